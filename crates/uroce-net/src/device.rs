//! A uroce device on a real UDP socket: the engine behind a lock, driven by whoever calls into
//! it and by a background progress thread.

use core::net::{IpAddr, SocketAddr};
use core::time::Duration;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, BufWriter};
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::thread::JoinHandle;

use uroce_engine::device::Piece;
use uroce_engine::{
    Access, AsyncEvent, CqHandle, CreateError, DestroyError, Device, DeviceConfig, Instant, LKey,
    MemoryRegion, Mtu, PdHandle, QpnBlock, RxInfo,
};
use uroce_wire::ROCE_V2_PORT;
use uroce_wire::pcap::PcapWriter;

use crate::fabric::capture::Capture;
use crate::fabric::faulty::Faulty;
use crate::fabric::host::HostFabric;
use crate::fabric::shm::{BusyMark, Shm};
use crate::fabric::tap::Tap;
use crate::fabric::udp::{Offloads, Udp};
use crate::fabric::{Fabric, Outgoing};
use crate::host::{HostDir, SlotId};
use crate::inspect::{Answering, QpSnapshot, Snapshot};
use crate::last_will::LastWill;
use crate::sys::memory::Registry;
use crate::sys::{self, EventFd, RawRegion};
use uroce_engine::faults::Faults;
use uroce_wire::icrc::Ipv4IdPolicy;

/// How a device is opened. [`Options::from_env`] reads `UROCE_PCAP` and `UROCE_FAULTS`.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Seed for keys, QPNs, PSNs and fault draws, for runs that must be reproducible (anyone
    /// who knows it can derive the device's keys). By default the device takes 256 bits from
    /// the operating system's randomness.
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
    /// After a round of progress that received a trickle of packets (a request, a ping-pong's
    /// message: at most four), the progress thread keeps polling this long (since the last
    /// packet) before it sleeps (`UROCE_PROGRESS_SPIN_US`, 50 µs unless set; 0: never), as a
    /// NIC's receive path is always awake: a passive RDMA READ or WRITE target answers without
    /// a thread wake-up per request. A stream is not spun for: it keeps the thread busy
    /// anyway; nor are a process's packets once it has armed a CQ for a completion event: its
    /// waits spin for their events themselves ([`Options::event_spin`]). While it spins, an
    /// application's verb that finds the device lock taken goes first.
    pub progress_spin: Option<Duration>,
    /// A thread about to block for a completion event (`ibv_get_cq_event`) first busy-polls
    /// the device this long (`UROCE_EVENT_SPIN_US`, 50 µs unless set; 0: never): an event
    /// that comes within it costs no wake-up of the progress thread and of the waiter, two
    /// context switches, most of an event-driven round trip (Linux's `SO_BUSY_POLL` does the
    /// same for sockets). The price is that much CPU per wait that ends in sleep.
    pub event_spin: Option<Duration>,
    /// The port MTU. By default it is derived from the MTU of the address's interface as RoCE
    /// NICs derive it (Linux rxe: the largest IB MTU that fits the interface MTU less 80 bytes
    /// of headers): 4096 on loopback, 1024 on 1500-byte Ethernet.
    pub port_mtu: Option<Mtu>,
    /// Copy every payload into its packet instead of sending it from registered memory (for
    /// measuring what zero copy buys).
    pub copy_payloads: bool,
    /// Send every packet through the kernel's UDP path, even to endpoints of this host
    /// (`UROCE_FABRIC=udp`): for measurement, and for debugging with tcpdump.
    pub udp_only: bool,
    /// Send every packet of the UDP path in a datagram of its own (`UROCE_GSO=0`), instead of
    /// runs of a QP's packets in one segmented send (UDP GSO): for measuring what it buys, and
    /// for paths that mishandle it.
    pub no_gso: bool,
    /// Receive every datagram alone (`UROCE_GRO=0`), instead of asking the kernel for
    /// coalesced runs (UDP GRO).
    pub no_gro: bool,
    /// The IPv4 identifications a received ICRC may have been computed with
    /// (`UROCE_ICRC_IP_ID=zero|linux|any`); by default any, which uroce's own IPv4 sender needs
    /// (it sends from connected sockets, numbered from a per-socket counter), as do Linux rxe
    /// and RNICs. `linux` (what an unconnected Linux socket produces: 0, or k for segment k of
    /// a segmented send) checks more strictly, and makes this device send unconnected too: all
    /// its peers must be set alike.
    pub ipv4_id_policy: Option<Ipv4IdPolicy>,
}

impl Options {
    /// Defaults, with the `UROCE_*` settings documented on each field applied when set
    /// (`UROCE_PCAP=FILE`, `UROCE_FAULTS=loss=…,dup=…,reorder=…,corrupt=…`, …).
    pub fn from_env() -> Result<Self, EnvError> {
        let mut o = Self {
            no_gso: std::env::var("UROCE_GSO").is_ok_and(|v| v == "0"),
            no_gro: std::env::var("UROCE_GRO").is_ok_and(|v| v == "0"),
            ..Self::default()
        };
        if let Ok(v) = std::env::var("UROCE_ICRC_IP_ID") {
            o.ipv4_id_policy = match v.as_str() {
                "zero" => Some(Ipv4IdPolicy::Zero),
                "linux" => Some(Ipv4IdPolicy::LinuxGso),
                "any" => Some(Ipv4IdPolicy::Any),
                _ => {
                    return Err(EnvError(format!(
                        "UROCE_ICRC_IP_ID={v:?}: expected zero, linux or any"
                    )));
                }
            };
        }
        if let Some(p) = std::env::var_os("UROCE_PCAP").filter(|p| !p.is_empty()) {
            o.pcap = Some(PathBuf::from(p));
        }
        if let Ok(f) = std::env::var("UROCE_FAULTS") {
            o.faults = Faults::parse(&f).map_err(|e| EnvError(format!("UROCE_FAULTS: {e}")))?;
        }
        o.realtime_progress = std::env::var("UROCE_PROGRESS_RT").is_ok_and(|v| v == "1");
        o.udp_only = std::env::var("UROCE_FABRIC").is_ok_and(|v| v == "udp");
        o.progress_spin = spin_from_env("UROCE_PROGRESS_SPIN_US", DEFAULT_PROGRESS_SPIN_US);
        o.event_spin = spin_from_env("UROCE_EVENT_SPIN_US", DEFAULT_EVENT_SPIN_US);
        Ok(o)
    }
}

/// A spin in microseconds from environment variable `var`: `default_us` when it is unset,
/// none when it is 0 (or not a number).
fn spin_from_env(var: &str, default_us: u64) -> Option<Duration> {
    match std::env::var(var).ok().map(|v| v.parse::<u64>()) {
        None => Some(Duration::from_micros(default_us)),
        Some(Ok(0) | Err(_)) => None,
        Some(Ok(us)) => Some(Duration::from_micros(us)),
    }
}

/// A `UROCE_*` environment setting [`Options::from_env`] cannot use: the message names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvError(pub String);

impl core::fmt::Display for EnvError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EnvError {}

/// [`Options::event_spin`] by default: above an event-driven round trip between two processes
/// of this host (about 10 µs busy-polling), well below a scheduler tick.
const DEFAULT_EVENT_SPIN_US: u64 = 50;

/// [`Options::progress_spin`] by default: a few round trips between two processes of this
/// host, well below a scheduler tick.
const DEFAULT_PROGRESS_SPIN_US: u64 = 50;

/// The IB MTU a port has on an interface of `if_mtu` bytes: the largest that leaves room for
/// the RoCEv2 headers (rxe reserves 80 bytes: IP, UDP, BTH, the largest extension header and
/// ICRC).
pub(crate) fn port_mtu_for(if_mtu: u32) -> Mtu {
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
    /// A `UROCE_*` setting that cannot be used.
    Environment(EnvError),
    /// The capture file could not be created.
    Capture(PathBuf, io::Error),
    /// The host directory (the device's shared state in `/dev/shm`) could not be used.
    HostDirectory(IpAddr, io::Error),
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
            Self::Environment(e) => write!(f, "{e}"),
            Self::Capture(p, e) => write!(f, "cannot write capture {}: {e}", p.display()),
            Self::Io(a, e) => write!(f, "cannot open a device on {a}: {e}"),
            Self::HostDirectory(a, e) => {
                write!(f, "cannot join the host-wide device on {a}: host directory: {e}")
            }
        }
    }
}

impl std::error::Error for OpenError {}

/// Counters of the runtime (the engine's own are [`Device::counters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetCounters {
    /// Packets handed to the kernel (each a datagram on the wire).
    pub tx_datagrams: u64,
    /// `sendmmsg` calls.
    pub tx_batches: u64,
    /// Datagrams the kernel refused (full socket buffer, no route): lost, as on a wire.
    pub tx_errors: u64,
    /// Of those, refused as larger than the route carries (`EMSGSIZE`): a QP whose path MTU
    /// exceeds the interface's. The first one is also reported on standard error.
    pub tx_too_big: u64,
    /// Datagrams whose payload the kernel took straight from registered memory.
    pub tx_zero_copy: u64,
    /// Their payload bytes.
    pub tx_zero_copy_bytes: u64,
    /// Segmented sends (UDP GSO): datagrams the kernel cut into several packets.
    pub tx_gso_sends: u64,
    /// The packets those carried (counted in `tx_datagrams` too).
    pub tx_gso_segments: u64,
    /// Segmented sends the kernel refused (no checksum offload on the route, an old kernel):
    /// the first turns segmentation off for the device's process.
    pub tx_gso_refused: u64,
    /// Send sockets connected to one destination (opened, evicted ones included): a
    /// connected socket's route is cached, an unconnected one's looked up per datagram.
    pub tx_sockets_connected: u64,
    /// Connected send sockets that could not be opened (no descriptor left, or, for IPv4, the
    /// identification of their next datagram could not be learnt): packets left unconnected.
    pub tx_connect_failed: u64,
    /// Connected IPv4 send sockets closed after a refused send that may have taken an
    /// identification (their count would no longer be known).
    pub tx_sockets_closed: u64,
    /// ICMP errors (port or host unreachable) a connected send socket reported on a send, for
    /// a datagram sent before; the datagram the report held back went again at once.
    pub tx_icmp_errors: u64,
    /// Posts whose packets waited for the next round of progress (a QP awaiting an ACK while
    /// a thread busy-polls: [`NetDevice::post_with`]).
    pub posts_batched: u64,
    /// Posts that resumed a busy poll's mark, ended by the poll that drained the
    /// application's completions, to batch the refill of its window ([`NetDevice::post_with`]).
    pub busy_polls_resumed: u64,
    /// Busy-poll rounds that received packets and held what they produced (ACKs, mostly)
    /// for the application's next verb, so that an ACK leaves in one system call with the
    /// reply the application posts ([`NetDevice::poll_with`]).
    pub tx_held: u64,
    /// Held packets idle polls kept until they grew too old and left alone, with no reply:
    /// idle polls stop keeping them (one hold in 1,024 tries again).
    pub holds_kept_for_nothing: u64,
    /// ACKs dropped before they left because a later ACK of the same QP, queued behind them,
    /// says more (a held ACK, then the next poll's: IBA 9.7.5.1, ACKs are cumulative).
    pub acks_superseded: u64,
    /// Packets read from the sockets.
    pub rx_datagrams: u64,
    /// Coalesced runs received (UDP GRO): one receive for several packets of one flow.
    pub rx_gro_datagrams: u64,
    /// The packets those carried (counted in `rx_datagrams` too).
    pub rx_gro_segments: u64,
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
    /// Rounds of progress the progress thread made (each a wake-up that took the lock).
    pub progress_wakeups: u64,
    /// Wake-ups of the progress thread that found an application thread busy-polling and
    /// went back to sleep without the device lock (counted at its next round of progress).
    pub progress_look_ins: u64,
    /// Wake-ups of the progress thread by a local sender while an application thread's
    /// busy-poll mark held but its stamp had gone stale (it went on to other work): the
    /// thread took over, instead of leaving the packet until the poller came back.
    pub progress_takeovers: u64,
    /// Times the progress thread spun for more packets after receiving ([`Options::progress_spin`]).
    pub progress_spins: u64,
    /// Spins during which the progress thread was preempted: more threads wanted the CPUs
    /// than there are (`UROCE_PROGRESS_SPIN_US=0` turns spinning off).
    pub progress_spins_preempted: u64,
    /// Waits for a completion event (`ibv_get_cq_event` with none queued) that the event came
    /// to while the waiting thread spun ([`Options::event_spin`]): no wake-up.
    pub event_spins_found: u64,
    /// Waits whose spin ended without the event: the thread slept on the channel, and the
    /// event will cost the progress thread's wake-up and its own.
    pub event_spins_expired: u64,
    /// Rounds of a waiting thread (busy-polling, or spinning for an event) that found nothing
    /// and gave the CPU up because the local peer it waits for was last seen on the same CPU
    /// ([`NetDevice::poll_with`]).
    pub yields_to_peer: u64,
    /// Times such a thread, still taking turns with its peer after a run of yields, moved
    /// itself to another CPU of its affinity (which it keeps as it was).
    pub moves_off_peer_cpu: u64,
    /// Busy polls that drained the application's completions, ended its busy-poll mark and
    /// woke the progress thread to go back to the sockets ([`NetDevice::poll_with`]).
    pub busy_polls_ended: u64,
    /// Busy polls that ended the mark so and left the progress thread asleep: all its traffic
    /// was local lately, and local senders wake the thread once the poller's stamp lapses.
    pub busy_polls_ended_quietly: u64,
    /// Polls of a CQ that held completions already, made without a round of progress (no
    /// socket read, no timers) ([`NetDevice::poll_cq_with`]).
    pub polls_without_round: u64,
    /// Asynchronous events no subscriber claimed (their object was destroyed meanwhile).
    pub async_events_unclaimed: u64,
    /// Packets sent to an endpoint of this host through shared memory (no system call).
    pub shm_tx_packets: u64,
    /// Packets lost because the ring to a local endpoint was full and so was the backlog that
    /// waits for it (a full ring pauses its sender first, as priority flow control pauses a
    /// link; RC retransmits what is lost).
    pub shm_tx_ring_full: u64,
    /// Packets for a local endpoint that had left (or been killed) before they could go.
    pub shm_tx_no_endpoint: u64,
    /// Packets that waited for a full ring while the application deregistered the memory
    /// their payload was in: lost (RC sends them again, from wherever it is registered then).
    pub shm_tx_payload_gone: u64,
    /// Packets received from local endpoints through shared memory.
    pub shm_rx_packets: u64,
    /// Ring contents that were not records (another process wrote garbage): skipped.
    pub shm_rx_malformed: u64,
    /// Wake-ups written to sleeping local endpoints.
    pub shm_wakeups_sent: u64,
    /// Of those, wake-ups of a progress thread asleep beside its application's busy-polling
    /// thread, which had stopped polling (gone on to other work, or descheduled) for longer
    /// than `POLLER_GONE_NS`: its progress thread takes the packet over.
    pub shm_wakeups_stopped_poller: u64,
    /// Datagrams the kernel gave this process for a QPN another process of the device owns,
    /// handed to it through shared memory (the device's port is shared).
    pub udp_rx_forwarded: u64,
    /// Probes sent to the device's own port to find this endpoint's socket in it, so that the
    /// kernel steers each datagram to the process owning its QPN (`fabric::steer`).
    pub udp_steer_probes_sent: u64,
    /// Probes that reached this endpoint's socket (its own, or another endpoint's that the
    /// program or the hash sent here): never given to the engine.
    pub udp_steer_probes_heard: u64,
    /// Probe rounds none of whose probes came back (or could not be sent): tried again.
    pub udp_steer_probes_lost: u64,
    /// Steering programs given to the port's socket group (after someone's index changed).
    pub udp_steer_programs: u64,
    /// Steering programs the kernel refused (then datagrams go where its hash sends them).
    pub udp_steer_refused: u64,
    /// `UROCE_FABRIC=udp`: CM messages (QP1) for another process of this device's address
    /// handed to it through shared memory, not sent to the port the address's processes
    /// share (where this process's own socket may take one, and forward it never if it exits).
    pub udp_gsi_handed_over: u64,
    /// RDMA CM connections of processes that died holding them, released by this endpoint
    /// from their last wills (the DREQ their kernel would have sent, `crate::last_will`).
    pub cm_released_for_dead: u64,
    /// Rounds of progress that left the sockets unread because shared memory was busy and
    /// they had been read less than 20 µs before (a system call saved each).
    pub udp_polls_skipped: u64,
}

