// The package as a JavaScript developer gets it: `npm pack` (its prepack builds what the
// tarball needs), installed into an empty app with no Rust toolchain on PATH, then the
// README's example (examples/embed.js) run on Node 20, 22, 24 and 26, Deno 2 and Bun 1, and
// every export type-checked by tsc. A runtime that cannot be installed fails the test.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { platform } from '../src/native.js';
import { runtime } from './helpers.js';

const HERE = path.resolve(new URL('..', import.meta.url).pathname);
const MIB = 1024 * 1024;
/** What the test saw, for the benchmark report and the closing note (target/package/report.json). */
const REPORT = path.resolve(HERE, '../target/package/report.json');
const report = { runtimes: {} };

/** Runs a command; throws with its output when it fails. @returns {string} stdout */
function run(cmd, args, opts = {}) {
  const r = spawnSync(cmd, args, { encoding: 'utf8', maxBuffer: 64 * MIB, timeout: 600_000, ...opts });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} failed (${r.status ?? r.signal}):\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

/** The runtimes the example runs on: this machine's Node 20, then those from the npm registry. */
function runtimes() {
  return [
    { name: 'node 20', cmd: process.execPath, args: [], sqlite: null },
    { name: 'node 22', cmd: runtime('node22/bin/node'), args: [], sqlite: 'node:sqlite' },
    { name: 'node 24', cmd: runtime('node24/bin/node'), args: [], sqlite: 'node:sqlite' },
    { name: 'node 26', cmd: runtime('node26/bin/node'), args: [], sqlite: 'node:sqlite' },
    { name: 'deno 2', cmd: runtime('deno/deno'), args: ['run', '-A'], sqlite: 'node:sqlite' },
    { name: 'bun 1', cmd: runtime('bun/bin/bun'), args: [], sqlite: 'bun:sqlite' },
  ];
}

/** PATH without any directory that holds cargo or rustc: the app is built with npm alone. */
function pathWithoutRust() {
  return process.env.PATH.split(':')
    .filter((d) => d && !fs.existsSync(path.join(d, 'cargo')) && !fs.existsSync(path.join(d, 'rustc')))
    .join(':');
}

test("the README's JavaScript snippets are quoted from the examples the package test runs", () => {
  const readme = fs.readFileSync(path.join(HERE, '../README.md'), 'utf8');
  const section = readme.slice(readme.indexOf('### The JavaScript package'), readme.indexOf('### The Node host'));
  const blocks = [...section.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]);
  assert.ok(blocks.length >= 3, 'embed, serve and Worker snippets');
  // A line as compared: trimmed, without a trailing `// comment`.
  const bare = (l) => l.replace(/\s+\/\/ .*$/, '').trim();
  const lines = new Set(
    ['examples/embed.js', 'examples/worker/src/index.js'].flatMap((f) => fs.readFileSync(path.join(HERE, f), 'utf8').split('\n').map(bare)),
  );
  for (const block of blocks) {
    for (const line of block.split('\n').map(bare)) {
      if (line === '' || line.startsWith('//')) continue;
      assert.ok(lines.has(line), `README line not in the examples: ${line}`);
    }
  }
});

