// Outbound safety (issue 18): which addresses a relay may connect to, and the DNS lookup that
// connects only to those. (The limits on fetching a claimed relay's key are the core's:
// relay_core::transport::keys.)
//
// Off the `dev` network a relay connects only to public addresses: a peer name is resolved
// here, every address it resolves to is checked, and the connection goes to a checked one
// (the lookup hands the socket the address it checked, so a second resolution cannot swap
// in another: DNS rebinding is caught). `allowPrivatePeers` lifts the check.

import dns from 'node:dns';
import { refusedAddress, refusedUrl, vettedAddresses } from './core.js';

/** Which URLs and addresses a relay may connect to is the core's one definition. */
export { refusedAddress, refusedUrl, vettedAddresses };

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
