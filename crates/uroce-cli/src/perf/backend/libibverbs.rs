//! A system's `libibverbs.so.1`, loaded at run time (no build-time dependency on rdma-core), and
//! the handful of verbs the benchmark calls, each behind an owning Rust type that releases its
//! object in the order the verbs require (a QP before its CQ, an MR before its PD, everything
//! before the device). Every unsafe call of the verbs backend is here.
//!
//! `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` are inline functions
//! of `<infiniband/verbs.h>` that call through the context's `ops` table; the layouts are
//! `uroce_verbs_abi`'s, checked against the installed header by its test.

use core::ffi::{CStr, c_char, c_int, c_uint, c_void};
use core::ptr::{self, NonNull};
use std::alloc::Layout;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use uroce_verbs_abi::consts::{IBV_SEND_SIGNALED, IBV_WR_RDMA_WRITE};
use uroce_verbs_abi::{
    IbvAh, IbvAhAttr, IbvCompChannel, IbvContext, IbvContextOps, IbvCq, IbvDevice, IbvGid, IbvMr,
    IbvPd, IbvPortAttr, IbvQp, IbvQpAttr, IbvQpInitAttr, IbvRecvWr, IbvSendWr, IbvSge, IbvWc,
    WrUnion,
};

/// The library's file name, as the dynamic loader searches for it (`LD_LIBRARY_PATH` first).
pub(crate) const LIBRARY: &CStr = c"libibverbs.so.1";
/// The variable that names another file to load instead (a path, or a name to search for).
pub(crate) const LIBRARY_VAR: &str = "UROCE_LIBIBVERBS";

/// The exported verbs the benchmark calls, resolved once.
struct Fns {
    get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut IbvDevice,
    free_device_list: unsafe extern "C" fn(*mut *mut IbvDevice),
    get_device_name: unsafe extern "C" fn(*mut IbvDevice) -> *const c_char,
    open_device: unsafe extern "C" fn(*mut IbvDevice) -> *mut IbvContext,
    close_device: unsafe extern "C" fn(*mut IbvContext) -> c_int,
    query_port: unsafe extern "C" fn(*mut IbvContext, u8, *mut IbvPortAttr) -> c_int,
    query_gid: unsafe extern "C" fn(*mut IbvContext, u8, c_int, *mut IbvGid) -> c_int,
    alloc_pd: unsafe extern "C" fn(*mut IbvContext) -> *mut IbvPd,
    dealloc_pd: unsafe extern "C" fn(*mut IbvPd) -> c_int,
    reg_mr: unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, c_int) -> *mut IbvMr,
    dereg_mr: unsafe extern "C" fn(*mut IbvMr) -> c_int,
    create_comp_channel: unsafe extern "C" fn(*mut IbvContext) -> *mut IbvCompChannel,
    destroy_comp_channel: unsafe extern "C" fn(*mut IbvCompChannel) -> c_int,
    create_cq: unsafe extern "C" fn(
        *mut IbvContext,
        c_int,
        *mut c_void,
        *mut IbvCompChannel,
        c_int,
    ) -> *mut IbvCq,
    destroy_cq: unsafe extern "C" fn(*mut IbvCq) -> c_int,
    get_cq_event:
        unsafe extern "C" fn(*mut IbvCompChannel, *mut *mut IbvCq, *mut *mut c_void) -> c_int,
    ack_cq_events: unsafe extern "C" fn(*mut IbvCq, c_uint),
    create_qp: unsafe extern "C" fn(*mut IbvPd, *mut IbvQpInitAttr) -> *mut IbvQp,
    modify_qp: unsafe extern "C" fn(*mut IbvQp, *mut IbvQpAttr, c_int) -> c_int,
    destroy_qp: unsafe extern "C" fn(*mut IbvQp) -> c_int,
    create_ah: unsafe extern "C" fn(*mut IbvPd, *mut IbvAhAttr) -> *mut IbvAh,
    destroy_ah: unsafe extern "C" fn(*mut IbvAh) -> c_int,
    wc_status_str: unsafe extern "C" fn(c_int) -> *const c_char,
}

