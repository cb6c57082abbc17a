//! A uroce device on a real UDP socket: the engine behind a lock, driven by whoever calls into
//! it and by a background progress thread.

use core::net::{IpAddr, SocketAddr};
use core::time::Duration;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, BufWriter};
use std::net::UdpSocket;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use uroce_engine::device::Piece;
use uroce_engine::{
    Access, AsyncEvent, CqHandle, CreateError, DestroyError, Device, DeviceConfig, Instant, LKey,
    MemoryAccess, MemoryRegion, Mtu, PdHandle, RxInfo,
};
use uroce_wire::ROCE_V2_PORT;
use uroce_wire::pcap::PcapWriter;

use crate::faults::{FaultRng, Faults, FaultsError};
use crate::sys::memory::Registry;
use crate::sys::{self, EventFd, RawRegion, RecvBatch};

/// How a device is opened. [`Options::from_env`] reads `UROCE_PCAP` and `UROCE_FAULTS`.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Seed for keys, QPNs and fault draws; by default from the address and the process id.
    pub seed: Option<u64>,
    /// Write every packet sent and received to this pcap file.
    pub pcap: Option<PathBuf>,
    /// Faults to inject on send and on receive.
    pub faults: Faults,
    /// Run the background progress thread (default). Without it only calls into the device
    /// make progress: for single-threaded busy-polling benchmarks.
    pub no_progress_thread: bool,
    /// Run the progress thread under `SCHED_FIFO` (needs `CAP_SYS_NICE`; `UROCE_PROGRESS_RT=1`).
    /// A one-sided operation lands only when the progress thread runs; when every core is busy
    /// with application threads spinning (perftest's `ib_write_lat` on two cores: both sides
    /// spin on memory), an ordinary thread waits for the scheduler's next tick, milliseconds.
    /// A real-time one runs at once, as a NIC would; it costs bandwidth when the application
    /// polls (it preempts the poller), so it is not the default.
    pub realtime_progress: bool,
    /// After a round of progress that received datagrams, the progress thread keeps polling
    /// the sockets this long (since the last datagram) before it sleeps
    /// (`UROCE_PROGRESS_SPIN_US`). A passive RDMA READ or WRITE target then answers without
    /// a thread wake-up per request, when a core is free to spin on; when every core is
    /// already spinning (both sides of `ib_write_lat` on two cores) it only adds contention,
    /// so it is off by default.
    pub progress_spin: Option<Duration>,
    /// The port MTU. By default it is derived from the MTU of the address's interface as RoCE
    /// NICs derive it (Linux rxe: the largest IB MTU that fits the interface MTU less 80 bytes
    /// of headers): 4096 on loopback, 1024 on 1500-byte Ethernet.
    pub port_mtu: Option<Mtu>,
    /// Copy every payload into its packet instead of sending it from registered memory (for
    /// measuring what zero copy buys).
    pub copy_payloads: bool,
}

impl Options {
    /// Defaults, with `UROCE_PCAP=FILE` and `UROCE_FAULTS=loss=…,dup=…,reorder=…,corrupt=…`
    /// applied when set.
    pub fn from_env() -> Result<Self, FaultsError> {
        let mut o = Self::default();
        if let Some(p) = std::env::var_os("UROCE_PCAP").filter(|p| !p.is_empty()) {
            o.pcap = Some(PathBuf::from(p));
        }
        if let Ok(f) = std::env::var("UROCE_FAULTS") {
            o.faults = Faults::parse(&f)?;
        }
        o.realtime_progress = std::env::var("UROCE_PROGRESS_RT").is_ok_and(|v| v == "1");
        o.progress_spin = std::env::var("UROCE_PROGRESS_SPIN_US")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&us| us > 0)
            .map(Duration::from_micros);
        Ok(o)
    }
}

/// The IB MTU a port has on an interface of `if_mtu` bytes: the largest that leaves room for
/// the RoCEv2 headers (rxe reserves 80 bytes: IP, UDP, BTH, the largest extension header and
/// ICRC).
fn port_mtu_for(if_mtu: u32) -> Mtu {
    let room = if_mtu.saturating_sub(80);
    Mtu::ALL.into_iter().rev().find(|m| m.bytes() <= room).unwrap_or(Mtu::Mtu256)
}

