//! The `rdma_*` entry points, exported as `uroce_rdmacm_*` for `librdmacm.so.1` to forward
//! to. Each follows its rdma-core man page: 0 or -1 with `errno` (NULL with `errno` for
//! pointers).

use core::ffi::{c_char, c_int, c_void};
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use core::ptr::null_mut;
use std::sync::Arc;

use uroce_net::BindError;
use uroce_net::uroce_cm::{self, ConnectParams};
use uroce_wire::cm::{TransportType, reason, sidr_status};
use uroce_wire::cma;

use super::abi::*;
use super::events::{self, complete, event};
use super::qp::{self, MAX_RD_ATOMIC};
use super::{
    Chan, ChanInner, Errno, EventPriv, IdPriv, IdState, Item, Phase, addr, device_of_addr, devices,
    id_of, lock, routes,
};
use crate::abi::consts::*;
use crate::abi::{IbvContext, IbvPd, IbvQpAttr, IbvQpInitAttr, IbvSrq, IbvSrqInitAttr};
use crate::verbs::{self, set_errno};

fn err(e: Errno) -> c_int {
    set_errno(e);
    -1
}

fn done(r: Result<(), Errno>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => err(e),
    }
}

/// Makes a new id: on `chan` (the C channel and its queue), or synchronous with a private
/// channel when `None`.
pub(crate) fn new_id(
    chan: Option<(*mut RdmaEventChannel, Arc<ChanInner>)>,
    context: *mut c_void,
    ps: c_int,
    qp_type: c_int,
) -> Result<Arc<IdPriv>, Errno> {
    let (cptr, inner, sync) = match chan {
        Some((p, inner)) => (p, inner, None),
        None => {
            let inner = ChanInner::new().map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?;
            let fd = {
                use std::os::fd::AsRawFd;
                inner.fd.as_raw_fd()
            };
            let mut c = Box::new(Chan { c: RdmaEventChannel { fd }, inner: Arc::clone(&inner) });
            let p = &raw mut c.c;
            // Live until the id goes (`IdPriv`'s drop).
            lock(&LIVE_CHANNELS).insert(p as usize);
            (p, inner, Some(c))
        }
    };
    // SAFETY: the route structure is plain data; zero is "no address".
    let route: RdmaRoute = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let path: IbvSaPathRec = unsafe { core::mem::zeroed() };
    let path = core::cell::UnsafeCell::new(path);
    let idp = Arc::new(IdPriv {
        id: core::cell::UnsafeCell::new(RdmaCmId {
            verbs: null_mut(),
            channel: cptr,
            context,
            qp: null_mut(),
            route,
            ps,
            port_num: 0,
            event: null_mut(),
            send_cq_channel: null_mut(),
            send_cq: null_mut(),
            recv_cq_channel: null_mut(),
            recv_cq: null_mut(),
            srq: null_mut(),
            pd: null_mut(),
            qp_type,
        }),
        st: std::sync::Mutex::new(IdState {
            chan: Arc::clone(&inner),
            phase: Phase::Idle,
            dev: None,
            bindings: Vec::new(),
            local: None,
            remote: None,
            cid: None,
            sidr: None,
            request: None,
            // Each id draws its starting PSN when it is made, as the kernel's rdma_cm does
            // (`__rdma_create_id`): `rdma_init_qp_attr` then gives an application's own QP
            // the PSN the REQ or REP will carry, whichever comes first.
            psn: super::random_psn(),
            depths: (MAX_RD_ATOMIC, MAX_RD_ATOMIC),
            retry_count: 7,
            rnr_retry_count: 7,
            remote_qpn: 0,
            remote_psn: 0,
            tos: 0,
            ack_timeout: None,
            ep_qp_init: None,
            own_cqs: false,
            groups: Vec::new(),
            synchronous: sync.is_some(),
        }),
        sync,
        path,
        events_out: std::sync::Mutex::new(0),
        all_acked: std::sync::Condvar::new(),
    });
    routes(|r| {
        r.chans.insert(idp.addr(), inner);
        r.ids.insert(idp.addr(), Arc::clone(&idp));
    });
    Ok(idp)
}

/// Writes the id's addresses, device and GIDs into its C structure.
pub(crate) fn set_route(idp: &IdPriv, st: &IdState) {
    // SAFETY: the live id's C structure, updated under its state lock (`st`), as every
    // update of it is; the application reads it, and writes only its own fields
    // (`context`), between calls.
    let c = unsafe { &mut *idp.id_ptr() };
    if let Some(l) = st.local {
        c.route.addr.src = addr::storage(l);
        c.route.addr.ibaddr.sgid = verbs::gid_of(l.ip());
    }
    if let Some(r) = st.remote {
        c.route.addr.dst = addr::storage(r);
        c.route.addr.ibaddr.dgid = verbs::gid_of(r.ip());
    }
    c.route.addr.ibaddr.pkey = 0xFFFFu16.to_be();
    if let Some(d) = st.dev {
        c.verbs = devices()[d].ctx;
        c.port_num = 1;
        // librdmacm gives an id the device's PD as soon as the id has a device
        // (`ucma_get_device`); pyverbs, for one, wraps `id->pd` right after binding.
        if c.pd.is_null() {
            c.pd = super::default_pd(d);
        }
        if st.local.is_none_or(|l| l.ip().is_unspecified()) {
            c.route.addr.ibaddr.sgid = verbs::gid_of(devices()[d].addr);
        }
    }
}

fn qp_type_of(ps: c_int) -> c_int {
    if ps == ps::UDP || ps == ps::IPOIB { IBV_QPT_UD } else { IBV_QPT_RC }
}

fn bind_err(e: BindError) -> Errno {
    match e {
        BindError::InUse => libc::EADDRINUSE,
        BindError::Exhausted => libc::EADDRNOTAVAIL,
    }
}

fn port_space(idp: &IdPriv) -> u16 {
    u16::try_from(idp.ps()).unwrap_or(0)
}

