//! RDMA over RoCEv2 in user space: the verbs programming model (protection domains, memory
//! regions, completion queues, queue pairs), safely.
//!
//! A [`Context`] is one device, bound to one IP address. Two programs — on one host with two
//! addresses, or on two hosts — create queue pairs, swap their [`Endpoint`]s over any channel
//! (here a TCP stream, as `ibv_rc_pingpong` does) and talk RDMA in real RoCEv2 packets.
//!
//! ```
//! use std::net::TcpListener;
//! use uroce::{Access, Context, QpType};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (a, b) = (Context::open("127.0.1.2".parse()?)?, Context::open("127.0.1.3".parse()?)?);
//! let (pd_a, pd_b) = (a.alloc_pd(), b.alloc_pd());
//! let (cq_a, cq_b) = (a.create_cq(16)?, b.create_cq(16)?);
//! let qp_a = pd_a.qp(QpType::Rc, &cq_a).build()?;
//! let qp_b = pd_b.qp(QpType::Rc, &cq_b).build()?;
//! // B's buffer, open to remote writes; A's source buffer.
//! let target = pd_b.register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
//! let source = pd_a.register(4096, Access::LOCAL_WRITE)?;
//! source.write(0, b"hello, RDMA")?;
//! // Swap endpoints (B's carries its region) over TCP, then connect both ways.
//! let listener = TcpListener::bind("127.0.0.1:0")?;
//! let port = listener.local_addr()?.port();
//! let b_side = qp_b.endpoint().with_region(target.remote());
//! let t = std::thread::spawn(move || {
//!     let (mut s, _) = listener.accept().unwrap();
//!     uroce::exchange(&mut s, &b_side).unwrap()
//! });
//! let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
//! let remote = uroce::exchange(&mut stream, &qp_a.endpoint())?;
//! qp_b.connect(&t.join().unwrap())?;
//! qp_a.connect(&remote)?;
//! // One-sided: B's application does nothing; its device's progress thread places the bytes.
//! qp_a.write(1, &source, 0..11, remote.regions[0])?;
//! let wc = cq_a.wait_one(None)?;
//! assert_eq!(wc.status, uroce::WcStatus::SUCCESS);
//! let mut got = [0u8; 11];
//! target.read(0, &mut got)?;
//! assert_eq!(&got, b"hello, RDMA");
//! # Ok(()) }
//! ```
//!
//! # Memory safety
//!
//! Registered memory is owned by its [`Mr`]: [`Pd::register`] allocates it page-aligned (and,
//! with [`Pd::register_locked`], pinned), so it cannot move. The application reads and writes it
//! through [`Mr::read`] and [`Mr::write`], which take the device lock that every access of the
//! transport takes too, so a peer's RDMA WRITE and the application never race in Rust's memory
//! model. [`Mr::as_slice`] gives a zero-copy view, `unsafe`, with its contract written down.
//!
//! Freeing a registered buffer while the transport may still touch it cannot corrupt memory.
//! Dropping an [`Mr`] hands its memory to the device: while a posted work request (a send
//! gathering from it, a receive or READ landing in it) has not completed, the region stays
//! registered and alive; once none remains it is deregistered, its keys refused from then on,
//! and freed. A peer's RDMA to a dropped region fails with `REM_ACCESS_ERR` after that.
#![deny(unsafe_code)]

pub mod cm;
mod work_request;
mod xrc;
pub use cm::{CmError, Connection, Listener};
pub use work_request::SendRequest;
pub use xrc::{XrcDomain, XrcSrq};

use core::fmt;
use core::net::IpAddr;
use core::ops::Range;
use core::time::Duration;
use std::io::{self, Read, Write};
use std::sync::Arc;

