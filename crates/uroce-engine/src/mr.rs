//! Memory regions and memory windows: registration, binding, keys, and the checks every local
//! and remote access passes.
//!
//! A window (IBA 10.6.7) is a range of a region, with its own R_Key and remote rights, that
//! the consumer binds and moves without re-registering: type 1 with `ibv_bind_mw`, usable by
//! every QP of its PD; type 2 (2B) by a work request, usable only through the QP that bound
//! it, and invalidated locally (`IBV_WR_LOCAL_INV`) or by the peer (SEND with invalidate).
//! A window's key is a 24-bit index of its own and an 8-bit tag the binder chooses, so a
//! stale key stops working at every bind.
//!
//! Keys are 32-bit values drawn from the device's ChaCha20 generator (secretly seeded on a real
//! device), so a peer cannot guess or derive the key of a region it was not given, however
//! many keys it has seen (IBA 10.6 leaves key values to the implementation; rxe uses an index
//! plus an 8-bit tag, which a peer can step through). Deregistration removes both keys at once: a request that
//! arrives a nanosecond later is refused.

use core::hash::{BuildHasherDefault, Hasher};
use std::collections::HashMap;

use uroce_wire::RKey;

use uroce_wire::Qpn;

use crate::rng::Rng;
use crate::types::{Access, LKey, MwBind, MwHandle, MwType, PdHandle};

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
    /// Where the bytes are: `addr` for a region registered at its own address; elsewhere for
    /// one registered at another (an IOVA, `ibv_reg_mr_iova(3)`; a zero-based region, whose
    /// keys name offsets from 0, such as device memory). Keys name `addr..addr + length`.
    pub host: u64,
}

impl MemoryRegion {
    /// The host address of key-space address `a` (inside the region).
    pub const fn host_addr(&self, a: u64) -> u64 {
        self.host.wrapping_add(a.wrapping_sub(self.addr))
    }

    /// Whether `[addr, addr + len)` lies inside the region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        spans(self.addr, self.length, addr, len)
    }
}

/// Whether `[addr, addr + len)` lies inside `[start, start + length)`.
fn spans(start: u64, length: u64, addr: u64, len: u64) -> bool {
    addr >= start && addr.checked_add(len).is_some_and(|end| end <= start.saturating_add(length))
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

/// Why a bind failed (`IBV_WC_MW_BIND_ERR`); each names the IBA 10.6.7.2 rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindError {
    /// No such window, or the key named is not its current one.
    UnknownWindow,
    /// A type 2 window must be free (unbound or invalidated) to be bound (o10-37.2.30).
    NotFree,
    /// The window, the QP and the region must share a PD (C10-72).
    WrongPd,
    /// A type 2 window is bound to a region range, never to nothing (o10-37.2.40).
    EmptyType2,
    /// The region is unknown (deregistered, or a bad lkey).
    UnknownRegion,
    /// The region was registered without `IBV_ACCESS_MW_BIND` (C10-73).
    RegionLacksBind,
    /// Remote write or atomic through a window needs local write on the region (C10-74).
    WritableNeedsLocalWrite,
    /// The window must lie inside the region (C10-75).
    OutsideRegion,
    /// Only remote rights can be granted through a window.
    BadAccess,
}

impl core::fmt::Display for BindError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::UnknownWindow => "no window has this key",
            Self::NotFree => "a type 2 window must be free to be bound (o10-37.2.30)",
            Self::WrongPd => "window, QP and region must share a PD (C10-72)",
            Self::EmptyType2 => "a type 2 window cannot be bound to nothing (o10-37.2.40)",
            Self::UnknownRegion => "no region has this lkey",
            Self::RegionLacksBind => "the region lacks IBV_ACCESS_MW_BIND (C10-73)",
            Self::WritableNeedsLocalWrite => {
                "remote write or atomic needs local write on the region (C10-74)"
            }
            Self::OutsideRegion => "the window must lie inside the region (C10-75)",
            Self::BadAccess => "a window grants remote read, write and atomic only",
        })
    }
}

