//! Copies to and from application memory that survive the memory going away.
//!
//! Registration pins nothing here (a software device needs no DMA), so an application may
//! unmap — or `mprotect` — a buffer it registered, and a peer's READ, WRITE or atomic into it
//! must then fail as an access error, never kill the process (a NIC that pinned the pages
//! would still have them). Every access the device makes on a peer's behalf goes through
//! [`read_from`] and [`write_to`]:
//!
//! - **x86-64:** the copy is one `rep movsb` at a known address. A `SIGSEGV`/`SIGBUS` handler,
//!   installed once per process, looks at the faulting instruction: if it is that one, it
//!   resumes at a fix-up that returns failure (what the Linux kernel's exception tables do for
//!   `copy_from_user`); any other fault goes to the handler that was there before, or to the
//!   default action, exactly as if this handler did not exist. The cost is nothing unless a
//!   fault happens.
//! - **Elsewhere:** `process_vm_readv`/`process_vm_writev` on the process itself, which return
//!   `EFAULT` for memory that is not there (a system call per access).
//!
//! A program that installs its own `SIGSEGV` handler after the device opens and does not
//! chain to the previous one takes over faults in these copies too: they then crash as
//! before this module existed.

/// The memory an access reached is not mapped (or not with the access asked for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fault;

/// Copies `dst.len()` bytes from application memory at `src` into `dst`.
///
/// # Safety
///
/// `src..src + dst.len()` must be memory nothing else writes during the copy, or memory that
/// is not mapped at all (that is the fault this returns); it must not overlap `dst`.
pub(crate) unsafe fn read_from(src: *const u8, dst: &mut [u8]) -> Result<(), Fault> {
    // SAFETY: forwarded from the caller; `dst` is a live exclusive buffer.
    unsafe { imp::copy(dst.as_mut_ptr(), src, dst.len(), imp::Side::Source) }
}

/// Copies `src` into application memory at `dst`.
///
/// # Safety
///
/// `dst..dst + src.len()` must be memory nothing else accesses during the copy, or memory that
/// is not mapped (or not writable): that is the fault this returns. It must not overlap `src`.
pub(crate) unsafe fn write_to(dst: *mut u8, src: &[u8]) -> Result<(), Fault> {
    // SAFETY: forwarded from the caller; `src` is a live buffer.
    unsafe { imp::copy(dst, src.as_ptr(), src.len(), imp::Side::Destination) }
}

/// Whether `len` bytes at `addr` can be read now: one byte of every page they touch.
///
/// # Safety
///
/// As [`read_from`] for the range.
pub(crate) unsafe fn readable(addr: *const u8, len: usize) -> Result<(), Fault> {
    if len == 0 {
        return Ok(());
    }
    let start = addr as usize;
    let last = start.saturating_add(len - 1);
    let mut page = start & !(PAGE - 1);
    let mut byte = [0u8; 1];
    while page <= last {
        let at = page.max(start);
        // SAFETY: `at` is inside the caller's range (forwarded contract).
        unsafe { read_from(addr.wrapping_add(at - start), &mut byte)? };
        page = match page.checked_add(PAGE) {
            Some(p) => p,
            None => break,
        };
    }
    Ok(())
}

/// The smallest page size Linux uses: probing one byte per this many covers every page.
const PAGE: usize = 4096;

#[cfg(target_arch = "x86_64")]
mod imp {
    use core::ffi::{c_int, c_void};
    use std::sync::{Once, OnceLock};

    use super::Fault;

    /// Which of the two buffers is the application's (the x86-64 copy does not care).
    #[derive(Clone, Copy)]
    pub(super) enum Side {
        Source,
        Destination,
    }

    // The copy, and where a fault in it resumes. `rep movsb` moves RCX bytes from [RSI] to
    // [RDI] (the System V ABI guarantees the direction flag is clear on entry); a fault leaves
    // RIP at the instruction, and the handler moves it to the fix-up, which returns 1 to the
    // caller as if the copy had returned (nothing was pushed, so `ret` finds the return
    // address).
    core::arch::global_asm!(
        ".pushsection .text.uroce_guard,\"ax\",@progbits",
        ".p2align 4",
        ".globl uroce_guard_copy",
        ".hidden uroce_guard_copy",
        ".type uroce_guard_copy,@function",
        "uroce_guard_copy:",
        "    mov rcx, rdx",
        ".globl uroce_guard_copy_at",
        ".hidden uroce_guard_copy_at",
        "uroce_guard_copy_at:",
        "    rep movsb",
        "    xor eax, eax",
        "    ret",
        ".globl uroce_guard_fixup",
        ".hidden uroce_guard_fixup",
        "uroce_guard_fixup:",
        "    mov eax, 1",
        "    ret",
        ".size uroce_guard_copy, . - uroce_guard_copy",
        ".popsection",
    );

