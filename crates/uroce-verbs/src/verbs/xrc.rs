//! XRC (IBA Annex A14): domains (`ibv_open_xrcd`, `ibv_close_xrcd`), XRC SRQs
//! (`ibv_create_srq_ex` through srq.rs, `ibv_get_srq_num`), target QPs (`ibv_create_qp_ex` with
//! `IBV_QPT_XRC_RECV`, `ibv_open_qp`). Initiators are ordinary QPs of type
//! `IBV_QPT_XRC_SEND` (qp.rs), whose work requests name the remote SRQ.
//!
//! A domain opened by a file is shared by every open of that file in this process, as the
//! kernel shares it by inode; uroce's devices are per process, so processes do not share one.

use std::sync::atomic::AtomicUsize;

use super::*;

/// An XRC domain.
#[repr(C)]
pub(super) struct Xrcd {
    pub(super) ibv: IbvXrcd,
    pub(super) handle: XrcdHandle,
    /// The file that names it, as (device, inode); `None` for one opened with fd -1.
    file: Option<(u64, u64)>,
    /// Opens not yet closed.
    opens: AtomicUsize,
}

// SAFETY: `#[repr(C)]` with its `IbvXrcd` at offset 0 (asserted below).
unsafe impl CObject for Xrcd {
    type Public = IbvXrcd;
}
const _: () = assert!(offset_of!(Xrcd, ibv) == 0);

/// The context of a domain and the domain.
///
/// # Safety
///
/// `x` is NULL or a live domain of this library.
unsafe fn xrcd_parts<'a>(x: *mut IbvXrcd) -> Option<(&'a Context, &'a Xrcd)> {
    // SAFETY: a live Xrcd (the caller's contract); only its atomic count is ever written.
    let x = unsafe { &*Xrcd::from_c(x)? };
    // SAFETY: a domain's context outlives it.
    Some((unsafe { ctx_of(x.ibv.context) }?, x))
}

/// `verbs_context.open_xrcd` (`ibv_open_xrcd(3)`): `fd` -1 opens a new domain; a file's
/// descriptor opens the domain of that file, created with `O_CREAT` if it has none (and
/// refused with `O_EXCL` if it has one), as the kernel's `ib_uverbs_open_xrcd`.
pub(super) unsafe extern "C" fn open_xrcd(
    context: *mut IbvContext,
    attr: *mut IbvXrcdInitAttr,
) -> *mut IbvXrcd {
    const VERB: &str = "ibv_open_xrcd";
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return fail(libc::EINVAL) };
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's attributes (checked non-NULL).
    let IbvXrcdInitAttr { comp_mask, fd, oflags } = unsafe { attr.read() };
    let known = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    if comp_mask & !known != 0 {
        return fail(refuse(VERB, format_args!("comp_mask {comp_mask:#x}"), libc::EOPNOTSUPP));
    }
    if comp_mask & known != known {
        return fail(refuse(VERB, "needs IBV_XRCD_INIT_ATTR_FD and _OFLAGS", libc::EINVAL));
    }
    let file = if fd == -1 {
        None
    } else {
        if fd < 0 {
            return fail(libc::EBADF);
        }
        match file_id(fd) {
            Ok(id) => Some(id),
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(libc::EBADF);
                return fail(refuse(VERB, format_args!("fd {fd}: {e}"), errno));
            }
        }
    };
    let mut objects = lock(&ctx.objects);
    if let Some(key) = file
        && let Some(&raw) = objects.xrcds_by_file.get(&key)
    {
        if oflags & libc::O_EXCL != 0 {
            return fail(refuse(VERB, "O_EXCL, and the file has a domain", libc::EINVAL));
        }
        // SAFETY: a live domain of this context (it leaves the map when closed).
        let x = unsafe { &*(raw as *const Xrcd) };
        x.opens.fetch_add(1, Ordering::AcqRel);
        return raw as *mut IbvXrcd;
    }
    if file.is_some() && oflags & libc::O_CREAT == 0 {
        return fail(refuse(VERB, "the file has no domain, and no O_CREAT", libc::EINVAL));
    }
    let handle = ctx.net.with(|s| s.engine().alloc_xrcd());
    let raw = Box::new(Xrcd { ibv: IbvXrcd { context }, handle, file, opens: AtomicUsize::new(1) })
        .into_c();
    if let Some(key) = file {
        objects.xrcds_by_file.insert(key, raw as usize);
    }
    raw
}

