// Test helpers: client identities (keys and signed objects from the core's own builders).
import { Identity } from '../pkg/relay_wasm.js';

export const NET = 'dev';

/** An account with one device, registered at `relay` (a Relay, in-process). */
export function register(relay, discoverable = true) {
  const id = new Identity();
  const cert = id.certificate(NET, 'send,sync,manage', Date.now() - 1000);
  const route = id.route(NET, relay.relay, 1, Date.now());
  const r = relay.call({ kind: 'anonymous' }, 'account.register', `{"route":${route},"certificate":${cert},"discoverable":${discoverable}}`);
  if (r.status !== 200) throw new Error(JSON.stringify(r.body));
  const s = relay.call({ kind: 'anonymous' }, 'session.open', id.sessionOpen(NET, relay.relay, Date.now()));
  if (s.status !== 200) throw new Error(JSON.stringify(s.body));
  return { id, cert, route, session: s.body.session, relay };
}

export const as = (user) => ({ kind: 'session', value: user.session });

/** message.send params from `from` to `to`. */
export function message(from, to, text, senderBoxes = false) {
  return from.id.message(NET, to.id.accountId(), `[${to.cert}]`, text, Date.now(), senderBoxes);
}

/** The decrypted texts of a user's timeline (in-process). */
export function texts(user) {
  const r = user.relay.call(as(user), 'message.timeline.sync', '{"after":0}');
  if (r.status !== 200) throw new Error(JSON.stringify(r.body));
  return r.body.entries.map((e) => user.id.openEntry(JSON.stringify(e)));
}

/** POSTs JSON to a URL; returns {status, body}. */
export async function post(url, body, session) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(session ? { authorization: `Bearer ${session}` } : {}) },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() };
}

/** Polls until `f()` is truthy. */
export async function eventually(f, ms = 10000) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > end) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 50));
  }
}