pub use uroce_engine::{
    Access, AsyncEvent, Counters, CreateError, DEVICE_ATTR, DeviceAttr, Instant, McastError,
    ModifyError, Mtu, MwType, PostError, Psn, QKey, QpCounters, QpState, QpType, Qpn, RKey,
    RemoteAddr, SendFlags, Sge, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
use uroce_engine::{
    AhAttr, AhHandle, CqHandle, MemoryRegion, MwHandle, PdHandle, QpAttr, QpCap, QpInitAttr,
    RecvWr, SendWr, SgList, SrqHandle, UdDest,
};
use uroce_net::{Channel, NetDevice, RawRegion};
pub use uroce_net::{Faults, NetCounters, OpenError, Options, process_cpu_time};

/// Everything that can go wrong, each naming the rule broken.
#[derive(Debug)]
pub enum Error {
    /// The device could not be opened.
    Open(OpenError),
    /// An object could not be created (a device limit, an unknown handle).
    Create(CreateError),
    /// A QP state transition was refused.
    Modify(ModifyError),
    /// A work request was refused; nothing was queued.
    Post(PostError),
    /// Multicast attach or detach failed.
    Mcast(McastError),
    /// A range outside a memory region.
    OutOfRange {
        /// The range asked for.
        range: Range<usize>,
        /// The region's length.
        len: usize,
    },
    /// An endpoint description that does not parse.
    BadEndpoint(&'static str),
    /// Connection setup or release through the CM failed.
    Cm(CmError),
    /// A system call failed.
    Io(io::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Open(e) => write!(f, "{e}"),
            Self::Create(e) => write!(f, "{e}"),
            Self::Modify(e) => write!(f, "{e}"),
            Self::Post(e) => write!(f, "{e}"),
            Self::Mcast(e) => write!(f, "{e}"),
            Self::OutOfRange { range, len } => {
                write!(f, "bytes {range:?} are outside the {len}-byte region")
            }
            Self::BadEndpoint(why) => write!(f, "bad endpoint description: {why}"),
            Self::Cm(e) => write!(f, "{e}"),
            Self::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

macro_rules! from_error {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self { Self::$v(e) }
        }
    )*};
}
from_error!(OpenError => Open, CreateError => Create, ModifyError => Modify, PostError => Post,
    McastError => Mcast, io::Error => Io);

/// What is left until `deadline`, for a blocking wait; `None` once it has passed.
fn time_left(deadline: std::time::Instant) -> Option<Duration> {
    #[expect(clippy::disallowed_methods, reason = "a blocking wait reads the clock")]
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    (!left.is_zero()).then_some(left)
}

/// Result with [`Error`].
pub type Result<T, E = Error> = core::result::Result<T, E>;

/// An open device: one IP address, its RoCEv2 GID.
#[derive(Clone, Debug)]
pub struct Context {
    dev: Arc<NetDevice>,
    /// The CM's events, once something connects or listens through it.
    cm: Arc<std::sync::OnceLock<Arc<cm::Hub>>>,
}

impl Context {
    /// Opens this process's endpoint of the host-wide device of `addr` (other processes may
    /// have it open too: the device's UDP port 4791 and its shared-memory paths are shared),
    /// with `UROCE_PCAP`, `UROCE_FAULTS` and `UROCE_FABRIC` applied from the environment.
    pub fn open(addr: IpAddr) -> Result<Self> {
        let options = Options::from_env().map_err(|e| Error::Open(OpenError::Environment(e)))?;
        Self::open_with(addr, options)
    }

    /// Opens the device of `addr` with explicit options.
    pub fn open_with(addr: IpAddr, options: Options) -> Result<Self> {
        Ok(Self { dev: Arc::new(NetDevice::open(addr, options)?), cm: Arc::default() })
    }

    /// The device's address (GID index 0).
    pub fn addr(&self) -> IpAddr {
        self.dev.addr()
    }

    /// This process's slot on the host-wide device: its index (the top byte of every QPN this
    /// context creates) and generation.
    pub fn endpoint_slot(&self) -> (u8, u32) {
        self.dev.endpoint_slot()
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Pd {
        let handle = self.dev.with(|s| s.engine().alloc_pd());
        Pd { ctx: self.clone(), handle, life: Arc::new(PdLife { ctx: self.clone(), handle }) }
    }

    /// A completion queue of `capacity` entries, with its own completion channel for
    /// [`Cq::wait`].
    pub fn create_cq(&self, capacity: usize) -> Result<Cq> {
        let channel = Arc::new(Channel::new()?);
        let ch = Arc::clone(&channel);
        let handle = self.dev.with(|s| {
            let cq = s.engine().create_cq(capacity)?;
            s.bind_channel(cq, ch);
            Ok::<_, CreateError>(cq)
        })?;
        Ok(Cq { ctx: self.clone(), handle, channel })
    }

    /// The device clock now: the timeline of [`WorkCompletion::timestamp`] (nanoseconds since
    /// this context's device opened in this process). The time between two completions is the
    /// difference of their stamps, taken when the packets that made them arrived.
    pub fn clock(&self) -> Instant {
        self.dev.clock()
    }

    /// Registered regions, counting those kept alive for outstanding work requests.
    pub fn registered_regions(&self) -> usize {
        self.dev.with(|s| s.registered_regions())
    }

    /// The transport's counters and the runtime's.
    pub fn counters(&self) -> (Counters, NetCounters) {
        self.dev.with(|s| (*s.engine().counters(), s.counters()))
    }

    /// The next asynchronous event (`ibv_get_async_event`), without blocking.
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.dev.progress();
        self.dev.with(uroce_net::State::poll_async_event)
    }
}

/// A protection domain: regions, QPs and address handles of one PD work together only.
///
/// Everything made from it (regions, windows, address handles, SRQs, QPs) holds it: the
/// domain is deallocated when the last of them, or this handle, goes. (A region whose
/// deregistration waits for outstanding work requests leaves the domain's number allocated.)
#[derive(Debug)]
pub struct Pd {
    ctx: Context,
    handle: PdHandle,
    life: Arc<PdLife>,
}

/// The engine's PD, deallocated with its last holder.
#[derive(Debug)]
pub(crate) struct PdLife {
    ctx: Context,
    handle: PdHandle,
}

impl Drop for PdLife {
    fn drop(&mut self) {
        let h = self.handle;
        // In use only by a region whose deregistration is deferred: the number stays taken.
        let _ = self.ctx.dev.with(|s| s.engine().dealloc_pd(h));
    }
}

/// The engine's SRQ, destroyed with its last holder (its handle and the QPs taking from it).
#[derive(Debug)]
pub(crate) struct SrqLife {
    ctx: Context,
    handle: SrqHandle,
    _pd: Arc<PdLife>,
}

impl Drop for SrqLife {
    fn drop(&mut self) {
        let h = self.handle;
        let _ = self.ctx.dev.with(|s| s.engine().destroy_srq(h));
    }
}

impl Pd {
    /// Registers `len` zeroed, page-aligned bytes with `access`.
    pub fn register(&self, len: usize, access: Access) -> Result<Mr> {
        self.register_region(RawRegion::new(len, false)?, access)
    }

    /// As [`Pd::register`], and pinned in RAM with `mlock` where the limit allows
    /// ([`Mr::locked`] says whether it was).
    pub fn register_locked(&self, len: usize, access: Access) -> Result<Mr> {
        self.register_region(RawRegion::new(len, true)?, access)
    }

    fn register_region(&self, region: RawRegion, access: Access) -> Result<Mr> {
        let region = Arc::new(region);
        let r = Arc::clone(&region);
        let mr = self.ctx.dev.with(|s| s.register(self.handle, r, access))?;
        Ok(Mr { ctx: self.ctx.clone(), region, mr, _pd: Arc::clone(&self.life) })
    }

    /// An address handle for UD sends to `dest` (a device address or a multicast group).
    pub fn create_ah(&self, dest: IpAddr) -> Result<Ah> {
        let handle = self.ctx.dev.with(|s| s.engine().create_ah(self.handle, AhAttr::new(dest)))?;
        Ok(Ah { ctx: self.ctx.clone(), handle, _pd: Arc::clone(&self.life) })
    }

    /// A memory window of `kind` (IBA 10.6.7), unbound: bind it to a range of a region with
    /// [`SendRequest::bind_mw`] to give a peer access to that range alone, with rights of its
    /// own, and take it back by binding again (type 1), invalidating it
    /// ([`SendRequest::local_invalidate`], or the peer's [`SendRequest::send_with_invalidate`],
    /// type 2), or dropping the window. Regions windows are bound in need [`Access::MW_BIND`].
    pub fn alloc_mw(&self, kind: MwType) -> Result<Mw> {
        let (handle, _) = self.ctx.dev.with(|s| s.engine().alloc_mw(self.handle, kind))?;
        Ok(Mw { ctx: self.ctx.clone(), handle, kind, _pd: Arc::clone(&self.life) })
    }

    /// A shared receive queue of up to `max_wr` receives.
    pub fn create_srq(&self, max_wr: u32) -> Result<Srq> {
        let handle = self.ctx.dev.with(|s| s.engine().create_srq(self.handle, max_wr, 4))?;
        let life = Arc::new(SrqLife { ctx: self.ctx.clone(), handle, _pd: Arc::clone(&self.life) });
        Ok(Srq { ctx: self.ctx.clone(), handle, life })
    }

    /// Starts building a queue pair of `qp_type` whose completions go to `cq`.
    pub fn qp<'a>(&'a self, qp_type: QpType, cq: &'a Cq) -> QpBuilder<'a> {
        QpBuilder {
            pd: self,
            qp_type,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap { max_send_wr: 512, max_recv_wr: 512, ..QpCap::default() },
            // The port's active MTU, as a connection manager picks it (the path MTU is then the
            // smaller of the two ends').
            mtu: self.ctx.dev.with(|s| s.engine().port_mtu()),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 4,
            access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            qkey: QKey(0x1111_1111),
            sq_sig_all: true,
        }
    }
}

/// Registered memory, owned: the buffer lives exactly as long as its registration.
#[derive(Debug)]
pub struct Mr {
    ctx: Context,
    region: Arc<RawRegion>,
    mr: MemoryRegion,
    _pd: Arc<PdLife>,
}

/// A memory window (`ibv_alloc_mw`). Its key changes at every bind; dropping it revokes
/// whatever it was bound to at once. A window never keeps a region alive: once the region is
/// dropped, the window reaches nothing.
#[derive(Debug)]
pub struct Mw {
    ctx: Context,
    handle: MwHandle,
    kind: MwType,
    _pd: Arc<PdLife>,
}

impl Mw {
    /// The window's current key: what the last completed bind gave it.
    pub fn rkey(&self) -> RKey {
        self.ctx.dev.with(|s| s.engine().mw_rkey(self.handle)).unwrap_or(RKey(0))
    }

    /// Type 1 or type 2.
    pub fn kind(&self) -> MwType {
        self.kind
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        let h = self.handle;
        let _ = self.ctx.dev.with(|s| s.engine().dealloc_mw(h));
    }
}

/// A remote region as a peer names it in RDMA and atomic work requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteMr {
    /// Its virtual address in the peer.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// Its remote key.
    pub rkey: RKey,
}

