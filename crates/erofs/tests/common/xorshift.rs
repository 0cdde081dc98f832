//! Reproducible pseudo-random test data without a dependency: xorshift64 (shifts 13, 7,
//! 17). Shared by the test helpers of several crates (`#[path]`, as skip.rs is), so the
//! generator is written once.

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