/// Why a device could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// Another socket (another uroce device?) has the address's RoCEv2 port.
    AddressInUse(SocketAddr),
    /// The address is not one of this host's.
    AddressNotAvailable(IpAddr),
    /// `UROCE_FAULTS` is malformed.
    Faults(FaultsError),
    /// The capture file could not be created.
    Capture(PathBuf, io::Error),
    /// Any other failure of the system.
    Io(SocketAddr, io::Error),
}

impl core::fmt::Display for OpenError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::AddressInUse(a) => {
                write!(f, "{a} is already in use (another device on {})", a.ip())
            }
            Self::AddressNotAvailable(a) => write!(f, "{a} is not an address of this host"),
            Self::Faults(e) => write!(f, "{e}"),
            Self::Capture(p, e) => write!(f, "cannot write capture {}: {e}", p.display()),
            Self::Io(a, e) => write!(f, "cannot open a device on {a}: {e}"),
        }
    }
}

impl std::error::Error for OpenError {}

/// Counters of the runtime (the engine's own are [`Device::counters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetCounters {
    /// Datagrams handed to the kernel.
    pub tx_datagrams: u64,
    /// `sendmmsg` calls.
    pub tx_batches: u64,
    /// Datagrams the kernel refused (full socket buffer, no route): lost, as on a wire.
    pub tx_errors: u64,
    /// Datagrams whose payload the kernel took straight from registered memory.
    pub tx_zero_copy: u64,
    /// Their payload bytes.
    pub tx_zero_copy_bytes: u64,
    /// Datagrams read from the sockets.
    pub rx_datagrams: u64,
    /// `recvmmsg` calls that returned data.
    pub rx_batches: u64,
    /// Injected faults: dropped, duplicated, reordered, corrupted (both directions).
    pub fault_drops: u64,
    /// See `fault_drops`.
    pub fault_dups: u64,
    /// See `fault_drops`.
    pub fault_reorders: u64,
    /// See `fault_drops`.
    pub fault_corruptions: u64,
    /// Times the progress thread woke up.
    pub progress_wakeups: u64,
    /// Asynchronous events no subscriber claimed (their object was destroyed meanwhile).
    pub async_events_unclaimed: u64,
}

/// A subscription to asynchronous events ([`State::subscribe_async`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubscriberId(u64);

struct AsyncSubscriber {
    id: SubscriberId,
    fd: Arc<EventFd>,
    wants: Box<dyn Fn(&AsyncEvent) -> bool + Send>,
    queue: VecDeque<AsyncEvent>,
}

/// A completion channel (`ibv_comp_channel`): a pollable eventfd and the CQs whose armed
/// notification fired, oldest first.
#[derive(Debug)]
pub struct Channel {
    fd: EventFd,
    events: Mutex<VecDeque<CqHandle>>,
}

impl Channel {
    /// A channel with no events.
    pub fn new() -> io::Result<Self> {
        Ok(Self { fd: EventFd::new()?, events: Mutex::new(VecDeque::new()) })
    }

    /// A channel whose descriptor is in blocking mode ([`EventFd::new_blocking`]), for
    /// `ibv_comp_channel`.
    pub fn new_blocking() -> io::Result<Self> {
        Ok(Self { fd: EventFd::new_blocking()?, events: Mutex::new(VecDeque::new()) })
    }

    /// The next CQ event, without blocking.
    pub fn try_get(&self) -> Option<CqHandle> {
        let mut q = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        let e = q.pop_front();
        if q.is_empty() {
            self.fd.take();
        }
        e
    }

    /// The next CQ event, waiting up to `timeout` (forever if `None`).
    pub fn get(&self, timeout: Option<Duration>) -> io::Result<Option<CqHandle>> {
        #[expect(clippy::disallowed_methods, reason = "the runtime owns the clock")]
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if let Some(e) = self.try_get() {
                return Ok(Some(e));
            }
            let ms = match deadline {
                None => -1,
                Some(d) => {
                    #[expect(clippy::disallowed_methods, reason = "the runtime owns the clock")]
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX)
                }
            };
            sys::poll_readable(&[self.fd.as_raw_fd()], ms)?;
        }
    }

    fn push(&self, cq: CqHandle) {
        self.events.lock().unwrap_or_else(PoisonError::into_inner).push_back(cq);
        self.fd.signal();
    }
}

