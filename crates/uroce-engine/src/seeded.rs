//! The seeded generator of everything that must be reproducible from a test's number: the
//! simulator's link faults, the runtime's injected faults (`UROCE_FAULTS`), and the spreading
//! of a test seed into a device's 256-bit one. SplitMix64: statistically sound, tiny, the same
//! on every platform — and invertible from its output, so never a source of keys (those come
//! from ChaCha20, [`crate::DeviceConfig::secret`]).

use core::ops::Range;

/// SplitMix64's increment: 2^64 divided by the golden ratio, made odd.
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function, a bijective mix of all 64 bits (Stafford's variant 13).
const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seeded pseudo-random generator (SplitMix64): not cryptographic, but statistically sound for
/// fault injection, tiny, and the same on every platform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator whose whole output is determined by `seed`.
    pub const fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The stream of the directed link `from → to` in a fabric seeded with `seed`. Hashing the
    /// coordinates in keeps the streams of neighbouring links unrelated.
    pub fn for_link(seed: u64, from: usize, to: usize) -> Self {
        let h = mix64(mix64(seed) ^ from as u64);
        Self::new(mix64(h.wrapping_add(GOLDEN_GAMMA) ^ to as u64))
    }

    /// The next 64 random bits.
    pub const fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix64(self.state)
    }

    /// A uniform value in [0, 1): the top 53 bits scaled, so every multiple of 2^-53 is equally
    /// likely.
    pub fn gen_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p`; draws nothing when `p` is 0, so disabled faults leave the
    /// stream untouched.
    pub fn gen_bool(&mut self, p: f64) -> bool {
        p > 0.0 && self.gen_f64() < p
    }

    /// A uniform value in `range`, without modulo bias. Panics if `range` is empty.
    pub fn gen_range(&mut self, range: Range<u64>) -> u64 {
        assert!(range.start < range.end, "empty range {range:?}");
        let span = range.end - range.start;
        // Reject the lowest 2^64 mod span values: the rest is a whole number of spans.
        let threshold = span.wrapping_neg() % span;
        loop {
            let x = self.next_u64();
            if x >= threshold {
                return range.start + x % span;
            }
        }
    }
}