impl RemoteMr {
    /// The remote address `offset` bytes in.
    pub fn at(&self, offset: u64) -> RemoteAddr {
        RemoteAddr { addr: self.addr + offset, rkey: self.rkey }
    }
}

impl Mr {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.region.len()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.region.is_empty()
    }

    /// Its virtual address (where it is in this process).
    pub fn addr(&self) -> u64 {
        self.mr.addr
    }

    /// Local key.
    pub fn lkey(&self) -> uroce_engine::LKey {
        self.mr.lkey
    }

    /// Remote key.
    pub fn rkey(&self) -> RKey {
        self.mr.rkey
    }

    /// Whether `mlock` pinned it.
    pub fn locked(&self) -> bool {
        self.region.locked()
    }

    /// How a peer names this region.
    pub fn remote(&self) -> RemoteMr {
        RemoteMr { addr: self.mr.addr, len: self.region.len() as u64, rkey: self.mr.rkey }
    }

    fn check(&self, range: &Range<usize>) -> Result<()> {
        if range.start > range.end || range.end > self.len() {
            return Err(Error::OutOfRange { range: range.clone(), len: self.len() });
        }
        Ok(())
    }

    /// The scatter/gather element for `range`.
    pub fn sge(&self, range: Range<usize>) -> Result<Sge> {
        self.check(&range)?;
        let length = u32::try_from(range.len())
            .map_err(|_| Error::OutOfRange { range: range.clone(), len: self.len() })?;
        Ok(Sge { addr: self.mr.addr + range.start as u64, length, lkey: self.mr.lkey })
    }

    /// Copies bytes `offset..offset + dst.len()` out (sound while a peer writes: it takes the
    /// device lock every transport access takes).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let ok = self.ctx.dev.with(|s| s.read_region(&self.region, offset, dst));
        if ok {
            Ok(())
        } else {
            Err(Error::OutOfRange { range: offset..offset + dst.len(), len: self.len() })
        }
    }

    /// Copies `src` in at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        let ok = self.ctx.dev.with(|s| s.write_region(&self.region, offset, src));
        if ok {
            Ok(())
        } else {
            Err(Error::OutOfRange { range: offset..offset + src.len(), len: self.len() })
        }
    }

    /// Bytes `range` as a vector.
    pub fn to_vec(&self, range: Range<usize>) -> Result<Vec<u8>> {
        self.check(&range)?;
        let mut v = vec![0; range.len()];
        self.read(range.start, &mut v)?;
        Ok(v)
    }

    /// The region's bytes, without a copy.
    ///
    /// # Safety
    ///
    /// While the slice lives nothing may write the region: no receive posted into it, no RDMA
    /// WRITE, READ response or atomic a peer or this process may direct at it, no
    /// [`Mr::write`]. (Reading it after the completion that ends all such work, with no new
    /// work posted, satisfies this.)
    #[allow(unsafe_code, reason = "the documented zero-copy escape hatch")]
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: forwarded to the caller, whose contract is the function's.
        unsafe { self.region.as_slice() }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // The device keeps the region (its registry holds it) until no outstanding work
        // request names it; then deregisters it, and the memory goes with the last reference.
        let lkey = self.mr.lkey;
        self.ctx.dev.with(|s| s.deregister(lkey));
    }
}

