// The relay's secrets on disk (its key seed, the operator token): made only when absent,
// never replaced. No dependencies but node's own, so the edge host's launcher uses it too.

import crypto from 'node:crypto';
import fs from 'node:fs';
import { messageOf } from './log.js';

const b64u = (buf) => Buffer.from(buf).toString('base64url');

/**
 * A secret of `len` bytes kept in `file` (base64url): read when the file is there, made
 * (mode 0600, never over an existing file) only when it is absent. Any other failure stops
 * the start with a message naming the file: a relay never replaces its key or token because
 * it could not read them.
 * @param {string} file @param {number} len
 * @returns {Buffer}
 */
export function secret(file, len) {
  let text;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    if (e.code !== 'ENOENT') throw new Error(`${file}: cannot read it (${e.code ?? messageOf(e)}); fix it or move it away (a new one is made only when the file is absent)`);
    const b = crypto.randomBytes(len);
    try {
      fs.writeFileSync(file, b64u(b), { mode: 0o600, flag: 'wx' });
    } catch (w) {
      throw new Error(`${file}: cannot create it: ${messageOf(w)}`);
    }
    return b;
  }
  const t = text.trim();
  const b = Buffer.from(t, 'base64url');
  if (!/^[A-Za-z0-9_-]+$/.test(t) || b.length !== len) {
    throw new Error(`${file}: malformed: it must hold ${len} bytes in base64url; fix it or move it away (a new one is made only when the file is absent)`);
  }
  return b;
}
