// A Worker for the trap test (edge.test.js): a core over a storage in memory, a trap in the
// wasm instance, then `reset()` and a fresh core over the same storage, as an object does.
import { RelayCore, reset, generation } from '../src/edge/core.js';

/** The core's storage in memory (keys compared as bytes). */
class Memory {
  constructor() {
    /** @type {Map<string, [Uint8Array, Uint8Array]>} */
    this.rows = new Map();
  }
  static id(k) {
    return Array.from(k, (b) => b.toString(16).padStart(2, '0')).join('');
  }
  get(k) {
    return this.rows.get(Memory.id(k))?.[1] ?? null;
  }
  scan(start, end, limit) {
    const [s, e] = [Memory.id(start), Memory.id(end)];
    return [...this.rows.keys()].filter((k) => k >= s && k < e).sort().slice(0, limit).map((k) => this.rows.get(k));
  }
  commit(writes) {
    for (const [k, v] of writes) {
      if (v === null) this.rows.delete(Memory.id(k));
      else this.rows.set(Memory.id(k), [k, v]);
    }
  }
}

export default {
  async fetch() {
    const store = new Memory();
    const config = JSON.stringify({ relay: 'http://127.0.0.1:1', network: 'dev', policies: {} });
    const first = new RelayCore(config, store, new Uint8Array(32), 'token');
    const before = { generation, relay: JSON.parse(first.wellKnown()).relay };
    // A RelayCore whose pointer is outside the wasm memory: entering it traps.
    const bogus = Object.create(RelayCore.prototype);
    bogus.__wbg_ptr = 0x7ffffff0;
    let trap = null;
    try {
      bogus.tick(Date.now());
    } catch (e) {
      trap = { runtimeError: e instanceof WebAssembly.RuntimeError, message: String(e.message) };
    }
    first.__destroy_into_raw();
    reset();
    const fresh = new RelayCore(config, store, new Uint8Array(32), 'token');
    const after = { generation, relay: JSON.parse(fresh.wellKnown()).relay, tick: fresh.tick(Date.now()) };
    return Response.json({ before, trap, after, keys: store.rows.size });
  },
};
