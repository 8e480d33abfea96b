// The transports of protocol.md §6 on one port: HTTP, WebSocket, relay RPC, /.well-known/relay.

import http from 'node:http';
import { WebSocketServer } from 'ws';
import { Dispatch, errorBody } from './dispatch.js';

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

/**
 * Serves a relay over HTTP and WebSocket: a `Relay` on this thread, or a relay thread
 * (`RelayThread.start`), which leaves this thread to the transports.
 * @param {import('./relay.js').Relay | import('./relay-thread.js').RelayThread} relay
 * @param {{host?: string, port?: number}} listen
 * @returns {Promise<{server: http.Server, port: number, close: () => Promise<void>}>}
 */
export async function serve(relay, listen = {}) {
  const front = typeof relay.request === 'function' ? relay : new Dispatch(relay);
  /** @type {Map<string, Set<{device: string, ws: import('ws').WebSocket}>>} */
  const sockets = new Map();
  front.on('notify', ({ account, latest_seq }) => {
    const frame = JSON.stringify({ method: 'message.timeline.changed', params: { account, latest_seq } });
    for (const c of sockets.get(account) ?? []) c.ws.send(frame);
  });
  front.on('end_device_sessions', ({ account, device_id }) => {
    for (const c of sockets.get(account) ?? []) if (c.device === device_id) c.ws.close(4401, 'device revoked');
  });

  const server = http.createServer(async (req, res) => {
    try {
      const url = new URL(req.url, 'http://relay');
      if (req.method === 'GET' && url.pathname === '/.well-known/relay') return send(res, 200, front.wellKnown);
      const m = /^\/(v1|relay\/v1|admin\/v1)\/([a-z.]+)$/.exec(url.pathname);
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
      console.error('request failed:', e);
      if (!res.headersSent) send(res, 500, errorBody('internal', 'the relay failed; nothing was accepted'));
    }
  });

  const wss = new WebSocketServer({ noServer: true, maxPayload: front.maxRequestBytes + 1024 });
  server.on('upgrade', async (req, socket, head) => {
    const url = new URL(req.url, 'http://relay');
    if (url.pathname !== '/v1/ws') return socket.destroy();
    const token = bearer(req) ?? url.searchParams.get('session');
    let s = { ok: false };
    try {
      if (token) s = await front.session(token);
    } catch (e) {
      console.error('session check failed:', e);
    }
    if (!s.ok) {
      socket.write('HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n');
      return socket.destroy();
    }
    const origin = req.socket.remoteAddress ?? null;
    wss.handleUpgrade(req, socket, head, (ws) => {
      const { account, device_id: device, expires_at: expires } = s.info;
      const entry = { device, ws };
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
            console.error('frame failed:', e);
            ws.close(1011, 'the relay failed');
          }
        });
      });
      ws.on('close', () => {
        clearTimeout(expiry);
        sockets.get(account)?.delete(entry);
      });
    });
  });

  await new Promise((resolve) => server.listen(listen.port ?? 0, listen.host ?? '127.0.0.1', resolve));
  return {
    server,
    port: server.address().port,
    close: async () => {
      for (const set of sockets.values()) for (const c of set) c.ws.terminate();
      await new Promise((resolve) => server.close(resolve));
      await front.close();
    },
  };
}
