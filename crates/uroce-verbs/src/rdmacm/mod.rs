//! The RDMA connection manager (`<rdma/rdma_cma.h>`, rdma-core 44) on uroce's devices.
//!
//! It lives here, beside the verbs, because it needs the device: QP1 and the IB CM belong to
//! the device's port (`uroce_net`: every endpoint runs a `uroce_cm::Cm` behind the shared
//! QP1), and `rdma_cm_id.verbs`, `.qp` and `.pd` are this library's verbs objects. The
//! `librdmacm.so.1` that programs load (crate `uroce-rdmacm`) forwards each `rdma_*` call to
//! the `uroce_rdmacm_*` function of the same name exported here, as Linux's librdmacm hands
//! its calls to the kernel's `rdma_cm`.
//!
//! What runs where, as with Linux's librdmacm over `ucma`:
//! - the IB CM (REQ/REP/RTU/REJ/MRA/DREQ/DREP/SIDR, timers, retries) runs in the device's
//!   progress, and its events are routed by comm ID (or service ID, for requests) to the
//!   event channel of the `rdma_cm_id` they concern ([`Routes`]): queued and signalled, no more;
//! - `rdma_get_cm_event` turns an IB CM event into an `rdma_cm_event`, doing on the way what
//!   librdmacm does in user space: a REP moves the id's QP to RTR and RTS and sends the RTU
//!   (`RDMA_CM_EVENT_ESTABLISHED`), a request creates the new id;
//! - address and route resolution are local and immediate (RoCE has no SA): the device whose
//!   address the kernel's routing picks for the destination (or, on loopback, the first device
//!   of the family), with its events queued at once.
//!
//! Lock order: an id's state, then a device, then [`ROUTES`], then a channel's queue. The
//! device's CM sink takes only the last two. The table of [`devices`] is taken with any of
//! them held, and holds none of them but while it opens the devices (once per process).
//!
//! After `fork(2)`, the child's first use opens devices and routes of its own: those it
//! inherited are its parent's (the progress threads that ran them did not come along).

mod abi;
mod addr;
mod api;
mod events;
mod qp;

use core::ffi::c_int;
use core::net::{IpAddr, SocketAddr};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use uroce_net::uroce_cm::{self, CommId, RequestInfo};
use uroce_net::{EventFd, NetDevice, PortBinding};

use self::abi::*;
use crate::abi::{IbvContext, IbvPd, IbvQpInitAttr};

pub(crate) use crate::verbs::lock;

/// The calling thread's `errno`, as a verb this library called left it.
pub(crate) fn last_errno() -> Errno {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL)
}

/// A device as the RDMA CM uses it: one shared verbs context (`rdma_get_devices`,
/// `rdma_cm_id.verbs`) and its runtime.
pub(crate) struct CmDev {
    pub(crate) addr: IpAddr,
    pub(crate) ctx: *mut IbvContext,
    pub(crate) net: Arc<NetDevice>,
    /// The PD ids use when the application gives none (librdmacm's per-device PD).
    pub(crate) pd: Mutex<Option<usize>>,
}

// SAFETY: `ctx` is a context this library opened for the life of the process; it is only
// passed back to this library's verbs, which are thread-safe.
unsafe impl Send for CmDev {}
// SAFETY: as above.
unsafe impl Sync for CmDev {}

/// The process that opened the RDMA CM's devices (0: none yet).
static DEVICES_PID: AtomicU32 = AtomicU32::new(0);

/// The devices, opened on first use of the RDMA CM: one context each for the process. A child
/// of `fork(2)` opens its own on its first use, as it must open its own verbs contexts
/// ([`crate::verbs`]); what it inherited is left as it was (never used, never freed).
pub(crate) fn devices() -> &'static [CmDev] {
    static DEVS: Mutex<Option<&'static [CmDev]>> = Mutex::new(None);
    let me = std::process::id();
    let mut devs = lock(&DEVS);
    match *devs {
        Some(d) if DEVICES_PID.load(Ordering::Acquire) == me => d,
        _ => {
            let d: &'static [CmDev] = Box::leak(open_devices().into_boxed_slice());
            DEVICES_PID.store(me, Ordering::Release);
            *devs = Some(d);
            d
        }
    }
}

