//! Shared receive queues.

use super::*;

#[repr(C)]
pub(super) struct Srq {
    pub(super) ibv: IbvSrq,
    pub(super) handle: SrqHandle,
    pub(super) max_wr: u32,
    pub(super) max_sge: u32,
    /// Asynchronous events `ibv_get_async_event` returned for this SRQ: `ibv_destroy_srq`
    /// waits until as many are acknowledged (`ibv.events_completed`; `ack`).
    pub(super) async_events_reported: AtomicU32,
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_create_srq(
    pd: *mut IbvPd,
    init: *mut IbvSrqInitAttr,
) -> *mut IbvSrq {
    // SAFETY: the caller passes a PD it allocated.
    let Some((ctx, pdh)) = (unsafe { pd_parts(pd) }) else { return fail(libc::EINVAL) };
    if init.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller passes a valid struct ibv_srq_init_attr (checked non-NULL).
    let IbvSrqInitAttr { srq_context, attr } = unsafe { init.read() };
    // ibv_create_srq(3): `srq_limit` is not used here (ibv_modify_srq arms the limit).
    let IbvSrqAttr { max_wr, max_sge, .. } = attr;
    if max_wr == 0 {
        return fail(libc::EINVAL);
    }
    let max_sge = max_sge.max(1);
    let handle = match ctx.net.with(|s| s.engine().create_srq(pdh, max_wr, max_sge)) {
        Ok(h) => h,
        Err(e) => return fail(refuse("ibv_create_srq", e, libc::EINVAL)),
    };
    // SAFETY: as above; ibv_create_srq(3) reports the actual sizes in `attr`.
    unsafe { (*init).attr = IbvSrqAttr { max_wr, max_sge, srq_limit: 0 } };
    publish_srq(ctx, pd, srq_context, handle, max_wr, max_sge)
}

/// `verbs_context.create_srq_ex` (`ibv_create_srq_ex(3)`): a basic SRQ as `ibv_create_srq`
/// makes, an XRC SRQ in a domain (xrc.rs), or a tag-matching SRQ (tm.rs); the last two with
/// the CQ their receives complete on.
pub(super) unsafe extern "C" fn create_srq_ex(
    context: *mut IbvContext,
    attr: *mut IbvSrqInitAttrEx,
) -> *mut IbvSrq {
    const VERB: &str = "ibv_create_srq_ex";
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's attributes (checked non-NULL).
    let a = unsafe { &mut *attr };
    let known = IBV_SRQ_INIT_ATTR_TYPE
        | IBV_SRQ_INIT_ATTR_PD
        | IBV_SRQ_INIT_ATTR_XRCD
        | IBV_SRQ_INIT_ATTR_CQ
        | IBV_SRQ_INIT_ATTR_TM;
    if a.comp_mask & !known != 0 {
        let why = format_args!("unknown comp_mask bits {:#x}", a.comp_mask & !known);
        return fail(refuse(VERB, why, libc::EOPNOTSUPP));
    }
    let srq_type =
        if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0 { a.srq_type } else { IBV_SRQT_BASIC };
    let pd = if a.comp_mask & IBV_SRQ_INIT_ATTR_PD != 0 { a.pd } else { null_mut() };
    // SAFETY: NULL or the caller's PD.
    let Some((ctx, pdh)) = (unsafe { pd_parts(pd) }) else {
        return fail(refuse(VERB, "an SRQ needs a PD", libc::EINVAL));
    };
    if ctx_ptr(ctx) != context {
        return fail(refuse(VERB, "the PD is another context's", libc::EINVAL));
    }
    match srq_type {
        IBV_SRQT_BASIC => {
            let mut legacy = IbvSrqInitAttr {
                srq_context: a.srq_context,
                attr: IbvSrqAttr { max_wr: a.attr.max_wr, max_sge: a.attr.max_sge, srq_limit: 0 },
            };
            // SAFETY: the caller's PD; a local attribute structure.
            let srq = unsafe { uroce_verbs_create_srq(pd, &raw mut legacy) };
            a.attr.max_wr = legacy.attr.max_wr;
            a.attr.max_sge = legacy.attr.max_sge;
            srq
        }
        // SAFETY: the caller's live PD of `ctx`, and its attributes.
        IBV_SRQT_XRC => unsafe { create_xrc_srq(ctx, pd, pdh, a) },
        // SAFETY: as above.
        IBV_SRQT_TM => unsafe { create_tm_srq(ctx, pd, pdh, a) },
        t => fail(refuse(VERB, format_args!("srq_type {t}: basic, XRC or TM"), libc::EINVAL)),
    }
}

/// An SRQ of the sizes `a` asks for (`max_wr` at least 1; `max_sge` 0 taken as 1), made by
/// `make`, handed to C with the sizes it got written back.
pub(super) fn create_sized_srq(
    ctx: &Context,
    pd: *mut IbvPd,
    a: &mut IbvSrqInitAttrEx,
    make: impl FnOnce(u32, u32) -> Result<SrqHandle, uroce_engine::CreateError>,
) -> *mut IbvSrq {
    if a.attr.max_wr == 0 {
        return fail(refuse("ibv_create_srq_ex", "max_wr 0", libc::EINVAL));
    }
    let (max_wr, max_sge) = (a.attr.max_wr, a.attr.max_sge.max(1));
    let handle = match make(max_wr, max_sge) {
        Ok(h) => h,
        Err(e) => return fail(refuse("ibv_create_srq_ex", e, libc::EINVAL)),
    };
    a.attr.max_wr = max_wr;
    a.attr.max_sge = max_sge;
    publish_srq(ctx, pd, a.srq_context, handle, max_wr, max_sge)
}

/// Hands an SRQ the engine created in `pd` to C.
pub(super) fn publish_srq(
    ctx: &Context,
    pd: *mut IbvPd,
    srq_context: *mut c_void,
    handle: SrqHandle,
    max_wr: u32,
    max_sge: u32,
) -> *mut IbvSrq {
    let boxed = Box::new(Srq {
        ibv: IbvSrq {
            context: ctx_ptr(ctx),
            srq_context,
            pd,
            handle: handle.get(),
            mutex: [0; 5],
            cond: [0; 6],
            events_completed: 0,
        },
        handle,
        max_wr,
        max_sge,
        async_events_reported: AtomicU32::new(0),
    });
    let raw = boxed.into_c();
    lock(&ctx.objects).srqs.insert(handle, raw as usize);
    // SAFETY: the caller's PD, live (checked above).
    unsafe { parent_domain_use(pd, true) };
    raw
}

/// The context of an SRQ and the SRQ.
///
/// # Safety
///
/// `srq` is NULL or a live SRQ of this library.
pub(super) unsafe fn srq_parts<'a>(srq: *mut IbvSrq) -> Option<(&'a Context, &'a Srq)> {
    // SAFETY: a live Srq (the caller's contract). The C side never writes it, and this
    // library writes no field of it after creation except the atomic limit.
    let s = unsafe { &*Srq::from_c(srq)? };
    // SAFETY: an SRQ's context outlives it.
    Some((unsafe { ctx_of(s.ibv.context) }?, s))
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_modify_srq(
    srq: *mut IbvSrq,
    attr: *mut IbvSrqAttr,
    mask: c_int,
) -> c_int {
    // SAFETY: the caller passes an SRQ it created.
    let Some((ctx, s)) = (unsafe { srq_parts(srq) }) else { return libc::EINVAL };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // Resizing is not supported (IBV_DEVICE_SRQ_RESIZE is not claimed).
    if mask & IBV_SRQ_MAX_WR != 0 {
        return libc::EINVAL;
    }
    if mask & IBV_SRQ_LIMIT != 0 {
        // SAFETY: the caller passes a valid struct ibv_srq_attr (checked non-NULL).
        let limit = unsafe { (*attr).srq_limit };
        // ibv_modify_srq(3): the limit must not exceed the SRQ's size.
        if limit > s.max_wr {
            return libc::EINVAL;
        }
        ctx.net.with(|st| st.engine().arm_srq_limit(s.handle, limit));
    }
    0
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_query_srq(
    srq: *mut IbvSrq,
    attr: *mut IbvSrqAttr,
) -> c_int {
    // SAFETY: the caller passes an SRQ it created.
    let Some((ctx, s)) = (unsafe { srq_parts(srq) }) else { return libc::EINVAL };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // ibv_query_srq(3): a limit of 0 means not armed, or no longer (it fired).
    let limit = ctx.net.with(|st| st.engine().srq_limit(s.handle)).unwrap_or(0);
    let out = IbvSrqAttr { max_wr: s.max_wr, max_sge: s.max_sge, srq_limit: limit };
    // SAFETY: the caller passes room for a struct ibv_srq_attr.
    unsafe { attr.write(out) };
    0
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_destroy_srq(srq: *mut IbvSrq) -> c_int {
    // SAFETY: the caller passes an SRQ it created.
    let Some((ctx, s)) = (unsafe { srq_parts(srq) }) else { return libc::EINVAL };
    // ibv_destroy_srq(3): EBUSY while a QP takes its receives from the SRQ.
    match ctx.net.with(|st| st.engine().destroy_srq(s.handle)) {
        Ok(()) => {}
        Err(DestroyError::InUse) => return libc::EBUSY,
        Err(DestroyError::Unknown) => return libc::EINVAL,
    }
    lock(&ctx.objects).srqs.remove(&s.handle);
    // Out of `srqs`, the SRQ gets no more events; those returned must be acknowledged before
    // it is freed (ibv_get_async_event(3); `ack`).
    let acked = srq.wrapping_byte_add(offset_of!(IbvSrq, events_completed)).cast::<u32>();
    // SAFETY: the SRQ is live until freed below; the counter is only accessed atomically.
    unsafe { await_acknowledgements(acked, &s.async_events_reported) };
    // SAFETY: an SRQ's PD is live while the SRQ is.
    unsafe { parent_domain_use(s.ibv.pd, false) };
    // SAFETY: made by `ibv_create_srq`; destroying it is the caller's last use.
    drop(unsafe { Srq::take(srq) });
    0
}

pub(super) unsafe extern "C" fn post_srq_recv(
    srq: *mut IbvSrq,
    wr: *mut IbvRecvWr,
    bad_wr: *mut *mut IbvRecvWr,
) -> c_int {
    // SAFETY: the caller passes an SRQ it created.
    let Some((ctx, s)) = (unsafe { srq_parts(srq) }) else { return libc::EINVAL };
    const VERB: &str = "ibv_post_srq_recv";
    ctx.net.post_recv_with(|st| {
        let mut post =
            |w| st.engine().post_srq_recv(s.handle, w).map_err(|e| refuse(VERB, e, post_errno(e)));
        // SAFETY: the caller passes a valid list and room for the failed request's pointer.
        unsafe { post_recv_list(VERB, wr, bad_wr, &mut post) }
    })
}
