// relay-node: the relay core in Node.js. Embed a relay (createRelay) or serve one (serve).
export { createRelay, Relay } from './relay.js';
export { serve } from './server.js';
export { MemoryStorage, SqliteStorage } from './storage.js';
