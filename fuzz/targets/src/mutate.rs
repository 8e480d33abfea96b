//! Deterministic mutations for the stable replay: libFuzzer's kinds of edits from a seeded RNG.

use rand::Rng;
use rand_chacha::ChaCha20Rng;

/// Tokens worth inserting into JSON-shaped inputs.
const TOKENS: &[&[u8]] = &[
    b"\"",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"\\",
    b"\\u",
    b"\\ud800",
    b"\\udc00",
    b"-0",
    b"1e400",
    b"1.0",
    b"9007199254740992",
    b"null",
    b"true",
    b"\"type\"",
    b"\"sig\"",
    b"\xff",
    b"\xed\xa0\x80",
    b"\x00",
    b" ",
    b"{\"a\":1,\"a\":2}",
    b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
];

/// One to four edits of `input`, sometimes splicing in part of `other`.
pub fn mutate(rng: &mut ChaCha20Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..rng.gen_range(1..=4) {
        let len = out.len();
        let at = if len == 0 { 0 } else { rng.gen_range(0..len) };
        match rng.gen_range(0..8) {
            0 if len > 0 => out[at] ^= 1 << rng.gen_range(0..8),
            1 if len > 0 => out[at] = rng.gen(),
            2 => {
                let t = TOKENS[rng.gen_range(0..TOKENS.len())];
                out.splice(at..at, t.iter().copied());
            }
            3 if len > 0 => {
                let end = (at + rng.gen_range(1..=8)).min(len);
                out.drain(at..end);
            }
            4 if len > 0 => {
                let end = (at + rng.gen_range(1..=16)).min(len);
                let piece = out[at..end].to_vec();
                out.splice(at..at, piece);
            }
            5 if !other.is_empty() => {
                let from = rng.gen_range(0..other.len());
                let end = (from + rng.gen_range(1..=64)).min(other.len());
                out.splice(at..at, other[from..end].iter().copied());
            }
            6 if len > 1 => out.truncate(at),
            _ => out.push(rng.gen()),
        }
    }
    out
}