impl AsRawFd for Channel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A packet ready to go: its source port, destination and bytes — all of them, or (when
/// `payload_at` is set) the headers and trailer around payload pieces of registered memory.
struct Outgoing {
    port: u16,
    dst: SocketAddr,
    bytes: Vec<u8>,
    payload_at: Option<usize>,
    pieces: Vec<Piece>,
}

impl Outgoing {
    /// The whole packet in `bytes` (for capture and fault injection, which need it in one
    /// piece): copies the payload in from registered memory.
    fn materialize(&mut self, mem: &Registry) {
        let Some(h) = self.payload_at.take() else { return };
        let trailer = self.bytes.split_off(h);
        for &(addr, len) in &self.pieces {
            let at = self.bytes.len();
            self.bytes.resize(at + len as usize, 0);
            mem.read(addr, &mut self.bytes[at..]);
        }
        self.bytes.extend_from_slice(&trailer);
        self.pieces.clear();
    }
}

/// Everything behind the device lock.
pub struct State {
    engine: Device<Registry>,
    addr: IpAddr,
    origin: std::time::Instant,
    /// Wall-clock time at `origin`, for capture timestamps.
    wall_origin: Duration,
    main: Arc<UdpSocket>,
    /// Send sockets by UDP source port (each QP's flow entropy; RoCEv2 sends to 4791 from a
    /// per-flow port, and a UDP socket sends from the port it is bound to).
    send_socks: HashMap<u16, UdpSocket>,
    /// Receive sockets of the multicast groups QPs are attached to.
    mcast_socks: HashMap<IpAddr, Arc<UdpSocket>>,
    pcap: Option<PcapWriter<BufWriter<File>>>,
    faults: Faults,
    rng: FaultRng,
    held_tx: Option<Outgoing>,
    recv: RecvBatch,
    out: Vec<Outgoing>,
    pool: Vec<Vec<u8>>,
    piece_pool: Vec<Vec<Piece>>,
    channels: HashMap<CqHandle, Arc<Channel>>,
    async_events: VecDeque<AsyncEvent>,
    /// Where asynchronous events go when any subscriber exists (each C context of a device is
    /// one); otherwise they wait in `async_events`.
    async_subscribers: Vec<AsyncSubscriber>,
    next_subscriber: u64,
    counters: NetCounters,
    /// Regions whose owner let go while work requests still named them.
    deferred_deregs: Vec<LKey>,
    copy_payloads: bool,
}

impl State {
    /// The engine: every verb.
    pub fn engine(&mut self) -> &mut Device<Registry> {
        &mut self.engine
    }

    /// The runtime's counters.
    pub fn counters(&self) -> NetCounters {
        self.counters
    }

    /// Registers `region` in `pd` with `access`.
    pub fn register(
        &mut self,
        pd: PdHandle,
        region: Arc<RawRegion>,
        access: Access,
    ) -> Result<MemoryRegion, CreateError> {
        let (addr, len) = (region.addr(), region.len() as u64);
        let mr = self.engine.reg_mr(pd, addr, len, access)?;
        self.engine.memory_mut().insert(region);
        Ok(mr)
    }

    /// Deregisters a region, or, while a work request not yet completed names it, defers
    /// that until the last such one completes: an outstanding work request keeps its memory
    /// alive (the registry holds the region). Then the keys stop working and the engine can no
    /// longer reach the memory.
    pub fn deregister(&mut self, lkey: LKey) {
        if self.engine.lkey_in_use(lkey) {
            self.deferred_deregs.push(lkey);
            return;
        }
        self.deregister_now(lkey);
    }

    /// Deregisters a region at once, as `ibv_dereg_mr` does: work requests still naming it
    /// fail with a protection error when they reach it, and the engine never touches its
    /// memory again (a C caller may free the memory as soon as this returns).
    pub fn deregister_now(&mut self, lkey: LKey) -> Option<MemoryRegion> {
        let mr = self.engine.dereg_mr(lkey)?;
        self.engine.memory_mut().remove(mr.addr, mr.length);
        Some(mr)
    }

    /// Subscribes to the asynchronous events `wants` claims (those of one `ibv_context`'s
    /// objects): each is queued for the first subscriber that claims it, and its `fd` is
    /// readable exactly while its queue holds events (`ibv_context.async_fd`). Events nobody
    /// claims are dropped (and counted). Until the first subscription, events wait for
    /// [`State::poll_async_event`].
    pub fn subscribe_async(
        &mut self,
        fd: Arc<EventFd>,
        wants: Box<dyn Fn(&AsyncEvent) -> bool + Send>,
    ) -> SubscriberId {
        let id = SubscriberId(self.next_subscriber);
        self.next_subscriber += 1;
        self.async_subscribers.push(AsyncSubscriber { id, fd, wants, queue: VecDeque::new() });
        id
    }

    /// Ends a subscription; its queued events are dropped.
    pub fn unsubscribe_async(&mut self, id: SubscriberId) {
        self.async_subscribers.retain(|s| s.id != id);
    }

    /// The next asynchronous event of a subscriber.
    pub fn poll_async_event_for(&mut self, id: SubscriberId) -> Option<AsyncEvent> {
        let s = self.async_subscribers.iter_mut().find(|s| s.id == id)?;
        let e = s.queue.pop_front();
        if s.queue.is_empty() {
            // Signalled under this same lock, so taking it here never loses an event.
            s.fd.take();
        }
        e
    }

    /// Queues an engine event for its subscriber, or for `poll_async_event` when there are
    /// none.
    fn route_async(&mut self, e: AsyncEvent) {
        if self.async_subscribers.is_empty() {
            self.async_events.push_back(e);
            return;
        }
        match self.async_subscribers.iter_mut().find(|s| (s.wants)(&e)) {
            Some(s) => {
                s.queue.push_back(e);
                s.fd.signal();
            }
            None => self.counters.async_events_unclaimed += 1,
        }
    }

    /// Regions still registered (deferred deregistrations included).
    pub fn registered_regions(&self) -> usize {
        self.engine.mr_count()
    }

    /// Completes the deferred deregistrations whose work requests have all completed.
    fn retry_deregs(&mut self) {
        if self.deferred_deregs.is_empty() {
            return;
        }
        let pending = core::mem::take(&mut self.deferred_deregs);
        for lkey in pending {
            self.deregister(lkey);
        }
    }

    /// Copies bytes out of a registered region; `false` if out of range.
    pub fn read_region(&self, region: &RawRegion, offset: usize, dst: &mut [u8]) -> bool {
        self.engine.memory().copy_out(region, offset, dst)
    }

    /// Copies bytes into a registered region; `false` if out of range.
    pub fn write_region(&mut self, region: &RawRegion, offset: usize, src: &[u8]) -> bool {
        self.engine.memory_mut().copy_in(region, offset, src)
    }

    /// Routes `cq`'s notifications to `channel` (`ibv_create_cq` with a channel).
    pub fn bind_channel(&mut self, cq: CqHandle, channel: Arc<Channel>) {
        self.channels.insert(cq, channel);
    }

    /// Destroys a completion queue and lets go of its channel (`ibv_destroy_cq`).
    pub fn destroy_cq(&mut self, cq: CqHandle) -> Result<(), DestroyError> {
        self.engine.destroy_cq(cq)?;
        self.channels.remove(&cq);
        Ok(())
    }

    /// The next asynchronous event.
    pub fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.async_events.pop_front()
    }

    /// Opens and closes group sockets to match the engine's multicast attachments.
    pub fn sync_multicast(&mut self) -> io::Result<()> {
        let groups: Vec<IpAddr> = self.engine.multicast_groups().collect();
        self.mcast_socks.retain(|g, _| groups.contains(g));
        for g in groups {
            if !self.mcast_socks.contains_key(&g) {
                let s = sys::udp_socket(SocketAddr::new(g, ROCE_V2_PORT), true)?;
                sys::join_multicast(&s, g, self.addr)?;
                self.mcast_socks.insert(g, Arc::new(s));
            }
        }
        Ok(())
    }

    fn now(&self) -> Instant {
        let ns = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        Instant::from_nanos(ns)
    }

    /// One round of progress: everything the sockets hold, due timers, then everything the
    /// engine has to send, and the events it raised.
    fn progress(&mut self) {
        let now = self.now();
        let main = Arc::clone(&self.main);
        self.drain(&main, now);
        if !self.mcast_socks.is_empty() {
            let groups: Vec<Arc<UdpSocket>> = self.mcast_socks.values().cloned().collect();
            for sock in &groups {
                self.drain(sock, now);
            }
        }
        let now = self.now();
        if self.engine.poll_timeout().is_some_and(|t| t <= now) {
            self.engine.handle_timeout(now);
        }
        self.flush(now);
    }

    /// Hands the engine what `sock` holds, a batch at a time.
    fn drain(&mut self, sock: &UdpSocket, now: Instant) {
        // Bounded: a flood cannot keep one caller here for ever.
        for _ in 0..16 {
            let Ok(n) = self.recv.recv(sock) else { break };
            if n == 0 {
                break;
            }
            self.counters.rx_batches += 1;
            self.counters.rx_datagrams += n as u64;
            for i in 0..n {
                self.receive(i, now);
            }
            if n < RECV_BATCH {
                break;
            }
        }
    }

    /// Datagram `i` of the last batch, straight from the receive buffer (a corrupting fault
    /// works on a copy).
    fn receive(&mut self, i: usize, now: Instant) {
        let meta = self.recv.meta[i];
        let payload = self.recv.payload(i);
        let dst = meta.dst.unwrap_or(self.addr);
        if let Some(w) = &mut self.pcap {
            let ts = self.wall_origin + self.origin.elapsed();
            let _ = w.write_roce(ts, meta.src, SocketAddr::new(dst, ROCE_V2_PORT), payload);
        }
        let rx = RxInfo {
            src: meta.src,
            dst,
            tclass: meta.tclass,
            hop_limit: meta.hop_limit,
            flow_label: 0,
        };
        if !self.faults.any() {
            self.engine.handle_datagram(now, &rx, payload);
            return;
        }
        let fate = self.rng.fate(&self.faults, payload.len());
        if fate.drop {
            self.counters.fault_drops += 1;
            return;
        }
        let corrupted;
        let bytes = match fate.flip {
            Some(bit) => {
                let mut copy = payload.to_vec();
                copy[bit / 8] ^= 1 << (bit % 8);
                self.counters.fault_corruptions += 1;
                corrupted = copy;
                &corrupted[..]
            }
            None => payload,
        };
        self.engine.handle_datagram(now, &rx, bytes);
        if fate.dup {
            self.counters.fault_dups += 1;
            self.engine.handle_datagram(now, &rx, bytes);
        }
    }

    fn pool_buf(&mut self) -> Vec<u8> {
        self.pool.pop().unwrap_or_else(|| Vec::with_capacity(sys::MAX_DATAGRAM))
    }

    /// Sends everything the engine has ready, and hands out the events it raised.
    fn flush(&mut self, now: Instant) {
        loop {
            let mut buf = self.pool_buf();
            let mut pieces = self.piece_pool.pop().unwrap_or_default();
            let tx = if self.copy_payloads {
                pieces.clear();
                self.engine.poll_transmit(now, &mut buf)
            } else {
                self.engine.poll_transmit_gather(now, &mut buf, &mut pieces)
            };
            let Some(tx) = tx else {
                self.pool.push(buf);
                self.piece_pool.push(pieces);
                break;
            };
            let mut o = Outgoing {
                port: tx.src_port,
                dst: tx.dst,
                bytes: buf,
                payload_at: tx.payload_at,
                pieces,
            };
            if self.pcap.is_some() || self.faults.any() {
                o.materialize(self.engine.memory());
            }
            self.stage(o);
            if self.out.len() >= 64 {
                self.send_out();
            }
        }
        if let Some(held) = self.held_tx.take() {
            self.out.push(held);
        }
        self.send_out();
        while let Some(cq) = self.engine.poll_cq_event() {
            if let Some(ch) = self.channels.get(&cq) {
                ch.push(cq);
            }
        }
        while let Some(e) = self.engine.poll_async_event() {
            self.route_async(e);
        }
        self.retry_deregs();
    }

    /// Applies the send faults and queues the packet.
    fn stage(&mut self, mut o: Outgoing) {
        if !self.faults.any() {
            self.out.push(o);
            return;
        }
        let fate = self.rng.fate(&self.faults, o.bytes.len());
        if fate.drop {
            self.counters.fault_drops += 1;
            self.pool.push(o.bytes);
            return;
        }
        if let Some(bit) = fate.flip {
            o.bytes[bit / 8] ^= 1 << (bit % 8);
            self.counters.fault_corruptions += 1;
        }
        if fate.dup {
            self.counters.fault_dups += 1;
            let copy = Outgoing { bytes: o.bytes.clone(), pieces: Vec::new(), ..o };
            self.out.push(copy);
        }
        if fate.hold && self.held_tx.is_none() {
            self.counters.fault_reorders += 1;
            self.held_tx = Some(o);
            return;
        }
        self.out.push(o);
        if let Some(held) = self.held_tx.take() {
            self.out.push(held);
        }
    }

    /// Hands the queued packets to the kernel, one `sendmmsg` per run of one source port.
    fn send_out(&mut self) {
        let out = core::mem::take(&mut self.out);
        let mut start = 0;
        while start < out.len() {
            let port = out[start].port;
            let end =
                out[start..].iter().position(|o| o.port != port).map_or(out.len(), |k| start + k);
            let run = &out[start..end];
            if let Some(w) = &mut self.pcap {
                let ts = self.wall_origin + self.origin.elapsed();
                for o in run {
                    let _ = w.write_roce(ts, SocketAddr::new(self.addr, port), o.dst, &o.bytes);
                }
            }
            let sent = if self.send_sock(port).is_some() {
                let (mem, sock) = (self.engine.memory(), &self.send_socks[&port]);
                // Headers, the payload where it lies in registered memory, the trailer.
                let list: Vec<(SocketAddr, Vec<&[u8]>)> = run
                    .iter()
                    .map(|o| {
                        let parts = match o.payload_at {
                            None => vec![&o.bytes[..]],
                            Some(h) => {
                                let mut p = Vec::with_capacity(o.pieces.len() + 2);
                                p.push(&o.bytes[..h]);
                                p.extend(
                                    o.pieces.iter().filter_map(|&(a, l)| mem.slice(a, l as usize)),
                                );
                                p.push(&o.bytes[h..]);
                                p
                            }
                        };
                        (o.dst, parts)
                    })
                    .collect();
                sys::send_batch(sock, &list).unwrap_or(0)
            } else {
                0
            };
            for o in run.iter().take(sent).filter(|o| o.payload_at.is_some()) {
                self.counters.tx_zero_copy += 1;
                self.counters.tx_zero_copy_bytes +=
                    o.pieces.iter().map(|&(_, l)| u64::from(l)).sum::<u64>();
            }
            self.counters.tx_batches += 1;
            self.counters.tx_datagrams += sent as u64;
            self.counters.tx_errors += (run.len() - sent) as u64;
            start = end;
        }
        if let Some(w) = &mut self.pcap {
            let _ = w.flush();
        }
        for o in out {
            self.pool.push(o.bytes);
            self.piece_pool.push(o.pieces);
        }
    }

    /// The socket that sends from UDP source port `port`, bound on first use.
    fn send_sock(&mut self, port: u16) -> Option<&UdpSocket> {
        if !self.send_socks.contains_key(&port) {
            let s = sys::udp_socket(SocketAddr::new(self.addr, port), false).ok()?;
            sys::set_multicast_if(&s, self.addr).ok()?;
            self.send_socks.insert(port, s);
        }
        self.send_socks.get(&port)
    }
}

