//! Contexts (`ibv_open_device`) and the queries of a device, its port, GIDs and P_Keys.

use super::*;

/// An open device (`ibv_open_device`).
#[repr(C)]
pub(crate) struct Context {
    pub(super) vctx: VerbsContext,
    pub(super) dev: &'static Device,
    pub(crate) net: Arc<NetDevice>,
    pub(super) async_fd: Arc<EventFd>,
    pub(super) objects: Arc<Mutex<Objects>>,
    /// This context's share of the device's asynchronous events: those of its objects.
    pub(super) events: Arc<Subscription>,
    /// Device memory this context holds (`ibv_alloc_dm`), in bytes.
    pub(super) dm_in_use: AtomicU64,
    /// `cmd_fd`: the context's own file, as a kernel device's uverbs file is; a duplicate of
    /// it imports the context (`ibv_import_device(3)`), in this process.
    pub(super) cmd: std::fs::File,
}

/// The C objects of a context by engine handle: what completion and asynchronous events name.
#[derive(Default)]
pub(super) struct Objects {
    pub(super) cqs: HashMap<CqHandle, usize>,
    pub(super) qps: HashMap<Qpn, usize>,
    pub(super) srqs: HashMap<SrqHandle, usize>,
    /// XRC domains opened by a file, by the file's (device, inode): one domain per file.
    pub(super) xrcds_by_file: HashMap<(u64, u64), usize>,
    /// XRC target QPs with the number of handles to each (`ibv_create_qp_ex` and every
    /// `ibv_open_qp`).
    pub(super) target_opens: HashMap<Qpn, usize>,
    /// Device memory by its handle (`ibv_import_dm(3)` finds it by that).
    pub(super) dms: HashMap<u32, usize>,
    /// The next device memory's handle.
    pub(super) next_dm: u32,
}

impl Objects {
    /// Whether the object an event is about is one of these.
    pub(super) fn owns(&self, e: &AsyncEvent) -> bool {
        self.object(e).is_some()
    }

    /// The C object an event is about and the event's `enum ibv_event_type`, the event counted
    /// as returned for that object, whose destroy then waits for its acknowledgement (`ack`);
    /// `None` for an object destroyed since the event was queued. Called with the lock held
    /// that the destroy takes to leave `Objects`.
    pub(super) fn report(&self, e: &AsyncEvent) -> Option<(usize, c_int)> {
        let (element, kind, reported) = self.object(e)?;
        reported.fetch_add(1, Ordering::AcqRel);
        Some((element, kind))
    }

    /// The C object an event is about, the event's `enum ibv_event_type` and the object's
    /// count of events returned.
    fn object(&self, e: &AsyncEvent) -> Option<(usize, c_int, &AtomicU32)> {
        let qp = |q: &Qpn| {
            let &p = self.qps.get(q)?;
            // SAFETY: registered QPs are live: a destroy leaves `qps` before it frees.
            Some((p, unsafe { &(*Qp::from_c(p as *mut IbvQp)?).inner.async_events_reported }))
        };
        let cq = |c: &CqHandle| {
            let &p = self.cqs.get(c)?;
            // SAFETY: as above, for `cqs`.
            Some((p, unsafe { &(*Cq::from_c(p as *mut IbvCq)?).async_events_reported }))
        };
        let srq = |h: &SrqHandle| {
            let &p = self.srqs.get(h)?;
            // SAFETY: as above, for `srqs`.
            Some((p, unsafe { &(*Srq::from_c(p as *mut IbvSrq)?).async_events_reported }))
        };
        let ((element, reported), kind) = match e {
            AsyncEvent::QpFatal(q) => (qp(q)?, IBV_EVENT_QP_FATAL),
            AsyncEvent::QpAccessError(q) => (qp(q)?, IBV_EVENT_QP_ACCESS_ERR),
            AsyncEvent::CommEstablished(q) => (qp(q)?, IBV_EVENT_COMM_EST),
            AsyncEvent::LastWqeReached(q) => (qp(q)?, IBV_EVENT_QP_LAST_WQE_REACHED),
            AsyncEvent::CqError(c) => (cq(c)?, IBV_EVENT_CQ_ERR),
            AsyncEvent::SrqLimitReached(h) => (srq(h)?, IBV_EVENT_SRQ_LIMIT_REACHED),
        };
        Some((element, kind, reported))
    }
}

