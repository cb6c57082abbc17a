//! The extended CQ (`ibv_create_cq_ex(3)`): polling one completion at a time with
//! `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll` and reading its fields with
//! `ibv_wc_read_*`, completion timestamps on the device clock and the wall clock, and
//! `ibv_query_rt_values_ex(3)`, the device clock now.
//!
//! Every CQ of this library is a `struct ibv_cq_ex` (see [`Cq`]), so the legacy verbs work on
//! an extended CQ through `ibv_cq_ex_to_cq` and the extended poll sees the same queue.

use super::*;

/// The device clock's frequency in kHz (`hca_core_clock`): completion timestamps and
/// `raw_clock` are nanoseconds.
pub(super) const DEVICE_CLOCK_KHZ: u64 = 1_000_000;

/// The `wc_flags` an extended CQ can report: the standard fields, both timestamps and
/// tag-matching information. A customer VLAN (`CVLAN`) and a flow tag belong to raw-packet
/// QPs and flow steering, which uroce does not have.
const SUPPORTED_WC_FLAGS: u64 = IBV_WC_STANDARD_FLAGS
    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK
    | IBV_WC_EX_WITH_TM_INFO;

/// The poll in progress on a CQ: the completion `ibv_start_poll` or `ibv_next_poll` loaded,
/// which the `ibv_wc_read_*` functions read until `ibv_end_poll`.
pub(super) struct PollState {
    /// The current completion.
    current: Mutex<Option<WorkCompletion>>,
    /// Held from a successful `ibv_start_poll` to `ibv_end_poll` when `locked`: one thread
    /// polls at a time, as a provider's CQ lock makes it (ibv_create_cq_ex(3)).
    busy: AtomicBool,
    locked: bool,
}

impl PollState {
    pub(super) fn new(locked: bool) -> Self {
        Self { current: Mutex::new(None), busy: AtomicBool::new(false), locked }
    }

    fn enter(&self) {
        if !self.locked {
            return;
        }
        while self
            .busy
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
    }

    fn leave(&self) {
        if self.locked {
            self.busy.store(false, Ordering::Release);
        }
    }
}

/// The `struct ibv_cq_ex` of a new CQ: `cq`, and the extended poll.
pub(super) fn extended_cq(cq: IbvCq) -> IbvCqEx {
    IbvCqEx {
        cq,
        comp_mask: 0,
        status: 0,
        wr_id: 0,
        start_poll: Some(start_poll),
        next_poll: Some(next_poll),
        end_poll: Some(end_poll),
        read_opcode: Some(read_opcode),
        read_vendor_err: Some(read_vendor_err),
        read_byte_len: Some(read_byte_len),
        read_imm_data: Some(read_imm_data),
        read_qp_num: Some(read_qp_num),
        read_src_qp: Some(read_src_qp),
        read_wc_flags: Some(read_wc_flags),
        read_slid: Some(read_slid),
        read_sl: Some(read_sl),
        read_dlid_path_bits: Some(read_dlid_path_bits),
        read_completion_ts: Some(read_completion_ts),
        read_cvlan: None,
        read_flow_tag: None,
        read_tm_info: Some(read_tm_info),
        read_completion_wallclock_ns: Some(read_completion_wallclock_ns),
    }
}

/// `verbs_context.create_cq_ex` (`ibv_create_cq_ex(3)`).
///
/// Refused as a device refuses: EINVAL for a size out of range, a `comp_vector` the context
/// lacks, unknown `comp_mask` or `flags` bits; EOPNOTSUPP for what uroce lacks — `wc_flags`
/// beyond [`SUPPORTED_WC_FLAGS`], a parent domain (`IBV_CQ_INIT_ATTR_MASK_PD`), and
/// `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN` (an overrun is always reported as `IBV_EVENT_CQ_ERR`).
pub(super) unsafe extern "C" fn create_cq_ex(
    context: *mut IbvContext,
    attr: *mut IbvCqInitAttrEx,
) -> *mut IbvCqEx {
    const VERB: &str = "ibv_create_cq_ex";
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller passes a valid struct ibv_cq_init_attr_ex (checked non-NULL).
    let a = unsafe { attr.read() };
    let known_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;
    if a.comp_mask & !known_mask != 0 {
        let why = format_args!("unknown comp_mask bits {:#x}", a.comp_mask & !known_mask);
        return fail(refuse(VERB, why, libc::EINVAL));
    }
    // IBV_CQ_INIT_ATTR_MASK_PD: the CQ belongs to a parent domain (ibv_create_cq_ex(3)),
    // which must be one, of this context.
    let parent_domain = if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 {
        // SAFETY: NULL or a live PD of this library (the caller's contract).
        let ok = unsafe { is_parent_domain(a.parent_domain) }
            && unsafe { (*a.parent_domain).context } == context;
        if !ok {
            return fail(refuse(
                VERB,
                "parent_domain is not a parent domain of this context",
                libc::EINVAL,
            ));
        }
        a.parent_domain
    } else {
        null_mut()
    };
    let flags = if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 { a.flags } else { 0 };
    let known_flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
    if flags & !known_flags != 0 {
        let why = format_args!("unknown flags {:#x}", flags & !known_flags);
        return fail(refuse(VERB, why, libc::EINVAL));
    }
    if flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN != 0 {
        let why = "IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN: an overrun is always reported";
        return fail(refuse(VERB, why, libc::EOPNOTSUPP));
    }
    if a.wc_flags & !SUPPORTED_WC_FLAGS != 0 {
        let why =
            format_args!("wc_flags {:#x}: no CVLAN or flow tag", a.wc_flags & !SUPPORTED_WC_FLAGS);
        return fail(refuse(VERB, why, libc::EOPNOTSUPP));
    }
    let spec = CqSpec {
        cqe: a.cqe,
        cq_context: a.cq_context,
        channel: a.channel,
        comp_vector: a.comp_vector,
        locked: flags & IBV_CREATE_CQ_ATTR_SINGLE_THREADED == 0,
        parent_domain,
    };
    // SAFETY: the caller passes a context it opened and, if not NULL, a channel of it.
    match unsafe { create(context, &spec) } {
        Ok(cq) => cq,
        Err((errno, why)) => fail(refuse(VERB, why, errno)),
    }
}

