//! Memory regions: registration, keys, and the checks every local and remote access passes.
//!
//! Keys are 32-bit values drawn from the device's ChaCha20 generator (secretly seeded on a real
//! device), so a peer cannot guess or derive the key of a region it was not given, however
//! many keys it has seen (IBA 10.6 leaves key values to the implementation; rxe uses an index
//! plus an 8-bit tag, which a peer can step through). Deregistration removes both keys at once: a request that
//! arrives a nanosecond later is refused.

use core::hash::{BuildHasherDefault, Hasher};
use std::collections::HashMap;

use uroce_wire::RKey;

use crate::rng::Rng;
use crate::types::{Access, LKey, PdHandle};

/// A registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryRegion {
    /// Protection domain.
    pub pd: PdHandle,
    /// First virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// Rights.
    pub access: Access,
    /// Local key.
    pub lkey: LKey,
    /// Remote key.
    pub rkey: RKey,
}

impl MemoryRegion {
    /// Whether `[addr, addr + len)` lies inside the region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr
            && addr.checked_add(len).is_some_and(|end| end <= self.addr.saturating_add(self.length))
    }
}

/// Why an access was refused. Each maps to a completion status or a NAK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessError {
    /// No region has this key (never registered, or deregistered).
    InvalidKey,
    /// The region belongs to another protection domain than the QP.
    WrongPd,
    /// The range is not inside the region.
    OutOfBounds,
    /// The region does not grant the right the access needs.
    NotPermitted,
}

/// Hashes a key: keys are already uniformly random 32-bit values, so one multiplication
/// spreads them; SipHash's resistance to chosen keys buys nothing when a peer can only look
/// keys up, never insert them.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
}

type KeyMap<V> = HashMap<u32, V, BuildHasherDefault<KeyHasher>>;

/// The device's regions, by key.
#[derive(Debug, Default)]
pub(crate) struct MrTable {
    by_lkey: KeyMap<MemoryRegion>,
    rkey_to_lkey: KeyMap<u32>,
}

impl MrTable {
    /// Registers a region and returns it with fresh keys.
    pub(crate) fn register(
        &mut self,
        rng: &mut Rng,
        pd: PdHandle,
        addr: u64,
        length: u64,
        access: Access,
    ) -> MemoryRegion {
        let lkey = loop {
            let k = rng.next_u32();
            if k != 0 && !self.by_lkey.contains_key(&k) {
                break k;
            }
        };
        let rkey = loop {
            let k = rng.next_u32();
            if k != 0 && !self.rkey_to_lkey.contains_key(&k) {
                break k;
            }
        };
        let mr = MemoryRegion { pd, addr, length, access, lkey: LKey(lkey), rkey: RKey(rkey) };
        self.by_lkey.insert(lkey, mr);
        self.rkey_to_lkey.insert(rkey, lkey);
        mr
    }

    /// Region `lkey`, if registered.
    pub(crate) fn get(&self, lkey: LKey) -> Option<MemoryRegion> {
        self.by_lkey.get(&lkey.0).copied()
    }

    /// Gives region `lkey` a new PD, range and access under the same keys; the region as it
    /// was, or `None` if the key is unknown.
    pub(crate) fn update(
        &mut self,
        lkey: LKey,
        pd: PdHandle,
        addr: u64,
        length: u64,
        access: Access,
    ) -> Option<MemoryRegion> {
        let mr = self.by_lkey.get_mut(&lkey.0)?;
        let old = *mr;
        (mr.pd, mr.addr, mr.length, mr.access) = (pd, addr, length, access);
        Some(old)
    }

    /// Whether any region belongs to `pd`.
    pub(crate) fn any_in(&self, pd: PdHandle) -> bool {
        self.by_lkey.values().any(|mr| mr.pd == pd)
    }

    /// Removes a region; its keys stop working immediately.
    pub(crate) fn deregister(&mut self, lkey: LKey) -> Option<MemoryRegion> {
        let mr = self.by_lkey.remove(&lkey.0)?;
        self.rkey_to_lkey.remove(&mr.rkey.0);
        Some(mr)
    }