/// The context of an `ibv_context` pointer.
///
/// # Safety
///
/// `p` is NULL or a context this library opened and has not closed.
pub(crate) unsafe fn ctx_of<'a>(p: *mut IbvContext) -> Option<&'a Context> {
    // SAFETY: every ibv_context this library hands out is the `vctx.context` of a live boxed
    // Context (the caller's contract); nothing writes a context after it is opened.
    Context::from_c(p).map(|c| unsafe { &*c })
}

/// A context's share of the device's asynchronous events: unsubscribed when the last context
/// holding it closes (an imported context shares its original's, as the kernel gives one
/// event file per command file).
pub(super) struct Subscription {
    net: Arc<NetDevice>,
    pub(super) id: SubscriberId,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.net.with(|s| s.unsubscribe_async(self.id));
    }
}

/// What a context shares with the contexts imported from it (`ibv_import_device(3)`): the
/// device, its objects and its events.
pub(super) struct Shared {
    pub(super) net: Arc<NetDevice>,
    pub(super) async_fd: Arc<EventFd>,
    pub(super) objects: Arc<Mutex<Objects>>,
    pub(super) events: Arc<Subscription>,
}

/// The live contexts by their command file, (device, inode): what `ibv_import_device` finds
/// a duplicated `cmd_fd` by.
static COMMAND_FILES: Mutex<Vec<((u64, u64), usize)>> = Mutex::new(Vec::new());

