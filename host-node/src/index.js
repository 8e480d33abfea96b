// relay-node: the relay core in Node.js. Embed a relay (createRelay), run one on a thread of
// its own (RelayThread.start), and serve either (serve).
export { createRelay, Relay } from './relay.js';
export { serve } from './server.js';
export { MemoryStorage, SqliteStorage } from './storage.js';
export { RelayThread } from './relay-thread.js';
export { Log } from './log.js';
