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
import { Log, messageOf } from './log.js';
import { batchPath, busyAnswer, healthAnswer, healthCheck, metricsType, notReady, refused, requestHeaders, transportMetricsText, uncommitted } from './core.js';
import { limitsOf } from './limits.js';
import { EMPTY, baseUrl, listen, parseAddr, peerOf, readBody, refuse, requestOf, sendText, urlOf, write } from './http.js';
import { Sockets } from './sockets.js';

export { parseAddr };

/**
 * The public and admin listeners with the transports' limits: node:http's timers, the
 * connection caps in all and per peer address, errors caught and counted.
 * @param {import('./limits.js').LIMITS} limits @param {{cert: string | Buffer, key: string | Buffer} | null} tls
 * @param {http.RequestListener} onRequest @param {http.RequestListener} onAdmin
 * @param {{connections: number, refused: {limit: number, perIp: number}}} metrics @param {Log} log
 * @returns {{server: http.Server, admin: http.Server}}
 */
function listeners(limits, tls, onRequest, onAdmin, metrics, log) {
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
    tls
      ? https.createServer({ ...httpOptions, cert: tls.cert, key: tls.key, handshakeTimeout: limits.headerTimeout }, onRequest)
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
  return { server, admin };
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
  const [batchAt, maxBatchBytes] = [batchPath(), front.maxBatchBytes ?? maxBytes];
  /** The transports' counts: open connections and WebSockets, refusals at accept, busy answers, dropped sockets. */
  const metrics = { connections: 0, websockets: 0, refused: { limit: 0, perIp: 0 }, busy: 0, dropped: 0 };
  let shuttingDown = false;
  /** Requests and frames waiting for the core (or the relay thread), at most `maxPending`. */
  let pending = 0;
  const readiness = async () => (shuttingDown ? { ready: false, reason: notReady({ stopping: true }) } : front.ready());
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

  /** Reads the body of a POST (others have none) within its path's limit; null when it was refused. @param {string} pathname */
  const bodyOf = async (req, res, pathname) => {
    if (req.method !== 'POST') return EMPTY;
    const limit = pathname === batchAt ? maxBatchBytes : maxBytes;
    const body = await readBody(req, res, limit, limits.bodyTimeout);
    return body === null ? null : new Uint8Array(body.buffer, body.byteOffset, body.length);
  };

  /** The public listener's requests. */
  const onRequest = async (req, res) => {
    try {
      const url = urlOf(req.url);
      if (!url) return refuse(req, res, refused('unreadable_target'));
      if (await health(req, res, url.pathname)) return undefined;
      const body = await bodyOf(req, res, url.pathname);
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
      const body = await bodyOf(req, res, url.pathname);
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

  const { server, admin } = listeners(limits, tlsCert ? { cert: tlsCert, key: tlsKey } : null, onRequest, onAdmin, metrics, log);
  const sockets = new Sockets({ front, limits, log, metrics, work, names });
  server.on('upgrade', (req, socket, head) => {
    sockets.upgrade(req, socket, head).catch((e) => {
      log.error(`upgrade failed: ${e?.stack ?? e}`);
      socket.destroy();
    });
  });

  // The admin listener first, and its URL written, so whoever sees the public port up finds
  // this start's admin.url (never the last one's).
  const adminFile = front.data ? path.join(front.data, 'admin.url') : null;
  if (adminFile) fs.rmSync(adminFile, { force: true });
  try {
    await listen(admin, parseAddr(opts.admin ?? front.adminListen ?? '127.0.0.1:0'));
  } catch (e) {
    sockets.stop();
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
    sockets.stop();
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
      // Every socket is told the relay is going away; one whose client does not answer the
      // close within a second is cut.
      const cut = sockets.closeAll();
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
