//! The extended QP's send API (`ibv_wr_post(3)`): work requests built one call at a time —
//! a builder (`ibv_wr_send`, `ibv_wr_rdma_write`, …) that takes `wr_id` and `wr_flags` from
//! `struct ibv_qp_ex`, then its setters (`ibv_wr_set_sge`, `ibv_wr_set_inline_data`,
//! `ibv_wr_set_ud_addr`, …) — between `ibv_wr_start` and `ibv_wr_complete`, which posts them
//! all or none, or `ibv_wr_abort`, which drops them.
//!
//! As the man page asks, the calls report nothing themselves: the first misuse (a setter
//! before any builder, an operation the QP type does not carry, a bad address handle) is
//! remembered and `ibv_wr_complete` returns it, posting nothing.

use super::*;

/// The operations `send_ops_flags` may ask for, per QP type (`ibv_wr_post(3)`, the table of
/// WR builders; IBA 9.8: UC carries SEND and RDMA WRITE, UD SEND only; SEND with invalidate
/// is RC's and XRC's, atomic write RC's). TSO is not offered.
fn supported_ops(qp_type: QpType) -> u64 {
    let sends = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
    let writes = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
    let windows = IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
    match qp_type {
        QpType::Ud => sends,
        QpType::Uc => sends | writes | windows,
        QpType::XrcTgt => 0,
        QpType::Rc => supported_ops(QpType::XrcIni) | IBV_QP_EX_WITH_ATOMIC_WRITE,
        QpType::XrcIni => {
            sends
                | writes
                | windows
                | IBV_QP_EX_WITH_SEND_WITH_INV
                | IBV_QP_EX_WITH_RDMA_READ
                | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
                | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
        }
    }
}

/// Checks `send_ops_flags` for a QP of `qp_type`: `Err(why)` names what it cannot carry.
pub(super) fn check_send_ops(qp_type: QpType, ops: u64) -> Result<(), String> {
    let unsupported = ops & !supported_ops(qp_type);
    if unsupported == 0 {
        return Ok(());
    }
    Err(format!(
        "send_ops_flags {unsupported:#x}: not for a {qp_type:?} QP on uroce (TSO is not \
         supported)"
    ))
}

/// The work requests built since `ibv_wr_start`.
#[derive(Default)]
pub(super) struct WrBatch {
    wrs: Vec<SendWr>,
    /// Per request: `IBV_SEND_INLINE` was in `wr_flags`.
    inline: Vec<bool>,
    /// The first misuse since `ibv_wr_start`: what `ibv_wr_complete` returns.
    error: Option<(c_int, String)>,
}

/// The `struct ibv_qp_ex` of a new QP: `qp`, and the `ibv_wr_*` functions.
pub(super) fn extended_qp(qp: IbvQp) -> IbvQpEx {
    IbvQpEx {
        qp_base: qp,
        comp_mask: 0,
        wr_id: 0,
        wr_flags: 0,
        wr_atomic_cmp_swp: Some(wr_atomic_cmp_swp),
        wr_atomic_fetch_add: Some(wr_atomic_fetch_add),
        wr_bind_mw: Some(wr_bind_mw),
        wr_local_inv: Some(wr_local_inv),
        wr_rdma_read: Some(wr_rdma_read),
        wr_rdma_write: Some(wr_rdma_write),
        wr_rdma_write_imm: Some(wr_rdma_write_imm),
        wr_send: Some(wr_send),
        wr_send_imm: Some(wr_send_imm),
        wr_send_inv: Some(wr_send_inv),
        wr_send_tso: Some(wr_send_tso),
        wr_set_ud_addr: Some(wr_set_ud_addr),
        wr_set_xrc_srqn: Some(wr_set_xrc_srqn),
        wr_set_inline_data: Some(wr_set_inline_data),
        wr_set_inline_data_list: Some(wr_set_inline_data_list),
        wr_set_sge: Some(wr_set_sge),
        wr_set_sge_list: Some(wr_set_sge_list),
        wr_start: Some(wr_start),
        wr_complete: Some(wr_complete),
        wr_abort: Some(wr_abort),
        wr_atomic_write: Some(wr_atomic_write),
    }
}

