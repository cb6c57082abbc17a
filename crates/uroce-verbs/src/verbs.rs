//! The verbs: rdma-core's C entry points on the uroce engine and runtime.
//!
//! Every object handed to C is a `#[repr(C)]` box whose first field is the public structure
//! (`struct ibv_qp` and so on) and whose later fields are this library's: the C pointer is the
//! box's address. Fields the C side may read concurrently (`qp->state`) are written through
//! raw places, never through a reference to the whole object.
//!
//! Failures follow each verb's man page: functions returning a pointer return NULL and set
//! `errno`; functions returning `int` return the errno value (or -1 with `errno` set, where
//! rdma-core does).

use core::ffi::{c_char, c_int, c_uint, c_void};
use core::mem::{offset_of, size_of};
use core::net::{IpAddr, Ipv6Addr};
use core::ptr::{self, null_mut};
use core::time::Duration;
use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use uroce_engine::{
    Access, AddressVector, AhAttr, AhHandle, AsyncEvent, CqHandle, DEVICE_ATTR, DestroyError, LKey,
    Mtu, PdHandle, PostError, Psn, QKey, QpAttr, QpCap, QpInitAttr, QpState, QpType, Qpn, RKey,
    RecvWr, RemoteAddr, RnrTimer, SendFlags, SendWr, Sge, SrqHandle, UdDest, WcOpcode,
    WorkCompletion, WrOpcode,
};
use uroce_net::{Channel, EventFd, NetDevice, OpenError, Options, RawRegion, SubscriberId};

use crate::abi::consts::*;
use crate::abi::*;

// ---------------------------------------------------------------------------------------------
// errno and small helpers

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: returns the calling thread's errno slot, valid for the thread's lifetime.
    let slot = unsafe { libc::__errno_location() };
    // SAFETY: as above: a valid, aligned, thread-local int.
    unsafe { *slot = e };
}

/// NULL with `errno`: the failure of a verb that returns a pointer.
fn fail<T>(e: c_int) -> *mut T {
    set_errno(e);
    null_mut()
}

/// Whether `UROCE_VERBS_DEBUG` (set and not `0`) asks for the reason of every refused verb on
/// stderr: the C API has only an errno to say what was wrong.
pub(crate) fn debug() -> bool {
    static DEBUG: OnceLock<bool> = OnceLock::new();
    *DEBUG
        .get_or_init(|| std::env::var("UROCE_VERBS_DEBUG").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// Says why `verb` was refused (with `UROCE_VERBS_DEBUG`) and returns `errno`.
fn refuse(verb: &str, why: impl core::fmt::Display, errno: c_int) -> c_int {
    if debug() {
        eprintln!("uroce: {verb}: {why}");
    }
    errno
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Copies `s` into a C string field, truncating and NUL-terminating.
fn c_string<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

/// The GID of an address: IPv6 as is, IPv4 as `::ffff:a.b.c.d` (RoCEv2, IBA A17.4.5.1).
pub(crate) fn gid_of(addr: IpAddr) -> IbvGid {
    let raw = match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    };
    IbvGid { raw }
}

/// The address of a GID: IPv4-mapped GIDs are IPv4 addresses.
fn addr_of_gid(gid: &IbvGid) -> IpAddr {
    let v6 = Ipv6Addr::from(gid.raw);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

// ---------------------------------------------------------------------------------------------
// Devices

/// A device: one configured address.
#[repr(C)]
pub(crate) struct Device {
    ibv: IbvDevice,
    addr: IpAddr,
    index: c_int,
    /// Node GUID, as the value `ibv_get_device_guid` returns (big-endian in memory).
    guid_be: u64,
}

/// Every device, built once from the configuration. They live as long as the process.
fn devices() -> &'static [&'static Device] {
    static DEVICES: OnceLock<Vec<&'static Device>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let addrs = uroce_net::config::addresses().unwrap_or_else(|msg| {
            eprintln!("{msg}");
            Vec::new()
        });
        addrs
            .into_iter()
            .enumerate()
            .map(|(i, addr)| {
                let name = format!("uroce{i}");
                let dev: &'static Device = Box::leak(Box::new(Device {
                    ibv: IbvDevice {
                        ops: [None, None],
                        node_type: IBV_NODE_CA,
                        transport_type: IBV_TRANSPORT_IB,
                        // As libibverbs fills them for kernel device i (`uverbsI`, and its
                        // sysfs directories), which `uroce exec` makes real.
                        name: c_string(&name),
                        dev_name: c_string(&format!("uverbs{i}")),
                        dev_path: c_string(&format!("/sys/class/infiniband_verbs/uverbs{i}")),
                        ibdev_path: c_string(&format!("/sys/class/infiniband/{name}")),
                    },
                    addr,
                    index: c_int::try_from(i).unwrap_or(c_int::MAX),
                    // The device's CM sends the same GUID in its REQs and REPs.
                    guid_be: uroce_net::node_guid(addr).to_be(),
                }));
                dev
            })
            .collect()
    })
}

/// Ours, if `p` is one of our devices (checked by address: nothing is dereferenced).
fn device_of(p: *mut IbvDevice) -> Option<&'static Device> {
    devices().iter().copied().find(|d| ptr::eq(&d.ibv, p))
}