/// The loaded library. It stays loaded for the life of the process (the verbs objects of a run
/// may outlive any one owner), so there is no `dlclose`.
pub(crate) struct Lib {
    fns: Fns,
}

/// `errno` as the verbs set it, in words.
fn errno() -> String {
    std::io::Error::last_os_error().to_string()
}

/// A verb's non-zero return value (an errno value) in words.
fn code(rc: c_int) -> String {
    std::io::Error::from_raw_os_error(rc).to_string()
}

impl Lib {
    /// Loads [`LIBRARY`] (or the file [`LIBRARY_VAR`] names) and resolves every verb; the
    /// error says what is missing.
    #[expect(
        clippy::missing_transmute_annotations,
        reason = "each symbol becomes the type of its field in `Fns`, which spells it out"
    )]
    pub(crate) fn load() -> Result<Arc<Self>, String> {
        let file = match std::env::var_os(LIBRARY_VAR) {
            Some(path) => {
                use std::os::unix::ffi::OsStrExt as _;
                std::ffi::CString::new(path.as_bytes())
                    .map_err(|_| format!("{LIBRARY_VAR} holds a NUL byte"))?
            }
            None => LIBRARY.to_owned(),
        };
        let shown = file.to_string_lossy().into_owned();
        // SAFETY: dlopen with a NUL-terminated name; loading runs the library's constructors,
        // which is what linking against it would do.
        let handle = unsafe { libc::dlopen(file.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns a NUL-terminated message (or NULL) owned by libc.
            let why = unsafe { libc::dlerror() };
            let why = if why.is_null() {
                "not found".to_string()
            } else {
                // SAFETY: non-NULL, NUL-terminated, valid until the next dl* call.
                unsafe { CStr::from_ptr(why) }.to_string_lossy().into_owned()
            };
            return Err(format!("cannot load {shown}: {why}"));
        }
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: dlsym on the handle dlopen returned, with a NUL-terminated name.
                let f = unsafe { libc::dlsym(handle, $name.as_ptr()) };
                if f.is_null() {
                    return Err(format!("{shown} has no {}", $name.to_string_lossy()));
                }
                // SAFETY: the symbol is the verb of that name, whose C prototype
                // (rdma-core's verbs.h) the field's type spells out.
                unsafe { core::mem::transmute::<*mut c_void, _>(f) }
            }};
        }
        let fns = Fns {
            get_device_list: sym!(c"ibv_get_device_list"),
            free_device_list: sym!(c"ibv_free_device_list"),
            get_device_name: sym!(c"ibv_get_device_name"),
            open_device: sym!(c"ibv_open_device"),
            close_device: sym!(c"ibv_close_device"),
            query_port: sym!(c"ibv_query_port"),
            query_gid: sym!(c"ibv_query_gid"),
            alloc_pd: sym!(c"ibv_alloc_pd"),
            dealloc_pd: sym!(c"ibv_dealloc_pd"),
            reg_mr: sym!(c"ibv_reg_mr"),
            dereg_mr: sym!(c"ibv_dereg_mr"),
            create_comp_channel: sym!(c"ibv_create_comp_channel"),
            destroy_comp_channel: sym!(c"ibv_destroy_comp_channel"),
            create_cq: sym!(c"ibv_create_cq"),
            destroy_cq: sym!(c"ibv_destroy_cq"),
            get_cq_event: sym!(c"ibv_get_cq_event"),
            ack_cq_events: sym!(c"ibv_ack_cq_events"),
            create_qp: sym!(c"ibv_create_qp"),
            modify_qp: sym!(c"ibv_modify_qp"),
            destroy_qp: sym!(c"ibv_destroy_qp"),
            create_ah: sym!(c"ibv_create_ah"),
            destroy_ah: sym!(c"ibv_destroy_ah"),
            wc_status_str: sym!(c"ibv_wc_status_str"),
        };
        Ok(Arc::new(Self { fns }))
    }

    /// The name of entry `i` of a device list of more than `i` entries.
    fn name_at(&self, list: *mut *mut IbvDevice, i: usize) -> String {
        // SAFETY: `i` is below the count the library returned with `list`.
        let dev = unsafe { list.wrapping_add(i).read() };
        // SAFETY: a device of the list; the name is NUL-terminated and lives with the list.
        let name = unsafe { (self.fns.get_device_name)(dev) };
        if name.is_null() {
            return String::new();
        }
        // SAFETY: non-NULL, NUL-terminated (above).
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    }

    /// `ibv_wc_status_str`.
    pub(crate) fn status_str(&self, status: c_int) -> String {
        // SAFETY: takes any value; returns a static NUL-terminated string.
        let s = unsafe { (self.fns.wc_status_str)(status) };
        if s.is_null() {
            return format!("status {status}");
        }
        // SAFETY: non-NULL, static, NUL-terminated.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
}

