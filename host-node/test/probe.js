// Helpers of the hostile-input tests (issue 18): relay-node processes, raw sockets and raw
// WebSocket frames, and the check every probe ends with (the relay still answers and delivers).

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import httpLib from 'node:http';
import https from 'node:https';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Identity } from '../pkg/relay_wasm.js';
import { freePort } from './helpers.js';

export { freePort };

const BIN = new URL('../bin/relay-node.js', import.meta.url).pathname;

export const tmp = (name) => fs.mkdtempSync(path.join(os.tmpdir(), `relay-node-${name}-`));

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * A `relay-node serve` process on a fresh port and data directory. `url` is where to reach
 * it (http or https), `id` its relay id. Its stderr is kept in `log()`.
 * @param {string[]} args extra flags
 * @param {{env?: Record<string, string>, scheme?: string, host?: string, id?: (port: number) => string, nodeArgs?: string[]}} [o]
 */
export async function relayNode(args = [], o = {}) {
  const port = await freePort();
  const scheme = o.scheme ?? 'http';
  const host = o.host ?? '127.0.0.1';
  const id = o.id ? o.id(port) : `${scheme}://${host}:${port}`;
  const data = tmp('probe');
  const proc = spawn(process.execPath, [...(o.nodeArgs ?? []), BIN, 'serve', '--listen', `127.0.0.1:${port}`, '--url', id, '--data', data, ...args], {
    env: { ...process.env, ...(o.env ?? {}) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let err = '';
  proc.stderr.on('data', (d) => (err += d));
  let out = '';
  const exited = new Promise((resolve) => proc.once('exit', (code, signal) => resolve({ code, signal })));
  await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`relay-node did not start:\n${err}`)), 20000);
    proc.stdout.on('data', (d) => {
      out += d;
      if (out.includes('listening')) {
        clearTimeout(t);
        resolve(undefined);
      }
    });
    proc.once('exit', (code) => {
      clearTimeout(t);
      reject(new Error(`relay-node exited (${code}):\n${err}`));
    });
  });
  return {
    proc,
    port,
    id,
    url: `${scheme}://127.0.0.1:${port}`,
    data,
    exited,
    log: () => err,
    /** Whether the process is still running. */
    alive: () => proc.exitCode === null && proc.signalCode === null,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill('SIGTERM');
        const t = setTimeout(() => proc.kill('SIGKILL'), 10000);
        await exited;
        clearTimeout(t);
      }
      fs.rmSync(data, { recursive: true, force: true });
    },
  };
}

/**
 * POSTs JSON to `url` over node:http(s) (a CA of the test's own is accepted); `{status, headers, body}`.
 * @param {string} url @param {string | object} body @param {string} [session] @param {{ca?: string}} [o]
 */
export function post(url, body, session, o = {}) {
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const req = (u.protocol === 'https:' ? https : httpLib).request(
      u,
      {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...(session ? { authorization: `Bearer ${session}` } : {}) },
        ...(o.ca ? { ca: o.ca } : {}),
        agent: false,
      },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => {
          const t = Buffer.concat(chunks).toString('utf8');
          let b;
          try {
            b = JSON.parse(t);
          } catch {
            b = t;
          }
          resolve({ status: res.statusCode, headers: res.headers, body: b });
        });
        res.on('error', reject);
      },
    );
    req.setTimeout(10000, () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end(text);
  });
}

/** An account with one device at the relay `id` reached at `url`, on `network`. */
export async function account(url, id, { network = 'dev', ca, discoverable = true } = {}) {
  const ident = new Identity();
  const cert = ident.certificate(network, 'send,sync,manage', Date.now() - 1000);
  const r = await post(`${url}/v1/account.register`, `{"route":${ident.route(network, id, 1, Date.now())},"certificate":${cert},"discoverable":${discoverable}}`, undefined, { ca });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  const s = await post(`${url}/v1/session.open`, ident.sessionOpen(network, id, Date.now()), undefined, { ca });
  assert.equal(s.status, 200, JSON.stringify(s.body));
  return { id: ident, cert, url, relay: id, network, ca, session: s.body.session };
}

