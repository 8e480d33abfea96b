// The environment knobs (README: "Environment knobs"): settings for measuring and debugging,
// never needed to run a relay. Their table is relay-settings' `KNOBS`, written by xtask into
// pkg/tuning.json; this reads the process's environment by it, once. A malformed value is
// an Error naming the variable, as on the wasmtime host.

import fs from 'node:fs';

/** @type {Array<{name: string, kind: 'switch' | 'count' | 'path', default: string, hosts: string[], doc: string}>} */
export const KNOBS = JSON.parse(fs.readFileSync(new URL('../pkg/tuning.json', import.meta.url), 'utf8'));

/**
 * The knobs' values from `env` (default: the process's).
 * @param {Record<string, string | undefined>} [env]
 * @returns {{preverify: boolean, groupCommit: number | null, ownVerify: boolean, ownSha256: boolean, nativeRequired: boolean, nodeThread: boolean}}
 */
export function tuningOf(env = process.env) {
  const value = (name) => {
    const knob = KNOBS.find((k) => k.name === name);
    if (!knob) throw new Error(`no knob ${name} in pkg/tuning.json`);
    const v = (env[name] ?? '').trim();
    return [knob, v === '' ? knob.default : v];
  };
  const switched = (name) => {
    const [k, v] = value(name);
    if (v !== '0' && v !== '1') throw new Error(`${k.name}=${v}: takes 0 or 1`);
    return v === '1';
  };
  const count = (name) => {
    const [k, v] = value(name);
    if (v === '') return null;
    if (!/^\d+$/.test(v)) throw new Error(`${k.name}=${v}: takes a count (0, 1, 2, ...)`);
    return Number(v);
  };
  return {
    preverify: switched('RELAY_PREVERIFY'),
    groupCommit: count('RELAY_GROUP_COMMIT'),
    ownVerify: switched('RELAY_OWN_VERIFY'),
    ownSha256: switched('RELAY_OWN_SHA256'),
    nativeRequired: switched('RELAY_NATIVE_REQUIRED'),
    nodeThread: switched('RELAY_NODE_THREAD'),
  };
}

/** This process's knobs, read once (at first use). */
let read = null;
export const tuning = () => (read ??= tuningOf());