/// An open device (`ibv_open_device`).
pub(crate) struct Context {
    lib: Arc<Lib>,
    ctx: NonNull<IbvContext>,
    /// The device's name, as the library lists it.
    name: String,
}

// SAFETY: rdma-core's verbs are thread-safe: a context and the objects made from it may be used
// from any thread (man ibv_open_device, "The verbs are thread safe").
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the device named `name`, or the first one listed.
    pub(crate) fn open(lib: &Arc<Lib>, name: Option<&str>) -> Result<Arc<Self>, String> {
        let mut n: c_int = 0;
        // SAFETY: ibv_get_device_list writes the count and returns a NULL-terminated array (or
        // NULL on failure).
        let list = unsafe { (lib.fns.get_device_list)(&raw mut n) };
        if list.is_null() {
            return Err(format!("no RDMA devices: ibv_get_device_list: {}", errno()));
        }
        let count = usize::try_from(n).unwrap_or(0);
        let names: Vec<String> = (0..count).map(|i| lib.name_at(list, i)).collect();
        let found = match name {
            Some(want) => names.iter().position(|n| n == want),
            None => (!names.is_empty()).then_some(0),
        };
        let opened = found.map(|i| {
            // SAFETY: `i` is below the count returned with `list`.
            let dev = unsafe { list.wrapping_add(i).read() };
            // SAFETY: a listed device, opened before the list is freed (man ibv_open_device).
            unsafe { (lib.fns.open_device)(dev) }
        });
        // SAFETY: the list ibv_get_device_list returned, freed once.
        unsafe { (lib.fns.free_device_list)(list) };
        let Some(opened) = opened else {
            let listed = if names.is_empty() { "none".to_string() } else { names.join(", ") };
            return Err(match name {
                Some(want) => format!("no RDMA device '{want}' (listed: {listed})"),
                None => "no RDMA devices listed".to_string(),
            });
        };
        let name = found.and_then(|i| names.get(i)).cloned().unwrap_or_default();
        let ctx =
            NonNull::new(opened).ok_or_else(|| format!("ibv_open_device {name}: {}", errno()))?;
        Ok(Arc::new(Self { lib: Arc::clone(lib), ctx, name }))
    }

    pub(crate) fn lib(&self) -> &Lib {
        &self.lib
    }

    /// The device's name, as the library lists it.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The provider's table of the verbs the header inlines.
    fn ops(&self) -> &IbvContextOps {
        // SAFETY: an open context; its ops table lives as long as it.
        &unsafe { self.ctx.as_ref() }.ops
    }

    /// `ibv_query_port`.
    pub(crate) fn port(&self, port: u8) -> Result<IbvPortAttr, String> {
        // SAFETY: a plain C structure; all zeroes is a valid value.
        let mut attr: IbvPortAttr = unsafe { core::mem::zeroed() };
        // SAFETY: an open context and an attribute structure at least as large as the one the
        // exported symbol fills (`_compat_ibv_port_attr`).
        let rc = unsafe { (self.lib.fns.query_port)(self.ctx.as_ptr(), port, &raw mut attr) };
        if rc != 0 {
            return Err(format!("ibv_query_port {port}: {}", code(rc)));
        }
        Ok(attr)
    }

    /// `ibv_query_gid`.
    pub(crate) fn gid(&self, port: u8, index: c_int) -> Result<[u8; 16], String> {
        let mut gid = IbvGid { raw: [0; 16] };
        // SAFETY: an open context and a 16-byte GID to fill.
        let rc = unsafe { (self.lib.fns.query_gid)(self.ctx.as_ptr(), port, index, &raw mut gid) };
        if rc != 0 {
            return Err(format!("ibv_query_gid {port}/{index}: {}", errno()));
        }
        Ok(gid.raw)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device; every object made from it holds an `Arc` of this
        // context, so none is left.
        unsafe { (self.lib.fns.close_device)(self.ctx.as_ptr()) };
    }
}

