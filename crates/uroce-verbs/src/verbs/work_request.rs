//! Work requests read from C: send, receive and scatter/gather lists.

use super::*;

/// Reads a C receive work request list into engine work requests.
///
/// # Safety
///
/// `wr` is a valid list: each `sg_list` holds `num_sge` entries.
pub(super) unsafe fn read_recv_wr(wr: *const IbvRecvWr) -> Option<RecvWr> {
    // SAFETY: the caller's contract; a bitwise copy of the C structure.
    let IbvRecvWr { wr_id, sg_list: sg, num_sge: n, .. } = unsafe { wr.read() };
    // SAFETY: as above.
    let sg_list = unsafe { read_sges(sg, n) }?;
    Some(RecvWr { wr_id, sg_list })
}

/// Posts the C receive list `wr` one request at a time with `post`, which returns the errno
/// of a refusal; the first refused (or unreadable) request stops the list, and `bad_wr`
/// names it (`ibv_post_recv(3)`). Returns 0 or that errno.
///
/// # Safety
///
/// `wr` is a valid list (each `sg_list` holds `num_sge` entries); `bad_wr` is NULL or valid
/// for a write.
pub(super) unsafe fn post_recv_list(
    verb: &str,
    wr: *mut IbvRecvWr,
    bad_wr: *mut *mut IbvRecvWr,
    mut post: impl FnMut(RecvWr) -> Result<(), c_int>,
) -> c_int {
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: the caller passes a valid list.
        let posted = match unsafe { read_recv_wr(cur) } {
            Some(w) => post(w),
            None => Err(refuse(verb, "a bad scatter/gather list", libc::EINVAL)),
        };
        if let Err(e) = posted {
            // SAFETY: the caller passes room for the failed request's pointer.
            unsafe { write_bad(bad_wr, cur) };
            return e;
        }
        // SAFETY: a valid list node.
        cur = unsafe { (*cur).next };
    }
    0
}

/// Reads `n` scatter/gather elements (into an [`SgList`] for a work request: one or two
/// elements, the usual, take no allocation).
///
/// # Safety
///
/// `sg` holds `n` entries when `n > 0`.
pub(super) unsafe fn read_sges<C: FromIterator<Sge>>(sg: *const IbvSge, n: c_int) -> Option<C> {
    let n = usize::try_from(n).ok()?;
    if n > 0 && sg.is_null() {
        return None;
    }
    let read = |i: usize| {
        // SAFETY: the caller's array holds `n` entries.
        let e = unsafe { sg.wrapping_add(i).read() };
        Sge { addr: e.addr, length: e.length, lkey: LKey(e.lkey) }
    };
    Some((0..n).map(read).collect())
}

