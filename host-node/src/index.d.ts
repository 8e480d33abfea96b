import { EventEmitter } from 'node:events';
import { Server } from 'node:http';

/** Log levels, as RELAY_LOG names them. */
export type LogLevel = 'error' | 'warn' | 'info' | 'debug';
/** `text` lines, or one JSON object per line. */
export type LogFormat = 'text' | 'json';
/** Extra fields of a log line. */
export type LogFields = Record<string, string | number | boolean | null | undefined | object>;

/**
 * A relay's log. In `json`, every line is `{timestamp, level, message, ...fields}` (level
 * `ERROR`, `WARN`, `INFO` or `DEBUG`, as the wasmtime host's tracing json), and each accepted
 * message and each terminal delivery outcome is a line of its own (ids only):
 * `{event: 'accepted', method, message_id, from, to, status}` and
 * `{event: 'delivery_ended', message_id, from, to, status, error_code}`. In `text` those
 * come at debug only.
 */
export class Log {
  /** `level` defaults to RELAY_LOG (else info); `write` gets each line without its newline (default: stderr). */
  constructor(opts?: { format?: LogFormat; level?: LogLevel; write?: (line: string) => void });
  readonly format: LogFormat;
  /** Whether per-message events are written. */
  readonly events: boolean;
  error(msg: string, fields?: LogFields): void;
  warn(msg: string, fields?: LogFields): void;
  info(msg: string, fields?: LogFields): void;
  debug(msg: string, fields?: LogFields): void;
  event(e: { event: string } & LogFields): void;
}

/** Whether a relay can serve (`/readyz`), and why not. */
export interface Readiness {
  ready: boolean;
  reason?: string;
}

/** What a backup wrote. */
export interface BackupResult {
  /** The file (absolute). */
  path: string;
  /** Its size. */
  bytes: number;
}

/** Storage the core runs on: synchronous, ordered, atomic batches. */
export interface Storage {
  /** The value at `key`, or null. */
  get(key: Uint8Array): Uint8Array | null | undefined;
  /** Up to `limit` entries with start <= key < end, in byte order. */
  scan(start: Uint8Array, end: Uint8Array, limit: number): Array<[Uint8Array, Uint8Array]>;
  /** Applies every write (null deletes) or none, durably, before returning. */
  commit(writes: Array<[Uint8Array, Uint8Array | null]>): void;
  close?(): void;
  /** False once the storage is closed (`/readyz`); absent means open. */
  readonly isOpen?: boolean;
  /** Copies the store to a file (written whole, mode 0600) while it is in use; needed for `admin backup`. */
  backup?(file: string): Promise<BackupResult>;
  /** True when a commit costs a sync to disk: the relay then groups concurrent calls' commits into one (the core's group commit). */
  readonly durable?: boolean;
  /** Operations in the commit being made (the relay sets it while the core flushes a group; for metrics). */
  batch?: number;
}

export class MemoryStorage implements Storage {
  constructor();
  get(key: Uint8Array): Uint8Array | null;
  scan(start: Uint8Array, end: Uint8Array, limit: number): Array<[Uint8Array, Uint8Array]>;
  commit(writes: Array<[Uint8Array, Uint8Array | null]>): void;
  readonly size: number;
}

/**
 * The SQLite a runtime offers: `bun:sqlite` on Bun, `node:sqlite` on Node 22.13+ and Deno 2.2+,
 * `better-sqlite3` where the user installed it (Node 20's only way to disk storage).
 */
export type SqliteDriver = 'node:sqlite' | 'bun:sqlite' | 'better-sqlite3';

export class SqliteStorage implements Storage {
  /**
   * `exclusive` (default true): hold the database's lock while open, so a second relay on it
   * fails. `driver`: which SQLite (default: the first the runtime offers, in the order of
   * `SqliteDriver`); none offered throws an Error that names the fix.
   */
  constructor(file: string, opts?: { exclusive?: boolean; driver?: SqliteDriver });
  /** The SQLite it runs on. */
  readonly driver: SqliteDriver;
  /** True: each commit is a sync to disk, so the relay groups them. */
  readonly durable: boolean;
  get(key: Uint8Array): Uint8Array | null;
  scan(start: Uint8Array, end: Uint8Array, limit: number): Array<[Uint8Array, Uint8Array]>;
  commit(writes: Array<[Uint8Array, Uint8Array | null]>): void;
  close(): void;
  readonly isOpen: boolean;
  /**
   * A consistent copy of the database at `file` with SQLite's online backup API, while the
   * relay goes on: commits made during the copy are carried into it, so it holds exactly
   * what was committed when it ends. Made in `file.partial` (0600), one self-contained file
   * (journal mode DELETE), synced, then renamed over `file`.
   */
  backup(file: string): Promise<BackupResult>;
  /** Told of each commit made outside a commit group: `(1, seconds)`. */
  onCommit: ((size: number, seconds: number) => void) | null;
}