/// A protection domain.
pub(crate) struct Pd {
    ctx: Arc<Context>,
    pd: NonNull<IbvPd>,
}

// SAFETY: verbs objects may be used from any thread (see `Context`).
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

impl Pd {
    pub(crate) fn new(ctx: &Arc<Context>) -> Result<Arc<Self>, String> {
        // SAFETY: an open context.
        let pd = unsafe { (ctx.lib.fns.alloc_pd)(ctx.ctx.as_ptr()) };
        let pd = NonNull::new(pd).ok_or_else(|| format!("ibv_alloc_pd: {}", errno()))?;
        Ok(Arc::new(Self { ctx: Arc::clone(ctx), pd }))
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd; its MRs, QPs and AHs hold an `Arc` of it.
        unsafe { (self.ctx.lib.fns.dealloc_pd)(self.pd.as_ptr()) };
    }
}

/// Zeroed, page-aligned memory of our own, registered.
pub(crate) struct Mr {
    pd: Arc<Pd>,
    mr: NonNull<IbvMr>,
    mem: NonNull<u8>,
    layout: Layout,
}

// SAFETY: verbs objects may be used from any thread; the memory is ours and is only accessed
// through the methods below (volatile, as the device writes it too).
unsafe impl Send for Mr {}

impl Mr {
    pub(crate) fn new(pd: &Arc<Pd>, len: usize, access: c_int) -> Result<Self, String> {
        let layout = Layout::from_size_align(len.max(8), 4096).map_err(|e| e.to_string())?;
        // SAFETY: a layout of non-zero size.
        let mem = unsafe { std::alloc::alloc_zeroed(layout) };
        let mem = NonNull::new(mem).ok_or("out of memory")?;
        // SAFETY: `mem` is `layout.size()` bytes we own until `drop`, which deregisters first.
        let mr = unsafe {
            (pd.ctx.lib.fns.reg_mr)(pd.pd.as_ptr(), mem.as_ptr().cast(), layout.size(), access)
        };
        let Some(mr) = NonNull::new(mr) else {
            let why = errno();
            // SAFETY: allocated above with this layout, never registered.
            unsafe { std::alloc::dealloc(mem.as_ptr(), layout) };
            return Err(format!("ibv_reg_mr of {len} bytes: {why}"));
        };
        Ok(Self { pd: Arc::clone(pd), mr, mem, layout })
    }

    pub(crate) fn addr(&self) -> u64 {
        self.mem.as_ptr() as u64
    }

    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }

    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: a registered MR, valid until `drop`.
        unsafe { self.mr.as_ref() }.lkey
    }

    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { self.mr.as_ref() }.rkey
    }

    /// A scatter/gather entry for `len` bytes at `offset`, if inside the region.
    pub(crate) fn sge(&self, offset: usize, len: usize) -> Result<IbvSge, String> {
        if offset.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(format!("{offset}+{len} is outside a {}-byte region", self.len()));
        }
        let length = u32::try_from(len).map_err(|_| "a message over 4 GiB")?;
        Ok(IbvSge { addr: self.addr() + offset as u64, length, lkey: self.lkey() })
    }

    /// Copies `bytes` in at `offset`.
    pub(crate) fn write(&self, offset: usize, bytes: &[u8]) -> Result<(), String> {
        self.sge(offset, bytes.len())?;
        let at = self.mem.as_ptr().wrapping_add(offset);
        for (i, &b) in bytes.iter().enumerate() {
            // SAFETY: inside our allocation (checked above); volatile, as the device may read it.
            unsafe { ptr::write_volatile(at.wrapping_add(i), b) };
        }
        Ok(())
    }

    /// Copies out `out.len()` bytes at `offset`.
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), String> {
        self.sge(offset, out.len())?;
        let at = self.mem.as_ptr().wrapping_add(offset);
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: inside our allocation (checked above); volatile, as the device (a peer's
            // WRITE) may change it at any time.
            *b = unsafe { ptr::read_volatile(at.wrapping_add(i)) };
        }
        Ok(())
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr, deregistered once, before its memory goes.
        unsafe { (self.pd.ctx.lib.fns.dereg_mr)(self.mr.as_ptr()) };
        // SAFETY: allocated in `new` with this layout; no longer registered.
        unsafe { std::alloc::dealloc(self.mem.as_ptr(), self.layout) };
    }
}