/// The errno for a work request the engine refused (ibv_post_send(3): `EINVAL` for an
/// invalid value, `ENOMEM` for a full queue).
pub(super) fn post_errno(e: PostError) -> c_int {
    match e {
        PostError::QueueFull => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

/// Stores the first failed work request where the caller asked (if it did).
///
/// # Safety
///
/// `bad` is NULL or valid for a write.
pub(super) unsafe fn write_bad<T>(bad: *mut *mut T, wr: *mut T) {
    if !bad.is_null() {
        // SAFETY: the caller's contract.
        unsafe { bad.write(wr) };
    }
}

/// Reads one C send work request into an engine work request.
///
/// # Safety
///
/// `wr` is a valid work request of a QP of type `qp_type`; inline data is read from the
/// addresses its scatter/gather list names.
pub(super) unsafe fn read_send_wr(wr: *const IbvSendWr, qp_type: QpType) -> Result<SendWr, c_int> {
    // SAFETY: the caller's contract; a bitwise copy of the C structure.
    let w = unsafe { wr.read() };
    let opcode = match w.opcode {
        IBV_WR_RDMA_WRITE => WrOpcode::RdmaWrite,
        IBV_WR_RDMA_WRITE_WITH_IMM => WrOpcode::RdmaWriteWithImm,
        IBV_WR_SEND => WrOpcode::Send,
        IBV_WR_SEND_WITH_IMM => WrOpcode::SendWithImm,
        IBV_WR_RDMA_READ => WrOpcode::RdmaRead,
        IBV_WR_ATOMIC_CMP_AND_SWP => WrOpcode::AtomicCmpAndSwp,
        IBV_WR_ATOMIC_FETCH_AND_ADD => WrOpcode::AtomicFetchAndAdd,
        IBV_WR_SEND_WITH_INV => WrOpcode::SendWithInv,
        IBV_WR_LOCAL_INV => WrOpcode::LocalInv,
        IBV_WR_BIND_MW => WrOpcode::BindMw,
        IBV_WR_ATOMIC_WRITE => WrOpcode::AtomicWrite,
        _ => return Err(libc::EINVAL),
    };
    // SAFETY: the caller's contract: `sg_list` holds `num_sge` entries.
    let sg_list = unsafe { read_sges::<SgList>(w.sg_list, w.num_sge) }.ok_or(libc::EINVAL)?;
    let mut out = SendWr::new(w.wr_id, opcode, sg_list);
    out.flags = send_flags(w.send_flags);
    if opcode.has_imm() {
        out.imm = Some(w.imm_data.to_ne_bytes());
    }
    // `invalidate_rkey` shares its place with `imm_data` (a host-order key).
    if matches!(opcode, WrOpcode::SendWithInv | WrOpcode::LocalInv) {
        out.invalidate_rkey = Some(RKey(w.imm_data));
    }
    if opcode == WrOpcode::BindMw {
        let b = w.bind_mw;
        // ibv_post_send(3): IBV_WR_BIND_MW binds a type 2 window (type 1: ibv_bind_mw).
        // SAFETY: the caller's contract: a live window of this library.
        if Mw::from_c(b.mw).is_none_or(|m| unsafe { (*m).ibv.mw_type } != IBV_MW_TYPE_2) {
            return Err(libc::EINVAL);
        }
        // SAFETY: as above; `bind_info.mr` NULL or a live region.
        let bind = unsafe { binding(b.mw, b.rkey, &b.bind_info) }.map_err(|e| e.0)?;
        out.bind = Some(Box::new(bind));
    }
    if opcode.is_atomic() {
        // SAFETY: an atomic opcode: the union holds `wr.atomic`.
        let a = unsafe { w.wr.atomic };
        out.remote = Some(RemoteAddr { addr: a.remote_addr, rkey: RKey(a.rkey) });
        out.compare_add = a.compare_add;
        out.swap = a.swap;
    } else if opcode.is_rdma() {
        // SAFETY: an RDMA opcode: the union holds `wr.rdma`.
        let r = unsafe { w.wr.rdma };
        out.remote = Some(RemoteAddr { addr: r.remote_addr, rkey: RKey(r.rkey) });
    }
    if qp_type == QpType::XrcIni {
        // The `qp_type.xrc.remote_srqn` union: the XRC SRQ at the target (IBA Annex A14).
        out.xrc_remote_srqn = w.qp_type;
    }
    if qp_type == QpType::Ud {
        // SAFETY: a UD QP: the union holds `wr.ud`.
        let u = unsafe { w.wr.ud };
        let ah = Ah::from_c(u.ah).ok_or(libc::EINVAL)?;
        // SAFETY: a live address handle of this library (the caller's contract).
        let handle = unsafe { (*ah).handle };
        out.ud = Some(UdDest {
            ah: handle,
            remote_qpn: Qpn::new(u.remote_qpn).ok_or(libc::EINVAL)?,
            remote_qkey: QKey(u.remote_qkey),
        });
    }
    if w.send_flags & IBV_SEND_INLINE != 0 {
        // SAFETY: the caller's contract: inline data is at the addresses the SGEs name.
        unsafe { inline_from_sges(&mut out) }?;
    }
    Ok(out)
}
