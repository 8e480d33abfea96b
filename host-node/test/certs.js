// A test CA and server certificates made at test time (node-forge signs; Node makes the keys).

import crypto from 'node:crypto';
import forge from 'node-forge';

const { pki } = forge;

/** A fresh RSA key pair as forge keys, made by Node (forge's own key generation is slow). */
function keys() {
  const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
  const priv = pki.privateKeyFromPem(privateKey.export({ type: 'pkcs8', format: 'pem' }).toString());
  return { privateKey: priv, publicKey: pki.setRsaPublicKey(priv.n, priv.e) };
}

function serial() {
  return `01${crypto.randomBytes(8).toString('hex')}`;
}

/**
 * A CA: `{cert, key}` as PEM, and `issue(names)` for a server certificate it signs, valid
 * for the DNS names and IP addresses given.
 * @param {string} [name]
 */
export function testCa(name = 'relay test CA') {
  const k = keys();
  const ca = pki.createCertificate();
  ca.publicKey = k.publicKey;
  ca.serialNumber = serial();
  ca.validity.notBefore = new Date(Date.now() - 60_000);
  ca.validity.notAfter = new Date(Date.now() + 24 * 3600_000);
  const subject = [{ name: 'commonName', value: name }];
  ca.setSubject(subject);
  ca.setIssuer(subject);
  ca.setExtensions([
    { name: 'basicConstraints', cA: true, critical: true },
    { name: 'keyUsage', keyCertSign: true, cRLSign: true, critical: true },
    { name: 'subjectKeyIdentifier' },
  ]);
  ca.sign(k.privateKey, forge.md.sha256.create());
  return {
    cert: pki.certificateToPem(ca),
    key: pki.privateKeyToPem(k.privateKey),
    /** @param {string[]} names DNS names and IP addresses */
    issue(names) {
      const sk = keys();
      const c = pki.createCertificate();
      c.publicKey = sk.publicKey;
      c.serialNumber = serial();
      c.validity.notBefore = new Date(Date.now() - 60_000);
      c.validity.notAfter = new Date(Date.now() + 24 * 3600_000);
      c.setSubject([{ name: 'commonName', value: names[0] }]);
      c.setIssuer(ca.subject.attributes);
      c.setExtensions([
        { name: 'basicConstraints', cA: false },
        { name: 'keyUsage', digitalSignature: true, keyEncipherment: true, critical: true },
        { name: 'extKeyUsage', serverAuth: true },
        { name: 'subjectAltName', altNames: names.map((n) => (/^[\d.]+$|:/.test(n) ? { type: 7, ip: n } : { type: 2, value: n })) },
      ]);
      c.sign(k.privateKey, forge.md.sha256.create());
      return { cert: pki.certificateToPem(c), key: pki.privateKeyToPem(sk.privateKey) };
    },
  };
}