/** Polls until `f()` is truthy. */
export async function eventually(f, ms = 10000) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > end) throw new Error('timed out');
    await sleep(50);
  }
}

/** The texts in `user`'s timeline, decrypted. */
export async function timeline(user) {
  const r = await post(`${user.url}/v1/message.timeline.sync`, { after: 0 }, user.session, { ca: user.ca });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  return r.body.entries.map((e) => user.id.openEntry(JSON.stringify(e)));
}

/** Sends `text` from `from` to `to` (to's route must be known where `from` lives); the answer. */
export async function sendText(from, to, text) {
  const m = from.id.message(from.network, to.id.accountId(), `[${to.cert}]`, text, Date.now(), false);
  return post(`${from.url}/v1/message.send`, m, from.session, { ca: from.ca });
}

/**
 * The check each probe ends with: within a few seconds the relay at `url` (relay id `id`)
 * answers, and delivers a message from a new account to another.
 */
export async function stillServes(url, id = url, o = {}) {
  const started = Date.now();
  const alice = await account(url, id, o);
  const bob = await account(url, id, o);
  const text = `still here ${crypto.randomUUID()}`;
  const sent = await sendText(alice, bob, text);
  assert.equal(sent.status, 200, JSON.stringify(sent.body));
  await eventually(async () => (await timeline(bob)).includes(text), 5000);
  assert.ok(Date.now() - started < 8000, `answered and delivered, but in ${Date.now() - started} ms`);
}

/** A raw TCP connection; resolves once connected. @param {number} port @param {object} [o] */
export function connect(port, o = {}) {
  return new Promise((resolve, reject) => {
    const s = net.connect({ port, host: '127.0.0.1', ...o }, () => resolve(s));
    s.on('error', reject);
  });
}

/**
 * What happens to a raw connection: the bytes it received and when it closed (ms after the
 * call), or `closed: false` if it is still open after `wait` ms.
 * @param {net.Socket} s @param {number} wait
 * @returns {Promise<{closed: boolean, after: number, data: string}>}
 */
export function outcome(s, wait) {
  const t0 = Date.now();
  let data = '';
  s.on('data', (d) => (data += d.toString('latin1')));
  s.on('error', () => {});
  return new Promise((resolve) => {
    if (s.destroyed) return resolve({ closed: true, after: 0, data });
    const t = setTimeout(() => resolve({ closed: false, after: wait, data }), wait);
    s.once('close', () => {
      clearTimeout(t);
      resolve({ closed: true, after: Date.now() - t0, data });
    });
  });
}

/**
 * A WebSocket opened by hand on a raw socket (so frames of any shape can be written):
 * resolves with the socket and the bytes after the 101 answer, or rejects with the answer.
 */
export async function rawWebSocket(port, target, token) {
  const s = await connect(port);
  const key = crypto.randomBytes(16).toString('base64');
  s.write(`GET ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: ${key}\r\nSec-WebSocket-Version: 13\r\n${token ? `Authorization: Bearer ${token}\r\n` : ''}\r\n`);
  let buf = Buffer.alloc(0);
  await new Promise((resolve, reject) => {
    const onData = (d) => {
      buf = Buffer.concat([buf, d]);
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      s.off('data', onData);
      const head = buf.subarray(0, end).toString('latin1');
      buf = buf.subarray(end + 4);
      if (!head.startsWith('HTTP/1.1 101')) reject(new Error(head));
      else resolve(undefined);
    };
    s.on('data', onData);
    s.once('close', () => reject(new Error(`closed during the handshake: ${buf.toString('latin1')}`)));
  });
  return { socket: s, rest: buf };
}

/**
 * One WebSocket frame as a client writes it.
 * @param {number} opcode @param {Buffer | string} payload
 * @param {{mask?: boolean, rsv1?: boolean, fin?: boolean}} [o]
 */
