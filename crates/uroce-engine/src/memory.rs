//! Application memory as the engine reaches it: through a trait, after the engine has checked
//! the key, protection domain, access rights and bounds of every access against its region
//! table (`mr.rs`). The runtime implements the trait over registered memory; tests and the
//! simulator use [`VecMemory`].

use std::collections::BTreeMap;

/// An access found application memory gone: a page of a registered region that the
/// application unmapped (or protected) after registering it. The engine answers it as the
/// access violation it is (IBA 9.7.5.2.4 remote access error for a peer's request, a local
/// protection error for the QP's own work request), never by touching the memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryFault;

impl core::fmt::Display for MemoryFault {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("registered memory is no longer mapped")
    }
}

impl std::error::Error for MemoryFault {}

/// Byte access to registered memory, by virtual address.
///
/// The engine calls these only for ranges inside a registered region that the caller's keys
/// allow, so an implementation may treat any other range as a bug. Atomics operate on 8 aligned
/// bytes in host byte order, as RNICs do on the host's memory. Every access may find the memory
/// gone ([`MemoryFault`]): registration does not pin it, and the application may unmap it.
pub trait MemoryAccess {
    /// Copies `dst.len()` bytes starting at `addr` into `dst`.
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), MemoryFault>;
    /// Copies `src` to `addr`.
    fn write(&mut self, addr: u64, src: &[u8]) -> Result<(), MemoryFault>;
    /// Atomically: if the 8 bytes at `addr` equal `compare`, replace them with `swap`. Returns
    /// the value before.
    fn compare_and_swap(&mut self, addr: u64, compare: u64, swap: u64) -> Result<u64, MemoryFault>;
    /// Atomically adds `add` (wrapping) to the 8 bytes at `addr`. Returns the value before.
    fn fetch_and_add(&mut self, addr: u64, add: u64) -> Result<u64, MemoryFault>;

    /// Atomically stores `value` in the 8 bytes at `addr` (IBA 1.5's RDMA ATOMIC WRITE): a
    /// reader of that word sees the old value or the new, never a mix. The default builds it
    /// from the two atomics.
    fn atomic_write(&mut self, addr: u64, value: u64) -> Result<(), MemoryFault> {
        let mut seen = self.fetch_and_add(addr, 0)?;
        loop {
            let before = self.compare_and_swap(addr, seen, value)?;
            if before == seen {
                return Ok(());
            }
            seen = before;
        }
    }

    /// Whether the `len` bytes at `addr` can be read now: asked before the engine lends them
    /// to the runtime ([`MemoryAccess::slice`]) for a READ response or a send, so that memory
    /// that is gone fails the operation instead of the process. The default (memory that
    /// cannot disappear) says yes.
    fn check_readable(&self, addr: u64, len: usize) -> Result<(), MemoryFault> {
        let _ = (addr, len);
        Ok(())
    }

    /// The `len` bytes at `addr` in place, if the implementation can lend them (one region
    /// holds them). Lets a runtime send payloads straight from registered memory
    /// ([`crate::Device::poll_transmit_gather`]); `None` (the default) means "copy instead".
    fn slice(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let _ = (addr, len);
        None
    }
}

/// Memory made of separate `Vec<u8>` buffers, each at a chosen virtual address: what tests
/// and the simulator register. Accesses outside every buffer panic (the engine must never make
/// one).
#[derive(Debug, Default, Clone)]
pub struct VecMemory {
    buffers: BTreeMap<u64, Vec<u8>>,
    /// Buffers the test took away ([`VecMemory::unmap`]): every access to them faults.
    unmapped: std::collections::BTreeSet<u64>,
}

impl VecMemory {
    /// No buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a buffer at virtual address `addr` (which must not overlap another).
    pub fn insert(&mut self, addr: u64, bytes: Vec<u8>) {
        self.buffers.insert(addr, bytes);
    }

    /// Takes the buffer at `addr` away as an application's `munmap` would, registered or
    /// not: from now on every access to it is a [`MemoryFault`].
    pub fn unmap(&mut self, addr: u64) {
        self.unmapped.insert(addr);
    }

    /// Whether the buffer holding `addr` was taken away.
    fn gone(&self, addr: u64) -> Result<(), MemoryFault> {
        match self.buffers.range(..=addr).next_back() {
            Some((base, _)) if self.unmapped.contains(base) => Err(MemoryFault),
            _ => Ok(()),
        }
    }

    /// The buffer that starts at `addr`.
    pub fn buffer(&self, addr: u64) -> Option<&[u8]> {
        self.buffers.get(&addr).map(Vec::as_slice)
    }

    /// The buffer that starts at `addr`, mutably.
    pub fn buffer_mut(&mut self, addr: u64) -> Option<&mut [u8]> {
        self.buffers.get_mut(&addr).map(Vec::as_mut_slice)
    }

    fn locate(&self, addr: u64, len: usize) -> (u64, usize) {
        let (&base, buf) = self
            .buffers
            .range(..=addr)
            .next_back()
            .unwrap_or_else(|| panic!("engine accessed unmapped address {addr:#x}"));
        let off = usize::try_from(addr - base).unwrap_or(usize::MAX);
        assert!(off.saturating_add(len) <= buf.len(), "engine accessed past a buffer at {addr:#x}");
        (base, off)
    }

    fn slot(&mut self, addr: u64) -> &mut [u8] {
        let (base, off) = self.locate(addr, 8);
        let buf = self.buffers.get_mut(&base).unwrap_or_else(|| unreachable!());
        &mut buf[off..off + 8]
    }
}

impl MemoryAccess for VecMemory {
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), MemoryFault> {
        if dst.is_empty() {
            return Ok(());
        }
        self.gone(addr)?;
        let (base, off) = self.locate(addr, dst.len());
        dst.copy_from_slice(&self.buffers[&base][off..off + dst.len()]);
        Ok(())
    }

    fn write(&mut self, addr: u64, src: &[u8]) -> Result<(), MemoryFault> {
        if src.is_empty() {
            return Ok(());
        }
        self.gone(addr)?;
        let (base, off) = self.locate(addr, src.len());
        let buf = self.buffers.get_mut(&base).unwrap_or_else(|| unreachable!());
        buf[off..off + src.len()].copy_from_slice(src);
        Ok(())
    }

    fn check_readable(&self, addr: u64, len: usize) -> Result<(), MemoryFault> {
        if len == 0 { Ok(()) } else { self.gone(addr) }
    }

    fn slice(&self, addr: u64, len: usize) -> Option<&[u8]> {
        self.gone(addr).ok()?;
        let (&base, buf) = self.buffers.range(..=addr).next_back()?;
        let off = usize::try_from(addr - base).ok()?;
        buf.get(off..off.checked_add(len)?)
    }

    fn compare_and_swap(&mut self, addr: u64, compare: u64, swap: u64) -> Result<u64, MemoryFault> {
        self.gone(addr)?;
        let slot = self.slot(addr);
        let old = u64::from_ne_bytes(slot.try_into().unwrap_or([0; 8]));
        if old == compare {
            slot.copy_from_slice(&swap.to_ne_bytes());
        }
        Ok(old)
    }

    fn fetch_and_add(&mut self, addr: u64, add: u64) -> Result<u64, MemoryFault> {
        self.gone(addr)?;
        let slot = self.slot(addr);
        let old = u64::from_ne_bytes(slot.try_into().unwrap_or([0; 8]));
        slot.copy_from_slice(&old.wrapping_add(add).to_ne_bytes());
        Ok(old)
    }
}