    /// Checks a local access of `len` bytes at `addr` through `lkey` for a QP of `pd`;
    /// `write` asks for local write access (IBA 10.6: receive buffers and READ/atomic
    /// results need it).
    pub(crate) fn check_local(
        &self,
        lkey: LKey,
        pd: PdHandle,
        addr: u64,
        len: u64,
        write: bool,
    ) -> Result<&MemoryRegion, AccessError> {
        let mr = self.by_lkey.get(&lkey.0).ok_or(AccessError::InvalidKey)?;
        Self::check(mr, pd, addr, len, if write { Access::LOCAL_WRITE } else { Access::NONE })
    }

    /// Checks a remote access of `len` bytes at `addr` through `rkey` for a QP of `pd`,
    /// needing `right` (IBA 9.7: R_Key, bounds and access are all checked before
    /// any byte moves).
    pub(crate) fn check_remote(
        &self,
        rkey: RKey,
        pd: PdHandle,
        addr: u64,
        len: u64,
        right: Access,
    ) -> Result<&MemoryRegion, AccessError> {
        let lkey = self.rkey_to_lkey.get(&rkey.0).ok_or(AccessError::InvalidKey)?;
        let mr = self.by_lkey.get(lkey).ok_or(AccessError::InvalidKey)?;
        Self::check(mr, pd, addr, len, right)
    }

    fn check(
        mr: &MemoryRegion,
        pd: PdHandle,
        addr: u64,
        len: u64,
        right: Access,
    ) -> Result<&MemoryRegion, AccessError> {
        if mr.pd != pd {
            return Err(AccessError::WrongPd);
        }
        if !mr.access.contains(right) {
            return Err(AccessError::NotPermitted);
        }
        if !mr.contains(addr, len) {
            return Err(AccessError::OutOfBounds);
        }
        Ok(mr)
    }

    /// Number of registered regions.
    pub(crate) fn len(&self) -> usize {
        self.by_lkey.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_key_pd_rights_and_bounds() {
        let mut rng = Rng::new(7);
        let mut t = MrTable::default();
        let pd = PdHandle(1);
        let mr = t.register(&mut rng, pd, 0x1000, 0x100, Access::LOCAL_WRITE | Access::REMOTE_READ);
        assert!(t.check_remote(mr.rkey, pd, 0x1000, 0x100, Access::REMOTE_READ).is_ok());
        assert_eq!(
            t.check_remote(mr.rkey, pd, 0x1001, 0x100, Access::REMOTE_READ),
            Err(AccessError::OutOfBounds),
            "one byte past the end"
        );
        assert_eq!(
            t.check_remote(mr.rkey, pd, 0xFFF, 1, Access::REMOTE_READ),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            t.check_remote(mr.rkey, pd, 0x1000, 8, Access::REMOTE_WRITE),
            Err(AccessError::NotPermitted)
        );
        assert_eq!(
            t.check_remote(mr.rkey, PdHandle(2), 0x1000, 8, Access::REMOTE_READ),
            Err(AccessError::WrongPd)
        );
        assert_eq!(
            t.check_remote(RKey(mr.rkey.0 ^ 1), pd, 0x1000, 8, Access::REMOTE_READ),
            Err(AccessError::InvalidKey)
        );
        assert_eq!(
            t.check_remote(mr.rkey, pd, u64::MAX, 2, Access::REMOTE_READ),
            Err(AccessError::OutOfBounds)
        );
        assert!(t.check_local(mr.lkey, pd, 0x10FF, 1, true).is_ok());
        t.deregister(mr.lkey).unwrap();
        assert_eq!(
            t.check_remote(mr.rkey, pd, 0x1000, 8, Access::REMOTE_READ),
            Err(AccessError::InvalidKey),
            "deregistration revokes the rkey at once"
        );
        assert_eq!(t.check_local(mr.lkey, pd, 0x1000, 8, false), Err(AccessError::InvalidKey));
    }

    #[test]
    fn keys_differ_between_regions_and_seeds() {
        let mut t = MrTable::default();
        let mut rng = Rng::new(1);
        let a = t.register(&mut rng, PdHandle(0), 0, 8, Access::NONE);
        let b = t.register(&mut rng, PdHandle(0), 0, 8, Access::NONE);
        assert_ne!(a.rkey, b.rkey);
        let mut other = MrTable::default();
        let c = other.register(&mut Rng::new(2), PdHandle(0), 0, 8, Access::NONE);
        assert_ne!(a.rkey, c.rkey);
    }
}
