//! Completion channels and completion queues: creation, polling, notification, events.

use super::*;

#[repr(C)]
pub(super) struct CompChannel {
    pub(super) ibv: IbvCompChannel,
    pub(super) channel: Arc<Channel>,
    /// Whether the descriptor was in non-blocking mode when `ibv_get_cq_event` last asked
    /// (`fcntl(F_GETFL)`: the application sets the mode on the descriptor, unseen).
    nonblocking_seen: AtomicBool,
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_create_comp_channel(
    context: *mut IbvContext,
) -> *mut IbvCompChannel {
    if context.is_null() {
        return fail(libc::EINVAL);
    }
    let channel = match Channel::new_blocking() {
        Ok(c) => Arc::new(c),
        Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EMFILE)),
    };
    let boxed = Box::new(CompChannel {
        ibv: IbvCompChannel { context, fd: channel.as_raw_fd(), refcnt: 0 },
        channel,
        nonblocking_seen: AtomicBool::new(false),
    });
    boxed.into_c()
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_destroy_comp_channel(
    channel: *mut IbvCompChannel,
) -> c_int {
    if channel.is_null() {
        return libc::EINVAL;
    }
    let field = channel.wrapping_byte_add(offset_of!(IbvCompChannel, refcnt)).cast::<u32>();
    // SAFETY: a live channel (the caller's contract); its refcount is only accessed atomically.
    let refcnt = unsafe { AtomicU32::from_ptr(field) };
    // ibv_create_comp_channel(3): destroying a channel that CQs still use fails with EBUSY.
    if refcnt.load(Ordering::Acquire) != 0 {
        return libc::EBUSY;
    }
    // SAFETY: made by `ibv_create_comp_channel`; destroying it is the caller's last use.
    drop(unsafe { CompChannel::take(channel) });
    0
}

/// A CQ, legacy or extended: both are a `struct ibv_cq_ex` (`ibv_cq_ex_to_cq(3)` is a cast),
/// and a legacy CQ simply never has its extended part read.
#[repr(C)]
pub(super) struct Cq {
    pub(super) ibv: IbvCqEx,
    pub(super) handle: CqHandle,
    /// `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll`: the poll in progress (`cq_ex`).
    pub(super) poll: PollState,
    /// The parent domain it was made in, or NULL.
    pub(super) parent_domain: *mut IbvPd,
    /// Completion events `ibv_get_cq_event` returned for this CQ: `ibv_destroy_cq` waits
    /// until the application has acknowledged as many (`ibv.comp_events_completed`).
    pub(super) events_reported: AtomicU32,
    /// Asynchronous events (`IBV_EVENT_CQ_ERR`) `ibv_get_async_event` returned for it, which
    /// `ibv_destroy_cq` waits for likewise (`ibv.async_events_completed`).
    pub(super) async_events_reported: AtomicU32,
}

/// The context and engine handle of a CQ.
///
/// # Safety
///
/// `cq` is NULL or a live CQ of this library.
pub(super) unsafe fn cq_parts<'a>(cq: *mut IbvCq) -> Option<(&'a Context, CqHandle)> {
    let cq = Cq::from_c(cq)?;
    // SAFETY: a live Cq (the caller's contract); reads a plain field.
    let c = unsafe { (*cq).ibv.cq.context };
    // SAFETY: as above.
    let h = unsafe { (*cq).handle };
    // SAFETY: a CQ's context outlives it.
    Some((unsafe { ctx_of(c) }?, h))
}

