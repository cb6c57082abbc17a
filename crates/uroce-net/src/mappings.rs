//! Whether a range of this process's address space is mapped, and with which rights: what a
//! device checks when it pins the pages of an `ibv_reg_mr` (Linux's `ib_umem_get`: EINVAL for a
//! range that wraps, EFAULT for pages that are not there or not writable when the registration
//! asks for write access).

use std::io;

/// Why a range cannot be registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeError {
    /// `addr + len` wraps around the address space.
    Wraps,
    /// Part of the range (from this address) is not mapped.
    Unmapped(u64),
    /// Part of the range (from this address) is mapped without the rights asked for.
    NoAccess(u64),
}

impl core::fmt::Display for RangeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Wraps => f.write_str("the range wraps around the address space"),
            Self::Unmapped(a) => write!(f, "nothing is mapped at {a:#x}"),
            Self::NoAccess(a) => write!(f, "the mapping at {a:#x} lacks the access asked for"),
        }
    }
}

impl std::error::Error for RangeError {}

/// The largest region this device registers: the user address space of x86-64 and AArch64
/// with four-level page tables (128 TiB).
pub const MAX_REGION: u64 = 1 << 47;

/// Checks that `len` bytes at `addr` are mapped readable (and writable if `write`), from
/// `/proc/self/maps`.
pub fn check_range(addr: u64, len: u64, write: bool) -> Result<(), RangeError> {
    let end = addr.checked_add(len).ok_or(RangeError::Wraps)?;
    let maps =
        std::fs::read_to_string("/proc/self/maps").map_err(|_| RangeError::Unmapped(addr))?;
    check_in(&maps, addr, end, write)
}

/// [`check_range`] against the text of a maps file.
fn check_in(maps: &str, addr: u64, end: u64, write: bool) -> Result<(), RangeError> {
    let mut at = addr;
    // Mappings are listed in address order; walk them until the range is covered.
    for line in maps.lines() {
        let Some((lo, hi, perms)) = parse_line(line) else { continue };
        if hi <= at {
            continue;
        }
        if lo > at {
            return Err(RangeError::Unmapped(at));
        }
        let rights = perms.as_bytes();
        if rights.first() != Some(&b'r') || (write && rights.get(1) != Some(&b'w')) {
            return Err(RangeError::NoAccess(at));
        }
        at = hi;
        if at >= end {
            return Ok(());
        }
    }
    if at >= end { Ok(()) } else { Err(RangeError::Unmapped(at)) }
}

/// `lo-hi perms …` of one maps line.
fn parse_line(line: &str) -> Option<(u64, u64, &str)> {
    let mut words = line.split_ascii_whitespace();
    let (lo, hi) = words.next()?.split_once('-')?;
    let perms = words.next()?;
    Some((u64::from_str_radix(lo, 16).ok()?, u64::from_str_radix(hi, 16).ok()?, perms))
}

/// For a caller that wants an `io::Error`.
impl From<RangeError> for io::Error {
    fn from(e: RangeError) -> Self {
        let kind = match e {
            RangeError::Wraps => io::ErrorKind::InvalidInput,
            RangeError::Unmapped(_) | RangeError::NoAccess(_) => io::ErrorKind::PermissionDenied,
        };
        Self::new(kind, e)
    }
}

/// Faults in the pages of `len` bytes at `addr` (readable, or writable with `write`) without
/// touching their contents: an on-demand-paging prefetch (`ibv_advise_mr(3)`).
pub fn prefetch(addr: u64, len: u64, write: bool) -> io::Result<()> {
    crate::sys::populate(addr, len, write)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
1000-3000 rw-p 00000000 00:00 0
3000-4000 r--p 00000000 00:00 0
5000-6000 rw-p 00000000 00:00 0 [heap]
";

    #[test]
    fn ranges_are_checked_against_every_mapping_they_cross() {
        assert_eq!(check_in(MAPS, 0x1000, 0x3000, true), Ok(()));
        assert_eq!(check_in(MAPS, 0x1800, 0x4000, false), Ok(()), "two adjacent mappings");
        assert_eq!(check_in(MAPS, 0x1800, 0x4000, true), Err(RangeError::NoAccess(0x3000)));
        assert_eq!(check_in(MAPS, 0x3800, 0x5800, false), Err(RangeError::Unmapped(0x4000)));
        assert_eq!(check_in(MAPS, 0x0, 0x10, false), Err(RangeError::Unmapped(0)));
        assert_eq!(check_in(MAPS, 0x5000, 0x7000, false), Err(RangeError::Unmapped(0x6000)));
        assert_eq!(check_range(u64::MAX - 1, 4, false), Err(RangeError::Wraps));
    }

    #[test]
    fn this_process_memory_checks_as_it_is_mapped() {
        let v = vec![0u8; 1 << 20];
        let a = v.as_ptr() as u64;
        assert_eq!(check_range(a, 1 << 20, true), Ok(()));
        assert!(check_range(a, 1 << 40, false).is_err(), "a terabyte past a heap buffer");
        assert!(matches!(check_range(0x1000, 4096, false), Err(RangeError::Unmapped(_))));
        // Code is mapped readable, not writable.
        let f: fn() = ranges_are_checked_against_every_mapping_they_cross;
        let code = f as usize as u64;
        assert_eq!(check_range(code, 1, false), Ok(()));
        assert!(matches!(check_range(code, 1, true), Err(RangeError::NoAccess(_))));
    }
}
