//! `rdma_get_cm_event`: IB CM events turned into RDMA CM events, with what librdmacm does on
//! the way (a request makes the new id; a REP brings the QP to RTS and sends the RTU).

use core::ffi::c_int;
use core::net::SocketAddr;
use core::ptr::null_mut;

use uroce_net::uroce_cm::{self, AcceptParams, Event as CmEvent};
use uroce_wire::cm::{reason, sidr_status};
use uroce_wire::cma;

use super::abi::*;
use super::qp::{self, MAX_RD_ATOMIC};
use super::{
    Chan, ChanInner, Errno, EventPriv, IdPriv, IdState, Item, Phase, devices, id_of, lock, routes,
};
use crate::abi::consts::*;

/// A new event for `id`, parameters zero.
pub(crate) fn event(id: *mut RdmaCmId, kind: c_int, status: c_int) -> Box<EventPriv> {
    Box::new(EventPriv {
        ev: RdmaCmEvent {
            id,
            listen_id: null_mut(),
            event: kind,
            status,
            // SAFETY: both views of the union are plain data; zero is "no parameters".
            param: unsafe { core::mem::zeroed() },
        },
        private: Vec::new(),
        reported_on: None,
    })
}

/// Sets a connection event's parameters, its private data copied into the event.
#[expect(clippy::too_many_arguments, reason = "the fields of rdma_conn_param")]
fn set_conn(
    e: &mut EventPriv,
    private: &[u8],
    responder_resources: u8,
    initiator_depth: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    srq: bool,
    qp_num: u32,
) {
    e.private = private.to_vec();
    e.ev.param.conn = RdmaConnParam {
        private_data: e.private.as_ptr().cast(),
        private_data_len: u8::try_from(e.private.len()).unwrap_or(u8::MAX),
        responder_resources,
        initiator_depth,
        flow_control: 1,
        retry_count,
        rnr_retry_count,
        srq: u8::from(srq),
        qp_num,
    };
}

/// Sets a UD event's parameters.
fn set_ud(e: &mut EventPriv, private: &[u8], st: &IdState, qp_num: u32, qkey: u32) {
    e.private = private.to_vec();
    e.ev.param.ud = RdmaUdParam {
        private_data: if e.private.is_empty() {
            core::ptr::null()
        } else {
            e.private.as_ptr().cast()
        },
        private_data_len: u8::try_from(e.private.len()).unwrap_or(u8::MAX),
        ah_attr: qp::ah_to(st),
        qp_num,
        qkey,
    };
}

/// The next event of `chan`, waiting for one unless its descriptor is non-blocking.
pub(crate) fn next(chan: &ChanInner) -> Result<Box<EventPriv>, Errno> {
    loop {
        match chan.pop() {
            Some(item) => {
                if let Some(e) = process(item) {
                    return Ok(e);
                }
            }
            None => {
                let fd = {
                    use std::os::fd::AsRawFd;
                    chan.fd.as_raw_fd()
                };
                if crate::verbs::nonblocking(fd) {
                    return Err(libc::EAGAIN);
                }
                let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
                // SAFETY: poll(2) on one valid pollfd.
                let r = unsafe { libc::poll(&raw mut p, 1, -1) };
                if r < 0 {
                    // A signal ends the wait with EINTR, as the read(2) of Linux's librdmacm.
                    return Err(std::io::Error::last_os_error()
                        .raw_os_error()
                        .unwrap_or(libc::EINTR));
                }
            }
        }
    }
}