/// A completion queue.
#[derive(Debug)]
pub struct Cq {
    ctx: Context,
    handle: CqHandle,
    channel: Arc<Channel>,
}

impl Cq {
    /// Makes progress, then takes every completion waiting, appending them to `out`; returns
    /// how many (busy polling: `ibv_poll_cq`).
    pub fn poll(&self, out: &mut Vec<WorkCompletion>) -> usize {
        self.ctx.dev.poll_with(|s| s.engine().poll_cq(self.handle, usize::MAX, out))
    }

    /// Blocks until at least one completion is there (or `timeout` passes), without spinning:
    /// arms the CQ and sleeps on its completion channel, as `ibv_req_notify_cq` plus
    /// `ibv_get_cq_event` do. Returns what is there (empty after a timeout).
    pub fn wait(&self, timeout: Option<Duration>) -> Result<Vec<WorkCompletion>> {
        self.wait_for(usize::MAX, timeout)
    }

    /// Waits for one completion and returns it (the rest stay queued); a timeout is an error
    /// of kind `TimedOut`.
    pub fn wait_one(&self, timeout: Option<Duration>) -> Result<WorkCompletion> {
        self.wait_for(1, timeout)?
            .pop()
            .ok_or_else(|| Error::Io(io::Error::new(io::ErrorKind::TimedOut, "no completion")))
    }

    /// Up to `max` completions, sleeping on the completion channel until there is one or the
    /// timeout passes.
    fn wait_for(&self, max: usize, timeout: Option<Duration>) -> Result<Vec<WorkCompletion>> {
        #[expect(clippy::disallowed_methods, reason = "a blocking wait reads the clock")]
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        let mut out = Vec::new();
        let take = |out: &mut Vec<WorkCompletion>| {
            self.ctx.dev.progress();
            self.ctx.dev.with(|s| s.engine().poll_cq(self.handle, max, out))
        };
        loop {
            if take(&mut out) > 0 {
                return Ok(out);
            }
            self.ctx.dev.req_notify_cq(self.handle, false);
            // A completion may have landed between the poll and the arming.
            if take(&mut out) > 0 {
                return Ok(out);
            }
            let left = match deadline.map(time_left) {
                None => None,
                Some(None) => return Ok(out),
                Some(left) => left,
            };
            // An event left by an earlier arming, whose completions a poll already took, wakes
            // this too: the loop then polls and sleeps again. One that comes soon is waited
            // for busy-polling ([`Options::event_spin`]), without a thread wake-up.
            if self.ctx.dev.spin_for_event(&self.channel).is_none() {
                self.ctx.dev.end_busy_poll();
                self.channel.get(left)?;
            }
        }
    }
}

