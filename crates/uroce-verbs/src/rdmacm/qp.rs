//! An id's QP: created with CQs and completion channels when the application gives none
//! (`rdma_create_qp`, `rdma_create_ep`), and moved through INIT, RTR and RTS with what the
//! connection agreed, as librdmacm does with the attributes the kernel's `rdma_init_qp_attr`
//! returns.

use core::ffi::c_int;
use core::ptr::null_mut;

use super::abi::*;
use super::{Errno, IdPriv, IdState, default_pd, devices, lock};
use crate::abi::consts::*;
use crate::abi::{IbvAhAttr, IbvGlobalRoute, IbvPd, IbvQpAttr, IbvQpCap, IbvQpInitAttr};
use crate::verbs;

/// The QP's local ACK timeout when the application sets none (`RDMA_OPTION_ID_ACK_TIMEOUT`):
/// 4.096 µs × 2^14 = 67 ms.
pub(crate) const DEFAULT_ACK_TIMEOUT: u8 = 14;
/// The RNR NAK timer a passive QP asks for: 12 = 0.64 ms (IBA table 45).
const MIN_RNR_TIMER: u8 = 12;
/// READ/atomic depth of a uroce QP (the device's `max_qp_rd_atom`).
pub(crate) const MAX_RD_ATOMIC: u8 = 16;

fn zero_attr() -> IbvQpAttr {
    // SAFETY: ibv_qp_attr is plain data; zero is its "nothing set" value.
    unsafe { core::mem::zeroed() }
}

/// The address vector to the id's peer.
pub(crate) fn ah_to(st: &IdState) -> IbvAhAttr {
    let dgid = st.remote.map_or(crate::abi::IbvGid { raw: [0; 16] }, |r| verbs::gid_of(r.ip()));
    IbvAhAttr {
        grh: IbvGlobalRoute {
            dgid,
            flow_label: 0,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: st.tos,
        },
        dlid: 0,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: 1,
    }
}