/// Waits on a synchronous id's private channel for the event its last call caused, and keeps
/// it in `id->event` (acknowledging the one before); an error event is the call's failure.
///
/// # Safety
///
/// `idp` is a live synchronous id.
pub(crate) unsafe fn complete(idp: &IdPriv, sync: &Chan) -> Result<(), Errno> {
    let mut e = next(&sync.inner)?;
    e.hand_out();
    let status = e.ev.status;
    let kind = e.ev.event;
    let raw = idp.id_ptr();
    // SAFETY: the live synchronous id's C structure, which only its caller uses now.
    let c = unsafe { &mut *raw };
    if !c.event.is_null() {
        // SAFETY: the id's previous event, one this library made.
        drop(unsafe { Box::from_raw(c.event.cast::<EventPriv>()) });
    }
    c.event = Box::into_raw(e).cast();
    let failed = matches!(
        kind,
        event::ADDR_ERROR
            | event::ROUTE_ERROR
            | event::CONNECT_ERROR
            | event::UNREACHABLE
            | event::REJECTED
            | event::MULTICAST_ERROR
    );
    if status != 0 || failed {
        Err(if status < 0 {
            -status
        } else if kind == event::REJECTED {
            libc::ECONNREFUSED
        } else {
            libc::EIO
        })
    } else {
        Ok(())
    }
}

fn cm_call<R>(dev: usize, f: impl FnOnce(&mut uroce_cm::Cm, uroce_cm::Instant) -> R) -> R {
    devices()[dev].net.with(|s| {
        let (cm, now) = s.cm();
        f(cm, now)
    })
}

/// Turns a queued item into the application's event; `None` for what it need not see.
fn process(item: Item) -> Option<Box<EventPriv>> {
    let (id, dev, e) = match item {
        Item::Ready(e) => {
            // An event made for an id destroyed since is dropped with it.
            let live = routes(|r| r.chans.contains_key(&(e.ev.id as usize)));
            return live.then_some(e);
        }
        Item::Cm { id, dev, event } => (id, dev, event),
    };
    if crate::verbs::debug() {
        eprintln!("uroce rdmacm: id {id:#x} on device {dev}: {e:?}");
    }
    // SAFETY: ids are looked up among the live ones.
    let held = unsafe { id_of(id as *mut RdmaCmId) }?;
    let idp = &*held;
    let raw = idp.id_ptr();
    match e {
        CmEvent::Request { id: cid, info, .. } => request(idp, dev, cid, info),
        CmEvent::SidrRequest { id: sid, private_data, .. } => {
            sidr_request(idp, dev, sid, &private_data)
        }
        CmEvent::Reply { id: cid, info } => {
            let mut st = lock(&idp.st);
            st.remote_qpn = info.remote_qpn.get();
            st.remote_psn = info.starting_psn.get();
            st.depths =
                (st.depths.0.min(info.initiator_depth), st.depths.1.min(info.responder_resources));
            st.rnr_retry_count = info.rnr_retry_count;
            let (rr, ini) = st.depths;
            let mut ev = event(raw, event::ESTABLISHED, 0);
            set_conn(
                &mut ev,
                &info.private_data,
                rr,
                ini,
                st.retry_count,
                info.rnr_retry_count,
                info.srq,
                info.remote_qpn.get(),
            );
            if idp.qp().is_null() {
                // The application brings its own QP up, then calls rdma_establish.
                ev.ev.event = event::CONNECT_RESPONSE;
                return Some(ev);
            }
            let up =
                qp::modify(idp, &st, IBV_QPS_RTR).and_then(|()| qp::modify(idp, &st, IBV_QPS_RTS));
            if let Err(err) = up {
                let _ = cm_call(dev, |cm, now| cm.reject(now, cid, reason::NO_QP, &[]));
                qp::to_error(idp, &st);
                st.phase = Phase::Idle;
                return Some(event(raw, event::CONNECT_ERROR, -err));
            }
            if cm_call(dev, |cm, _| cm.ready(cid)).is_err() {
                return None;
            }
            st.phase = Phase::Established;
            Some(ev)
        }
        CmEvent::Established { .. } => {
            let mut st = lock(&idp.st);
            if st.phase != Phase::Accepted {
                return None;
            }
            st.phase = Phase::Established;
            Some(event(raw, event::ESTABLISHED, 0))
        }
        CmEvent::Rejected { id: cid, reason: why, private_data } => {
            let mut st = lock(&idp.st);
            qp::to_error(idp, &st);
            st.phase = Phase::Idle;
            st.cid = None;
            routes(|r| r.by_cid.remove(&(dev, cid)));
            let mut ev = event(raw, event::REJECTED, c_int::from(why));
            set_conn(&mut ev, &private_data, 0, 0, 0, 0, false, 0);
            Some(ev)
        }
        CmEvent::Unreachable { id: cid } => {
            let mut st = lock(&idp.st);
            qp::to_error(idp, &st);
            st.phase = Phase::Idle;
            st.cid = None;
            routes(|r| r.by_cid.remove(&(dev, cid)));
            Some(event(raw, event::UNREACHABLE, -libc::ETIMEDOUT))
        }
        CmEvent::DisconnectRequest { .. } => {
            let mut st = lock(&idp.st);
            st.phase = Phase::Disconnected;
            Some(event(raw, event::DISCONNECTED, 0))
        }
        CmEvent::Disconnected { .. } => {
            let mut st = lock(&idp.st);
            st.phase = Phase::Disconnected;
            Some(event(raw, event::DISCONNECTED, 0))
        }
        CmEvent::TimewaitExit { id: cid } => {
            routes(|r| r.by_cid.remove(&(dev, cid)));
            None
        }
        CmEvent::SidrReply { id: sid, status, qpn, qkey, private_data } => {
            let mut st = lock(&idp.st);
            st.sidr = None;
            routes(|r| r.by_sidr.remove(&(dev, sid)));
            if status != sidr_status::OK {
                st.phase = Phase::Idle;
                return Some(event(raw, event::UNREACHABLE, c_int::from(status)));
            }
            st.remote_qpn = qpn.get();
            st.phase = Phase::Established;
            let mut ev = event(raw, event::ESTABLISHED, 0);
            set_ud(&mut ev, &private_data, &st, qpn.get(), qkey.0);
            Some(ev)
        }
        CmEvent::SidrTimeout { id: sid } => {
            let mut st = lock(&idp.st);
            st.sidr = None;
            st.phase = Phase::Idle;
            routes(|r| r.by_sidr.remove(&(dev, sid)));
            Some(event(raw, event::UNREACHABLE, -libc::ETIMEDOUT))
        }
    }
}

