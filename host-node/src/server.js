// The transports of protocol.md §6 on one port: HTTP (or HTTPS), WebSocket, relay RPC,
// /.well-known/relay, and the health checks. The operator's side is on a listener of its own
// (loopback by default): the admin API, /metrics and the health checks.
//
// Facing the internet (issue 18): every server, socket and WebSocket has its errors caught;
// headers, bodies and idle connections are timed; connections are capped in all and per
// peer address at accept; bodies and WebSocket messages are limited to max_request_bytes
// while they are read; each WebSocket's outbound queue is bounded, and so is the work
// waiting to enter the core (beyond it: 503 unavailable, Retry-After 1). The limits and
// their defaults are in limits.js.

import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import path from 'node:path';
import { WebSocketServer, WebSocket } from 'ws';
import { Log, messageOf } from './log.js';
import { busyAnswer, busyFrame, healthAnswer, healthCheck, metricsType, notReady, refused, requestHeaders, stoppingClose, transportMetricsText, uncommitted } from './core.js';
import { limitsOf } from './limits.js';


/** Frames read ahead of the one the core is answering, per WebSocket; past it the socket is paused. */
const WS_READ_AHEAD = 8;

const EMPTY = new Uint8Array(0);

/** Writes an answer as the core made it: status, headers and body as they are. @param {http.ServerResponse} res @param {{status: number, headers: Record<string, string>, body: Uint8Array}} a */
function write(res, a) {
  res.writeHead(a.status, { ...a.headers, 'content-length': a.body.length });
  res.end(a.body);
}

/**
 * Writes the core's answer to a request refused unread (`refused`), and closes the
 * connection without reading the rest of the request, with a lingering close.
 * @param {http.IncomingMessage} req @param {http.ServerResponse} res @param {import('./core.js').Answer} a
 */
