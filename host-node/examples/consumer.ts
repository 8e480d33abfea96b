// Every export of relay-node and relay-node/client, used as a TypeScript app would: `./x test`
// type-checks this file (tsc --noEmit, strict) against the packed package's declarations.
import {
  createRelay,
  serve,
  Relay,
  RelayThread,
  MemoryStorage,
  SqliteStorage,
  Log,
  type Caller,
  type Reply,
  type Storage,
  type SqliteDriver,
  type Served,
  type Notification,
  type ProtocolError,
  type HttpAnswer,
  type WebSocketSession,
  type DeliveryStatus,
  type TimelinePage,
  type TypedCallError,
} from 'relay-node';
import { Identity, RelayError, moveAccount, openSession, type Moved } from 'relay-node/client';

const log: Log = new Log({ format: 'json', level: 'info', write: (line: string) => void line });
const memory: Storage = new MemoryStorage();
const disk = new SqliteStorage('/tmp/relay-types/relay.sqlite', { driver: 'node:sqlite' });
const driver: SqliteDriver = disk.driver;

async function main(): Promise<void> {
  const relay: Relay = await createRelay({ relay: 'http://127.0.0.1:9000', storage: memory, log, sqliteDriver: driver });
  relay.on('notify', (n: Notification) => console.log(n.account, n.latest_seq));
  const anonymous: Caller = { kind: 'anonymous' };
  const reply: Reply = relay.call(anonymous, 'account.register', '{}');
  if (reply.status !== 200) {
    const error: ProtocolError = reply.body.error as ProtocolError;
    console.log(error.code, error.message);
  }
  const grouped: Reply = await relay.callGrouped(anonymous, 'session.open', { device_id: 'x' });
  try {
    const status: DeliveryStatus = relay.status(anonymous, 'no-such-message');
    const page: TimelinePage = relay.sync(anonymous, 0, 10);
    const sent: DeliveryStatus = relay.send(anonymous, '{}');
    console.log(status.status, status.deadline, page.hasMore, page.entries.map((e) => e.kind + e.envelope), sent.messageId);
  } catch (e) {
    const failure = (e as TypedCallError).payload;
    console.log(failure.code, failure.status, failure.error.message, failure.error.data);
  }
  const answer: HttpAnswer | { upgrade: WebSocketSession } = await relay.handle({
    admin: false,
    method: 'GET',
    path: '/.well-known/relay',
    query: '',
    headers: '',
    body: new Uint8Array(),
    origin: null,
  });
  const served: Served = await serve(relay, { host: '127.0.0.1', port: 9000, headerTimeout: 10_000 });
  await served.close();
  const thread: RelayThread = await RelayThread.start({ relay: 'http://127.0.0.1:9001', storage: 'memory' });
  console.log(grouped.status, 'status' in answer ? answer.status : answer.upgrade.account, (await thread.stats()).coreCalls);
  await thread.close();

  const identity = new Identity();
  const certificate: string = identity.certificate('dev', 'send,sync,manage', Date.now());
  const session: string = await openSession({ identity, network: 'dev', relay: 'http://127.0.0.1:9000' });
  try {
    const moved: Moved = await moveAccount({ identity, network: 'dev', from: 'http://a', to: 'http://b', revision: 2, certificates: [certificate] });
    console.log(moved.route, moved.session, session);
  } catch (e) {
    if (e instanceof RelayError) console.log(e.code, e.status, e.relay, e.method, e.data);
  }
}

void main();

// Under the `workerd` condition (and as relay-node/worker): the Worker and its Durable Object class.
import worker, { RelayShard, type RelayEnv, type RelayConfig } from 'relay-node/worker';
const config: RelayConfig = { relay: 'https://relay.example.com', network: 'prod', shards: 1, probe_peers: false };
async function edge(env: RelayEnv): Promise<Response> {
  const shard = new RelayShard({}, { ...env, CONFIG: config });
  await shard.alarm();
  return worker.fetch(new Request('https://relay.example.com/healthz'), env);
}
void edge;