/// The (device, inode) of the file open as `fd`: what names a command file or an XRC
/// domain's file.
pub(super) fn file_id(fd: c_int) -> std::io::Result<(u64, u64)> {
    // SAFETY: all zeroes is a valid `struct stat` (integers).
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: fstat(2) writes the local `st`; the descriptor is only looked at.
    if unsafe { libc::fstat(fd, &raw mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((st.st_dev, st.st_ino))
}

/// The context whose command file `fd` is open on, if one lives.
pub(super) fn context_of_file(fd: c_int) -> Option<*mut IbvContext> {
    let id = file_id(fd).ok()?;
    lock(&COMMAND_FILES).iter().find(|(f, _)| *f == id).map(|&(_, c)| c as *mut IbvContext)
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_open_device(device: *mut IbvDevice) -> *mut IbvContext {
    let Some(dev) = device_of(device) else { return fail(libc::ENODEV) };
    let net = match open_net(dev.addr) {
        Ok(n) => n,
        Err(e) => return fail(e),
    };
    let async_fd = match EventFd::new_blocking() {
        Ok(fd) => Arc::new(fd),
        Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EMFILE)),
    };
    // The command file: a memfd, an inode of its own, by which a duplicate of `cmd_fd` finds
    // this context again (ibv_import_device(3)).
    // SAFETY: memfd_create(2) with a NUL-terminated name; the descriptor is owned below.
    let fd = unsafe { libc::memfd_create(c"uroce-context".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return fail(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EMFILE));
    }
    // SAFETY: a descriptor just opened, owned by nothing else.
    let cmd = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // Several contexts may share one device: each takes the events of its own objects.
    let objects = Arc::new(Mutex::new(Objects::default()));
    let mine = Arc::clone(&objects);
    let wants = Box::new(move |e: &AsyncEvent| lock(&mine).owns(e));
    let id = net.with(|s| s.subscribe_async(Arc::clone(&async_fd), wants));
    let events = Arc::new(Subscription { net: Arc::clone(&net), id });
    // SAFETY: `device` is a device of this library's list (checked above).
    unsafe { new_context(device, dev, Shared { net, async_fd, objects, events }, cmd) }
}

/// A context on `device` with what it shares and its command file.
///
/// # Safety
///
/// `device` is a device of this library's list and `dev` its description.
pub(super) unsafe fn new_context(
    device: *mut IbvDevice,
    dev: &'static Device,
    shared: Shared,
    cmd: std::fs::File,
) -> *mut IbvContext {
    let ops = IbvContextOps {
        compat_query_device: None,
        compat_query_port: None,
        compat_1: [None; 5],
        alloc_mw: Some(alloc_mw),
        bind_mw: Some(bind_mw),
        dealloc_mw: Some(dealloc_mw),
        compat_create_cq: None,
        poll_cq: Some(poll_cq),
        req_notify_cq: Some(req_notify_cq),
        compat_2: [None; 7],
        post_srq_recv: Some(post_srq_recv),
        compat_3: [None; 4],
        post_send: Some(post_send),
        post_recv: Some(post_recv),
        compat_4: [None; 5],
    };
    let ctx = Box::new(Context {
        vctx: VerbsContext {
            query_port: Some(query_port_ex),
            advise_mr: Some(advise_mr),
            unset_before_reg_dm_mr: [None; 5],
            reg_dm_mr: Some(reg_dm_mr),
            alloc_dm: Some(alloc_dm),
            free_dm: Some(free_dm),
            unset_before_alloc_parent_domain: [None; 4],
            alloc_parent_domain: Some(alloc_parent_domain),
            dealloc_td: Some(dealloc_td),
            alloc_td: Some(alloc_td),
            modify_cq: None,
            post_srq_ops: Some(post_srq_ops),
            unset_before_query_rt_values: [None; 5],
            query_rt_values: Some(query_rt_values),
            create_cq_ex: Some(create_cq_ex),
            priv_: None,
            query_device_ex: Some(query_device_ex),
            unset_before_open_qp: [None; 4],
            open_qp: Some(open_qp),
            create_qp_ex: Some(create_qp_ex),
            get_srq_num: Some(get_srq_num),
            create_srq_ex: Some(create_srq_ex),
            open_xrcd: Some(open_xrcd),
            close_xrcd: Some(close_xrcd),
            abi_placeholder3: None,
            sz: size_of::<VerbsContext>(),
            context: IbvContext {
                device,
                ops,
                cmd_fd: cmd.as_raw_fd(),
                async_fd: shared.async_fd.as_raw_fd(),
                num_comp_vectors: 1,
                mutex: [0; 5],
                abi_compat: VERBS_ABI_IS_EXTENDED,
            },
        },
        dev,
        net: shared.net,
        async_fd: shared.async_fd,
        objects: shared.objects,
        events: shared.events,
        dm_in_use: AtomicU64::new(0),
        cmd,
    });
    let raw = ctx.into_c();
    if let Ok(id) = file_id(raw_cmd_fd(raw)) {
        lock(&COMMAND_FILES).push((id, raw as usize));
    }
    raw
}

/// A context's `cmd_fd`.
fn raw_cmd_fd(context: *mut IbvContext) -> c_int {
    // SAFETY: a context this library just made; a plain field.
    unsafe { (*context).cmd_fd }
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_close_device(context: *mut IbvContext) -> c_int {
    if Context::from_c(context).is_none() {
        return libc::EINVAL;
    }
    lock(&COMMAND_FILES).retain(|&(_, c)| c != context as usize);
    // SAFETY: made by `ibv_open_device` or `ibv_import_device`; closing it is the caller's
    // last use (ibv_close_device(3)). Its share of the events goes with the last holder.
    drop(unsafe { Context::take(context) });
    0
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_query_device(
    context: *mut IbvContext,
    attr: *mut IbvDeviceAttr,
) -> c_int {
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return libc::EINVAL };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller passes room for a struct ibv_device_attr (checked non-NULL).
    unsafe { attr.write(device_attr(ctx)) };
    0
}

/// `verbs_context.query_device_ex` (`ibv_query_device_ex(3)`): the legacy attributes and the
/// extended ones, as far as `attr_size` (the caller's `sizeof(struct ibv_device_attr_ex)`,
/// which an older header makes smaller) reaches. Every extended capability uroce lacks reads
/// 0: TSO, RSS, packet pacing and tag matching.
pub(super) unsafe extern "C" fn query_device_ex(
    context: *mut IbvContext,
    input: *const IbvQueryDeviceExInput,
    attr: *mut IbvDeviceAttrEx,
    attr_size: usize,
) -> c_int {
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return libc::EINVAL };
    // SAFETY: NULL or the caller's input.
    if unsafe { input.as_ref() }.is_some_and(|i| i.comp_mask != 0) {
        return libc::EINVAL;
    }
    if attr.is_null() || attr_size < size_of::<IbvDeviceAttr>() {
        return libc::EINVAL;
    }
    let orig_attr = device_attr(ctx);
    let out = IbvDeviceAttrEx {
        device_cap_flags_ex: u64::from(orig_attr.device_cap_flags),
        phys_port_cnt_ex: u32::from(orig_attr.phys_port_cnt),
        orig_attr,
        comp_mask: 0,
        odp_caps: odp_caps(),
        // Completion timestamps are device-clock nanoseconds (`NetDevice::clock`): a 64-bit
        // counter at 1 GHz, `hca_core_clock` being in kHz (ibv_query_device_ex(3)).
        completion_timestamp_mask: u64::MAX,
        hca_core_clock: DEVICE_CLOCK_KHZ,
        tso_caps: IbvTsoCaps::default(),
        rss_caps: IbvRssCaps::default(),
        max_wq_type_rq: 0,
        packet_pacing_caps: IbvPacketPacingCaps::default(),
        raw_packet_caps: 0,
        tm_caps: tm_caps(),
        cq_mod_caps: IbvCqModerationCaps::default(),
        max_dm_size: MAX_DM_SIZE,
        pci_atomic_caps: IbvPciAtomicCaps::default(),
        xrc_odp_caps: odp_caps().per_transport_caps.rc_odp_caps,
    };
    let n = attr_size.min(size_of::<IbvDeviceAttrEx>());
    // SAFETY: the caller passes `attr_size` writable bytes at `attr` (checked non-NULL);
    // `out` is a local of at least `n` bytes; they cannot overlap.
    unsafe { ptr::copy_nonoverlapping((&raw const out).cast::<u8>(), attr.cast::<u8>(), n) };
    0
}

/// On-demand paging (`ibv_query_device_ex(3)`): a software device never pins memory, so every
/// region can be on-demand, implicit ones included, for every operation of every transport
/// it has: an access to a page that is not there is a protection error (the guarded copies),
/// never a fault that kills the process. XRC's are RC's (`xrc_odp_caps`).
fn odp_caps() -> IbvOdpCaps {
    let messages = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV;
    IbvOdpCaps {
        general_caps: IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT,
        per_transport_caps: IbvOdpTransportCaps {
            rc_odp_caps: messages
                | IBV_ODP_SUPPORT_WRITE
                | IBV_ODP_SUPPORT_READ
                | IBV_ODP_SUPPORT_ATOMIC
                | IBV_ODP_SUPPORT_SRQ_RECV,
            uc_odp_caps: messages | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_SRQ_RECV,
            ud_odp_caps: messages | IBV_ODP_SUPPORT_SRQ_RECV,
        },
    }
}

/// The device's attributes as `ibv_query_device(3)` reports them.
pub(super) fn device_attr(ctx: &Context) -> IbvDeviceAttr {
    let a = DEVICE_ATTR;
    let int = |v: u32| c_int::try_from(v).unwrap_or(c_int::MAX);
    let rd_atom = c_int::from(a.max_qp_rd_atom);
    IbvDeviceAttr {
        fw_ver: c_string(concat!("uroce ", env!("CARGO_PKG_VERSION"))),
        node_guid: ctx.dev.guid_be,
        sys_image_guid: ctx.dev.guid_be,
        max_mr_size: uroce_net::mappings::MAX_REGION,
        page_size_cap: 4096,
        // Vendor 0xFFFFFF (none assigned) and part 0: tools that pick fast paths by vendor
        // (perftest) use the standard verbs.
        vendor_id: 0x00FF_FFFF,
        vendor_part_id: 0,
        hw_ver: 0,
        max_qp: int(a.max_qp),
        max_qp_wr: int(a.max_qp_wr),
        // IBA 10.6.7: memory windows of type 1 and 2B.
        device_cap_flags: IBV_DEVICE_SYS_IMAGE_GUID
            | IBV_DEVICE_RC_RNR_NAK_GEN
            | IBV_DEVICE_MEM_WINDOW
            | IBV_DEVICE_MEM_WINDOW_TYPE_2B
            | IBV_DEVICE_XRC,
        max_sge: int(a.max_sge),
        max_sge_rd: int(a.max_sge),
        max_cq: int(a.max_qp),
        max_cqe: int(a.max_cqe),
        max_mr: int(a.max_mr),
        max_pd: int(a.max_qp),
        max_qp_rd_atom: rd_atom,
        max_ee_rd_atom: 0,
        max_res_rd_atom: rd_atom.saturating_mul(int(a.max_qp)),
        max_qp_init_rd_atom: rd_atom,
        max_ee_init_rd_atom: 0,
        atomic_cap: IBV_ATOMIC_HCA,
        max_ee: 0,
        max_rdd: 0,
        max_mw: int(a.max_mw),
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: int(a.max_mcast_grp),
        max_mcast_qp_attach: int(a.max_mcast_qp_attach),
        max_total_mcast_qp_attach: int(a.max_total_mcast_qp_attach),
        max_ah: int(a.max_ah),
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: int(a.max_qp),
        max_srq_wr: int(a.max_qp_wr),
        max_srq_sge: int(a.max_sge),
        max_pkeys: 1,
        local_ca_ack_delay: 15,
        phys_port_cnt: 1,
    }
}

/// Port 1 as `ibv_query_port(3)` describes it.
pub(super) fn port_attr(ctx: &Context) -> IbvPortAttr {
    let mtu = ctx.net.with(|s| s.engine().port_mtu());
    IbvPortAttr {
        state: IBV_PORT_ACTIVE,
        max_mtu: IBV_MTU_4096,
        active_mtu: mtu_enum(mtu),
        gid_tbl_len: c_int::try_from(DEVICE_ATTR.gid_tbl_len).unwrap_or(c_int::MAX),
        port_cap_flags: 0,
        max_msg_sz: DEVICE_ATTR.max_msg_sz,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: 1,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        // 1X QDR (10 Gbit/s): near what one uroce QP moves over loopback; a software device
        // has no link speed of its own.
        active_width: ACTIVE_WIDTH_1X,
        active_speed: ACTIVE_SPEED_QDR,
        phys_state: PHYS_STATE_LINK_UP,
        link_layer: IBV_LINK_LAYER_ETHERNET,
        flags: IBV_QPF_GRH_REQUIRED,
        port_cap_flags2: 0,
    }
}

/// `enum ibv_mtu` of an MTU: its IBA code.
pub(super) fn mtu_enum(m: Mtu) -> c_int {
    c_int::from(m.code())
}

/// The MTU of an `enum ibv_mtu` value, if it is one.
pub(super) fn mtu_from_enum(m: c_int) -> Option<Mtu> {
    u8::try_from(m).ok().and_then(Mtu::from_code)
}

/// `verbs_context.query_port`: what the header's `ibv_query_port` calls, with the caller's
/// structure size (newer callers have `port_cap_flags2`).
pub(super) unsafe extern "C" fn query_port_ex(
    context: *mut IbvContext,
    port: u8,
    attr: *mut IbvPortAttr,
    len: usize,
) -> c_int {
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return libc::EINVAL };
    if port != 1 || attr.is_null() {
        return libc::EINVAL;
    }
    let a = port_attr(ctx);
    let n = len.min(size_of::<IbvPortAttr>());
    // SAFETY: the caller's buffer holds `len` bytes (at least `n`); `a` is a separate local.
    unsafe { ptr::copy_nonoverlapping(ptr::from_ref(&a).cast::<u8>(), attr.cast::<u8>(), n) };
    0
}

