//! Strict base64url without padding (RFC 4648 §5), the encoding of every binary field.
//!
//! Padding and non-zero trailing bits are rejected, so each byte string has
//! exactly one spelling and signed objects cannot be re-spelled.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

/// Encodes bytes as unpadded base64url.
pub fn encode(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Decodes canonical unpadded base64url; `None` for any other spelling.
pub fn decode(s: &str) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(s.as_bytes()).ok()
}

/// Decodes into exactly `N` bytes.
pub fn decode_array<const N: usize>(s: &str) -> Option<[u8; N]> {
    // A quick length check avoids decoding obviously wrong inputs.
    if s.len() != (N * 4).div_ceil(3) {
        return None;
    }
    decode(s)?.try_into().ok()
}