/// A completion channel: the file descriptor completion events arrive on.
struct Channel {
    ctx: Arc<Context>,
    ch: NonNull<IbvCompChannel>,
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: made by ibv_create_comp_channel; its CQ (the only one) is destroyed first.
        unsafe { (self.ctx.lib.fns.destroy_comp_channel)(self.ch.as_ptr()) };
    }
}

/// A completion queue, with a channel of its own when it is waited on by events.
pub(crate) struct Cq {
    ctx: Arc<Context>,
    cq: NonNull<IbvCq>,
    /// Dropped after the CQ (field order).
    channel: Option<Channel>,
    /// Events taken and not yet acknowledged (acknowledged before the CQ is destroyed).
    unacked: AtomicU32,
}

// SAFETY: verbs objects may be used from any thread (see `Context`).
unsafe impl Send for Cq {}
// SAFETY: as above; the only state of ours is atomic.
unsafe impl Sync for Cq {}

impl Cq {
    pub(crate) fn new(
        ctx: &Arc<Context>,
        entries: usize,
        events: bool,
    ) -> Result<Arc<Self>, String> {
        let channel = if events {
            // SAFETY: an open context.
            let ch = unsafe { (ctx.lib.fns.create_comp_channel)(ctx.ctx.as_ptr()) };
            let ch =
                NonNull::new(ch).ok_or_else(|| format!("ibv_create_comp_channel: {}", errno()))?;
            Some(Channel { ctx: Arc::clone(ctx), ch })
        } else {
            None
        };
        let ch = channel.as_ref().map_or(ptr::null_mut(), |c| c.ch.as_ptr());
        let cqe = c_int::try_from(entries).map_err(|_| "a CQ too deep")?;
        // SAFETY: an open context; `ch` is NULL or a channel of that context.
        let cq = unsafe { (ctx.lib.fns.create_cq)(ctx.ctx.as_ptr(), cqe, ptr::null_mut(), ch, 0) };
        let cq = NonNull::new(cq).ok_or_else(|| format!("ibv_create_cq({cqe}): {}", errno()))?;
        let cq = Self { ctx: Arc::clone(ctx), cq, channel, unacked: AtomicU32::new(0) };
        if cq.channel.is_some() {
            cq.arm()?;
        }
        Ok(Arc::new(cq))
    }

    /// `ibv_poll_cq` into `wcs`; how many it filled.
    pub(crate) fn poll(&self, wcs: &mut [IbvWc]) -> Result<usize, String> {
        let n = c_int::try_from(wcs.len()).unwrap_or(c_int::MAX);
        let poll = self.ctx.ops().poll_cq.ok_or("the provider has no poll_cq")?;
        // SAFETY: a live CQ and room for `n` completions.
        let got = unsafe { poll(self.cq.as_ptr(), n, wcs.as_mut_ptr()) };
        usize::try_from(got).map_err(|_| format!("ibv_poll_cq failed ({got})"))
    }

    /// `ibv_req_notify_cq`: the next completion raises an event.
    fn arm(&self) -> Result<(), String> {
        let notify = self.ctx.ops().req_notify_cq.ok_or("the provider has no req_notify_cq")?;
        // SAFETY: a live CQ.
        let rc = unsafe { notify(self.cq.as_ptr(), 0) };
        if rc != 0 {
            return Err(format!("ibv_req_notify_cq: {}", code(rc)));
        }
        Ok(())
    }