/**
 * Who calls. `origin` is the network address the caller connected from (an IP address, no
 * port; `serve` passes `req.socket.remoteAddress`): anonymous calls are also limited per
 * address (policy `anonymous_rate`). Leave it out for an in-process caller.
 */
export type Caller =
  | { kind: 'anonymous'; origin?: string | null }
  | { kind: 'session'; value: string; origin?: string | null }
  /** A relay calling in process; `routeRevision`: the recipient's route revision a `message.deliver` targets. */
  | { kind: 'relay'; value: string; routeRevision?: number; origin?: string | null }
  | { kind: 'operator'; origin?: string | null };

/** A JSON value as the core writes it (canonical JSON; protocol integers are numbers). */
export type Json = null | boolean | number | string | Json[] | { [member: string]: Json };

/** A protocol error (protocol.md §4): `code` is one of the error codes of protocol.md §5. */
export interface ProtocolError {
  code:
    | 'invalid_params' | 'payload_too_large' | 'unauthenticated' | 'permission_denied'
    | 'invalid_signature' | 'invalid_certificate' | 'clock_skew' | 'message_expired'
    | 'authorization_invalid' | 'discovery_disabled' | 'device_unknown' | 'not_home_relay'
    | 'state_conflict' | 'rate_limited' | 'not_found' | 'unavailable' | 'internal';
  message: string;
  data?: { [member: string]: Json };
}

/** A method's answer: 200 and the result object, or an error status and `{error}`. */
export type Reply =
  | { status: 200; body: { [member: string]: Json } }
  | { status: number; body: { error: ProtocolError } };

/** A request read whole, as the core takes it. */
export interface HttpRequest {
  /** Whether it came to the admin listener. */
  admin: boolean;
  /** `GET`, `POST`, ... */
  method: string;
  /** The target's path, without the query. */
  path: string;
  /** The query without `?` ('' when none). */
  query: string;
  /** `name\nvalue\n` for each header the core reads that is present (lowercase names). */
  headers: string;
  body: Uint8Array;
  /** The peer's IP address, no port; null in process. */
  origin: string | null;
}

/** An answer to write as it is. */
export interface HttpAnswer {
  status: number;
  /** `content-type`, and `retry-after` with 429 and 503. */
  headers: Record<string, string>;
  body: Uint8Array;
}

/** Who a WebSocket belongs to; the host closes it with `expiry_close` (the core's 4401 "session expired") at `expires_at`. */
export interface WebSocketSession {
  token: string;
  account: string;
  device_id: string;
  expires_at: number;
  expiry_close: { code: number; reason: string };
}

/** The core's answer to a WebSocket text message. */
export interface SocketAnswer {
  /** The answer frame to send. */
  text: string;
  /** Close the socket after it with this code and reason. */
  close: [number, string] | null;
}

/** An account's timeline changed: `frame` is the notification to send to its WebSockets. */
export interface Notification {
  account: string;
  latest_seq: number;
  frame: string;
}

/** Every WebSocket of this device is to close with `code` and `reason` (a revoked device). */
export interface SessionsEnded {
  account: string;
  device_id: string;
  code: number;
  reason: string;
}

/**
 * The transport limits of protocol.md §6 (issue 18), each with its `relay-node serve` flag
 * and TOML key; every one a positive integer.
 */
export interface Limits {
  /** `--header-timeout` (default 10000 ms): request line and headers within it, else 408 and close. */
  headerTimeout?: number;
  /** `--body-timeout` (default 30000 ms): the whole body within it once the headers are in, else 408 and close. */
  bodyTimeout?: number;
  /** `--idle-timeout` (default 60000 ms): an idle keep-alive connection is closed (node:http adds a second of grace). */
  idleTimeout?: number;
  /** `--ws-ping-interval` (default 30000 ms): every WebSocket is pinged; no frame since the last ping closes it. */
  wsPingInterval?: number;
  /** `--max-connections` (default 1000): open TCP connections at most; beyond, new ones are closed at accept. */
  maxConnections?: number;
  /** `--max-connections-per-ip` (default 64): the same, per peer IP address. */
  maxConnectionsPerIp?: number;
  /** `--ws-send-queue` (default 256): frames queued per WebSocket at most; a client that lets it fill is dropped. */
  wsSendQueue?: number;
  /** `--max-pending` (default 1024): requests waiting for the core at most; beyond, 503 unavailable with Retry-After 1. */
  maxPending?: number;
}

