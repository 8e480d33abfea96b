// The transports of protocol.md §6 on one port: HTTP, WebSocket, relay RPC, /.well-known/relay.

import http from 'node:http';
import { WebSocketServer } from 'ws';

const RELAY_METHODS = new Set(['message.deliver', 'route.get', 'route.publish', 'device.list']);

function send(res, status, body) {
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  const headers = { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) };
  const retry = status === 429 ? body?.error?.data?.retry_after : undefined;
  if (Number.isInteger(retry)) headers['retry-after'] = String(Math.ceil(retry / 1000));
  res.writeHead(status, headers);
  res.end(text);
}

function errorBody(code, message) {
  return { error: { code, message } };
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

function bearer(req) {
  const a = req.headers.authorization;
  return a && a.startsWith('Bearer ') ? a.slice(7).trim() : null;
}

/** Parses a frame `{id, method, params}` in the core, keeping params as the exact text sent. */
function parseFrame(relay, text) {
  const f = relay.core.parseFrame(text);
  if (!f.error && f.method.startsWith('admin.')) return { id: f.id, error: { code: 'not_found', message: 'unknown method' } };
  return f;
}

/**
 * Serves a relay over HTTP and WebSocket.
 * @param {import('./relay.js').Relay} relay
 * @param {{host?: string, port?: number}} listen
 * @returns {Promise<{server: http.Server, port: number, close: () => Promise<void>}>}
 */
export async function serve(relay, listen = {}) {
  /** @type {Map<string, Set<{device: string, ws: import('ws').WebSocket}>>} */
  const sockets = new Map();
  relay.on('notify', ({ account, latest_seq }) => {
    const frame = JSON.stringify({ method: 'message.timeline.changed', params: { account, latest_seq } });
    for (const c of sockets.get(account) ?? []) c.ws.send(frame);
  });
  relay.on('end_device_sessions', ({ account, device_id }) => {
    for (const c of sockets.get(account) ?? []) if (c.device === device_id) c.ws.close(4401, 'device revoked');
  });

  const server = http.createServer(async (req, res) => {
    try {
      const url = new URL(req.url, 'http://relay');
      if (req.method === 'GET' && url.pathname === '/.well-known/relay') return send(res, 200, relay.wellKnown());
      const m = /^\/(v1|relay\/v1|admin\/v1)\/([a-z.]+)$/.exec(url.pathname);
      if (req.method !== 'POST' || !m) return send(res, 404, errorBody('not_found', 'no such route'));
      const body = await readBody(req, relay.maxRequestBytes);
      if (body === null) return send(res, 413, errorBody('payload_too_large', `request body exceeds max_request_bytes ${relay.maxRequestBytes}`));
      const text = body.toString('utf8');
      // The core's own strict parser judges the body before the relay is called.
      const bad = Buffer.from(text, 'utf8').equals(body) ? relay.core.checkJson(text) : { status: 400, body: errorBody('invalid_params', 'invalid JSON: invalid UTF-8') };
      if (bad) return send(res, bad.status, bad.body);
      const [, space, method] = m;
      if (space === 'v1') {
        if (method.startsWith('admin.')) return send(res, 404, errorBody('not_found', 'unknown method'));
        const token = bearer(req);
        const r = await relay.callGrouped(token ? { kind: 'session', value: token } : { kind: 'anonymous' }, method, text);
        return send(res, r.status, r.body);
      }
      if (space === 'admin/v1') {
        if (bearer(req) !== relay.adminToken) return send(res, 401, errorBody('unauthenticated', 'operator token required'));
        const r = relay.call({ kind: 'operator' }, `admin.${method}`, text);
        return send(res, r.status, r.body);
      }
      if (!RELAY_METHODS.has(method)) return send(res, 404, errorBody('not_found', 'not a relay method'));
      const auth = await relay.authenticateRelay(req.headers, method, text);
      if (!auth.ok) return send(res, auth.reply.status, auth.reply.body);
      const r = await relay.callGrouped({ kind: 'relay', value: auth.source }, method, text);
      return send(res, r.status, r.body);
    } catch (e) {
      console.error('request failed:', e);
      if (!res.headersSent) send(res, 500, errorBody('internal', 'the relay failed; nothing was accepted'));
    }
  });

  const wss = new WebSocketServer({ noServer: true, maxPayload: relay.maxRequestBytes + 1024 });
  server.on('upgrade', (req, socket, head) => {
    const url = new URL(req.url, 'http://relay');
    if (url.pathname !== '/v1/ws') return socket.destroy();
    const token = bearer(req) ?? url.searchParams.get('session');
    const s = token ? relay.session(token) : { ok: false };
    if (!s.ok) {
      socket.write('HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n');
      return socket.destroy();
    }
    wss.handleUpgrade(req, socket, head, (ws) => {
      const { account, device_id: device, expires_at: expires } = s.info;
      const entry = { device, ws };
      if (!sockets.has(account)) sockets.set(account, new Set());
      sockets.get(account).add(entry);
      const expiry = setTimeout(() => ws.close(4401, 'session expired'), Math.max(0, Math.min(expires - Date.now(), 2 ** 31 - 1)));
      ws.on('message', (data) => {
        const frame = parseFrame(relay, data.toString('utf8'));
        if (frame.error) return ws.send(JSON.stringify({ id: frame.id, error: frame.error }));
        const r = relay.call({ kind: 'session', value: token }, frame.method, frame.params);
        ws.send(JSON.stringify(r.status === 200 ? { id: frame.id, result: r.body } : { id: frame.id, error: r.body.error }));
        if (r.status === 401) ws.close(4401, 'session ended');
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
      await relay.close();
    },
  };
}