fn open_devices() -> Vec<CmDev> {
    {
        let mut n: c_int = 0;
        // SAFETY: our own verb; `n` is a valid out-pointer.
        let list = unsafe { crate::verbs::uroce_verbs_get_device_list(&raw mut n) };
        if list.is_null() {
            return Vec::new();
        }
        let mut out = Vec::new();
        // SAFETY: the list holds `n` device pointers.
        let list_devs =
            unsafe { core::slice::from_raw_parts(list, usize::try_from(n).unwrap_or(0)) };
        for &dev in list_devs {
            // SAFETY: a device of the list.
            let ctx = unsafe { crate::verbs::uroce_verbs_open_device(dev) };
            // SAFETY: a context just opened by this library, or NULL.
            let Some(c) = (unsafe { crate::verbs::ctx_of(ctx) }) else { continue };
            let net = Arc::clone(&c.net);
            let index = out.len();
            install_sink(&net, index);
            out.push(CmDev { addr: net.addr(), ctx, net, pd: Mutex::new(None) });
        }
        // SAFETY: the list this library returned above.
        unsafe { crate::verbs::uroce_verbs_free_device_list(list) };
        // SAFETY: atexit(3) with a function that lives as long as the process.
        unsafe { libc::atexit(release_at_exit) };
        out
    }
}

/// At exit, every connection still open is released as the kernel releases a process's
/// rdma_cm ids when it closes their file: a live connection gets its DREQ (or, answering one,
/// its DREP), a request not answered its REJ, so that no peer waits out its timeouts for a
/// process that is gone. (qperf's server, for one, exits without destroying its connection.)
///
/// The kernel's CM then goes on retrying those DREQs after the process is gone, and answers
/// a peer's retried DREQ whose DREP was lost; uroce's CM lives in the process. So the exit
/// sends every DREP it gave a release still in TimeWait once more, and waits (at most
/// [`EXIT_LINGER`]) until every DREQ of this process has its DREP and until a peer whose
/// DREQ it answered would have retried it (about 1.1 s after the last answer), answering
/// that retry: otherwise one MAD lost on the way leaves the peer waiting out all its DREQ
/// retries (15 × 1.1 s) for `RDMA_CM_EVENT_DISCONNECTED`.
extern "C" fn release_at_exit() {
    // A child of fork(2) inherits this handler, and its parent's ids: those are the parent's
    // to release. The child's own devices registered the handler again.
    static RELEASED_BY: AtomicU32 = AtomicU32::new(0);
    let me = std::process::id();
    if DEVICES_PID.load(Ordering::Acquire) != me || RELEASED_BY.swap(me, Ordering::AcqRel) == me {
        return;
    }
    let ids: Vec<Arc<IdPriv>> = routes(|r| r.ids.values().cloned().collect());
    for idp in ids {
        let (dev, cid) = {
            let st = lock(&idp.st);
            (st.dev, st.cid)
        };
        if let (Some(dev), Some(cid)) = (dev, cid) {
            devices()[dev].net.with(|s| {
                let (cm, now) = s.cm();
                cm.destroy(now, cid);
            });
        }
    }
    for d in devices() {
        d.net.with(|s| s.cm().0.repeat_dreps());
    }
    let releasing =
        || devices().iter().map(|d| d.net.with(|s| s.cm().0.releasing())).sum::<usize>();
    let answering = || {
        devices().iter().any(|d| {
            d.net.with(|s| {
                let (cm, now) = s.cm();
                cm.answering_until().is_some_and(|until| now < until)
            })
        })
    };
    #[expect(clippy::disallowed_methods, reason = "a bounded wait at exit reads the clock")]
    let deadline = std::time::Instant::now() + EXIT_LINGER;
    while releasing() > 0 || answering() {
        #[expect(clippy::disallowed_methods, reason = "a bounded wait at exit reads the clock")]
        if std::time::Instant::now() >= deadline {
            break;
        }
        // The progress thread retries the DREQs and answers the peers'; this only watches.
        #[expect(clippy::disallowed_methods, reason = "a bounded wait at exit")]
        std::thread::sleep(core::time::Duration::from_millis(5));
    }
}

