// Types of relay-node under the `workerd` condition (and of relay-node/worker): the relay as a
// Cloudflare Worker with its Durable Object class. A Worker of the user's re-exports both:
//   export { default, RelayShard } from 'relay-node';

/** The relay's settings, the `CONFIG` binding (a JSON var). */
export interface RelayConfig {
  /** The relay id: the origin URL it is reached at. */
  relay: string;
  /** Default `dev`. */
  network?: string;
  /** Policies of protocol.md §7 to override. */
  policies?: Record<string, number>;
  /** Shards (one Durable Object each): fixed for the relay's life. Default 1. */
  shards?: number;
  /** Connect to private and loopback peers off `dev`. */
  allow_private_peers?: boolean;
  /** Open a TCP connection first, so a refused peer counts as not attempted (off on Cloudflare). Default true. */
  probe_peers?: boolean;
  attempt_timeout?: number;
  max_in_flight_per_destination?: number;
}

/** A Durable Object namespace, as far as the relay uses it. */
export interface RelayNamespace {
  idFromName(name: string): unknown;
  get(id: unknown): { fetch(input: string | Request, init?: RequestInit): Promise<Response> };
}

/** The Worker's bindings (wrangler.jsonc). */
export interface RelayEnv {
  /** The Durable Object namespace of `RelayShard`. */
  RELAY: RelayNamespace;
  CONFIG: RelayConfig;
  /** Secret: the relay key's 32-byte seed, base64url. */
  RELAY_KEY: string;
  /** Secret: the operator token, base64url. */
  ADMIN_TOKEN: string;
  /** `admin` on the Worker that serves the operator API and /metrics; absent on the public one. */
  DOOR?: 'admin';
}

/** The Worker: reads each request whole and routes it to its shard's object. */
declare const worker: {
  fetch(request: Request, env: RelayEnv): Promise<Response>;
};
export default worker;

/** One shard of the relay: a relay core over the object's SQLite storage (a SQLite-backed Durable Object class). */
export declare class RelayShard {
  constructor(ctx: unknown, env: RelayEnv);
  fetch(request: Request): Promise<Response>;
  alarm(): Promise<void>;
  webSocketMessage(ws: WebSocket, message: string | ArrayBuffer): Promise<void>;
  webSocketClose(ws: WebSocket, code: number, reason: string): void;
  webSocketError(): void;
}