/// `ibv_qp_to_qp_ex(3)`: the extended QP of a QP created with
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`; NULL for any other (as rdma-core answers).
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_qp_to_qp_ex(qp: *mut IbvQp) -> *mut IbvQpEx {
    // SAFETY: the caller passes a QP it created.
    match unsafe { qp_parts(qp) } {
        Some((_, q)) if q.wr_api => qp.cast(),
        _ => null_mut(),
    }
}

/// Runs `f` on the batch of `qp`, with its type and the `wr_id`/`wr_flags` the caller set.
///
/// # Safety
///
/// `qp` is NULL or a live extended QP of this library.
unsafe fn with_batch(qp: *mut IbvQpEx, f: impl FnOnce(&mut WrBatch, QpType, u64, c_uint)) {
    // SAFETY: the caller's contract; an extended QP is a QP.
    let Some((_, q)) = (unsafe { qp_parts(qp.cast()) }) else { return };
    // SAFETY: as above; a plain field the application writes before a builder call.
    let wr_id = unsafe { (*qp).wr_id };
    // SAFETY: as above.
    let wr_flags = unsafe { (*qp).wr_flags };
    f(&mut lock(&q.batch), q.qp_type, wr_id, wr_flags);
}

impl WrBatch {
    /// Remembers the first misuse.
    fn misuse(&mut self, errno: c_int, why: impl Into<String>) {
        if self.error.is_none() {
            self.error = Some((errno, why.into()));
        }
    }

    /// Starts a work request, if the QP type carries `opcode`.
    fn build(
        &mut self,
        qp_type: QpType,
        wr_id: u64,
        wr_flags: c_uint,
        opcode: WrOpcode,
    ) -> Option<&mut SendWr> {
        if !qp_type.carries(opcode) {
            self.misuse(libc::EINVAL, format!("{opcode:?} on a {qp_type:?} QP"));
            return None;
        }
        let mut wr = SendWr::new(wr_id, opcode, SgList::new());
        wr.flags = send_flags(wr_flags);
        self.inline.push(wr_flags & IBV_SEND_INLINE != 0);
        self.wrs.push(wr);
        self.wrs.last_mut()
    }

    /// The request a setter completes.
    fn last(&mut self, setter: &str) -> Option<&mut SendWr> {
        if self.wrs.is_empty() {
            self.misuse(libc::EINVAL, format!("{setter} before any work-request builder"));
        }
        self.wrs.last_mut()
    }
}

/// `enum ibv_send_flags` as the engine's flags (IBV_SEND_INLINE aside).
pub(super) fn send_flags(flags: c_uint) -> SendFlags {
    let mut out = SendFlags::NONE;
    if flags & IBV_SEND_SIGNALED != 0 {
        out = out | SendFlags::SIGNALED;
    }
    if flags & IBV_SEND_SOLICITED != 0 {
        out = out | SendFlags::SOLICITED;
    }
    if flags & IBV_SEND_FENCE != 0 {
        out = out | SendFlags::FENCE;
    }
    out
}

unsafe extern "C" fn wr_start(qp: *mut IbvQpEx) {
    // SAFETY: the caller passes an extended QP it created.
    unsafe { with_batch(qp, |b, _, _, _| *b = WrBatch::default()) };
}

unsafe extern "C" fn wr_abort(qp: *mut IbvQpEx) {
    // SAFETY: the caller passes an extended QP it created.
    unsafe { with_batch(qp, |b, _, _, _| *b = WrBatch::default()) };
}

/// `ibv_wr_complete`: posts every request built since `ibv_wr_start`, or — on the first
/// misuse, or any request the queue would refuse — none, returning the errno.
unsafe extern "C" fn wr_complete(qp: *mut IbvQpEx) -> c_int {
    // SAFETY: the caller passes an extended QP it created.
    let Some((ctx, q)) = (unsafe { qp_parts(qp.cast()) }) else { return libc::EINVAL };
    let batch = core::mem::take(&mut *lock(&q.batch));
    if let Some((errno, why)) = batch.error {
        return refuse("ibv_wr_complete", why, errno);
    }
    let mut wrs = batch.wrs;
    for (wr, _) in wrs.iter_mut().zip(batch.inline).filter(|(_, inline)| *inline) {
        {
            // SAFETY: IBV_SEND_INLINE with an SGE: the data is read now (ibv_wr_post(3)
            // takes the buffers at the post, as ibv_post_send does).
            if let Err(e) = unsafe { inline_from_sges(wr) } {
                return refuse("ibv_wr_complete", "inline data at a NULL address", e);
            }
        }
    }
    match ctx.net.post_with(q.qpn, |s| s.engine().post_send_batch(q.qpn, wrs)) {
        Ok(()) => 0,
        Err((i, e)) => refuse(
            "ibv_wr_complete",
            format_args!("QP {:#x}, request {i}: {e}; nothing posted", q.qpn.get()),
            post_errno(e),
        ),
    }
}

unsafe extern "C" fn wr_send(qp: *mut IbvQpEx) {
    // SAFETY: the caller passes an extended QP it created.
    unsafe {
        with_batch(qp, |b, t, id, f| {
            b.build(t, id, f, WrOpcode::Send);
        });
    }
}

unsafe extern "C" fn wr_send_imm(qp: *mut IbvQpEx, imm: u32) {
    // SAFETY: the caller passes an extended QP it created.
    unsafe {
        with_batch(qp, |b, t, id, f| {
            // `__be32`: the wire bytes, in memory order.
            if let Some(wr) = b.build(t, id, f, WrOpcode::SendWithImm) {
                wr.imm = Some(imm.to_ne_bytes());
            }
        });
    }
}

/// A one-sided operation on `rkey`/`remote_addr`; `fill` sets the rest of the request.
///
/// # Safety
///
/// As [`with_batch`].
unsafe fn remote_op(
    qp: *mut IbvQpEx,
    opcode: WrOpcode,
    rkey: u32,
    addr: u64,
    fill: impl FnOnce(&mut SendWr),
) {
    // SAFETY: the caller's contract.
    unsafe {
        with_batch(qp, |b, t, id, f| {
            if let Some(wr) = b.build(t, id, f, opcode) {
                wr.remote = Some(RemoteAddr { addr, rkey: RKey(rkey) });
                fill(wr);
            }
        });
    }
}

unsafe extern "C" fn wr_rdma_write(qp: *mut IbvQpEx, rkey: u32, addr: u64) {
    // SAFETY: the caller passes an extended QP it created.
    unsafe { remote_op(qp, WrOpcode::RdmaWrite, rkey, addr, |_| ()) };
}

/// `imm` is `__be32`: the wire bytes, in memory order.
unsafe extern "C" fn wr_rdma_write_imm(qp: *mut IbvQpEx, rkey: u32, addr: u64, imm: u32) {
    let fill = |wr: &mut SendWr| wr.imm = Some(imm.to_ne_bytes());
    // SAFETY: the caller passes an extended QP it created.
    unsafe { remote_op(qp, WrOpcode::RdmaWriteWithImm, rkey, addr, fill) };
}

unsafe extern "C" fn wr_rdma_read(qp: *mut IbvQpEx, rkey: u32, addr: u64) {
    // SAFETY: the caller passes an extended QP it created.
    unsafe { remote_op(qp, WrOpcode::RdmaRead, rkey, addr, |_| ()) };
}

unsafe extern "C" fn wr_atomic_cmp_swp(qp: *mut IbvQpEx, rkey: u32, addr: u64, cmp: u64, swp: u64) {
    let fill = |wr: &mut SendWr| (wr.compare_add, wr.swap) = (cmp, swp);
    // SAFETY: the caller passes an extended QP it created.
    unsafe { remote_op(qp, WrOpcode::AtomicCmpAndSwp, rkey, addr, fill) };
}

unsafe extern "C" fn wr_atomic_fetch_add(qp: *mut IbvQpEx, rkey: u32, addr: u64, add: u64) {
    let fill = |wr: &mut SendWr| wr.compare_add = add;
    // SAFETY: the caller passes an extended QP it created.
    unsafe { remote_op(qp, WrOpcode::AtomicFetchAndAdd, rkey, addr, fill) };
}

/// A builder uroce does not offer (creation refuses its `send_ops_flags` bit): the batch fails.
///
/// # Safety
///
/// As [`with_batch`].
unsafe fn unsupported(qp: *mut IbvQpEx, builder: &'static str) {
    // SAFETY: the caller's contract.
    unsafe {
        with_batch(qp, |b, _, _, _| b.misuse(libc::EOPNOTSUPP, format!("{builder}: not supported")))
    };
}

/// `ibv_wr_bind_mw`: binds type 2 window `mw` under `rkey` (its new key; IBA 10.6.7.2).
unsafe extern "C" fn wr_bind_mw(
    qp: *mut IbvQpEx,
    mw: *mut IbvMw,
    rkey: u32,
    info: *const IbvMwBindInfo,
) {
    // SAFETY: NULL or the caller's bind information.
    let info = unsafe { info.as_ref() };
    // SAFETY: NULL or a live window of this library (the caller's contract).
    let type2 = Mw::from_c(mw).is_some_and(|m| unsafe { (*m).ibv.mw_type } == IBV_MW_TYPE_2);
    // SAFETY: as above; `info.mr` NULL or a live region.
    let bind = info.filter(|_| type2).map(|i| unsafe { binding(mw, rkey, i) });
    // SAFETY: the caller passes an extended QP it created.
    unsafe {
        with_batch(qp, |b, t, id, f| match bind {
            Some(Ok(bind)) => {
                if let Some(wr) = b.build(t, id, f, WrOpcode::BindMw) {
                    wr.bind = Some(Box::new(bind));
                }
            }
            Some(Err((errno, why))) => b.misuse(errno, format!("ibv_wr_bind_mw: {why}")),
            None => b.misuse(libc::EINVAL, "ibv_wr_bind_mw: a type 2 window and its binding"),
        });
    }
}

/// `ibv_wr_local_inv`: frees the type 2 window `rkey` names, in queue order.
unsafe extern "C" fn wr_local_inv(qp: *mut IbvQpEx, rkey: u32) {
    // SAFETY: the caller passes an extended QP it created.
    unsafe {
        with_batch(qp, |b, t, id, f| {
            if let Some(wr) = b.build(t, id, f, WrOpcode::LocalInv) {
                wr.invalidate_rkey = Some(RKey(rkey));
            }
        });
    }
}

/// `ibv_wr_send_inv`: a SEND that frees window `rkey` at the responder.
unsafe extern "C" fn wr_send_inv(qp: *mut IbvQpEx, rkey: u32) {
    // SAFETY: the caller passes an extended QP it created.
    unsafe {
        with_batch(qp, |b, t, id, f| {
            if let Some(wr) = b.build(t, id, f, WrOpcode::SendWithInv) {
                wr.invalidate_rkey = Some(RKey(rkey));
            }
        });
    }
}

unsafe extern "C" fn wr_send_tso(qp: *mut IbvQpEx, _: *mut c_void, _: u16, _: u16) {
    // SAFETY: the caller passes an extended QP it created.
    unsafe { unsupported(qp, "ibv_wr_send_tso") };
}

/// `ibv_wr_atomic_write(3)`: the 8 bytes at `atomic_wr` are taken now, as inline data.
unsafe extern "C" fn wr_atomic_write(qp: *mut IbvQpEx, rkey: u32, addr: u64, data: *const c_void) {
    let value = (!data.is_null()).then(|| {
        // SAFETY: ibv_wr_atomic_write(3): `atomic_wr` points at the 8 bytes to write.
        unsafe { data.cast::<[u8; 8]>().read_unaligned() }
    });
    // SAFETY: the caller passes an extended QP it created.
    unsafe {
        with_batch(qp, |b, t, id, f| {
            let Some(value) = value else {
                return b.misuse(libc::EINVAL, "ibv_wr_atomic_write: NULL data");
            };
            if let Some(wr) = b.build(t, id, f, WrOpcode::AtomicWrite) {
                wr.remote = Some(RemoteAddr { addr, rkey: RKey(rkey) });
                wr.inline_data = Some(value.to_vec());
            }
        });
    }
}

unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut IbvQpEx, remote_srqn: u32) {
    // SAFETY: the caller passes an extended QP it created.
    unsafe {
        with_batch(qp, |b, t, _, _| {
            if t != QpType::XrcIni {
                return b.misuse(libc::EINVAL, "ibv_wr_set_xrc_srqn on a QP that is not XRC");
            }
            if let Some(wr) = b.last("ibv_wr_set_xrc_srqn") {
                wr.xrc_remote_srqn = remote_srqn;
            }
        });
    }
}

unsafe extern "C" fn wr_set_ud_addr(qp: *mut IbvQpEx, ah: *mut IbvAh, qpn: u32, qkey: u32) {
    // SAFETY: NULL or a live address handle of this library (the caller's contract).
    let ah = Ah::from_c(ah).map(|a| unsafe { (*a).handle });
    // SAFETY: the caller passes an extended QP it created.
    unsafe {
        with_batch(qp, |b, t, _, _| {
            if t != QpType::Ud {
                return b.misuse(libc::EINVAL, "ibv_wr_set_ud_addr on a connected QP");
            }
            let Some(ah) = ah else {
                return b.misuse(libc::EINVAL, "ibv_wr_set_ud_addr: a NULL address handle");
            };
            let Some(remote_qpn) = Qpn::new(qpn) else {
                return b.misuse(libc::EINVAL, format!("ibv_wr_set_ud_addr: QPN {qpn:#x}"));
            };
            if let Some(wr) = b.last("ibv_wr_set_ud_addr") {
                wr.ud = Some(UdDest { ah, remote_qpn, remote_qkey: QKey(qkey) });
            }
        });
    }
}

unsafe extern "C" fn wr_set_sge(qp: *mut IbvQpEx, lkey: u32, addr: u64, length: u32) {
    // SAFETY: the caller passes an extended QP it created.
    unsafe {
        with_batch(qp, |b, _, _, _| {
            if let Some(wr) = b.last("ibv_wr_set_sge") {
                wr.sg_list = [Sge { addr, length, lkey: LKey(lkey) }].into();
            }
        });
    }
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut IbvQpEx, n: usize, list: *const IbvSge) {
    let n = c_int::try_from(n).unwrap_or(c_int::MAX);
    // SAFETY: the caller's list holds `n` entries.
    let sges = unsafe { read_sges(list, n) };
    // SAFETY: the caller passes an extended QP it created.
    unsafe {
        with_batch(qp, |b, _, _, _| {
            let Some(sges) = sges else {
                return b.misuse(libc::EINVAL, "ibv_wr_set_sge_list: a NULL list");
            };
            if let Some(wr) = b.last("ibv_wr_set_sge_list") {
                wr.sg_list = sges;
            }
        });
    }
}

/// Copies `len` bytes at `addr` (NULL allowed when `len` is 0).
///
/// # Safety
///
/// `addr` is valid for `len` bytes when `len > 0`.
unsafe fn copy_in(addr: *const c_void, len: usize, out: &mut Vec<u8>) -> bool {
    if len == 0 {
        return true;
    }
    if addr.is_null() {
        return false;
    }
    // SAFETY: the caller's contract.
    out.extend_from_slice(unsafe { core::slice::from_raw_parts(addr.cast::<u8>(), len) });
    true
}

/// `ibv_wr_set_inline_data`: the bytes are copied now, so the buffer is free at return.
unsafe extern "C" fn wr_set_inline_data(qp: *mut IbvQpEx, addr: *mut c_void, len: usize) {
    let mut data = Vec::with_capacity(len);
    // SAFETY: the application's buffer of `len` bytes (ibv_wr_post(3)).
    let ok = unsafe { copy_in(addr, len, &mut data) };
    // SAFETY: the caller passes an extended QP it created.
    unsafe { set_inline(qp, ok.then_some(data), "ibv_wr_set_inline_data") };
}

unsafe extern "C" fn wr_set_inline_data_list(qp: *mut IbvQpEx, n: usize, list: *const IbvDataBuf) {
    let mut data = Vec::new();
    let mut ok = n == 0 || !list.is_null();
    for i in 0..if ok { n } else { 0 } {
        // SAFETY: the caller's list holds `n` entries.
        let b = unsafe { list.wrapping_add(i).read() };
        // SAFETY: each entry names `length` bytes of the application's (ibv_wr_post(3)).
        ok &= unsafe { copy_in(b.addr, b.length, &mut data) };
    }
    // SAFETY: the caller passes an extended QP it created.
    unsafe { set_inline(qp, ok.then_some(data), "ibv_wr_set_inline_data_list") };
}

/// Makes the last request's payload `data` (`None`: a NULL address was passed).
///
/// # Safety
///
/// As [`with_batch`].
unsafe fn set_inline(qp: *mut IbvQpEx, data: Option<Vec<u8>>, setter: &'static str) {
    // SAFETY: the caller's contract.
    unsafe {
        with_batch(qp, |b, _, _, _| {
            let Some(data) = data else {
                return b.misuse(libc::EINVAL, format!("{setter}: a NULL address"));
            };
            if let Some(wr) = b.last(setter) {
                wr.sg_list.clear();
                wr.inline_data = Some(data);
            }
        });
    }
}

/// An `IBV_SEND_INLINE` request given an SGE: its bytes are taken at the post, and the lkeys
/// are not checked (ibv_post_send(3)).
///
/// # Safety
///
/// The SGEs name application memory valid for their lengths (the verbs contract for inline
/// sends).
pub(super) unsafe fn inline_from_sges(wr: &mut SendWr) -> Result<(), c_int> {
    if wr.inline_data.is_some() || wr.opcode.is_read_or_atomic() {
        return Ok(());
    }
    let mut data = Vec::new();
    for s in &wr.sg_list {
        // SAFETY: the caller's contract.
        if !unsafe { copy_in(s.addr as *const c_void, s.length as usize, &mut data) } {
            return Err(libc::EINVAL);
        }
    }
    wr.sg_list.clear();
    wr.inline_data = Some(data);
    Ok(())
}