const RECV_BATCH: usize = 32;

struct Shared {
    state: Mutex<State>,
    wake: EventFd,
    stop: AtomicBool,
    /// When the progress thread will wake on its own (device nanoseconds; `u64::MAX`: never).
    sleeping_until: AtomicU64,
    /// When an application thread last busy-polled (device nanoseconds).
    last_busy_poll: AtomicU64,
    /// The device clock's origin (the same instant as `State::origin`).
    origin: std::time::Instant,
    addr: IpAddr,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether an application thread busy-polled within the grace period before `now`.
    fn busy_polled(&self, now: Instant) -> bool {
        let last = self.last_busy_poll.load(Ordering::Acquire);
        last != 0 && now.as_nanos().saturating_sub(last) < BUSY_POLL_GRACE_NS
    }
}

/// Polls the sockets (a round of progress at a time, the lock released in between) until
/// `spin_ns` pass without a datagram, the device stops, or an application thread takes over
/// by busy-polling.
fn spin(shared: &Shared, spin_ns: u64) {
    let mut quiet_since = shared.now_ns();
    let mut seen = None;
    loop {
        let (rx, now) = {
            let mut s = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            s.progress();
            (s.counters.rx_datagrams, s.now())
        };
        if seen != Some(rx) {
            seen = Some(rx);
            quiet_since = now.as_nanos();
        }
        let quiet = now.as_nanos().saturating_sub(quiet_since) >= spin_ns;
        if quiet || shared.stop.load(Ordering::Acquire) || shared.busy_polled(now) {
            return;
        }
        core::hint::spin_loop();
    }
}