/// The runtime devices open in this process, shared by every context on the same address (a
/// UDP port can be bound once).
///
/// Each is the process's that opened it: a child of `fork(2)` inherits the parent's devices
/// without their progress threads, as the parent's endpoints on the host, so it opens its own
/// (as on a real RNIC, where a child cannot use its parent's contexts but may open new ones).
/// The inherited ones are never used, and dropping one leaves the parent's endpoint alone (its
/// release checks the pid).
fn open_net(addr: IpAddr) -> Result<Arc<NetDevice>, c_int> {
    static OPEN: Mutex<Vec<(u32, IpAddr, Weak<NetDevice>)>> = Mutex::new(Vec::new());
    let me = std::process::id();
    let mut open = lock(&OPEN);
    open.retain(|(pid, _, w)| *pid == me && w.strong_count() > 0);
    if let Some(net) = open.iter().find(|(_, a, _)| *a == addr).and_then(|(_, _, w)| w.upgrade()) {
        return Ok(net);
    }
    let options = Options::from_env().map_err(|e| {
        eprintln!("uroce: {e}");
        libc::EINVAL
    })?;
    let net = NetDevice::open(addr, options).map_err(|e| {
        eprintln!("uroce: cannot open the device of {addr}: {e}");
        match e {
            OpenError::AddressInUse(_) => libc::EADDRINUSE,
            OpenError::AddressNotAvailable(_) => libc::EADDRNOTAVAIL,
            _ => libc::EIO,
        }
    })?;
    let net = Arc::new(net);
    open.push((me, addr, Arc::downgrade(&net)));
    Ok(net)
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_get_device_list(
    num_devices: *mut c_int,
) -> *mut *mut IbvDevice {
    let devs = devices();
    let n = c_int::try_from(devs.len()).unwrap_or(c_int::MAX);
    if !num_devices.is_null() {
        // SAFETY: the caller passes a valid int or NULL (checked); ibv_get_device_list(3)
        // always sets it.
        unsafe { *num_devices = n };
    }
    let mut list: Vec<*mut IbvDevice> =
        devs.iter().map(|d| ptr::from_ref(&d.ibv).cast_mut()).collect();
    list.push(null_mut());
    Box::into_raw(list.into_boxed_slice()).cast()
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_free_device_list(list: *mut *mut IbvDevice) {
    if list.is_null() {
        return;
    }
    let mut len = 0;
    // SAFETY: `list` came from `ibv_get_device_list`: NULL-terminated, so every read up to and
    // including the terminator is inside the allocation.
    while !unsafe { *list.wrapping_add(len) }.is_null() {
        len += 1;
    }
    let slice = ptr::slice_from_raw_parts_mut(list, len + 1);
    // SAFETY: allocated by `ibv_get_device_list` as a boxed slice of exactly `len + 1`.
    drop(unsafe { Box::from_raw(slice) });
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_get_device_name(device: *mut IbvDevice) -> *const c_char {
    device_of(device).map_or(ptr::null(), |d| d.ibv.name.as_ptr())
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_get_device_guid(device: *mut IbvDevice) -> u64 {
    device_of(device).map_or(0, |d| d.guid_be)
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_get_device_index(device: *mut IbvDevice) -> c_int {
    device_of(device).map_or(-1, |d| d.index)
}

// ---------------------------------------------------------------------------------------------
// Contexts

/// An open device (`ibv_open_device`).
#[repr(C)]
pub(crate) struct Context {
    vctx: VerbsContext,
    dev: &'static Device,
    pub(crate) net: Arc<NetDevice>,
    async_fd: Arc<EventFd>,
    objects: Arc<Mutex<Objects>>,
    /// This context's share of the device's asynchronous events: those of its objects.
    events: SubscriberId,
}

/// The C objects of a context by engine handle: what completion and asynchronous events name.
#[derive(Default)]
struct Objects {
    cqs: HashMap<CqHandle, usize>,
    qps: HashMap<Qpn, usize>,
    srqs: HashMap<SrqHandle, usize>,
}

impl Objects {
    /// The C object an event is about, and the event's `enum ibv_event_type`.
    fn event(&self, e: &AsyncEvent) -> Option<(usize, c_int)> {
        let (element, kind) = match *e {
            AsyncEvent::QpFatal(q) => (self.qps.get(&q), IBV_EVENT_QP_FATAL),
            AsyncEvent::QpAccessError(q) => (self.qps.get(&q), IBV_EVENT_QP_ACCESS_ERR),
            AsyncEvent::CommEstablished(q) => (self.qps.get(&q), IBV_EVENT_COMM_EST),
            AsyncEvent::LastWqeReached(q) => (self.qps.get(&q), IBV_EVENT_QP_LAST_WQE_REACHED),
            AsyncEvent::CqError(c) => (self.cqs.get(&c), IBV_EVENT_CQ_ERR),
            AsyncEvent::SrqLimitReached(s) => (self.srqs.get(&s), IBV_EVENT_SRQ_LIMIT_REACHED),
        };
        element.map(|&p| (p, kind))
    }
}

const CONTEXT_OFFSET: usize = offset_of!(Context, vctx) + offset_of!(VerbsContext, context);

/// The context of an `ibv_context` pointer.
///
/// # Safety
///
/// `p` is NULL or a context this library opened and has not closed.
pub(crate) unsafe fn ctx_of<'a>(p: *mut IbvContext) -> Option<&'a Context> {
    if p.is_null() {
        return None;
    }
    let c = p.wrapping_byte_sub(CONTEXT_OFFSET).cast::<Context>();
    // SAFETY: every ibv_context this library hands out is the `vctx.context` of a live boxed
    // Context (the caller's contract), so stepping back by the field offset reaches it.
    Some(unsafe { &*c })
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
    // Several contexts may share one device: each takes the events of its own objects.
    let objects = Arc::new(Mutex::new(Objects::default()));
    let mine = Arc::clone(&objects);
    let wants = Box::new(move |e: &AsyncEvent| lock(&mine).event(e).is_some());
    let events = net.with(|s| s.subscribe_async(Arc::clone(&async_fd), wants));
    let ops = IbvContextOps {
        compat_query_device: None,
        compat_query_port: None,
        compat_1: [None; 5],
        alloc_mw: None,
        bind_mw: None,
        dealloc_mw: None,
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
            unset_before_query_device_ex: [None; 26],
            query_device_ex: Some(query_device_ex),
            unset_before_create_qp_ex: [None; 5],
            create_qp_ex: Some(create_qp_ex),
            unset_after_create_qp_ex: [None; 5],
            sz: size_of::<VerbsContext>(),
            context: IbvContext {
                device,
                ops,
                cmd_fd: -1,
                async_fd: async_fd.as_raw_fd(),
                num_comp_vectors: 1,
                mutex: [0; 5],
                abi_compat: VERBS_ABI_IS_EXTENDED,
            },
        },
        dev,
        net,
        async_fd,
        objects,
        events,
    });
    let raw = Box::into_raw(ctx);
    // SAFETY: `raw` is the live box just made; the pointer to its field stays valid until
    // `ibv_close_device` frees it.
    unsafe { &raw mut (*raw).vctx.context }
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_close_device(context: *mut IbvContext) -> c_int {
    if context.is_null() {
        return libc::EINVAL;
    }
    let c = context.wrapping_byte_sub(CONTEXT_OFFSET).cast::<Context>();
    // SAFETY: made by `ibv_open_device` with Box::into_raw; closing it is the caller's last
    // use (ibv_close_device(3)).
    let ctx = unsafe { Box::from_raw(c) };
    ctx.net.with(|s| s.unsubscribe_async(ctx.events));
    0
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_query_device(
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
/// 0: no on-demand paging, no completion timestamps (so no core clock), no device memory, no
/// TSO, RSS, packet pacing or tag matching.
unsafe extern "C" fn query_device_ex(
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
        odp_caps: IbvOdpCaps::default(),
        completion_timestamp_mask: 0,
        hca_core_clock: 0,
        tso_caps: IbvTsoCaps::default(),
        rss_caps: IbvRssCaps::default(),
        max_wq_type_rq: 0,
        packet_pacing_caps: IbvPacketPacingCaps::default(),
        raw_packet_caps: 0,
        tm_caps: IbvTmCaps::default(),
        cq_mod_caps: IbvCqModerationCaps::default(),
        max_dm_size: 0,
        pci_atomic_caps: IbvPciAtomicCaps::default(),
        xrc_odp_caps: 0,
    };
    let n = attr_size.min(size_of::<IbvDeviceAttrEx>());
    // SAFETY: the caller passes `attr_size` writable bytes at `attr` (checked non-NULL);
    // `out` is a local of at least `n` bytes; they cannot overlap.
    unsafe { ptr::copy_nonoverlapping((&raw const out).cast::<u8>(), attr.cast::<u8>(), n) };
    0
}

/// The device's attributes as `ibv_query_device(3)` reports them.
fn device_attr(ctx: &Context) -> IbvDeviceAttr {
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
        device_cap_flags: IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_RC_RNR_NAK_GEN,
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
        max_mw: 0,
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
fn port_attr(ctx: &Context) -> IbvPortAttr {
    let mtu = ctx.net.with(|s| s.engine().port_mtu());
    IbvPortAttr {
        state: IBV_PORT_ACTIVE,
        max_mtu: IBV_MTU_4096,
        active_mtu: mtu_enum(mtu),
        gid_tbl_len: 1,
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

fn mtu_enum(m: Mtu) -> c_int {
    match m {
        Mtu::Mtu256 => 1,
        Mtu::Mtu512 => 2,
        Mtu::Mtu1024 => 3,
        Mtu::Mtu2048 => 4,
        Mtu::Mtu4096 => 5,
    }
}

fn mtu_from_enum(m: c_int) -> Option<Mtu> {
    Some(match m {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        5 => Mtu::Mtu4096,
        _ => return None,
    })
}

/// `verbs_context.query_port`: what the header's `ibv_query_port` calls, with the caller's
/// structure size (newer callers have `port_cap_flags2`).
unsafe extern "C" fn query_port_ex(
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
unsafe extern "C" fn uroce_verbs_query_port(
    context: *mut IbvContext,
    port: u8,
    attr: *mut IbvPortAttr,
) -> c_int {
    // SAFETY: same contract as the extended verb, with the compat size.
    unsafe { query_port_ex(context, port, attr, COMPAT_PORT_ATTR_SIZE) }
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_query_gid(
    context: *mut IbvContext,
    port: u8,
    index: c_int,
    gid: *mut IbvGid,
) -> c_int {
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return -1 };
    if port != 1 || index != 0 || gid.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller passes room for a union ibv_gid.
    unsafe { gid.write(gid_of(ctx.dev.addr)) };
    0
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_query_gid_type(
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

fn gid_entry(ctx: &Context) -> IbvGidEntry {
    IbvGidEntry {
        gid: gid_of(ctx.dev.addr),
        gid_index: 0,
        port_num: 1,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: 0,
    }
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_query_gid_ex(
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
    if port != 1 || index != 0 {
        return libc::ENODATA;
    }
    // SAFETY: the caller passes room for `entry_size` >= size_of bytes.
    unsafe { entry.write(gid_entry(ctx)) };
    0
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_query_gid_table(
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
unsafe extern "C" fn uroce_verbs_query_pkey(
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
unsafe extern "C" fn uroce_verbs_get_pkey_index(
    context: *mut IbvContext,
    port: u8,
    pkey_be: u16,
) -> c_int {
    if context.is_null() || port != 1 {
        return -libc::EINVAL;
    }
    if u16::from_be(pkey_be) | 0x8000 == 0xFFFF { 0 } else { -libc::ENOENT }
}

// ---------------------------------------------------------------------------------------------
// Protection domains and memory regions

#[repr(C)]
struct Pd {
    ibv: IbvPd,
    handle: PdHandle,
}

/// The context and engine handle of a PD.
///
/// # Safety
///
/// `pd` is NULL or a live PD of this library.
unsafe fn pd_parts<'a>(pd: *mut IbvPd) -> Option<(&'a Context, PdHandle)> {
    if pd.is_null() {
        return None;
    }
    let pd = pd.cast::<Pd>();
    // SAFETY: a live Pd (the caller's contract); reads a plain field.
    let c = unsafe { (*pd).ibv.context };
    // SAFETY: as above.
    let h = unsafe { (*pd).handle };
    // SAFETY: a PD's context outlives it.
    Some((unsafe { ctx_of(c) }?, h))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_alloc_pd(context: *mut IbvContext) -> *mut IbvPd {
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return fail(libc::EINVAL) };
    let handle = ctx.net.with(|s| s.engine().alloc_pd());
    let pd = Box::new(Pd { ibv: IbvPd { context, handle: 0 }, handle });
    Box::into_raw(pd).cast()
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_dealloc_pd(pd: *mut IbvPd) -> c_int {
    // SAFETY: the caller passes a PD it allocated.
    let Some((ctx, handle)) = (unsafe { pd_parts(pd) }) else { return libc::EINVAL };
    // ibv_dealloc_pd(3) fails while the PD is in use: EBUSY while an MR, QP, SRQ or AH of it
    // lives, as the kernel answers for a PD whose use count is not zero.
    match ctx.net.with(|s| s.engine().dealloc_pd(handle)) {
        Ok(()) => {}
        Err(DestroyError::InUse) => {
            return refuse("ibv_dealloc_pd", "an MR, QP, SRQ or AH still uses the PD", libc::EBUSY);
        }
        Err(DestroyError::Unknown) => return libc::EINVAL,
    }
    // SAFETY: made by `ibv_alloc_pd`; deallocating is the caller's last use.
    drop(unsafe { Box::from_raw(pd.cast::<Pd>()) });
    0
}

#[repr(C)]
struct Mr {
    ibv: IbvMr,
    lkey: LKey,
    /// The access it was registered with (`ibv_rereg_mr` keeps it unless told otherwise).
    access: Access,
}

/// Access flags as the engine takes them, or the errno and rule of a refusal: a combination
/// `ibv_reg_mr(3)` rejects is EINVAL, a capability uroce lacks EOPNOTSUPP (as a device without
/// it answers, and as rdma-core's tests take to mean "skip").
fn mr_access(flags: c_int) -> Result<Access, (c_int, &'static str)> {
    // The optional range and HUGETLB are hints: a device may ignore them (ibv_reg_mr(3)).
    let flags = flags & !(IBV_ACCESS_OPTIONAL_RANGE | IBV_ACCESS_HUGETLB);
    if flags & IBV_ACCESS_MW_BIND != 0 {
        return Err((libc::EOPNOTSUPP, "IBV_ACCESS_MW_BIND: uroce has no memory windows yet"));
    }
    if flags & IBV_ACCESS_ON_DEMAND != 0 {
        return Err((libc::EOPNOTSUPP, "IBV_ACCESS_ON_DEMAND: no on-demand paging yet"));
    }
    if flags & IBV_ACCESS_ZERO_BASED != 0 {
        return Err((libc::EOPNOTSUPP, "IBV_ACCESS_ZERO_BASED: no zero-based regions"));
    }
    let known = IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC;
    if flags & !known != 0 {
        return Err((libc::EINVAL, "access has bits no enum ibv_access_flags defines"));
    }
    // ibv_reg_mr(3): remote write or atomic access requires local write.
    if flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
        && flags & IBV_ACCESS_LOCAL_WRITE == 0
    {
        return Err((libc::EINVAL, "remote write or atomic access needs local write"));
    }
    Ok(Access::from_bits(flags.cast_unsigned()))
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_reg_mr(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut IbvMr {
    // SAFETY: the caller passes a PD it allocated.
    let Some((ctx, pdh)) = (unsafe { pd_parts(pd) }) else { return fail(libc::EINVAL) };
    // SAFETY: ibv_reg_mr(3)'s contract: `length` bytes at `addr` stay valid until
    // ibv_dereg_mr.
    let (mr, access) = match unsafe { register(ctx, pdh, addr, length, access, "ibv_reg_mr") } {
        Ok(r) => r,
        Err(errno) => return fail(errno),
    };
    let boxed = Box::new(Mr {
        ibv: IbvMr {
            context: ctx_ptr(ctx),
            pd,
            addr,
            length,
            handle: mr.lkey.0,
            lkey: mr.lkey.0,
            rkey: mr.rkey.0,
        },
        lkey: mr.lkey,
        access,
    });
    Box::into_raw(boxed).cast()
}

/// Checks and registers `length` bytes at `addr` with `access` in PD `pdh`, as `verb` (for its
/// messages); the region and its access, or the errno.
///
/// # Safety
///
/// The memory stays valid until the region is deregistered (ibv_reg_mr(3)).
unsafe fn register(
    ctx: &Context,
    pdh: PdHandle,
    addr: *mut c_void,
    length: usize,
    access: c_int,
    verb: &str,
) -> Result<(uroce_engine::MemoryRegion, Access), c_int> {
    // SAFETY: the caller's contract.
    let (region, access) = unsafe { prepare(addr, length, access, verb) }?;
    match ctx.net.with(|s| s.register(pdh, Arc::new(region), access)) {
        Ok(mr) => Ok((mr, access)),
        Err(e) => Err(refuse(verb, e, libc::ENOMEM)),
    }
}

/// The checks a registration of `length` bytes at `addr` with `access` passes, and the
/// region the engine will reach; the errno of the first that fails, as `verb` reports it.
///
/// # Safety
///
/// The memory stays valid until the region is deregistered (ibv_reg_mr(3)).
unsafe fn prepare(
    addr: *mut c_void,
    length: usize,
    access: c_int,
    verb: &str,
) -> Result<(RawRegion, Access), c_int> {
    let access = match mr_access(access) {
        Ok(a) => a,
        Err((errno, rule)) => {
            return Err(refuse(verb, format_args!("access {access:#x}: {rule}"), errno));
        }
    };
    if length == 0 {
        return Err(refuse(verb, "length 0", libc::EINVAL));
    }
    // A device pins the pages: a range that wraps is EINVAL, one not mapped (or not writable
    // when the registration writes to it) EFAULT, as Linux's ib_umem_get answers.
    let write = access.contains(Access::LOCAL_WRITE);
    if let Err(e) = uroce_net::mappings::check_range(addr as u64, length as u64, write) {
        let errno = match e {
            uroce_net::mappings::RangeError::Wraps => libc::EINVAL,
            _ => libc::EFAULT,
        };
        return Err(refuse(verb, format_args!("{length} bytes at {addr:p}: {e}"), errno));
    }
    // SAFETY: the caller's contract: the memory stays valid until deregistration, which
    // removes the region from the engine before returning; the engine reaches it only for
    // work requests the application posted on it.
    match unsafe { RawRegion::borrowed(addr.cast(), length) } {
        Ok(region) => Ok((region, access)),
        Err(_) => Err(libc::EINVAL),
    }
}

/// `ibv_rereg_mr(3)`: a new translation (`addr`, `length`), PD or access for `mr`, each alone
/// or together, in the same `struct ibv_mr` and under the same keys (as rxe and mlx5 keep
/// them), which from now on reach the new range with the new rights only. An input error
/// leaves the region as it was (`IBV_REREG_MR_ERR_INPUT`, errno set).
#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_rereg_mr(
    mr: *mut IbvMr,
    flags: c_int,
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    const INPUT: c_int = -1; // IBV_REREG_MR_ERR_INPUT
    let input = |errno| {
        set_errno(errno);
        INPUT
    };
    let supported =
        IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
    if mr.is_null() || flags == 0 || flags & !supported != 0 {
        return input(libc::EINVAL);
    }
    let m = mr.cast::<Mr>();
    // SAFETY: a live MR of this library (the caller's contract).
    let old = unsafe { &mut *m };
    let new_pd = if flags & IBV_REREG_MR_CHANGE_PD != 0 { pd } else { old.ibv.pd };
    let (addr, length) = if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
        if addr.is_null() || length == 0 {
            return input(libc::EINVAL);
        }
        (addr, length)
    } else {
        (old.ibv.addr, old.ibv.length)
    };
    let access = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
        access
    } else {
        old.access.bits().cast_signed()
    };
    // SAFETY: the new PD is the caller's (or the MR's own).
    let Some((ctx, pdh)) = (unsafe { pd_parts(new_pd) }) else { return input(libc::EINVAL) };
    if !ptr::eq(ctx_ptr(ctx), old.ibv.context) {
        return input(libc::EINVAL);
    }
    // SAFETY: ibv_rereg_mr(3): the new range, like the old, stays valid until deregistration.
    let (region, access) = match unsafe { prepare(addr, length, access, "ibv_rereg_mr") } {
        Ok(r) => r,
        Err(errno) => return input(errno),
    };
    let translate = flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0;
    let region = translate.then(|| Arc::new(region));
    let lkey = old.lkey;
    match ctx.net.with(|s| s.reregister(lkey, pdh, region, access)) {
        Some(Ok(_)) => {}
        Some(Err(e)) => return input(refuse("ibv_rereg_mr", e, libc::EINVAL)),
        None => return input(libc::EINVAL),
    }
    // The keys stay: only what they reach changes.
    old.ibv.pd = new_pd;
    old.ibv.addr = addr;
    old.ibv.length = length;
    old.access = access;
    0
}

/// `ibv_reg_mr_iova(3)`: uroce's virtual addresses are the process's own, so only an IOVA
/// equal to the address can be honoured.
#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_reg_mr_iova(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut IbvMr {
    if iova != addr as u64 {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller's contract is that of ibv_reg_mr.
    unsafe { uroce_verbs_reg_mr(pd, addr, length, access) }
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_reg_mr_iova2(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut IbvMr {
    // SAFETY: the caller's contract is that of ibv_reg_mr.
    unsafe { uroce_verbs_reg_mr_iova(pd, addr, length, iova, access.cast_signed()) }
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_dereg_mr(mr: *mut IbvMr) -> c_int {
    if mr.is_null() {
        return libc::EINVAL;
    }
    let mr = mr.cast::<Mr>();
    // SAFETY: made by `ibv_reg_mr`; deregistering is the caller's last use.
    let boxed = unsafe { Box::from_raw(mr) };
    // SAFETY: an MR's context outlives it.
    if let Some(ctx) = unsafe { ctx_of(boxed.ibv.context) } {
        ctx.net.with(|s| s.deregister_now(boxed.lkey));
    }
    0
}

fn ctx_ptr(ctx: &Context) -> *mut IbvContext {
    ptr::from_ref(&ctx.vctx.context).cast_mut()
}

// ---------------------------------------------------------------------------------------------
// Completion channels and completion queues

#[repr(C)]
struct CompChannel {
    ibv: IbvCompChannel,
    channel: Arc<Channel>,
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
    });
    Box::into_raw(boxed).cast()
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
    drop(unsafe { Box::from_raw(channel.cast::<CompChannel>()) });
    0
}

#[repr(C)]
struct Cq {
    ibv: IbvCq,
    handle: CqHandle,
    /// Completion events `ibv_get_cq_event` returned for this CQ: `ibv_destroy_cq` waits
    /// until the application has acknowledged as many (`ibv.comp_events_completed`).
    events_reported: AtomicU32,
}

/// Signaled on every `ibv_ack_cq_events`, for a destroy waiting for the acknowledgements.
static ACKED: (Mutex<()>, std::sync::Condvar) = (Mutex::new(()), std::sync::Condvar::new());

/// The context and engine handle of a CQ.
///
/// # Safety
///
/// `cq` is NULL or a live CQ of this library.
unsafe fn cq_parts<'a>(cq: *mut IbvCq) -> Option<(&'a Context, CqHandle)> {
    if cq.is_null() {
        return None;
    }
    let cq = cq.cast::<Cq>();
    // SAFETY: a live Cq (the caller's contract); reads a plain field.
    let c = unsafe { (*cq).ibv.context };
    // SAFETY: as above.
    let h = unsafe { (*cq).handle };
    // SAFETY: a CQ's context outlives it.
    Some((unsafe { ctx_of(c) }?, h))
}

/// `ibv_resize_cq(3)`: the CQ takes at least `cqe` completions from now on, keeping those it
/// holds; EINVAL for a size outside 1..=`max_cqe` or below the completions queued.
#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_resize_cq(cq: *mut IbvCq, cqe: c_int) -> c_int {
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
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return fail(libc::EINVAL) };
    let Ok(capacity) = usize::try_from(cqe) else { return fail(libc::EINVAL) };
    if capacity == 0 {
        return fail(libc::EINVAL);
    }
    // ibv_create_cq(3): comp_vector is at least 0 and less than the context's
    // num_comp_vectors (the kernel refuses any other with EINVAL).
    // SAFETY: a live context of this library; a plain field.
    let vectors = unsafe { (*context).num_comp_vectors };
    if !(0..vectors).contains(&comp_vector) {
        let why = format_args!("comp_vector {comp_vector}: the context has {vectors} vector(s)");
        return fail(refuse("ibv_create_cq", why, libc::EINVAL));
    }
    let handle = match ctx.net.with(|s| s.engine().create_cq(capacity)) {
        Ok(h) => h,
        Err(e) => return fail(refuse("ibv_create_cq", e, libc::EINVAL)),
    };
    if !channel.is_null() {
        let ch = channel.cast::<CompChannel>();
        // SAFETY: a live channel of this context (the caller's contract).
        let arc = unsafe { Arc::clone(&(*ch).channel) };
        let field = channel.wrapping_byte_add(offset_of!(IbvCompChannel, refcnt)).cast::<u32>();
        // SAFETY: as above; the refcount is only accessed atomically.
        let refcnt = unsafe { AtomicU32::from_ptr(field) };
        refcnt.fetch_add(1, Ordering::AcqRel);
        ctx.net.with(|s| s.bind_channel(handle, arc));
    }
    let boxed = Box::new(Cq {
        ibv: IbvCq {
            context,
            channel,
            cq_context,
            handle: handle.get(),
            cqe,
            mutex: [0; 5],
            cond: [0; 6],
            comp_events_completed: 0,
            async_events_completed: 0,
        },
        handle,
        events_reported: AtomicU32::new(0),
    });
    let raw = Box::into_raw(boxed);
    lock(&ctx.objects).cqs.insert(handle, raw as usize);
    raw.cast()
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_destroy_cq(cq: *mut IbvCq) -> c_int {
    // SAFETY: the caller passes a CQ it created.
    let Some((ctx, handle)) = (unsafe { cq_parts(cq) }) else { return libc::EINVAL };
    // ibv_destroy_cq(3): EBUSY while a QP uses the CQ.
    match ctx.net.with(|s| s.destroy_cq(handle)) {
        Ok(()) => {}
        Err(DestroyError::InUse) => return libc::EBUSY,
        Err(DestroyError::Unknown) => return libc::EINVAL,
    }
    // From here `ibv_get_cq_event` drops this CQ's events instead of returning them.
    lock(&ctx.objects).cqs.remove(&handle);
    // As rdma-core's ibv_destroy_cq does, wait until every event returned for this CQ is
    // acknowledged (ibv_get_cq_event(3)): a thread that got one may still be handling it,
    // and the CQ (and whatever its cq_context names) must outlive that.
    let field = cq.wrapping_byte_add(offset_of!(IbvCq, comp_events_completed)).cast::<u32>();
    // SAFETY: the CQ is live until freed below; the counter is only accessed atomically.
    let acked = unsafe { AtomicU32::from_ptr(field) };
    // SAFETY: as above; a field of our CQ, read atomically.
    let reported = unsafe { &(*cq.cast::<Cq>()).events_reported };
    let mut g = lock(&ACKED.0);
    while acked.load(Ordering::Acquire) < reported.load(Ordering::Acquire) {
        let wait = ACKED.1.wait_timeout(g, Duration::from_millis(10));
        g = wait.map_or_else(|e| e.into_inner().0, |w| w.0);
    }
    drop(g);
    // SAFETY: made by `ibv_create_cq`; destroying it is the caller's last use.
    let boxed = unsafe { Box::from_raw(cq.cast::<Cq>()) };
    let channel = boxed.ibv.channel;
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

fn wc_of(w: &WorkCompletion) -> IbvWc {
    let opcode = match w.opcode {
        WcOpcode::Send => IBV_WC_SEND,
        WcOpcode::RdmaWrite => IBV_WC_RDMA_WRITE,
        WcOpcode::RdmaRead => IBV_WC_RDMA_READ,
        WcOpcode::CompSwap => IBV_WC_COMP_SWAP,
        WcOpcode::FetchAdd => IBV_WC_FETCH_ADD,
        WcOpcode::Recv => IBV_WC_RECV,
        WcOpcode::RecvRdmaWithImm => IBV_WC_RECV_RDMA_WITH_IMM,
    };
    let mut flags = 0;
    if w.grh {
        flags |= IBV_WC_GRH;
    }
    if w.imm.is_some() {
        flags |= IBV_WC_WITH_IMM;
    }
    IbvWc {
        wr_id: w.wr_id,
        status: c_int::try_from(w.status.0).unwrap_or(c_int::MAX),
        opcode,
        vendor_err: 0,
        byte_len: w.byte_len,
        // `__be32`: the wire bytes, in memory order.
        imm_data: w.imm.map_or(0, u32::from_ne_bytes),
        qp_num: w.qp_num.get(),
        src_qp: w.src_qp.get(),
        wc_flags: flags,
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
fn ud_sl(w: &WorkCompletion) -> u8 {
    if !w.grh {
        return 0;
    }
    const UDP_PRESENT: u8 = 0x8;
    UDP_PRESENT | if w.ipv4 { 0x2 } else { 0x1 }
}

/// `ibv_poll_cq(3)` (through `ibv_context.ops`): a round of progress in the calling thread,
/// then up to `num_entries` completions.
unsafe extern "C" fn poll_cq(cq: *mut IbvCq, num_entries: c_int, wc: *mut IbvWc) -> c_int {
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

unsafe extern "C" fn req_notify_cq(cq: *mut IbvCq, solicited_only: c_int) -> c_int {
    // SAFETY: the caller passes a CQ it created.
    let Some((ctx, handle)) = (unsafe { cq_parts(cq) }) else { return libc::EINVAL };
    if ctx.net.with(|s| s.engine().req_notify_cq(handle, solicited_only != 0)) {
        0
    } else {
        libc::EINVAL
    }
}

/// Whether `fd` is in non-blocking mode (then waiting verbs return `EAGAIN`).
pub(crate) fn nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL reads the file status flags; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_get_cq_event(
    channel: *mut IbvCompChannel,
    cq_out: *mut *mut IbvCq,
    cq_context_out: *mut *mut c_void,
) -> c_int {
    if channel.is_null() || cq_out.is_null() || cq_context_out.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    let ch = channel.cast::<CompChannel>();
    // SAFETY: a live channel (the caller's contract); a reference to its private part.
    let chan = unsafe { &(*ch).channel };
    // SAFETY: as above; reads a plain field.
    let fd = unsafe { (*ch).ibv.fd };
    // SAFETY: as above.
    let context = unsafe { (*ch).ibv.context };
    // SAFETY: a channel's context outlives it.
    let Some(ctx) = (unsafe { ctx_of(context) }) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    loop {
        // An event already there is returned in either mode, without asking which.
        let got = if let Some(h) = chan.try_get() {
            h
        } else if nonblocking(fd) {
            set_errno(libc::EAGAIN);
            return -1;
        } else if let Some(h) = ctx.net.spin_for_event(chan) {
            h
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
        let cq_context = unsafe { (*cq).ibv.cq_context };
        // SAFETY: the caller passes room for both pointers (checked non-NULL).
        unsafe { cq_out.write(cq.cast()) };
        // SAFETY: as above.
        unsafe { cq_context_out.write(cq_context) };
        return 0;
    }
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_ack_cq_events(cq: *mut IbvCq, nevents: c_uint) {
    if cq.is_null() {
        return;
    }
    let field = cq.wrapping_byte_add(offset_of!(IbvCq, comp_events_completed)).cast::<u32>();
    // SAFETY: a live CQ (the caller's contract); the counter is only accessed atomically.
    let done = unsafe { AtomicU32::from_ptr(field) };
    done.fetch_add(nevents, Ordering::AcqRel);
    let _g = lock(&ACKED.0);
    ACKED.1.notify_all();
}

// ---------------------------------------------------------------------------------------------
// Shared receive queues

#[repr(C)]
struct Srq {
    ibv: IbvSrq,
    handle: SrqHandle,
    max_wr: u32,
    max_sge: u32,
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
    });
    let raw = Box::into_raw(boxed);
    lock(&ctx.objects).srqs.insert(handle, raw as usize);
    raw.cast()
}

/// The context of an SRQ and the SRQ.
///
/// # Safety
///
/// `srq` is NULL or a live SRQ of this library.
unsafe fn srq_parts<'a>(srq: *mut IbvSrq) -> Option<(&'a Context, &'a Srq)> {
    if srq.is_null() {
        return None;
    }
    // SAFETY: a live Srq (the caller's contract). The C side never writes it, and this
    // library writes no field of it after creation except the atomic limit.
    let s = unsafe { &*srq.cast::<Srq>() };
    // SAFETY: an SRQ's context outlives it.
    Some((unsafe { ctx_of(s.ibv.context) }?, s))
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_modify_srq(
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
unsafe extern "C" fn uroce_verbs_query_srq(srq: *mut IbvSrq, attr: *mut IbvSrqAttr) -> c_int {
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
    // SAFETY: made by `ibv_create_srq`; destroying it is the caller's last use.
    drop(unsafe { Box::from_raw(srq.cast::<Srq>()) });
    0
}

/// Reads a C receive work request list into engine work requests.
///
/// # Safety
///
/// `wr` is a valid list: each `sg_list` holds `num_sge` entries.
unsafe fn read_recv_wr(wr: *const IbvRecvWr) -> Option<RecvWr> {
    // SAFETY: the caller's contract; a bitwise copy of the C structure.
    let IbvRecvWr { wr_id, sg_list: sg, num_sge: n, .. } = unsafe { wr.read() };
    // SAFETY: as above.
    let sg_list = unsafe { read_sges(sg, n) }?;
    Some(RecvWr { wr_id, sg_list })
}

/// Reads `n` scatter/gather elements.
///
/// # Safety
///
/// `sg` holds `n` entries when `n > 0`.
unsafe fn read_sges(sg: *const IbvSge, n: c_int) -> Option<Vec<Sge>> {
    let n = usize::try_from(n).ok()?;
    if n > 0 && sg.is_null() {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: the caller's array holds `n` entries.
        let e = unsafe { sg.wrapping_add(i).read() };
        out.push(Sge { addr: e.addr, length: e.length, lkey: LKey(e.lkey) });
    }
    Some(out)
}

/// The errno for a work request the engine refused (ibv_post_send(3): `EINVAL` for an
/// invalid value, `ENOMEM` for a full queue).
fn post_errno(e: PostError) -> c_int {
    match e {
        PostError::QueueFull => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

unsafe extern "C" fn post_srq_recv(
    srq: *mut IbvSrq,
    wr: *mut IbvRecvWr,
    bad_wr: *mut *mut IbvRecvWr,
) -> c_int {
    // SAFETY: the caller passes an SRQ it created.
    let Some((ctx, s)) = (unsafe { srq_parts(srq) }) else { return libc::EINVAL };
    ctx.net.post_recv_with(|st| {
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: the caller passes a valid list.
            let posted = match unsafe { read_recv_wr(cur) } {
                Some(w) => st
                    .engine()
                    .post_srq_recv(s.handle, w)
                    .map_err(|e| refuse("ibv_post_srq_recv", e, post_errno(e))),
                None => Err(refuse("ibv_post_srq_recv", "a bad scatter/gather list", libc::EINVAL)),
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

/// Stores the first failed work request where the caller asked (if it did).
///
/// # Safety
///
/// `bad` is NULL or valid for a write.
unsafe fn write_bad<T>(bad: *mut *mut T, wr: *mut T) {
    if !bad.is_null() {
        // SAFETY: the caller's contract.
        unsafe { bad.write(wr) };
    }
}

// ---------------------------------------------------------------------------------------------
// Queue pairs

#[repr(C)]
struct Qp {
    ibv: IbvQp,
    inner: QpInner,
}

/// What this library keeps of a QP.
struct QpInner {
    qpn: Qpn,
    qp_type: QpType,
    sq_sig_all: bool,
    cap: IbvQpCap,
    /// The attributes set so far, for `ibv_query_qp`.
    attr: Mutex<IbvQpAttr>,
}

/// The context of a QP and the QP.
///
/// # Safety
///
/// `qp` is NULL or a live QP of this library.
unsafe fn qp_parts<'a>(qp: *mut IbvQp) -> Option<(&'a Context, &'a QpInner)> {
    if qp.is_null() {
        return None;
    }
    let q = qp.cast::<Qp>();
    // SAFETY: a live Qp (the caller's contract); reads a plain field.
    let c = unsafe { (*q).ibv.context };
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
unsafe extern "C" fn create_qp_ex(
    context: *mut IbvContext,
    attr: *mut IbvQpInitAttrEx,
) -> *mut IbvQp {
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's extended attributes (checked non-NULL).
    let a = unsafe { &*attr };
    let supported = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
    if a.comp_mask & !supported != 0 {
        let why = format_args!(
            "comp_mask {:#x}: only IBV_QP_INIT_ATTR_PD and IBV_QP_INIT_ATTR_CREATE_FLAGS (XRC, \
             TSO, RSS and the ibv_wr_* API are not supported)",
            a.comp_mask
        );
        return fail(refuse("ibv_create_qp_ex", why, libc::EOPNOTSUPP));
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
        let why = format_args!("create_flags {:#x}: none is supported", a.create_flags);
        return fail(refuse("ibv_create_qp_ex", why, libc::EOPNOTSUPP));
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        return fail(refuse("ibv_create_qp_ex", "a QP of these types needs a PD", libc::EINVAL));
    }
    // SAFETY: the caller's PD (non-NULL); a plain field.
    if unsafe { (*a.pd).context } != context {
        return fail(refuse("ibv_create_qp_ex", "the PD is another context's", libc::EINVAL));
    }
    // SAFETY: `struct ibv_qp_init_attr_ex` begins with `struct ibv_qp_init_attr`.
    unsafe { uroce_verbs_create_qp(a.pd, attr.cast::<IbvQpInitAttr>()) }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_create_qp(
    pd: *mut IbvPd,
    init: *mut IbvQpInitAttr,
) -> *mut IbvQp {
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
        t => {
            let why = format_args!("qp_type {t}: uroce has RC, UC and UD QPs");
            return fail(refuse("ibv_create_qp", why, libc::EOPNOTSUPP));
        }
    };
    // SAFETY: CQs passed by the caller are live CQs of this library (or NULL).
    let (Some((_, send_cq)), Some((_, recv_cq))) =
        (unsafe { cq_parts(i.send_cq) }, unsafe { cq_parts(i.recv_cq) })
    else {
        return fail(libc::EINVAL);
    };
    // SAFETY: as above for the SRQ.
    let srq = match unsafe { srq_parts(i.srq) } {
        Some((_, s)) => Some(s.handle),
        None if i.srq.is_null() => None,
        None => return fail(libc::EINVAL),
    };
    let cap = QpCap {
        max_send_wr: i.cap.max_send_wr.max(1),
        max_recv_wr: if srq.is_some() { 0 } else { i.cap.max_recv_wr.max(1) },
        max_send_sge: i.cap.max_send_sge.max(1),
        max_recv_sge: i.cap.max_recv_sge.max(1),
        max_inline_data: i.cap.max_inline_data,
    };
    let attr =
        QpInitAttr { qp_type, pd: pdh, send_cq, recv_cq, cap, sq_sig_all: i.sq_sig_all != 0, srq };
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
    // SAFETY: all zeroes is a valid IbvQpAttr (integers and a NUL GID).
    let mut qattr: IbvQpAttr = unsafe { core::mem::zeroed() };
    qattr.cap = actual;
    qattr.qp_state = IBV_QPS_RESET;
    qattr.port_num = 1;
    let boxed = Box::new(Qp {
        ibv: IbvQp {
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
        },
        inner: QpInner {
            qpn,
            qp_type,
            sq_sig_all: i.sq_sig_all != 0,
            cap: actual,
            attr: Mutex::new(qattr),
        },
    });
    let raw = Box::into_raw(boxed);
    lock(&ctx.objects).qps.insert(qpn, raw as usize);
    raw.cast()
}

fn qp_state_of(s: c_int) -> Option<QpState> {
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

fn qp_state_enum(s: QpState) -> c_int {
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
type AttrRefusal = (c_int, &'static str);

/// The engine's attributes for `ibv_modify_qp(a, mask)`. Which attributes each transition
/// takes is the engine's to check (IBA 11.2.5.2); here are the mask bits uroce does not model
/// and the values only the C ABI carries.
fn qp_attr(a: &IbvQpAttr, mask: c_int) -> Result<QpAttr, AttrRefusal> {
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
            return invalid("ah_attr.grh.sgid_index: the port's GID table has one entry, 0");
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
fn remember(rec: &mut IbvQpAttr, a: &IbvQpAttr, mask: c_int) {
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
    ctx.net.with(|s| {
        s.engine().destroy_qp(qpn);
        let _ = s.sync_multicast();
    });
    lock(&ctx.objects).qps.remove(&qpn);
    // SAFETY: made by `ibv_create_qp`; destroying it is the caller's last use.
    drop(unsafe { Box::from_raw(qp.cast::<Qp>()) });
    0
}

/// Reads one C send work request into an engine work request.
///
/// # Safety
///
/// `wr` is a valid work request of a QP of type `qp_type`; inline data is read from the
/// addresses its scatter/gather list names.
unsafe fn read_send_wr(wr: *const IbvSendWr, qp_type: QpType) -> Result<SendWr, c_int> {
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
        _ => return Err(libc::EINVAL),
    };
    // SAFETY: the caller's contract: `sg_list` holds `num_sge` entries.
    let sg_list = unsafe { read_sges(w.sg_list, w.num_sge) }.ok_or(libc::EINVAL)?;
    let mut flags = SendFlags::NONE;
    if w.send_flags & IBV_SEND_SIGNALED != 0 {
        flags = flags | SendFlags::SIGNALED;
    }
    if w.send_flags & IBV_SEND_SOLICITED != 0 {
        flags = flags | SendFlags::SOLICITED;
    }
    if w.send_flags & IBV_SEND_FENCE != 0 {
        flags = flags | SendFlags::FENCE;
    }
    let mut out = SendWr::new(w.wr_id, opcode, sg_list);
    out.flags = flags;
    if opcode.has_imm() {
        out.imm = Some(w.imm_data.to_ne_bytes());
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
    if qp_type == QpType::Ud {
        // SAFETY: a UD QP: the union holds `wr.ud`.
        let u = unsafe { w.wr.ud };
        if u.ah.is_null() {
            return Err(libc::EINVAL);
        }
        let ah = u.ah.cast::<Ah>();
        // SAFETY: a live address handle of this library (the caller's contract).
        let handle = unsafe { (*ah).handle };
        out.ud = Some(UdDest {
            ah: handle,
            remote_qpn: Qpn::new(u.remote_qpn).ok_or(libc::EINVAL)?,
            remote_qkey: QKey(u.remote_qkey),
        });
    }
    // ibv_post_send(3): with IBV_SEND_INLINE the data is read at post time and the lkeys are
    // not checked.
    if w.send_flags & IBV_SEND_INLINE != 0 && !opcode.is_read_or_atomic() {
        let total: usize = out.sg_list.iter().map(|s| s.length as usize).sum();
        let mut data = Vec::with_capacity(total);
        // An empty element adds nothing (MPICH posts them with a null address; a slice from
        // a null pointer is undefined even when empty).
        for s in out.sg_list.iter().filter(|s| s.length > 0) {
            let from = s.addr as *const u8;
            if from.is_null() {
                return Err(libc::EINVAL);
            }
            // SAFETY: the application's buffer of `length` bytes (the verbs contract for
            // inline sends).
            let bytes = unsafe { core::slice::from_raw_parts(from, s.length as usize) };
            data.extend_from_slice(bytes);
        }
        out.inline_data = Some(data);
        out.sg_list.clear();
    }
    Ok(out)
}

unsafe extern "C" fn post_send(
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

unsafe extern "C" fn post_recv(
    qp: *mut IbvQp,
    wr: *mut IbvRecvWr,
    bad_wr: *mut *mut IbvRecvWr,
) -> c_int {
    // SAFETY: the caller passes a QP it created.
    let Some((ctx, q)) = (unsafe { qp_parts(qp) }) else { return libc::EINVAL };
    ctx.net.post_recv_with(|s| {
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: the caller passes a valid list.
            let posted = match unsafe { read_recv_wr(cur) } {
                Some(w) => s.engine().post_recv(q.qpn, w).map_err(|e| {
                    refuse(
                        "ibv_post_recv",
                        format_args!("QP {:#x}: {e}", q.qpn.get()),
                        post_errno(e),
                    )
                }),
                None => Err(refuse("ibv_post_recv", "a bad scatter/gather list", libc::EINVAL)),
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
unsafe fn mcast(qp: *mut IbvQp, gid: *const IbvGid, attach: bool) -> c_int {
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

// ---------------------------------------------------------------------------------------------
// Address handles

#[repr(C)]
struct Ah {
    ibv: IbvAh,
    handle: AhHandle,
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_create_ah(pd: *mut IbvPd, attr: *mut IbvAhAttr) -> *mut IbvAh {
    // SAFETY: the caller passes a PD it allocated.
    let Some((ctx, pdh)) = (unsafe { pd_parts(pd) }) else { return fail(libc::EINVAL) };
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller passes a valid struct ibv_ah_attr (checked non-NULL).
    let a = unsafe { attr.read() };
    // RoCE: the destination is the GID; without a GRH there is none.
    if a.is_global == 0 {
        let why = "RoCE needs is_global = 1 and the destination's GID in grh.dgid";
        return fail(refuse("ibv_create_ah", why, libc::EINVAL));
    }
    let ah_attr = AhAttr { dest: addr_of_gid(&a.grh.dgid), flow_label: a.grh.flow_label };
    let handle = match ctx.net.with(|s| s.engine().create_ah(pdh, ah_attr)) {
        Ok(h) => h,
        Err(e) => return fail(refuse("ibv_create_ah", e, libc::EINVAL)),
    };
    let boxed =
        Box::new(Ah { ibv: IbvAh { context: ctx_ptr(ctx), pd, handle: handle.get() }, handle });
    Box::into_raw(boxed).cast()
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_destroy_ah(ah: *mut IbvAh) -> c_int {
    if ah.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: made by `ibv_create_ah`; destroying it is the caller's last use.
    let boxed = unsafe { Box::from_raw(ah.cast::<Ah>()) };
    // SAFETY: an AH's context outlives it.
    if let Some(ctx) = unsafe { ctx_of(boxed.ibv.context) } {
        ctx.net.with(|s| s.engine().destroy_ah(boxed.handle));
    }
    0
}

/// `ibv_init_ah_from_wc(3)`: the address handle attributes that answer a received UD message,
/// from the network header at the start of its buffer. RoCEv2 over IPv4 puts the IPv4 header
/// in the last 20 of those 40 bytes.
#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_init_ah_from_wc(
    context: *mut IbvContext,
    port: u8,
    wc: *mut IbvWc,
    grh: *mut IbvGrh,
    attr: *mut IbvAhAttr,
) -> c_int {
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return libc::EINVAL };
    if wc.is_null() || grh.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a valid work completion (checked non-NULL).
    let flags = unsafe { (*wc).wc_flags };
    if flags & IBV_WC_GRH == 0 {
        return libc::EINVAL;
    }
    // SAFETY: the 40 bytes of the receive buffer's network header (checked non-NULL).
    let raw: [u8; 40] = unsafe { grh.cast::<[u8; 40]>().read() };
    let (src, tclass, hop, flow) = if ctx.dev.addr.is_ipv4() {
        let ip = &raw[20..];
        let src = IpAddr::from([ip[12], ip[13], ip[14], ip[15]]);
        (src, ip[1], ip[8], 0)
    } else {
        let mut s = [0u8; 16];
        s.copy_from_slice(&raw[8..24]);
        let vtf = u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]);
        let tclass = ((vtf >> 20) & 0xFF) as u8;
        (IpAddr::from(s), tclass, raw[7], vtf & 0x000F_FFFF)
    };
    let out = IbvAhAttr {
        grh: IbvGlobalRoute {
            dgid: gid_of(src),
            flow_label: flow,
            sgid_index: 0,
            hop_limit: hop,
            traffic_class: tclass,
        },
        dlid: 0,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: port,
    };
    // SAFETY: the caller passes room for a struct ibv_ah_attr (checked non-NULL).
    unsafe { attr.write(out) };
    0
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_create_ah_from_wc(
    pd: *mut IbvPd,
    wc: *mut IbvWc,
    grh: *mut IbvGrh,
    port: u8,
) -> *mut IbvAh {
    // SAFETY: the caller passes a PD it allocated.
    let Some((ctx, _)) = (unsafe { pd_parts(pd) }) else { return fail(libc::EINVAL) };
    // SAFETY: all zeroes is a valid IbvAhAttr.
    let mut attr: IbvAhAttr = unsafe { core::mem::zeroed() };
    // SAFETY: the caller's contract for wc and grh; `attr` is a live local.
    let r = unsafe { uroce_verbs_init_ah_from_wc(ctx_ptr(ctx), port, wc, grh, &raw mut attr) };
    if r != 0 {
        return fail(r);
    }
    // SAFETY: as above.
    unsafe { uroce_verbs_create_ah(pd, &raw mut attr) }
}

// ---------------------------------------------------------------------------------------------
// Asynchronous events

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_get_async_event(
    context: *mut IbvContext,
    event: *mut IbvAsyncEvent,
) -> c_int {
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    loop {
        while let Some(e) = ctx.net.with(|s| s.poll_async_event_for(ctx.events)) {
            // An object destroyed since its event was queued: the event goes with it.
            let Some((element, kind)) = lock(&ctx.objects).event(&e) else { continue };
            let out = IbvAsyncEvent { element: element as *mut c_void, event_type: kind };
            // SAFETY: the caller passes room for a struct ibv_async_event (checked).
            unsafe { event.write(out) };
            return 0;
        }
        if nonblocking(ctx.async_fd.as_raw_fd()) {
            set_errno(libc::EAGAIN);
            return -1;
        }
        ctx.net.end_busy_poll();
        if let Err(e) = ctx.async_fd.wait(-1) {
            set_errno(e.raw_os_error().unwrap_or(libc::EIO));
            return -1;
        }
    }
}

#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_ack_async_event(_event: *mut IbvAsyncEvent) {}