impl NetCounters {
    /// How many counters there are: every field is one `u64`, so a field added without its
    /// line in [`NetCounters::fields`] fails to compile there.
    pub const COUNT: usize = size_of::<Self>() / 8;

    /// Packets received on every path: UDP datagrams and shared-memory records.
    pub const fn received(&self) -> u64 {
        self.rx_datagrams + self.shm_rx_packets
    }

    /// Every counter with its name, in declaration order.
    pub fn fields(&self) -> [(&'static str, u64); Self::COUNT] {
        [
            ("tx_datagrams", self.tx_datagrams),
            ("tx_batches", self.tx_batches),
            ("tx_errors", self.tx_errors),
            ("tx_too_big", self.tx_too_big),
            ("tx_zero_copy", self.tx_zero_copy),
            ("tx_zero_copy_bytes", self.tx_zero_copy_bytes),
            ("tx_gso_sends", self.tx_gso_sends),
            ("tx_gso_segments", self.tx_gso_segments),
            ("tx_gso_refused", self.tx_gso_refused),
            ("tx_sockets_connected", self.tx_sockets_connected),
            ("tx_connect_failed", self.tx_connect_failed),
            ("tx_sockets_closed", self.tx_sockets_closed),
            ("tx_icmp_errors", self.tx_icmp_errors),
            ("posts_batched", self.posts_batched),
            ("busy_polls_resumed", self.busy_polls_resumed),
            ("tx_held", self.tx_held),
            ("holds_kept_for_nothing", self.holds_kept_for_nothing),
            ("acks_superseded", self.acks_superseded),
            ("rx_datagrams", self.rx_datagrams),
            ("rx_gro_datagrams", self.rx_gro_datagrams),
            ("rx_gro_segments", self.rx_gro_segments),
            ("rx_batches", self.rx_batches),
            ("fault_drops", self.fault_drops),
            ("fault_dups", self.fault_dups),
            ("fault_reorders", self.fault_reorders),
            ("fault_corruptions", self.fault_corruptions),
            ("progress_wakeups", self.progress_wakeups),
            ("progress_look_ins", self.progress_look_ins),
            ("progress_takeovers", self.progress_takeovers),
            ("progress_spins", self.progress_spins),
            ("progress_spins_preempted", self.progress_spins_preempted),
            ("event_spins_found", self.event_spins_found),
            ("event_spins_expired", self.event_spins_expired),
            ("yields_to_peer", self.yields_to_peer),
            ("moves_off_peer_cpu", self.moves_off_peer_cpu),
            ("busy_polls_ended", self.busy_polls_ended),
            ("busy_polls_ended_quietly", self.busy_polls_ended_quietly),
            ("polls_without_round", self.polls_without_round),
            ("async_events_unclaimed", self.async_events_unclaimed),
            ("shm_tx_packets", self.shm_tx_packets),
            ("shm_tx_ring_full", self.shm_tx_ring_full),
            ("shm_tx_no_endpoint", self.shm_tx_no_endpoint),
            ("shm_tx_payload_gone", self.shm_tx_payload_gone),
            ("shm_rx_packets", self.shm_rx_packets),
            ("shm_rx_malformed", self.shm_rx_malformed),
            ("shm_wakeups_sent", self.shm_wakeups_sent),
            ("shm_wakeups_stopped_poller", self.shm_wakeups_stopped_poller),
            ("udp_rx_forwarded", self.udp_rx_forwarded),
            ("udp_steer_probes_sent", self.udp_steer_probes_sent),
            ("udp_steer_probes_heard", self.udp_steer_probes_heard),
            ("udp_steer_probes_lost", self.udp_steer_probes_lost),
            ("udp_steer_programs", self.udp_steer_programs),
            ("udp_steer_refused", self.udp_steer_refused),
            ("udp_gsi_handed_over", self.udp_gsi_handed_over),
            ("cm_released_for_dead", self.cm_released_for_dead),
            ("udp_polls_skipped", self.udp_polls_skipped),
        ]
    }
}

impl core::ops::AddAssign for NetCounters {
    fn add_assign(&mut self, o: Self) {
        self.tx_datagrams += o.tx_datagrams;
        self.tx_batches += o.tx_batches;
        self.tx_errors += o.tx_errors;
        self.tx_too_big += o.tx_too_big;
        self.tx_zero_copy += o.tx_zero_copy;
        self.tx_zero_copy_bytes += o.tx_zero_copy_bytes;
        self.tx_gso_sends += o.tx_gso_sends;
        self.tx_gso_segments += o.tx_gso_segments;
        self.tx_gso_refused += o.tx_gso_refused;
        self.tx_sockets_connected += o.tx_sockets_connected;
        self.tx_connect_failed += o.tx_connect_failed;
        self.tx_sockets_closed += o.tx_sockets_closed;
        self.tx_icmp_errors += o.tx_icmp_errors;
        self.posts_batched += o.posts_batched;
        self.busy_polls_resumed += o.busy_polls_resumed;
        self.tx_held += o.tx_held;
        self.holds_kept_for_nothing += o.holds_kept_for_nothing;
        self.acks_superseded += o.acks_superseded;
        self.rx_datagrams += o.rx_datagrams;
        self.rx_gro_datagrams += o.rx_gro_datagrams;
        self.rx_gro_segments += o.rx_gro_segments;
        self.rx_batches += o.rx_batches;
        self.fault_drops += o.fault_drops;
        self.fault_dups += o.fault_dups;
        self.fault_reorders += o.fault_reorders;
        self.fault_corruptions += o.fault_corruptions;
        self.progress_wakeups += o.progress_wakeups;
        self.progress_look_ins += o.progress_look_ins;
        self.progress_takeovers += o.progress_takeovers;
        self.progress_spins += o.progress_spins;
        self.progress_spins_preempted += o.progress_spins_preempted;
        self.event_spins_found += o.event_spins_found;
        self.event_spins_expired += o.event_spins_expired;
        self.yields_to_peer += o.yields_to_peer;
        self.moves_off_peer_cpu += o.moves_off_peer_cpu;
        self.busy_polls_ended += o.busy_polls_ended;
        self.busy_polls_ended_quietly += o.busy_polls_ended_quietly;
        self.polls_without_round += o.polls_without_round;
        self.async_events_unclaimed += o.async_events_unclaimed;
        self.shm_tx_packets += o.shm_tx_packets;
        self.shm_tx_ring_full += o.shm_tx_ring_full;
        self.shm_tx_no_endpoint += o.shm_tx_no_endpoint;
        self.shm_tx_payload_gone += o.shm_tx_payload_gone;
        self.shm_rx_packets += o.shm_rx_packets;
        self.shm_rx_malformed += o.shm_rx_malformed;
        self.shm_wakeups_sent += o.shm_wakeups_sent;
        self.shm_wakeups_stopped_poller += o.shm_wakeups_stopped_poller;
        self.udp_rx_forwarded += o.udp_rx_forwarded;
        self.udp_steer_probes_sent += o.udp_steer_probes_sent;
        self.udp_steer_probes_heard += o.udp_steer_probes_heard;
        self.udp_steer_probes_lost += o.udp_steer_probes_lost;
        self.udp_steer_programs += o.udp_steer_programs;
        self.udp_steer_refused += o.udp_steer_refused;
        self.udp_gsi_handed_over += o.udp_gsi_handed_over;
        self.cm_released_for_dead += o.cm_released_for_dead;
        self.udp_polls_skipped += o.udp_polls_skipped;
    }
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
///
/// The descriptor is readable while an event waits, except while a thread spins for one in
/// [`NetDevice::spin_for_event`]: that thread takes it from the queue directly, and the
/// descriptor is made readable when it stops spinning if any event is left. Writing and
/// clearing the eventfd only when its state changes saves two or three system calls an
/// event.
#[derive(Debug)]
pub struct Channel {
    fd: EventFd,
    queue: Mutex<ChannelQueue>,
}

#[derive(Debug, Default)]
struct ChannelQueue {
    events: VecDeque<CqHandle>,
    /// The eventfd holds a count (is readable).
    signaled: bool,
    /// Threads spinning for an event.
    spinners: usize,
}

impl ChannelQueue {
    /// The descriptor readable exactly when someone may have to look.
    fn settle(&mut self, fd: &EventFd) {
        let want = !self.events.is_empty() && self.spinners == 0;
        if want && !self.signaled {
            fd.signal();
        } else if !want && self.signaled {
            fd.take_signaled();
        }
        self.signaled = want;
    }
}

impl Channel {
    /// A channel with no events.
    pub fn new() -> io::Result<Self> {
        Ok(Self { fd: EventFd::new()?, queue: Mutex::default() })
    }

    /// A channel whose descriptor is in blocking mode ([`EventFd::new_blocking`]), for
    /// `ibv_comp_channel`.
    pub fn new_blocking() -> io::Result<Self> {
        Ok(Self { fd: EventFd::new_blocking()?, queue: Mutex::default() })
    }

    fn lock(&self) -> MutexGuard<'_, ChannelQueue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether an event waits (a look, without taking it).
    pub fn has_event(&self) -> bool {
        !self.lock().events.is_empty()
    }

    /// The next CQ event, without blocking.
    pub fn try_get(&self) -> Option<CqHandle> {
        let mut q = self.lock();
        let e = q.events.pop_front();
        // Left readable only while another event waits.
        q.settle(&self.fd);
        e
    }

    /// The next CQ event, waiting up to `timeout` (forever if `None`). A signal ends the wait
    /// with an `Interrupted` error, as it ends the `read(2)` of a kernel completion channel.
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
            sys::wait_readable(self.fd.as_raw_fd(), ms)?;
        }
    }

    fn push(&self, cq: CqHandle) {
        let mut q = self.lock();
        q.events.push_back(cq);
        q.settle(&self.fd);
    }

    fn spinning(&self, on: bool) {
        let mut q = self.lock();
        if on {
            q.spinners += 1;
        } else {
            q.spinners = q.spinners.saturating_sub(1);
        }
        q.settle(&self.fd);
    }
}

impl AsRawFd for Channel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Everything behind the device lock.
pub struct State {
    engine: Device<Registry>,
    origin: std::time::Instant,
    /// How packets move: UDP and shared memory, with capture and faults around them.
    fabric: Box<dyn Fabric>,
    out: Vec<Outgoing>,
    /// The clock as the last round of progress read it, for the flush that follows it.
    round_now: Option<Instant>,
    /// The clock as a busy-polling round last read it, and the rounds since.
    polled_clock: Option<Instant>,
    polled_rounds: u32,
    /// Set by a busy-polling round for the verb it runs in: whether it received packets.
    polled_round: Option<bool>,
    /// Packets held for the next verb were left in place by `ibv_req_notify_cq` (see
    /// [`NetDevice::req_notify_cq`]): the poll that follows keeps them if it hands the
    /// application completions.
    hold_over_arming: bool,
    /// The last poll of a CQ skipped its round of progress (it held completions already).
    skipped_round: bool,
    /// Set by a busy poll of a CQ not armed, for the verb it runs in: what earlier polls held
    /// may stay held if it is young ([`HOLD_ACROSS_POLLS_NS`]).
    poll_may_keep: bool,
    /// When what waits in `out` for the next verb began to wait, if idle polls may keep it:
    /// it all goes through the kernel's sockets (what goes to a local peer's ring is not kept
    /// across polls), and keeping it has paid lately or is tried again.
    held_since: Option<Instant>,
    /// Whether an idle poll kept what is held ([`HOLD_ACROSS_POLLS_NS`]).
    held_across_polls: bool,
    /// Whether keeping held packets across idle polls pays: what was kept last left with a
    /// verb's own packets (a reply), not alone once grown old (a stream's receiver, whose peer
    /// waits for the ACK and sends no reply).
    keeping_pays: bool,
    /// Holds to come before keeping is tried again, while it does not pay.
    keeping_retry_in: u32,
    /// CQs armed (`ibv_req_notify_cq`) since their last poll: that poll comes before the
    /// application sleeps for the CQ's event even when a completion fired the event (and so
    /// disarmed the CQ) between the arming and the poll.
    armed_since_poll: Vec<CqHandle>,
    /// Consecutive rounds of waiting threads that gave way to a peer on their CPU
    /// ([`State::poll_for_peer`]).
    gave_way: u32,
    /// Batches handed to the fabric ([`State::send_out`]): a verb that finds it moved knows
    /// that what was held when it began has left.
    sends: u64,
    /// When a waiting thread last moved off its peer's CPU.
    moved_at: Option<Instant>,
    pool: Vec<Vec<u8>>,
    piece_pool: Vec<Vec<Piece>>,
    channels: HashMap<CqHandle, Arc<Channel>>,
    /// CQ events the engine raised in this round, handed to their channels once the round's
    /// packets are out ([`State::hand_out_events`]).
    events_due: Vec<CqHandle>,
    async_events: VecDeque<AsyncEvent>,
    /// Where asynchronous events go when any subscriber exists (each C context of a device is
    /// one); otherwise they wait in `async_events`.
    async_subscribers: Vec<AsyncSubscriber>,
    next_subscriber: u64,
    counters: NetCounters,
    /// Regions whose owner let go while work requests still named them.
    deferred_deregs: Vec<LKey>,
    copy_payloads: bool,
    /// This endpoint's communication manager: QP1's MADs for it, its timers.
    cm: uroce_cm::Cm,
    /// Where the CM's events go (the RDMA CM above); without one they are dropped (a
    /// process that connects nothing hears of nothing, and requests to it are rejected).
    cm_sink: Option<CmSink>,
    /// Answers `uroce stat` and `uroce qp` (when the device joined the host directory).
    answering: Option<Answering>,
    /// The CM's established connections, published for a survivor to release should this
    /// process die, and the look at the wills of those that did (with a host directory).
    last_will: Option<LastWill>,
    /// What waiting threads did, counted without the lock ([`NetDevice::spin_for_event`],
    /// [`GiveWay::act`]), read into [`State::counters`].
    wait_counts: Arc<WaitCounts>,
}

