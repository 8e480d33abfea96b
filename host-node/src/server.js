// The transports of protocol.md §6 on one port: HTTP, WebSocket, relay RPC, /.well-known/relay,
// and the health checks. The operator's side is on a listener of its own (loopback by
// default): the admin API, /metrics and the health checks.

import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { WebSocketServer } from 'ws';
import { Dispatch, errorBody } from './dispatch.js';
import { Log, messageOf } from './log.js';
import { CONTENT_TYPE, TransportMetrics } from './metrics.js';

function send(res, status, body) {
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  const headers = { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) };
  // A 429 says when to retry; its body may come as text from a relay thread.
  const retry = status === 429 ? (typeof body === 'string' ? JSON.parse(body) : body)?.error?.data?.retry_after : undefined;
  if (Number.isInteger(retry)) headers['retry-after'] = String(Math.ceil(retry / 1000));
  res.writeHead(status, headers);
  res.end(text);
}

/** Reads a body up to `limit` bytes; `null` when it is larger (413 before any parsing). */
function readBody(req, limit) {
  return new Promise((resolve, reject) => {
    const declared = Number(req.headers['content-length']);
    if (Number.isFinite(declared) && declared > limit) {
      req.resume();
      resolve(null);
      return;
    }
    const chunks = [];
    let size = 0;
    let over = false;
    req.on('data', (c) => {
      size += c.length;
      if (size > limit) over = true;
      else chunks.push(c);
    });
    req.on('end', () => resolve(over ? null : Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

/** The relay-authentication headers of protocol.md §6, the only ones a relay request needs. */
function relayHeaders(h) {
  return {
    'relay-id': h['relay-id'],
    'relay-timestamp': h['relay-timestamp'],
    'relay-nonce': h['relay-nonce'],
    'relay-signature': h['relay-signature'],
  };
}

function bearer(req) {
  const a = req.headers.authorization;
  return a && a.startsWith('Bearer ') ? a.slice(7).trim() : null;
}

/** @param {http.ServerResponse} res @param {number} status @param {string} text @param {string} [type] */
function sendText(res, status, text, type = 'text/plain; charset=utf-8') {
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

/** A listening server's base URL. @param {http.Server} server */
function baseUrl(server) {
  const a = /** @type {import('node:net').AddressInfo} */ (server.address());
  return `http://${a.family === 'IPv6' ? `[${a.address}]` : a.address}:${a.port}`;
}

/** Starts `server` listening; rejects when it cannot bind. @param {http.Server} server @param {{host: string, port: number}} at */
function listen(server, at) {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(at.port, at.host, () => {
      server.off('error', reject);
      resolve(undefined);
    });
  });
}

/**
 * Serves a relay over HTTP and WebSocket: a `Relay` on this thread, or a relay thread
 * (`RelayThread.start`), which leaves this thread to the transports. The admin listener
 * binds `opts.admin` (else the relay's `adminListen`, else `127.0.0.1:0`); its base URL is
 * logged and, when the relay has a data directory, written to `DATA/admin.url` before the
 * public port listens.
 * @param {import('./relay.js').Relay | import('./relay-thread.js').RelayThread} relay
 * @param {{host?: string, port?: number, admin?: string}} opts
 * @returns {Promise<{server: http.Server, port: number, admin: http.Server, adminUrl: string, close: () => Promise<void>}>}
 */
export async function serve(relay, opts = {}) {
  const front = typeof relay.request === 'function' ? relay : new Dispatch(relay);
  /** @type {Log} */
  const log = front.log ?? new Log();
  const metrics = new TransportMetrics();
  let shuttingDown = false;
  const readiness = async () => (shuttingDown ? { ready: false, reason: 'shutting down' } : front.ready());
  /** @type {Map<string, Set<{device: string, ws: import('ws').WebSocket}>>} */
  const sockets = new Map();
  front.on('notify', ({ account, latest_seq }) => {
    const frame = JSON.stringify({ method: 'message.timeline.changed', params: { account, latest_seq } });
    for (const c of sockets.get(account) ?? []) c.ws.send(frame);
  });
  front.on('end_device_sessions', ({ account, device_id }) => {
    for (const c of sockets.get(account) ?? []) if (c.device === device_id) c.ws.close(4401, 'device revoked');
  });

  /** `/healthz` and `/readyz`, on both listeners; false when the request is neither. */
  const health = async (req, res, pathname) => {
    if (req.method !== 'GET') return false;
    if (pathname === '/healthz') {
      sendText(res, 200, 'ok\n');
      return true;
    }
    if (pathname !== '/readyz') return false;
    const r = await readiness();
    sendText(res, r.ready ? 200 : 503, r.ready ? 'ready\n' : `not ready: ${r.reason}\n`);
    return true;
  };

  const server = http.createServer(async (req, res) => {
    try {
      const url = new URL(req.url, 'http://relay');
      if (req.method === 'GET' && url.pathname === '/.well-known/relay') return send(res, 200, front.wellKnown);
      if (url.pathname === '/healthz' || url.pathname === '/readyz') {
        if (await health(req, res, url.pathname)) return undefined;
      }
      // The admin API is not served here: only on the admin listener.
      const m = /^\/(v1|relay\/v1)\/([a-z.]+)$/.exec(url.pathname);
      if (req.method !== 'POST' || !m) return send(res, 404, errorBody('not_found', 'no such route'));
      const body = await readBody(req, front.maxRequestBytes);
      if (body === null) return send(res, 413, errorBody('payload_too_large', `request body exceeds max_request_bytes ${front.maxRequestBytes}`));
      const text = body.toString('utf8');
      if (!Buffer.from(text, 'utf8').equals(body)) return send(res, 400, errorBody('invalid_params', 'invalid JSON: invalid UTF-8'));
      const [, space, method] = m;
      // The peer's address as the socket reports it; the core reads IPv4-mapped IPv6 as IPv4.
      const r = await front.request(space, method, bearer(req), space === 'relay/v1' ? relayHeaders(req.headers) : null, text, req.socket.remoteAddress ?? null);
      return send(res, r.status, r.body);
    } catch (e) {
      // The relay thread stopped with this request in it: its outcome is unknown, and a
      // dropped connection says so, as a crashed relay would.
      if (e?.code === 'RELAY_THREAD_LOST') return res.destroy();
      log.error(`request failed: ${e?.stack ?? e}`);
      if (!res.headersSent) send(res, 500, errorBody('internal', 'the relay failed; nothing was accepted'));
    }
    return undefined;
  });
  // Open connections, counted as they come and go (read at scrape time).
  const counted = (socket) => {
    metrics.connections += 1;
    socket.once('close', () => {
      metrics.connections -= 1;
    });
  };
  server.on('connection', counted);

  const admin = http.createServer(async (req, res) => {
    try {
      const url = new URL(req.url, 'http://relay');
      if (await health(req, res, url.pathname)) return undefined;
      if (req.method === 'GET' && url.pathname === '/metrics') {
        const text = (await front.metrics()) + (await metrics.text());
        return sendText(res, 200, text, CONTENT_TYPE);
      }
      const m = /^\/admin\/v1\/([a-z.]+)$/.exec(url.pathname);
      if (req.method !== 'POST' || !m) return send(res, 404, errorBody('not_found', 'no such route'));
      const body = await readBody(req, front.maxRequestBytes);
      if (body === null) return send(res, 413, errorBody('payload_too_large', `request body exceeds max_request_bytes ${front.maxRequestBytes}`));
      const text = body.toString('utf8');
      if (!Buffer.from(text, 'utf8').equals(body)) return send(res, 400, errorBody('invalid_params', 'invalid JSON: invalid UTF-8'));
      const r = await front.request('admin/v1', m[1], bearer(req), null, text, req.socket.remoteAddress ?? null);
      return send(res, r.status, r.body);
    } catch (e) {
      if (e?.code === 'RELAY_THREAD_LOST') return res.destroy();
      log.error(`admin request failed: ${e?.stack ?? e}`);
      if (!res.headersSent) send(res, 500, errorBody('internal', `the relay failed: ${messageOf(e)}`));
    }
    return undefined;
  });
  admin.on('connection', counted);

  const wss = new WebSocketServer({ noServer: true, maxPayload: front.maxRequestBytes + 1024 });
  server.on('upgrade', async (req, socket, head) => {
    const url = new URL(req.url, 'http://relay');
    if (url.pathname !== '/v1/ws') return socket.destroy();
    const token = bearer(req) ?? url.searchParams.get('session');
    let s = { ok: false };
    try {
      if (token) s = await front.session(token);
    } catch (e) {
      log.error(`session check failed: ${e?.stack ?? e}`);
    }
    if (!s.ok) {
      socket.write('HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n');
      return socket.destroy();
    }
    const origin = req.socket.remoteAddress ?? null;
    wss.handleUpgrade(req, socket, head, (ws) => {
      const { account, device_id: device, expires_at: expires } = s.info;
      const entry = { device, ws };
      metrics.websockets += 1;
      if (!sockets.has(account)) sockets.set(account, new Set());
      sockets.get(account).add(entry);
      const expiry = setTimeout(() => ws.close(4401, 'session expired'), Math.max(0, Math.min(expires - Date.now(), 2 ** 31 - 1)));
      // Frames are answered in the order they came, one at a time.
      let queue = Promise.resolve();
      ws.on('message', (data) => {
        const text = data.toString('utf8');
        queue = queue.then(async () => {
          try {
            const { reply, ended } = await front.frame(token, text, origin);
            ws.send(reply);
            if (ended) ws.close(4401, 'session ended');
          } catch (e) {
            log.error(`frame failed: ${e?.stack ?? e}`);
            ws.close(1011, 'the relay failed');
          }
        });
      });
      ws.on('close', () => {
        metrics.websockets -= 1;
        clearTimeout(expiry);
        sockets.get(account)?.delete(entry);
      });
    });
  });

  // The admin listener first, and its URL written, so whoever sees the public port up finds
  // this start's admin.url (never the last one's).
  const adminFile = front.data ? path.join(front.data, 'admin.url') : null;
  if (adminFile) fs.rmSync(adminFile, { force: true });
  await listen(admin, parseAddr(opts.admin ?? front.adminListen ?? '127.0.0.1:0'));
  const adminUrl = baseUrl(admin);
  if (adminFile) {
    fs.writeFileSync(`${adminFile}.tmp`, `${adminUrl}\n`, { mode: 0o600 });
    fs.renameSync(`${adminFile}.tmp`, adminFile);
  }
  log.info('admin listener (admin API, /metrics, /healthz, /readyz)', { admin_url: adminUrl });
  try {
    await listen(server, { port: opts.port ?? 0, host: opts.host ?? '127.0.0.1' });
  } catch (e) {
    admin.close();
    throw e;
  }
  return {
    server,
    port: /** @type {import('node:net').AddressInfo} */ (server.address()).port,
    admin,
    adminUrl,
    close: async () => {
      // /readyz says so from now on, on both listeners, while requests in flight finish.
      shuttingDown = true;
      for (const set of sockets.values()) for (const c of set) c.ws.terminate();
      await Promise.all([new Promise((resolve) => server.close(resolve)), new Promise((resolve) => admin.close(resolve))]);
      await front.close();
      // A clean stop takes its admin.url away (if it is still this start's).
      if (adminFile) {
        try {
          if (fs.readFileSync(adminFile, 'utf8').trim() === adminUrl) fs.rmSync(adminFile, { force: true });
        } catch {
          // gone already
        }
      }
    },
  };
}