/** What `serve` takes beside the listen address: the limits, and a certificate to serve HTTPS and WSS with. */
export interface ServeOptions extends Limits {
  /** PEM certificate (chain) for the public listener (`--tls-cert`); with `tlsKey`, it serves HTTPS and WSS only. */
  tlsCert?: string | Buffer;
  /** Its PEM private key (`--tls-key`). */
  tlsKey?: string | Buffer;
}

export interface RelayOptions extends ServeOptions {
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
  /** Which SQLite `storage: 'sqlite'` runs on (default: the first the runtime offers). */
  sqliteDriver?: SqliteDriver;
  /** Engine tunables. */
  engine?: { attempt_timeout?: number; max_in_flight_per_destination?: number };
  /** Where `serve` puts the admin listener (admin API, /metrics, /healthz, /readyz), `HOST:PORT`. Default `127.0.0.1:0`. */
  adminListen?: string;
  /** Default `text`. */
  logFormat?: LogFormat;
  /** A log of the caller's, instead of one made from `logFormat` (a relay thread makes its own from `log.format`). */
  log?: Log;
  /**
   * Off `dev`, peers are reached over https only and only at public addresses (a name's
   * resolved addresses are checked, and the connection goes to a checked one); this lifts the
   * address check (`--allow-private-peers`), for private deployments and tests.
   */
  allowPrivatePeers?: boolean;
  /** PEM CA certificates trusted for outbound https beside the system's (`--ca`). */
  ca?: string | Buffer | Array<string | Buffer>;
}

/** A protocol error object as the wire carries it (the WIT's `error-object`; `data` is canonical JSON). */
export interface ErrorObject {
  code: string;
  message: string;
  data?: string;
}
/** Why a typed call was refused (the WIT's `failure`); `code` is spelled as the WIT's `error-code` (`state-conflict`). */
export interface Failure {
  code: string;
  status: number;
  error: ErrorObject;
}
/** What a typed call throws: an Error carrying the Failure, as jco throws a WIT `result`'s error. */
export interface TypedCallError extends Error {
  payload: Failure;
}
/** The seed's DeliveryStatus (the WIT's `delivery-status`); times in Unix milliseconds. */
export interface DeliveryStatus {
  messageId: string;
  from: string;
  to: string;
  status: 'delivering' | 'target-accepted' | 'failed';
  acceptedAt: number;
  deadline?: number;
  targetAcceptedAt?: number;
  error?: ErrorObject;
}
/** One timeline entry for the calling device; the signed objects are canonical JSON text. */
export interface TimelineEntry {
  seq: number;
  kind: 'sent' | 'received' | 'self-delivery';
  acceptedAt: number;
  expiresAt: number;
  envelope: string;
  deviceCertificate: string;
  keyBox: string;
}
/** A page of the calling device's timeline: `next` is the next page's `after`. */
export interface TimelinePage {
  entries: TimelineEntry[];
  next: number;
  hasMore: boolean;
}

export class Relay extends EventEmitter {
  readonly relay: string;
  readonly network: string;
  readonly adminToken: string;
  /** The data directory, if any (where `serve` writes `admin.url`). */
  readonly data: string | null;
  /** The storage the core runs on (a SqliteStorage, a MemoryStorage, or the caller's). */
  readonly storage: Storage;
  readonly adminListen: string;
  readonly log: Log;
  /** Calls that entered the core. */
  readonly coreCalls: number;
  /** Calls a method of protocol.md §4 in-process. */
  call(caller: Caller, method: string, params: string | object): Reply;
  /**
   * message.send in process, typed (the WIT's `send`): the DeliveryStatus. A refusal is thrown
   * as a `TypedCallError` (its `payload` the Failure), and nothing was committed.
   */
  send(caller: Caller, params: string | object): DeliveryStatus;
  /** message.deliver in process, typed, as `send` (the caller is a relay). */
  deliver(caller: Caller, params: string | object): DeliveryStatus;
  /** message.delivery.status of the caller's message, typed. */
  status(caller: Caller, messageId: string): DeliveryStatus;
  /** message.timeline.sync of the caller's device, typed: entries after `after`, at most `limit` (default: the protocol's). */
  sync(caller: Caller, after?: number, limit?: number): TimelinePage;
  /** Calls a method in a commit group: concurrent calls share one durable transaction; resolves after it commits. */
  callGrouped(caller: Caller, method: string, params: string | object): Promise<Reply>;
  /** The transports listen (`serve` calls it): the first tick runs if it has not yet. */
  listening(): void;
  /**
   * A request read whole, answered by the core (routing, the operator gate, relay
   * authentication with its key fetches): the answer to write as it is, or the session a
   * `GET /v1/ws` upgrade belongs to. A backup the operator asks for is written here.
   */
  handle(req: HttpRequest): Promise<HttpAnswer | { upgrade: WebSocketSession }>;
  /** A WebSocket text message of the session `token`: the answer frame, and the close to follow it, if any. */
  message(token: string, text: string, origin?: string | null): SocketAnswer;
  /** This relay's /.well-known/relay document. */
  wellKnown(): string;
  /** Storage open, core instance healthy, not shutting down. */
  ready(): Readiness;
  /** The core's counters and pending deliveries, then the host's metrics (attempts, commits, ticks, traps, restarts), Prometheus text. */
  metricsText(): Promise<string>;
  /** A consistent copy of the running relay's SQLite database at `file` (absolute; written whole, mode 0600, replacing any file there). */
  backup(file: string): Promise<BackupResult>;
  /** Stops timers, waits for deliveries in flight, closes the storage. */
  close(): Promise<void>;
  on(event: 'notify', listener: (n: Notification) => void): this;
  on(event: 'end_device_sessions', listener: (d: SessionsEnded) => void): this;
}