/// A shared receive queue. The QPs that take from it hold it: it is destroyed when the last
/// of them, or this handle, goes.
#[derive(Debug)]
pub struct Srq {
    ctx: Context,
    handle: SrqHandle,
    life: Arc<SrqLife>,
}

impl Srq {
    /// Posts a receive of `range` of `mr`.
    pub fn post_recv(&self, wr_id: u64, mr: &Mr, range: Range<usize>) -> Result<()> {
        let wr = RecvWr { wr_id, sg_list: [mr.sge(range)?].into() };
        self.ctx.dev.post_recv_with(|s| s.engine().post_srq_recv(self.handle, wr))?;
        Ok(())
    }
}

/// An address handle (UD destinations).
#[derive(Debug)]
pub struct Ah {
    ctx: Context,
    handle: AhHandle,
    _pd: Arc<PdLife>,
}

impl Drop for Ah {
    fn drop(&mut self) {
        let h = self.handle;
        self.ctx.dev.with(|s| s.engine().destroy_ah(h));
    }
}

/// Builds a queue pair; the defaults suit most uses (MTU 1024, 512-deep queues, ACK timeout
/// 14 ≈ 67 ms, 7 retries, RNR retry for ever, 4 READ/atomics outstanding, every send signaled).
#[derive(Debug)]
#[must_use]
pub struct QpBuilder<'a> {
    pd: &'a Pd,
    qp_type: QpType,
    send_cq: &'a Cq,
    recv_cq: &'a Cq,
    srq: Option<&'a Srq>,
    cap: QpCap,
    mtu: Mtu,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    max_rd_atomic: u8,
    access: Access,
    qkey: QKey,
    sq_sig_all: bool,
}

impl<'a> QpBuilder<'a> {
    /// A separate CQ for receive completions.
    pub fn recv_cq(mut self, cq: &'a Cq) -> Self {
        self.recv_cq = cq;
        self
    }
    /// Take receives from a shared receive queue.
    pub fn srq(mut self, srq: &'a Srq) -> Self {
        self.srq = Some(srq);
        self
    }
    /// Send and receive queue depths.
    pub fn depth(mut self, send: u32, recv: u32) -> Self {
        self.cap.max_send_wr = send;
        self.cap.max_recv_wr = recv;
        self
    }
    /// Largest inline send.
    pub fn max_inline(mut self, bytes: u32) -> Self {
        self.cap.max_inline_data = bytes;
        self
    }
    /// Path MTU (RC and UC; UD uses the port's). Default: the port's active MTU.
    pub fn mtu(mut self, mtu: Mtu) -> Self {
        self.mtu = mtu;
        self
    }
    /// ACK timeout exponent, transport retries and RNR retries (7: for ever).
    pub fn retries(mut self, timeout: u8, retry_cnt: u8, rnr_retry: u8) -> Self {
        (self.timeout, self.retry_cnt, self.rnr_retry) = (timeout, retry_cnt, rnr_retry);
        self
    }
    /// Remote operations this QP serves.
    pub fn access(mut self, access: Access) -> Self {
        self.access = access;
        self
    }
    /// UD Q_Key.
    pub fn qkey(mut self, qkey: QKey) -> Self {
        self.qkey = qkey;
        self
    }
    /// Only signaled sends complete on success (`sq_sig_all` = 0): a [`SendRequest`] marked
    /// [`SendRequest::unsignaled`] then completes only on error. The helpers' sends are all
    /// signaled.
    pub fn selective_signaling(mut self) -> Self {
        self.sq_sig_all = false;
        self
    }

    /// Creates the QP and moves it to Init (UD: on to RTS, as it needs no peer).
    pub fn build(self) -> Result<Qp> {
        let ctx = &self.pd.ctx;
        let init = QpInitAttr {
            qp_type: self.qp_type,
            pd: self.pd.handle,
            send_cq: self.send_cq.handle,
            recv_cq: self.recv_cq.handle,
            cap: self.cap,
            sq_sig_all: self.sq_sig_all,
            srq: self.srq.map(|s| s.handle),
            xrcd: None,
        };
        let ud = self.qp_type == QpType::Ud;
        let (qpn, psn) = ctx.dev.with(|s| -> Result<(Qpn, Psn)> {
            let e = s.engine();
            let qpn = e.create_qp(init)?;
            // A starting PSN nobody can predict (IBA 9.7.2), from the device's generator.
            let psn = e.random_psn();
            e.init_qp(qpn, self.access, self.qkey)?;
            if ud {
                e.ready_datagram_qp(qpn, psn)?;
            }
            Ok((qpn, psn))
        })?;
        Ok(Qp {
            ctx: ctx.clone(),
            qpn,
            qp_type: self.qp_type,
            psn,
            mtu: self.mtu,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            max_rd_atomic: self.max_rd_atomic,
            qkey: self.qkey,
            domain: None,
            _pd: Some(Arc::clone(&self.pd.life)),
            _srq: self.srq.map(|s| Arc::clone(&s.life)),
        })
    }
}

