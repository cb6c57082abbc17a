//! Queue pairs: creation, state changes, queries, posting, multicast.

use super::*;

#[repr(C)]
pub(super) struct Qp {
    /// Every QP is a `struct ibv_qp_ex`; `ibv_qp_to_qp_ex` hands out the extension only for
    /// QPs created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
    pub(super) ibv: IbvQpEx,
    pub(super) inner: QpInner,
}

/// What this library keeps of a QP.
pub(super) struct QpInner {
    pub(super) qpn: Qpn,
    pub(super) qp_type: QpType,
    pub(super) sq_sig_all: bool,
    pub(super) cap: IbvQpCap,
    /// The attributes set so far, for `ibv_query_qp`.
    pub(super) attr: Mutex<IbvQpAttr>,
    /// Created for the `ibv_wr_*` API (`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`).
    pub(super) wr_api: bool,
    /// The requests built since `ibv_wr_start`; the lock is the API's per-QP critical section.
    pub(super) batch: Mutex<WrBatch>,
    /// Asynchronous events `ibv_get_async_event` returned for this QP: `ibv_destroy_qp` waits
    /// until as many are acknowledged (`ibv.qp_base.events_completed`; `ack`).
    pub(super) async_events_reported: AtomicU32,
}

/// The context of a QP and the QP.
///
/// # Safety
///
/// `qp` is NULL or a live QP of this library.
pub(super) unsafe fn qp_parts<'a>(qp: *mut IbvQp) -> Option<(&'a Context, &'a QpInner)> {
    let q = Qp::from_c(qp)?;
    // SAFETY: a live Qp (the caller's contract); reads a plain field.
    let c = unsafe { (*q).ibv.qp_base.context };
    // SAFETY: as above. The reference covers the private part only, which nothing writes but
    // through its mutex; the public part (`ibv.state` is written) is reached by raw places.
    let private = unsafe { &(*q).inner };
    // SAFETY: a QP's context outlives it.
    Some((unsafe { ctx_of(c) }?, private))
}

