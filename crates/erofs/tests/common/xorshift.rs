//! Reproducible pseudo-random test data without a dependency: xorshift64 (shifts 13, 7,
//! 17) for bytes, xorshift64* for picking at random in fuzz tests. Shared by the test
//! helpers of several crates (`#[path]`, as skip.rs is), so each generator is written
//! once; not every includer uses both.
#![allow(dead_code)]

/// A xorshift64 stream. The state must not be 0 (the stream would stay 0).
pub struct XorShift(pub u64);

impl XorShift {
    /// The next state.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// The next `n` states' low bytes: `bytes` continues where the last call stopped.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// `n` bytes of the stream that starts at `seed` (not 0).
pub fn xorshift(n: usize, seed: u64) -> Vec<u8> {
    XorShift(seed).bytes(n)
}

/// A xorshift64* stream (shifts 12, 25, 27, then a multiply). The state must not be 0.
pub struct XorShiftStar(pub u64);

impl XorShiftStar {
    /// The next output.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}