/// The parts of an extended CQ a poll uses.
///
/// # Safety
///
/// `cq` is NULL or a live CQ of this library.
unsafe fn parts<'a>(cq: *mut IbvCqEx) -> Option<(&'a Context, CqHandle, &'a PollState)> {
    // SAFETY: the caller's contract; an extended CQ is a CQ.
    let (ctx, handle) = unsafe { cq_parts(cq.cast()) }?;
    let object = Cq::from_c(cq.cast())?;
    // SAFETY: a live Cq (the caller's contract); a reference to its private poll state only,
    // which nothing writes but through its own synchronization.
    Some((ctx, handle, unsafe { &(*object).poll }))
}

/// Makes `wc` the current completion: `status` and `wr_id` in the public structure, the rest
/// for the readers.
///
/// # Safety
///
/// `cq` is a live CQ of this library, polled by the calling thread.
unsafe fn load(cq: *mut IbvCqEx, poll: &PollState, wc: WorkCompletion) {
    // SAFETY: the caller's contract; the two public fields are the poller's to write between
    // start and end of a poll.
    unsafe { (*cq).status = c_int::try_from(wc.status.0).unwrap_or(c_int::MAX) };
    // SAFETY: as above.
    unsafe { (*cq).wr_id = wc.wr_id };
    *lock(&poll.current) = Some(wc);
}

/// `ibv_start_poll(3)`: a round of progress, then the oldest completion, or ENOENT (the poll
/// has not started and takes no `ibv_end_poll`). EINVAL for a `comp_mask` (none is defined).
unsafe extern "C" fn start_poll(cq: *mut IbvCqEx, attr: *mut IbvPollCqAttr) -> c_int {
    // SAFETY: NULL or the caller's attributes.
    if unsafe { attr.as_ref() }.is_some_and(|a| a.comp_mask != 0) {
        return libc::EINVAL;
    }
    // SAFETY: the caller passes a CQ it created.
    let Some((ctx, handle, poll)) = (unsafe { parts(cq) }) else { return libc::EINVAL };
    poll.enter();
    let polled = poll_one(|got| {
        ctx.net.poll_cq_with(Some(handle), |s| s.engine().poll_cq(handle, 1, got));
    });
    let Some(wc) = polled else {
        poll.leave();
        return libc::ENOENT;
    };
    // SAFETY: a live CQ; this thread holds the poll.
    unsafe { load(cq, poll, wc) };
    0
}

/// `ibv_next_poll(3)`: the next completion already in the queue, or ENOENT.
unsafe extern "C" fn next_poll(cq: *mut IbvCqEx) -> c_int {
    // SAFETY: the caller passes a CQ it started polling.
    let Some((ctx, handle, poll)) = (unsafe { parts(cq) }) else { return libc::EINVAL };
    let polled = poll_one(|got| {
        ctx.net.with(|s| s.engine().poll_cq(handle, 1, got));
    });
    let Some(wc) = polled else { return libc::ENOENT };
    // SAFETY: a live CQ; this thread holds the poll.
    unsafe { load(cq, poll, wc) };
    0
}

/// `ibv_end_poll(3)`: the poll is over; the CQ is free for the next.
unsafe extern "C" fn end_poll(cq: *mut IbvCqEx) {
    // SAFETY: the caller passes a CQ it started polling.
    if let Some((_, _, poll)) = unsafe { parts(cq) } {
        *lock(&poll.current) = None;
        poll.leave();
    }
}