function refuse(req, res, a) {
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
function linger(socket) {
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
function readBody(req, res, limit, timeout) {
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
function urlOf(target) {
  try {
    return new URL(target ?? '', 'http://relay');
  } catch {
    return null;
  }
}

/** A peer's address for the per-address count: IPv4-mapped IPv6 as IPv4. @param {string | undefined} a */
function peerOf(a) {
  if (!a) return '?';
  return a.startsWith('::ffff:') && a.includes('.') ? a.slice(7) : a;
}

/**
 * A request read whole as the core takes it: only the headers it reads cross, as
 * `name\nvalue\n` lines; the peer's address without the IPv4-mapped prefix.
 * @param {http.IncomingMessage} req @param {URL} url @param {Uint8Array} body @param {boolean} admin @param {string[]} names
 * @returns {import('./relay.js').Request}
 */
function requestOf(req, url, body, admin, names) {
  let headers = '';
  for (const n of names) {
    const v = req.headers[n];
    if (typeof v === 'string') headers += `${n}\n${v}\n`;
  }
  const a = req.socket.remoteAddress;
  return { admin, method: req.method ?? '', path: url.pathname, query: url.search.slice(1), headers, body, origin: a ? peerOf(a) : null };
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

/** A listening server's base URL. @param {http.Server} server @param {string} [scheme] */
function baseUrl(server, scheme = 'http') {
  const a = /** @type {import('node:net').AddressInfo} */ (server.address());
  return `${scheme}://${a.family === 'IPv6' ? `[${a.address}]` : a.address}:${a.port}`;
}

/**
 * Starts `server` listening (on `at.handle`, a server already bound, when given); rejects
 * when it cannot bind.
 * @param {http.Server} server @param {{host: string, port: number, handle?: import('node:net').Server}} at
 */
function listen(server, at) {
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

/**
 * Serves a relay over HTTP (or HTTPS) and WebSocket: a `Relay` on this thread, or a relay
 * thread (`RelayThread.start`), which leaves this thread to the transports. The admin
 * listener binds `opts.admin` (else the relay's `adminListen`, else `127.0.0.1:0`); its base
 * URL is logged and, when the relay has a data directory, written to `DATA/admin.url` before
 * the public port listens. The limits (limits.js) and `tlsCert`/`tlsKey` come from `opts`,
 * else from the options the relay was made with, else the defaults. `handle`, a server
 * already bound, is listened on instead of `host` and `port`.
 * @param {import('./relay.js').Relay | import('./relay-thread.js').RelayThread} relay
 * @param {{host?: string, port?: number, handle?: import('node:net').Server, admin?: string, tlsCert?: string | Buffer, tlsKey?: string | Buffer} & Partial<import('./limits.js').LIMITS>} opts
 * @returns {Promise<{server: http.Server, port: number, admin: http.Server, adminUrl: string, url: string, close: () => Promise<void>}>}
 */
export async function serve(relay, opts = {}) {
  const front = relay;
  const names = requestHeaders();
  /** @type {Log} */
  const log = front.log ?? new Log();
  const carried = /** @type {Record<string, any>} */ (relay.serveOptions ?? {});
  const limits = limitsOf(carried, opts);
  const tlsCert = opts.tlsCert ?? carried.tlsCert;
  const tlsKey = opts.tlsKey ?? carried.tlsKey;
  if (Boolean(tlsCert) !== Boolean(tlsKey)) throw new Error('TLS needs both a certificate (tlsCert) and its key (tlsKey)');
  const maxBytes = front.maxRequestBytes;
  /** The transports' counts: open connections and WebSockets, refusals at accept, busy answers, dropped sockets. */
  const metrics = { connections: 0, websockets: 0, refused: { limit: 0, perIp: 0 }, busy: 0, dropped: 0 };
  let shuttingDown = false;
  /** Requests and frames waiting for the core (or the relay thread), at most `maxPending`. */
  let pending = 0;
  const readiness = async () => (shuttingDown ? { ready: false, reason: notReady({ stopping: true }) } : front.ready());
  /** @typedef {{device: string, ws: WebSocket, queued: number, alive: boolean, waiting: number}} Conn */
  /** @type {Map<string, Set<Conn>>} */
  const sockets = new Map();

  /**
   * Queues a text frame to a WebSocket. A client that does not read lets its queue grow: past
   * `wsSendQueue` frames not yet written to the socket, it is dropped.
   * @param {Conn} c @param {string} text
   */
  const push = (c, text) => {
    if (c.ws.readyState !== WebSocket.OPEN) return;
    if (c.queued >= limits.wsSendQueue) {
      log.info('websocket dropped: its client does not read (send queue full)', { queued: c.queued });
      metrics.dropped += 1;
      c.ws.terminate();
      return;
    }
    c.queued += 1;
    c.ws.send(text, () => {
      c.queued -= 1;
    });
  };
  front.on('notify', ({ account, frame }) => {
    for (const c of sockets.get(account) ?? []) push(c, frame);
  });
  front.on('end_device_sessions', ({ account, device_id, code, reason }) => {
    for (const c of sockets.get(account) ?? []) if (c.device === device_id) c.ws.close(code, reason);
  });

  /** `/healthz` and `/readyz` (the core says which requests they are), on both listeners; false when the request is neither. */
  const health = async (req, res, pathname) => {
    const check = healthCheck(req.method ?? '', pathname);
    if (check === null) return false;
    write(res, healthAnswer(check, check === 'ready' ? ((await readiness()).reason ?? null) : null));
    return true;
  };

  /**
   * Runs `f` as work for the core unless `maxPending` are waiting already (then `null`).
   * @template T @param {() => Promise<T>} f @returns {Promise<T | null>}
   */
  const work = async (f) => {
    if (pending >= limits.maxPending) {
      metrics.busy += 1;
      return null;
    }
    pending += 1;
    try {
      return await f();
    } finally {
      pending -= 1;
    }
  };

  /** Reads the body of a POST (others have none); null when it was refused. */
  const bodyOf = async (req, res) => {
    if (req.method !== 'POST') return EMPTY;
    const body = await readBody(req, res, maxBytes, limits.bodyTimeout);
    return body === null ? null : new Uint8Array(body.buffer, body.byteOffset, body.length);
  };

  /** The public listener's requests. */
  const onRequest = async (req, res) => {
    try {
      const url = urlOf(req.url);
      if (!url) return refuse(req, res, refused('unreadable_target'));
      if (await health(req, res, url.pathname)) return undefined;
      const body = await bodyOf(req, res);
      if (body === null) return undefined;
      const r = await work(() => front.handle(requestOf(req, url, body, false, names)));
      if (r === null) return write(res, busyAnswer());
      return write(res, r);
    } catch (e) {
      // The relay thread stopped with this request in it: its outcome is unknown, and a
      // dropped connection says so, as a crashed relay would.
      if (e?.code === 'RELAY_THREAD_LOST') return res.destroy();
      log.error(`request failed: ${e?.stack ?? e}`);
      if (!res.headersSent) write(res, uncommitted());
      else res.destroy();
    }
    return undefined;
  };

  /** The admin listener's requests. */
  const onAdmin = async (req, res) => {
    try {
      const url = urlOf(req.url);
      if (!url) return refuse(req, res, refused('unreadable_target'));
      if (await health(req, res, url.pathname)) return undefined;
      if ((req.method === 'GET' || req.method === 'HEAD') && url.pathname === '/metrics') {
        const text = (await front.metricsText()) + transportMetricsText(metrics);
        return sendText(res, 200, text, metricsType());
      }
      const body = await bodyOf(req, res);
      if (body === null) return undefined;
      const r = await front.handle(requestOf(req, url, body, true, names));
      return write(res, r);
    } catch (e) {
      if (e?.code === 'RELAY_THREAD_LOST') return res.destroy();
      log.error(`admin request failed: ${e?.stack ?? e}`);
      if (!res.headersSent) write(res, uncommitted());
      else res.destroy();
    }
    return undefined;
  };

  // node:http's own timers: the request line and headers within headerTimeout (else 408 and
  // close), the whole request within headerTimeout + bodyTimeout (the body's own timer in
  // readBody answers first), idle keep-alive connections closed after idleTimeout (node adds
  // a second of grace), and no connection left with nothing moving either way for
  // idleTimeout + bodyTimeout. The timers are checked every quarter of the shortest (at most
  // once a second, at least every 50 ms).
  const httpOptions = {
    headersTimeout: limits.headerTimeout,
    requestTimeout: limits.headerTimeout + limits.bodyTimeout,
    connectionsCheckingInterval: Math.max(50, Math.min(1000, Math.floor(Math.min(limits.headerTimeout, limits.bodyTimeout) / 4))),
  };
  /** @param {http.Server} s */
  const timed = (s) => {
    s.keepAliveTimeout = limits.idleTimeout;
    s.timeout = limits.idleTimeout + limits.bodyTimeout;
    s.maxConnections = limits.maxConnections;
    return s;
  };
  const server = timed(
    tlsCert
      ? https.createServer({ ...httpOptions, cert: tlsCert, key: tlsKey, handshakeTimeout: limits.headerTimeout }, onRequest)
      : http.createServer(httpOptions, onRequest),
  );
  const admin = timed(http.createServer(httpOptions, onAdmin));
  for (const [name, s] of [['public', server], ['admin', admin]]) {
    s.on('error', (e) => log.error(`${name} listener: ${messageOf(e)}`));
    // Beyond maxConnections node closes a new connection at once.
    s.on('drop', () => {
      metrics.refused.limit += 1;
    });
  }
  server.on('tlsClientError', (e, socket) => {
    log.debug(`TLS handshake failed: ${messageOf(e)}`);
    socket.destroy();
  });

  /** Open connections per peer address (public listener). @type {Map<string, number>} */
  const perIp = new Map();
  server.on('connection', (socket) => {
    const ip = peerOf(socket.remoteAddress);
    const n = perIp.get(ip) ?? 0;
    if (n >= limits.maxConnectionsPerIp) {
      metrics.refused.perIp += 1;
      socket.destroy();
      return;
    }
    perIp.set(ip, n + 1);
    metrics.connections += 1;
    socket.once('close', () => {
      metrics.connections -= 1;
      const left = (perIp.get(ip) ?? 1) - 1;
      if (left > 0) perIp.set(ip, left);
      else perIp.delete(ip);
    });
  });
  admin.on('connection', (socket) => {
    metrics.connections += 1;
    socket.once('close', () => {
      metrics.connections -= 1;
    });
  });

  // Messages over max_request_bytes close the socket with 1009; RSV bits, unmasked frames
  // and bad opcodes with 1002, invalid UTF-8 text with 1007 (the ws library's checks; its
  // 'error' event is caught below).
  const wss = new WebSocketServer({ noServer: true, maxPayload: maxBytes });
  wss.on('error', (e) => log.error(`websocket server: ${messageOf(e)}`));

  /** A raw answer on a socket that asked to upgrade, then closed: the core's answer as it is, or a bare status. */
  const reject = (socket, status, a = null) => {
    if (!socket.destroyed && socket.writable) {
      const head = Object.entries(a?.headers ?? {})
        .filter(([k]) => k !== 'connection')
        .map(([k, v]) => `${k}: ${v}\r\n`)
        .join('');
      socket.write(`HTTP/1.1 ${status} ${http.STATUS_CODES[status] ?? ''}\r\n${head}Content-Length: ${a?.body.length ?? 0}\r\nConnection: close\r\n\r\n`);
      socket.end(a?.body);
    }
    socket.destroy();
  };

  const upgrade = async (req, socket, head) => {
    // node:http lets go of an upgrading socket: its errors are this handler's from here.
    socket.on('error', (e) => log.debug(`socket error during upgrade: ${messageOf(e)}`));
    const url = urlOf(req.url);
    if (!url) return reject(socket, 400, refused('unreadable_target'));
    const r = await work(async () => {
      try {
        return await front.handle(requestOf(req, url, EMPTY, false, names));
      } catch (e) {
        if (e?.code !== 'RELAY_THREAD_LOST') log.error(`upgrade failed: ${e?.stack ?? e}`);
        return uncommitted();
      }
    });
    const a = r ?? busyAnswer();
    if (!('upgrade' in a)) return reject(socket, a.status, a);
    if (socket.destroyed) return undefined;
    const { token, account, device_id: device, expires_at: expires, expiry_close: close } = a.upgrade;
    const origin = req.socket.remoteAddress ? peerOf(req.socket.remoteAddress) : null;
    wss.handleUpgrade(req, socket, head, (ws) => {
      /** @type {Conn} */
      const c = { device, ws, queued: 0, alive: true, waiting: 0 };
      metrics.websockets += 1;
      if (!sockets.has(account)) sockets.set(account, new Set());
      sockets.get(account).add(c);
      const expiry = setTimeout(() => ws.close(close.code, close.reason), Math.max(0, Math.min(expires - Date.now(), 2 ** 31 - 1)));
      ws.on('error', (e) => log.debug(`websocket closed on a protocol error: ${messageOf(e)}`, { code: /** @type {any} */ (e).code }));
      const alive = () => {
        c.alive = true;
      };
      ws.on('pong', alive);
      ws.on('ping', alive);
      // Frames are answered in the order they came, one at a time; a few are read ahead,
      // then the socket is paused until the core catches up.
      let queue = Promise.resolve();
      ws.on('message', (data) => {
        c.alive = true;
        const text = data.toString('utf8');
        c.waiting += 1;
        if (c.waiting >= WS_READ_AHEAD) ws.pause();
        queue = queue.then(async () => {
          try {
            if (ws.readyState !== WebSocket.OPEN) return;
            const r = await work(() => front.message(token, text, origin));
            if (r === null) {
              push(c, busyFrame(text));
              return;
            }
            push(c, r.text);
            if (r.close) ws.close(r.close[0], r.close[1]);
          } catch (e) {
            if (e?.code !== 'RELAY_THREAD_LOST') log.error(`frame failed: ${e?.stack ?? e}`);
            ws.close(1011, 'the relay failed');
          } finally {
            c.waiting -= 1;
            if (c.waiting < WS_READ_AHEAD && ws.isPaused) ws.resume();
          }
        });
      });
      ws.on('close', () => {
        metrics.websockets -= 1;
        clearTimeout(expiry);
        const set = sockets.get(account);
        set?.delete(c);
        if (set?.size === 0) sockets.delete(account);
      });
    });
    return undefined;
  };
  server.on('upgrade', (req, socket, head) => {
    upgrade(req, socket, head).catch((e) => {
      log.error(`upgrade failed: ${e?.stack ?? e}`);
      socket.destroy();
    });
  });

  // Liveness: every WebSocket is pinged each wsPingInterval; one from which nothing came
  // since the last ping (no pong, no frame) is closed.
  const pinger = setInterval(() => {
    for (const set of sockets.values()) {
      for (const c of set) {
        if (!c.alive) {
          log.debug('websocket closed: no pong since the last ping');
          c.ws.terminate();
          continue;
        }
        c.alive = false;
        c.ws.ping();
      }
    }
  }, limits.wsPingInterval);
  pinger.unref();

  // The admin listener first, and its URL written, so whoever sees the public port up finds
  // this start's admin.url (never the last one's).
  const adminFile = front.data ? path.join(front.data, 'admin.url') : null;
  if (adminFile) fs.rmSync(adminFile, { force: true });
  try {
    await listen(admin, parseAddr(opts.admin ?? front.adminListen ?? '127.0.0.1:0'));
  } catch (e) {
    clearInterval(pinger);
    throw e;
  }
  const adminUrl = baseUrl(admin);
  if (adminFile) {
    fs.writeFileSync(`${adminFile}.tmp`, `${adminUrl}\n`, { mode: 0o600 });
    fs.renameSync(`${adminFile}.tmp`, adminFile);
  }
  log.info('admin listener (admin API, /metrics, /healthz, /readyz)', { admin_url: adminUrl });
  try {
    await listen(server, { port: opts.port ?? 0, host: opts.host ?? '127.0.0.1', handle: opts.handle });
  } catch (e) {
    clearInterval(pinger);
    admin.close();
    throw e;
  }
  // A relay thread held its first tick until its key can be fetched here.
  await relay.listening?.();
  return {
    server,
    port: /** @type {import('node:net').AddressInfo} */ (server.address()).port,
    url: baseUrl(server, tlsCert ? 'https' : 'http'),
    admin,
    adminUrl,
    close: async () => {
      // /readyz says so from now on, on both listeners, while requests in flight finish.
      shuttingDown = true;
      clearInterval(pinger);
      // Every socket is told the relay is going away (its client reconnects); one whose
      // client does not answer the close within a second is cut, since the server waits for
      // its upgraded sockets too.
      const [code, reason] = stoppingClose();
      const all = () => [...sockets.values()].flatMap((set) => [...set]);
      for (const c of all()) c.ws.close(code, reason);
      const cut = setTimeout(() => all().forEach((c) => c.ws.terminate()), 1000);
      await Promise.all([new Promise((resolve) => server.close(resolve)), new Promise((resolve) => admin.close(resolve))]);
      clearTimeout(cut);
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