/// `ibv_query_port@IBVERBS_1.1`: the caller's structure is the 48-byte
/// `_compat_ibv_port_attr`; writing `port_cap_flags2` would run past it.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_query_port(
    context: *mut IbvContext,
    port: u8,
    attr: *mut IbvPortAttr,
) -> c_int {
    // SAFETY: same contract as the extended verb, with the compat size.
    unsafe { query_port_ex(context, port, attr, COMPAT_PORT_ATTR_SIZE) }
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_query_gid(
    context: *mut IbvContext,
    port: u8,
    index: c_int,
    gid: *mut IbvGid,
) -> c_int {
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return -1 };
    if port != 1 || !in_gid_table(index) || gid.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // ibv_query_gid(3): an empty entry reads as the zero GID, as the kernel's sysfs shows it.
    let value = if index == 0 { gid_of(ctx.dev.addr) } else { IbvGid { raw: [0; 16] } };
    // SAFETY: the caller passes room for a union ibv_gid.
    unsafe { gid.write(value) };
    0
}

/// Whether `index` is an entry of the port's GID table (populated or not).
fn in_gid_table(index: impl TryInto<u32>) -> bool {
    index.try_into().is_ok_and(|i| i < DEVICE_ATTR.gid_tbl_len)
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_query_gid_type(
    context: *mut IbvContext,
    port: u8,
    index: c_uint,
    gid_type: *mut c_int,
) -> c_int {
    if context.is_null() || port != 1 || index != 0 || gid_type.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller passes room for the enum.
    unsafe { gid_type.write(IBV_GID_TYPE_SYSFS_ROCE_V2) };
    0
}

pub(super) fn gid_entry(ctx: &Context) -> IbvGidEntry {
    IbvGidEntry {
        gid: gid_of(ctx.dev.addr),
        gid_index: 0,
        port_num: 1,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: 0,
    }
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_query_gid_ex(
    context: *mut IbvContext,
    port: u32,
    index: u32,
    entry: *mut IbvGidEntry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return libc::EINVAL };
    if flags != 0 || entry.is_null() || entry_size < size_of::<IbvGidEntry>() {
        return libc::EINVAL;
    }
    // The kernel's query_gid_entry: EINVAL past the table, ENODATA for an empty entry.
    if port != 1 || !in_gid_table(index) {
        return libc::EINVAL;
    }
    if index != 0 {
        return libc::ENODATA;
    }
    // SAFETY: the caller passes room for `entry_size` >= size_of bytes.
    unsafe { entry.write(gid_entry(ctx)) };
    0
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_query_gid_table(
    context: *mut IbvContext,
    entries: *mut IbvGidEntry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return -(libc::EINVAL as isize) };
    if flags != 0 || entry_size < size_of::<IbvGidEntry>() {
        return -(libc::EINVAL as isize);
    }
    if max_entries < 1 || entries.is_null() {
        return -(libc::EINVAL as isize);
    }
    // SAFETY: the caller passes room for `max_entries` >= 1 entries.
    unsafe { entries.write(gid_entry(ctx)) };
    1
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_query_pkey(
    context: *mut IbvContext,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    if context.is_null() || port != 1 || index != 0 || pkey.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller passes room for a __be16. The one P_Key is the default, full member.
    unsafe { pkey.write(0xFFFF_u16.to_be()) };
    0
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_get_pkey_index(
    context: *mut IbvContext,
    port: u8,
    pkey_be: u16,
) -> c_int {
    if context.is_null() || port != 1 {
        return -libc::EINVAL;
    }
    if u16::from_be(pkey_be) | 0x8000 == 0xFFFF { 0 } else { -libc::ENOENT }
}

pub(super) fn ctx_ptr(ctx: &Context) -> *mut IbvContext {
    ptr::from_ref(&ctx.vctx.context).cast_mut()
}