test('the packed package installs with no compiler and runs the README example on every runtime', async (t) => {
  assert.ok(process.versions.node.startsWith('20.'), `the suite's own Node is 20 (got ${process.versions.node})`);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-pack-'));
  try {
    // 1. Pack: the main package and this platform's native crypto package.
    const [packed] = JSON.parse(run('npm', ['pack', '--json', '--pack-destination', dir], { cwd: HERE }));
    const native = path.join(HERE, 'npm', platform());
    const [nativePacked] = JSON.parse(run('npm', ['pack', '--json', '--pack-destination', dir], { cwd: native }));
    const files = packed.files.map((f) => f.path).sort();
    for (const f of ['pkg/relay_wasm_script_bg.wasm', 'pkg/relay_wasm.js', 'pkg/relay_settings.js', 'pkg/tuning.json', 'src/index.js', 'src/index.d.ts', 'bin/relay-node.js']) {
      assert.ok(files.includes(f), `the tarball holds ${f}`);
    }
    assert.deepEqual(files.filter((f) => f.endsWith('.node')), [], 'no native binary in the main package');
    assert.deepEqual(nativePacked.files.map((f) => f.path).sort(), ['package.json', 'relay_native.node']);
    assert.ok(packed.size < 5 * MIB, `tarball ${packed.size} bytes, under 5 MiB`);
    Object.assign(report, { tarball: packed.filename, size: packed.size, unpacked: packed.unpackedSize, files, native: { tarball: nativePacked.filename, size: nativePacked.size } });

    // 2. Install into an empty app, npm alone: nothing compiles, no better-sqlite3.
    const app = path.join(dir, 'app');
    fs.mkdirSync(app);
    fs.writeFileSync(path.join(app, 'package.json'), JSON.stringify({ name: 'app', private: true, type: 'module' }));
    fs.copyFileSync(path.join(HERE, 'examples/embed.js'), path.join(app, 'embed.js'));
    const started = performance.now();
    const out = run('npm', ['install', '--no-audit', '--no-fund', '--foreground-scripts', path.join(dir, packed.filename), path.join(dir, nativePacked.filename)], {
      cwd: app,
      env: { ...process.env, PATH: pathWithoutRust() },
    });
    report.installSeconds = (performance.now() - started) / 1000;
    assert.doesNotMatch(out, /gyp|prebuild|cargo|rustc/, 'no build step ran at install');
    const installed = fs.readdirSync(path.join(app, 'node_modules')).filter((n) => !n.startsWith('.')).sort();
    assert.deepEqual(installed, ['relay-node', `relay-node-${platform()}`, 'sorted-btree', 'ws'].sort());
    assert.equal(execFileSync('find', [path.join(app, 'node_modules'), '-name', '*.node']).toString().trim().split('\n').length, 1, 'one native binary: this platform\'s');
    report.installed = installed;
    const manifest = JSON.parse(fs.readFileSync(path.join(app, 'node_modules/relay-node/package.json'), 'utf8'));
    assert.deepEqual(manifest.optionalDependencies, { [`relay-node-${platform()}`]: manifest.version }, 'each platform package is an optional dependency');
    assert.equal(manifest.dependencies['better-sqlite3'], undefined, 'better-sqlite3 only as an optional peer');
    assert.deepEqual(manifest.peerDependenciesMeta, { 'better-sqlite3': { optional: true } });

    // 3. The example on each runtime.
    for (const rt of runtimes()) {
      await t.test(rt.name, () => {
        const stdout = run(rt.cmd, [...rt.args, 'embed.js'], { cwd: app, env: { ...process.env, PATH: pathWithoutRust() }, timeout: 120_000 });
        const seen = JSON.parse(stdout.trim().split('\n').pop());
        assert.match(seen.runtime, new RegExp(`^${rt.name.split(' ')[0]} ${rt.name.split(' ')[1]}\\.`));
        assert.deepEqual(seen.memory, { status: 'target-accepted', read: ['hello'] }, 'in memory, through the typed calls');
        assert.deepEqual(seen.bad, { status: 400, code: 'invalid_params' }, 'bad input is a protocol error');
        assert.deepEqual(seen.http, { status: 'target_accepted', read: ['note to self'] }, 'a self-delivery over HTTP');
        if (rt.sqlite) {
          assert.deepEqual(seen.disk, { driver: rt.sqlite, status: 'target-accepted', read: ['hello'] }, 'on disk');
        } else {
          // Node 20 has no node:sqlite: disk storage says how to get it.
          assert.match(seen.disk.error, /better-sqlite3/);
          assert.match(seen.disk.error, /Node 22\.13/);
          assert.match(seen.disk.error, /storage: 'memory'/);
        }
        report.runtimes[seen.runtime] = seen.disk.driver ?? 'memory only (no SQLite without better-sqlite3)';
      });
    }

    // 4. Types: every export, strict, against the installed declarations.
    fs.copyFileSync(path.join(HERE, 'examples/consumer.ts'), path.join(app, 'consumer.ts'));
    fs.writeFileSync(
      path.join(app, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: { strict: true, noEmit: true, module: 'nodenext', moduleResolution: 'nodenext', target: 'es2022', types: ['node'], typeRoots: [path.join(HERE, 'node_modules/@types')], skipLibCheck: false },
        files: ['consumer.ts'],
      }),
    );
    run(process.execPath, [path.join(HERE, 'node_modules/typescript/bin/tsc'), '-p', app], { cwd: app });
    for (const d of ['src/index.d.ts', 'src/client.d.ts']) {
      const text = fs.readFileSync(path.join(app, 'node_modules/relay-node', d), 'utf8');
      assert.doesNotMatch(text, /[:<,(|]\s*any\b/, `${d}: no any in a public signature`);
    }
  } finally {
    fs.mkdirSync(path.dirname(REPORT), { recursive: true });
    fs.writeFileSync(REPORT, JSON.stringify(report, null, 2));
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
