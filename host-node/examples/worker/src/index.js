// A Worker of your own that is a relay: relay-node's `workerd` export is the relay's Worker and
// its Durable Object class (wrangler resolves it under the `workerd` condition).
export { default, RelayShard } from 'relay-node';