/// How long an exiting process waits for the DREPs of its DREQs and for its peers' retries of
/// the DREQs it answered: a few CM retries (each after about 1.1 s, the response timeout the
/// CM sends, IBA 12.7.36).
const EXIT_LINGER: core::time::Duration = core::time::Duration::from_secs(4);

/// The device with address `addr`.
pub(crate) fn device_of_addr(addr: IpAddr) -> Option<usize> {
    devices().iter().position(|d| d.addr == addr)
}

/// Where the IB CM's events go: the id each comm ID, SIDR request or listened service belongs
/// to, per device, and each live id's channel.
#[derive(Default)]
pub(crate) struct Routes {
    pub(crate) by_cid: HashMap<(usize, CommId), usize>,
    pub(crate) by_sidr: HashMap<(usize, u32), usize>,
    pub(crate) listeners: HashMap<(usize, u64), usize>,
    pub(crate) chans: HashMap<usize, Arc<ChanInner>>,
    /// Every live id, by the address the application holds.
    pub(crate) ids: HashMap<usize, Arc<IdPriv>>,
}

/// The routes, and the process they belong to.
pub(crate) static ROUTES: Mutex<Option<(u32, Routes)>> = Mutex::new(None);

/// This process's routes. A child of `fork(2)` starts with none: its parent's ids, channels
/// and listeners name the parent's devices, and are forgotten, not dropped (dropping one would
/// act for the parent).
pub(crate) fn routes<R>(f: impl FnOnce(&mut Routes) -> R) -> R {
    let me = std::process::id();
    let mut g = lock(&ROUTES);
    if g.as_ref().is_some_and(|(pid, _)| *pid != me) {
        std::mem::forget(g.take());
    }
    f(&mut g.get_or_insert_with(|| (me, Routes::default())).1)
}

/// Sends device `dev`'s CM events to the channels of the ids they concern.
fn install_sink(net: &NetDevice, dev: usize) {
    net.with(|s| {
        s.set_cm_sink(Box::new(move |e: uroce_cm::Event| {
            use uroce_cm::Event as E;
            routes(|r| {
                let target = match &e {
                    E::Request { info, .. } => r.listeners.get(&(dev, info.service_id)),
                    E::SidrRequest { service_id, .. } => r.listeners.get(&(dev, *service_id)),
                    E::SidrReply { id, .. } | E::SidrTimeout { id } => r.by_sidr.get(&(dev, *id)),
                    E::Reply { id, .. }
                    | E::Established { id }
                    | E::Rejected { id, .. }
                    | E::Unreachable { id }
                    | E::DisconnectRequest { id, .. }
                    | E::Disconnected { id }
                    | E::TimewaitExit { id } => r.by_cid.get(&(dev, *id)),
                };
                if let Some(&id) = target
                    && let Some(chan) = r.chans.get(&id)
                {
                    chan.push(Item::Cm { id, dev, event: e });
                }
            });
        }));
    });
}

/// What waits in an event channel: an IB CM event for an id, or an event already made.
pub(crate) enum Item {
    Cm { id: usize, dev: usize, event: uroce_cm::Event },
    Ready(Box<EventPriv>),
}

/// The shared part of an event channel: its queue and the descriptor that is readable while
/// the queue is not empty.
pub(crate) struct ChanInner {
    queue: Mutex<VecDeque<Item>>,
    pub(crate) fd: EventFd,
}

impl ChanInner {
    pub(crate) fn new() -> std::io::Result<Arc<Self>> {
        Ok(Arc::new(Self { queue: Mutex::new(VecDeque::new()), fd: EventFd::new_blocking()? }))
    }

    /// Queues an item; the descriptor becomes readable.
    pub(crate) fn push(&self, item: Item) {
        let mut q = lock(&self.queue);
        if q.is_empty() {
            self.fd.signal();
        }
        q.push_back(item);
    }

    /// The oldest item; the descriptor stops being readable when none is left.
    pub(crate) fn pop(&self) -> Option<Item> {
        let mut q = lock(&self.queue);
        let item = q.pop_front();
        if q.is_empty() {
            self.fd.take();
        }
        item
    }

