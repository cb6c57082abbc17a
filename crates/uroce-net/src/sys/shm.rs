//! Shared memory between the processes of one host: file-backed `MAP_SHARED` mappings (files in
//! a per-user directory of `/dev/shm`), the atomics and byte copies done on them, FIFOs that
//! wake a sleeping process, and process liveness.
//!
//! A mapping is reached only through its accessors, which check every offset: the other
//! processes that map the same file may write anything into it at any time, so nothing here
//! hands out a Rust reference to its bytes (only to its atomics, which may be shared).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64};

use super::check;

/// A file mapped `MAP_SHARED`, read-write.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: core::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; every access goes through atomics or through copies
// whose callers own the bytes by the protocol of the structure laid over them (a ring's
// producer writes only its free space, its consumer reads only published records).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` gives out no reference to non-atomic bytes.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `file` (which must be at least that long).
    pub(crate) fn new(file: &File, len: usize) -> io::Result<Self> {
        // SAFETY: mmap(2) of a file descriptor we hold, at an address the kernel picks; the
        // result is checked before use.
        let raw = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = core::ptr::NonNull::new(raw.cast())
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        Ok(Self { ptr, len })
    }

    fn in_range(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// The `u64` at `offset`, as an atomic. `offset` is one of the caller's layout constants:
    /// it must be 8-aligned and in range, or this panics (a bug, never input).
    pub(crate) fn u64_at(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && self.in_range(offset, 8), "u64 outside the mapping");
        // SAFETY: in range (checked above), so the pointer stays in the mapping.
        let at = unsafe { self.ptr.as_ptr().add(offset) };
        // SAFETY: in range and aligned (checked above; the mapping is page-aligned); the bytes
        // live as long as `self`, and are only ever accessed atomically at this offset.
        unsafe { &*at.cast::<AtomicU64>() }
    }

    /// The `u32` at `offset`, as an atomic; as [`Mapping::u64_at`].
    pub(crate) fn u32_at(&self, offset: usize) -> &AtomicU32 {
        assert!(offset.is_multiple_of(4) && self.in_range(offset, 4), "u32 outside the mapping");
        // SAFETY: in range (checked above), so the pointer stays in the mapping.
        let at = unsafe { self.ptr.as_ptr().add(offset) };
        // SAFETY: as in `u64_at`.
        unsafe { &*at.cast::<AtomicU32>() }
    }

    /// Copies `src` in at `offset`; `false` (and nothing written) if out of range.
    pub(crate) fn write(&self, offset: usize, src: &[u8]) -> bool {
        if !self.in_range(offset, src.len()) {
            return false;
        }
        // SAFETY: in range (checked), so the pointer stays in the mapping.
        let to = unsafe { self.ptr.as_ptr().add(offset) };
        // SAFETY: in range; `src` is our own memory, not the mapping; the bytes are the
        // caller's by the structure's protocol (another process writing them anyway can only
        // garble what is read, which every reader validates).
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), to, src.len()) };
        true
    }

    /// Copies bytes at `offset` out into `dst`; `false` (and `dst` untouched) if out of range.
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) -> bool {
        if !self.in_range(offset, dst.len()) {
            return false;
        }
        // SAFETY: in range (checked), so the pointer stays in the mapping.
        let from = unsafe { self.ptr.as_ptr().add(offset) };
        // SAFETY: in range; `dst` is our own memory. The bytes are copied, never referenced,
        // so a concurrent writer in another process can garble the copy but not our state.
        unsafe { core::ptr::copy_nonoverlapping(from, dst.as_mut_ptr(), dst.len()) };
        true
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; no reference into it outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len.max(1)) };
    }
}

/// Creates a FIFO at `path`, mode 0600 (an existing one is kept).
pub(crate) fn make_fifo(path: &Path) -> io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `c` is a NUL-terminated path; mkfifo(3) reads it only.
    let ret = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    if ret < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
    }
    Ok(())
}

/// Opens a FIFO without blocking: `read_side` opens it read-write (so it never sees EOF and
/// never blocks the writers' open), otherwise write-only (failing with `ENXIO` when nobody has
/// it open for reading: nobody to wake).
pub(crate) fn open_fifo(path: &Path, read_side: bool) -> io::Result<OwnedFd> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mode = if read_side { libc::O_RDWR } else { libc::O_WRONLY };
    // SAFETY: `c` is a NUL-terminated path; the result is checked.
    let fd = check(unsafe {
        libc::open(c.as_ptr(), mode | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOFOLLOW)
    })?;
    // SAFETY: `fd` was just returned by open(2) and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Writes one byte to a FIFO (a wake-up); a full FIFO already holds one, so errors are ignored.
///
/// A FIFO whose reader is gone (its process exited between its last sleep and now) answers
/// `EPIPE` and raises `SIGPIPE`, whose default action would kill this process: the signal is
/// blocked in this thread for the write, and the one the write raised is taken before it is
/// unblocked (one already pending from elsewhere is left alone).
pub(crate) fn poke(fd: RawFd) {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it below.
    let mut pipe: libc::sigset_t = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let mut pending: libc::sigset_t = unsafe { core::mem::zeroed() };
    // SAFETY: initialises a local set.
    unsafe { libc::sigemptyset(&raw mut pipe) };
    // SAFETY: adds a valid signal to the local set.
    unsafe { libc::sigaddset(&raw mut pipe, libc::SIGPIPE) };
    // SAFETY: changes this thread's mask; the old one is kept and restored below.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &raw const pipe, &raw mut old) };
    // SAFETY: fills a local set.
    unsafe { libc::sigpending(&raw mut pending) };
    // SAFETY: reads a local set.
    let already = unsafe { libc::sigismember(&raw const pending, libc::SIGPIPE) } == 1;
    let b = 1u8;
    // SAFETY: writes one byte from a live local.
    let n = unsafe { libc::write(fd, (&raw const b).cast(), 1) };
    if n < 0 && !already && io::Error::last_os_error().raw_os_error() == Some(libc::EPIPE) {
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: takes the pending SIGPIPE this write raised, without waiting.
        unsafe { libc::sigtimedwait(&raw const pipe, core::ptr::null_mut(), &raw const zero) };
    }
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &raw const old, core::ptr::null_mut()) };
}

/// Reads everything a non-blocking FIFO holds; whether it held anything.
pub(crate) fn drain(fd: RawFd) -> bool {
    let mut buf = [0u8; 64];
    let mut any = false;
    loop {
        // SAFETY: reads at most `buf.len()` bytes into the live local buffer.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        any |= n > 0;
        if n < buf.len() as isize {
            return any;
        }
    }
}

/// Whether process `pid` exists (a zombie counts: its descriptors are closed already, but its
/// pid is not free for reuse until it is reaped).
pub(crate) fn process_exists(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else { return false };
    if p <= 0 {
        return false;
    }
    // SAFETY: kill(2) with signal 0 only checks for existence and permission.
    let ret = unsafe { libc::kill(p, 0) };
    ret == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The effective user id of this process.
pub(crate) fn effective_uid() -> u32 {
    // SAFETY: geteuid(2) takes no argument and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn waking_a_reader_that_is_gone_does_not_kill_the_waker() {
        let path = std::env::temp_dir().join(format!("uroce-fifo-{}", std::process::id()));
        make_fifo(&path).unwrap();
        let reader = open_fifo(&path, true).unwrap();
        let writer = open_fifo(&path, false).unwrap();
        drop(reader);
        // EPIPE, and a SIGPIPE that would end this test process if it were delivered.
        poke(writer.as_raw_fd());
        poke(writer.as_raw_fd());
        std::fs::remove_file(&path).unwrap();
    }
}