    unsafe extern "C" {
        fn uroce_guard_copy(dst: *mut u8, src: *const u8, len: usize) -> u32;
        static uroce_guard_copy_at: u8;
        static uroce_guard_fixup: u8;
    }

    /// The handlers found for `SIGSEGV` and `SIGBUS` when this one was installed.
    static PREVIOUS: [OnceLock<libc::sigaction>; 2] = [OnceLock::new(), OnceLock::new()];
    static INSTALL: Once = Once::new();

    fn copy_at() -> usize {
        (&raw const uroce_guard_copy_at) as usize
    }

    fn fixup() -> usize {
        (&raw const uroce_guard_fixup) as usize
    }

    /// # Safety
    ///
    /// Both ranges valid for the copy or unmapped (the module's contract), not overlapping.
    pub(super) unsafe fn copy(
        dst: *mut u8,
        src: *const u8,
        len: usize,
        _side: Side,
    ) -> Result<(), Fault> {
        if len == 0 {
            return Ok(());
        }
        install();
        // SAFETY: the caller's contract; a fault inside returns 1 through the handler.
        let faulted = unsafe { uroce_guard_copy(dst, src, len) };
        if faulted == 0 { Ok(()) } else { Err(Fault) }
    }

    /// Installs the fault handler once per process, remembering the handlers it stands in
    /// front of.
    fn install() {
        INSTALL.call_once(|| {
            for (k, sig) in [libc::SIGSEGV, libc::SIGBUS].into_iter().enumerate() {
                // SAFETY: all-zero is a valid `sigaction` (no handler, empty mask, no flags).
                let mut old: libc::sigaction = unsafe { core::mem::zeroed() };
                // SAFETY: queries the current disposition into a valid out-pointer.
                if unsafe { libc::sigaction(sig, core::ptr::null(), &raw mut old) } != 0 {
                    continue;
                }
                // Known before the handler can run, so a fault never finds it unset.
                let _ = PREVIOUS[k].set(old);
                // SAFETY: as above.
                let mut new: libc::sigaction = unsafe { core::mem::zeroed() };
                new.sa_sigaction = on_fault as *const () as usize;
                // SA_ONSTACK: a thread with an alternate signal stack (a stack overflow
                // detector's) keeps using it.
                new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                // SAFETY: `new` is fully initialised; the handler is async-signal-safe (it
                // reads and writes the interrupted context and calls sigaction(2)).
                unsafe { libc::sigaction(sig, &raw const new, core::ptr::null_mut()) };
            }
        });
    }

    /// The fault handler: resumes a faulting guarded copy at its fix-up, and passes every
    /// other fault on.
    extern "C" fn on_fault(sig: c_int, info: *mut libc::siginfo_t, uctx: *mut c_void) {
        let uc = uctx.cast::<libc::ucontext_t>();
        let rip = libc::REG_RIP as usize;
        // SAFETY: an SA_SIGINFO handler gets the interrupted thread's context, valid and ours
        // to change until the handler returns.
        let at = unsafe { (*uc).uc_mcontext.gregs[rip] };
        if usize::try_from(at).is_ok_and(|a| a == copy_at()) {
            // SAFETY: as above; resuming at the fix-up is what it is for.
            unsafe { (*uc).uc_mcontext.gregs[rip] = fixup() as i64 };
            return;
        }
        pass_on(sig, info, uctx);
    }