/// What polling and waiting threads did, counted without the lock: how waits for a completion
/// event ended (`event_spins_found`, `event_spins_expired`), what they gave up to a peer on
/// their CPU (`yields_to_peer`, `moves_off_peer_cpu`), and how busy polls ended their mark
/// (`busy_polls_ended`, `busy_polls_ended_quietly`).
#[derive(Default)]
struct WaitCounts {
    found: AtomicU64,
    expired: AtomicU64,
    yielded: AtomicU64,
    moved: AtomicU64,
    ended: AtomicU64,
    ended_quietly: AtomicU64,
}

/// Takes the CM's events as they happen, under the device lock: it must only queue them.
pub type CmSink = Box<dyn FnMut(uroce_cm::Event) + Send>;

impl State {
    /// The engine: every verb.
    pub fn engine(&mut self) -> &mut Device<Registry> {
        &mut self.engine
    }

    /// The runtime's counters.
    pub fn counters(&self) -> NetCounters {
        let mut c = self.counters;
        c.event_spins_found = self.wait_counts.found.load(Ordering::Relaxed);
        c.event_spins_expired = self.wait_counts.expired.load(Ordering::Relaxed);
        c.yields_to_peer = self.wait_counts.yielded.load(Ordering::Relaxed);
        c.moves_off_peer_cpu = self.wait_counts.moved.load(Ordering::Relaxed);
        c.busy_polls_ended = self.wait_counts.ended.load(Ordering::Relaxed);
        c.busy_polls_ended_quietly = self.wait_counts.ended_quietly.load(Ordering::Relaxed);
        c
    }

    /// The endpoint's connection manager, and the time to give its calls. What a call sends
    /// goes out when the enclosing [`NetDevice::with`] returns.
    pub fn cm(&mut self) -> (&mut uroce_cm::Cm, Instant) {
        let now = self.round_now.unwrap_or_else(|| self.now());
        (&mut self.cm, now)
    }

    /// Sends the CM's events to `sink` from now on.
    pub fn set_cm_sink(&mut self, sink: CmSink) {
        self.cm_sink = Some(sink);
    }

