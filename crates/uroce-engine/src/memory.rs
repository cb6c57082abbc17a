//! Application memory as the engine reaches it: through a trait, after the engine has checked
//! the key, protection domain, access rights and bounds of every access against its region
//! table (`mr.rs`). The runtime implements the trait over registered memory; tests and the
//! simulator use [`VecMemory`].

use std::collections::BTreeMap;

/// Byte access to registered memory, by virtual address.
///
/// The engine calls these only for ranges inside a registered region that the caller's keys
/// allow, so an implementation may treat any other range as a bug. Atomics operate on 8 aligned
/// bytes in host byte order, as RNICs do on the host's memory.
pub trait MemoryAccess {
    /// Copies `dst.len()` bytes starting at `addr` into `dst`.
    fn read(&self, addr: u64, dst: &mut [u8]);
    /// Copies `src` to `addr`.
    fn write(&mut self, addr: u64, src: &[u8]);
    /// Atomically: if the 8 bytes at `addr` equal `compare`, replace them with `swap`. Returns
    /// the value before.
    fn compare_and_swap(&mut self, addr: u64, compare: u64, swap: u64) -> u64;
    /// Atomically adds `add` (wrapping) to the 8 bytes at `addr`. Returns the value before.
    fn fetch_and_add(&mut self, addr: u64, add: u64) -> u64;

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
    fn read(&self, addr: u64, dst: &mut [u8]) {
        if dst.is_empty() {
            return;
        }
        let (base, off) = self.locate(addr, dst.len());
        dst.copy_from_slice(&self.buffers[&base][off..off + dst.len()]);
    }

    fn write(&mut self, addr: u64, src: &[u8]) {
        if src.is_empty() {
            return;
        }
        let (base, off) = self.locate(addr, src.len());
        let buf = self.buffers.get_mut(&base).unwrap_or_else(|| unreachable!());
        buf[off..off + src.len()].copy_from_slice(src);
    }

    fn slice(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let (&base, buf) = self.buffers.range(..=addr).next_back()?;
        let off = usize::try_from(addr - base).ok()?;
        buf.get(off..off.checked_add(len)?)
    }

    fn compare_and_swap(&mut self, addr: u64, compare: u64, swap: u64) -> u64 {
        let slot = self.slot(addr);
        let old = u64::from_ne_bytes(slot.try_into().unwrap_or([0; 8]));
        if old == compare {
            slot.copy_from_slice(&swap.to_ne_bytes());
        }
        old
    }

    fn fetch_and_add(&mut self, addr: u64, add: u64) -> u64 {
        let slot = self.slot(addr);
        let old = u64::from_ne_bytes(slot.try_into().unwrap_or([0; 8]));
        slot.copy_from_slice(&old.wrapping_add(add).to_ne_bytes());
        old
    }
}
