//! Registered memory as the engine reaches it: the regions the application registered, by
//! virtual address (their real address in this process).

use std::collections::BTreeMap;
use std::sync::Arc;

use uroce_engine::{MemoryAccess, MemoryFault};

use super::RawRegion;

/// The registered regions of one device. It lives inside the device lock, so every access the
/// engine makes through it is serialized with the application's accessors.
///
/// Regions are kept by start address; several may start at one address, and regions may
/// overlap, when the application registers the same memory more than once (`ibv_reg_mr` allows
/// it: each registration has its own keys).
#[derive(Debug, Default)]
pub struct Registry {
    regions: BTreeMap<u64, Vec<Arc<RawRegion>>>,
    /// Accesses outside every region: an engine bug if ever non-zero (the engine checks keys
    /// and bounds first); counted instead of touching memory.
    pub stray_accesses: u64,
}

impl Registry {
    pub(crate) fn insert(&mut self, region: Arc<RawRegion>) {
        self.regions.entry(region.addr()).or_default().push(region);
    }

    /// Removes one region of `len` bytes at `addr`.
    pub(crate) fn remove(&mut self, addr: u64, len: u64) -> Option<Arc<RawRegion>> {
        let at = self.regions.get_mut(&addr)?;
        let i = at.iter().position(|r| r.len() as u64 == len)?;
        let region = at.swap_remove(i);
        if at.is_empty() {
            self.regions.remove(&addr);
        }
        Some(region)
    }

    /// A region holding `addr..addr + len`, and the offset of `addr` in it: the nearest one
    /// starting at or below `addr` first, then (overlapping registrations) the ones before it.
    fn find(&self, addr: u64, len: usize) -> Option<(&RawRegion, usize)> {
        self.regions.range(..=addr).rev().find_map(|(&start, at)| {
            let offset = usize::try_from(addr - start).ok()?;
            let end = offset.checked_add(len)?;
            at.iter().find(|r| end <= r.len()).map(|r| (&**r, offset))
        })
    }

    /// Copies out of a region for the application. `false` if out of range.
    pub(crate) fn copy_out(&self, region: &RawRegion, offset: usize, dst: &mut [u8]) -> bool {
        if offset.checked_add(dst.len()).is_none_or(|end| end > region.len()) {
            return false;
        }
        // SAFETY: the caller holds the device lock, which every writer of registered memory
        // holds too; the range is checked.
        unsafe { region.read(offset, dst) }.is_ok()
    }

    /// Copies into a region for the application. `false` if out of range.
    pub(crate) fn copy_in(&mut self, region: &RawRegion, offset: usize, src: &[u8]) -> bool {
        if offset.checked_add(src.len()).is_none_or(|end| end > region.len()) {
            return false;
        }
        // SAFETY: as in `copy_out`: the device lock serializes every access.
        unsafe { region.write(offset, src) }.is_ok()
    }

    /// The 8 bytes at `addr`, their region and offset (`None`: in no region).
    fn word(&self, addr: u64) -> Result<Option<(&RawRegion, usize, u64)>, MemoryFault> {
        let Some((r, off)) = self.find(addr, 8) else { return Ok(None) };
        let mut b = [0u8; 8];
        // SAFETY: the device lock is held (the engine runs under it); range checked by `find`.
        unsafe { r.read(off, &mut b) }.map_err(|_| MemoryFault)?;
        Ok(Some((r, off, u64::from_ne_bytes(b))))
    }
}

impl MemoryAccess for Registry {
    fn slice(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let (r, off) = self.find(addr, len)?;
        // SAFETY: every write to registered memory goes through `&mut Registry` (the engine's
        // `write`, atomics and `copy_in`), so none can happen while this shared borrow of the
        // registry, which the slice lives no longer than, exists.
        Some(unsafe { r.slice(off, len) })
    }

    fn check_readable(&self, addr: u64, len: usize) -> Result<(), MemoryFault> {
        match self.find(addr, len) {
            Some((r, off)) => r.readable(off, len).map_err(|_| MemoryFault),
            None => Ok(()),
        }
    }

    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), MemoryFault> {
        match self.find(addr, dst.len()) {
            // SAFETY: the engine calls this under the device lock; range checked by `find`.
            Some((r, off)) => unsafe { r.read(off, dst) }.map_err(|_| MemoryFault),
            None => {
                dst.fill(0);
                Ok(())
            }
        }
    }

    fn write(&mut self, addr: u64, src: &[u8]) -> Result<(), MemoryFault> {
        match self.find(addr, src.len()) {
            // SAFETY: the engine calls this under the device lock; range checked by `find`.
            Some((r, off)) => unsafe { r.write(off, src) }.map_err(|_| MemoryFault),
            None => {
                self.stray_accesses += 1;
                Ok(())
            }
        }
    }

    fn compare_and_swap(&mut self, addr: u64, compare: u64, swap: u64) -> Result<u64, MemoryFault> {
        let Some((r, off, old)) = self.word(addr)? else {
            self.stray_accesses += 1;
            return Ok(0);
        };
        if old == compare {
            // SAFETY: as in `write`; the read and this write are one step under the lock.
            unsafe { r.write(off, &swap.to_ne_bytes()) }.map_err(|_| MemoryFault)?;
        }
        Ok(old)
    }

    fn fetch_and_add(&mut self, addr: u64, add: u64) -> Result<u64, MemoryFault> {
        let Some((r, off, old)) = self.word(addr)? else {
            self.stray_accesses += 1;
            return Ok(0);
        };
        // SAFETY: as in `write`; the read and this write are one step under the lock.
        unsafe { r.write(off, &old.wrapping_add(add).to_ne_bytes()) }.map_err(|_| MemoryFault)?;
        Ok(old)
    }
}
