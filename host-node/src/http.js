// Reading requests and writing answers on node:http, for the listeners of `serve` and the
// WebSocket upgrades of `sockets.js`: the request as the core reads it, the core's answer as
// it is, bodies read within their limit and time, and the host's own refusals.

import http from 'node:http';
import { refused } from './core.js';

/** No bytes: the body of a request that has none. */
export const EMPTY = new Uint8Array(0);

/** Writes an answer as the core made it: status, headers and body as they are. @param {http.ServerResponse} res @param {{status: number, headers: Record<string, string>, body: Uint8Array}} a */
export function write(res, a) {
  res.writeHead(a.status, { ...a.headers, 'content-length': a.body.length });
  res.end(a.body);
}

/**
 * Writes the core's answer to a request refused unread (`refused`), and closes the
 * connection without reading the rest of the request, with a lingering close.
 * @param {http.IncomingMessage} req @param {http.ServerResponse} res @param {import('./core.js').Answer} a
 */
export function refuse(req, res, a) {
  req.pause();
  if (res.headersSent) {
    res.destroy();
    return;
  }
  res.shouldKeepAlive = false;
  // Node ends such a connection with destroySoon() once the answer is written, which resets it
  // when request bytes are still unread, and the client may then lose the answer: linger instead.
  const socket = req.socket;
  socket.destroySoon = () => linger(socket);
  write(res, a);
}

/** How long a refused connection stays open, half-closed, after its answer. */
const LINGER_MS = 250;

/**
 * Closes a connection whose request was refused unread: our side is ended (FIN, after the
 * answer) and nothing more is read; the socket is destroyed a moment later. Destroying it
 * at once, with the client's bytes unread, sends a reset that can make the client lose the
 * answer; reading on instead would read the body the answer refused. Meanwhile the client
 * sees the answer and stops, or its writes fill the buffers and wait.
 * @param {import('node:net').Socket} socket
 */
export function linger(socket) {
  if (socket.destroyed) return;
  const timer = setTimeout(() => socket.destroy(), LINGER_MS);
  socket.once('close', () => clearTimeout(timer));
  socket.once('end', () => socket.destroy());
  socket.end();
}

/**
 * Reads a body up to `limit` bytes within `timeout` ms; `null` when it was refused (413 as
 * soon as the declared length or the count passes the limit, 408 when the time is up, 400
 * when it cannot be read: the core's answer is sent, the rest is not read and the
 * connection is closed).
 */
export function readBody(req, res, limit, timeout) {
  return new Promise((resolve) => {
    const declared = Number(req.headers['content-length']);
    if (Number.isFinite(declared) && declared > limit) {
      refuse(req, res, refused('too_large', limit));
      resolve(null);
      return;
    }
    const chunks = [];
    let size = 0;
    let done = false;
    const stop = () => {
      done = true;
      clearTimeout(timer);
      req.off('data', onData);
    };
    const timer = setTimeout(() => {
      if (done) return;
      stop();
      refuse(req, res, refused('body_timeout', timeout));
      resolve(null);
    }, timeout);
    const onData = (c) => {
      if (done) return;
      size += c.length;
      if (size > limit) {
        stop();
        refuse(req, res, refused('too_large', limit));
        resolve(null);
      } else chunks.push(c);
    };
    req.on('data', onData);
    req.on('end', () => {
      if (done) return;
      stop();
      resolve(Buffer.concat(chunks));
    });
    req.on('error', () => {
      if (done) return;
      stop();
      refuse(req, res, refused('unreadable_body'));
      resolve(null);
    });
    // The client went away before the end: nothing to answer.
    req.on('close', () => {
      if (done) return;
      stop();
      resolve(null);
    });
  });
}

/** The path of a request target, or null when it cannot be read (`//`, garbage). @param {string | undefined} target */
export function urlOf(target) {
  try {
    return new URL(target ?? '', 'http://relay');
  } catch {
    return null;
  }
}

/** A peer's address for the per-address count: IPv4-mapped IPv6 as IPv4. @param {string | undefined} a */
export function peerOf(a) {
  if (!a) return '?';
  return a.startsWith('::ffff:') && a.includes('.') ? a.slice(7) : a;
}

/**
 * A request read whole as the core takes it: only the headers it reads cross, as
 * `name\nvalue\n` lines; the peer's address without the IPv4-mapped prefix.
 * @param {http.IncomingMessage} req @param {URL} url @param {Uint8Array} body @param {boolean} admin @param {string[]} names
 * @returns {import('./relay.js').Request}
 */
export function requestOf(req, url, body, admin, names) {
  let headers = '';
  for (const n of names) {
    const v = req.headers[n];
    if (typeof v === 'string') headers += `${n}\n${v}\n`;
  }
  const a = req.socket.remoteAddress;
  return { admin, method: req.method ?? '', path: url.pathname, query: url.search.slice(1), headers, body, origin: a ? peerOf(a) : null };
}

/** @param {http.ServerResponse} res @param {number} status @param {string} text @param {string} [type] */
export function sendText(res, status, text, type = 'text/plain; charset=utf-8') {
  res.writeHead(status, { 'content-type': type, 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

/**
 * `HOST:PORT` (`[v6]:PORT` for IPv6) as listen options.
 * @param {string} addr
 * @returns {{host: string, port: number}}
 */
export function parseAddr(addr) {
  const m = /^(?:\[([^\]]+)\]|([^:\[\]]*)):(\d+)$/.exec(addr);
  if (!m || Number(m[3]) > 65535) throw new Error(`an address is HOST:PORT, not ${addr}`);
  return { host: m[1] ?? m[2], port: Number(m[3]) };
}

/** A listening server's base URL. @param {http.Server} server @param {string} [scheme] */
export function baseUrl(server, scheme = 'http') {
  const a = /** @type {import('node:net').AddressInfo} */ (server.address());
  return `${scheme}://${a.family === 'IPv6' ? `[${a.address}]` : a.address}:${a.port}`;
}

/**
 * Starts `server` listening (on `at.handle`, a server already bound, when given); rejects
 * when it cannot bind.
 * @param {http.Server} server @param {{host: string, port: number, handle?: import('node:net').Server}} at
 */
export function listen(server, at) {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    const listening = () => {
      server.off('error', reject);
      resolve(undefined);
    };
    if (at.handle) server.listen(at.handle, listening);
    else server.listen(at.port, at.host, listening);
  });
}