export function frame(opcode, payload, { mask = true, rsv1 = false, fin = true } = {}) {
  const p = Buffer.from(payload);
  const head = [(fin ? 0x80 : 0) | (rsv1 ? 0x40 : 0) | opcode];
  const m = mask ? 0x80 : 0;
  if (p.length < 126) head.push(m | p.length);
  else if (p.length < 65536) head.push(m | 126, p.length >> 8, p.length & 0xff);
  else {
    head.push(m | 127, 0, 0, 0, 0);
    head.push((p.length >>> 24) & 0xff, (p.length >>> 16) & 0xff, (p.length >>> 8) & 0xff, p.length & 0xff);
  }
  if (!mask) return Buffer.concat([Buffer.from(head), p]);
  const key = crypto.randomBytes(4);
  const masked = Buffer.from(p.map((b, i) => b ^ key[i % 4]));
  return Buffer.concat([Buffer.from(head), key, masked]);
}

/**
 * The frames a server sent on a raw WebSocket until it closed (or `wait` ms): opcodes, and
 * the close code if a close frame came.
 * @param {{socket: net.Socket, rest: Buffer}} ws @param {number} wait
 * @returns {Promise<{opcodes: number[], closeCode: number | null, closed: boolean}>}
 */
export function serverFrames(ws, wait) {
  let buf = ws.rest;
  const opcodes = [];
  let closeCode = null;
  const parse = () => {
    for (;;) {
      if (buf.length < 2) return;
      let len = buf[1] & 0x7f;
      let off = 2;
      if (len === 126) {
        if (buf.length < 4) return;
        len = buf.readUInt16BE(2);
        off = 4;
      } else if (len === 127) {
        if (buf.length < 10) return;
        len = Number(buf.readBigUInt64BE(2));
        off = 10;
      }
      if (buf.length < off + len) return;
      const op = buf[0] & 0x0f;
      opcodes.push(op);
      if (op === 8 && len >= 2) closeCode = buf.readUInt16BE(off);
      buf = buf.subarray(off + len);
    }
  };
  parse();
  return new Promise((resolve) => {
    const done = (closed) => {
      clearTimeout(t);
      resolve({ opcodes, closeCode, closed });
    };
    const t = setTimeout(() => done(false), wait);
    ws.socket.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      parse();
    });
    ws.socket.on('error', () => {});
    if (ws.socket.destroyed) done(true);
    else ws.socket.once('close', () => done(true));
  });
}

/** Headers that pass the core's cheap checks of a relay request from `relayId` (never a valid signature). */
export function unsignedRelayHeaders(relayId) {
  return {
    'relay-id': relayId,
    'relay-timestamp': String(Date.now()),
    'relay-nonce': crypto.randomBytes(16).toString('base64url'),
    'relay-signature': crypto.randomBytes(64).toString('base64url'),
  };
}

/**
 * A server that counts its connections and requests and answers each as `answer` says
 * (`hang`: never answers).
 * @param {'hang' | 'fail' | ((req: import('node:http').IncomingMessage, res: import('node:http').ServerResponse) => void)} answer
 */
export async function countingServer(answer = 'fail') {
  const counts = { connections: 0, requests: 0 };
  const held = new Set();
  const srv = httpLib.createServer((req, res) => {
    counts.requests += 1;
    if (answer === 'hang') {
      held.add(res);
      return;
    }
    if (answer === 'fail') {
      res.writeHead(500).end('no');
      return;
    }
    answer(req, res);
  });
  srv.on('connection', (s) => {
    counts.connections += 1;
    s.on('error', () => {});
  });
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  return {
    counts,
    port: srv.address().port,
    url: `http://127.0.0.1:${srv.address().port}`,
    close: () =>
      new Promise((r) => {
        srv.closeAllConnections();
        srv.close(r);
      }),
  };
}