    /// Sleeps until the CQ's event or `limit`, then re-arms it (man ibv_get_cq_event: take the
    /// event, acknowledge it, request the next, then poll). `false` when the time ran out.
    pub(crate) fn wait_event(&self, limit: core::time::Duration) -> Result<bool, String> {
        let Some(channel) = &self.channel else { return Err("a CQ without events".into()) };
        // SAFETY: a live channel.
        let fd = unsafe { channel.ch.as_ref() }.fd;
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let ms = c_int::try_from(limit.as_millis()).unwrap_or(c_int::MAX);
        // SAFETY: one pollfd.
        let ready = unsafe { libc::poll(&raw mut pfd, 1, ms) };
        if ready < 0 {
            return Err(format!("poll on the completion channel: {}", errno()));
        }
        if ready == 0 {
            return Ok(false);
        }
        let (mut cq, mut cq_ctx) = (ptr::null_mut(), ptr::null_mut());
        // SAFETY: a live channel with an event pending; out-pointers to locals.
        let rc = unsafe {
            (self.ctx.lib.fns.get_cq_event)(channel.ch.as_ptr(), &raw mut cq, &raw mut cq_ctx)
        };
        if rc != 0 {
            return Err(format!("ibv_get_cq_event: {}", errno()));
        }
        // Acknowledging in batches is what the man page recommends (it takes a lock).
        if self.unacked.fetch_add(1, Ordering::Relaxed) + 1 >= 64 {
            self.ack();
        }
        self.arm()?;
        Ok(true)
    }

    fn ack(&self) {
        let n = self.unacked.swap(0, Ordering::Relaxed);
        if n > 0 {
            // SAFETY: a live CQ; acknowledges exactly the events taken.
            unsafe { (self.ctx.lib.fns.ack_cq_events)(self.cq.as_ptr(), n) };
        }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        self.ack();
        // SAFETY: made by ibv_create_cq; its QPs hold an `Arc` of it and are gone; every event
        // is acknowledged (above).
        unsafe { (self.ctx.lib.fns.destroy_cq)(self.cq.as_ptr()) };
    }
}

/// A queue pair.
pub(crate) struct Qp {
    pd: Arc<Pd>,
    qp: NonNull<IbvQp>,
    /// The CQ it completes on, kept alive until the QP is destroyed.
    _cq: Arc<Cq>,
}

// SAFETY: verbs objects may be used from any thread (see `Context`).
unsafe impl Send for Qp {}

/// One send work request, in Rust terms.
pub(crate) struct SendWr {
    pub(crate) wr_id: u64,
    pub(crate) opcode: c_int,
    pub(crate) flags: u32,
    pub(crate) sge: IbvSge,
    pub(crate) imm: u32,
    pub(crate) wr: WrUnion,
}

impl SendWr {
    /// A signaled WRITE (the caller sets what differs).
    pub(crate) fn new(wr_id: u64, sge: IbvSge, wr: WrUnion) -> Self {
        Self { wr_id, opcode: IBV_WR_RDMA_WRITE, flags: IBV_SEND_SIGNALED, sge, imm: 0, wr }
    }
}

impl Qp {
    pub(crate) fn new(
        pd: &Arc<Pd>,
        cq: &Arc<Cq>,
        attr: &mut IbvQpInitAttr,
    ) -> Result<Self, String> {
        let raw_cq = cq.cq.as_ptr();
        attr.send_cq = raw_cq;
        attr.recv_cq = raw_cq;
        // SAFETY: a live PD and CQ of the same context; `attr` is a complete init structure.
        let qp = unsafe { (pd.ctx.lib.fns.create_qp)(pd.pd.as_ptr(), attr) };
        let qp = NonNull::new(qp).ok_or_else(|| format!("ibv_create_qp: {}", errno()))?;
        Ok(Self { pd: Arc::clone(pd), qp, _cq: Arc::clone(cq) })
    }

    pub(crate) fn num(&self) -> u32 {
        // SAFETY: a live QP.
        unsafe { self.qp.as_ref() }.qp_num
    }

