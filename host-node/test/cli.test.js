import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from '../src/cli.js';

test('relay-node serve takes the wasmtime host flags and a TOML config', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-node-cfg-'));
  const cfg = path.join(dir, 'relay.toml');
  fs.writeFileSync(cfg, 'listen = "127.0.0.1:9100"\nnetwork = "dev"\nmemory = true\n[policy]\nmessage_retention = 60000\n');
  const s = parseArgs(['--config', cfg, '--policy', 'clock_tolerance=1000', '--url', 'http://127.0.0.1:9100']);
  assert.equal(s.listen, '127.0.0.1:9100');
  assert.equal(s.data, null);
  assert.deepEqual(s.policies, { message_retention: 60000, clock_tolerance: 1000 });
  assert.equal(s.url, 'http://127.0.0.1:9100');
  assert.throws(() => parseArgs(['--policy', 'x=1.5']), /NAME=INTEGER/);
  assert.throws(() => parseArgs(['--nope']), /unknown flag/);
  fs.writeFileSync(cfg, 'lisen = "x"\n');
  assert.throws(() => parseArgs(['--config', cfg]), /unknown key/);
  fs.rmSync(dir, { recursive: true });
});