/// While an application thread busy-polls, it receives everything itself; the progress thread
/// then leaves the sockets to it (a second reader would only steal packets and, on a small
/// machine, the CPU) and looks in this often for timers, or to take over once polling stops.
const BUSY_POLL_GRACE_NS: u64 = 1_000_000;

/// A uroce device bound to one address, with its progress thread.
pub struct NetDevice {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl core::fmt::Debug for NetDevice {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("NetDevice").field("addr", &self.shared.addr).finish_non_exhaustive()
    }
}

impl NetDevice {
    /// Opens the device of `addr`: binds UDP port 4791 there.
    pub fn open(addr: IpAddr, options: Options) -> Result<Self, OpenError> {
        let local = SocketAddr::new(addr, ROCE_V2_PORT);
        let main = sys::udp_socket(local, false).map_err(|e| match e.raw_os_error() {
            Some(libc::EADDRINUSE) => OpenError::AddressInUse(local),
            Some(libc::EADDRNOTAVAIL) => OpenError::AddressNotAvailable(addr),
            _ => OpenError::Io(local, e),
        })?;
        let pcap = match &options.pcap {
            Some(path) => {
                let file = File::create(path).map_err(|e| OpenError::Capture(path.clone(), e))?;
                Some(
                    PcapWriter::new(BufWriter::new(file))
                        .map_err(|e| OpenError::Capture(path.clone(), e))?,
                )
            }
            None => None,
        };
        #[expect(clippy::disallowed_methods, reason = "the runtime owns the clock")]
        let (origin, wall_origin) = (
            std::time::Instant::now(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default(),
        );
        let seed = options.seed.unwrap_or_else(|| {
            let a = match addr {
                IpAddr::V4(a) => u64::from(a.to_bits()),
                IpAddr::V6(a) => u64::from_le_bytes(a.octets()[8..].try_into().unwrap_or([0; 8])),
            };
            let nanos = u64::try_from(wall_origin.as_nanos() & u128::from(u64::MAX)).unwrap_or(0);
            a ^ (u64::from(std::process::id()) << 32) ^ nanos
        });
        let mut config = DeviceConfig::new(addr, seed);
        config.port_mtu = options
            .port_mtu
            .unwrap_or_else(|| sys::interface_mtu(&main, addr).map_or(Mtu::Mtu4096, port_mtu_for));
        let state = State {
            engine: Device::new(config, Registry::default()),
            addr,
            origin,
            wall_origin,
            main: Arc::new(main),
            send_socks: HashMap::new(),
            mcast_socks: HashMap::new(),
            pcap,
            faults: options.faults,
            rng: FaultRng::new(seed ^ 0xFA17),
            held_tx: None,
            recv: RecvBatch::new(RECV_BATCH),
            out: Vec::with_capacity(64),
            pool: Vec::new(),
            piece_pool: Vec::new(),
            channels: HashMap::new(),
            async_events: VecDeque::new(),
            async_subscribers: Vec::new(),
            next_subscriber: 1,
            counters: NetCounters::default(),
            deferred_deregs: Vec::new(),
            copy_payloads: options.copy_payloads,
        };
        let wake = EventFd::new().map_err(|e| OpenError::Io(local, e))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            wake,
            stop: AtomicBool::new(false),
            sleeping_until: AtomicU64::new(u64::MAX),
            last_busy_poll: AtomicU64::new(0),
            origin,
            addr,
        });
        let thread = if options.no_progress_thread {
            None
        } else {
            let s = Arc::clone(&shared);
            let realtime = options.realtime_progress;
            let spin = options
                .progress_spin
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
            let t = std::thread::Builder::new()
                .name(format!("uroce-progress-{addr}"))
                .spawn(move || {
                    if let Some(Err(e)) = realtime.then(|| sys::set_realtime(1)) {
                        eprintln!(
                            "uroce: the progress thread stays SCHED_OTHER: SCHED_FIFO: {e} (it \
                             needs CAP_SYS_NICE)"
                        );
                    }
                    progress_thread(&s, spin);
                })
                .map_err(|e| OpenError::Io(local, e))?;
            Some(t)
        };
        Ok(Self { shared, thread })
    }

    /// The device's address.
    pub fn addr(&self) -> IpAddr {
        self.shared.addr
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the device state under its lock, then sends what it produced and lets the
    /// progress thread know of any earlier timer. Every verb goes through here.
    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut s = self.lock();
        let r = f(&mut s);
        let now = s.now();
        s.flush(now);
        let next = s.engine.poll_timeout().map(Instant::as_nanos);
        drop(s);
        if next.is_some_and(|t| t < self.shared.sleeping_until.load(Ordering::Acquire)) {
            self.shared.wake.signal();
        }
        r
    }

    /// One round of progress in the calling thread (receive, timers, send): what polling a CQ
    /// does before it looks at the queue.
    pub fn progress(&self) {
        self.with(State::progress);
    }

    /// For a thread about to block (on a completion channel, say) after polling: ends the
    /// busy-poll mark [`NetDevice::poll_with`] set, so the progress thread goes back to the
    /// sockets now instead of at its next check-in.
    pub fn end_busy_poll(&self) {
        if self.shared.last_busy_poll.swap(0, Ordering::AcqRel) != 0 {
            self.shared.wake.signal();
        }
    }

    /// For a thread that busy-polls: a round of progress, then `f`, under one acquisition of
    /// the lock. While such a thread keeps polling, the progress thread stays off the sockets
    /// (it looks in every millisecond for timers, and takes over when polling stops).
    ///
    /// A poll that leaves no work request pending ends the busy-poll mark instead: the
    /// application cannot be waiting for a completion then, but may be waiting for a one-sided
    /// operation to land in its memory (perftest's `ib_write_lat` spins on the buffer), which
    /// only the progress thread will take off the socket.
    pub fn poll_with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let (r, pending) = self.with(|s| {
            s.progress();
            let r = f(s);
            (r, s.engine.has_pending_work())
        });
        if pending {
            self.shared.last_busy_poll.store(self.shared.now_ns().max(1), Ordering::Release);
        } else {
            self.end_busy_poll();
        }
        r
    }
}