    /// Moves every item for `id` into `other` (`rdma_migrate_id`).
    pub(crate) fn move_items_of(&self, id: usize, other: &Self) {
        let mut q = lock(&self.queue);
        let (mine, rest): (VecDeque<Item>, VecDeque<Item>) =
            q.drain(..).partition(|i| item_id(i) == id);
        *q = rest;
        if q.is_empty() {
            self.fd.take();
        }
        drop(q);
        for i in mine {
            other.push(i);
        }
    }
}

fn item_id(i: &Item) -> usize {
    match i {
        Item::Cm { id, .. } => *id,
        Item::Ready(e) => e.ev.id as usize,
    }
}

/// `struct rdma_event_channel` and what stands behind it.
#[repr(C)]
pub(crate) struct Chan {
    pub(crate) c: RdmaEventChannel,
    pub(crate) inner: Arc<ChanInner>,
}

/// An event handed to the application, with the private data its parameters point into.
#[repr(C)]
pub(crate) struct EventPriv {
    pub(crate) ev: RdmaCmEvent,
    pub(crate) private: Vec<u8>,
    /// The id it was reported on, once handed out: acknowledging it (dropping it) tells that
    /// id one event fewer is out ([`IdPriv::events_out`]).
    pub(crate) reported_on: Option<Arc<IdPriv>>,
}

impl EventPriv {
    /// Counts the event as handed to the application, against the id it is reported on: a
    /// connection request's listener (librdmacm's `evt->id_priv`), any other event's own id.
    pub(crate) fn hand_out(&mut self) {
        let on = if self.ev.listen_id.is_null() { self.ev.id } else { self.ev.listen_id };
        // SAFETY: ids are looked up among the live ones.
        if let Some(id) = unsafe { id_of(on) } {
            *lock(&id.events_out) += 1;
            self.reported_on = Some(id);
        }
    }
}

impl Drop for EventPriv {
    fn drop(&mut self) {
        if let Some(id) = self.reported_on.take() {
            let mut out = lock(&id.events_out);
            *out = out.saturating_sub(1);
            id.all_acked.notify_all();
        }
    }
}

// SAFETY: the pointers name ids (used only through this library's checked lookups) and the
// event's own private data; an event moves between threads in a channel's queue, and only
// one thread holds it at a time.
unsafe impl Send for EventPriv {}

/// Where an id is in its life (rdma_cm's `enum rdma_cm_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Idle,
    AddrResolved,
    RouteResolved,
    Listening,
    /// Active: REQ (or SIDR_REQ) sent.
    Connecting,
    /// Passive: a request received, not answered yet.
    Requested,
    /// Passive: accepted (REP sent).
    Accepted,
    Established,
    Disconnected,
}

/// What the RDMA CM keeps of an id.
pub(crate) struct IdState {
    pub(crate) chan: Arc<ChanInner>,
    pub(crate) phase: Phase,
    pub(crate) dev: Option<usize>,
    /// Ports bound: one per device for a wildcard bind.
    pub(crate) bindings: Vec<(usize, PortBinding)>,
    pub(crate) local: Option<SocketAddr>,
    pub(crate) remote: Option<SocketAddr>,
    /// The IB CM connection (or, for UD, the SIDR request) on `dev`.
    pub(crate) cid: Option<CommId>,
    pub(crate) sidr: Option<u32>,
    /// Passive: what the request asked.
    pub(crate) request: Option<RequestInfo>,
    /// The QP's first PSN, once chosen.
    pub(crate) psn: u32,
    /// READ/atomic depths agreed: (responder resources, initiator depth).
    pub(crate) depths: (u8, u8),
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry_count: u8,
    /// The remote QP and its PSN (active: from the REP).
    pub(crate) remote_qpn: u32,
    pub(crate) remote_psn: u32,
    pub(crate) tos: u8,
    pub(crate) ack_timeout: Option<u8>,
    /// The application's `rdma_create_ep` QP attributes of a passive id, for the ids
    /// `rdma_get_request` returns.
    pub(crate) ep_qp_init: Option<(usize, IbvQpInitAttr)>,
    /// CQs and channels this library created for the id's QP (destroyed with it).
    pub(crate) own_cqs: bool,
    /// Multicast groups joined.
    pub(crate) groups: Vec<IpAddr>,
    /// The id's calls wait for their events (it was made without a channel, and not
    /// migrated to one since).
    pub(crate) synchronous: bool,
}

