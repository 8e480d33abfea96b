// The WebSockets of `serve`: the upgrade the core accepts, each socket's frames answered in
// order through the core, notifications and session ends pushed to the sockets of an account
// or device, a bounded send queue per socket, liveness pings, and the close at shutdown.

import http from 'node:http';
import { WebSocketServer, WebSocket } from 'ws';
import { messageOf } from './log.js';
import { busyAnswer, busyFrame, refused, stoppingClose, uncommitted } from './core.js';
import { EMPTY, peerOf, requestOf, urlOf } from './http.js';

/** Frames read ahead of the one the core is answering, per WebSocket; past it the socket is paused. */
const WS_READ_AHEAD = 8;

/** @typedef {{device: string, ws: WebSocket, queued: number, alive: boolean, waiting: number}} Conn */

export class Sockets {
  /**
   * @param {object} o
   * @param {import('./relay.js').Relay | import('./relay-thread.js').RelayThread} o.front the relay (or its thread)
   * @param {import('./limits.js').LIMITS} o.limits
   * @param {import('./log.js').Log} o.log
   * @param {{websockets: number, dropped: number}} o.metrics the transports' counts
   * @param {<T>(f: () => Promise<T>) => Promise<T | null>} o.work runs work for the core unless too much waits
   * @param {string[]} o.names the request headers the core reads
   */
  constructor({ front, limits, log, metrics, work, names }) {
    Object.assign(this, { front, limits, log, metrics, work, names });
    /** The open sockets, by account. @type {Map<string, Set<Conn>>} */
    this.byAccount = new Map();
    // Messages over max_request_bytes close the socket with 1009; RSV bits, unmasked frames
    // and bad opcodes with 1002, invalid UTF-8 text with 1007 (the ws library's checks; its
    // 'error' event is caught below).
    this.wss = new WebSocketServer({ noServer: true, maxPayload: front.maxRequestBytes });
    this.wss.on('error', (e) => log.error(`websocket server: ${messageOf(e)}`));
    front.on('notify', ({ account, frame }) => {
      for (const c of this.byAccount.get(account) ?? []) this.push(c, frame);
    });
    front.on('end_device_sessions', ({ account, device_id, code, reason }) => {
      for (const c of this.byAccount.get(account) ?? []) if (c.device === device_id) c.ws.close(code, reason);
    });
    // Liveness: every WebSocket is pinged each wsPingInterval; one from which nothing came
    // since the last ping (no pong, no frame) is closed.
    this.pinger = setInterval(() => this.#ping(), limits.wsPingInterval);
    this.pinger.unref();
  }

  /**
   * Queues a text frame to a WebSocket. A client that does not read lets its queue grow: past
   * `wsSendQueue` frames not yet written to the socket, it is dropped.
   * @param {Conn} c @param {string} text
   */
  push(c, text) {
    if (c.ws.readyState !== WebSocket.OPEN) return;
    if (c.queued >= this.limits.wsSendQueue) {
      this.log.info('websocket dropped: its client does not read (send queue full)', { queued: c.queued });
      this.metrics.dropped += 1;
      c.ws.terminate();
      return;
    }
    c.queued += 1;
    c.ws.send(text, () => {
      c.queued -= 1;
    });
  }

  /** A GET /v1/ws the public listener passed on: the core's upgrade, or its refusal as a raw answer. */
  async upgrade(req, socket, head) {
    // node:http lets go of an upgrading socket: its errors are this handler's from here.
    socket.on('error', (e) => this.log.debug(`socket error during upgrade: ${messageOf(e)}`));
    const url = urlOf(req.url);
    if (!url) return reject(socket, 400, refused('unreadable_target'));
    const r = await this.work(async () => {
      try {
        return await this.front.handle(requestOf(req, url, EMPTY, false, this.names));
      } catch (e) {
        if (e?.code !== 'RELAY_THREAD_LOST') this.log.error(`upgrade failed: ${e?.stack ?? e}`);
        return uncommitted();
      }
    });
    const a = r ?? busyAnswer();
    if (!('upgrade' in a)) return reject(socket, a.status, a);
    if (socket.destroyed) return undefined;
    const origin = req.socket.remoteAddress ? peerOf(req.socket.remoteAddress) : null;
    this.wss.handleUpgrade(req, socket, head, (ws) => this.#open(ws, a.upgrade, origin));
    return undefined;
  }

  /** A socket the core upgraded: its frames go to the core one at a time, in order. */
  #open(ws, { token, account, device_id: device, expires_at: expires, expiry_close: close }, origin) {
    /** @type {Conn} */
    const c = { device, ws, queued: 0, alive: true, waiting: 0 };
    this.metrics.websockets += 1;
    if (!this.byAccount.has(account)) this.byAccount.set(account, new Set());
    this.byAccount.get(account).add(c);
    const expiry = setTimeout(() => ws.close(close.code, close.reason), Math.max(0, Math.min(expires - Date.now(), 2 ** 31 - 1)));
    ws.on('error', (e) => this.log.debug(`websocket closed on a protocol error: ${messageOf(e)}`, { code: /** @type {any} */ (e).code }));
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
          const r = await this.work(() => this.front.message(token, text, origin));
          if (r === null) {
            this.push(c, busyFrame(text));
            return;
          }
          this.push(c, r.text);
          if (r.close) ws.close(r.close[0], r.close[1]);
        } catch (e) {
          if (e?.code !== 'RELAY_THREAD_LOST') this.log.error(`frame failed: ${e?.stack ?? e}`);
          ws.close(1011, 'the relay failed');
        } finally {
          c.waiting -= 1;
          if (c.waiting < WS_READ_AHEAD && ws.isPaused) ws.resume();
        }
      });
    });
    ws.on('close', () => {
      this.metrics.websockets -= 1;
      clearTimeout(expiry);
      const set = this.byAccount.get(account);
      set?.delete(c);
      if (set?.size === 0) this.byAccount.delete(account);
    });
  }

  #ping() {
    for (const set of this.byAccount.values()) {
      for (const c of set) {
        if (!c.alive) {
          this.log.debug('websocket closed: no pong since the last ping');
          c.ws.terminate();
          continue;
        }
        c.alive = false;
        c.ws.ping();
      }
    }
  }

  /** Stops pinging. */
  stop() {
    clearInterval(this.pinger);
  }

  /**
   * Tells every socket the relay is going away (its client reconnects); returns a timer that
   * cuts, a second later, those whose client did not answer the close (the server waits for
   * its upgraded sockets too).
   */
  closeAll() {
    this.stop();
    const [code, reason] = stoppingClose();
    const all = () => [...this.byAccount.values()].flatMap((set) => [...set]);
    for (const c of all()) c.ws.close(code, reason);
    return setTimeout(() => all().forEach((c) => c.ws.terminate()), 1000);
  }
}

/** A raw answer on a socket that asked to upgrade, then closed: the core's answer as it is, or a bare status. */
function reject(socket, status, a = null) {
  if (!socket.destroyed && socket.writable) {
    const head = Object.entries(a?.headers ?? {})
      .filter(([k]) => k !== 'connection')
      .map(([k, v]) => `${k}: ${v}\r\n`)
      .join('');
    socket.write(`HTTP/1.1 ${status} ${http.STATUS_CODES[status] ?? ''}\r\n${head}Content-Length: ${a?.body.length ?? 0}\r\nConnection: close\r\n\r\n`);
    socket.end(a?.body);
  }
  socket.destroy();
}