/// Why an invalidation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidateError {
    /// No window has this key (region keys cannot be invalidated: no fast-registered MRs).
    UnknownKey,
    /// Type 1 windows are never invalidated (o10-37.2.26).
    Type1,
    /// The window is not bound.
    NotBound,
    /// A type 2 window is invalidated only through the QP it is bound to, or a QP of its PD
    /// for a local invalidation.
    WrongQp,
}

impl core::fmt::Display for InvalidateError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::UnknownKey => "no window has this key",
            Self::Type1 => "a type 1 window cannot be invalidated (o10-37.2.26)",
            Self::NotBound => "the window is not bound",
            Self::WrongQp => "the window is bound to another QP",
        })
    }
}

/// A memory window.
#[derive(Debug, Clone, Copy)]
struct Window {
    pd: PdHandle,
    kind: MwType,
    rkey: RKey,
    bound: Option<Binding>,
}

/// What a bound window reaches.
#[derive(Debug, Clone, Copy)]
struct Binding {
    mr: LKey,
    addr: u64,
    length: u64,
    access: Access,
    /// Type 2: the QP it was bound through, the only one that may use it.
    qp: Option<Qpn>,
}

/// The device's regions and windows, by key.
#[derive(Debug, Default)]
pub(crate) struct MrTable {
    by_lkey: KeyMap<MemoryRegion>,
    rkey_to_lkey: KeyMap<u32>,
    /// Windows by handle; a window's R_Key is `index << 8 | tag`.
    windows: KeyMap<Window>,
    /// Window handles by key index (`rkey >> 8`).
    window_index: KeyMap<u32>,
    /// Key indexes (`rkey >> 8`) of regions, each with its count: no window takes one.
    region_indexes: KeyMap<u32>,
    /// The last window handle given out.
    next_window: u32,
}