/// A queue pair.
#[derive(Debug)]
pub struct Qp {
    ctx: Context,
    qpn: Qpn,
    qp_type: QpType,
    psn: Psn,
    mtu: Mtu,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    max_rd_atomic: u8,
    qkey: QKey,
    /// An XRC target's domain, which lives as long as the target.
    domain: Option<Arc<xrc::DomainInner>>,
    /// The PD and SRQ it was made from, which live as long as it.
    _pd: Option<Arc<PdLife>>,
    _srq: Option<Arc<SrqLife>>,
}

impl Qp {
    /// A QP the engine created as `qpn`, with the builder's default transport settings.
    fn unconnected(ctx: Context, qpn: Qpn, qp_type: QpType, psn: Psn, mtu: Mtu) -> Self {
        Self {
            ctx,
            qpn,
            qp_type,
            psn,
            mtu,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 4,
            qkey: QKey(0x1111_1111),
            domain: None,
            _pd: None,
            _srq: None,
        }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        let q = self.qpn;
        self.ctx.dev.with(|s| s.engine().destroy_qp(q));
    }
}

/// What a peer needs to reach a QP: its GID, QPN and starting PSN, its MTU and Q_Key, and any
/// regions it offers for RDMA. Serializes to bytes for any out-of-band channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The device address (GID).
    pub gid: IpAddr,
    /// The QP number.
    pub qpn: Qpn,
    /// The first PSN it sends.
    pub psn: Psn,
    /// Its path MTU.
    pub mtu: Mtu,
    /// Its Q_Key (UD).
    pub qkey: QKey,
    /// Regions offered to the peer.
    pub regions: Vec<RemoteMr>,
}

const ENDPOINT_MAGIC: &[u8; 4] = b"URE1";

impl Endpoint {
    /// Adds a region to offer.
    #[must_use]
    pub fn with_region(mut self, r: RemoteMr) -> Self {
        self.regions.push(r);
        self
    }

    /// The wire form: magic `URE1`, 16-byte GID (IPv4-mapped for IPv4), QPN, PSN, Q_Key,
    /// MTU in bytes, region count, then per region address, length and R_Key; big-endian.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(40 + 20 * self.regions.len());
        b.extend_from_slice(ENDPOINT_MAGIC);
        let gid = match self.gid {
            IpAddr::V4(a) => a.to_ipv6_mapped(),
            IpAddr::V6(a) => a,
        };
        b.extend_from_slice(&gid.octets());
        b.extend_from_slice(&self.qpn.get().to_be_bytes());
        b.extend_from_slice(&self.psn.get().to_be_bytes());
        b.extend_from_slice(&self.qkey.0.to_be_bytes());
        b.extend_from_slice(&self.mtu.bytes().to_be_bytes());
        b.extend_from_slice(&u16::try_from(self.regions.len()).unwrap_or(u16::MAX).to_be_bytes());
        for r in self.regions.iter().take(usize::from(u16::MAX)) {
            b.extend_from_slice(&r.addr.to_be_bytes());
            b.extend_from_slice(&r.len.to_be_bytes());
            b.extend_from_slice(&r.rkey.0.to_be_bytes());
        }
        b
    }

    /// Parses [`Endpoint::to_bytes`]'s form.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        let take = |at: usize, n: usize| b.get(at..at + n).ok_or(Error::BadEndpoint("truncated"));
        let be32 = |at| take(at, 4).map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]));
        let be64 = |at| take(at, 8).map(|s| u64::from_be_bytes(s.try_into().unwrap_or([0; 8])));
        if take(0, 4)? != ENDPOINT_MAGIC {
            return Err(Error::BadEndpoint("not a uroce endpoint (magic)"));
        }
        let gid6 = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(take(4, 16)?).unwrap_or([0; 16]));
        let gid = gid6.to_ipv4_mapped().map_or(IpAddr::V6(gid6), IpAddr::V4);
        let qpn = Qpn::new(be32(20)?).ok_or(Error::BadEndpoint("QPN beyond 24 bits"))?;
        let psn = Psn::new(be32(24)?).ok_or(Error::BadEndpoint("PSN beyond 24 bits"))?;
        let qkey = QKey(be32(28)?);
        let mtu_bytes = be32(32)?;
        let mtu = Mtu::from_bytes(mtu_bytes)
            .ok_or(Error::BadEndpoint("MTU not 256, 512, 1024, 2048 or 4096"))?;
        let n = take(36, 2).map(|s| usize::from(u16::from_be_bytes([s[0], s[1]])))?;
        let mut regions = Vec::with_capacity(n.min(1024));
        for i in 0..n {
            let at = 38 + 20 * i;
            regions.push(RemoteMr {
                addr: be64(at)?,
                len: be64(at + 8)?,
                rkey: RKey(be32(at + 16)?),
            });
        }
        Ok(Self { gid, qpn, psn, mtu, qkey, regions })
    }
}

