//! The engine's source of randomness: memory keys, the first QPN, PSN choices, source ports.
//!
//! ChaCha20 as a generator (RFC 8439's block function, run as a keystream): a peer that sees
//! any number of a device's keys learns nothing about the next one without the 256-bit seed.
//! The seed is the caller's: the operating system's randomness on a real device
//! ([`crate::DeviceConfig::secret`]), a test's number in the simulator
//! ([`crate::DeviceConfig::new`]), where every run must be reproducible from it.

use chacha20::ChaCha20Rng;
use chacha20::rand_core::{Rng as _, SeedableRng as _};

/// A ChaCha20 keystream.
#[derive(Debug)]
pub(crate) struct Rng(ChaCha20Rng);

impl Rng {
    /// The generator of a 256-bit seed.
    pub(crate) fn from_seed(seed: [u8; 32]) -> Self {
        Self(ChaCha20Rng::from_seed(seed))
    }

    /// A reproducible generator for tests: the seed expanded as `rand_core` expands one.
    #[cfg(test)]
    pub(crate) fn new(seed: u64) -> Self {
        Self::from_seed(expand(seed))
    }

    pub(crate) fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }
}

/// A 64-bit test seed as 256 bits (the seeded generator's first four words, only to spread it:
/// the secrecy of a real device's keys rests on a seed that never goes through here).
pub(crate) const fn expand(seed: u64) -> [u8; 32] {
    let mut out = [0u8; 32];
    let mut rng = crate::seeded::Rng::new(seed);
    let mut i = 0;
    while i < 4 {
        let b = rng.next_u64().to_le_bytes();
        let mut k = 0;
        while k < 8 {
            out[8 * i + k] = b[k];
            k += 1;
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ChaCha20's block function with an all-zero key, nonce and counter begins
    /// 76 b8 e0 ad a0 f1 3d 90 40 5d 6a e5 (RFC 8439 appendix A.1, test vector 1): the
    /// generator is ChaCha20.
    #[test]
    fn the_generator_is_chacha20() {
        let mut r = Rng::from_seed([0; 32]);
        assert_eq!(r.next_u32().to_le_bytes(), [0x76, 0xb8, 0xe0, 0xad]);
        assert_eq!(r.next_u32().to_le_bytes(), [0xa0, 0xf1, 0x3d, 0x90]);
        assert_eq!(r.next_u32().to_le_bytes(), [0x40, 0x5d, 0x6a, 0xe5]);
    }

    #[test]
    fn test_seeds_reproduce_and_differ() {
        let a: Vec<u32> = (0..4)
            .map({
                let mut r = Rng::new(5);
                move |_| r.next_u32()
            })
            .collect();
        let b: Vec<u32> = (0..4)
            .map({
                let mut r = Rng::new(5);
                move |_| r.next_u32()
            })
            .collect();
        let c: Vec<u32> = (0..4)
            .map({
                let mut r = Rng::new(6);
                move |_| r.next_u32()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
