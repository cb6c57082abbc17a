//! Time as the engine sees it: a point on a nanosecond timeline that the caller supplies.
//!
//! The engine never reads a clock. The runtime passes the wall clock in; the simulator passes a
//! virtual one, so an ACK timeout of seconds is tested in microseconds of real time.

use core::fmt;
use core::ops::{Add, AddAssign, Sub};

/// A point in time, in nanoseconds since an origin the caller chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

/// A span of time in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(u64);

impl Instant {
    /// The origin.
    pub const ZERO: Self = Self(0);

    /// An instant `nanos` after the origin.
    pub const fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self − earlier`, or zero if `earlier` is later.
    pub const fn saturating_since(self, earlier: Self) -> Duration {
        Duration(self.0.saturating_sub(earlier.0))
    }
}

impl Duration {
    /// No time.
    pub const ZERO: Self = Self(0);
    /// The longest representable span; used for "never".
    pub const MAX: Self = Self(u64::MAX);

    /// A span of `nanos` nanoseconds.
    pub const fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }
    /// A span of `micros` microseconds.
    pub const fn from_micros(micros: u64) -> Self {
        Self(micros.saturating_mul(1_000))
    }
    /// A span of `millis` milliseconds.
    pub const fn from_millis(millis: u64) -> Self {
        Self(millis.saturating_mul(1_000_000))
    }
    /// A span of `secs` seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Self(secs.saturating_mul(1_000_000_000))
    }
    /// The span in nanoseconds.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    /// The span in whole microseconds.
    pub const fn as_micros(self) -> u64 {
        self.0 / 1_000
    }
    /// `self × n`, saturating.
    #[must_use]
    pub const fn saturating_mul(self, n: u64) -> Self {
        Self(self.0.saturating_mul(n))
    }
}

impl Add<Duration> for Instant {
    type Output = Self;
    fn add(self, d: Duration) -> Self {
        Self(self.0.saturating_add(d.0))
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl Sub for Instant {
    type Output = Duration;
    fn sub(self, rhs: Self) -> Duration {
        self.saturating_since(rhs)
    }
}

impl Add for Duration {
    type Output = Self;
    fn add(self, rhs: Self) -> Self {
        Self(self.0.saturating_add(rhs.0))
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:09}s", self.0 / 1_000_000_000, self.0 % 1_000_000_000)
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 >= 1_000_000 {
            write!(f, "{}.{:03}ms", self.0 / 1_000_000, (self.0 / 1_000) % 1_000)
        } else {
            write!(f, "{}.{:03}us", self.0 / 1_000, self.0 % 1_000)
        }
    }
}
