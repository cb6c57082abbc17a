//! The verbs: rdma-core's C entry points on the uroce engine and runtime, one file per object
//! kind (device, context, PD, MR, CQ, SRQ, QP, AH, asynchronous events).
//!
//! Every object handed to C is a `#[repr(C)]` box holding the public structure (`struct ibv_qp`
//! and so on) and, after it, this library's fields; [`CObject`] is the one way between the C
//! pointer and the box. Fields the C side may read concurrently (`qp->state`) are written
//! through raw places, never through a reference to the whole object.
//!
//! Failures follow each verb's man page: functions returning a pointer return NULL and set
//! `errno`; functions returning `int` return the errno value (or -1 with `errno` set, where
//! rdma-core does).
//!
//! # Safety of the exported functions
//!
//! Each exported function is a verb of `<infiniband/verbs.h>` and has that verb's contract, as
//! its rdma-core man page states it: every pointer argument is NULL or what the page names — an
//! object this library made and that is still live, or memory valid for the structure (and,
//! for arrays, the count) given. NULL is checked wherever the verb can fail. An object already
//! destroyed, or one another provider made, is undefined behaviour, as it is with rdma-core.
//!
//! # Panics
//!
//! No verb panics on what a caller passes: bad handles, sizes and attributes are errno values.
//! A panic would be a bug in this library, and it never unwinds into C: every verb is `extern
//! "C"` (never `"C-unwind"`), and a panic that reaches such a function aborts the process after
//! printing where it happened (the language's rule since Rust 1.81). Aborting is deliberate:
//! the engine's state may be half-updated at the panic, and a verb that then returned an
//! error would let the program go on with corrupted queues. `tests` below holds this.

use core::ffi::{c_char, c_int, c_uint, c_void};
use core::mem::{offset_of, size_of};
use core::net::{IpAddr, Ipv6Addr};
use core::ptr::{self, null_mut};
use core::time::Duration;
use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use uroce_engine::{
    Access, AddressVector, AhAttr, AhHandle, AsyncEvent, CqHandle, DEVICE_ATTR, DestroyError, LKey,
    Mtu, MwBind, MwHandle, MwType, PdHandle, PostError, Psn, QKey, QpAttr, QpCap, QpInitAttr,
    QpState, QpType, Qpn, RKey, RecvWr, RemoteAddr, RnrTimer, SendFlags, SendWr, SgList, Sge,
    SrqHandle, TmFlags, UdDest, WcOpcode, WorkCompletion, WrOpcode, XrcdHandle,
};
use uroce_net::{Channel, EventFd, NetDevice, OpenError, Options, RawRegion, SubscriberId};

use crate::abi::consts::*;
use crate::abi::*;

// ---------------------------------------------------------------------------------------------
// errno and small helpers

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: returns the calling thread's errno slot, valid for the thread's lifetime.
    let slot = unsafe { libc::__errno_location() };
    // SAFETY: as above: a valid, aligned, thread-local int.
    unsafe { *slot = e };
}

/// NULL with `errno`: the failure of a verb that returns a pointer.
fn fail<T>(e: c_int) -> *mut T {
    set_errno(e);
    null_mut()
}

/// Whether `UROCE_VERBS_DEBUG` (set and not `0`) asks for the reason of every refused verb on
/// stderr: the C API has only an errno to say what was wrong.
pub(crate) fn debug() -> bool {
    static DEBUG: OnceLock<bool> = OnceLock::new();
    *DEBUG
        .get_or_init(|| std::env::var("UROCE_VERBS_DEBUG").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// Says why `verb` was refused (with `UROCE_VERBS_DEBUG`) and returns `errno`.
fn refuse(verb: &str, why: impl core::fmt::Display, errno: c_int) -> c_int {
    if debug() {
        eprintln!("uroce: {verb}: {why}");
    }
    errno
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Copies `s` into a C string field, truncating and NUL-terminating.
fn c_string<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

/// The GID of an address: IPv6 as is, IPv4 as `::ffff:a.b.c.d` (RoCEv2, IBA A17.4.5.1).
pub(crate) fn gid_of(addr: IpAddr) -> IbvGid {
    let raw = match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    };
    IbvGid { raw }
}

/// The address of a GID: IPv4-mapped GIDs are IPv4 addresses.
fn addr_of_gid(gid: &IbvGid) -> IpAddr {
    let v6 = Ipv6Addr::from(gid.raw);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

mod ack;
mod ah;
mod async_event;
mod context;
mod cq;
mod cq_ex;
mod device;
mod dm;
mod handle;
mod import;
mod mr;
mod mw;
mod pd;
mod qp;
mod qp_ex;
mod srq;
mod tm;
mod work_request;
mod xrc;

use ack::*;
use ah::*;
pub(crate) use context::*;
pub(crate) use cq::*;
use cq_ex::*;
pub(crate) use device::*;
use dm::*;
pub(crate) use handle::*;
use mr::*;
use mw::*;
pub(crate) use pd::*;
pub(crate) use qp::*;
use qp_ex::*;
pub(crate) use srq::*;
use tm::*;
use work_request::*;
use xrc::*;

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;

    const CHILD: &str = "UROCE_TEST_PANIC_CHILD";

    /// What every verb is: an `extern "C"` function. Panics only in the child process below.
    extern "C" fn a_verb_with_a_bug() -> core::ffi::c_int {
        if std::env::var_os(CHILD).is_some() {
            panic!("a bug inside a verb");
        }
        0
    }

    #[test]
    fn panicking_verb_child() {
        // The child half of the test below; in the normal run it does nothing.
        let _ = core::hint::black_box(a_verb_with_a_bug)();
    }

    #[test]
    fn a_panic_in_a_verb_aborts_instead_of_unwinding_into_c() {
        let exe = std::env::current_exe().expect("the test binary");
        let out = Command::new(exe)
            .args(["verbs::tests::panicking_verb_child", "--exact", "--nocapture"])
            .env(CHILD, "1")
            .output()
            .expect("runs the child");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{stderr}");
        assert!(stderr.contains("a bug inside a verb"), "{stderr}");
        assert!(stderr.contains("panic in a function that cannot unwind"), "{stderr}");
    }

    #[test]
    fn no_verb_may_unwind() {
        // A `"C-unwind"` verb would let a panic cross into C; none is declared.
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        let mut stack = vec![std::path::PathBuf::from(dir)];
        while let Some(p) = stack.pop() {
            if p.is_dir() {
                stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            } else if p.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                let unwinding = concat!("extern \"C", "-unwind\"");
                assert!(!text.contains(unwinding), "{} declares one", p.display());
            }
        }
    }
}