export function createRelay(opts: RelayOptions): Promise<Relay>;

/**
 * A relay on a worker thread of its own (core, storage, timers, deliveries to peers), seen
 * from the thread that serves it: the transports and the core then run on two cores.
 */
export class RelayThread extends EventEmitter {
  /** Starts one; the options are plain data (`storage` is 'sqlite' or 'memory'). */
  static start(opts: RelayOptions & { storage?: 'sqlite' | 'memory' }): Promise<RelayThread>;
  /** The transports listen (`serve` calls it): the relay on the thread runs its first tick, held until now. */
  listening(): Promise<void>;
  /** This relay's /.well-known/relay document. */
  readonly wellKnown: string;
  readonly maxRequestBytes: number;
  /** The body limit of relay RPC in batches (`max_batch_bytes`). */
  readonly maxBatchBytes: number;
  readonly data: string | null;
  readonly adminListen: string;
  /** This thread's log (the relay thread logs in the same format). */
  readonly log: Log;
  /** As `Relay.handle`, answered by the thread. */
  handle(req: HttpRequest): Promise<HttpAnswer | { upgrade: WebSocketSession }>;
  /** As `Relay.message`, answered by the thread. */
  message(token: string, text: string, origin?: string | null): Promise<SocketAnswer>;
  /** Counters of the relay on the thread. */
  stats(): Promise<{ coreCalls: number; preverified: number }>;
  /** As `Relay.ready`, asked of the thread; not ready once the thread is gone or closing. */
  ready(): Promise<Readiness>;
  /** As `Relay.metricsText`, asked of the thread at each call (the figures live there). */
  metricsText(): Promise<string>;
  /** Stops the relay on its thread (deliveries in flight finish, the storage closes), then the thread. */
  close(): Promise<void>;
  on(event: 'notify', listener: (n: Notification) => void): this;
  on(event: 'end_device_sessions', listener: (d: SessionsEnded) => void): this;
  /** The thread stopped unasked; its requests' connections were dropped (error code `RELAY_THREAD_LOST`). */
  on(event: 'lost', listener: (e: Error & { code: 'RELAY_THREAD_LOST' }) => void): this;
}

/** What `serve` started. */
export interface Served {
  /** The public listener: HTTP, WebSocket, relay RPC, /.well-known/relay, /healthz, /readyz. */
  server: Server;
  port: number;
  /** The admin listener: `POST /admin/v1/{method}` (operator token), `GET /metrics`, /healthz, /readyz. */
  admin: Server;
  /** Its base URL, e.g. `http://127.0.0.1:43121` (also in `DATA/admin.url` when the relay has a data directory). */
  adminUrl: string;
  /** The public listener's base URL (`https://` when it serves TLS). */
  url: string;
  /** Stops both listeners (/readyz answers 503 from the start), then the relay. */
  close(): Promise<void>;
}

/**
 * Serves a relay (on this thread, or a relay thread) over HTTP, WebSocket and relay RPC on
 * one port, and its admin listener on another (`admin`, else the relay's `adminListen`,
 * else `127.0.0.1:0`). The limits and the TLS certificate come from these options, else from
 * those the relay was made with, else the defaults. Every server, socket and WebSocket has its
 * errors caught; a protocol error on a WebSocket closes that one (1002, 1007, 1009).
 */
export function serve(relay: Relay | RelayThread, listen?: { host?: string; port?: number; handle?: import('node:net').Server; admin?: string } & ServeOptions): Promise<Served>;