/// `verbs_context.close_xrcd` (`ibv_close_xrcd(3)`): the last close frees the domain, which
/// fails with EBUSY while an XRC SRQ or target QP is in it.
pub(super) unsafe extern "C" fn close_xrcd(xrcd: *mut IbvXrcd) -> c_int {
    // SAFETY: the caller passes a domain it opened.
    let Some((ctx, x)) = (unsafe { xrcd_parts(xrcd) }) else { return libc::EINVAL };
    let mut objects = lock(&ctx.objects);
    if x.opens.load(Ordering::Acquire) > 1 {
        x.opens.fetch_sub(1, Ordering::AcqRel);
        return 0;
    }
    match ctx.net.with(|s| s.engine().dealloc_xrcd(x.handle)) {
        Ok(()) => {}
        Err(DestroyError::InUse) => return refuse("ibv_close_xrcd", "still in use", libc::EBUSY),
        Err(DestroyError::Unknown) => return libc::EINVAL,
    }
    if let Some(key) = x.file {
        objects.xrcds_by_file.remove(&key);
    }
    drop(objects);
    // SAFETY: made by `ibv_open_xrcd`; its last close is the caller's last use.
    drop(unsafe { Xrcd::take(xrcd) });
    0
}

/// An XRC SRQ (`ibv_create_srq_ex` with `IBV_SRQT_XRC`) in `pd`: it needs an XRC domain and
/// the CQ its receives complete on.
///
/// # Safety
///
/// `pd` is the live PD `pdh` of `ctx`; `a` the caller's attributes.
pub(super) unsafe fn create_xrc_srq(
    ctx: &Context,
    pd: *mut IbvPd,
    pdh: PdHandle,
    a: &mut IbvSrqInitAttrEx,
) -> *mut IbvSrq {
    const VERB: &str = "ibv_create_srq_ex";
    let need = IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
    if a.comp_mask & need != need {
        return fail(refuse(VERB, "an XRC SRQ needs an XRC domain and a CQ", libc::EINVAL));
    }
    // SAFETY: NULL or the caller's domain and CQ.
    let (Some((xctx, x)), Some((cctx, cq))) =
        (unsafe { xrcd_parts(a.xrcd) }, unsafe { cq_parts(a.cq) })
    else {
        return fail(libc::EINVAL);
    };
    if !ptr::eq(xctx, ctx) || !ptr::eq(cctx, ctx) {
        return fail(refuse(VERB, "objects of another context", libc::EINVAL));
    }
    create_sized_srq(ctx, pd, a, |max_wr, max_sge| {
        ctx.net.with(|s| s.engine().create_xrc_srq(pdh, x.handle, cq, max_wr, max_sge))
    })
}

/// `verbs_context.get_srq_num` (`ibv_get_srq_num(3)`): the number initiators name in their
/// work requests (and the XRCETH).
pub(super) unsafe extern "C" fn get_srq_num(srq: *mut IbvSrq, num: *mut u32) -> c_int {
    // SAFETY: the caller passes an SRQ it created.
    let Some((ctx, s)) = (unsafe { srq_parts(srq) }) else { return libc::EINVAL };
    if num.is_null() {
        return libc::EINVAL;
    }
    if ctx.net.with(|st| st.engine().srq_xrcd(s.handle)).is_none() {
        return refuse("ibv_get_srq_num", "not an XRC SRQ", libc::EINVAL);
    }
    // SAFETY: the caller passes room for the number (checked non-NULL).
    unsafe { num.write(s.handle.get()) };
    0
}

