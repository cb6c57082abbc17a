//! Newtypes for the numbers the transport carries: 24-bit PSN, QPN and MSN, and the keys.
//!
//! A bare `u32` never stands for one of these: construction either rejects or masks bits above
//! the field width, and PSN arithmetic and comparison wrap modulo 2^24 here and nowhere else.

use core::cmp::Ordering;
use core::fmt;

/// Mask of a 24-bit field.
const MASK24: u32 = 0x00FF_FFFF;

/// The constructors and accessor every 24-bit number shares.
macro_rules! u24_number {
    ($name:ident, $what:literal) => {
        impl $name {
            #[doc = concat!("A ", $what, " from a value that must fit 24 bits; `None` if it does not.")]
            pub const fn new(value: u32) -> Option<Self> {
                if value > MASK24 { None } else { Some(Self(value)) }
            }

            #[doc = concat!("A ", $what, " from the low 24 bits of `value` (the wire field's width).")]
            pub const fn from_masked(value: u32) -> Self {
                Self(value & MASK24)
            }

            #[doc = concat!("The ", $what, " as an integer in `0..2^24`.")]
            pub const fn get(self) -> u32 {
                self.0
            }
        }
    };
}

/// A packet sequence number: 24 bits, compared modulo 2^24 (IBA 9.7).
///
/// `Psn` deliberately has no `Ord`: "later than" is only meaningful for PSNs less than 2^23
/// apart. [`Psn::cmp_wrapping`] and the predicates built on it are the one place the window
/// rule lives (the same rule as Linux rxe's `psn_compare` and smoltcp's `SeqNumber`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The largest PSN, 2^24 − 1.
    pub const MAX: Self = Self(MASK24);
    /// PSN zero.
    pub const ZERO: Self = Self(0);

    /// `self + n` modulo 2^24.
    #[must_use]
    pub const fn add(self, n: u32) -> Self {
        Self(self.0.wrapping_add(n) & MASK24)
    }

    /// `self − n` modulo 2^24.
    #[must_use]
    pub const fn sub(self, n: u32) -> Self {
        Self(self.0.wrapping_sub(n) & MASK24)
    }

    /// The next PSN.
    #[must_use]
    pub const fn next(self) -> Self {
        self.add(1)
    }

    /// The signed distance `self − other`, in `−2^23 ..= 2^23 − 1`.
    ///
    /// The 24-bit difference is shifted into the top of an `i32` and back, so that the sign
    /// says which PSN is later within half the sequence space.
    pub const fn distance(self, other: Self) -> i32 {
        (self.0.wrapping_sub(other.0) << 8).cast_signed() >> 8
    }

    /// Orders two PSNs within the half-space window: `Less` when `self` comes before `other`.
    pub const fn cmp_wrapping(self, other: Self) -> Ordering {
        let d = self.distance(other);
        if d < 0 {
            Ordering::Less
        } else if d == 0 {
            Ordering::Equal
        } else {
            Ordering::Greater
        }
    }

    /// `self` comes strictly before `other`.
    pub const fn is_before(self, other: Self) -> bool {
        self.distance(other) < 0
    }

    /// `self` comes strictly after `other`.
    pub const fn is_after(self, other: Self) -> bool {
        self.distance(other) > 0
    }
}

u24_number!(Psn, "PSN");
u24_number!(Qpn, "QPN");
u24_number!(Msn, "MSN");

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A queue pair number: 24 bits (IBA 9.2, BTH DestQP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Qpn(u32);

impl Qpn {
    /// QP0, the subnet management QP (not used by RoCE).
    pub const QP0: Self = Self(0);
    /// QP1, the general services interface QP (used by RoCE connection management).
    pub const QP1: Self = Self(1);
    /// The destination QPN of a multicast packet (IBA 9.2: permissive DestQP 0xFFFFFF).
    pub const MULTICAST: Self = Self(MASK24);
}

impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

/// A message sequence number carried in the AETH: 24 bits, wrapping (IBA 9.3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Msn(u32);

impl Msn {
    /// The next MSN, modulo 2^24.
    #[must_use]
    pub const fn next(self) -> Self {
        Self(self.0.wrapping_add(1) & MASK24)
    }
}

impl fmt::Display for Msn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A partition key (IBA 10.9); bit 15 set means full membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PKey(pub u16);

impl PKey {
    /// The default partition key, full member (what RoCE uses unless configured otherwise).
    pub const DEFAULT: Self = Self(0xFFFF);

    /// The membership bit: full (`true`) or limited.
    pub const fn is_full_member(self) -> bool {
        self.0 & 0x8000 != 0
    }

    /// The partition number without the membership bit; two keys match when these agree and
    /// at least one of them is a full member (IBA 10.9).
    pub const fn base(self) -> u16 {
        self.0 & 0x7FFF
    }
}

impl Default for PKey {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for PKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#06x}", self.0)
    }
}

/// A queue key, checked by UD receivers (IBA 10.2, DETH).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QKey(pub u32);

impl fmt::Display for QKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

/// A remote key: names a registered memory region for remote access (IBA 10.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RKey(pub u32);

impl fmt::Display for RKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_construction_rejects_or_masks_high_bits() {
        assert_eq!(Psn::new(0x00FF_FFFF), Some(Psn::MAX));
        assert_eq!(Psn::new(0x0100_0000), None);
        assert_eq!(Psn::from_masked(0x0100_0005).get(), 5);
        assert_eq!(Qpn::new(0x0100_0000), None);
        assert_eq!(Qpn::from_masked(0xFFFF_FFFF), Qpn::MULTICAST);
        assert_eq!(Msn::new(1 << 24), None);
    }

    #[test]
    fn psn_arithmetic_wraps_at_2_pow_24() {
        assert_eq!(Psn::MAX.next(), Psn::ZERO);
        assert_eq!(Psn::MAX.add(3).get(), 2);
        assert_eq!(Psn::ZERO.sub(1), Psn::MAX);
        assert_eq!(Psn::from_masked(5).sub(10).get(), 0x00FF_FFFB);
        assert_eq!(Msn::from_masked(0x00FF_FFFF).next().get(), 0);
    }

    #[test]
    fn psn_comparison_wraps_within_half_space() {
        let a = Psn::MAX;
        let b = Psn::ZERO;
        assert!(a.is_before(b), "2^24-1 precedes 0 across the wrap");
        assert!(b.is_after(a));
        assert_eq!(b.distance(a), 1);
        assert_eq!(a.distance(b), -1);
        assert_eq!(a.cmp_wrapping(a), Ordering::Equal);
        // Exactly half the space apart: the distance is -2^23, i.e. `self` counts as earlier.
        let half = Psn::from_masked(1 << 23);
        assert_eq!(half.distance(Psn::ZERO), -(1 << 23));
        assert!(Psn::from_masked((1 << 23) - 1).is_after(Psn::ZERO));
        assert!(Psn::from_masked((1 << 23) + 1).is_before(Psn::ZERO));
    }

    #[test]
    fn psn_distance_is_antisymmetric_except_at_half() {
        for (x, y) in [(0u32, 1u32), (0x00FF_FFF0, 0x10), (12345, 0x0080_0000), (7, 7)] {
            let (x, y) = (Psn::from_masked(x), Psn::from_masked(y));
            if x.distance(y) != -(1 << 23) {
                assert_eq!(x.distance(y), -y.distance(x));
            }
        }
    }

    #[test]
    fn pkey_membership() {
        assert!(PKey::DEFAULT.is_full_member());
        assert_eq!(PKey(0x7FFF).base(), PKey::DEFAULT.base());
        assert!(!PKey(0x7FFF).is_full_member());
    }
}