/// Binds `a` for the id (a wildcard: the port on every device of the family).
fn bind(idp: &IdPriv, st: &mut IdState, a: SocketAddr) -> Result<(), Errno> {
    if !st.bindings.is_empty() {
        return Err(libc::EINVAL);
    }
    let space = port_space(idp);
    let devs = devices();
    if a.ip().is_unspecified() {
        let family: Vec<usize> =
            (0..devs.len()).filter(|&i| a.is_ipv6() || devs[i].addr.is_ipv4()).collect();
        let mut port = a.port();
        for &d in &family {
            let b = devs[d].net.bind_port(space, port, devs[d].addr).map_err(bind_err)?;
            port = b.port();
            st.bindings.push((d, b));
        }
        if st.bindings.is_empty() {
            return Err(libc::ENODEV);
        }
        st.local = Some(SocketAddr::new(a.ip(), port));
        return Ok(());
    }
    // A loopback address that is no device's binds to the first device of its family, as
    // Linux's rdma_cm binds a loopback address to a device (`cma_bind_loopback`): libfabric,
    // for one, binds "localhost" to find a passive endpoint's address.
    let loopback = a.ip().is_loopback() && device_of_addr(a.ip()).is_none();
    let d = if loopback {
        (0..devs.len()).find(|&i| devs[i].addr.is_ipv4() == a.is_ipv4()).ok_or(libc::ENODEV)?
    } else {
        device_of_addr(a.ip()).ok_or(libc::EADDRNOTAVAIL)?
    };
    let on = if loopback { devs[d].addr } else { a.ip() };
    let b = devs[d].net.bind_port(space, a.port(), on).map_err(bind_err)?;
    // The id's local address is then the device's (what `rdma_get_local_addr` reports and
    // a peer can reach): a RoCE device has no loopback address of its own.
    st.local = Some(SocketAddr::new(on, b.port()));
    st.bindings.push((d, b));
    st.dev = Some(d);
    Ok(())
}

fn sync_wait(idp: &IdPriv) -> Result<(), Errno> {
    if !lock(&idp.st).synchronous {
        return Ok(());
    }
    match &idp.sync {
        // SAFETY: the live synchronous id.
        Some(c) => unsafe { complete(idp, c) },
        None => Ok(()),
    }
}

fn push_ready(idp: &IdPriv, e: Box<EventPriv>) {
    lock(&idp.st).chan.push(Item::Ready(e));
}

macro_rules! id_or_einval {
    ($p:expr) => {
        // SAFETY: the application's id pointer (liveness is checked).
        match unsafe { id_of($p) } {
            Some(i) => i,
            None => return err(libc::EINVAL),
        }
    };
}

#[unsafe(no_mangle)]
extern "C" fn uroce_rdmacm_create_event_channel() -> *mut RdmaEventChannel {
    let Ok(inner) = ChanInner::new() else {
        set_errno(libc::EMFILE);
        return null_mut();
    };
    let fd = {
        use std::os::fd::AsRawFd;
        inner.fd.as_raw_fd()
    };
    let c = Box::into_raw(Box::new(Chan { c: RdmaEventChannel { fd }, inner }));
    lock(&LIVE_CHANNELS).insert(c as usize);
    // A new channel at a destroyed one's address is that channel no more.
    lock(&DESTROYED_CHANNELS).retain(|&d| d != c as usize);
    // SAFETY: the box just leaked; its first field is the C structure.
    unsafe { &raw mut (*c).c }
}

/// The event channels made and not destroyed. A call on any other channel pointer never
/// reads the memory it points to.
pub(crate) static LIVE_CHANNELS: std::sync::Mutex<std::collections::BTreeSet<usize>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// The most recently destroyed channels (at most [`DESTROYED_REMEMBERED`]).
///
/// An application thread may call `rdma_get_cm_event` on a channel another thread has just
/// destroyed: rping (rdma-core v44) does, when its event thread, having acknowledged the
/// last DISCONNECTED, loops back while its main thread tears down. Through librdmacm that
/// call is a `read(2)` of the channel's descriptor: begun before the `close`, it blocks until
/// the process exits; begun after, it fails with EBADF. The kernel's slower teardown makes
/// the first the usual outcome, and uroce's, much faster, made the second likely on a busy
/// machine (rping then exits with status 255: CI saw it once in ~10 runs). So a call on a
/// channel destroyed here waits, as the read that started first does.
static DESTROYED_CHANNELS: std::sync::Mutex<std::collections::VecDeque<usize>> =
    std::sync::Mutex::new(std::collections::VecDeque::new());

/// How many destroyed channels [`DESTROYED_CHANNELS`] remembers.
const DESTROYED_REMEMBERED: usize = 1024;

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_destroy_event_channel(channel: *mut RdmaEventChannel) {
    // Unknown once removed: a racing `rdma_get_cm_event` cannot reach the memory freed here.
    if lock(&LIVE_CHANNELS).remove(&(channel as usize)) {
        let mut destroyed = lock(&DESTROYED_CHANNELS);
        if destroyed.len() == DESTROYED_REMEMBERED {
            destroyed.pop_front();
        }
        destroyed.push_back(channel as usize);
        drop(destroyed);
        // SAFETY: a channel this library made (the first field of a leaked Chan), destroyed
        // once: it has just left the set of live ones.
        drop(unsafe { Box::from_raw(channel.cast::<Chan>()) });
    }
}