/// Sends `local` over `stream` and reads the peer's endpoint (each as a 4-byte length and the
/// bytes of [`Endpoint::to_bytes`]): the out-of-band exchange `ibv_rc_pingpong` does over TCP.
pub fn exchange<S: Read + Write>(stream: &mut S, local: &Endpoint) -> Result<Endpoint> {
    let bytes = local.to_bytes();
    stream.write_all(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes())?;
    stream.write_all(&bytes)?;
    stream.flush()?;
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > 1 << 20 {
        return Err(Error::BadEndpoint("longer than 1 MiB"));
    }
    let mut buf = vec![0; len];
    stream.read_exact(&mut buf)?;
    Endpoint::from_bytes(&buf)
}

impl Qp {
    /// The QP number.
    pub fn qpn(&self) -> Qpn {
        self.qpn
    }

    /// This QP's counters.
    pub fn counters(&self) -> QpCounters {
        self.ctx.dev.with(|s| s.engine().qp_counters(self.qpn)).unwrap_or_default()
    }

    /// The state.
    pub fn state(&self) -> Option<QpState> {
        self.ctx.dev.with(|s| s.engine().qp_state(self.qpn))
    }

    /// This QP's endpoint description, with no regions.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            gid: self.ctx.addr(),
            qpn: self.qpn,
            psn: self.psn,
            mtu: self.mtu,
            qkey: self.qkey,
            regions: Vec::new(),
        }
    }

    /// Connects an RC, UC or XRC QP to `remote` (Init → RTR → RTS; the path MTU is the
    /// smaller of the two; an XRC initiator connects to a target, a target to an initiator).
    /// UD QPs are ready from `build` and ignore this.
    pub fn connect(&self, remote: &Endpoint) -> Result<()> {
        if self.qp_type == QpType::Ud {
            return Ok(());
        }
        let path = uroce_engine::PathAttr {
            dest: remote.gid,
            dest_qpn: remote.qpn,
            mtu: self.mtu.min(remote.mtu),
            sq_psn: self.psn,
            rq_psn: remote.psn,
        };
        let reliability = uroce_engine::Reliability {
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            max_rd_atomic: self.max_rd_atomic,
            ..uroce_engine::Reliability::default()
        };
        self.ctx.dev.with(|s| -> Result<()> {
            s.engine().connect_qp(self.qpn, &path, &reliability)?;
            Ok(())
        })
    }

    /// Posts a send work request (`ibv_post_send(3)`): any operation, with the elements,
    /// flags and data [`SendRequest`] gives it. The helpers below post the common ones,
    /// signaled.
    pub fn post_send(&self, wr: SendRequest) -> Result<()> {
        self.post_wr(wr.wr)
    }

    /// Posts `wrs` in order under one lock of the device, as one `ibv_post_send(3)` call posts
    /// a list: the first refused request stops the list, and its index comes back with the
    /// error (what the verb's `bad_wr` names); the requests before it are posted.
    pub fn post_send_list(
        &self,
        wrs: impl IntoIterator<Item = SendRequest>,
    ) -> core::result::Result<(), (usize, Error)> {
        self.ctx.dev.post_with(self.qpn, |s| {
            for (i, wr) in wrs.into_iter().enumerate() {
                s.engine().post_send(self.qpn, wr.wr).map_err(|e| (i, e.into()))?;
            }
            Ok(())
        })
    }

    fn post_wr(&self, wr: SendWr) -> Result<()> {
        self.ctx.dev.post_with(self.qpn, |s| s.engine().post_send(self.qpn, wr))?;
        Ok(())
    }

    /// Posts a receive of `range` of `mr`.
    pub fn post_recv(&self, wr_id: u64, mr: &Mr, range: Range<usize>) -> Result<()> {
        let wr = RecvWr { wr_id, sg_list: [mr.sge(range)?].into() };
        self.ctx.dev.post_recv_with(|s| s.engine().post_recv(self.qpn, wr))?;
        Ok(())
    }

    /// SEND of `range` of `mr`.
    pub fn send(&self, wr_id: u64, mr: &Mr, range: Range<usize>) -> Result<()> {
        self.post_wr(SendWr::new(wr_id, WrOpcode::Send, [mr.sge(range)?]))
    }

    /// SEND with immediate data.
    pub fn send_with_imm(&self, wr_id: u64, mr: &Mr, range: Range<usize>, imm: u32) -> Result<()> {
        let mut wr = SendWr::new(wr_id, WrOpcode::SendWithImm, [mr.sge(range)?]);
        wr.imm = Some(imm.to_be_bytes());
        self.post_wr(wr)
    }

    /// RDMA WRITE with immediate data to an exact remote address: the peer's receive WQE
    /// completes with the immediate.
    pub fn write_with_imm(
        &self,
        wr_id: u64,
        mr: &Mr,
        range: Range<usize>,
        remote: impl Into<RemoteAddr>,
        imm: u32,
    ) -> Result<()> {
        let mut wr = SendWr::new(wr_id, WrOpcode::RdmaWriteWithImm, [mr.sge(range)?]);
        wr.remote = Some(remote.into());
        wr.imm = Some(imm.to_be_bytes());
        self.post_wr(wr)
    }

    /// RDMA WRITE of `range` of `mr` to `remote`: an address ([`RemoteMr::at`]) or a region
    /// (its first byte).
    pub fn write(
        &self,
        wr_id: u64,
        mr: &Mr,
        range: Range<usize>,
        remote: impl Into<RemoteAddr>,
    ) -> Result<()> {
        let mut wr = SendWr::new(wr_id, WrOpcode::RdmaWrite, [mr.sge(range)?]);
        wr.remote = Some(remote.into());
        self.post_wr(wr)
    }

    /// RDMA READ of `range.len()` bytes from `remote` into `range` of `mr`.
    pub fn read(
        &self,
        wr_id: u64,
        mr: &Mr,
        range: Range<usize>,
        remote: impl Into<RemoteAddr>,
    ) -> Result<()> {
        let mut wr = SendWr::new(wr_id, WrOpcode::RdmaRead, [mr.sge(range)?]);
        wr.remote = Some(remote.into());
        self.post_wr(wr)
    }

    /// Atomic fetch-and-add of `add` on the 8 bytes at `remote`; the old value lands at
    /// `offset` of `mr`.
    pub fn fetch_add(
        &self,
        wr_id: u64,
        mr: &Mr,
        offset: usize,
        remote: impl Into<RemoteAddr>,
        add: u64,
    ) -> Result<()> {
        let mut wr = SendWr::new(wr_id, WrOpcode::AtomicFetchAndAdd, [mr.sge(offset..offset + 8)?]);
        wr.remote = Some(remote.into());
        wr.compare_add = add;
        self.post_wr(wr)
    }

    /// Atomic compare-and-swap; the old value lands at `offset` of `mr`.
    pub fn compare_swap(
        &self,
        wr_id: u64,
        mr: &Mr,
        offset: usize,
        remote: impl Into<RemoteAddr>,
        compare: u64,
        swap: u64,
    ) -> Result<()> {
        let mut wr = SendWr::new(wr_id, WrOpcode::AtomicCmpAndSwp, [mr.sge(offset..offset + 8)?]);
        wr.remote = Some(remote.into());
        (wr.compare_add, wr.swap) = (compare, swap);
        self.post_wr(wr)
    }

    /// SEND of `data` inline (`IBV_SEND_INLINE`): the bytes are copied at post time, no
    /// memory region is named, and the buffer may be reused at once. At most the QP's
    /// `max_inline` bytes. For UD, `to` names the destination.
    pub fn send_inline(&self, wr_id: u64, data: &[u8], to: Option<(&Ah, Qpn, QKey)>) -> Result<()> {
        let mut wr = SendWr::new(wr_id, WrOpcode::Send, SgList::new());
        wr.inline_data = Some(data.to_vec());
        if let Some((ah, remote_qpn, remote_qkey)) = to {
            wr.ud = Some(UdDest { ah: ah.handle, remote_qpn, remote_qkey });
        }
        self.post_wr(wr)
    }

    /// UD: SEND of `range` of `mr` to QP `remote_qpn` (or [`Qpn::MULTICAST`]) behind `ah`.
    pub fn send_to(
        &self,
        wr_id: u64,
        mr: &Mr,
        range: Range<usize>,
        ah: &Ah,
        remote_qpn: Qpn,
        qkey: QKey,
    ) -> Result<()> {
        let mut wr = SendWr::new(wr_id, WrOpcode::Send, [mr.sge(range)?]);
        wr.ud = Some(UdDest { ah: ah.handle, remote_qpn, remote_qkey: qkey });
        self.post_wr(wr)
    }

    /// UD: joins multicast group `group`.
    pub fn attach_mcast(&self, group: IpAddr) -> Result<()> {
        self.ctx.dev.with(|s| -> Result<()> {
            s.engine().attach_mcast(self.qpn, group)?;
            s.sync_multicast()?;
            Ok(())
        })
    }

    /// UD: leaves multicast group `group`.
    pub fn detach_mcast(&self, group: IpAddr) -> Result<()> {
        self.ctx.dev.with(|s| -> Result<()> {
            s.engine().detach_mcast(self.qpn, group)?;
            s.sync_multicast()?;
            Ok(())
        })
    }
}