/// The attributes `rdma_init_qp_attr` gives for moving the id's QP to `state`.
pub(crate) fn attrs_for(
    id: &IdPriv,
    st: &IdState,
    state: c_int,
) -> Result<(IbvQpAttr, c_int), Errno> {
    let mut a = zero_attr();
    a.qp_state = state;
    let ud = id.qp_type() == IBV_QPT_UD;
    let uc = id.qp_type() == IBV_QPT_UC;
    match state {
        IBV_QPS_INIT => {
            a.pkey_index = 0;
            a.port_num = 1;
            if ud {
                a.qkey = RDMA_UDP_QKEY;
                Ok((a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
            } else {
                a.qp_access_flags = (IBV_ACCESS_LOCAL_WRITE
                    | IBV_ACCESS_REMOTE_WRITE
                    | IBV_ACCESS_REMOTE_READ
                    | IBV_ACCESS_REMOTE_ATOMIC)
                    .cast_unsigned();
                Ok((a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
            }
        }
        IBV_QPS_RTR if ud => Ok((a, IBV_QP_STATE)),
        IBV_QPS_RTR => {
            if st.remote_qpn == 0 {
                return Err(libc::EINVAL);
            }
            let dev = st.dev.ok_or(libc::EINVAL)?;
            let port_mtu = port_mtu(dev);
            let asked = st.request.as_ref().map_or(port_mtu, |r| c_int::from(r.path_mtu));
            a.path_mtu = port_mtu.min(asked).max(IBV_MTU_256);
            a.dest_qp_num = st.remote_qpn;
            a.rq_psn = st.remote_psn;
            a.ah_attr = ah_to(st);
            let mut mask =
                IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
            if !uc {
                a.max_dest_rd_atomic = st.depths.0;
                a.min_rnr_timer = MIN_RNR_TIMER;
                mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
            }
            Ok((a, mask))
        }
        IBV_QPS_RTS => {
            a.sq_psn = st.psn;
            if ud || uc {
                return Ok((a, IBV_QP_STATE | IBV_QP_SQ_PSN));
            }
            let asked = st.request.as_ref().map(|r| r.local_ack_timeout);
            a.timeout = st.ack_timeout.or(asked).unwrap_or(DEFAULT_ACK_TIMEOUT);
            a.retry_cnt = st.retry_count;
            a.rnr_retry = st.rnr_retry_count;
            a.max_rd_atomic = st.depths.1;
            Ok((
                a,
                IBV_QP_STATE
                    | IBV_QP_SQ_PSN
                    | IBV_QP_TIMEOUT
                    | IBV_QP_RETRY_CNT
                    | IBV_QP_RNR_RETRY
                    | IBV_QP_MAX_QP_RD_ATOMIC,
            ))
        }
        IBV_QPS_ERR => Ok((a, IBV_QP_STATE)),
        _ => Err(libc::EINVAL),
    }
}

/// The port's active MTU (`enum ibv_mtu`).
pub(crate) fn port_mtu(dev: usize) -> c_int {
    let mtu = devices()[dev].net.with(|s| s.engine().port_mtu());
    c_int::from(mtu.bytes().trailing_zeros().saturating_sub(7).min(5) as u8)
}

/// Moves the id's QP to `state`; 0 or an errno.
pub(crate) fn modify(id: &IdPriv, st: &IdState, state: c_int) -> Result<(), Errno> {
    let qp = id.qp();
    if qp.is_null() {
        return Ok(());
    }
    let (mut a, mask) = attrs_for(id, st, state)?;
    // SAFETY: the id's QP, created by this library.
    match unsafe { verbs::uroce_verbs_modify_qp(qp, &raw mut a, mask) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// Moves the id's QP to Error (a failed or ended connection; IBA 12.9.7: a QP leaves the
/// connection before the DREQ goes).
pub(crate) fn to_error(id: &IdPriv, st: &IdState) {
    let _ = modify(id, st, IBV_QPS_ERR);
}

/// `rdma_create_qp`: a QP on the id's device (CQs and channels made when `attr` names none),
/// brought to INIT, or for UD to RTS.
///
/// # Safety
///
/// `idp`'s `id` is the application's live id; `pd` is NULL or its PD; `attr` is valid.
pub(crate) unsafe fn create(
    idp: &IdPriv,
    pd: *mut IbvPd,
    attr: *mut IbvQpInitAttr,
) -> Result<(), Errno> {
    if attr.is_null() {
        return Err(libc::EINVAL);
    }
    let raw = idp.id_ptr();
    let dev = lock(&idp.st).dev.ok_or(libc::EINVAL)?;
    let ctx = devices()[dev].ctx;
    let pd = if pd.is_null() { default_pd(dev) } else { pd };
    if pd.is_null() {
        return Err(libc::ENOMEM);
    }
    // SAFETY: the caller's attributes; copied so the application's stay as given.
    let mut a = unsafe { attr.read() };
    let mut own = false;
    if a.send_cq.is_null() || a.recv_cq.is_null() {
        let (sch, scq, rch, rcq) = make_cqs(ctx, &a.cap)?;
        // SAFETY: the live id's C structure, updated under no other reference.
        let c = unsafe { &mut *raw };
        c.send_cq_channel = sch;
        c.send_cq = scq;
        c.recv_cq_channel = rch;
        c.recv_cq = rcq;
        if a.send_cq.is_null() {
            a.send_cq = scq;
        }
        if a.recv_cq.is_null() {
            a.recv_cq = rcq;
        }
        own = true;
    } else {
        // SAFETY: as above.
        let c = unsafe { &mut *raw };
        c.send_cq = a.send_cq;
        c.recv_cq = a.recv_cq;
    }
    if a.qp_type == 0 {
        // SAFETY: the live id.
        a.qp_type = unsafe { (*raw).qp_type };
    }
    // SAFETY: our PD and attributes made valid above.
    let qp = unsafe { verbs::uroce_verbs_create_qp(pd, &raw mut a) };
    if qp.is_null() {
        let e = super::last_errno();
        if own {
            // SAFETY: the CQs and channels just made.
            unsafe { destroy_cqs(raw) };
        }
        return Err(e);
    }
    // SAFETY: the QP just created.
    let qp_type = unsafe { (*qp).qp_type };
    // SAFETY: the live id's C structure, updated under no other reference.
    let c = unsafe { &mut *raw };
    c.qp = qp;
    c.pd = pd;
    c.qp_type = qp_type;
    if !a.srq.is_null() {
        c.srq = a.srq;
    }
    // SAFETY: the caller's attributes: the capabilities granted go back.
    unsafe { (*attr).cap = a.cap };
    let mut st = lock(&idp.st);
    st.own_cqs = own;
    let steps: &[c_int] = if a.qp_type == IBV_QPT_UD {
        &[IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS]
    } else {
        &[IBV_QPS_INIT]
    };
    for &s in steps {
        if let Err(e) = modify(idp, &st, s) {
            drop(st);
            // SAFETY: the live id and its QP.
            unsafe { destroy(idp) };
            return Err(e);
        }
    }
    Ok(())
}

type Cqs = (
    *mut crate::abi::IbvCompChannel,
    *mut crate::abi::IbvCq,
    *mut crate::abi::IbvCompChannel,
    *mut crate::abi::IbvCq,
);

fn make_cqs(ctx: *mut crate::abi::IbvContext, cap: &IbvQpCap) -> Result<Cqs, Errno> {
    let mk = |n: u32| -> Result<_, Errno> {
        // SAFETY: our context.
        let ch = unsafe { verbs::uroce_verbs_create_comp_channel(ctx) };
        if ch.is_null() {
            return Err(super::last_errno());
        }
        let cqe = c_int::try_from(n.max(1)).unwrap_or(c_int::MAX);
        // SAFETY: our context and the channel just made.
        let cq = unsafe { verbs::uroce_verbs_create_cq(ctx, cqe, null_mut(), ch, 0) };
        if cq.is_null() {
            let e = super::last_errno();
            // SAFETY: the channel just made, unused.
            unsafe { verbs::uroce_verbs_destroy_comp_channel(ch) };
            return Err(e);
        }
        Ok((ch, cq))
    };
    let (sch, scq) = mk(cap.max_send_wr)?;
    match mk(cap.max_recv_wr) {
        Ok((rch, rcq)) => Ok((sch, scq, rch, rcq)),
        Err(e) => {
            // SAFETY: the CQ just made.
            unsafe { verbs::uroce_verbs_destroy_cq(scq) };
            // SAFETY: its channel, unused now.
            unsafe { verbs::uroce_verbs_destroy_comp_channel(sch) };
            Err(e)
        }
    }
}

/// Destroys the CQs and channels [`create`] made for the id.
///
/// # Safety
///
/// `raw` is a live id whose CQ fields, if set, hold this library's objects no QP uses.
unsafe fn destroy_cqs(raw: *mut RdmaCmId) {
    // SAFETY: the caller's contract: a live id, updated under no other reference.
    let c = unsafe { &mut *raw };
    for cq in [c.send_cq, c.recv_cq] {
        if !cq.is_null() {
            // SAFETY: this library's CQ, which no QP uses (the caller's contract).
            unsafe { verbs::uroce_verbs_destroy_cq(cq) };
        }
    }
    for ch in [c.send_cq_channel, c.recv_cq_channel] {
        if !ch.is_null() {
            // SAFETY: this library's channel, its CQ gone.
            unsafe { verbs::uroce_verbs_destroy_comp_channel(ch) };
        }
    }
    c.send_cq = null_mut();
    c.recv_cq = null_mut();
    c.send_cq_channel = null_mut();
    c.recv_cq_channel = null_mut();
}

/// `rdma_destroy_qp`: the QP, and the CQs made for it.
///
/// # Safety
///
/// `idp` is a live id.
pub(crate) unsafe fn destroy(idp: &IdPriv) {
    let raw = idp.id_ptr();
    // SAFETY: the live id's C structure, updated under no other reference.
    let c = unsafe { &mut *raw };
    if !c.qp.is_null() {
        // SAFETY: the id's QP, this library's.
        unsafe { verbs::uroce_verbs_destroy_qp(c.qp) };
        c.qp = null_mut();
    }
    let own = core::mem::take(&mut lock(&idp.st).own_cqs);
    if own {
        // SAFETY: the CQs this library made for the QP just destroyed.
        unsafe { destroy_cqs(raw) };
    }
}

/// The QP number of the id's QP, or `fallback` (the application's own QP, named in
/// `rdma_conn_param.qp_num`).
pub(crate) fn qp_num(idp: &IdPriv, fallback: u32) -> u32 {
    let qp = idp.qp();
    if qp.is_null() {
        fallback
    } else {
        // SAFETY: the id's QP, this library's.
        unsafe { (*qp).qp_num }
    }
}