impl Drop for NetDevice {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The background thread: sleeps in `poll` on the sockets and its wake-up eventfd until a
/// datagram arrives, a timer is due or a verb brings one forward; makes progress; repeats.
/// With nothing to do it sleeps without a deadline: an idle device costs no CPU.
///
/// With `spin_ns` > 0, a round that received datagrams is followed by polling the sockets
/// until `spin_ns` pass without one ([`Options::progress_spin`]), unless an application thread
/// is busy-polling (it receives then).
fn progress_thread(shared: &Shared, spin_ns: u64) {
    // Timers are microseconds apart (ACK timeouts, busy-poll check-ins): wake on time.
    sys::set_timer_slack_ns(1_000);
    let lock = || shared.state.lock().unwrap_or_else(PoisonError::into_inner);
    while !shared.stop.load(Ordering::Acquire) {
        let (fds, wait_ns) = {
            let mut s = lock();
            s.counters.progress_wakeups += 1;
            let before = s.counters.rx_datagrams;
            s.progress();
            if spin_ns > 0 && s.counters.rx_datagrams != before && !shared.busy_polled(s.now()) {
                drop(s);
                spin(shared, spin_ns);
                s = lock();
            }
            let now = s.now();
            let busy = shared.busy_polled(now);
            let mut fds = vec![shared.wake.as_raw_fd()];
            if !busy {
                fds.push(s.main.as_raw_fd());
                fds.extend(s.mcast_socks.values().map(|m| m.as_raw_fd()));
            }
            let mut deadline = s.engine.poll_timeout();
            if busy {
                let look_again = now + uroce_engine::Duration::from_nanos(BUSY_POLL_GRACE_NS);
                deadline = Some(deadline.map_or(look_again, |d| d.min(look_again)));
            }
            shared
                .sleeping_until
                .store(deadline.map_or(u64::MAX, Instant::as_nanos), Ordering::Release);
            let wait_ns = deadline.map(|t| t.as_nanos().saturating_sub(now.as_nanos()));
            (fds, wait_ns)
        };
        let _ = sys::poll_readable_ns(&fds, wait_ns);
        shared.wake.take();
    }
}