/// A new id for a request to listener `l`, on `l`'s channel (or, for a synchronous listener,
/// synchronous itself).
fn child_of(
    l: &IdPriv,
    dev: usize,
    local: SocketAddr,
    remote: SocketAddr,
) -> Option<std::sync::Arc<IdPriv>> {
    let lst = lock(&l.st);
    let sync = lst.synchronous;
    // SAFETY: the live listener's C structure, read.
    let lc = unsafe { &*l.id_ptr() };
    let (ctx, ps, qp_type, cptr) = (lc.context, lc.ps, lc.qp_type, lc.channel);
    let chan = if sync { None } else { Some((cptr, std::sync::Arc::clone(&lst.chan))) };
    drop(lst);
    let child = super::api::new_id(chan, ctx, ps, qp_type).ok()?;
    {
        let mut st = lock(&child.st);
        st.dev = Some(dev);
        st.local = Some(local);
        st.remote = Some(remote);
        super::api::set_route(&child, &st);
    }
    Some(child)
}

fn request(
    l: &IdPriv,
    dev: usize,
    cid: uroce_cm::CommId,
    info: uroce_cm::RequestInfo,
) -> Option<Box<EventPriv>> {
    let Ok(hdr) = cma::Header::parse(&info.private_data) else {
        let _ = cm_call(dev, |cm, now| cm.reject(now, cid, reason::CONSUMER_REJECT, &[]));
        return None;
    };
    let port = lock(&l.st).local.map_or(0, |a| a.port());
    let child =
        child_of(l, dev, SocketAddr::new(hdr.dst, port), SocketAddr::new(hdr.src, hdr.src_port))?;
    {
        let mut st = lock(&child.st);
        st.cid = Some(cid);
        st.phase = Phase::Requested;
        st.remote_qpn = info.remote_qpn.get();
        st.remote_psn = info.starting_psn.get();
        st.depths =
            (info.initiator_depth.min(MAX_RD_ATOMIC), info.responder_resources.min(MAX_RD_ATOMIC));
        st.retry_count = info.retry_count;
        st.rnr_retry_count = info.rnr_retry_count;
        st.request = Some(info.clone());
    }
    routes(|r| r.by_cid.insert((dev, cid), child.addr()));
    let mut ev = event(child.id_ptr(), event::CONNECT_REQUEST, 0);
    ev.ev.listen_id = l.id_ptr();
    let private = info.private_data.get(cma::HEADER_LEN..).unwrap_or(&[]);
    set_conn(
        &mut ev,
        private,
        info.responder_resources,
        info.initiator_depth,
        info.retry_count,
        info.rnr_retry_count,
        info.srq,
        info.remote_qpn.get(),
    );
    Some(ev)
}

