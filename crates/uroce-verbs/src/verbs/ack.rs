//! Acknowledged events: an object is not freed while a thread still holds an event about it.
//!
//! `ibv_get_cq_event(3)` and `ibv_get_async_event(3)`: every event returned must be
//! acknowledged (`ibv_ack_cq_events`, `ibv_ack_async_event`), and destroying a CQ, SRQ or QP
//! waits until all the events returned for it are, "to avoid races": a thread handling an
//! event reads the object the event names (UCX reads `element.qp->qp_num`), and must not find
//! it freed by another thread that destroyed it meanwhile. Events not yet returned when the
//! object goes are dropped instead (each getter looks the object up in `Objects`, which the
//! destroy leaves first). As in rdma-core, the acknowledgements are counted in the public
//! structure (`comp_events_completed`, `async_events_completed`, `events_completed`), the
//! events returned in this library's part of the object.

use super::*;

/// Signaled on every acknowledgement, for the destroys waiting for one.
static ACKED: (Mutex<()>, std::sync::Condvar) = (Mutex::new(()), std::sync::Condvar::new());

/// A counter of acknowledgements: a `u32` field of an object's public structure.
///
/// # Safety
///
/// `field` is such a field of a live object, accessed only atomically.
unsafe fn counter<'a>(field: *mut u32) -> &'a AtomicU32 {
    // SAFETY: the caller's contract.
    unsafe { AtomicU32::from_ptr(field) }
}

/// Counts `n` acknowledgements in `field` and wakes the destroys waiting for them.
///
/// # Safety
///
/// As for [`counter`].
pub(super) unsafe fn acknowledge(field: *mut u32, n: u32) {
    // SAFETY: the caller's contract.
    unsafe { counter(field) }.fetch_add(n, Ordering::AcqRel);
    let _g = lock(&ACKED.0);
    ACKED.1.notify_all();
}

/// Returns once `field` counts as many acknowledgements as `reported` counts events returned.
/// The object must already be out of `Objects`, so that `reported` no longer grows.
///
/// # Safety
///
/// As for [`counter`].
pub(super) unsafe fn await_acknowledgements(field: *mut u32, reported: &AtomicU32) {
    // SAFETY: the caller's contract.
    let acked = unsafe { counter(field) };
    let mut g = lock(&ACKED.0);
    // Counts that wrap: the events still unacknowledged are the difference, taken as signed so
    // that an application acknowledging more than it got is not waited for forever.
    let unacknowledged = || {
        let d = reported.load(Ordering::Acquire).wrapping_sub(acked.load(Ordering::Acquire));
        i32::from_ne_bytes(d.to_ne_bytes()) > 0
    };
    while unacknowledged() {
        let wait = ACKED.1.wait_timeout(g, Duration::from_millis(10));
        g = wait.map_or_else(|e| e.into_inner().0, |w| w.0);
    }
}
