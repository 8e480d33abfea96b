//! A reader that turns fuzz bytes into choices; an exhausted input reads as zeros.
//!
//! Every choice is total (any byte is a valid answer), and the zero byte always
//! means the first option, so an all-zero or truncated input still decodes to a
//! well-formed program: the engine target's option 0 is the valid, natural one.

/// Fuzz bytes, consumed front to back.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data }
    }

    /// Whether every byte was read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The next byte (0 once exhausted).
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// Two bytes, little-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// Four bytes, little-endian.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// Eight bytes, little-endian.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// One of `0..n` (`n` > 0).
    pub fn choose(&mut self, n: usize) -> usize {
        debug_assert!(n > 0);
        if n <= 256 {
            usize::from(self.u8()) % n
        } else {
            usize::from(self.u16()) % n
        }
    }

    /// True with probability about `percent` / 100 (false once exhausted).
    pub fn chance(&mut self, percent: u8) -> bool {
        // Byte 0 (and an exhausted input) is never a hit, so zeros keep the natural path.
        let b = self.u8();
        b != 0 && u32::from(b) * 100 <= u32::from(percent) * 256
    }

    /// Up to `max` bytes, the count taken from the input first.
    pub fn bytes(&mut self, max: usize) -> &'a [u8] {
        let n = self.choose(max + 1).min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exhausted_input_reads_zeros_and_natural_choices() {
        let mut i = Input::new(&[7]);
        assert_eq!(i.choose(5), 2);
        assert!(i.is_empty());
        assert_eq!(i.u64(), 0);
        assert_eq!(i.choose(3), 0);
        assert!(!i.chance(100));
        assert!(i.bytes(10).is_empty());
    }

    #[test]
    fn chance_follows_the_percentage() {
        let hits = (0..=255u8).filter(|b| Input::new(&[*b]).chance(25)).count();
        assert!((60..=66).contains(&hits), "{hits}");
    }
}