    /// The earliest timer of the engine and the CM.
    fn next_deadline(&self) -> Option<Instant> {
        match (self.engine.poll_timeout(), self.cm.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When the progress thread must run next: at the engine's or the CM's next timer, and,
    /// while packets wait for room in a local peer's ring, at the backlog's next retry (a
    /// verb that filled a ring leaves the rest to the thread: without this deadline the rest
    /// waited until something else woke it).
    fn wake_deadline(&self, now: Instant) -> Option<Instant> {
        let retry = self.fabric.backlog_retry().map(|r| now + r);
        let look = self.last_will.as_ref().and_then(|w| w.next_look(&self.cm));
        let own = self.fabric.own_deadline();
        self.next_deadline().into_iter().chain(retry).chain(look).chain(own).min()
    }

    /// Registers `region` in `pd` with `access`.
    pub fn register(
        &mut self,
        pd: PdHandle,
        region: Arc<RawRegion>,
        access: Access,
    ) -> Result<MemoryRegion, CreateError> {
        let addr = region.addr();
        self.register_at(pd, region, addr, access)
    }

    /// Registers `region` in `pd` with `access`, its keys naming `iova..` rather than the
    /// region's own addresses (`ibv_reg_mr_iova(3)`; 0 for a zero-based region).
    pub fn register_at(
        &mut self,
        pd: PdHandle,
        region: Arc<RawRegion>,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion, CreateError> {
        let (host, len) = (region.addr(), region.len() as u64);
        let mr = self.engine.reg_mr_at(pd, iova, host, len, access)?;
        self.engine.memory_mut().insert(region);
        Ok(mr)
    }

    /// Re-registers region `lkey` with a new PD and access, and, with `region`, a new range
    /// (`ibv_rereg_mr`): the keys stay, the old range leaves the registry. `None` if the key
    /// is unknown.
    pub fn reregister(
        &mut self,
        lkey: LKey,
        pd: PdHandle,
        region: Option<Arc<RawRegion>>,
        access: Access,
    ) -> Option<Result<MemoryRegion, CreateError>> {
        let (addr, len) = match &region {
            Some(r) => (r.addr(), r.len() as u64),
            None => {
                let mr = self.engine.mr(lkey)?;
                (mr.addr, mr.length)
            }
        };
        let old = match self.engine.rereg_mr(lkey, pd, addr, len, access)? {
            Ok(old) => old,
            Err(e) => return Some(Err(e)),
        };
        if let Some(r) = region {
            self.engine.memory_mut().remove(old.host, old.length);
            self.engine.memory_mut().insert(r);
        }
        self.engine.mr(lkey).map(Ok)
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
        self.engine.memory_mut().remove(mr.host, mr.length);
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
        self.take_armed_since_poll(cq);
        Ok(())
    }

    /// The next asynchronous event.
    pub fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.async_events.pop_front()
    }

    /// Opens and closes group sockets to match the engine's multicast attachments.
    pub fn sync_multicast(&mut self) -> io::Result<()> {
        let groups: Vec<IpAddr> = self.engine.multicast_groups().collect();
        self.fabric.sync_multicast(&groups)
    }

    fn now(&self) -> Instant {
        clock_at(self.origin)
    }

    /// One round of progress: everything the fabric holds, due timers, then everything the
    /// engine has to send, and the events it raised.
    fn progress(&mut self) {
        let now = self.now();
        self.progress_at(now);
        self.send_out();
    }

    /// A round of progress for a thread that busy-polls: the clock (a few tens of nanoseconds
    /// a read here, a fifth of an idle poll) is read on one round in [`CLOCK_EVERY`], and
    /// whenever packets arrive; the rounds between use the last reading, so a timer fires at
    /// most that many rounds (microseconds) late.
    fn progress_polled(&mut self) {
        self.polled_rounds += 1;
        let now = match self.polled_clock {
            Some(t) if self.polled_rounds < CLOCK_EVERY => t,
            _ => {
                self.polled_rounds = 0;
                self.now()
            }
        };
        self.polled_clock = Some(now);
        let received = self.progress_at(now);
        self.polled_round = Some(received);
    }

    /// [`State::progress_polled`] for a thread that waits for a local peer (busy-polls, or
    /// spins for a completion event) on `cpu`; says whether the thread should give its CPU
    /// up before its next round: when the round received nothing, and the peer that sent last
    /// was last seen polling or waiting on this same CPU.
    ///
    /// Two processes whose threads wake each other end up on one CPU (the kernel places a
    /// woken thread near its waker) and stay there for milliseconds, until the load balancer
    /// separates them. Meanwhile the peer is runnable behind the spinner, which spins until
    /// its spin or time slice runs out (`ibv_rc_pingpong -e` took 160 µs an iteration for its
    /// first 17 ms): a yield lets the peer answer now. When they keep sharing the CPU, one of
    /// the two (the endpoint in the higher slot) moves to another CPU, as the balancer would
    /// later; if both did, they would share the other CPU. Each thread says where
    /// it polls in its endpoint's slot, so a thread on a CPU of its own spins undisturbed.
    fn poll_for_peer(&mut self, cpu: Option<u32>) -> GiveWay {
        self.poll_saying_where(cpu);
        self.give_way(cpu)
    }

    /// [`State::progress_polled`], having published `cpu` as where this endpoint polls.
    fn poll_saying_where(&mut self, cpu: Option<u32>) {
        if let Some(cpu) = cpu {
            self.fabric.publish_cpu(cpu);
        }
        self.progress_polled();
    }

    /// The decision of [`State::poll_for_peer`], after its round of progress.
    fn give_way(&mut self, cpu: Option<u32>) -> GiveWay {
        let Some(cpu) = cpu else { return GiveWay::No };
        let Some(peer) = self.fabric.peer_seen().filter(|p| p.cpu == cpu) else {
            self.gave_way = 0;
            return GiveWay::No;
        };
        if self.polled_round != Some(false) {
            return GiveWay::No;
        }
        self.gave_way += 1;
        let now = self.polled_clock.unwrap_or_else(|| self.now());
        let moved_long_ago = self
            .moved_at
            .is_none_or(|t| now.as_nanos().saturating_sub(t.as_nanos()) >= MOVE_INTERVAL_NS);
        if peer.moves && self.gave_way >= MOVE_AFTER_YIELDS && moved_long_ago {
            self.gave_way = 0;
            self.moved_at = Some(now);
            return GiveWay::MoveOff(cpu);
        }
        GiveWay::Yield
    }

    /// Receives, runs due timers and collects what the engine has to send (the caller sends
    /// it); returns whether packets arrived.
    fn progress_at(&mut self, now: Instant) -> bool {
        let Self { engine, fabric, counters, origin, .. } = self;
        // Packets are handled at a fresh reading (one per round that receives), so that what
        // they complete is stamped when it arrived, not up to CLOCK_EVERY rounds before.
        let mut arrival = None;
        let received = fabric.receive(now, counters, &mut |rx: &RxInfo, bytes: &[u8], intact| {
            let now = *arrival.get_or_insert_with(|| clock_at(*origin));
            if intact {
                engine.handle_datagram_intact(now, rx, bytes);
            } else {
                engine.handle_datagram(now, rx, bytes);
            }
        });
        // Handling a batch takes time; an empty round took next to none.
        let now = if received > 0 {
            let fresh = self.now();
            self.polled_clock = Some(fresh);
            self.polled_rounds = 0;
            fresh
        } else {
            now
        };
        self.round_now = Some(now);
        if self.engine.poll_timeout().is_some_and(|t| t <= now) {
            self.engine.handle_timeout(now);
        }
        while let Some(m) = self.engine.poll_gsi() {
            self.cm.handle_mad(now, m.from, &m.mad);
        }
        if self.cm.poll_timeout().is_some_and(|t| t <= now) {
            self.cm.handle_timeout(now);
        }
        if let Some(will) = self.last_will.as_mut()
            && will.next_look(&self.cm).is_some_and(|t| t <= now)
        {
            self.counters.cm_released_for_dead += will.look(now, &mut self.cm) as u64;
        }
        self.collect(now);
        if let Some(asked) = self.answering.as_ref().and_then(Answering::asked) {
            let snap = self.snapshot();
            if let Some(a) = self.answering.as_mut() {
                a.answer(asked, &snap);
            }
        }
        received > 0
    }

    /// This endpoint's counters and QPs, for a tool looking from outside.
    pub fn snapshot(&self) -> Snapshot {
        let engine = self.engine.counters().fields();
        let net = self.counters().fields();
        let counters = engine.iter().chain(net.iter()).map(|&(n, v)| (n.to_owned(), v)).collect();
        let qps = self
            .engine
            .qp_infos()
            .into_iter()
            .map(|q| QpSnapshot {
                qpn: q.qpn.get(),
                qp_type: q.qp_type.transport().name().to_owned(),
                state: state_name(q.state).to_owned(),
                path: match q.dest {
                    Some(ip) if q.qp_type != uroce_engine::QpType::Ud => {
                        self.fabric.path_to(ip, q.dest_qpn).name().to_owned()
                    }
                    _ => "-".to_owned(),
                },
                mtu: q.mtu.bytes(),
                dest: q.dest,
                dest_qpn: q.dest_qpn,
                send_psn: q.send_psn,
                unacked_psn: q.unacked_psn,
                expected_psn: q.expected_psn,
                send_outstanding: q.send_outstanding as u64,
                recv_posted: q.recv_posted as u64,
                window: q.window,
                error_status: q.error_status.map(|s| format!("IBV_WC_{}", s.name())),
                counters: q.counters.fields().iter().map(|&(n, v)| (n.to_owned(), v)).collect(),
            })
            .collect();
        Snapshot {
            pid: std::process::id(),
            addr: Some(self.engine.addr()),
            port_mtu: self.engine.port_mtu().bytes(),
            counters,
            qps,
        }
    }

    fn pool_buf(&mut self) -> Vec<u8> {
        self.pool.pop().unwrap_or_else(|| Vec::with_capacity(sys::MAX_DATAGRAM))
    }

    /// Takes everything the engine has ready into `out` (sending only when 64 are waiting),
    /// and the CQ events it raised into `events_due`; publishes the last will.
    fn collect(&mut self, now: Instant) {
        // Most verbs (a receive posted, a poll that found nothing) produce nothing: asked
        // first, that costs one look, not a dozen.
        if self.cm.has_output() || self.engine.has_output(now) {
            self.take_output(now);
        }
        if let Some(will) = self.last_will.as_mut() {
            will.publish(&self.cm);
        }
    }

    /// [`State::collect`]'s polls of the CM and the engine, for when they have something.
    fn take_output(&mut self, now: Instant) {
        while let Some((dst, mad)) = self.cm.poll_transmit() {
            self.engine.gsi_send(dst, &mad);
        }
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
            // The fabric may send the QP's flow from a port of its own: an ICRC computed for
            // the engine's port would then be wrong, and is computed again where it is needed.
            let port = self.fabric.source_port(tx.src_port);
            let o = Outgoing {
                port,
                dst: tx.dst,
                bytes: buf,
                payload_at: tx.payload_at,
                pieces,
                icrc_deferred: tx.icrc_deferred || port != tx.src_port,
                ip_id: 0,
                alone: tx.alone,
            };
            if let Some(o) = self.supersede_ack(o) {
                self.out.push(o);
            }
            if self.out.len() >= 64 {
                self.send_out();
            }
        }
        while let Some(cq) = self.engine.poll_cq_event() {
            self.events_due.push(cq);
        }
        while let Some(e) = self.engine.poll_async_event() {
            self.route_async(e);
        }
        while let Some(e) = self.cm.poll_event() {
            if let Some(sink) = self.cm_sink.as_mut() {
                sink(e);
            }
        }
    }

    /// An ACK joining the queue replaces one of the same QP still queued (held for the
    /// application's next verb, see [`NetDevice::poll_with`]): ACKs are cumulative (IBA
    /// 9.7.5.1.1), so only the later PSN need go; the requester would drop the other as a
    /// stale response. Returns the packet to queue, if any.
    fn supersede_ack(&mut self, o: Outgoing) -> Option<Outgoing> {
        let Some((qpn, psn)) = o.plain_ack() else { return Some(o) };
        let queued = self.out.iter().enumerate().find_map(|(i, q)| {
            let (other, queued_psn) = q.plain_ack().filter(|_| q.dst == o.dst)?;
            (other == qpn).then_some((i, queued_psn))
        });
        let Some((i, queued_psn)) = queued else { return Some(o) };
        self.counters.acks_superseded += 1;
        let (keep, gone) =
            if psn.is_before(queued_psn) { (None, o) } else { (Some(o), self.out.remove(i)) };
        self.pool.push(gone.bytes);
        self.piece_pool.push(gone.pieces);
        keep
    }

    /// Hands the queued packets to the fabric and takes their buffers back; then
    /// deregisters the regions that waited for their work requests.
    fn send_out(&mut self) {
        if !self.out.is_empty() || self.fabric.backlog_retry().is_some() {
            self.sends = self.sends.wrapping_add(1);
            self.fabric.transmit(&mut self.out, self.engine.memory(), &mut self.counters);
            for o in self.out.drain(..) {
                self.pool.push(o.bytes);
                self.piece_pool.push(o.pieces);
            }
        }
        self.hand_out_events();
        self.retry_deregs();
    }

    /// Hands the CQ events raised to their channels. After the packets of the same round are
    /// sent: waking a waiter costs a system call (the channel's eventfd), and the packet that
    /// the event's completion went with (a ping-pong's reply, say) need not wait for it.
    fn hand_out_events(&mut self) {
        for cq in self.events_due.drain(..) {
            if let Some(ch) = self.channels.get(&cq) {
                ch.push(cq);
            }
        }
    }

    /// Whether `cq` was armed since its last poll; forgets it (this is that poll).
    fn take_armed_since_poll(&mut self, cq: CqHandle) -> bool {
        let Some(i) = self.armed_since_poll.iter().position(|&c| c == cq) else { return false };
        self.armed_since_poll.swap_remove(i);
        true
    }

    /// Whether what waits in `out` may wait for the next verb: it is there (a busy poll
    /// received and answered), and none of it gathers its payload from registered memory,
    /// which the application may deregister and free in the meantime (ACKs, NAKs and atomic
    /// answers carry none).
    fn may_hold(&self) -> bool {
        !self.out.is_empty() && self.out.iter().all(|o| o.payload_at.is_none())
    }
}

struct Shared {
    state: Mutex<State>,
    wake: EventFd,
    /// Armed by a verb whose deadline comes before `sleeping_until`.
    timer: sys::TimerFd,
    stop: AtomicBool,
    /// When the progress thread will wake on its own (device nanoseconds; `u64::MAX`: never).
    sleeping_until: AtomicU64,
    /// When an application thread last busy-polled (device nanoseconds).
    last_busy_poll: AtomicU64,
    /// The progress thread's look-in while an application thread busy-polls: it sleeps on
    /// this timer, and the poller pushes the expiry on as it polls ([`Shared::mark_busy_poll`]),
    /// so the thread wakes once polling has stopped, not every grace period.
    look_in: sys::TimerFd,
    /// When `look_in` expires (device nanoseconds; 0: nobody sleeps on it).
    look_in_at: AtomicU64,
    /// When a busy poll last took the last completion its application awaited, and so ended
    /// the mark (device nanoseconds; 0: never): a post soon after resumes it
    /// ([`NetDevice::post_with`]).
    drained_at: AtomicU64,
    /// Polls in a row that left nothing outstanding ([`Shared::polls_idly`]).
    idle_polls: AtomicU32,
    /// Application threads that found the lock taken and wait for it: the spinning progress
    /// thread ([`spin`]) leaves the lock to them instead of taking it again at once (the
    /// standard mutex is not fair, and a verb parked on it waits for a futex wake-up, tens of
    /// microseconds).
    verbs_waiting: AtomicU32,
    /// The endpoint's busy-poll stamp for local senders, and the wake-up through which they
    /// reach a progress thread that sleeps while the application polls (none without a host
    /// directory).
    busy_mark: Option<BusyMark>,
    /// The device clock's origin (the same instant as `State::origin`).
    origin: std::time::Instant,
    /// The wall clock at `origin`, since the Unix epoch (as the capture's timestamps).
    wall_origin: Duration,
    addr: IpAddr,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Notes that an application thread busy-polled at `now` (never stored as 0, which means
    /// "no mark").
    fn mark_busy_poll(&self, now: Instant) {
        let now_ns = now.as_nanos();
        self.last_busy_poll.store(now_ns.max(1), Ordering::Release);
        if let Some(mark) = &self.busy_mark {
            mark.publish(now_ns);
        }
        // The progress thread's look-in comes within a grace: push it on. A system call every
        // few milliseconds, where waking the thread to look (a thousand times a second) would
        // preempt this poller on a machine with no idle core: two context switches, and the
        // tail of every latency.
        let due = self.look_in_at.load(Ordering::Acquire);
        if due != 0 && due < now_ns.saturating_add(BUSY_POLL_GRACE_NS) {
            self.arm_look_in(now_ns, LOOK_IN_PUSH_NS);
        }
    }

    /// Ends the busy-poll mark; whether there was one.
    fn clear_busy_poll(&self) -> bool {
        self.last_busy_poll.swap(0, Ordering::AcqRel) != 0
    }

    /// Arms the look-in to expire `after_ns` from `now_ns`, for the progress thread to sleep on.
    fn arm_look_in(&self, now_ns: u64, after_ns: u64) {
        self.look_in_at.store(now_ns.saturating_add(after_ns).max(1), Ordering::Release);
        self.look_in.arm_in(after_ns);
    }

    /// Notes that a busy poll drained the application's completions at `now` (never stored
    /// as 0, which means "never").
    fn mark_drained(&self, now: Instant) {
        self.drained_at.store(now.as_nanos().max(1), Ordering::Release);
    }

    /// Counts a poll that left nothing outstanding; whether it is one of a run of
    /// [`IDLE_POLLS_TO_BUSY`], each within [`RESUME_AFTER_DRAIN_NS`] of the one before. A
    /// thread that polls on with nothing outstanding (the passive side of READs and WRITEs,
    /// whose work the responder does without a work request; a progress loop waiting for
    /// requests) is busy-polling all the same: it receives, and the progress thread can sleep
    /// without its peers having to wake it for every request (9,400 wake-ups a second, and a
    /// context switch each, under a 64 KiB READ ping-pong). A loop that polls until the queue
    /// is empty and then goes on to other work makes one or two such polls, not a run.
    fn polls_idly(&self, now: Instant) -> bool {
        let run = self.idle_polls.load(Ordering::Relaxed);
        // A thread already counted as polling keeps its mark over a preemption (the mark
        // itself lapses after the grace period when it has stopped).
        let goes_on =
            self.just_drained(now) || (run >= IDLE_POLLS_TO_BUSY && self.busy_polled(now));
        let run = if goes_on { run.saturating_add(1) } else { 1 };
        self.idle_polls.store(run, Ordering::Relaxed);
        run >= IDLE_POLLS_TO_BUSY
    }

    /// Whether an application thread busy-polled within the grace period before `now`.
    fn busy_polled(&self, now: Instant) -> bool {
        self.busy_poll_lapses_in(now.as_nanos()).is_some()
    }

    /// If an application thread busy-polled within the grace period before `now_ns`, how
    /// long until its mark lapses.
    fn busy_poll_lapses_in(&self, now_ns: u64) -> Option<u64> {
        let last = self.last_busy_poll.load(Ordering::Acquire);
        let age = now_ns.saturating_sub(last);
        (last != 0 && age < BUSY_POLL_GRACE_NS).then(|| BUSY_POLL_GRACE_NS - age)
    }

    /// Whether a busy poll ended its mark by draining the application's completions less
    /// than [`RESUME_AFTER_DRAIN_NS`] before `now`: a post now is the application refilling
    /// its window from what that poll handed it, and it will poll again.
    fn just_drained(&self, now: Instant) -> bool {
        let at = self.drained_at.load(Ordering::Acquire);
        at != 0 && now.as_nanos().saturating_sub(at) < RESUME_AFTER_DRAIN_NS
    }
}

/// rdma-core's short name of a QP state (`ibv_qp_state`, as `rdma resource show qp` prints it).
fn state_name(s: uroce_engine::QpState) -> &'static str {
    use uroce_engine::QpState;
    match s {
        QpState::Reset => "RESET",
        QpState::Init => "INIT",
        QpState::Rtr => "RTR",
        QpState::Rts => "RTS",
        QpState::Sqd => "SQD",
        QpState::Sqe => "SQE",
        QpState::Error => "ERR",
    }
}

/// Polls the sockets (a round of progress at a time, the lock released in between) until
/// `spin_ns` pass without a packet, a round receives more than a trickle ([`SPIN_TRICKLE`]),
/// the device stops, or an application thread takes over by busy-polling. Returns whether the
/// thread was preempted meanwhile.
fn spin(shared: &Shared, spin_ns: u64) -> bool {
    let preemptions = sys::thread_preemptions();
    let mut quiet_since = shared.now_ns();
    let mut seen = None;
    loop {
        // An application's verb waits for the lock: it goes first.
        if shared.verbs_waiting.load(Ordering::Acquire) > 0 {
            core::hint::spin_loop();
            continue;
        }
        let Some(mut s) = try_lock_state(&shared.state) else {
            core::hint::spin_loop();
            continue;
        };
        s.progress();
        let (rx, now) = (s.counters.received(), s.now());
        drop(s);
        let stream = seen.is_some_and(|before| rx.saturating_sub(before) > SPIN_TRICKLE);
        if seen != Some(rx) {
            seen = Some(rx);
            quiet_since = now.as_nanos();
        }
        let quiet = now.as_nanos().saturating_sub(quiet_since) >= spin_ns;
        if quiet || stream || shared.stop.load(Ordering::Acquire) || shared.busy_polled(now) {
            return sys::thread_preemptions() != preemptions;
        }
        core::hint::spin_loop();
    }
}

/// The device clock: nanoseconds since `origin`.
fn clock_at(origin: std::time::Instant) -> Instant {
    Instant::from_nanos(u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

/// The device state's lock if it is free now (a poisoned one too: a panic elsewhere leaves
/// the state as consistent as `lock` callers already accept).
fn try_lock_state(state: &Mutex<State>) -> Option<MutexGuard<'_, State>> {
    match state.try_lock() {
        Ok(s) => Some(s),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// The most packets a round of progress may receive for the progress thread to spin for more
/// ([`Options::progress_spin`]): a request, a ping-pong's message, a READ's few responses.
const SPIN_TRICKLE: u64 = 4;

/// How many times a verb that finds the device lock taken tries it again, spinning, before it
/// parks on it: about the length of a round of progress.
const VERB_LOCK_SPINS: u32 = 4096;

/// What a waiting thread does before its next round ([`State::poll_for_peer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GiveWay {
    /// Spins on.
    No,
    /// Yields its CPU to the peer waiting for it.
    Yield,
    /// Moves off this CPU, where it keeps taking turns with its peer.
    MoveOff(u32),
}

impl GiveWay {
    /// Does it (outside the device lock), and counts it in `counts`. A thread whose
    /// affinity allows no other CPU yields instead of moving.
    fn act(self, counts: &WaitCounts) {
        match self {
            Self::No => core::hint::spin_loop(),
            Self::MoveOff(cpu) if sys::move_off_cpu(cpu) => {
                counts.moved.fetch_add(1, Ordering::Relaxed);
            }
            Self::Yield | Self::MoveOff(_) => {
                counts.yielded.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
            }
        }
    }
}

/// Consecutive yields to a peer on the same CPU after which a waiting thread moves off it.
const MOVE_AFTER_YIELDS: u32 = 16;

/// A waiting thread moves off its peer's CPU at most this often.
const MOVE_INTERVAL_NS: u64 = 10_000_000;

/// A busy-polling thread reads the clock on one round in this many (and whenever packets
/// arrive).
const CLOCK_EVERY: u32 = 16;

/// While an application thread busy-polls, it receives everything itself; the progress thread
/// then leaves the sockets to it (a second reader would only steal packets and, on a small
/// machine, the CPU) and takes over once no thread has polled for this long: its look-in
/// timer, which the poller pushes on as it polls, wakes it then or a few milliseconds later
/// ([`LOOK_IN_PUSH_NS`]).
const BUSY_POLL_GRACE_NS: u64 = 1_000_000;

/// How long busy polls that find nothing new keep what an earlier poll held for the next verb
/// (an ACK, for the reply): long enough for an application's round of progress between a
/// message and its reply, far below the peer's tail-loss probe (200 µs at least), which an
/// ACK held longer would set off. Measured on the polls' clock, which a busy poller reads
/// once in [`CLOCK_EVERY`] rounds: a few microseconds more at most.
const HOLD_ACROSS_POLLS_NS: u64 = 20_000;

/// Holds, once keeping across idle polls did not pay, before it is tried again.
const KEEP_RETRY_EVERY: u32 = 1024;

/// How far ahead a busy poller pushes the progress thread's look-in ([`Shared::mark_busy_poll`]),
/// so the thread takes over 1–5 ms after polling stops. Past the scheduler's next tick (4 ms
/// at `HZ=250`): a timer due before it reprograms the CPU's timer, which a hypervisor traps
/// (measured here: `timerfd_settime` every 0.5 ms for 1 ms ahead costs 10 µs a call, for 4.5
/// ms ahead 1 µs; at 1 ms, pushing put 2,000 such stalls a second into a ping-pong's tail).
const LOOK_IN_PUSH_NS: u64 = 5_000_000;

/// A post this soon after a busy poll drained the application's completions (and so ended
/// its mark) resumes the mark: a stream whose acknowledgement completed the whole window
/// refills it at once (microseconds), and its posts batch as while polling.
const RESUME_AFTER_DRAIN_NS: u64 = 50_000;

/// Polls in a row with nothing outstanding after which an application thread counts as busy
/// polling ([`Shared::polls_idly`]).
const IDLE_POLLS_TO_BUSY: u32 = 64;

/// A uroce device bound to one address, with its progress thread.
pub struct NetDevice {
    shared: Arc<Shared>,
    /// [`Options::event_spin`] in nanoseconds (0: none).
    event_spin_ns: u64,
    /// [`State`]'s counts of what waiting threads did, shared.
    wait_counts: Arc<WaitCounts>,
    thread: Option<JoinHandle<()>>,
    endpoint: Option<Endpoint>,
}

/// This process's claim on the host directory, released when the device closes.
struct Endpoint {
    dir: Arc<HostDir>,
    slot: SlotId,
}

impl Endpoint {
    fn claim(addr: IpAddr) -> io::Result<Self> {
        let dir = Arc::new(HostDir::open()?);
        let slot = dir.claim(addr)?;
        Ok(Self { dir, slot })
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.dir.release(self.slot);
    }
}

impl core::fmt::Debug for NetDevice {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("NetDevice").field("addr", &self.shared.addr).finish_non_exhaustive()
    }
}

impl NetDevice {
    /// Opens this process's endpoint of the host-wide device at `addr`: claims a slot of the
    /// host directory (its block of QPNs and its shared-memory rings) and binds the device's
    /// UDP port 4791, shared with the device's other processes.
    pub fn open(addr: IpAddr, options: Options) -> Result<Self, OpenError> {
        let local = SocketAddr::new(addr, ROCE_V2_PORT);
        // IPv4 from connected sockets carries identifications only a receiver that accepts
        // any can check: so only where this device's receivers do (its peers set alike).
        let connected_ipv4 = options.ipv4_id_policy.unwrap_or_default() == Ipv4IdPolicy::Any;
        let offloads = Offloads { gso: !options.no_gso, gro: !options.no_gro, connected_ipv4 };
        let udp = Udp::bind(addr, offloads).map_err(|e| match e.raw_os_error() {
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
        // A seed given (tests, benchmarks) makes every choice reproducible; otherwise keys,
        // QPNs and PSNs come from 256 bits of the operating system's randomness, and nothing a
        // peer sees (keys, PSNs, comm IDs) lets it derive the rest.
        let (mut config, seed) = match options.seed {
            Some(seed) => (DeviceConfig::new(addr, seed), seed),
            None => {
                let no_randomness = |e: getrandom::Error| {
                    OpenError::Io(
                        local,
                        io::Error::other(format!("no randomness from the OS: {e}")),
                    )
                };
                let mut key = [0u8; 32];
                getrandom::fill(&mut key).map_err(no_randomness)?;
                let seed = getrandom::u64().map_err(no_randomness)?;
                (DeviceConfig::secret(addr, key), seed)
            }
        };
        if let Some(policy) = options.ipv4_id_policy {
            config.ipv4_id_policy = policy;
        }
        config.port_mtu = options
            .port_mtu
            .unwrap_or_else(|| udp.interface_mtu().map_or(Mtu::Mtu4096, port_mtu_for));
        // Without a host directory (no writable /dev/shm) the device still works for this
        // process, over UDP only: it cannot share its address with another process.
        let joined = Endpoint::claim(addr).and_then(|e| {
            let shm = Shm::new(Arc::clone(&e.dir), e.slot, addr)?;
            Ok((e, shm))
        });
        let (endpoint, shm) = match joined {
            Ok((e, shm)) => {
                config.qpns = QpnBlock { first: u32::from(e.slot.index) << 16, len: 0x1_0000 };
                (Some(e), Some(shm))
            }
            Err(e) => {
                eprintln!(
                    "uroce: {}; this device is private to the process",
                    OpenError::HostDirectory(addr, e)
                );
                (None, None)
            }
        };
        // The device clock's origin on the host-wide clock, for stamps other processes read.
        let mono_at_origin = sys::monotonic_ns()
            .saturating_sub(u64::try_from(origin.elapsed().as_nanos()).unwrap_or(0));
        let busy_mark = shm.as_ref().map(|shm| shm.busy_mark(mono_at_origin));
        let host = HostFabric::new(addr, udp, shm, options.udp_only);
        let mut fabric: Box<dyn Fabric> = match &endpoint {
            Some(e) => Box::new(Tap::new(host, Arc::clone(&e.dir), e.slot, addr)),
            None => Box::new(host),
        };
        let answering = endpoint.as_ref().map(|e| Answering::new(Arc::clone(&e.dir), e.slot));
        let last_will = endpoint.as_ref().map(|e| LastWill::new(Arc::clone(&e.dir), e.slot, addr));
        if let Some(pcap) = pcap {
            fabric = Box::new(Capture::new(fabric, pcap, addr, origin, wall_origin));
        }
        if options.faults.any() {
            fabric = Box::new(Faulty::new(fabric, addr, options.faults, seed ^ 0xFA17));
        }
        let cm = uroce_cm::Cm::new(uroce_cm::Config::new(
            endpoint.as_ref().map_or(0, |e| e.slot.index),
            // The low bits of comm IDs start where the seed says: a restarted process does not
            // reuse its predecessor's IDs.
            u32::try_from(seed >> 32).unwrap_or(0) ^ u32::try_from(seed & 0xFFFF_FFFF).unwrap_or(0),
            crate::cm::node_guid(addr),
        ));
        let mut engine = Device::new(config, Registry::default());
        // The ICRC of a packet that carries registered memory is left to the path it takes:
        // none between endpoints of this host, the UDP path's (which knows the IPv4
        // identification each GSO segment will carry), a capture's.
        engine.set_defer_icrc(true);
        let wait_counts = Arc::new(WaitCounts::default());
        let state = State {
            engine,
            origin,
            fabric,
            out: Vec::with_capacity(64),
            round_now: None,
            polled_clock: None,
            polled_rounds: 0,
            polled_round: None,
            hold_over_arming: false,
            skipped_round: false,
            poll_may_keep: false,
            held_since: None,
            held_across_polls: false,
            keeping_pays: true,
            keeping_retry_in: 0,
            armed_since_poll: Vec::new(),
            gave_way: 0,
            sends: 0,
            moved_at: None,
            pool: Vec::new(),
            piece_pool: Vec::new(),
            channels: HashMap::new(),
            events_due: Vec::new(),
            async_events: VecDeque::new(),
            async_subscribers: Vec::new(),
            next_subscriber: 1,
            counters: NetCounters::default(),
            deferred_deregs: Vec::new(),
            copy_payloads: options.copy_payloads,
            cm,
            cm_sink: None,
            answering,
            last_will,
            wait_counts: Arc::clone(&wait_counts),
        };
        let wake = EventFd::new().map_err(|e| OpenError::Io(local, e))?;
        let timer = sys::TimerFd::new().map_err(|e| OpenError::Io(local, e))?;
        let look_in = sys::TimerFd::new().map_err(|e| OpenError::Io(local, e))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            wake,
            timer,
            stop: AtomicBool::new(false),
            sleeping_until: AtomicU64::new(u64::MAX),
            last_busy_poll: AtomicU64::new(0),
            look_in,
            look_in_at: AtomicU64::new(0),
            drained_at: AtomicU64::new(0),
            idle_polls: AtomicU32::new(0),
            verbs_waiting: AtomicU32::new(0),
            busy_mark,
            origin,
            wall_origin,
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
        let event_spin_ns =
            options.event_spin.map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Ok(Self { shared, event_spin_ns, wait_counts, thread, endpoint })
    }

    /// This process's slot on the host-wide device: its index (the top byte of every QPN it
    /// hands out) and generation.
    pub fn endpoint_slot(&self) -> (u8, u32) {
        self.endpoint.as_ref().map_or((0, 0), |e| (e.slot.index, e.slot.generation))
    }

    /// The device's address.
    pub fn addr(&self) -> IpAddr {
        self.shared.addr
    }

    /// The device clock now: nanoseconds since this process opened the device, the timeline
    /// the engine runs on and completion timestamps are read on (a 1 GHz `hca_core_clock`).
    pub fn clock(&self) -> Instant {
        Instant::from_nanos(self.shared.now_ns())
    }

    /// Wall-clock nanoseconds since the Unix epoch at device time `t`: the clock read at open
    /// plus the monotonic time since, as the capture file stamps packets.
    pub fn wall_clock_ns(&self, t: Instant) -> u64 {
        let origin = u64::try_from(self.shared.wall_origin.as_nanos()).unwrap_or(u64::MAX);
        origin.saturating_add(t.as_nanos())
    }

    /// Binds an RDMA CM port (`space`: the port space's value, `rdma_cma.h`; port 0: an
    /// ephemeral one) on `addr` (this device's address, or a wildcard) for this endpoint,
    /// unique across the host's processes as TCP ports are.
    pub fn bind_port(
        &self,
        space: u16,
        port: u16,
        addr: IpAddr,
    ) -> Result<crate::PortBinding, crate::BindError> {
        crate::cm::bind(
            self.endpoint.as_ref().map(|e| (Arc::clone(&e.dir), e.slot)),
            space,
            port,
            addr,
        )
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        let state = &self.shared.state;
        if let Some(s) = try_lock_state(state) {
            return s;
        }
        // Taken: say so, so that a spinning progress thread does not take it again, and wait
        // a little for it without parking (its rounds are microseconds); then park.
        self.shared.verbs_waiting.fetch_add(1, Ordering::AcqRel);
        let spun = (0..VERB_LOCK_SPINS).find_map(|_| {
            let s = try_lock_state(state);
            if s.is_none() {
                core::hint::spin_loop();
            }
            s
        });
        let s = spun.unwrap_or_else(|| state.lock().unwrap_or_else(PoisonError::into_inner));
        self.shared.verbs_waiting.fetch_sub(1, Ordering::AcqRel);
        s
    }

    /// Runs `f` on the device state under its lock, then sends what it produced and lets the
    /// progress thread know of any earlier timer. Every verb goes through here.
    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        self.with_at(f).0
    }

    /// As [`NetDevice::with`], for posting send work requests to QP `qpn`: the doorbell. When
    /// the QP already has packets awaiting acknowledgement and an application thread is
    /// busy-polling the device, what `f` queues is not sent now but at the next round of
    /// progress — that thread's next poll, or the one the acknowledgement brings — so a window
    /// of small messages posted one by one leaves in one segmented send instead of a system
    /// call each (a NIC batches the same way while it is busy). Otherwise it is sent at once,
    /// as by `with`: a ping-pong's post, with nothing outstanding, costs no delay.
    ///
    /// A poll that takes the last completion an application awaits ends its busy-poll mark
    /// (see [`NetDevice::poll_cq_with`]); when that application posts again right after, it
    /// is refilling its window (a stream whose one coalesced ACK completed all of it), and the
    /// post resumes the mark: without that, every post of the refill went out alone.
    pub fn post_with<R>(&self, qpn: uroce_wire::Qpn, f: impl FnOnce(&mut State) -> R) -> R {
        let mut s = self.lock();
        if s.engine.awaits_ack(qpn) {
            let now = s.now();
            if self.shared.busy_polled(now) || self.resume_busy_poll(&mut s, now) {
                s.counters.posts_batched += 1;
                return f(&mut s);
            }
        }
        drop(s);
        self.with(f)
    }

    /// Sets the busy-poll mark again if a poll ended it by draining the application's
    /// completions just before `now`; returns whether it did.
    fn resume_busy_poll(&self, s: &mut State, now: Instant) -> bool {
        if !self.shared.just_drained(now) {
            return false;
        }
        self.shared.mark_busy_poll(now);
        s.counters.busy_polls_resumed += 1;
        true
    }

    /// As [`NetDevice::with`], for posting receive work requests: what a busy poll held for
    /// the next verb (see [`NetDevice::poll_with`]) keeps waiting, for the reply that
    /// typically follows (a pingpong posts the next receive, then its answer). Every other
    /// verb sends what was held.
    pub fn post_recv_with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        self.with_holding(f, true).0
    }

    /// As [`NetDevice::with`], also returning the time the call's flush used.
    fn with_at<R>(&self, f: impl FnOnce(&mut State) -> R) -> (R, Instant) {
        self.with_holding(f, false)
    }

    /// [`NetDevice::with_at`]; `keep`: a verb that sends nothing leaves held packets held.
    fn with_holding<R>(&self, f: impl FnOnce(&mut State) -> R, keep: bool) -> (R, Instant) {
        let mut s = self.lock();
        let (held, sends) = (s.out.len(), s.sends);
        let (taken, over_arming) =
            (s.engine.completions_taken(), core::mem::take(&mut s.hold_over_arming));
        let r = f(&mut s);
        // A round of progress inside `f` has just read the clock: no need to again.
        let now = s.round_now.take().unwrap_or_else(|| s.now());
        s.collect(now);
        // What `f` and the collecting produced may have filled a batch, which took the held
        // packets with it: what now leads `out` came after them.
        let held = if s.sends == sends { held } else { 0 };
        // ACK coalescing, as an RNIC's: what a busy poll that received produced (the ACKs
        // of what arrived, mostly) waits for the application's next verb, so that the reply
        // it posts to what the poll handed it leaves in the same system call. Posting a
        // receive that sends nothing leaves held packets waiting; any other verb sends them,
        // and so does the next poll whatever it finds: nothing waits longer than one poll
        // round (or, should the application stop calling verbs, the progress thread's next
        // look-in, `BUSY_POLL_GRACE_NS`; closing the device sends them too). Between an
        // event and its poll, arming the CQ kept them: that poll keeps them once more if it
        // hands over completions and produced nothing itself (the event's completions, to
        // which the application replies next).
        //
        // A busy poll that finds nothing new keeps what earlier polls held for the kernel's
        // sockets, for a while (`HOLD_ACROSS_POLLS_NS`): an application that polls several
        // CQs between a message and its reply (UCX polls its send and receive CQs, and its UD
        // interface's, in every round of progress) would otherwise send the ACK alone from the
        // next one, and the reply alone after it — two datagrams, two system calls on each
        // side, where one carries both. Into a local peer's ring an ACK alone costs no system
        // call, so there it leaves as before: early, the peer handles it before it awaits the
        // reply rather than with it. Keeping goes on while it pays: when what was kept grows
        // too old and an idle poll sends it alone (the receiver of a stream, whose peer's
        // window waits for the ACK, and no reply comes), idle polls stop keeping, and try
        // again one hold in `KEEP_RETRY_EVERY`; it pays again when it leaves with a verb's
        // packets. (What leaves with the packets of a poll that received, an exchange's
        // ACK from the peer, say, neither.)
        let handed = s.engine.completions_taken() > taken;
        let may_keep = core::mem::take(&mut s.poll_may_keep);
        let young = s
            .held_since
            .is_some_and(|t| now.as_nanos().saturating_sub(t.as_nanos()) < HOLD_ACROSS_POLLS_NS);
        let unchanged = held > 0 && s.out.len() == held;
        let polled = s.polled_round.take();
        let kept_across = polled == Some(false) && may_keep && unchanged && young;
        let hold = kept_across
            || match polled {
                Some(received) => {
                    (received && held == 0 && s.may_hold())
                        || (over_arming && !received && handed && unchanged)
                }
                None => keep && unchanged,
            };
        if hold {
            s.counters.tx_held += u64::from(held == 0);
            if held == 0 {
                let fabric = &s.fabric;
                let through_sockets = s.out.iter().all(|o| {
                    let qpn = crate::fabric::dest_qpn(&o.bytes).unwrap_or(0);
                    fabric.path_to(o.dst.ip(), qpn) == crate::fabric::Path::Udp
                });
                let try_keeping = s.keeping_pays || {
                    s.keeping_retry_in = s.keeping_retry_in.saturating_sub(1);
                    s.keeping_retry_in == 0
                };
                s.held_since = (through_sockets && try_keeping).then_some(now);
                s.held_across_polls = false;
            }
            s.held_across_polls |= kept_across;
            s.hand_out_events();
        } else {
            if held > 0 && core::mem::take(&mut s.held_across_polls) {
                if polled.is_none() && s.out.len() > held {
                    s.keeping_pays = true;
                } else if may_keep && polled == Some(false) && unchanged && !young {
                    s.keeping_pays = false;
                    s.counters.holds_kept_for_nothing += 1;
                    s.keeping_retry_in = KEEP_RETRY_EVERY;
                }
            }
            s.held_since = None;
            // What was held, when it is only ACKs, leaves after what this verb produced (the
            // reply it posted): through the kernel each datagram makes its own trip, and the
            // peer waits for the reply first. An ACK's order does not matter to the peer: one
            // that comes after a later response of its QP is stale, and dropped. Requests and
            // the other responses keep their order: a READ response or atomic ACK overtaken
            // by a later response of its QP would look lost (an implied NAK, and the READ
            // asked for again), a request out of order a sequence error.
            if held > 0 && s.out.len() > held && s.out[..held].iter().all(Outgoing::is_acknowledge)
            {
                s.out.rotate_left(held);
            }
            s.send_out();
        }
        // A thread busy-polling runs the timers itself; otherwise the progress thread must
        // know of a deadline earlier than the one it sleeps to.
        let next = if self.shared.busy_polled(now) {
            None
        } else {
            s.wake_deadline(now).map(Instant::as_nanos)
        };
        // A deadline earlier than the one the progress thread sleeps to: the kernel's timer
        // wakes it then (arming it costs a system call; waking the thread now would cost a
        // context switch, and on a small machine the CPU the application is about to use).
        // Under the lock, as the thread sets its own deadline, so neither undoes the other.
        if let Some(t) = next
            && t < self.shared.sleeping_until.load(Ordering::Acquire)
        {
            self.shared.sleeping_until.store(t, Ordering::Release);
            self.shared.timer.arm_in(t.saturating_sub(now.as_nanos()));
        }
        drop(s);
        (r, now)
    }

    /// One round of progress in the calling thread (receive, timers, send): what polling a CQ
    /// does before it looks at the queue.
    pub fn progress(&self) {
        self.with(State::progress);
    }

    /// Arms `cq` for its next completion (its next solicited or unsuccessful one with
    /// `solicited_only`): `ibv_req_notify_cq`, usually between taking an event and polling,
    /// on the way to the reply. Arming sends and raises nothing, so it takes the lock without
    /// a verb's round of collecting, and leaves what a busy poll (the event's wait) held for
    /// the next verb: the poll that follows, if it hands over completions, keeps it for the
    /// reply to them, so that `ibv_rc_pingpong -e`'s ACK leaves with its answer, as when
    /// polling, instead of in a system call of its own. `false` for an unknown CQ.
    pub fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> bool {
        let mut s = self.lock();
        let armed = s.engine.req_notify_cq(cq, solicited_only);
        if armed && !s.armed_since_poll.contains(&cq) {
            s.armed_since_poll.push(cq);
        }
        s.hold_over_arming = !s.out.is_empty() && s.may_hold();
        if !s.hold_over_arming && !s.out.is_empty() {
            s.send_out();
        }
        armed
    }

    /// For a thread about to block (on a completion channel, say) after polling: ends the
    /// busy-poll mark [`NetDevice::poll_with`] set, so the progress thread goes back to the
    /// sockets now instead of at its next check-in. Returns whether there was a mark to end.
    pub fn end_busy_poll(&self) -> bool {
        // The stamp stays: woken now, the progress thread asks for wake-ups as a sleeper
        // (and looks at the rings once more) before it sleeps again. Clearing it would write
        // the line every sender reads on every poll that ends a mark (each ping-pong message).
        let ended = self.shared.clear_busy_poll();
        if ended {
            self.shared.wake.signal();
        }
        ended
    }

    /// For a thread about to block for an event: busy-polls (rounds of progress in this
    /// thread, the progress thread standing off the sockets) until `ready` holds or
    /// [`Options::event_spin`] passes. Returns whether `ready` held; if not, the caller ends
    /// the busy-poll mark ([`NetDevice::end_busy_poll`]) before it blocks.
    fn spin_for(&self, mut ready: impl FnMut() -> bool) -> bool {
        if ready() {
            return true;
        }
        if self.event_spin_ns == 0 {
            return false;
        }
        let until = self.shared.now_ns().saturating_add(self.event_spin_ns);
        loop {
            let (give_way, now) = self.with_at(|s| s.poll_for_peer(sys::current_cpu()));
            self.shared.mark_busy_poll(now);
            if ready() {
                return true;
            }
            if now.as_nanos() >= until {
                return false;
            }
            give_way.act(&self.wait_counts);
        }
    }

    /// For a thread about to block in `ibv_get_cq_event`: `NetDevice::spin_for` an event
    /// of `channel`, and takes it. `None`: none came; the caller ends the busy-poll mark and
    /// blocks.
    pub fn spin_for_event(&self, channel: &Channel) -> Option<CqHandle> {
        if let Some(e) = channel.try_get() {
            return Some(e);
        }
        if self.event_spin_ns == 0 {
            return None;
        }
        channel.spinning(true);
        let found = self.spin_for(|| channel.has_event());
        let e = found.then(|| channel.try_get()).flatten();
        channel.spinning(false);
        // Counted without the device lock: a waiter woken by its event goes on to poll, and
        // one more acquisition (with the progress thread perhaps holding it) would delay that.
        let ended = if e.is_some() { &self.wait_counts.found } else { &self.wait_counts.expired };
        ended.fetch_add(1, Ordering::Relaxed);
        e
    }

    /// For a thread that busy-polls: a round of progress, then `f`, under one acquisition of
    /// the lock. While such a thread keeps polling, the progress thread stays off the sockets
    /// (it looks in every millisecond for timers, and takes over when polling stops).
    ///
    /// A poll that leaves no work request pending ends the busy-poll mark instead: the
    /// application cannot be waiting for a completion then, but may be waiting for a one-sided
    /// operation to land in its memory (perftest's `ib_write_lat` spins on the buffer), which
    /// only the progress thread will take off the socket.
    ///
    /// A poll that found nothing while the local peer that sent last was last seen on this
    /// thread's CPU yields the CPU to it, and after a run of such polls one of the two moves to
    /// another CPU: two pollers taking turns on one CPU would each wait a time slice for the
    /// other's answer.
    pub fn poll_with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        self.poll_cq_with(None, f)
    }

    /// [`NetDevice::poll_with`] for a poll of `cq`: a poll of a CQ armed for a notification
    /// (`ibv_req_notify_cq`, then `ibv_poll_cq`: what Gloo, UCX's event mode and libfabric do
    /// before they sleep in `poll(2)` on the channel's descriptor) is no busy-poll, and sets
    /// no mark; otherwise the progress thread would stay off the sockets for the grace period
    /// while the application sleeps, and every message would wait up to a millisecond.
    pub fn poll_cq_with<R>(&self, cq: Option<CqHandle>, f: impl FnOnce(&mut State) -> R) -> R {
        let ((r, pending, armed, give_way, peers_wake), now) = self.with_at(|s| {
            let cpu = sys::current_cpu();
            // A CQ that holds completions already (the event's, which the wait's last round
            // received; a backlog) is polled without a round of progress of its own — a
            // socket read, a system call, for nothing the application needs now. Never twice
            // in a row, so a thread working through a backlog still receives and sends.
            let skip = !core::mem::take(&mut s.skipped_round)
                && cq.is_some_and(|c| s.engine.cq_len(c) > 0);
            if skip {
                s.skipped_round = true;
                s.counters.polls_without_round += 1;
                s.polled_round = Some(false);
            } else {
                s.poll_saying_where(cpu);
            }
            let r = f(s);
            // A CQ armed since its last poll counts as armed: the completion whose event
            // disarmed it in between (Gloo arms, then polls) leaves the application going to
            // sleep all the same, not busy-polling.
            let armed_before = cq.is_some_and(|c| s.take_armed_since_poll(c));
            let armed = armed_before || cq.is_some_and(|c| s.engine.cq_armed(c));
            // The poll of an armed CQ comes before a sleep, which no verb of ours sees (the
            // application waits in poll(2) on the channel's descriptor): what this poll would
            // hold for the next verb leaves now, unless a busy-poll mark stands (the event
            // was spun for), whose look-in sends it should no verb follow. Without a mark
            // nothing would: a held ACK would wait for the requester's tail-loss probe.
            if armed && s.polled_round.is_some() {
                let now = s.round_now.unwrap_or_else(|| s.now());
                if !self.shared.busy_polled(now) {
                    s.polled_round = None;
                }
            }
            // The poll of an armed CQ comes before a sleep: nothing to give way for (and a
            // move decided there and not made would hold the next one off).
            let give_way = if armed || skip { GiveWay::No } else { s.give_way(cpu) };
            s.poll_may_keep = !armed;
            let pending = s.engine.has_pending_work();
            // Asked only of a poll that may end the mark (no clock read for the others).
            // (What the round produced may be held for the next verb: only the woken thread
            // would send it, were the application to go on to other work.)
            let peers_wake = !pending && s.out.is_empty() && {
                let now = s.round_now.unwrap_or_else(|| s.now());
                s.fabric.peers_wake_a_stopped_poller(now)
            };
            (r, pending, armed, give_way, peers_wake)
        });
        if armed {
            return r;
        }
        if pending {
            self.shared.mark_busy_poll(now);
        } else {
            let idly = self.shared.polls_idly(now);
            self.shared.mark_drained(now);
            if idly {
                self.shared.mark_busy_poll(now);
            } else if peers_wake {
                // Ends the mark without waking the progress thread: a loop that polls a long
                // operation to its end (a 512 KiB READ, an MPI rendezvous) and posts the next
                // one at once woke it for nothing every time (4,500 times a second, each a
                // context switch that took a CPU from a spinning thread). Should the
                // application have gone on to other work instead, its local peers' next
                // packet finds its stamp lapsed and wakes the thread.
                if self.shared.clear_busy_poll() {
                    self.wait_counts.ended_quietly.fetch_add(1, Ordering::Relaxed);
                }
            } else if self.end_busy_poll() {
                self.wait_counts.ended.fetch_add(1, Ordering::Relaxed);
            }
        }
        if give_way != GiveWay::No {
            give_way.act(&self.wait_counts);
        }
        r
    }
}

/// Closing a device waits for packets queued for a local peer's full ring at most this long
/// while none of them moves (the peer stopped reading, but its process runs).
const CLOSE_DRAIN_STALL_NS: u64 = 1_000_000_000;

impl NetDevice {
    /// Before closing: sends what waits for room in a local peer's ring, and waits for the
    /// peers to read their rings (which go with this endpoint: a peer that had not opened its
    /// ring yet would never find it). A UD or UC send completes when its packet is handed
    /// over (copied aside if the ring was full), so an application may close its device right
    /// after its last completion (`ib_send_bw -c UD` does); an RNIC has put such a packet on
    /// the wire by then, and so must this device before it goes. Gives up once nothing moved
    /// for [`CLOSE_DRAIN_STALL_NS`]; what waits for a peer whose process is gone is let go
    /// sooner (`shm_tx_no_endpoint`).
    fn drain_before_close(&self) {
        let mut last_move = (self.shared.now_ns(), (u64::MAX, u64::MAX));
        loop {
            let mut s = self.lock();
            s.send_out();
            let (retry, unread) = (s.fabric.backlog_retry(), s.fabric.unread());
            if retry.is_none() && unread == 0 {
                return;
            }
            let moved = (s.counters.shm_tx_packets, unread);
            drop(s);
            let now = self.shared.now_ns();
            if moved != last_move.1 {
                last_move = (now, moved);
            } else if now.saturating_sub(last_move.0) > CLOSE_DRAIN_STALL_NS {
                return;
            }
            let wait = retry.map_or(20_000, |r| r.as_nanos());
            #[expect(clippy::disallowed_methods, reason = "a closing device waits for its peer")]
            std::thread::sleep(Duration::from_nanos(wait));
        }
    }
}

impl Drop for NetDevice {
    fn drop(&mut self) {
        // What a busy poll held for a next verb that never came (an ACK, typically), and what
        // waits for a local peer's ring.
        self.drain_before_close();
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // The slot goes free now, under a new generation; the rings and FIFO (named after
        // this one) are removed when the engine's state drops, just after, and a successor
        // claiming the slot meanwhile removes them too.
        drop(self.endpoint.take());
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
    let mut slept_on_fabric = false;
    let mut look_ins = 0;
    let mut taken_over = 0;
    let mut fds = Vec::new();
    while !shared.stop.load(Ordering::Acquire) {
        fds.clear();
        fds.push(shared.wake.as_raw_fd());
        fds.push(shared.timer.as_raw_fd());
        let now_ns = shared.now_ns();
        // While an application thread busy-polls, it receives and runs the timers; the
        // thread only looks in to take over once polling stops, and leaves the lock alone:
        // taking it from a thread that holds it almost always would cost both a context
        // switch, and on a machine with fewer cores than spinning threads a preempted lock
        // holder stalls every thread of the device for a scheduler slice (milliseconds).
        //
        // It sleeps beside the poller on the fabric's wake-up too: a local sender wakes it
        // once the poller's stamp is stale (the application went on to other work, and a
        // request for it would wait for the next look-in), and it then takes over for a round.
        let look_in = if slept_on_fabric { None } else { shared.busy_poll_lapses_in(now_ns) };
        let mut beside_poller = None;
        let wait_ns = if let Some(lapse_ns) = look_in {
            look_ins += 1;
            if let Some(mark) = &shared.busy_mark {
                let Some(fifo) = mark.sleep_beside_poller() else {
                    slept_on_fabric = true;
                    taken_over += 1;
                    continue;
                };
                fds.push(fifo);
                beside_poller = Some(mark);
            }
            // No timeout of its own: the look-in timer, which the poller pushes on while it
            // polls, wakes the thread once the poller has stopped for a grace or more (so
            // `sleeping_until` is the earliest it wakes; verbs arm no timer while the mark
            // holds, and the poller runs the timers).
            shared.arm_look_in(now_ns, lapse_ns);
            fds.push(shared.look_in.as_raw_fd());
            shared.sleeping_until.store(now_ns.saturating_add(lapse_ns), Ordering::Release);
            None
        } else {
            let mut s = lock();
            if core::mem::take(&mut slept_on_fabric) {
                s.fabric.woken();
            }
            s.counters.progress_wakeups += 1;
            s.counters.progress_look_ins += core::mem::take(&mut look_ins);
            s.counters.progress_takeovers += core::mem::take(&mut taken_over);
            let before = s.counters.received();
            s.progress();
            let received = s.counters.received().saturating_sub(before);
            let now = s.now();
            // A trickle (a request, a ping-pong's message) is worth spinning for the next one;
            // a stream keeps the thread busy anyway, and a consumer spinning on the rings
            // only takes their cache lines from the producer. A process that waits for
            // completion events spins in its own wait (`Options::event_spin`); a second
            // spinner beside it only takes its CPU (`ibv_ud_pingpong -e` went from 6 to
            // 35–98 µs an iteration).
            let trickle = (1..=SPIN_TRICKLE).contains(&received);
            let events = s.engine.events_requested();
            if spin_ns > 0 && trickle && !events && !shared.busy_polled(now) {
                s.counters.progress_spins += 1;
                drop(s);
                let preempted = spin(shared, spin_ns);
                s = lock();
                s.counters.progress_spins_preempted += u64::from(preempted);
            }
            let now = s.now();
            let busy = shared.busy_polled(now);
            // Ask the fabric's senders for a wake-up (beside a poller: once it has stopped);
            // if something arrived meanwhile, go round again instead of sleeping — unless
            // the poller is there to take it (a stream it polls would otherwise have this
            // thread take the lock from it round after round).
            let pending = !s.fabric.prepare_sleep(busy);
            // (The poller's stamp, a clock read, is looked at only when it decides.)
            if pending && (!busy || shared.busy_mark.as_ref().is_none_or(BusyMark::poller_stopped))
            {
                slept_on_fabric = busy;
                continue;
            }
            if !busy {
                slept_on_fabric = true;
                s.fabric.wait_fds(&mut fds);
            } else if let Some(mark) = &shared.busy_mark {
                // Asked again if the look found packets (which took the request back).
                let fifo = if pending { mark.sleep_beside_poller() } else { Some(mark.wake_fd()) };
                let Some(fifo) = fifo else {
                    slept_on_fabric = true;
                    continue;
                };
                fds.push(fifo);
                beside_poller = Some(mark);
            }
            let mut deadline = s.wake_deadline(now);
            if busy {
                let look_again = now + uroce_engine::Duration::from_nanos(BUSY_POLL_GRACE_NS);
                deadline = Some(deadline.map_or(look_again, |d| d.min(look_again)));
            }
            shared
                .sleeping_until
                .store(deadline.map_or(u64::MAX, Instant::as_nanos), Ordering::Release);
            deadline.map(|t| t.as_nanos().saturating_sub(now.as_nanos()))
        };
        let _ = sys::poll_readable_ns(&fds, wait_ns);
        // Woken beside the poller by a sender: the next round takes the lock and receives
        // (and empties the wake-up FIFO), even though the poller's mark has not lapsed.
        if beside_poller.is_some_and(BusyMark::poked) {
            slept_on_fabric = true;
            taken_over += 1;
        }
        shared.wake.take();
        // Every time: a wake-up before the timer's expiry clears nothing, and the expiry
        // must not be left readable.
        shared.timer.clear();
        if look_in.is_some() {
            // Awake: the poller stops pushing a look-in nobody sleeps on.
            shared.look_in_at.store(0, Ordering::Release);
            shared.look_in.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(c: &Channel) -> bool {
        sys::readable_now(c.as_raw_fd())
    }

    /// `uroce stat` sums a device's processes with `+=`: every counter must be in the sum
    /// (the GSO, GRO and batching counters were once left out of it).
    #[test]
    fn adding_counters_adds_every_one() {
        // Every field, and no `..`: a counter added later does not compile here until it
        // is added, and then this checks its line in `add_assign`.
        let ones = NetCounters {
            tx_datagrams: 1,
            tx_batches: 1,
            tx_errors: 1,
            tx_too_big: 1,
            tx_zero_copy: 1,
            tx_zero_copy_bytes: 1,
            tx_gso_sends: 1,
            tx_gso_segments: 1,
            tx_gso_refused: 1,
            tx_sockets_connected: 1,
            tx_connect_failed: 1,
            tx_sockets_closed: 1,
            tx_icmp_errors: 1,
            posts_batched: 1,
            busy_polls_resumed: 1,
            tx_held: 1,
            holds_kept_for_nothing: 1,
            acks_superseded: 1,
            rx_datagrams: 1,
            rx_gro_datagrams: 1,
            rx_gro_segments: 1,
            rx_batches: 1,
            fault_drops: 1,
            fault_dups: 1,
            fault_reorders: 1,
            fault_corruptions: 1,
            progress_wakeups: 1,
            progress_look_ins: 1,
            progress_takeovers: 1,
            progress_spins: 1,
            progress_spins_preempted: 1,
            event_spins_found: 1,
            event_spins_expired: 1,
            yields_to_peer: 1,
            moves_off_peer_cpu: 1,
            busy_polls_ended: 1,
            busy_polls_ended_quietly: 1,
            polls_without_round: 1,
            async_events_unclaimed: 1,
            shm_tx_packets: 1,
            shm_tx_ring_full: 1,
            shm_tx_no_endpoint: 1,
            shm_tx_payload_gone: 1,
            shm_rx_packets: 1,
            shm_rx_malformed: 1,
            shm_wakeups_sent: 1,
            shm_wakeups_stopped_poller: 1,
            udp_rx_forwarded: 1,
            udp_steer_probes_sent: 1,
            udp_steer_probes_heard: 1,
            udp_steer_probes_lost: 1,
            udp_steer_programs: 1,
            udp_steer_refused: 1,
            udp_gsi_handed_over: 1,
            cm_released_for_dead: 1,
            udp_polls_skipped: 1,
        };
        let mut sum = NetCounters::default();
        sum += ones;
        sum += ones;
        for (name, v) in sum.fields() {
            assert_eq!(v, 2, "{name}");
        }
    }

    /// What a [`Watched`] fabric does with each batch it is handed.
    type OnTransmit = Box<dyn FnMut(&[Outgoing]) + Send>;

    /// A fabric for watching the runtime: it sends nothing and receives nothing, shows each
    /// batch it is handed to `on_transmit`, and counts the rounds that read it.
    struct Watched {
        on_transmit: OnTransmit,
        reads: Arc<AtomicU32>,
        /// The path it says packets take ([`Fabric::path_to`]).
        path: crate::fabric::Path,
    }

    impl Watched {
        fn new(on_transmit: impl FnMut(&[Outgoing]) + Send + 'static) -> Self {
            Self {
                on_transmit: Box::new(on_transmit),
                reads: Arc::default(),
                path: crate::fabric::Path::Udp,
            }
        }
    }

    impl Fabric for Watched {
        fn transmit(&mut self, out: &mut Vec<Outgoing>, _: &Registry, _: &mut NetCounters) {
            (self.on_transmit)(out);
        }
        fn receive(
            &mut self,
            _: Instant,
            _: &mut NetCounters,
            _: &mut crate::fabric::Sink<'_>,
        ) -> usize {
            self.reads.fetch_add(1, Ordering::Relaxed);
            0
        }
        fn wait_fds(&self, _: &mut Vec<RawFd>) {}
        fn sync_multicast(&mut self, _: &[IpAddr]) -> io::Result<()> {
            Ok(())
        }
        fn path_to(&self, _: IpAddr, _: u32) -> crate::fabric::Path {
            self.path
        }
    }

    /// A [`Watched`] fabric that logs each batch handed to it: how many packets, and whether
    /// an ACK was among them.
    fn logging_batches(log: &Arc<Mutex<Vec<(usize, bool)>>>) -> Watched {
        let batches = Arc::clone(log);
        Watched::new(move |out| {
            let ack = out.iter().any(Outgoing::is_acknowledge);
            batches.lock().unwrap().push((out.len(), ack));
        })
    }

    /// Posts a signaled UD SEND of a few inline bytes on `qp` to QPN 2 at `to` (the watched
    /// fabric drops it; its completion comes as it leaves).
    fn post_ud_send(s: &mut State, qp: uroce_wire::Qpn, pd: PdHandle, to: &str, wr_id: u64) {
        use uroce_engine::{AhAttr, QKey, SendWr, UdDest, WrOpcode};
        let e = s.engine();
        let ah = e.create_ah(pd, AhAttr::new(to.parse().unwrap())).unwrap();
        let mut wr = SendWr::new(wr_id, WrOpcode::Send, Vec::new());
        wr.inline_data = Some(b"ping".to_vec());
        let remote_qpn = uroce_wire::Qpn::new(2).unwrap();
        wr.ud = Some(UdDest { ah, remote_qpn, remote_qkey: QKey(7) });
        e.post_send(qp, wr).unwrap();
    }

    /// A UD SEND completes as its datagram leaves; the completion event that wakes a waiter
    /// (an eventfd write, a system call) comes after the datagram is handed to the fabric, so
    /// that a ping-pong's reply does not wait for it.
    #[test]
    fn a_completion_event_is_handed_out_after_the_packets_of_its_round() {
        use uroce_engine::{Access, Psn, QKey, QpCap, QpInitAttr, QpType};
        let options = Options { no_progress_thread: true, ..Options::default() };
        let dev = NetDevice::open("127.0.18.10".parse().unwrap(), options).unwrap();
        let channel = Arc::new(Channel::new().unwrap());
        let handed = Arc::new(AtomicU32::new(0));
        let handed_after_event = Arc::new(AtomicU32::new(0));
        dev.with(|s| {
            // Notes, each time it is handed packets, whether `channel` already had an event.
            let (ch, all, late) =
                (Arc::clone(&channel), Arc::clone(&handed), Arc::clone(&handed_after_event));
            s.fabric = Box::new(Watched::new(move |out| {
                let n = u32::try_from(out.len()).unwrap_or(u32::MAX);
                all.fetch_add(n, Ordering::Relaxed);
                if ch.has_event() {
                    late.fetch_add(n, Ordering::Relaxed);
                }
            }));
            let e = s.engine();
            let pd = e.alloc_pd();
            let cq = e.create_cq(4).unwrap();
            let init = QpInitAttr {
                qp_type: QpType::Ud,
                pd,
                send_cq: cq,
                recv_cq: cq,
                cap: QpCap { max_inline_data: 64, ..QpCap::default() },
                sq_sig_all: true,
                srq: None,
                xrcd: None,
            };
            let qp = e.create_qp(init).unwrap();
            e.init_qp(qp, Access::NONE, QKey(7)).unwrap();
            e.ready_datagram_qp(qp, Psn::ZERO).unwrap();
            assert!(e.req_notify_cq(cq, false));
            s.bind_channel(cq, Arc::clone(&channel));
            post_ud_send(s, qp, pd, "127.0.18.11", 1);
        });
        assert_eq!(handed.load(Ordering::Relaxed), 1, "the datagram was sent");
        assert!(channel.has_event(), "the send's completion raised the event");
        assert_eq!(handed_after_event.load(Ordering::Relaxed), 0, "the event came first");
    }

    /// An RC ACKNOWLEDGE to QP `qpn` for `psn` with AETH syndrome `syndrome` (0: ACK).
    fn acknowledge(qpn: u32, psn: u32, syndrome: u8, alone: bool) -> Outgoing {
        let mut bytes = vec![0u8; 16];
        bytes[0] = uroce_wire::opcode::Opcode::RC_ACKNOWLEDGE.0;
        bytes[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        bytes[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
        bytes[12] = syndrome;
        Outgoing { dst: "127.0.18.21:4791".parse().unwrap(), bytes, alone, ..Outgoing::empty() }
    }

    /// A held ACK gives way to a later one of the same QP; NAKs, ACKs of other QPs, ACKs sent
    /// alone on purpose and an ACK older than the held one do not replace it.
    #[test]
    fn a_later_ack_of_the_same_qp_replaces_a_held_one() {
        let options = Options { no_progress_thread: true, ..Options::default() };
        let dev = NetDevice::open("127.0.18.20".parse().unwrap(), options).unwrap();
        dev.with(|s| {
            let psns = |s: &State| -> Vec<(u32, u8)> {
                s.out
                    .iter()
                    .map(|o| {
                        (u32::from_be_bytes([0, o.bytes[9], o.bytes[10], o.bytes[11]]), o.bytes[12])
                    })
                    .collect()
            };
            s.out.push(acknowledge(5, 10, 0, false));
            let later = s.supersede_ack(acknowledge(5, 12, 0, false));
            assert!(later.is_some() && s.out.is_empty(), "the held ACK for 10 went");
            s.out.extend(later);
            assert!(s.supersede_ack(acknowledge(5, 11, 0, false)).is_none(), "an older one goes");
            assert_eq!(psns(s), [(12, 0)]);
            assert_eq!(s.counters.acks_superseded, 2);
            // A sequence NAK (syndrome 011 00000), another QP, a farewell copy: all stay.
            for o in [
                acknowledge(5, 13, 0x60, false),
                acknowledge(6, 13, 0, false),
                acknowledge(5, 14, 0, true),
            ] {
                let o = s.supersede_ack(o);
                assert!(o.is_some());
                s.out.extend(o);
            }
            assert_eq!(psns(s), [(12, 0), (13, 0x60), (13, 0), (14, 0)]);
            // Wrapping PSNs: 2 comes after 2^24 − 1.
            s.out.clear();
            s.out.push(acknowledge(7, 0xFF_FFFF, 0, false));
            let wrapped = s.supersede_ack(acknowledge(7, 2, 0, false));
            assert!(wrapped.is_some() && s.out.is_empty());
            assert_eq!(s.counters.acks_superseded, 3);
        });
    }

    /// `ibv_rc_pingpong -e`'s turn: the wait for an event receives the peer's message and
    /// holds its ACK; then `ibv_req_notify_cq`, `ibv_poll_cq` (which hands over the
    /// completion) and the reply. The ACK leaves with the reply, in one batch, as when
    /// polling — arming used to send it alone (a system call of its own, and a datagram the
    /// peer reads in a call of its own: 1.4× the polling pingpong's time over UDP). A poll
    /// after the arming that hands over nothing sends it at once: nothing is held longer.
    /// Nor is it held when no busy poll stands behind it (an application that waits in
    /// poll(2) on the channel's descriptor itself, as Gloo does): no look-in of the progress
    /// thread would send it should the application sleep instead of replying.
    #[test]
    fn a_held_ack_leaves_with_the_reply_across_the_arming_of_the_cq() {
        let options = Options { no_progress_thread: true, ..Options::default() };
        let dev = NetDevice::open("127.0.18.30".parse().unwrap(), options).unwrap();
        // Each batch handed over: how many packets, and whether an ACK was among them.
        let log = Arc::new(Mutex::new(Vec::new()));
        let (qpn, pd, cq, _, _) = dev.with(|s| {
            s.fabric = Box::new(logging_batches(&log));
            ud_qp(s, 0, 4096)
        });
        let send = |dev: &NetDevice| dev.with(|s| post_ud_send(s, qpn, pd, "127.0.18.31", 1));
        let poll = |dev: &NetDevice| {
            let mut got = Vec::new();
            dev.poll_cq_with(Some(cq), |s| s.engine().poll_cq(cq, 16, &mut got));
            got.len()
        };
        for (hands_over, spun) in [(true, true), (false, true), (true, false)] {
            // A completion to hand over (a send's), or none.
            if hands_over {
                send(&dev);
            }
            log.lock().unwrap().clear();
            // As a round of the wait that received the message: it holds the ACK. A wait
            // that spun for the event left a busy-poll mark.
            let (_, now) = dev.with_at(|s| {
                s.out.push(acknowledge(5, 10, 0, false));
                s.polled_round = Some(true);
            });
            if spun {
                dev.shared.mark_busy_poll(now);
            } else {
                dev.shared.clear_busy_poll();
            }
            assert!(log.lock().unwrap().is_empty(), "the ACK is held");
            assert!(dev.req_notify_cq(cq, false));
            assert!(log.lock().unwrap().is_empty(), "arming sends nothing");
            assert_eq!(poll(&dev), usize::from(hands_over));
            if !spun {
                assert_eq!(*log.lock().unwrap(), [(1, true)], "no busy poll behind it: sent");
                dev.with(|s| s.engine().poll_cq(cq, 16, &mut Vec::new()));
            } else if hands_over {
                assert!(log.lock().unwrap().is_empty(), "kept for the reply to the completion");
                send(&dev);
                assert_eq!(*log.lock().unwrap(), [(2, true)], "the reply and the ACK together");
                // (The reply's own completion.)
                dev.with(|s| s.engine().poll_cq(cq, 16, &mut Vec::new()));
            } else {
                assert_eq!(*log.lock().unwrap(), [(1, true)], "nothing handed over: sent");
            }
        }
    }

    /// UCX's turn: one round of its progress polls several CQs (its RC interface's send and
    /// receive CQs, its UD interface's), and the reply to a message is posted after the
    /// round. The ACK the receiving poll held waits through the polls of other CQs that find
    /// nothing, and leaves with the reply; the poll of an armed CQ (the application is about
    /// to sleep) or one after `HOLD_ACROSS_POLLS_NS` sends it alone, and so does the next poll
    /// when it goes into a local peer's ring (no system call to save). Over UDP the ACK and the
    /// reply went as two datagrams in 0.44 of UCX's round trips (`uroce stat`: `tx_batches`
    /// against `tx_gso_sends`), and the kept hold must also stop where it does not pay.
    #[test]
    #[expect(clippy::disallowed_methods, reason = "the held ACK must outgrow its time")]
    fn a_held_ack_waits_through_idle_polls_of_other_cqs_for_the_reply() {
        let options = Options { no_progress_thread: true, ..Options::default() };
        let dev = NetDevice::open("127.0.18.60".parse().unwrap(), options).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (qpn, pd, cq, _mr, _) = dev.with(|s| {
            s.fabric = Box::new(logging_batches(&log));
            ud_qp(s, 0, 4096)
        });
        let other = dev.with(|s| s.engine().create_cq(16).unwrap());
        let poll = |c: CqHandle| {
            dev.poll_cq_with(Some(c), |s| s.engine().poll_cq(c, 16, &mut Vec::new()));
        };
        // A poll received a message and held its ACK (as in the test above).
        let hold = || {
            let (_, now) = dev.with_at(|s| {
                s.out.push(acknowledge(5, 10, 0, false));
                s.polled_round = Some(true);
            });
            dev.shared.mark_busy_poll(now);
            log.lock().unwrap().clear();
        };
        // The application's reply to the message.
        let reply = || dev.with(|s| post_ud_send(s, qpn, pd, "127.0.18.61", 1));
        hold();
        for _ in 0..3 {
            poll(other);
            poll(cq);
        }
        assert!(log.lock().unwrap().is_empty(), "idle polls sent the held ACK");
        reply();
        assert_eq!(*log.lock().unwrap(), [(2, true)], "the reply and the ACK together");
        poll(cq);
        // Held too long: an idle poll sends it, once its round reads the clock (one in
        // CLOCK_EVERY does). Keeping did not pay (as for a stream's receiver, whose peer
        // waits for the ACK and sends no reply): idle polls stop keeping.
        hold();
        poll(other);
        std::thread::sleep(Duration::from_nanos(2 * HOLD_ACROSS_POLLS_NS));
        assert!(log.lock().unwrap().is_empty());
        for _ in 0..=CLOCK_EVERY {
            poll(other);
        }
        assert_eq!(*log.lock().unwrap(), [(1, true)], "an old ACK left alone");
        assert_eq!(dev.with(|s| s.counters().holds_kept_for_nothing), 1);
        hold();
        poll(other);
        assert_eq!(*log.lock().unwrap(), [(1, true)], "kept for nothing before: sent");
        // Tried again (one hold in KEEP_RETRY_EVERY), and paying: kept again.
        dev.with(|s| s.keeping_retry_in = 1);
        hold();
        poll(other);
        assert!(log.lock().unwrap().is_empty(), "tried again: kept");
        reply();
        assert_eq!(*log.lock().unwrap(), [(2, true)], "the reply and the ACK together");
        poll(cq);
        hold();
        poll(other);
        assert!(log.lock().unwrap().is_empty(), "paid: kept");
        reply();
        poll(cq);
        // Taken along by a poll that received (an exchange: the peer's ACK came first): that
        // says nothing against keeping.
        hold();
        poll(other);
        dev.with_at(|s| {
            s.out.push(acknowledge(6, 20, 0, false));
            s.polled_round = Some(true);
        });
        assert_eq!(log.lock().unwrap().len(), 1, "sent with what the poll received");
        log.lock().unwrap().clear();
        hold();
        poll(other);
        assert!(log.lock().unwrap().is_empty(), "still kept");
        reply();
        poll(cq);
        // The poll of an armed CQ precedes a sleep: it sends at once.
        hold();
        assert!(dev.req_notify_cq(other, false));
        poll(other);
        assert_eq!(*log.lock().unwrap(), [(1, true)], "polled armed: sent");
        // Into a local peer's ring: the next poll (of a CQ not armed) sends it.
        dev.with(|s| {
            let mut ring = logging_batches(&log);
            ring.path = crate::fabric::Path::Shm;
            s.fabric = Box::new(ring);
        });
        hold();
        poll(cq);
        assert_eq!(*log.lock().unwrap(), [(1, true)], "through a ring: sent");
    }

    /// Gloo's turn: `ibv_req_notify_cq`, then `ibv_poll_cq`, then poll(2) on the channel's
    /// descriptor. When a completion comes between the arming and the poll, its event
    /// disarms the CQ, and the poll looked like a busy poll: with work outstanding it set
    /// the busy-poll mark, so the progress thread stood off and local senders did not wake
    /// it while the application slept — the next message waited for the mark to go stale
    /// (200 µs), the requester's tail-loss probe fired first, and one allreduce in ten was
    /// sent twice. A poll of a CQ armed since its last poll is no busy poll; the poll after
    /// it, with no arming between, is.
    #[test]
    fn a_poll_after_arming_is_no_busy_poll_even_when_an_event_disarmed_the_cq() {
        use uroce_engine::{RecvWr, Sge};
        let options = Options { no_progress_thread: true, ..Options::default() };
        let dev = NetDevice::open("127.0.18.50".parse().unwrap(), options).unwrap();
        let channel = Arc::new(Channel::new().unwrap());
        let (qpn, pd, cq, _mr, _) = dev.with(|s| {
            s.fabric = Box::new(Watched::new(|_| {}));
            let (qpn, pd, cq, mr, addr) = ud_qp(s, 1, 4096);
            s.bind_channel(cq, Arc::clone(&channel));
            // A receive posted: work outstanding, as in any application awaiting messages.
            let sge = Sge { addr, length: 4096, lkey: mr.lkey };
            s.engine().post_recv(qpn, RecvWr { wr_id: 9, sg_list: [sge].into() }).unwrap();
            (qpn, pd, cq, mr, addr)
        });
        let poll = || {
            let mut got = Vec::new();
            dev.poll_cq_with(Some(cq), |s| s.engine().poll_cq(cq, 16, &mut got));
            (got.len(), dev.shared.busy_polled(dev.clock()))
        };
        assert!(dev.req_notify_cq(cq, false));
        // A completion between the arming and the poll: its event disarms the CQ.
        dev.with(|s| post_ud_send(s, qpn, pd, "127.0.18.51", 1));
        assert!(channel.has_event() && !dev.with(|s| s.engine().cq_armed(cq)));
        assert_eq!(poll(), (1, false), "after arming: no busy poll");
        assert_eq!(poll(), (0, true), "no arming since: a busy poll");
    }

    /// A poll of a CQ that already holds completions (an event's, which the wait received)
    /// hands them over without a round of progress — over UDP an empty socket read, a system
    /// call: `ibv_ud_pingpong -e` paid one per side and iteration. Never twice in a row, so a
    /// thread working through a backlog still receives.
    #[test]
    fn a_poll_of_a_cq_with_completions_skips_its_round_but_never_twice_in_a_row() {
        let options = Options { no_progress_thread: true, ..Options::default() };
        let dev = NetDevice::open("127.0.18.40".parse().unwrap(), options).unwrap();
        let fabric = Watched::new(|_| {});
        let rounds = Arc::clone(&fabric.reads);
        let (qpn, pd, cq, _, _) = dev.with(|s| {
            s.fabric = Box::new(fabric);
            ud_qp(s, 0, 4096)
        });
        // Three completions queued (UD sends complete as they leave).
        dev.with(|s| (0..3).for_each(|i| post_ud_send(s, qpn, pd, "127.0.18.41", i)));
        let poll_one = || {
            let mut got = Vec::new();
            dev.poll_cq_with(Some(cq), |s| s.engine().poll_cq(cq, 1, &mut got));
            (got.len(), rounds.load(Ordering::Relaxed))
        };
        assert_eq!(poll_one(), (1, 0), "completions queued: no round");
        assert_eq!(poll_one(), (1, 1), "but not twice in a row");
        assert_eq!(poll_one(), (1, 1), "one still queued: no round");
        assert_eq!(poll_one(), (0, 2), "none queued: a round");
        assert_eq!(dev.with(|s| s.counters().polls_without_round), 2);
    }

    /// A UD QP with `recvs` receive WQEs on a fresh CQ, and a registered region of `len`.
    fn ud_qp(
        s: &mut State,
        recvs: u32,
        len: usize,
    ) -> (uroce_wire::Qpn, PdHandle, CqHandle, MemoryRegion, u64) {
        use uroce_engine::{Psn, QKey, QpCap, QpInitAttr, QpType};
        let pd = s.engine().alloc_pd();
        let cq = s.engine().create_cq(8192).unwrap();
        let init = QpInitAttr {
            qp_type: QpType::Ud,
            pd,
            send_cq: cq,
            recv_cq: cq,
            cap: QpCap { max_send_wr: 4096, max_recv_wr: recvs.max(1), ..QpCap::default() },
            sq_sig_all: false,
            srq: None,
            xrcd: None,
        };
        let qp = s.engine().create_qp(init).unwrap();
        s.engine().init_qp(qp, Access::NONE, QKey(7)).unwrap();
        s.engine().ready_datagram_qp(qp, Psn::ZERO).unwrap();
        let region = Arc::new(RawRegion::new(len, false).unwrap());
        let addr = region.addr();
        let mr = s.register(pd, region, Access::LOCAL_WRITE).unwrap();
        (qp, pd, cq, mr, addr)
    }

    /// Packets a verb could not fit in a local peer's ring wait in the backlog; the progress
    /// thread sends them while the application does nothing more. Once, it slept without
    /// the backlog's retry as a deadline, and the rest waited until something else woke it
    /// (`ib_send_bw -c UD` lost the last of its 1,000 messages that way, now and then).
    #[test]
    fn what_a_full_ring_left_waiting_goes_without_another_verb() {
        to_a_stalled_peer("127.0.18.14", "127.0.18.15", 3000, false);
    }

    /// The same, the sender closing its device at once: its UD sends have completed, so
    /// closing sends what still waits (a NIC's link has carried it by then).
    #[test]
    fn closing_a_device_sends_what_waits_for_a_ring_first() {
        to_a_stalled_peer("127.0.18.16", "127.0.18.17", 3000, true);
    }

    /// A few datagrams, all in the ring, and the sender closes before the receiver ever
    /// looked: closing waits until they are read (the ring goes with the sender, and a
    /// receiver that had not opened it would never find it).
    #[test]
    fn closing_a_device_waits_until_its_rings_are_read() {
        to_a_stalled_peer("127.0.18.18", "127.0.18.19", 10, true);
    }

    /// `n` UD datagrams of 2,000 bytes from `tx` to a stalled `rx`, posted in one verb (3,000
    /// are more than a ring holds); `close`: the sender's device closes right after. Every
    /// one must arrive.
    #[expect(clippy::disallowed_methods, reason = "a test waiting for another thread")]
    fn to_a_stalled_peer(rx_ip: &str, tx_ip: &str, n: u32, close: bool) {
        use uroce_engine::{AhAttr, QKey, RecvWr, SendWr, Sge, UdDest, WrOpcode};
        const LEN: u32 = 2000;
        let rx_ip: IpAddr = rx_ip.parse().unwrap();
        let rx = NetDevice::open(rx_ip, Options::default()).unwrap();
        let tx = NetDevice::open(tx_ip.parse().unwrap(), Options::default()).unwrap();
        let (rqp, rcq) = rx.with(|s| {
            let (qp, _, cq, mr, addr) = ud_qp(s, n, n as usize * 4096);
            for i in 0..n {
                let sge = Sge { addr: addr + u64::from(i) * 4096, length: 4096, lkey: mr.lkey };
                s.engine()
                    .post_recv(qp, RecvWr { wr_id: i.into(), sg_list: [sge].into() })
                    .unwrap();
            }
            (qp, cq)
        });
        // The receiver stops reading for a while (its device lock held), as a busy process
        // would, and the sender posts more than its ring holds.
        let rx = Arc::new(rx);
        let (held, hold) = std::sync::mpsc::channel();
        let stall = std::thread::spawn({
            let rx = Arc::clone(&rx);
            move || {
                rx.with(|_| {
                    held.send(()).unwrap();
                    std::thread::sleep(Duration::from_millis(300));
                });
            }
        });
        hold.recv().unwrap();
        tx.with(|s| {
            let (qp, pd, _, mr, addr) = ud_qp(s, 0, LEN as usize);
            let ah = s.engine().create_ah(pd, AhAttr::new(rx_ip)).unwrap();
            for i in 0..n {
                let sge = Sge { addr, length: LEN, lkey: mr.lkey };
                let mut wr = SendWr::new(i.into(), WrOpcode::Send, vec![sge]);
                wr.ud = Some(UdDest { ah, remote_qpn: rqp, remote_qkey: QKey(7) });
                s.engine().post_send(qp, wr).unwrap();
            }
        });
        let waiting = tx.with(|s| s.counters());
        if n > 1000 {
            assert!(waiting.shm_tx_packets < u64::from(n), "the ring filled: {waiting:?}");
        }
        if close {
            drop(tx);
        }
        stall.join().unwrap();
        let mut got = 0usize;
        let mut wcs = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while got < n as usize && std::time::Instant::now() < deadline {
            got += rx.with(|s| s.engine().poll_cq(rcq, 4096, &mut wcs));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(got, n as usize, "every datagram arrived");
    }

    #[test]
    fn a_channel_is_readable_while_an_event_waits_and_nobody_spins_for_it() -> io::Result<()> {
        let c = Channel::new_blocking()?;
        let options = Options { no_progress_thread: true, ..Options::default() };
        let dev = NetDevice::open("127.0.18.9".parse().map_err(io::Error::other)?, options)
            .map_err(io::Error::other)?;
        let cq = dev.with(|s| s.engine().create_cq(4)).map_err(io::Error::other)?;
        assert!(!readable(&c));
        c.push(cq);
        c.push(cq);
        assert!(readable(&c), "an epoll on the channel sees the event");
        assert_eq!(c.try_get(), Some(cq));
        assert!(readable(&c), "one is left");
        assert_eq!(c.try_get(), Some(cq));
        assert!(!readable(&c));
        // A thread spinning for an event takes it from the queue: no write to the eventfd.
        c.spinning(true);
        c.push(cq);
        assert!(!readable(&c) && c.has_event());
        // It stopped spinning with the event still there: the descriptor says so.
        c.spinning(false);
        assert!(readable(&c));
        assert_eq!(c.get(Some(Duration::from_millis(1)))?, Some(cq));
        assert!(!readable(&c));
        Ok(())
    }
}