/// `ibv_resize_cq(3)`: the CQ takes at least `cqe` completions from now on, keeping those it
/// holds; EINVAL for a size outside 1..=`max_cqe` or below the completions queued.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_resize_cq(cq: *mut IbvCq, cqe: c_int) -> c_int {
    // SAFETY: the caller passes a CQ it created.
    let Some((ctx, handle)) = (unsafe { cq_parts(cq) }) else { return libc::EINVAL };
    let Ok(capacity) = usize::try_from(cqe) else { return libc::EINVAL };
    if let Err(e) = ctx.net.with(|s| s.engine().resize_cq(handle, capacity)) {
        return refuse("ibv_resize_cq", format_args!("cqe {cqe}: {e}"), libc::EINVAL);
    }
    // SAFETY: a live CQ of this library; `cqe` is read by the application between calls.
    unsafe { (*cq).cqe = cqe };
    0
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_create_cq(
    context: *mut IbvContext,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut IbvCompChannel,
    comp_vector: c_int,
) -> *mut IbvCq {
    let Ok(cqe) = u32::try_from(cqe) else { return fail(libc::EINVAL) };
    let Ok(comp_vector) = u32::try_from(comp_vector) else {
        return fail(refuse("ibv_create_cq", "a negative comp_vector", libc::EINVAL));
    };
    let spec =
        CqSpec { cqe, cq_context, channel, comp_vector, locked: true, parent_domain: null_mut() };
    // SAFETY: the caller passes a context it opened and, if not NULL, a channel of it.
    match unsafe { create(context, &spec) } {
        Ok(cq) => cq.cast(),
        Err(e) => fail(refuse("ibv_create_cq", e.1, e.0)),
    }
}

/// What a CQ is created with, by `ibv_create_cq` or `ibv_create_cq_ex`.
pub(super) struct CqSpec {
    pub(super) cqe: u32,
    pub(super) cq_context: *mut c_void,
    pub(super) channel: *mut IbvCompChannel,
    pub(super) comp_vector: u32,
    /// `ibv_start_poll` to `ibv_end_poll` excludes other threads (not
    /// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED`).
    pub(super) locked: bool,
    /// The parent domain it belongs to (`IBV_CQ_INIT_ATTR_MASK_PD`), or NULL.
    pub(super) parent_domain: *mut IbvPd,
}