/// `verbs_context.create_qp_ex` (`ibv_create_qp_ex(3)`), which the header's wrapper calls for
/// any `comp_mask` but the PD alone. uroce creates what the legacy verb creates: a PD, and
/// create flags if there are none (`IBV_QP_INIT_ATTR_CREATE_FLAGS` with 0, as rdma-core's
/// tests pass it). An XRC domain, TSO, RSS, a source QPN and the `ibv_wr_*` send operations
/// (`send_ops_flags`) are capabilities uroce lacks: EOPNOTSUPP, as for a device without them.
pub(super) unsafe extern "C" fn create_qp_ex(
    context: *mut IbvContext,
    attr: *mut IbvQpInitAttrEx,
) -> *mut IbvQp {
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's extended attributes (checked non-NULL).
    let a = unsafe { &*attr };
    let supported = IBV_QP_INIT_ATTR_PD
        | IBV_QP_INIT_ATTR_XRCD
        | IBV_QP_INIT_ATTR_CREATE_FLAGS
        | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    if a.comp_mask & !supported != 0 {
        let why = format_args!(
            "comp_mask {:#x}: only IBV_QP_INIT_ATTR_PD, _XRCD, _CREATE_FLAGS and _SEND_OPS_FLAGS \
             (TSO and RSS are not supported)",
            a.comp_mask
        );
        return fail(refuse("ibv_create_qp_ex", why, libc::EOPNOTSUPP));
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
        let why = format_args!("create_flags {:#x}: none is supported", a.create_flags);
        return fail(refuse("ibv_create_qp_ex", why, libc::EOPNOTSUPP));
    }
    if a.qp_type == IBV_QPT_XRC_RECV {
        // SAFETY: the caller's context and attributes (checked non-NULL).
        return unsafe { create_target(context, a) };
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        return fail(refuse("ibv_create_qp_ex", "a QP of these types needs a PD", libc::EINVAL));
    }
    // SAFETY: the caller's PD (non-NULL); a plain field.
    if unsafe { (*a.pd).context } != context {
        return fail(refuse("ibv_create_qp_ex", "the PD is another context's", libc::EINVAL));
    }
    let send_ops = (a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0).then_some(a.send_ops_flags);
    // SAFETY: `struct ibv_qp_init_attr_ex` begins with `struct ibv_qp_init_attr`.
    unsafe { create(a.pd, attr.cast::<IbvQpInitAttr>(), send_ops) }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_create_qp(
    pd: *mut IbvPd,
    init: *mut IbvQpInitAttr,
) -> *mut IbvQp {
    // SAFETY: the caller's contract is create's.
    unsafe { create(pd, init, None) }
}

/// Creates a QP; `send_ops` are the `ibv_wr_*` operations it will use (`ibv_create_qp_ex`
/// with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`), refused with EOPNOTSUPP where the type cannot
/// carry one or uroce lacks it (ibv_wr_post(3): "QP creation will fail").
///
/// # Safety
///
/// `pd` is NULL or a live PD of this library; `init` NULL or a valid `ibv_qp_init_attr`.
unsafe fn create(pd: *mut IbvPd, init: *mut IbvQpInitAttr, send_ops: Option<u64>) -> *mut IbvQp {
    // SAFETY: the caller passes a PD it allocated.
    let Some((ctx, pdh)) = (unsafe { pd_parts(pd) }) else { return fail(libc::EINVAL) };
    if init.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller passes a valid struct ibv_qp_init_attr (checked non-NULL).
    let i = unsafe { init.read() };
    let qp_type = match i.qp_type {
        IBV_QPT_RC => QpType::Rc,
        IBV_QPT_UC => QpType::Uc,
        IBV_QPT_UD => QpType::Ud,
        IBV_QPT_XRC_SEND => QpType::XrcIni,
        t => {
            let why = format_args!("qp_type {t}: uroce has RC, UC, UD and XRC QPs");
            return fail(refuse("ibv_create_qp", why, libc::EOPNOTSUPP));
        }
    };
    if let Some(Err(why)) = send_ops.map(|ops| check_send_ops(qp_type, ops)) {
        return fail(refuse("ibv_create_qp_ex", why, libc::EOPNOTSUPP));
    }
    // SAFETY: CQs passed by the caller are live CQs of this library (or NULL).
    let Some((_, send_cq)) = (unsafe { cq_parts(i.send_cq) }) else { return fail(libc::EINVAL) };
    // An XRC initiator receives nothing: its receive CQ may be NULL (ibv_create_qp_ex(3)).
    let xrc = qp_type == QpType::XrcIni;
    // SAFETY: as above.
    let recv_cq = match unsafe { cq_parts(i.recv_cq) } {
        Some((_, c)) => c,
        None if xrc && i.recv_cq.is_null() => send_cq,
        None => return fail(libc::EINVAL),
    };
    // SAFETY: as above for the SRQ.
    let srq = match unsafe { srq_parts(i.srq) } {
        Some((_, s)) => Some(s.handle),
        None if i.srq.is_null() => None,
        None => return fail(libc::EINVAL),
    };
    let cap = QpCap {
        max_send_wr: i.cap.max_send_wr.max(1),
        max_recv_wr: if srq.is_some() || xrc { 0 } else { i.cap.max_recv_wr.max(1) },
        max_send_sge: i.cap.max_send_sge.max(1),
        max_recv_sge: if xrc { 0 } else { i.cap.max_recv_sge.max(1) },
        max_inline_data: i.cap.max_inline_data,
    };
    let attr = QpInitAttr {
        qp_type,
        pd: pdh,
        send_cq,
        recv_cq,
        cap,
        sq_sig_all: i.sq_sig_all != 0,
        srq,
        xrcd: None,
    };
    let qpn = match ctx.net.with(|s| s.engine().create_qp(attr)) {
        Ok(q) => q,
        Err(e) => return fail(refuse("ibv_create_qp", e, libc::EINVAL)),
    };
    let actual = IbvQpCap {
        max_send_wr: cap.max_send_wr,
        max_recv_wr: cap.max_recv_wr,
        max_send_sge: cap.max_send_sge,
        max_recv_sge: cap.max_recv_sge,
        max_inline_data: cap.max_inline_data,
    };
    // SAFETY: as above; ibv_create_qp(3) reports the actual capabilities in `init->cap`.
    unsafe { (*init).cap = actual };
    let public = IbvQp {
        context: ctx_ptr(ctx),
        qp_context: i.qp_context,
        pd,
        send_cq: i.send_cq,
        recv_cq: i.recv_cq,
        srq: i.srq,
        handle: qpn.get(),
        qp_num: qpn.get(),
        state: IBV_QPS_RESET,
        qp_type: i.qp_type,
        mutex: [0; 5],
        cond: [0; 6],
        events_completed: 0,
    };
    let raw = publish_qp(ctx, public, qp_type, i.sq_sig_all != 0, actual, send_ops.is_some());
    // SAFETY: the caller's PD, live (checked above).
    unsafe { parent_domain_use(pd, true) };
    raw
}

/// Hands a QP the engine created to C: its public part and this library's private one.
pub(super) fn publish_qp(
    ctx: &Context,
    public: IbvQp,
    qp_type: QpType,
    sq_sig_all: bool,
    cap: IbvQpCap,
    wr_api: bool,
) -> *mut IbvQp {
    let qpn = Qpn::from_masked(public.qp_num);
    // SAFETY: all zeroes is a valid IbvQpAttr (integers and a NUL GID).
    let mut qattr: IbvQpAttr = unsafe { core::mem::zeroed() };
    qattr.cap = cap;
    qattr.qp_state = public.state;
    qattr.port_num = 1;
    let boxed = Box::new(Qp {
        ibv: extended_qp(public),
        inner: QpInner {
            qpn,
            qp_type,
            sq_sig_all,
            cap,
            attr: Mutex::new(qattr),
            wr_api,
            batch: Mutex::new(WrBatch::default()),
            async_events_reported: AtomicU32::new(0),
        },
    });
    let raw = boxed.into_c();
    lock(&ctx.objects).qps.entry(qpn).or_insert(raw as usize);
    raw
}

pub(super) fn qp_state_of(s: c_int) -> Option<QpState> {
    Some(match s {
        IBV_QPS_RESET => QpState::Reset,
        IBV_QPS_INIT => QpState::Init,
        IBV_QPS_RTR => QpState::Rtr,
        IBV_QPS_RTS => QpState::Rts,
        IBV_QPS_SQD => QpState::Sqd,
        IBV_QPS_SQE => QpState::Sqe,
        IBV_QPS_ERR => QpState::Error,
        _ => return None,
    })
}

pub(super) fn qp_state_enum(s: QpState) -> c_int {
    match s {
        QpState::Reset => IBV_QPS_RESET,
        QpState::Init => IBV_QPS_INIT,
        QpState::Rtr => IBV_QPS_RTR,
        QpState::Rts => IBV_QPS_RTS,
        QpState::Sqd => IBV_QPS_SQD,
        QpState::Sqe => IBV_QPS_SQE,
        QpState::Error => IBV_QPS_ERR,
    }
}

/// The engine's attributes for an `ibv_modify_qp` call; `None` for a value the verb rejects.
/// Why `ibv_modify_qp` refused before the engine saw the attributes: the errno and the rule.
pub(super) type AttrRefusal = (c_int, &'static str);

/// The engine's attributes for `ibv_modify_qp(a, mask)`. Which attributes each transition
/// takes is the engine's to check (IBA 11.2.5.2); here are the mask bits uroce does not model
/// and the values only the C ABI carries.
pub(super) fn qp_attr(a: &IbvQpAttr, mask: c_int) -> Result<QpAttr, AttrRefusal> {
    let has = |bit: c_int| mask & bit != 0;
    let invalid = |why| Err((libc::EINVAL, why));
    let unsupported = |why| Err((libc::EOPNOTSUPP, why));
    // Linux refuses mask bits past the last it defines with EOPNOTSUPP
    // (`ib_uverbs_ex_modify_qp`), and those no RC, UC or UD transition takes with EINVAL.
    if mask & !((IBV_QP_RATE_LIMIT << 1) - 1) != 0 {
        return unsupported("attr_mask has bits past IBV_QP_RATE_LIMIT");
    }
    if has(IBV_QP_ALT_PATH) || has(IBV_QP_PATH_MIG_STATE) {
        return unsupported("IBV_QP_ALT_PATH, IBV_QP_PATH_MIG_STATE: no automatic path migration");
    }
    if has(IBV_QP_EN_SQD_ASYNC_NOTIFY) {
        return unsupported("IBV_QP_EN_SQD_ASYNC_NOTIFY: uroce raises no SQD drained event");
    }
    if has(IBV_QP_CAP) || has(IBV_QP_RATE_LIMIT) || mask & (0xF << 21) != 0 {
        return invalid(
            "IBV_QP_CAP, IBV_QP_RATE_LIMIT and bits 21-24: no RC, UC or UD transition takes them",
        );
    }
    let mut out = QpAttr::default();
    if has(IBV_QP_STATE) {
        out.state = Some(qp_state_of(a.qp_state).ok_or((libc::EINVAL, "qp_state: no such state"))?);
    }
    if has(IBV_QP_CUR_STATE) {
        let s = qp_state_of(a.cur_qp_state).ok_or((libc::EINVAL, "cur_qp_state: no such state"))?;
        out.cur_state = Some(s);
    }
    if has(IBV_QP_ACCESS_FLAGS) {
        let known = IBV_ACCESS_LOCAL_WRITE
            | IBV_ACCESS_REMOTE_WRITE
            | IBV_ACCESS_REMOTE_READ
            | IBV_ACCESS_REMOTE_ATOMIC;
        out.access_flags = Some(Access::from_bits(a.qp_access_flags & known.cast_unsigned()));
    }
    if has(IBV_QP_PKEY_INDEX) {
        out.pkey_index = Some(a.pkey_index);
    }
    if has(IBV_QP_PORT) {
        out.port_num = Some(a.port_num);
    }
    if has(IBV_QP_QKEY) {
        out.qkey = Some(QKey(a.qkey));
    }
    if has(IBV_QP_AV) {
        // RoCE addresses by GID: an address vector without a GRH names no IP destination.
        if a.ah_attr.is_global == 0 {
            return invalid("ah_attr: RoCE needs is_global = 1 and the peer's GID in grh.dgid");
        }
        // The source GID and the port must exist (Linux checks both before the driver).
        if a.ah_attr.grh.sgid_index != 0 {
            return invalid("ah_attr.grh.sgid_index: only entry 0 of the GID table holds a GID");
        }
        if a.ah_attr.port_num != 1 {
            return invalid("ah_attr.port_num: the device has port 1 only");
        }
        out.av = Some(AddressVector { dest: addr_of_gid(&a.ah_attr.grh.dgid) });
    }
    if has(IBV_QP_PATH_MTU) {
        let mtu =
            mtu_from_enum(a.path_mtu).ok_or((libc::EINVAL, "path_mtu: not an enum ibv_mtu"))?;
        out.path_mtu = Some(mtu);
    }
    if has(IBV_QP_TIMEOUT) {
        out.timeout = Some(a.timeout);
    }
    if has(IBV_QP_RETRY_CNT) {
        out.retry_cnt = Some(a.retry_cnt);
    }
    if has(IBV_QP_RNR_RETRY) {
        out.rnr_retry = Some(a.rnr_retry);
    }
    if has(IBV_QP_RQ_PSN) {
        out.rq_psn = Some(Psn::from_masked(a.rq_psn));
    }
    if has(IBV_QP_SQ_PSN) {
        out.sq_psn = Some(Psn::from_masked(a.sq_psn));
    }
    if has(IBV_QP_MAX_QP_RD_ATOMIC) {
        out.max_rd_atomic = Some(a.max_rd_atomic);
    }
    if has(IBV_QP_MAX_DEST_RD_ATOMIC) {
        out.max_dest_rd_atomic = Some(a.max_dest_rd_atomic);
    }
    if has(IBV_QP_MIN_RNR_TIMER) {
        out.min_rnr_timer = Some(RnrTimer::from_masked(a.min_rnr_timer));
    }
    if has(IBV_QP_DEST_QPN) {
        let qpn = Qpn::new(a.dest_qp_num).ok_or((libc::EINVAL, "dest_qp_num: above 2^24"))?;
        out.dest_qp_num = Some(qpn);
    }
    Ok(out)
}

/// Copies the attributes named by `mask` into the record `ibv_query_qp` answers from.
pub(super) fn remember(rec: &mut IbvQpAttr, a: &IbvQpAttr, mask: c_int) {
    let has = |bit: c_int| mask & bit != 0;
    if has(IBV_QP_STATE) {
        rec.qp_state = a.qp_state;
    }
    if has(IBV_QP_ACCESS_FLAGS) {
        rec.qp_access_flags = a.qp_access_flags;
    }
    if has(IBV_QP_PKEY_INDEX) {
        rec.pkey_index = a.pkey_index;
    }
    if has(IBV_QP_PORT) {
        rec.port_num = a.port_num;
    }
    if has(IBV_QP_QKEY) {
        rec.qkey = a.qkey;
    }
    if has(IBV_QP_AV) {
        rec.ah_attr = a.ah_attr;
    }
    if has(IBV_QP_PATH_MTU) {
        rec.path_mtu = a.path_mtu;
    }
    if has(IBV_QP_TIMEOUT) {
        rec.timeout = a.timeout;
    }
    if has(IBV_QP_RETRY_CNT) {
        rec.retry_cnt = a.retry_cnt;
    }
    if has(IBV_QP_RNR_RETRY) {
        rec.rnr_retry = a.rnr_retry;
    }
    if has(IBV_QP_RQ_PSN) {
        rec.rq_psn = a.rq_psn;
    }
    if has(IBV_QP_SQ_PSN) {
        rec.sq_psn = a.sq_psn;
    }
    if has(IBV_QP_MAX_QP_RD_ATOMIC) {
        rec.max_rd_atomic = a.max_rd_atomic;
    }
    if has(IBV_QP_MAX_DEST_RD_ATOMIC) {
        rec.max_dest_rd_atomic = a.max_dest_rd_atomic;
    }
    if has(IBV_QP_MIN_RNR_TIMER) {
        rec.min_rnr_timer = a.min_rnr_timer;
    }
    if has(IBV_QP_DEST_QPN) {
        rec.dest_qp_num = a.dest_qp_num;
    }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_modify_qp(
    qp: *mut IbvQp,
    attr: *mut IbvQpAttr,
    mask: c_int,
) -> c_int {
    // SAFETY: the caller passes a QP it created.
    let Some((ctx, q)) = (unsafe { qp_parts(qp) }) else { return libc::EINVAL };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller passes a valid struct ibv_qp_attr (checked non-NULL).
    let a = unsafe { attr.read() };
    let engine_attr = match qp_attr(&a, mask) {
        Ok(attr) => attr,
        Err((errno, why)) => return refuse("ibv_modify_qp", why, errno),
    };
    if let Err(e) = ctx.net.with(|s| s.engine().modify_qp(q.qpn, &engine_attr)) {
        return refuse("ibv_modify_qp", format_args!("QP {:#x}: {e}", q.qpn.get()), libc::EINVAL);
    }
    remember(&mut lock(&q.attr), &a, mask);
    if let Some(state) = engine_attr.state {
        // SAFETY: a live QP; `state` is written through its raw place (the C side reads it).
        unsafe { (*qp).state = qp_state_enum(state) };
    }
    0
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_query_qp(
    qp: *mut IbvQp,
    attr: *mut IbvQpAttr,
    _mask: c_int,
    init: *mut IbvQpInitAttr,
) -> c_int {
    // SAFETY: the caller passes a QP it created.
    let Some((ctx, q)) = (unsafe { qp_parts(qp) }) else { return libc::EINVAL };
    if attr.is_null() || init.is_null() {
        return libc::EINVAL;
    }
    let mut out = *lock(&q.attr);
    if let Some(state) = ctx.net.with(|s| s.engine().qp_state(q.qpn)) {
        out.qp_state = qp_state_enum(state);
        out.cur_qp_state = out.qp_state;
    }
    out.cap = q.cap;
    // SAFETY: the caller passes room for a struct ibv_qp_attr.
    unsafe { attr.write(out) };
    // SAFETY: a live QP; its public fields are read through raw places.
    let qp_context = unsafe { (*qp).qp_context };
    // SAFETY: as above.
    let send_cq = unsafe { (*qp).send_cq };
    // SAFETY: as above.
    let recv_cq = unsafe { (*qp).recv_cq };
    // SAFETY: as above.
    let srq = unsafe { (*qp).srq };
    // SAFETY: as above.
    let qp_type = unsafe { (*qp).qp_type };
    let i = IbvQpInitAttr {
        qp_context,
        send_cq,
        recv_cq,
        srq,
        cap: q.cap,
        qp_type,
        sq_sig_all: c_int::from(q.sq_sig_all),
    };
    // SAFETY: the caller passes room for a struct ibv_qp_init_attr.
    unsafe { init.write(i) };
    0
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_destroy_qp(qp: *mut IbvQp) -> c_int {
    // SAFETY: the caller passes a QP it created.
    let Some((ctx, q)) = (unsafe { qp_parts(qp) }) else { return libc::EINVAL };
    let qpn = q.qpn;
    // An XRC target opened more than once (`ibv_open_qp`) lives until its last handle goes.
    let last = {
        let mut objects = lock(&ctx.objects);
        let left = objects.target_opens.get_mut(&qpn).map(|n| {
            *n -= 1;
            *n
        });
        if left == Some(0) {
            objects.target_opens.remove(&qpn);
        }
        let last = left.is_none_or(|n| n == 0);
        if last || objects.qps.get(&qpn) == Some(&(qp as usize)) {
            objects.qps.remove(&qpn);
        }
        last
    };
    if last {
        ctx.net.with(|s| {
            s.engine().destroy_qp(qpn);
            let _ = s.sync_multicast();
        });
    }
    // Out of `qps` (or never in it), the QP gets no more events; those returned must be
    // acknowledged before it is freed (ibv_get_async_event(3); `ack`).
    let acked = qp.wrapping_byte_add(offset_of!(IbvQp, events_completed)).cast::<u32>();
    // SAFETY: the QP is live until freed below; the counter is only accessed atomically.
    unsafe { await_acknowledgements(acked, &q.async_events_reported) };
    // SAFETY: a live QP; a plain field.
    let pd = unsafe { (*qp).pd };
    // SAFETY: a QP's PD is live while the QP is.
    unsafe { parent_domain_use(pd, false) };
    // SAFETY: made by `ibv_create_qp`; destroying it is the caller's last use.
    drop(unsafe { Qp::take(qp) });
    0
}

pub(super) unsafe extern "C" fn post_send(
    qp: *mut IbvQp,
    wr: *mut IbvSendWr,
    bad_wr: *mut *mut IbvSendWr,
) -> c_int {
    // SAFETY: the caller passes a QP it created.
    let Some((ctx, q)) = (unsafe { qp_parts(qp) }) else { return libc::EINVAL };
    ctx.net.post_with(q.qpn, |s| {
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: the caller passes a valid list for this QP.
            let posted = match unsafe { read_send_wr(cur, q.qp_type) } {
                Ok(w) => s.engine().post_send(q.qpn, w).map_err(|e| {
                    refuse(
                        "ibv_post_send",
                        format_args!("QP {:#x}: {e}", q.qpn.get()),
                        post_errno(e),
                    )
                }),
                Err(e) => Err(refuse("ibv_post_send", "an invalid work request", e)),
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
    })
}

pub(super) unsafe extern "C" fn post_recv(
    qp: *mut IbvQp,
    wr: *mut IbvRecvWr,
    bad_wr: *mut *mut IbvRecvWr,
) -> c_int {
    // SAFETY: the caller passes a QP it created.
    let Some((ctx, q)) = (unsafe { qp_parts(qp) }) else { return libc::EINVAL };
    const VERB: &str = "ibv_post_recv";
    ctx.net.post_recv_with(|s| {
        let mut post = |w| {
            s.engine().post_recv(q.qpn, w).map_err(|e| {
                refuse(VERB, format_args!("QP {:#x}: {e}", q.qpn.get()), post_errno(e))
            })
        };
        // SAFETY: the caller passes a valid list and room for the failed request's pointer.
        unsafe { post_recv_list(VERB, wr, bad_wr, &mut post) }
    })
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_attach_mcast(
    qp: *mut IbvQp,
    gid: *const IbvGid,
    _lid: u16,
) -> c_int {
    // SAFETY: the caller passes a QP it created and a valid GID.
    unsafe { mcast(qp, gid, true) }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_detach_mcast(
    qp: *mut IbvQp,
    gid: *const IbvGid,
    _lid: u16,
) -> c_int {
    // SAFETY: as for attach.
    unsafe { mcast(qp, gid, false) }
}

/// # Safety
///
/// `qp` is a live QP of this library; `gid` is NULL or valid.
pub(super) unsafe fn mcast(qp: *mut IbvQp, gid: *const IbvGid, attach: bool) -> c_int {
    // SAFETY: the caller's contract.
    let Some((ctx, q)) = (unsafe { qp_parts(qp) }) else { return libc::EINVAL };
    if gid.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a valid GID (checked non-NULL).
    let group = addr_of_gid(&unsafe { gid.read() });
    ctx.net.with(|s| {
        let r = if attach {
            s.engine().attach_mcast(q.qpn, group)
        } else {
            s.engine().detach_mcast(q.qpn, group)
        };
        match r {
            Ok(()) => match s.sync_multicast() {
                Ok(()) => 0,
                Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
            },
            Err(_) => libc::EINVAL,
        }
    })
}