// SAFETY: the raw pointers in `ep_qp_init` are the application's objects, handed back to this
// library's verbs only; the state is behind the id's mutex.
unsafe impl Send for IdState {}

// SAFETY: the C structure is reached only through raw places (`IdPriv::id_ptr`), as the
// application reaches it from any thread; the rest is behind mutexes or immutable.
unsafe impl Send for IdPriv {}
// SAFETY: as above.
unsafe impl Sync for IdPriv {}

/// `struct rdma_cm_id` and what stands behind it; the C pointer is the address of the `Arc`'s
/// value (its first field is the C structure).
#[repr(C)]
pub(crate) struct IdPriv {
    /// The application reads and writes this (`id->context`, `id->qp`): only through raw
    /// places.
    pub(crate) id: core::cell::UnsafeCell<RdmaCmId>,
    pub(crate) st: Mutex<IdState>,
    /// The private channel of an id made without one (librdmacm's synchronous mode: calls
    /// wait for their event on it).
    pub(crate) sync: Option<Box<Chan>>,
    /// The path record `id.route.path_rec` points to once the route is resolved.
    pub(crate) path: core::cell::UnsafeCell<IbvSaPathRec>,
    /// Events reported on this id and handed to the application, not yet acknowledged
    /// (`rdma_ack_cm_event`): `rdma_destroy_id` waits for them (rdma_destroy_id(3): "users must
    /// ... ack all related events"; librdmacm's `ucma_free_id` blocks until they are).
    pub(crate) events_out: Mutex<u32>,
    pub(crate) all_acked: std::sync::Condvar,
}

impl Drop for IdPriv {
    fn drop(&mut self) {
        // A synchronous id's private channel leaves the live set before its memory goes.
        if let Some(c) = &self.sync {
            lock(&api::LIVE_CHANNELS).remove(&(core::ptr::from_ref(&c.c) as usize));
        }
    }
}

impl IdPriv {
    pub(crate) fn addr(&self) -> usize {
        core::ptr::from_ref(self) as usize
    }

    /// The `rdma_cm_id` the application holds.
    pub(crate) const fn id_ptr(&self) -> *mut RdmaCmId {
        self.id.get()
    }

    /// The id's QP (NULL before `rdma_create_qp`).
    pub(crate) fn qp(&self) -> *mut crate::abi::IbvQp {
        // SAFETY: a field of the live id, read as the application may be writing others.
        unsafe { (*self.id_ptr()).qp }
    }

    /// The id's QP type.
    pub(crate) fn qp_type(&self) -> c_int {
        // SAFETY: as above.
        unsafe { (*self.id_ptr()).qp_type }
    }

    /// The id's port space.
    pub(crate) fn ps(&self) -> c_int {
        // SAFETY: as above.
        unsafe { (*self.id_ptr()).ps }
    }
}

/// The id behind a pointer the application passes, if it is live: held, so that an
/// `rdma_destroy_id` in another thread frees it only when this use is over (librdmacm
/// likewise waits for the id's events in flight).
///
/// # Safety
///
/// None beyond the pointer being what the application holds: it is looked up, never
/// dereferenced, unless it names a live id.
pub(crate) unsafe fn id_of(p: *mut RdmaCmId) -> Option<Arc<IdPriv>> {
    if p.is_null() {
        return None;
    }
    routes(|r| r.ids.get(&(p as usize)).cloned())
}

/// The PD an id uses: the application's, or the device's own.
pub(crate) fn default_pd(dev: usize) -> *mut IbvPd {
    let d = &devices()[dev];
    let mut pd = lock(&d.pd);
    if let Some(p) = *pd {
        return p as *mut IbvPd;
    }
    // SAFETY: our context.
    let p = unsafe { crate::verbs::uroce_verbs_alloc_pd(d.ctx) };
    if !p.is_null() {
        *pd = Some(p as usize);
    }
    p
}

/// A random 24-bit PSN (IBA 9.7.2: the first PSN should be hard to predict).
pub(crate) fn random_psn() -> u32 {
    uroce_net::random_u32() & 0xFF_FFFF
}

/// How a call failed: an errno for the application.
pub(crate) type Errno = c_int;