/// Reads a field of the current completion (0 when there is none, as after a misuse).
///
/// # Safety
///
/// `cq` is NULL or a live CQ of this library.
unsafe fn read<T: Default>(cq: *mut IbvCqEx, f: impl FnOnce(&Context, &WorkCompletion) -> T) -> T {
    // SAFETY: the caller's contract.
    let Some((ctx, _, poll)) = (unsafe { parts(cq) }) else { return T::default() };
    lock(&poll.current).as_ref().map_or_else(T::default, |w| f(ctx, w))
}

unsafe extern "C" fn read_opcode(cq: *mut IbvCqEx) -> c_int {
    // SAFETY: the caller passes a CQ it is polling.
    unsafe { read(cq, |_, w| wc_opcode(w)) }
}

unsafe extern "C" fn read_vendor_err(_cq: *mut IbvCqEx) -> u32 {
    0
}

unsafe extern "C" fn read_byte_len(cq: *mut IbvCqEx) -> u32 {
    // SAFETY: the caller passes a CQ it is polling.
    unsafe { read(cq, |_, w| w.byte_len) }
}

/// The immediate data (`__be32`: the wire bytes, in memory order), or the invalidated key
/// (`ibv_wc_read_invalidated_rkey` reads through this).
unsafe extern "C" fn read_imm_data(cq: *mut IbvCqEx) -> u32 {
    // SAFETY: the caller passes a CQ it is polling.
    unsafe { read(cq, |_, w| imm_or_invalidated(w)) }
}

unsafe extern "C" fn read_qp_num(cq: *mut IbvCqEx) -> u32 {
    // SAFETY: the caller passes a CQ it is polling.
    unsafe { read(cq, |_, w| w.qp_num.get()) }
}

unsafe extern "C" fn read_src_qp(cq: *mut IbvCqEx) -> u32 {
    // SAFETY: the caller passes a CQ it is polling.
    unsafe { read(cq, |_, w| w.src_qp.get()) }
}

unsafe extern "C" fn read_wc_flags(cq: *mut IbvCqEx) -> c_uint {
    // SAFETY: the caller passes a CQ it is polling.
    unsafe { read(cq, |_, w| wc_flags(w)) }
}

/// RoCE has no LIDs: 0, as `ibv_poll_cq` reports.
unsafe extern "C" fn read_slid(_cq: *mut IbvCqEx) -> u32 {
    0
}

unsafe extern "C" fn read_sl(cq: *mut IbvCqEx) -> u8 {
    // SAFETY: the caller passes a CQ it is polling.
    unsafe { read(cq, |_, w| ud_sl(w)) }
}

unsafe extern "C" fn read_dlid_path_bits(_cq: *mut IbvCqEx) -> u8 {
    0
}

/// The tag and application context of the message a TM-SRQ matched (both 0 for any other
/// completion), as `ibv_wc_read_tm_info(3)` reads them.
unsafe extern "C" fn read_tm_info(cq: *mut IbvCqEx, info: *mut IbvWcTmInfo) {
    // SAFETY: the caller passes a CQ it is polling.
    let tm = unsafe { read(cq, |_, w| w.tm.unwrap_or_default()) };
    // SAFETY: NULL or the caller's room for a struct ibv_wc_tm_info.
    if let Some(out) = unsafe { info.as_mut() } {
        *out = IbvWcTmInfo { tag: tm.tag, priv_: tm.app_ctx };
    }
}

/// When the completion entered the CQ, in device-clock ticks ([`DEVICE_CLOCK_KHZ`]).
unsafe extern "C" fn read_completion_ts(cq: *mut IbvCqEx) -> u64 {
    // SAFETY: the caller passes a CQ it is polling.
    unsafe { read(cq, |_, w| w.timestamp.as_nanos()) }
}

/// The same instant in nanoseconds since the Unix epoch.
unsafe extern "C" fn read_completion_wallclock_ns(cq: *mut IbvCqEx) -> u64 {
    // SAFETY: the caller passes a CQ it is polling.
    unsafe { read(cq, |ctx, w| ctx.net.wall_clock_ns(w.timestamp)) }
}

/// `verbs_context.query_rt_values` (`ibv_query_rt_values_ex(3)`): the device clock now
/// (`IBV_VALUES_MASK_RAW_CLOCK`), the clock completion timestamps are on. `comp_mask` comes
/// back with the values filled in.
pub(super) unsafe extern "C" fn query_rt_values(
    context: *mut IbvContext,
    values: *mut IbvValuesEx,
) -> c_int {
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return libc::EINVAL };
    // SAFETY: NULL or the caller's structure.
    let Some(v) = (unsafe { values.as_mut() }) else { return libc::EINVAL };
    let mut filled = 0;
    if v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK != 0 {
        let ns = ctx.net.clock().as_nanos();
        v.raw_clock.tv_sec =
            libc::time_t::try_from(ns / 1_000_000_000).unwrap_or(libc::time_t::MAX);
        v.raw_clock.tv_nsec = libc::c_long::try_from(ns % 1_000_000_000).unwrap_or(0);
        filled |= IBV_VALUES_MASK_RAW_CLOCK;
    }
    v.comp_mask = filled;
    0
}