/// Work completion helpers.
pub trait CompletionExt {
    /// Whether the status is `SUCCESS`.
    fn ok(&self) -> bool;
}

impl CompletionExt for WorkCompletion {
    fn ok(&self) -> bool {
        self.status == WcStatus::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_round_trips_and_rejects_garbage() {
        let e = Endpoint {
            gid: "127.0.0.2".parse().unwrap(),
            qpn: Qpn::new(0x12345).unwrap(),
            psn: Psn::new(0xABCDE).unwrap(),
            mtu: Mtu::Mtu2048,
            qkey: QKey(7),
            regions: vec![RemoteMr { addr: 0x7f00_0000_1000, len: 1 << 20, rkey: RKey(0xDEAD) }],
        };
        assert_eq!(Endpoint::from_bytes(&e.to_bytes()).unwrap(), e);
        let b = e.to_bytes();
        let v6 = Endpoint { gid: "fd00::2".parse().unwrap(), regions: vec![], ..e };
        assert_eq!(Endpoint::from_bytes(&v6.to_bytes()).unwrap(), v6);
        for cut in 0..b.len() {
            assert!(Endpoint::from_bytes(&b[..cut]).is_err(), "truncated at {cut}");
        }
        assert!(Endpoint::from_bytes(b"XXXX").is_err());
    }
}