fn sidr_request(l: &IdPriv, dev: usize, sid: u32, private: &[u8]) -> Option<Box<EventPriv>> {
    let Ok(hdr) = cma::Header::parse(private) else {
        let _ = cm_call(dev, |cm, _| {
            cm.sidr_reply(
                sid,
                sidr_status::REJECTED,
                uroce_wire::Qpn::from_masked(0),
                uroce_wire::QKey(0),
                &[],
            )
        });
        return None;
    };
    let port = lock(&l.st).local.map_or(0, |a| a.port());
    let child =
        child_of(l, dev, SocketAddr::new(hdr.dst, port), SocketAddr::new(hdr.src, hdr.src_port))?;
    let st = {
        let mut st = lock(&child.st);
        st.sidr = Some(sid);
        st.phase = Phase::Requested;
        // SAFETY: the child was just made; it is ours.
        unsafe { (*child.id_ptr()).qp_type = IBV_QPT_UD };
        st
    };
    let mut ev = event(child.id_ptr(), event::CONNECT_REQUEST, 0);
    ev.ev.listen_id = l.id_ptr();
    set_ud(&mut ev, private.get(cma::HEADER_LEN..).unwrap_or(&[]), &st, 0, 0);
    drop(st);
    Some(ev)
}

/// `rdma_accept` of a request: RTR and RTS, then the REP (or, for UD, the SIDR_REP).
pub(crate) fn accept(
    idp: &IdPriv,
    param: Option<&RdmaConnParam>,
    private: &[u8],
) -> Result<(), Errno> {
    let mut st = lock(&idp.st);
    if st.phase != Phase::Requested {
        return Err(libc::EINVAL);
    }
    let dev = st.dev.ok_or(libc::EINVAL)?;
    if let Some(sid) = st.sidr {
        let qpn = qp::qp_num(idp, param.map_or(0, |p| p.qp_num));
        cm_call(dev, |cm, _| {
            cm.sidr_reply(
                sid,
                sidr_status::OK,
                uroce_wire::Qpn::from_masked(qpn),
                uroce_wire::QKey(RDMA_UDP_QKEY),
                private,
            )
        })
        .map_err(|_| libc::EINVAL)?;
        st.phase = Phase::Established;
        return Ok(());
    }
    let cid = st.cid.ok_or(libc::EINVAL)?;
    if let Some(p) = param {
        st.depths = (
            st.depths.0.min(p.responder_resources.min(MAX_RD_ATOMIC)),
            st.depths.1.min(p.initiator_depth.min(MAX_RD_ATOMIC)),
        );
    }
    qp::modify(idp, &st, IBV_QPS_RTR)?;
    qp::modify(idp, &st, IBV_QPS_RTS)?;
    let accept = AcceptParams {
        qpn: uroce_wire::Qpn::from_masked(qp::qp_num(idp, param.map_or(0, |p| p.qp_num))),
        starting_psn: uroce_wire::Psn::from_masked(st.psn),
        responder_resources: st.depths.0,
        initiator_depth: st.depths.1,
        rnr_retry_count: param.map_or(7, |p| p.rnr_retry_count & 7),
        srq: param.is_some_and(|p| p.srq != 0) || !unsafe_srq(idp).is_null(),
        private_data: private.to_vec(),
    };
    cm_call(dev, |cm, now| cm.accept(now, cid, &accept)).map_err(|_| libc::EINVAL)?;
    st.phase = Phase::Accepted;
    Ok(())
}

fn unsafe_srq(idp: &IdPriv) -> *mut crate::abi::IbvSrq {
    // SAFETY: a field of the live id.
    unsafe { (*idp.id_ptr()).srq }
}