    /// Hands a fault that is not ours to the handler that was installed before, or restores
    /// the default action, so the faulting instruction runs again and the process ends as it
    /// would have without this handler (`SIG_IGN` counts as default: the kernel does the same
    /// for a fault it cannot deliver).
    fn pass_on(sig: c_int, info: *mut libc::siginfo_t, uctx: *mut c_void) {
        let k = usize::from(sig == libc::SIGBUS);
        let previous = PREVIOUS[k].get().copied();
        match previous {
            Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
                if p.sa_flags & libc::SA_SIGINFO != 0 {
                    type Action = extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void);
                    // SAFETY: with SA_SIGINFO, `sa_sigaction` holds a three-argument handler.
                    let f: Action = unsafe { core::mem::transmute(p.sa_sigaction) };
                    f(sig, info, uctx);
                } else {
                    type Handler = extern "C" fn(c_int);
                    // SAFETY: without SA_SIGINFO, `sa_sigaction` holds a one-argument handler.
                    let f: Handler = unsafe { core::mem::transmute(p.sa_sigaction) };
                    f(sig);
                }
            }
            _ => {
                // SAFETY: all-zero with SIG_DFL (0) is the default disposition.
                let dfl: libc::sigaction = unsafe { core::mem::zeroed() };
                // SAFETY: sigaction(2) is async-signal-safe; `dfl` is initialised.
                unsafe { libc::sigaction(sig, &raw const dfl, core::ptr::null_mut()) };
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    use super::Fault;

    /// Which of the two buffers is the application's: that one is the "remote" side of the
    /// cross-memory call, whose faults the kernel reports as `EFAULT`.
    #[derive(Clone, Copy)]
    pub(super) enum Side {
        Source,
        Destination,
    }

    /// # Safety
    ///
    /// Both ranges valid for the copy or unmapped (the module's contract), not overlapping.
    pub(super) unsafe fn copy(
        dst: *mut u8,
        src: *const u8,
        len: usize,
        side: Side,
    ) -> Result<(), Fault> {
        if len == 0 {
            return Ok(());
        }
        let local = libc::iovec {
            iov_base: if matches!(side, Side::Source) { dst.cast() } else { src.cast_mut().cast() },
            iov_len: len,
        };
        let remote = libc::iovec {
            iov_base: if matches!(side, Side::Source) { src.cast_mut().cast() } else { dst.cast() },
            iov_len: len,
        };
        // SAFETY: getpid(2) has no preconditions.
        let me = unsafe { libc::getpid() };
        let done = match side {
            // SAFETY: one valid local iovec and one remote one; the kernel checks the remote.
            Side::Source => unsafe { libc::process_vm_readv(me, &local, 1, &remote, 1, 0) },
            // SAFETY: as above.
            Side::Destination => unsafe { libc::process_vm_writev(me, &local, 1, &remote, 1, 0) },
        };
        if usize::try_from(done).is_ok_and(|d| d == len) { Ok(()) } else { Err(Fault) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh anonymous private page with protection `prot`, the test's to unmap.
    fn map_page(prot: libc::c_int) -> *mut u8 {
        // SAFETY: an anonymous private mapping of one page, checked below.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                PAGE,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p.cast()
    }

    /// A page mapped, then unmapped: copies from and to it fail, and the process lives on;
    /// mapped memory copies as usual.
    #[test]
    fn copies_from_and_to_an_unmapped_page_fail_instead_of_faulting() {
        let page = PAGE;
        let p = map_page(libc::PROT_READ | libc::PROT_WRITE);
        let mut out = [0u8; 16];
        // SAFETY: the page is mapped and private to this test.
        unsafe { write_to(p.wrapping_add(100), &[7; 16]) }.unwrap();
        // SAFETY: as above.
        unsafe { read_from(p.wrapping_add(100), &mut out) }.unwrap();
        assert_eq!(out, [7; 16]);
        // SAFETY: as above.
        unsafe { readable(p, page) }.unwrap();
        // Takes every access right away rather than unmapping: an unmapped address can be
        // handed at once to another test thread's mmap, which made this test fail at random.
        // SAFETY: the page is this test's own; nothing else refers to it.
        assert_eq!(unsafe { libc::mprotect(p.cast(), page, libc::PROT_NONE) }, 0);
        // SAFETY: the page cannot be accessed: exactly the fault these report.
        assert_eq!(unsafe { read_from(p, &mut out) }, Err(Fault));
        // SAFETY: as above.
        assert_eq!(unsafe { write_to(p, &[1; 16]) }, Err(Fault));
        // SAFETY: as above.
        assert_eq!(unsafe { readable(p.wrapping_add(5), 10) }, Err(Fault));
        // SAFETY: unmaps the page this test mapped; nothing refers to it after.
        assert_eq!(unsafe { libc::munmap(p.cast(), page) }, 0);
    }

    /// A write into a read-only page fails; the read of it works.
    #[test]
    fn a_write_into_a_read_only_page_fails() {
        let page = PAGE;
        let p = map_page(libc::PROT_READ);
        let mut out = [1u8; 8];
        // SAFETY: mapped readable; private to this test.
        unsafe { read_from(p, &mut out) }.unwrap();
        assert_eq!(out, [0; 8]);
        // SAFETY: mapped read-only: the fault this reports.
        assert_eq!(unsafe { write_to(p, &[1; 8]) }, Err(Fault));
        // SAFETY: unmaps the page this test mapped.
        assert_eq!(unsafe { libc::munmap(p.cast(), page) }, 0);
    }
}