impl MrTable {
    /// Registers a region whose keys name `addr..addr + length`, its bytes at `host`, and
    /// returns it with fresh keys.
    pub(crate) fn register(
        &mut self,
        rng: &mut Rng,
        pd: PdHandle,
        (addr, host): (u64, u64),
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
            if k != 0
                && !self.rkey_to_lkey.contains_key(&k)
                && !self.window_index.contains_key(&(k >> 8))
            {
                break k;
            }
        };
        let mr =
            MemoryRegion { pd, addr, length, access, lkey: LKey(lkey), rkey: RKey(rkey), host };
        self.by_lkey.insert(lkey, mr);
        self.rkey_to_lkey.insert(rkey, lkey);
        *self.region_indexes.entry(rkey >> 8).or_default() += 1;
        mr
    }

    /// Allocates an unbound window of `pd` (`ibv_alloc_mw`) and returns it with its key.
    pub(crate) fn alloc_window(
        &mut self,
        rng: &mut Rng,
        pd: PdHandle,
        kind: MwType,
    ) -> (MwHandle, RKey) {
        let index = loop {
            let i = rng.next_u32() >> 8;
            if i != 0
                && !self.window_index.contains_key(&i)
                && !self.region_indexes.contains_key(&i)
            {
                break i;
            }
        };
        let tag = rng.next_u32() & 0xff;
        let rkey = RKey(index << 8 | tag);
        self.next_window = self.next_window.wrapping_add(1).max(1);
        while self.windows.contains_key(&self.next_window) {
            self.next_window = self.next_window.wrapping_add(1).max(1);
        }
        let handle = self.next_window;
        self.windows.insert(handle, Window { pd, kind, rkey, bound: None });
        self.window_index.insert(index, handle);
        (MwHandle(handle), rkey)
    }

    /// Removes a window (`ibv_dealloc_mw`): its key stops working at once. `None` if unknown.
    pub(crate) fn dealloc_window(&mut self, mw: MwHandle) -> Option<PdHandle> {
        let w = self.windows.remove(&mw.0)?;
        self.window_index.remove(&(w.rkey.0 >> 8));
        Some(w.pd)
    }

    /// A window's PD and current key.
    pub(crate) fn window(&self, mw: MwHandle) -> Option<(PdHandle, MwType, RKey)> {
        self.windows.get(&mw.0).map(|w| (w.pd, w.kind, w.rkey))
    }

    /// Number of windows.
    pub(crate) fn windows(&self) -> usize {
        self.windows.len()
    }

    /// Whether any window belongs to `pd`.
    pub(crate) fn any_window_in(&self, pd: PdHandle) -> bool {
        self.windows.values().any(|w| w.pd == pd)
    }

    /// Binds a window for QP `qpn` of `pd` (IBA 10.6.7.2): checks every rule, then gives the
    /// window its range, rights and new key — the tag (low 8 bits) of `b.rkey` — and returns
    /// that key. A type 1 window with length 0 is unbound.
    pub(crate) fn bind(&mut self, b: &MwBind, pd: PdHandle, qpn: Qpn) -> Result<RKey, BindError> {
        let w = self.windows.get(&b.mw.0).ok_or(BindError::UnknownWindow)?;
        if w.rkey.0 >> 8 != b.rkey.0 >> 8 {
            return Err(BindError::UnknownWindow);
        }
        if w.pd != pd {
            return Err(BindError::WrongPd);
        }
        if w.kind == MwType::Type2 {
            if w.bound.is_some() {
                return Err(BindError::NotFree);
            }
            if b.length == 0 {
                return Err(BindError::EmptyType2);
            }
        }
        if !Access::REMOTE.contains(b.access) {
            return Err(BindError::BadAccess);
        }
        let bound = if b.length == 0 {
            None
        } else {
            let mr = self.by_lkey.get(&b.mr.0).ok_or(BindError::UnknownRegion)?;
            if mr.pd != pd {
                return Err(BindError::WrongPd);
            }
            if !mr.access.contains(Access::MW_BIND) {
                return Err(BindError::RegionLacksBind);
            }
            let writable =
                Access::from_bits(Access::REMOTE_WRITE.bits() | Access::REMOTE_ATOMIC.bits());
            if b.access.bits() & writable.bits() != 0 && !mr.access.contains(Access::LOCAL_WRITE) {
                return Err(BindError::WritableNeedsLocalWrite);
            }
            if !mr.contains(b.addr, b.length) {
                return Err(BindError::OutsideRegion);
            }
            let qp = (w.kind == MwType::Type2).then_some(qpn);
            Some(Binding { mr: b.mr, addr: b.addr, length: b.length, access: b.access, qp })
        };
        let rkey = RKey((w.rkey.0 & !0xff) | (b.rkey.0 & 0xff));
        if let Some(w) = self.windows.get_mut(&b.mw.0) {
            (w.rkey, w.bound) = (rkey, bound);
        }
        Ok(rkey)
    }

    /// Invalidates the type 2 window `rkey` names: locally (`IBV_WR_LOCAL_INV` on a QP of
    /// `pd`) or, with `remote`, for the peer of QP `qpn` (IETH), which must be the QP it is
    /// bound to. The window is then free to bind again.
    pub(crate) fn invalidate(
        &mut self,
        rkey: RKey,
        pd: PdHandle,
        qpn: Qpn,
        remote: bool,
    ) -> Result<(), InvalidateError> {
        let handle = self.window_index.get(&(rkey.0 >> 8)).ok_or(InvalidateError::UnknownKey)?;
        let w = self.windows.get_mut(handle).ok_or(InvalidateError::UnknownKey)?;
        if w.rkey != rkey {
            return Err(InvalidateError::UnknownKey);
        }
        if w.kind == MwType::Type1 {
            return Err(InvalidateError::Type1);
        }
        let Some(b) = w.bound else { return Err(InvalidateError::NotBound) };
        if w.pd != pd || (remote && b.qp != Some(qpn)) {
            return Err(InvalidateError::WrongQp);
        }
        w.bound = None;
        Ok(())
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
        // The same range keeps its translation (a change of PD or access only); a new one is
        // at its own address.
        let host = if (addr, length) == (old.addr, old.length) { old.host } else { addr };
        (mr.pd, mr.addr, mr.host, mr.length, mr.access) = (pd, addr, host, length, access);
        Some(old)
    }

    /// Whether any region belongs to `pd`.
    pub(crate) fn any_in(&self, pd: PdHandle) -> bool {
        self.by_lkey.values().any(|mr| mr.pd == pd)
    }

    /// Removes a region; its keys, and the windows bound in it, stop working immediately.
    pub(crate) fn deregister(&mut self, lkey: LKey) -> Option<MemoryRegion> {
        let mr = self.by_lkey.remove(&lkey.0)?;
        self.rkey_to_lkey.remove(&mr.rkey.0);
        let index = mr.rkey.0 >> 8;
        if let Some(n) = self.region_indexes.get_mut(&index) {
            *n -= 1;
            if *n == 0 {
                self.region_indexes.remove(&index);
            }
        }
        Some(mr)
    }

    /// Checks a local access of `len` bytes at `addr` through `lkey` for a QP of `pd`;
    /// `write` asks for local write access (IBA 10.6: receive buffers and READ/atomic
    /// results need it). Returns where `addr`'s bytes are (the host address).
    pub(crate) fn check_local(
        &self,
        lkey: LKey,
        pd: PdHandle,
        addr: u64,
        len: u64,
        write: bool,
    ) -> Result<u64, AccessError> {
        let mr = self.by_lkey.get(&lkey.0).ok_or(AccessError::InvalidKey)?;
        let right = if write { Access::LOCAL_WRITE } else { Access::NONE };
        Self::check(mr, pd, addr, len, right).map(|mr| mr.host_addr(addr))
    }

    /// Checks a remote access of `len` bytes at `addr` through `rkey` for QP `qpn` of `pd`,
    /// needing `right` (IBA 9.7: R_Key, bounds and access are all checked before any byte
    /// moves). The key is a region's or a bound window's (IBA 10.6.7.3: a type 2 window only
    /// through the QP it is bound to; the window's range and rights, then the region's).
    /// Returns where `addr`'s bytes are (the host address).
    pub(crate) fn check_remote(
        &self,
        rkey: RKey,
        pd: PdHandle,
        qpn: Qpn,
        addr: u64,
        len: u64,
        right: Access,
    ) -> Result<u64, AccessError> {
        if let Some(lkey) = self.rkey_to_lkey.get(&rkey.0) {
            let mr = self.by_lkey.get(lkey).ok_or(AccessError::InvalidKey)?;
            return Self::check(mr, pd, addr, len, right).map(|mr| mr.host_addr(addr));
        }
        let handle = self.window_index.get(&(rkey.0 >> 8)).ok_or(AccessError::InvalidKey)?;
        let w = self.windows.get(handle).ok_or(AccessError::InvalidKey)?;
        let b = w.bound.filter(|_| w.rkey == rkey).ok_or(AccessError::InvalidKey)?;
        if w.pd != pd || b.qp.is_some_and(|q| q != qpn) {
            return Err(AccessError::WrongPd);
        }
        if !b.access.contains(right) {
            return Err(AccessError::NotPermitted);
        }
        if !spans(b.addr, b.length, addr, len) {
            return Err(AccessError::OutOfBounds);
        }
        // The region under the window: deregistered (or rebound narrower) means no access.
        let mr = self.by_lkey.get(&b.mr.0).ok_or(AccessError::InvalidKey)?;
        Self::check(mr, pd, addr, len, Access::NONE).map(|mr| mr.host_addr(addr))
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
        let mr = t.register(
            &mut rng,
            pd,
            (0x1000, 0x1000),
            0x100,
            Access::LOCAL_WRITE | Access::REMOTE_READ,
        );
        assert!(
            t.check_remote(mr.rkey, pd, Qpn::new(1).unwrap(), 0x1000, 0x100, Access::REMOTE_READ)
                .is_ok()
        );
        assert_eq!(
            t.check_remote(mr.rkey, pd, Qpn::new(1).unwrap(), 0x1001, 0x100, Access::REMOTE_READ),
            Err(AccessError::OutOfBounds),
            "one byte past the end"
        );
        assert_eq!(
            t.check_remote(mr.rkey, pd, Qpn::new(1).unwrap(), 0xFFF, 1, Access::REMOTE_READ),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            t.check_remote(mr.rkey, pd, Qpn::new(1).unwrap(), 0x1000, 8, Access::REMOTE_WRITE),
            Err(AccessError::NotPermitted)
        );
        assert_eq!(
            t.check_remote(
                mr.rkey,
                PdHandle(2),
                Qpn::new(1).unwrap(),
                0x1000,
                8,
                Access::REMOTE_READ
            ),
            Err(AccessError::WrongPd)
        );
        assert_eq!(
            t.check_remote(
                RKey(mr.rkey.0 ^ 1),
                pd,
                Qpn::new(1).unwrap(),
                0x1000,
                8,
                Access::REMOTE_READ
            ),
            Err(AccessError::InvalidKey)
        );
        assert_eq!(
            t.check_remote(mr.rkey, pd, Qpn::new(1).unwrap(), u64::MAX, 2, Access::REMOTE_READ),
            Err(AccessError::OutOfBounds)
        );
        assert!(t.check_local(mr.lkey, pd, 0x10FF, 1, true).is_ok());
        t.deregister(mr.lkey).unwrap();
        assert_eq!(
            t.check_remote(mr.rkey, pd, Qpn::new(1).unwrap(), 0x1000, 8, Access::REMOTE_READ),
            Err(AccessError::InvalidKey),
            "deregistration revokes the rkey at once"
        );
        assert_eq!(t.check_local(mr.lkey, pd, 0x1000, 8, false), Err(AccessError::InvalidKey));
    }

    #[test]
    fn keys_differ_between_regions_and_seeds() {
        let mut t = MrTable::default();
        let mut rng = Rng::new(1);
        let a = t.register(&mut rng, PdHandle(0), (0, 0), 8, Access::NONE);
        let b = t.register(&mut rng, PdHandle(0), (0, 0), 8, Access::NONE);
        assert_ne!(a.rkey, b.rkey);
        let mut other = MrTable::default();
        let c = other.register(&mut Rng::new(2), PdHandle(0), (0, 0), 8, Access::NONE);
        assert_ne!(a.rkey, c.rkey);
    }

    #[test]
    fn a_type_2_window_serves_only_its_qp_and_dies_with_its_region_or_itself() {
        let mut rng = Rng::new(3);
        let mut t = MrTable::default();
        let pd = PdHandle(1);
        let (q1, q2) = (Qpn::new(0x11).unwrap(), Qpn::new(0x12).unwrap());
        let mr = t.register(
            &mut rng,
            pd,
            (0x1000, 0x1000),
            0x1000,
            Access::LOCAL_WRITE | Access::MW_BIND,
        );
        let (mw, k0) = t.alloc_window(&mut rng, pd, MwType::Type2);
        assert_ne!(k0.0 >> 8, mr.rkey.0 >> 8, "windows and regions never share a key index");
        let key = RKey((k0.0 & !0xff) | (k0.0.wrapping_add(1) & 0xff));
        let b = MwBind {
            mw,
            rkey: key,
            mr: mr.lkey,
            addr: 0x1100,
            length: 0x100,
            access: Access::REMOTE_WRITE,
        };
        assert_eq!(t.bind(&b, PdHandle(2), q1), Err(BindError::WrongPd));
        assert_eq!(t.bind(&b, pd, q1), Ok(key));
        assert!(t.check_remote(key, pd, q1, 0x1100, 0x100, Access::REMOTE_WRITE).is_ok());
        assert_eq!(
            t.check_remote(key, pd, q2, 0x1100, 8, Access::REMOTE_WRITE),
            Err(AccessError::WrongPd),
            "type 2: only the QP it was bound through"
        );
        assert_eq!(
            t.check_remote(k0, pd, q1, 0x1100, 8, Access::REMOTE_WRITE),
            Err(AccessError::InvalidKey)
        );
        assert_eq!(t.invalidate(key, pd, q2, true), Err(InvalidateError::WrongQp));
        t.deregister(mr.lkey).unwrap();
        assert_eq!(
            t.check_remote(key, pd, q1, 0x1100, 8, Access::REMOTE_WRITE),
            Err(AccessError::InvalidKey),
            "the region under the window is gone"
        );
        t.dealloc_window(mw).unwrap();
        assert_eq!(t.invalidate(key, pd, q1, true), Err(InvalidateError::UnknownKey));
        assert!(!t.any_window_in(pd));
    }
}
