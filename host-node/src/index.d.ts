import { EventEmitter } from 'node:events';
import { Server } from 'node:http';

/** Storage the core runs on: synchronous, ordered, atomic batches. */
export interface Storage {
  /** The value at `key`, or null. */
  get(key: Uint8Array): Uint8Array | null | undefined;
  /** Up to `limit` entries with start <= key < end, in byte order. */
  scan(start: Uint8Array, end: Uint8Array, limit: number): Array<[Uint8Array, Uint8Array]>;
  /** Applies every write (null deletes) or none, durably, before returning. */
  commit(writes: Array<[Uint8Array, Uint8Array | null]>): void;
  close?(): void;
}

export class MemoryStorage implements Storage {
  constructor();
  get(key: Uint8Array): Uint8Array | null;
  scan(start: Uint8Array, end: Uint8Array, limit: number): Array<[Uint8Array, Uint8Array]>;
  commit(writes: Array<[Uint8Array, Uint8Array | null]>): void;
  readonly size: number;
}

export class SqliteStorage implements Storage {
  /** `exclusive` (default true): hold the database's lock while open, so a second relay on it fails. */
  constructor(file: string, opts?: { exclusive?: boolean });
  get(key: Uint8Array): Uint8Array | null;
  scan(start: Uint8Array, end: Uint8Array, limit: number): Array<[Uint8Array, Uint8Array]>;
  commit(writes: Array<[Uint8Array, Uint8Array | null]>): void;
  close(): void;
}

/**
 * Who calls. `origin` is the network address the caller connected from (an IP address, no
 * port; `serve` passes `req.socket.remoteAddress`): anonymous calls are also limited per
 * address (policy `anonymous_rate`). Leave it out for an in-process caller.
 */
export type Caller =
  | { kind: 'anonymous'; origin?: string | null }
  | { kind: 'session'; value: string; origin?: string | null }
  | { kind: 'relay'; value: string; origin?: string | null }
  | { kind: 'operator'; origin?: string | null };

/** A method's answer: HTTP status and the result or `{error}` object. */
export interface Reply {
  status: number;
  body: any;
}

export interface RelayOptions {
  /** The relay id: its origin URL. */
  relay: string;
  /** Default `dev`. */
  network?: string;
  /** Policies of protocol.md §7 to override. */
  policies?: Record<string, number>;
  /** `sqlite` (needs `data`), `memory`, or any Storage. Default: sqlite with `data`, else memory. */
  storage?: 'sqlite' | 'memory' | Storage;
  /** Data directory: SQLite database, relay key, operator token. */
  data?: string;
  /** Engine tunables. */
  engine?: { attempt_timeout?: number; max_in_flight_per_destination?: number };
}

export class Relay extends EventEmitter {
  readonly relay: string;
  readonly network: string;
  readonly adminToken: string;
  /** Calls that entered the core. */
  readonly coreCalls: number;
  /** Calls a method of protocol.md §4 in-process. */
  call(caller: Caller, method: string, params: string | object): Reply;
  /** Calls a method in a commit group: concurrent calls share one durable transaction; resolves after it commits. */
  callGrouped(caller: Caller, method: string, params: string | object): Promise<Reply>;
  /** The holder of a session token. */
  session(token: string): { ok: true; info: { account: string; device_id: string; expires_at: number } } | { ok: false; reply: Reply };
  /** This relay's /.well-known/relay document. */
  wellKnown(): string;
  /** Stops timers, waits for deliveries in flight, closes the storage. */
  close(): Promise<void>;
  on(event: 'notify', listener: (n: { account: string; latest_seq: number }) => void): this;
  on(event: 'end_device_sessions', listener: (d: { account: string; device_id: string }) => void): this;
}

export function createRelay(opts: RelayOptions): Promise<Relay>;

/**
 * A relay on a worker thread of its own (core, storage, timers, deliveries to peers), seen
 * from the thread that serves it: the transports and the core then run on two cores.
 */
export class RelayThread extends EventEmitter {
  /** Starts one; the options are plain data (`storage` is 'sqlite' or 'memory'). */
  static start(opts: RelayOptions & { storage?: 'sqlite' | 'memory' }): Promise<RelayThread>;
  /** This relay's /.well-known/relay document. */
  readonly wellKnown: string;
  readonly maxRequestBytes: number;
  /** Counters of the relay on the thread. */
  stats(): Promise<{ coreCalls: number; preverified: number }>;
  /** Stops the relay on its thread (deliveries in flight finish, the storage closes), then the thread. */
  close(): Promise<void>;
  on(event: 'notify', listener: (n: { account: string; latest_seq: number }) => void): this;
  on(event: 'end_device_sessions', listener: (d: { account: string; device_id: string }) => void): this;
  /** The thread stopped unasked; its requests' connections were dropped (error code `RELAY_THREAD_LOST`). */
  on(event: 'lost', listener: (e: Error & { code: 'RELAY_THREAD_LOST' }) => void): this;
}

/** Serves a relay (on this thread, or a relay thread) over HTTP, WebSocket and relay RPC on one port. */
export function serve(relay: Relay | RelayThread, listen?: { host?: string; port?: number }): Promise<{ server: Server; port: number; close(): Promise<void> }>;