/// The queue behind a C channel: `None` for NULL, or for one not made here or destroyed.
///
/// # Safety
///
/// `p` is NULL or a channel `rdma_create_event_channel` returned.
unsafe fn chan_of(p: *mut RdmaEventChannel) -> Option<Arc<ChanInner>> {
    let live = lock(&LIVE_CHANNELS);
    // SAFETY: in the set, so the first field of a live Chan, which cannot be freed while the
    // set's lock is held.
    live.contains(&(p as usize)).then(|| Arc::clone(unsafe { &(*p.cast::<Chan>()).inner }))
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_create_id(
    channel: *mut RdmaEventChannel,
    id: *mut *mut RdmaCmId,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    if id.is_null() || ![ps::TCP, ps::UDP, ps::IB, ps::IPOIB].contains(&ps) {
        return err(libc::EINVAL);
    }
    // SAFETY: the application's channel.
    let chan = unsafe { chan_of(channel) }.map(|c| (channel, c));
    match new_id(chan, context, ps, qp_type_of(ps)) {
        Ok(held) => {
            // SAFETY: the caller's out-pointer.
            unsafe { *id = held.id_ptr() };
            0
        }
        Err(e) => err(e),
    }
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_destroy_id(id: *mut RdmaCmId) -> c_int {
    if verbs::debug() {
        eprintln!("uroce rdmacm: rdma_destroy_id({id:p})");
    }
    let held = id_or_einval!(id);
    let idp = &*held;
    let me = idp.addr();
    routes(|r| {
        r.chans.remove(&me);
        r.ids.remove(&me);
        r.by_cid.retain(|_, v| *v != me);
        r.by_sidr.retain(|_, v| *v != me);
        r.listeners.retain(|_, v| *v != me);
    });
    let (dev, cid, listening, bindings) = {
        let mut st = lock(&idp.st);
        (st.dev, st.cid.take(), st.phase == Phase::Listening, core::mem::take(&mut st.bindings))
    };
    if let (Some(dev), Some(cid)) = (dev, cid) {
        let state = devices()[dev].net.with(|s| {
            let (cm, now) = s.cm();
            let state = cm.state(cid);
            cm.destroy(now, cid);
            state
        });
        if verbs::debug() {
            eprintln!(
                "uroce rdmacm: id {me:#x} destroyed, its connection {cid:#010x} was {state:?}"
            );
        }
    }
    if listening {
        for (d, b) in &bindings {
            devices()[*d].net.with(|s| s.cm().0.unlisten(b.service_id()));
        }
    }
    drop(bindings);
    // SAFETY: the live id's field.
    let ev = unsafe { (*idp.id_ptr()).event };
    if !ev.is_null() {
        // SAFETY: the id's event is one this library made, freed once: nobody uses the id
        // again.
        drop(unsafe { Box::from_raw(ev.cast::<EventPriv>()) });
    }
    // Every event handed out on the id is acknowledged before it goes, as librdmacm waits: an
    // application's event thread that is still handling the id's last event (rping's, printing
    // its DISCONNECTED) is done with it, and back waiting on the channel, before the main
    // thread goes on to destroy the channel.
    let mut out = lock(&idp.events_out);
    while *out > 0 {
        out = idp.all_acked.wait(out).unwrap_or_else(std::sync::PoisonError::into_inner);
    }
    drop(out);
    // The last holder (this, or an event being processed in another thread) frees it.
    drop(held);
    0
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_bind_addr(id: *mut RdmaCmId, a: *mut libc::sockaddr) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    // SAFETY: the application's sockaddr.
    let Some(a) = (unsafe { addr::read(a) }) else { return err(libc::EAFNOSUPPORT) };
    let mut st = lock(&idp.st);
    let r = bind(idp, &mut st, a);
    set_route(idp, &st);
    done(r)
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_resolve_addr(
    id: *mut RdmaCmId,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    // SAFETY: the application's sockaddrs.
    let src = unsafe { addr::read(src) };
    // SAFETY: as above.
    let dst = unsafe { addr::read(dst) };
    let Some(dst) = dst else { return err(libc::EINVAL) };
    let r = (|| {
        let mut st = lock(&idp.st);
        if st.bindings.is_empty()
            && let Some(s) = src
            && !s.ip().is_unspecified()
        {
            bind(idp, &mut st, s)?;
        }
        let dev = match st.dev {
            Some(d) => d,
            None => addr::device_towards(dst.ip()).ok_or(libc::ENODEV)?,
        };
        if st.bindings.iter().all(|(d, _)| *d != dev) {
            let b = devices()[dev]
                .net
                .bind_port(port_space(idp), 0, devices()[dev].addr)
                .map_err(bind_err)?;
            st.bindings.push((dev, b));
        }
        let port = st.bindings.iter().find(|(d, _)| *d == dev).map_or(0, |(_, b)| b.port());
        st.dev = Some(dev);
        st.local = Some(SocketAddr::new(devices()[dev].addr, port));
        // The host's loopback address (127.0.0.1, ::1), when no device of this process has
        // it, is the device itself, as Linux's rdma_cm resolves a loopback destination
        // (`cma_resolve_loopback`: the destination GID is the source GID); a listener bound to
        // it listens on that device's address. Only that one address: uroce's devices
        // themselves live on other loopback addresses (127.0.0.2 and up), which are peers.
        let localhost = match dst.ip() {
            IpAddr::V4(a) => a == Ipv4Addr::LOCALHOST,
            IpAddr::V6(a) => a == Ipv6Addr::LOCALHOST,
        };
        let dst = if localhost && device_of_addr(dst.ip()).is_none() {
            SocketAddr::new(devices()[dev].addr, dst.port())
        } else {
            dst
        };
        st.remote = Some(dst);
        st.phase = Phase::AddrResolved;
        set_route(idp, &st);
        drop(st);
        push_ready(idp, event(idp.id_ptr(), event::ADDR_RESOLVED, 0));
        sync_wait(idp)
    })();
    done(r)
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_resolve_route(id: *mut RdmaCmId, _timeout_ms: c_int) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    let r = (|| {
        let mut st = lock(&idp.st);
        if st.phase != Phase::AddrResolved {
            return Err(libc::EINVAL);
        }
        let dev = st.dev.ok_or(libc::EINVAL)?;
        let raw = idp.id_ptr();
        let mtu = qp::port_mtu(dev);
        // SAFETY: the live id's C structure, updated under its state lock.
        let c = unsafe { &mut *raw };
        let rec = IbvSaPathRec {
            dgid: c.route.addr.ibaddr.dgid,
            sgid: c.route.addr.ibaddr.sgid,
            dlid: 0,
            slid: 0,
            raw_traffic: 0,
            flow_label: 0,
            hop_limit: 64,
            traffic_class: st.tos,
            reversible: 1,
            numb_path: 1,
            pkey: 0xFFFFu16.to_be(),
            sl: 0,
            mtu_selector: 2,
            mtu: u8::try_from(mtu).unwrap_or(5),
            rate_selector: 2,
            rate: 3,
            packet_life_time_selector: 2,
            packet_life_time: 14,
            preference: 0,
        };
        let path = idp.path.get();
        // SAFETY: the id's own path record, written under its state lock.
        unsafe { path.write(rec) };
        c.route.path_rec = path;
        c.route.num_paths = 1;
        st.phase = Phase::RouteResolved;
        drop(st);
        push_ready(idp, event(raw, event::ROUTE_RESOLVED, 0));
        sync_wait(idp)
    })();
    done(r)
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_create_qp(
    id: *mut RdmaCmId,
    pd: *mut IbvPd,
    attr: *mut IbvQpInitAttr,
) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    // SAFETY: the application's PD (or NULL) and attributes.
    done(unsafe { qp::create(idp, pd, attr) })
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_create_qp_ex(
    id: *mut RdmaCmId,
    attr: *mut IbvQpInitAttrExHead,
) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    if attr.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: the application's extended attributes.
    let ex = unsafe { &*attr };
    let pd = if ex.comp_mask & IBV_QP_INIT_ATTR_PD != 0 { ex.pd } else { null_mut() };
    let mut a = IbvQpInitAttr {
        qp_context: ex.qp_context,
        send_cq: ex.send_cq,
        recv_cq: ex.recv_cq,
        srq: ex.srq,
        cap: ex.cap,
        qp_type: ex.qp_type,
        sq_sig_all: ex.sq_sig_all,
    };
    // SAFETY: attributes built above.
    let r = unsafe { qp::create(idp, pd, &raw mut a) };
    if r.is_ok() {
        // SAFETY: the application's attributes: the capabilities granted go back.
        unsafe { (*attr).cap = a.cap };
    }
    done(r)
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_destroy_qp(id: *mut RdmaCmId) {
    // SAFETY: the application's id.
    if let Some(held) = unsafe { id_of(id) } {
        let idp = &*held;
        // SAFETY: the live id.
        unsafe { qp::destroy(idp) };
    }
}

/// The private data of a `rdma_conn_param`.
///
/// # Safety
///
/// `p` is NULL or a valid parameter block whose private data pointer covers its length.
unsafe fn private_of<'a>(p: *const RdmaConnParam) -> &'a [u8] {
    // SAFETY: the caller's contract.
    match unsafe { p.as_ref() } {
        Some(c) if !c.private_data.is_null() && c.private_data_len > 0 => {
            // SAFETY: as above.
            unsafe {
                core::slice::from_raw_parts(c.private_data.cast(), usize::from(c.private_data_len))
            }
        }
        _ => &[],
    }
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_connect(id: *mut RdmaCmId, param: *mut RdmaConnParam) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    // SAFETY: the application's parameters.
    let user = unsafe { private_of(param) };
    // SAFETY: as above.
    let param = unsafe { param.as_ref() }.copied();
    done(connect(idp, param.as_ref(), user))
}

fn connect(idp: &IdPriv, param: Option<&RdmaConnParam>, user: &[u8]) -> Result<(), Errno> {
    let mut st = lock(&idp.st);
    if st.phase != Phase::RouteResolved {
        return Err(libc::EINVAL);
    }
    let (dev, local, remote) = (
        st.dev.ok_or(libc::EINVAL)?,
        st.local.ok_or(libc::EINVAL)?,
        st.remote.ok_or(libc::EINVAL)?,
    );
    let hdr = cma::Header { src: local.ip(), dst: remote.ip(), src_port: local.port() };
    let mut private = vec![0u8; cma::HEADER_LEN];
    hdr.emit(&mut private).map_err(|_| libc::EAFNOSUPPORT)?;
    private.extend_from_slice(user);
    let space =
        cma::PortSpace::from_value(u32::try_from(idp.ps()).unwrap_or(0)).ok_or(libc::EINVAL)?;
    let service_id = space.service_id(remote.port());
    let me = idp.addr();
    let net = &devices()[dev].net;
    if idp.qp_type() == IBV_QPT_UD {
        if private.len() > uroce_wire::cm::private_len::SIDR_REQ {
            return Err(libc::EINVAL);
        }
        let sid = net.with(|s| {
            let (cm, now) = s.cm();
            let r = cm.sidr_request(now, remote.ip(), service_id, &private);
            if let Ok(sid) = r {
                routes(|rt| rt.by_sidr.insert((dev, sid), me));
            }
            r
        });
        st.sidr = Some(sid.map_err(|_| libc::ENOMEM)?);
    } else {
        if private.len() > uroce_wire::cm::private_len::REQ {
            return Err(libc::EINVAL);
        }
        if let Some(p) = param {
            st.depths =
                (p.responder_resources.min(MAX_RD_ATOMIC), p.initiator_depth.min(MAX_RD_ATOMIC));
            st.retry_count = p.retry_count & 7;
            st.rnr_retry_count = p.rnr_retry_count & 7;
        }
        let params = ConnectParams {
            remote: remote.ip(),
            local: local.ip(),
            service_id,
            qpn: uroce_wire::Qpn::from_masked(qp::qp_num(idp, param.map_or(0, |p| p.qp_num))),
            starting_psn: uroce_wire::Psn::from_masked(st.psn),
            transport: if idp.qp_type() == IBV_QPT_UC {
                TransportType::Uc
            } else {
                TransportType::Rc
            },
            responder_resources: st.depths.0,
            initiator_depth: st.depths.1,
            path_mtu: u8::try_from(qp::port_mtu(dev)).unwrap_or(5),
            retry_count: st.retry_count,
            rnr_retry_count: st.rnr_retry_count,
            // SAFETY: a field of the live id.
            srq: param.is_some_and(|p| p.srq != 0) || !unsafe { (*idp.id_ptr()).srq }.is_null(),
            local_ack_timeout: st.ack_timeout.unwrap_or(qp::DEFAULT_ACK_TIMEOUT),
            private_data: private,
        };
        let cid = net.with(|s| {
            let (cm, now) = s.cm();
            let r = cm.connect(now, &params);
            if let Ok(cid) = r {
                routes(|rt| rt.by_cid.insert((dev, cid), me));
            }
            r
        });
        st.cid = Some(cid.map_err(|e| match e {
            uroce_cm::Error::TooManyConnections => libc::ENOMEM,
            _ => libc::EINVAL,
        })?);
    }
    st.phase = Phase::Connecting;
    drop(st);
    sync_wait(idp)
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_establish(id: *mut RdmaCmId) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    let mut st = lock(&idp.st);
    let (Some(dev), Some(cid)) = (st.dev, st.cid) else { return err(libc::EINVAL) };
    if devices()[dev].net.with(|s| s.cm().0.ready(cid)).is_err() {
        return err(libc::EINVAL);
    }
    st.phase = Phase::Established;
    0
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_listen(id: *mut RdmaCmId, backlog: c_int) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    let mut st = lock(&idp.st);
    if st.bindings.is_empty() {
        // rdma_listen(3): an id not bound listens on every address, on a port of its own.
        let any = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0);
        if let Err(e) = bind(idp, &mut st, any) {
            return err(e);
        }
    }
    let backlog = usize::try_from(backlog).unwrap_or(0);
    let me = idp.addr();
    for (d, b) in &st.bindings {
        let service = b.service_id();
        let r = devices()[*d].net.with(|s| {
            let r = s.cm().0.listen(service, backlog);
            if r.is_ok() {
                routes(|rt| rt.listeners.insert((*d, service), me));
            }
            r
        });
        if r.is_err() {
            return err(libc::EADDRINUSE);
        }
        b.set_listening(true);
    }
    st.phase = Phase::Listening;
    set_route(idp, &st);
    0
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_get_request(
    listen: *mut RdmaCmId,
    id: *mut *mut RdmaCmId,
) -> c_int {
    let held = id_or_einval!(listen);
    let l = &*held;
    if id.is_null() {
        return err(libc::EINVAL);
    }
    let Some(sync) = l.sync.as_ref().filter(|_| lock(&l.st).synchronous) else {
        return err(libc::EINVAL);
    };
    let e = loop {
        match events::next(&sync.inner) {
            Ok(e) if e.ev.event == event::CONNECT_REQUEST => break e,
            Ok(_) => {}
            Err(e) => return err(e),
        }
    };
    let child = e.ev.id;
    // SAFETY: the child id the request made; its event slot is empty.
    unsafe { (*child).event = Box::into_raw(e).cast() };
    // SAFETY: the child id is live.
    let Some(child_held) = (unsafe { id_of(child) }) else { return err(libc::EINVAL) };
    let cp = &*child_held;
    let stored = lock(&l.st).ep_qp_init;
    if let Some((pd, mut attr)) = stored {
        // SAFETY: the application's PD (or NULL) and a copy of its attributes.
        if let Err(e) = unsafe { qp::create(cp, pd as *mut IbvPd, &raw mut attr) } {
            // SAFETY: the child id is ours to refuse.
            unsafe { uroce_rdmacm_reject(child, core::ptr::null(), 0) };
            return err(e);
        }
    }
    // SAFETY: the caller's out-pointer.
    unsafe { *id = child };
    0
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_accept(id: *mut RdmaCmId, param: *mut RdmaConnParam) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    // SAFETY: the application's parameters.
    let user = unsafe { private_of(param) };
    // SAFETY: as above.
    let param = unsafe { param.as_ref() }.copied();
    if let Err(e) = events::accept(idp, param.as_ref(), user) {
        return err(e);
    }
    if idp.qp_type() == IBV_QPT_UD {
        return 0;
    }
    done(sync_wait(idp))
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_reject(
    id: *mut RdmaCmId,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    let private: &[u8] = if private_data.is_null() {
        &[]
    } else {
        // SAFETY: the application's private data of that length.
        unsafe { core::slice::from_raw_parts(private_data.cast(), usize::from(private_data_len)) }
    };
    let mut st = lock(&idp.st);
    let Some(dev) = st.dev else { return err(libc::EINVAL) };
    if st.phase != Phase::Requested {
        return err(libc::EINVAL);
    }
    let net = &devices()[dev].net;
    let r = if let Some(sid) = st.sidr.take() {
        net.with(|s| {
            s.cm().0.sidr_reply(
                sid,
                sidr_status::REJECTED,
                uroce_wire::Qpn::from_masked(0),
                uroce_wire::QKey(0),
                private,
            )
        })
    } else if let Some(cid) = st.cid.take() {
        routes(|r| r.by_cid.remove(&(dev, cid)));
        net.with(|s| {
            let (cm, now) = s.cm();
            cm.reject(now, cid, reason::CONSUMER_REJECT, private)
        })
    } else {
        return err(libc::EINVAL);
    };
    st.phase = Phase::Idle;
    if r.is_err() { err(libc::EINVAL) } else { 0 }
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_notify(id: *mut RdmaCmId, ev: c_int) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    let st = lock(&idp.st);
    if ev == IBV_EVENT_COMM_EST
        && let (Some(dev), Some(cid)) = (st.dev, st.cid)
    {
        let _ = devices()[dev].net.with(|s| s.cm().0.notify_established(cid));
    }
    0
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_disconnect(id: *mut RdmaCmId) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    let st = lock(&idp.st);
    qp::to_error(idp, &st);
    let (Some(dev), Some(cid)) = (st.dev, st.cid) else {
        // A UD id, or one never connected: nothing to release.
        return if st.phase == Phase::Established { 0 } else { err(libc::EINVAL) };
    };
    let r = devices()[dev].net.with(|s| {
        let (cm, now) = s.cm();
        cm.disconnect(now, cid)
    });
    match r {
        Ok(()) => 0,
        // Released already (the peer's DREQ answered, or TimeWait): as Linux, not an error
        // worth failing a program over.
        Err(uroce_cm::Error::InvalidState(..) | uroce_cm::Error::UnknownId(_))
            if st.phase == Phase::Disconnected =>
        {
            0
        }
        Err(_) => err(libc::EINVAL),
    }
}

fn group_of(a: *mut libc::sockaddr) -> Result<IpAddr, Errno> {
    // SAFETY: the application's sockaddr.
    let g = unsafe { addr::read(a) }.ok_or(libc::EINVAL)?.ip();
    if g.is_multicast() { Ok(g) } else { Err(libc::EINVAL) }
}

fn join(idp: &IdPriv, group: IpAddr, context: *mut c_void) -> Result<(), Errno> {
    let mut st = lock(&idp.st);
    if st.dev.is_none() {
        st.dev = addr::device_towards(group);
    }
    let dev = st.dev.ok_or(libc::ENODEV)?;
    let qp = idp.qp();
    let gid = verbs::gid_of(group);
    if !qp.is_null() {
        // SAFETY: the id's QP and a GID on the stack.
        let r = unsafe { verbs::uroce_verbs_attach_mcast(qp, &raw const gid, 0) };
        if r != 0 {
            return Err(r);
        }
    }
    st.groups.push(group);
    set_route(idp, &st);
    let _ = dev;
    let mut e = event(idp.id_ptr(), event::MULTICAST_JOIN, 0);
    let mut ah = qp::ah_to(&st);
    ah.grh.dgid = gid;
    e.ev.param.ud = RdmaUdParam {
        private_data: context,
        private_data_len: 0,
        ah_attr: ah,
        qp_num: 0xFF_FFFF,
        qkey: RDMA_UDP_QKEY,
    };
    drop(st);
    push_ready(idp, e);
    sync_wait(idp)
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_join_multicast(
    id: *mut RdmaCmId,
    a: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    done(group_of(a).and_then(|g| join(idp, g, context)))
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_join_multicast_ex(
    id: *mut RdmaCmId,
    attr: *mut RdmaCmJoinMcAttrEx,
    context: *mut c_void,
) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    // SAFETY: the application's attributes.
    let Some(a) = (unsafe { attr.as_ref() }) else { return err(libc::EINVAL) };
    if a.comp_mask & JOIN_MC_ATTR_ADDRESS == 0 {
        return err(libc::EINVAL);
    }
    done(group_of(a.addr).and_then(|g| join(idp, g, context)))
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_leave_multicast(
    id: *mut RdmaCmId,
    a: *mut libc::sockaddr,
) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    let g = match group_of(a) {
        Ok(g) => g,
        Err(e) => return err(e),
    };
    let mut st = lock(&idp.st);
    let Some(i) = st.groups.iter().position(|x| *x == g) else { return err(libc::EADDRNOTAVAIL) };
    st.groups.remove(i);
    let qp = idp.qp();
    if !qp.is_null() {
        let gid = verbs::gid_of(g);
        // SAFETY: the id's QP and a GID on the stack.
        unsafe { verbs::uroce_verbs_detach_mcast(qp, &raw const gid, 0) };
    }
    0
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_get_cm_event(
    channel: *mut RdmaEventChannel,
    ev: *mut *mut RdmaCmEvent,
) -> c_int {
    if channel.is_null() || ev.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: the application's channel.
    let Some(chan) = (unsafe { chan_of(channel) }) else {
        if lock(&DESTROYED_CHANNELS).contains(&(channel as usize)) {
            // As a read(2) begun before the close: no event will come, and the process
            // ends around this thread.
            loop {
                std::thread::park();
            }
        }
        return err(libc::EBADF);
    };
    match events::next(&chan) {
        Ok(mut e) => {
            e.hand_out();
            // SAFETY: the caller's out-pointer.
            unsafe { *ev = Box::into_raw(e).cast() };
            0
        }
        Err(e) => err(e),
    }
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_ack_cm_event(ev: *mut RdmaCmEvent) -> c_int {
    if ev.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: an event rdma_get_cm_event returned (the first field of a leaked EventPriv).
    drop(unsafe { Box::from_raw(ev.cast::<EventPriv>()) });
    0
}

fn port_of(idp: &IdPriv, local: bool) -> u16 {
    let st = lock(&idp.st);
    let a = if local { st.local } else { st.remote };
    a.map_or(0, |a| a.port().to_be())
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_get_src_port(id: *mut RdmaCmId) -> u16 {
    // SAFETY: the application's id.
    unsafe { id_of(id) }.map_or(0, |i| port_of(&i, true))
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_get_dst_port(id: *mut RdmaCmId) -> u16 {
    // SAFETY: the application's id.
    unsafe { id_of(id) }.map_or(0, |i| port_of(&i, false))
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_get_devices(num: *mut c_int) -> *mut *mut IbvContext {
    let devs = devices();
    // SAFETY: calloc(3) of one more pointer than there are devices: the list ends in NULL.
    let list = unsafe { libc::calloc(devs.len() + 1, size_of::<*mut IbvContext>()) }
        .cast::<*mut IbvContext>();
    if list.is_null() {
        set_errno(libc::ENOMEM);
        return null_mut();
    }
    // SAFETY: the allocation just made holds `devs.len() + 1` pointers.
    let slots = unsafe { core::slice::from_raw_parts_mut(list, devs.len()) };
    for (slot, d) in slots.iter_mut().zip(devs) {
        *slot = d.ctx;
    }
    if !num.is_null() {
        // SAFETY: the caller's out-pointer.
        unsafe { *num = c_int::try_from(devs.len()).unwrap_or(c_int::MAX) };
    }
    list
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_free_devices(list: *mut *mut IbvContext) {
    // SAFETY: a list rdma_get_devices allocated with calloc (or NULL).
    unsafe { libc::free(list.cast()) };
}

#[unsafe(no_mangle)]
extern "C" fn uroce_rdmacm_event_str(e: c_int) -> *const c_char {
    let s: &'static core::ffi::CStr = match e {
        event::ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        event::ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        event::ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        event::ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        event::CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        event::CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        event::CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        event::UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        event::REJECTED => c"RDMA_CM_EVENT_REJECTED",
        event::ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        event::DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        event::DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        event::MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        event::MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        event::ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        event::TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_set_option(
    id: *mut RdmaCmId,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    if optval.is_null() {
        return err(libc::EINVAL);
    }
    let byte = || {
        // SAFETY: the application's option value, at least one byte (checked by the caller).
        unsafe { *optval.cast::<u8>() }
    };
    let mut st = lock(&idp.st);
    match (level, optname) {
        (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) if optlen >= 1 => st.tos = byte(),
        (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) if optlen >= 1 => {
            st.ack_timeout = Some(byte() & 0x1F);
        }
        (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY)
            if optlen >= size_of::<c_int>() => {}
        // RoCE paths are not set from outside: the route is the IP route.
        (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {}
        (RDMA_OPTION_ID | RDMA_OPTION_IB, _) => return err(libc::EINVAL),
        _ => return err(libc::ENOSYS),
    }
    0
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_migrate_id(
    id: *mut RdmaCmId,
    channel: *mut RdmaEventChannel,
) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    // rdma_migrate_id(3): a NULL channel makes the id synchronous (on its private channel,
    // which an id made with a channel gets now).
    // SAFETY: the application's channel.
    let (to, cptr, synchronous) = match unsafe { chan_of(channel) } {
        Some(c) => (c, channel, false),
        None => match &idp.sync {
            Some(own) => (Arc::clone(&own.inner), core::ptr::from_ref(&own.c).cast_mut(), true),
            None => return err(libc::ENOSYS),
        },
    };
    let mut st = lock(&idp.st);
    let me = idp.addr();
    routes(|r| r.chans.insert(me, Arc::clone(&to)));
    st.chan.move_items_of(me, &to);
    st.chan = to;
    st.synchronous = synchronous;
    // SAFETY: the live id's field.
    unsafe { (*idp.id_ptr()).channel = cptr };
    0
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const RdmaAddrinfo,
    res: *mut *mut RdmaAddrinfo,
) -> c_int {
    if res.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: the application's strings and hints.
    match unsafe { addr::getaddrinfo(node, service, hints) } {
        Ok(r) => {
            // SAFETY: the caller's out-pointer.
            unsafe { *res = r };
            0
        }
        Err(e) => err(e),
    }
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_freeaddrinfo(res: *mut RdmaAddrinfo) {
    // SAFETY: a list rdma_getaddrinfo returned.
    unsafe { addr::freeaddrinfo(res) };
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_init_qp_attr(
    id: *mut RdmaCmId,
    attr: *mut IbvQpAttr,
    mask: *mut c_int,
) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    if attr.is_null() || mask.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: the application's attributes: the state it asks about.
    let state = unsafe { (*attr).qp_state };
    let st = lock(&idp.st);
    match qp::attrs_for(idp, &st, state) {
        Ok((a, m)) => {
            // SAFETY: the caller's out-pointer.
            unsafe { *attr = a };
            // SAFETY: as above.
            unsafe { *mask = m };
            0
        }
        Err(e) => err(e),
    }
}

#[unsafe(no_mangle)]
extern "C" fn uroce_rdmacm_ece_unsupported() -> c_int {
    err(libc::EOPNOTSUPP)
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_create_ep(
    id: *mut *mut RdmaCmId,
    res: *mut RdmaAddrinfo,
    pd: *mut IbvPd,
    qp_init_attr: *mut IbvQpInitAttr,
) -> c_int {
    // SAFETY: the application's addrinfo.
    let Some(ai) = (unsafe { res.as_ref() }) else { return err(libc::EINVAL) };
    if id.is_null() {
        return err(libc::EINVAL);
    }
    let space = if ai.ai_port_space == 0 { ps::TCP } else { ai.ai_port_space };
    let qp_type = if ai.ai_qp_type == 0 { qp_type_of(space) } else { ai.ai_qp_type };
    let held = match new_id(None, null_mut(), space, qp_type) {
        Ok(i) => i,
        Err(e) => return err(e),
    };
    let idp = &*held;
    let raw = idp.id_ptr();
    let r = (|| {
        if ai.ai_flags & RAI_PASSIVE != 0 {
            // SAFETY: the addrinfo's source address.
            let a = unsafe { addr::read(ai.ai_src_addr) }.ok_or(libc::EINVAL)?;
            let mut st = lock(&idp.st);
            bind(idp, &mut st, a)?;
            set_route(idp, &st);
            if !qp_init_attr.is_null() {
                // SAFETY: the application's attributes, copied for the ids to come.
                st.ep_qp_init = Some((pd as usize, unsafe { qp_init_attr.read() }));
            }
            return Ok(());
        }
        // SAFETY: our own entry point on the id just made, with the addrinfo's addresses.
        if unsafe { uroce_rdmacm_resolve_addr(raw, ai.ai_src_addr, ai.ai_dst_addr, 2000) } != 0 {
            return Err(super::last_errno());
        }
        // SAFETY: as above.
        if unsafe { uroce_rdmacm_resolve_route(raw, 2000) } != 0 {
            return Err(super::last_errno());
        }
        if !qp_init_attr.is_null() {
            // SAFETY: the application's PD and attributes.
            unsafe { qp::create(idp, pd, qp_init_attr) }?;
        }
        Ok(())
    })();
    match r {
        Ok(()) => {
            // SAFETY: the caller's out-pointer.
            unsafe { *id = raw };
            0
        }
        Err(e) => {
            // SAFETY: the id just made, not handed out.
            unsafe { uroce_rdmacm_destroy_id(raw) };
            err(e)
        }
    }
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_destroy_ep(id: *mut RdmaCmId) {
    // SAFETY: the application's id.
    if let Some(held) = unsafe { id_of(id) } {
        let idp = &*held;
        // SAFETY: the live id's field.
        if !unsafe { (*idp.id_ptr()).srq }.is_null() {
            // SAFETY: the live id.
            unsafe { uroce_rdmacm_destroy_srq(id) };
        }
        // SAFETY: the live id.
        unsafe { qp::destroy(idp) };
        // SAFETY: the live id, not used again.
        unsafe { uroce_rdmacm_destroy_id(id) };
    }
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_create_srq(
    id: *mut RdmaCmId,
    pd: *mut IbvPd,
    attr: *mut IbvSrqInitAttr,
) -> c_int {
    let held = id_or_einval!(id);
    let idp = &*held;
    let Some(dev) = lock(&idp.st).dev else { return err(libc::EINVAL) };
    let pd = if pd.is_null() { super::default_pd(dev) } else { pd };
    // SAFETY: our PD and the application's attributes.
    let srq: *mut IbvSrq = unsafe { verbs::uroce_verbs_create_srq(pd, attr) };
    if srq.is_null() {
        return -1;
    }
    // SAFETY: the live id's C structure, updated under no other reference.
    let c = unsafe { &mut *idp.id_ptr() };
    c.srq = srq;
    c.pd = pd;
    0
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_destroy_srq(id: *mut RdmaCmId) {
    // SAFETY: the application's id.
    if let Some(held) = unsafe { id_of(id) } {
        let idp = &*held;
        // SAFETY: the live id's C structure, updated under no other reference.
        let c = unsafe { &mut *idp.id_ptr() };
        if !c.srq.is_null() {
            // SAFETY: the id's SRQ, this library's.
            unsafe { verbs::uroce_verbs_destroy_srq(c.srq) };
            c.srq = null_mut();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rping's event thread can call `rdma_get_cm_event` on a channel its main thread has just
    /// destroyed: the call never reads the freed channel, and waits, as librdmacm's read of
    /// the descriptor begun before the close does (rping exited 255 when it failed instead).
    /// A pointer that was never a channel fails with EBADF.
    #[test]
    fn a_destroyed_channel_is_waited_on_not_read_and_an_unknown_one_refused() {
        let ch = uroce_rdmacm_create_event_channel();
        assert!(!ch.is_null());
        // SAFETY: the channel just made; destroyed once.
        unsafe { uroce_rdmacm_destroy_event_channel(ch) };
        let (tx, rx) = std::sync::mpsc::channel();
        let addr = ch as usize;
        std::thread::spawn(move || {
            let mut ev = null_mut();
            // SAFETY: a stale channel pointer, which the function only looks up.
            let rc = unsafe { uroce_rdmacm_get_cm_event(addr as *mut _, &raw mut ev) };
            let _ = tx.send(rc);
        });
        // Left waiting: the test process ends around it.
        let waited = rx.recv_timeout(std::time::Duration::from_millis(300));
        assert!(waited.is_err(), "returned {waited:?}");
        let mut never = RdmaEventChannel { fd: -1 };
        let mut ev = null_mut();
        // SAFETY: not a channel of this library: looked up, never read.
        let rc = unsafe { uroce_rdmacm_get_cm_event(&raw mut never, &raw mut ev) };
        let errno = std::io::Error::last_os_error().raw_os_error();
        assert_eq!((rc, errno), (-1, Some(libc::EBADF)));
        // A second destroy of the same pointer is ignored, not a double free.
        // SAFETY: the channel destroyed above, which the function only looks up.
        unsafe { uroce_rdmacm_destroy_event_channel(ch) };
    }

    /// rdma_destroy_id(3) returns only once every event handed out on the id is acknowledged
    /// (rping's main thread destroys its id while its event thread still prints the id's
    /// DISCONNECTED; without the wait it destroyed the channel too, and the event thread's next
    /// `rdma_get_cm_event` failed with EBADF, rping with status 255).
    #[test]
    fn destroying_an_id_waits_for_its_events_to_be_acknowledged() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let ch = uroce_rdmacm_create_event_channel();
        let mut id = null_mut();
        // SAFETY: a live channel and an out-pointer on the stack.
        let rc = unsafe { uroce_rdmacm_create_id(ch, &raw mut id, null_mut(), ps::TCP) };
        assert_eq!(rc, 0);
        let mut e = event(id, event::DISCONNECTED, 0);
        e.hand_out();
        let ev = Box::into_raw(e);
        let destroyed = Arc::new(AtomicBool::new(false));
        let (id_addr, ch_addr) = (id as usize, ch as usize);
        let done = Arc::clone(&destroyed);
        let destroyer = std::thread::spawn(move || {
            // SAFETY: the id made above, destroyed once.
            let rc = unsafe { uroce_rdmacm_destroy_id(id_addr as *mut RdmaCmId) };
            done.store(true, Ordering::SeqCst);
            // SAFETY: the channel made above, destroyed once.
            unsafe { uroce_rdmacm_destroy_event_channel(ch_addr as *mut RdmaEventChannel) };
            rc
        });
        #[expect(clippy::disallowed_methods, reason = "gives the destroyer time to return early")]
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!destroyed.load(Ordering::SeqCst), "rdma_destroy_id returned with an event out");
        // SAFETY: the event handed out above, acknowledged once.
        assert_eq!(unsafe { uroce_rdmacm_ack_cm_event(ev.cast()) }, 0);
        assert_eq!(destroyer.join().unwrap(), 0);
        assert!(destroyed.load(Ordering::SeqCst));
    }
}