    /// `ibv_modify_qp`.
    pub(crate) fn modify(&self, attr: &mut IbvQpAttr, mask: c_int) -> Result<(), String> {
        // SAFETY: a live QP and a complete attribute structure.
        let rc = unsafe { (self.pd.ctx.lib.fns.modify_qp)(self.qp.as_ptr(), attr, mask) };
        if rc != 0 {
            return Err(format!("ibv_modify_qp to state {}: {}", attr.qp_state, code(rc)));
        }
        Ok(())
    }

    /// `ibv_post_send` of one work request.
    pub(crate) fn post_send(&self, w: SendWr) -> Result<(), String> {
        let mut sge = w.sge;
        // SAFETY: a plain C structure; all zeroes is a valid value.
        let mut wr: IbvSendWr = unsafe { core::mem::zeroed() };
        wr.wr_id = w.wr_id;
        wr.sg_list = &raw mut sge;
        wr.num_sge = 1;
        wr.opcode = w.opcode;
        wr.send_flags = w.flags;
        wr.imm_data = w.imm;
        wr.wr = w.wr;
        let mut bad = ptr::null_mut();
        let post = self.pd.ctx.ops().post_send.ok_or("the provider has no post_send")?;
        // SAFETY: a live QP, one work request whose scatter/gather entry outlives the call
        // (inline data is copied during it; otherwise the entry names registered memory).
        let rc = unsafe { post(self.qp.as_ptr(), &raw mut wr, &raw mut bad) };
        if rc != 0 {
            return Err(format!("ibv_post_send: {}", code(rc)));
        }
        Ok(())
    }

    /// `ibv_post_recv` of one receive.
    pub(crate) fn post_recv(&self, wr_id: u64, sge: IbvSge) -> Result<(), String> {
        let mut sge = sge;
        let mut wr = IbvRecvWr { wr_id, next: ptr::null_mut(), sg_list: &raw mut sge, num_sge: 1 };
        let mut bad = ptr::null_mut();
        let post = self.pd.ctx.ops().post_recv.ok_or("the provider has no post_recv")?;
        // SAFETY: a live QP and one receive naming registered memory.
        let rc = unsafe { post(self.qp.as_ptr(), &raw mut wr, &raw mut bad) };
        if rc != 0 {
            return Err(format!("ibv_post_recv: {}", code(rc)));
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: made by ibv_create_qp, destroyed once, before its CQ and PD (it holds both).
        unsafe { (self.pd.ctx.lib.fns.destroy_qp)(self.qp.as_ptr()) };
    }
}

/// An address handle (UD).
pub(crate) struct Ah {
    pd: Arc<Pd>,
    ah: NonNull<IbvAh>,
}

// SAFETY: verbs objects may be used from any thread (see `Context`).
unsafe impl Send for Ah {}

impl Ah {
    pub(crate) fn new(pd: &Arc<Pd>, attr: &mut IbvAhAttr) -> Result<Self, String> {
        // SAFETY: a live PD and a complete attribute structure.
        let ah = unsafe { (pd.ctx.lib.fns.create_ah)(pd.pd.as_ptr(), attr) };
        let ah = NonNull::new(ah).ok_or_else(|| format!("ibv_create_ah: {}", errno()))?;
        Ok(Self { pd: Arc::clone(pd), ah })
    }

    pub(crate) fn as_ptr(&self) -> *mut IbvAh {
        self.ah.as_ptr()
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        // SAFETY: made by ibv_create_ah, destroyed once.
        unsafe { (self.pd.ctx.lib.fns.destroy_ah)(self.ah.as_ptr()) };
    }
}

/// Zeroed attribute structures to fill in (plain C data, all zeroes valid).
pub(crate) fn zeroed_qp_attr() -> IbvQpAttr {
    // SAFETY: a plain C structure; all zeroes is a valid value.
    unsafe { core::mem::zeroed() }
}

/// See [`zeroed_qp_attr`].
pub(crate) fn zeroed_init_attr() -> IbvQpInitAttr {
    // SAFETY: a plain C structure; all zeroes is a valid value.
    unsafe { core::mem::zeroed() }
}

/// See [`zeroed_qp_attr`].
pub(crate) fn zeroed_wc() -> IbvWc {
    // SAFETY: a plain C structure; all zeroes is a valid value.
    unsafe { core::mem::zeroed() }
}
