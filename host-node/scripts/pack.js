// npm pack's two hooks (package.json `prepack` and `postpack`), the napi-rs way.
//
// prepack: builds what the tarball carries (the wasm cores and their glue into pkg/, the
// workerd build into pkg/web/, and this platform's native crypto package into npm/<platform>/)
// with the repository's xtask, then names each platform's native package as an optional
// dependency at this version, so that npm installs the one matching the user's os, cpu and
// libc and no other. They are not in the
// committed package.json: none of them is published while the checkout is developed, and
// `npm ci` would look for them. postpack puts the committed package.json back, byte for byte.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';

const root = new URL('..', import.meta.url);
const manifest = new URL('package.json', root);
const saved = new URL('node_modules/.package.json.prepack', root);

const step = process.argv[2];
if (step === 'prepack') {
  for (const build of ['bindgen', 'bindgen-edge']) {
    execFileSync('cargo', ['run', '--locked', '--release', '-q', '-p', 'xtask', '--', build], { cwd: new URL('..', root), stdio: ['ignore', 2, 2] });
  }
  const text = fs.readFileSync(manifest, 'utf8');
  fs.mkdirSync(new URL('node_modules', root), { recursive: true });
  fs.writeFileSync(saved, text);
  const pkg = JSON.parse(text);
  pkg.optionalDependencies = Object.fromEntries(pkg.relay.platforms.map((p) => [`relay-node-${p}`, pkg.version]));
  fs.writeFileSync(manifest, `${JSON.stringify(pkg, null, 2)}\n`);
} else if (step === 'postpack') {
  if (fs.existsSync(saved)) {
    fs.writeFileSync(manifest, fs.readFileSync(saved));
    fs.rmSync(saved);
  }
} else {
  throw new Error('usage: node scripts/pack.js prepack|postpack');
}
