// Run by sqlite.test.js on each runtime: SqliteStorage on that runtime's SQLite driver keeps
// the storage contract the core relies on. Prints one JSON line of what it saw.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { SqliteStorage } from '../src/storage.js';

const b = (s) => new TextEncoder().encode(s);
const text = (u) => (u ? new TextDecoder().decode(u) : null);
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-sqlite-'));
const file = path.join(dir, 'relay.sqlite');
const seen = {};
const s = new SqliteStorage(file);
seen.driver = s.driver;
s.commit([[b('a'), b('1')], [b('c'), b('3')], [b('b'), b('2')]]);
// Byte order, start <= key < end, the limit; an empty start key is the least key.
seen.scan = s.scan(b('a'), b('c'), 10).map(([k, v]) => `${text(k)}=${text(v)}`);
seen.fromEmpty = s.scan(b(''), b('z'), 10).map(([k]) => text(k));
seen.first = s.scan(b('a'), b('z'), 1).map(([k]) => text(k));
// All of a commit or none: a write that cannot be bound fails the batch after a good one.
try {
  s.commit([[b('d'), b('4')], [b('e'), /** @type {any} */ ({ not: 'bytes' })]]);
  seen.atomic = 'no error';
} catch {
  seen.atomic = text(s.get(b('d'))) === null ? 'none applied' : 'part applied';
}
// A delete, and the batch after a failed one still commits.
s.commit([[b('a'), null]]);
seen.afterDelete = text(s.get(b('a')));
// A second relay on the same file is refused while this one holds it.
try {
  new SqliteStorage(file).close();
  seen.second = 'opened';
} catch (e) {
  seen.second = /another relay/.test(e.message) ? 'refused' : e.message;
}
await s.backup(path.join(dir, 'copy.sqlite'));
s.close();
const copy = new SqliteStorage(path.join(dir, 'copy.sqlite'));
seen.backup = copy.scan(b(''), b('z'), 10).map(([k]) => text(k));
copy.close();
fs.rmSync(dir, { recursive: true, force: true });
console.log(JSON.stringify(seen));