/// An XRC target QP (`ibv_create_qp_ex` with `IBV_QPT_XRC_RECV` and `IBV_QP_INIT_ATTR_XRCD`):
/// no PD, CQs, SRQ or queues of its own.
///
/// # Safety
///
/// `context` is a context this library opened; `a` the caller's attributes.
pub(super) unsafe fn create_target(context: *mut IbvContext, a: &IbvQpInitAttrEx) -> *mut IbvQp {
    const VERB: &str = "ibv_create_qp_ex";
    // SAFETY: the caller's contract.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return fail(libc::EINVAL) };
    if a.comp_mask & IBV_QP_INIT_ATTR_XRCD == 0 {
        return fail(refuse(VERB, "an XRC target QP needs an XRC domain", libc::EINVAL));
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 && a.send_ops_flags != 0 {
        return fail(refuse(VERB, "an XRC target QP sends nothing", libc::EINVAL));
    }
    // SAFETY: NULL or the caller's domain.
    let Some((xctx, x)) = (unsafe { xrcd_parts(a.xrcd) }) else { return fail(libc::EINVAL) };
    if !ptr::eq(xctx, ctx) {
        return fail(refuse(VERB, "the XRC domain is another context's", libc::EINVAL));
    }
    let qpn = match ctx.net.with(|s| s.engine().create_qp(QpInitAttr::xrc_target(x.handle))) {
        Ok(q) => q,
        Err(e) => return fail(refuse(VERB, e, libc::EINVAL)),
    };
    lock(&ctx.objects).target_opens.insert(qpn, 1);
    publish_qp(
        ctx,
        target_public(ctx, qpn, a.qp_context),
        QpType::XrcTgt,
        false,
        no_queues(),
        false,
    )
}

fn no_queues() -> IbvQpCap {
    IbvQpCap {
        max_send_wr: 0,
        max_recv_wr: 0,
        max_send_sge: 0,
        max_recv_sge: 0,
        max_inline_data: 0,
    }
}

fn target_public(ctx: &Context, qpn: Qpn, qp_context: *mut c_void) -> IbvQp {
    IbvQp {
        context: ctx_ptr(ctx),
        qp_context,
        pd: null_mut(),
        send_cq: null_mut(),
        recv_cq: null_mut(),
        srq: null_mut(),
        handle: qpn.get(),
        qp_num: qpn.get(),
        state: IBV_QPS_RESET,
        qp_type: IBV_QPT_XRC_RECV,
        mutex: [0; 5],
        cond: [0; 6],
        events_completed: 0,
    }
}

/// `verbs_context.open_qp` (`ibv_open_qp(3)`): another handle to an XRC target QP of the
/// domain, which then lives until its last handle is destroyed.
pub(super) unsafe extern "C" fn open_qp(
    context: *mut IbvContext,
    attr: *mut IbvQpOpenAttr,
) -> *mut IbvQp {
    const VERB: &str = "ibv_open_qp";
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return fail(libc::EINVAL) };
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's attributes (checked non-NULL).
    let a = unsafe { attr.read() };
    let need = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
    if a.comp_mask & need != need {
        return fail(refuse(VERB, "needs the QP number, its XRC domain and type", libc::EINVAL));
    }
    if a.qp_type != IBV_QPT_XRC_RECV {
        return fail(refuse(VERB, "only XRC target QPs are opened", libc::EINVAL));
    }
    // SAFETY: NULL or the caller's domain.
    let Some((_, x)) = (unsafe { xrcd_parts(a.xrcd) }) else { return fail(libc::EINVAL) };
    let Some(qpn) = Qpn::new(a.qp_num) else { return fail(libc::EINVAL) };
    let in_domain = ctx.net.with(|s| s.engine().qp_xrcd(qpn)) == Some(x.handle);
    if !in_domain {
        return fail(refuse(VERB, format_args!("no XRC target {qpn} in the domain"), libc::EINVAL));
    }
    let qp_context =
        if a.comp_mask & IBV_QP_OPEN_ATTR_CONTEXT != 0 { a.qp_context } else { null_mut() };
    let state = ctx.net.with(|s| s.engine().qp_state(qpn)).map_or(IBV_QPS_RESET, qp_state_enum);
    {
        let mut objects = lock(&ctx.objects);
        *objects.target_opens.entry(qpn).or_insert(0) += 1;
    }
    let mut public = target_public(ctx, qpn, qp_context);
    public.state = state;
    publish_qp(ctx, public, QpType::XrcTgt, false, no_queues(), false)
}
