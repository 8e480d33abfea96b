// Outbound safety (issue 18): which addresses a relay may connect to, and the DNS lookup that
// connects only to those. (The limits on fetching a claimed relay's key are the core's:
// relay_core::transport::keys.)
//
// Off the `dev` network a relay connects only to public addresses: a peer name is resolved
// here, every address it resolves to is checked, and the connection goes to a checked one
// (the lookup hands the socket the address it checked, so a second resolution cannot swap
// in another: DNS rebinding is caught). `allowPrivatePeers` lifts the check.

import dns from 'node:dns';
import net from 'node:net';

/**
 * Why an IPv4 address is refused, or null when it is public.
 * @param {number[]} b its four bytes
 * @returns {string | null}
 */
function refusedV4(b) {
  const [a, c] = b;
  if (a === 0) return 'unspecified';
  if (a === 127) return 'loopback';
  if (a === 10 || (a === 172 && (c & 0xf0) === 16) || (a === 192 && c === 168)) return 'private';
  if (a === 169 && c === 254) return 'link-local';
  if (a === 100 && (c & 0xc0) === 64) return 'shared (CGNAT)';
  if (a >= 224 && a <= 239) return 'multicast';
  if (a >= 240) return 'reserved or broadcast';
  return null;
}

/** The 16 bytes of an IPv6 address (zone dropped), or null when it is not one. @param {string} ip */
function v6Bytes(ip) {
  let s = ip.replace(/%.*$/, '');
  if (!net.isIPv6(s)) return null;
  // A dotted IPv4 tail becomes two groups.
  const tail = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(s);
  if (tail) {
    const [p, q, r, t] = tail.slice(1).map(Number);
    s = `${s.slice(0, tail.index)}${((p << 8) | q).toString(16)}:${((r << 8) | t).toString(16)}`;
  }
  const [head, rest] = s.split('::');
  const hs = head ? head.split(':') : [];
  const rs = rest === undefined ? [] : rest ? rest.split(':') : [];
  const groups = rest === undefined ? hs : [...hs, ...Array(8 - hs.length - rs.length).fill('0'), ...rs];
  if (groups.length !== 8) return null;
  const out = [];
  for (const g of groups) {
    const v = parseInt(g, 16);
    out.push(v >> 8, v & 0xff);
  }
  return out;
}

/**
 * Why a relay must not connect to `ip`, or null when it may: loopback, private (10/8,
 * 172.16/12, 192.168/16, fc00::/7, and the deprecated site-local fec0::/10), link-local
 * (169.254/16, fe80::/10), CGNAT (100.64/10), multicast (224/4, ff00::/8), unspecified
 * (0/8, ::), reserved and broadcast (240/4); the IPv4 inside IPv4-mapped (::ffff:a.b.c.d),
 * IPv4-compatible (::a.b.c.d), NAT64 (64:ff9b::/96) and 6to4 (2002::/16) addresses is
 * judged as IPv4. Anything that is not an IP address is refused.
 * @param {string} ip
 * @returns {string | null}
 */
export function refusedAddress(ip) {
  if (net.isIPv4(ip)) return refusedV4(ip.split('.').map(Number));
  const b = v6Bytes(ip);
  if (!b) return 'not an IP address';
  const zero = (from, to) => b.slice(from, to).every((x) => x === 0);
  if (zero(0, 16)) return 'unspecified';
  if (zero(0, 15) && b[15] === 1) return 'loopback';
  if (zero(0, 10) && b[10] === 0xff && b[11] === 0xff) return refusedV4(b.slice(12));
  if (zero(0, 12)) return refusedV4(b.slice(12));
  if (b[0] === 0x00 && b[1] === 0x64 && b[2] === 0xff && b[3] === 0x9b && zero(4, 12)) return refusedV4(b.slice(12));
  if (b[0] === 0x20 && b[1] === 0x02) return refusedV4(b.slice(2, 6));
  if ((b[0] & 0xfe) === 0xfc) return 'private';
  if (b[0] === 0xfe && (b[1] & 0xc0) === 0x80) return 'link-local';
  if (b[0] === 0xfe && (b[1] & 0xc0) === 0xc0) return 'private (site-local)';
  if (b[0] === 0xff) return 'multicast';
  return null;
}

/** The error code of a peer whose every address was refused: the exchange is *not attempted*. */
export const REFUSED_CODE = 'ERR_RELAY_PEER_REFUSED';

/** @param {string} message */
function refusal(message) {
  return Object.assign(new Error(message), { code: REFUSED_CODE });
}

/**
 * A `lookup` for `http(s).request` that resolves `hostname`, drops every refused address and
 * hands the socket only checked ones (all of them when asked for all, as happy eyeballs
 * does); when none is left, fails with `REFUSED_CODE`.
 * @param {string} hostname
 * @param {object} options
 * @param {Function} callback
 */
export function vettedLookup(hostname, options, callback) {
  const opts = typeof options === 'object' && options !== null ? options : { family: options };
  dns.lookup(hostname, { ...opts, all: true }, (err, addresses) => {
    if (err) return callback(err);
    const ok = addresses.filter((a) => refusedAddress(a.address) === null);
    if (ok.length === 0) {
      const seen = addresses.map((a) => `${a.address} (${refusedAddress(a.address)})`).join(', ');
      return callback(refusal(`${hostname} resolves to no public address: ${seen}`));
    }
    if (opts.all) return callback(null, ok);
    return callback(null, ok[0].address, ok[0].family);
  });
}

/**
 * Checks a peer URL before any connection: off `dev`, the scheme must be https; unless private
 * peers are allowed, an IP literal must be public (a name is checked by `vettedLookup` at
 * connect time). Returns why it is refused, or null.
 * @param {URL} u
 * @param {{network: string, allowPrivatePeers: boolean}} rules
 * @returns {string | null}
 */
export function refusedUrl(u, rules) {
  if (rules.network === 'dev') return null;
  if (u.protocol !== 'https:') return `${u.origin}: relays off the dev network are reached over https only`;
  if (rules.allowPrivatePeers) return null;
  const host = u.hostname.replace(/^\[|\]$/g, '');
  if (net.isIP(host)) {
    const why = refusedAddress(host);
    if (why) return `${u.origin}: ${host} is ${why}`;
  }
  return null;
}
