// SqliteStorage keeps the storage contract the core relies on, on every runtime's SQLite
// driver (test/sqlite-drivers.js, run on each): keys in byte order within [start, end) and
// the limit, an empty start key the least one, a commit all or nothing, a second relay on
// the same file refused, and a backup that holds every committed key.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { runtime } from './helpers.js';

const HERE = path.resolve(new URL('..', import.meta.url).pathname);
const bin = (p) => runtime(p);
const RUNTIMES = [
  ['node 20 (better-sqlite3)', process.execPath, [], 'better-sqlite3'],
  ['node 22', bin('node22/bin/node'), [], 'node:sqlite'],
  ['node 26', bin('node26/bin/node'), [], 'node:sqlite'],
  ['deno 2', bin('deno/deno'), ['run', '-A'], 'node:sqlite'],
  ['bun 1', bin('bun/bin/bun'), [], 'bun:sqlite'],
];

for (const [name, cmd, args, driver] of RUNTIMES) {
  test(`the SQLite storage contract on ${name}`, () => {
    const r = spawnSync(cmd, [...args, 'test/sqlite-drivers.js'], { cwd: HERE, encoding: 'utf8', timeout: 60_000 });
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout.trim().split('\n').pop()), {
      driver,
      scan: ['a=1', 'b=2'],
      fromEmpty: ['a', 'b', 'c'],
      first: ['a'],
      atomic: 'none applied',
      afterDelete: null,
      second: 'refused',
      backup: ['b', 'c'],
    });
  });
}
