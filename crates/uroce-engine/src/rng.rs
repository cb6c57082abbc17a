//! The engine's source of randomness: a SplitMix64 generator seeded by the caller, so that every
//! "random" choice (memory keys, initial values) is reproducible from the seed.

/// SplitMix64 (Steele, Lea and Flood, 2014): tiny, fast, and good enough for key tags and
/// initial values. Not cryptographic: keys resist guessing by a peer that cannot observe them,
/// not by one that can.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) const fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
}