/// Creates a CQ: (errno, why) when refused.
///
/// # Safety
///
/// `context` is NULL or a live context of this library; `spec.channel` is NULL or a live
/// channel of it.
pub(super) unsafe fn create(
    context: *mut IbvContext,
    spec: &CqSpec,
) -> Result<*mut IbvCqEx, (c_int, String)> {
    // SAFETY: the caller's contract.
    let Some(ctx) = (unsafe { ctx_of(context) }) else {
        return Err((libc::EINVAL, "not a context of this library".into()));
    };
    let capacity = usize::try_from(spec.cqe).unwrap_or(usize::MAX);
    if capacity == 0 {
        return Err((libc::EINVAL, "cqe 0".into()));
    }
    // ibv_create_cq(3): comp_vector is at least 0 and less than the context's
    // num_comp_vectors (the kernel refuses any other with EINVAL).
    // SAFETY: a live context of this library; a plain field.
    let vectors = unsafe { (*context).num_comp_vectors };
    if u32::try_from(vectors).is_ok_and(|v| spec.comp_vector >= v) {
        let why = format!("comp_vector {}: the context has {vectors} vector(s)", spec.comp_vector);
        return Err((libc::EINVAL, why));
    }
    let handle = match ctx.net.with(|s| s.engine().create_cq(capacity)) {
        Ok(h) => h,
        Err(e) => return Err((libc::EINVAL, e.to_string())),
    };
    let channel = spec.channel;
    if let Some(ch) = CompChannel::from_c(channel) {
        // SAFETY: a live channel of this context (the caller's contract).
        let arc = unsafe { Arc::clone(&(*ch).channel) };
        let field = channel.wrapping_byte_add(offset_of!(IbvCompChannel, refcnt)).cast::<u32>();
        // SAFETY: as above; the refcount is only accessed atomically.
        let refcnt = unsafe { AtomicU32::from_ptr(field) };
        refcnt.fetch_add(1, Ordering::AcqRel);
        ctx.net.with(|s| s.bind_channel(handle, arc));
    }
    let cq = IbvCq {
        context,
        channel,
        cq_context: spec.cq_context,
        handle: handle.get(),
        cqe: c_int::try_from(spec.cqe).unwrap_or(c_int::MAX),
        mutex: [0; 5],
        cond: [0; 6],
        comp_events_completed: 0,
        async_events_completed: 0,
    };
    let boxed = Box::new(Cq {
        ibv: extended_cq(cq),
        handle,
        poll: PollState::new(spec.locked),
        parent_domain: spec.parent_domain,
        events_reported: AtomicU32::new(0),
        async_events_reported: AtomicU32::new(0),
    });
    let raw = boxed.into_c();
    lock(&ctx.objects).cqs.insert(handle, raw as usize);
    // SAFETY: NULL or the caller's parent domain, live (checked by the caller).
    unsafe { parent_domain_use(spec.parent_domain, true) };
    Ok(raw.cast())
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_destroy_cq(cq: *mut IbvCq) -> c_int {
    // SAFETY: the caller passes a CQ it created.
    let Some((ctx, handle)) = (unsafe { cq_parts(cq) }) else { return libc::EINVAL };
    let Some(object) = Cq::from_c(cq) else { return libc::EINVAL };
    // ibv_destroy_cq(3): EBUSY while a QP uses the CQ.
    match ctx.net.with(|s| s.destroy_cq(handle)) {
        Ok(()) => {}
        Err(DestroyError::InUse) => return libc::EBUSY,
        Err(DestroyError::Unknown) => return libc::EINVAL,
    }
    // From here `ibv_get_cq_event` drops this CQ's events instead of returning them.
    lock(&ctx.objects).cqs.remove(&handle);
    // As rdma-core's ibv_destroy_cq does, wait until every event returned for this CQ, a
    // completion event or an asynchronous one, is acknowledged (`ack`): a thread that got one
    // may still be handling it, and the CQ (and whatever its cq_context names) must outlive
    // that.
    let comp = cq.wrapping_byte_add(offset_of!(IbvCq, comp_events_completed)).cast::<u32>();
    let asynchronous =
        cq.wrapping_byte_add(offset_of!(IbvCq, async_events_completed)).cast::<u32>();
    // SAFETY: the CQ is live until freed below.
    let object = unsafe { &*object };
    // SAFETY: as above; its counters are only accessed atomically.
    unsafe { await_acknowledgements(comp, &object.events_reported) };
    // SAFETY: as above.
    unsafe { await_acknowledgements(asynchronous, &object.async_events_reported) };
    // SAFETY: made by `ibv_create_cq`; destroying it is the caller's last use.
    let Some(boxed) = (unsafe { Cq::take(cq) }) else { return libc::EINVAL };
    // SAFETY: a CQ's parent domain outlives it (its deallocation is EBUSY meanwhile).
    unsafe { parent_domain_use(boxed.parent_domain, false) };
    let channel = boxed.ibv.cq.channel;
    if !channel.is_null() {
        let field = channel.wrapping_byte_add(offset_of!(IbvCompChannel, refcnt)).cast::<u32>();
        // SAFETY: a CQ's channel outlives it (ibv_destroy_comp_channel fails while in use);
        // the refcount is only accessed atomically.
        let refcnt = unsafe { AtomicU32::from_ptr(field) };
        refcnt.fetch_sub(1, Ordering::AcqRel);
    }
    0
}

thread_local! {
    static SCRATCH: RefCell<Vec<WorkCompletion>> = const { RefCell::new(Vec::new()) };
}

/// The one completion `poll` leaves in the calling thread's scratch buffer, if any: the
/// extended poll's way to take completions one at a time without allocating.
pub(super) fn poll_one(poll: impl FnOnce(&mut Vec<WorkCompletion>)) -> Option<WorkCompletion> {
    SCRATCH.with_borrow_mut(|got| {
        got.clear();
        poll(got);
        got.pop()
    })
}

/// `enum ibv_wc_opcode` of a completion.
pub(super) fn wc_opcode(w: &WorkCompletion) -> c_int {
    match w.opcode {
        WcOpcode::Send => IBV_WC_SEND,
        WcOpcode::RdmaWrite => IBV_WC_RDMA_WRITE,
        WcOpcode::RdmaRead => IBV_WC_RDMA_READ,
        WcOpcode::CompSwap => IBV_WC_COMP_SWAP,
        WcOpcode::FetchAdd => IBV_WC_FETCH_ADD,
        WcOpcode::Recv => IBV_WC_RECV,
        WcOpcode::RecvRdmaWithImm => IBV_WC_RECV_RDMA_WITH_IMM,
        WcOpcode::BindMw => IBV_WC_BIND_MW,
        WcOpcode::LocalInv => IBV_WC_LOCAL_INV,
        WcOpcode::AtomicWrite => IBV_WC_ATOMIC_WRITE,
        WcOpcode::TmAdd => IBV_WC_TM_ADD,
        WcOpcode::TmDel => IBV_WC_TM_DEL,
        WcOpcode::TmSync => IBV_WC_TM_SYNC,
        WcOpcode::TmRecv => IBV_WC_TM_RECV,
        WcOpcode::TmNoTag => IBV_WC_TM_NO_TAG,
    }
}

/// `wc_flags` of a completion (`IBV_WC_GRH`, `IBV_WC_WITH_IMM`, `IBV_WC_WITH_INV`, and a
/// TM-SRQ's `IBV_WC_TM_*`).
pub(super) fn wc_flags(w: &WorkCompletion) -> u32 {
    let mut flags = 0;
    if w.grh {
        flags |= IBV_WC_GRH;
    }
    if w.imm.is_some() {
        flags |= IBV_WC_WITH_IMM;
    }
    if w.invalidated_rkey.is_some() {
        flags |= IBV_WC_WITH_INV;
    }
    let tm = w.tm.unwrap_or_default().flags;
    for (bit, c) in [
        (TmFlags::SYNC_REQ, IBV_WC_TM_SYNC_REQ),
        (TmFlags::MATCH, IBV_WC_TM_MATCH),
        (TmFlags::DATA_VALID, IBV_WC_TM_DATA_VALID),
    ] {
        if tm.contains(bit) {
            flags |= c;
        }
    }
    flags
}

/// `wc.imm_data`, the union it shares with `invalidated_rkey`: the immediate data as the wire
/// bytes (`__be32`), or the invalidated key in host order.
pub(super) fn imm_or_invalidated(w: &WorkCompletion) -> u32 {
    match (w.imm, w.invalidated_rkey) {
        (Some(imm), _) => u32::from_ne_bytes(imm),
        (None, Some(rkey)) => rkey.0,
        (None, None) => 0,
    }
}

/// A completion as `struct ibv_wc`.
pub(super) fn wc_of(w: &WorkCompletion) -> IbvWc {
    IbvWc {
        wr_id: w.wr_id,
        status: c_int::try_from(w.status.0).unwrap_or(c_int::MAX),
        opcode: wc_opcode(w),
        vendor_err: 0,
        byte_len: w.byte_len,
        imm_data: imm_or_invalidated(w),
        qp_num: w.qp_num.get(),
        src_qp: w.src_qp.get(),
        wc_flags: wc_flags(w),
        pkey_index: 0,
        slid: 0,
        sl: ud_sl(w),
        dlid_path_bits: 0,
    }
}

/// The `sl` of a UD receive on RoCE: Ethernet has no service level, and a ConnectX reports
/// the packet type there instead (rdma-core's mlx5 provider copies bits 24–27 of the CQE's
/// `flags_rqpn` into `wc.sl`; for a UD responder on RoCE they are bit 3 "UDP header present",
/// bits 2:0 the L3 header, 1 IPv6 and 2 IPv4). UCX reads it to find the destination GID in
/// the GRH area (IBA A17.4.5.1: the CQE says whether the frame was IPv4 or IPv6). Linux rxe
/// leaves it 0. Everything else: 0.
pub(super) fn ud_sl(w: &WorkCompletion) -> u8 {
    if !w.grh {
        return 0;
    }
    const UDP_PRESENT: u8 = 0x8;
    UDP_PRESENT | if w.ipv4 { 0x2 } else { 0x1 }
}

/// `ibv_poll_cq(3)` (through `ibv_context.ops`): a round of progress in the calling thread,
/// then up to `num_entries` completions.
pub(super) unsafe extern "C" fn poll_cq(
    cq: *mut IbvCq,
    num_entries: c_int,
    wc: *mut IbvWc,
) -> c_int {
    // SAFETY: the caller passes a CQ it created.
    let Some((ctx, handle)) = (unsafe { cq_parts(cq) }) else { return -1 };
    let Ok(max) = usize::try_from(num_entries) else { return -1 };
    if max == 0 || wc.is_null() {
        return 0;
    }
    SCRATCH.with_borrow_mut(|got| {
        got.clear();
        let n = ctx.net.poll_cq_with(Some(handle), |s| s.engine().poll_cq(handle, max, got));
        for (i, w) in got.iter().enumerate() {
            // SAFETY: the caller's array holds `num_entries` >= n entries.
            unsafe { wc.wrapping_add(i).write(wc_of(w)) };
        }
        c_int::try_from(n).unwrap_or(c_int::MAX)
    })
}

pub(super) unsafe extern "C" fn req_notify_cq(cq: *mut IbvCq, solicited_only: c_int) -> c_int {
    // SAFETY: the caller passes a CQ it created.
    let Some((ctx, handle)) = (unsafe { cq_parts(cq) }) else { return libc::EINVAL };
    if ctx.net.req_notify_cq(handle, solicited_only != 0) { 0 } else { libc::EINVAL }
}

/// Whether `fd` is in non-blocking mode (then waiting verbs return `EAGAIN`).
pub(crate) fn nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL reads the file status flags; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_get_cq_event(
    channel: *mut IbvCompChannel,
    cq_out: *mut *mut IbvCq,
    cq_context_out: *mut *mut c_void,
) -> c_int {
    let Some(ch) = CompChannel::from_c(channel) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if cq_out.is_null() || cq_context_out.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: a live channel (the caller's contract); a reference to its private part.
    let chan = unsafe { &(*ch).channel };
    // SAFETY: as above.
    let nonblocking_seen = unsafe { &(*ch).nonblocking_seen };
    // SAFETY: as above; reads a plain field.
    let fd = unsafe { (*ch).ibv.fd };
    // The descriptor's mode, noted for the next call.
    let nonblocking_now = || {
        let now = nonblocking(fd);
        nonblocking_seen.store(now, Ordering::Relaxed);
        now
    };
    // SAFETY: as above.
    let context = unsafe { (*ch).ibv.context };
    // SAFETY: a channel's context outlives it.
    let Some(ctx) = (unsafe { ctx_of(context) }) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    loop {
        // An event already there is returned in either mode, without asking which.
        // The mode is asked (a system call) before spinning only if it was non-blocking last
        // time; a channel that turned non-blocking since is found so after one spin, which
        // an event may end, as it may end any call. A blocking wait asks before it sleeps.
        let got = if let Some(h) = chan.try_get() {
            h
        } else if nonblocking_seen.load(Ordering::Relaxed) && nonblocking_now() {
            set_errno(libc::EAGAIN);
            return -1;
        } else if let Some(h) = ctx.net.spin_for_event(chan) {
            h
        } else if nonblocking_now() {
            set_errno(libc::EAGAIN);
            return -1;
        } else {
            ctx.net.end_busy_poll();
            match chan.get(None) {
                Ok(Some(h)) => h,
                Ok(None) => continue,
                Err(e) => {
                    set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                    return -1;
                }
            }
        };
        // An event of a CQ destroyed meanwhile is dropped, as the kernel does. One returned
        // is counted under the same lock the destroy takes, so the destroy waits for its ack.
        let objects = lock(&ctx.objects);
        let Some(&cq) = objects.cqs.get(&got) else { continue };
        let cq = cq as *mut Cq;
        // SAFETY: registered CQs are live; the counter is atomic.
        unsafe { (*cq).events_reported.fetch_add(1, Ordering::AcqRel) };
        drop(objects);
        // SAFETY: registered CQs are live; reads one plain field.
        let cq_context = unsafe { (*cq).ibv.cq.cq_context };
        // SAFETY: the caller passes room for both pointers (checked non-NULL).
        unsafe { cq_out.write(cq.wrapping_byte_add(Cq::OFFSET).cast()) };
        // SAFETY: as above.
        unsafe { cq_context_out.write(cq_context) };
        return 0;
    }
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_ack_cq_events(cq: *mut IbvCq, nevents: c_uint) {
    if cq.is_null() {
        return;
    }
    let field = cq.wrapping_byte_add(offset_of!(IbvCq, comp_events_completed)).cast::<u32>();
    // SAFETY: a live CQ (the caller's contract); the counter is only accessed atomically.
    unsafe { acknowledge(field, nevents) };
}
