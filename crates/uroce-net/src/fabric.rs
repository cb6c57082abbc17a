//! How datagrams move: the seam between the runtime (engine lock, clock, progress, channels,
//! events) and the paths packets take.
//!
//! A [`Fabric`] takes the packets the engine built and hands received ones to the engine. Two
//! carry packets — [`udp::Udp`], the kernel's UDP path (between hosts), and [`shm::Shm`], rings
//! in shared memory (between processes of one host) — and [`host::HostFabric`] joins them for a
//! host-wide device. Three wrap any fabric: [`capture::Capture`] (`UROCE_PCAP`),
//! [`faulty::Faulty`] (`UROCE_FAULTS`) and [`tap::Tap`] (`uroce capture`, from outside).
//! Every path carries whole RoCEv2 packets (BTH to ICRC), so a capture reads the same
//! whichever path a packet took.

pub(crate) mod capture;
pub(crate) mod faulty;
pub(crate) mod host;
pub(crate) mod shm;
pub(crate) mod steer;
pub(crate) mod tap;
pub(crate) mod udp;

use core::net::{IpAddr, SocketAddr};
use std::io;
use std::os::fd::RawFd;

use uroce_engine::device::Piece;
use uroce_engine::{Duration, Instant, MemoryAccess, RxInfo};
use uroce_wire::icrc::{self, PseudoHeader};

use crate::device::NetCounters;
use crate::sys::memory::Registry;

/// A packet ready to go: its source port, destination and bytes — all of them, or (when
/// `payload_at` is set) the headers and trailer around payload pieces of registered memory.
pub(crate) struct Outgoing {
    pub(crate) port: u16,
    pub(crate) dst: SocketAddr,
    pub(crate) bytes: Vec<u8>,
    pub(crate) payload_at: Option<usize>,
    pub(crate) pieces: Vec<Piece>,
    /// The ICRC field is still zero ([`uroce_engine::Transmit::icrc_deferred`]).
    pub(crate) icrc_deferred: bool,
    /// The IPv4 identification the ICRC was computed for, once computed (0 from the engine; k
    /// for segment k of a GSO send).
    pub(crate) ip_id: u16,
    /// Never segmented with its neighbours ([`uroce_engine::Transmit::alone`]).
    pub(crate) alone: bool,
}

impl Outgoing {
    /// A packet with nothing in it (a placeholder for one taken out of a queue).
    pub(crate) fn empty() -> Self {
        let dst = SocketAddr::new(IpAddr::V4(core::net::Ipv4Addr::UNSPECIFIED), 0);
        Self {
            port: 0,
            dst,
            bytes: Vec::new(),
            payload_at: None,
            pieces: Vec::new(),
            icrc_deferred: false,
            ip_id: 0,
            alone: false,
        }
    }

    /// Computes the ICRC the engine left zero (IBA Annex A17.3.3), for a path that needs it:
    /// a capture, a fault that corrupts. `src` is the sending address and port.
    pub(crate) fn fill_icrc(&mut self, mem: &Registry, src: SocketAddr) {
        if !self.icrc_deferred {
            return;
        }
        if let Ok(pseudo) = PseudoHeader::for_endpoints(src, self.dst) {
            self.seal(mem, &pseudo, 0);
        }
    }

    /// Makes the ICRC right for the headers `pseudo` gives with IPv4 identification `ip_id`
    /// (the wire: segment k of a GSO send carries k; a connected socket's counter), computing
    /// it only if it is not already. One computed for another identification is moved to
    /// `ip_id` ([`PseudoHeader::ipv4_id_moved`]) without reading the packet again: cheaper, and
    /// a packet corrupted on purpose since (`Faults`) stays corrupt — hashed again, it went out
    /// with a valid ICRC, and its receiver took the corruption for data.
    pub(crate) fn seal(&mut self, mem: &Registry, pseudo: &PseudoHeader, ip_id: u16) {
        if (!self.icrc_deferred && self.ip_id == ip_id) || self.bytes.len() < ICRC_LEN {
            return;
        }
        if !self.icrc_deferred {
            let end = self.bytes.len() - ICRC_LEN;
            let pieces = if self.payload_at.is_some() { &self.pieces[..] } else { &[] };
            let hashed = end + pieces.iter().map(|&(_, l)| l as usize).sum::<usize>();
            if let Ok(icrc) = icrc::carried(&self.bytes) {
                let moved = pseudo.ipv4_id_moved(icrc, hashed, self.ip_id, ip_id);
                self.bytes[end..].copy_from_slice(&icrc::to_wire(moved));
            }
            self.ip_id = ip_id;
            return;
        }
        self.icrc_deferred = false;
        self.ip_id = ip_id;
        let pseudo = pseudo.with_ipv4_id(ip_id);
        let end = self.bytes.len() - ICRC_LEN;
        let h = self.payload_at.unwrap_or(end).min(end);
        let pieces = if self.payload_at.is_some() { &self.pieces[..] } else { &[] };
        let parts = core::iter::once(&self.bytes[..h])
            .chain(pieces.iter().filter_map(|&(a, l)| mem.slice(a, l as usize)))
            .chain(core::iter::once(&self.bytes[h..end]));
        if let Ok(crc) = icrc::compute_iter(&pseudo, parts) {
            self.bytes[end..].copy_from_slice(&icrc::to_wire(crc));
        }
    }

    /// The whole packet in `bytes` (for capture and fault injection, which need it in one
    /// piece): copies the payload in from registered memory.
    pub(crate) fn materialize(&mut self, mem: &Registry) {
        let Some(h) = self.payload_at.take() else { return };
        let trailer = self.bytes.split_off(h);
        for &(addr, len) in &self.pieces {
            let at = self.bytes.len();
            self.bytes.resize(at + len as usize, 0);
            // Memory unmapped since the engine checked it goes out as zeros (the receiver's
            // ICRC check, computed over what was there, then drops the packet).
            let _ = mem.read(addr, &mut self.bytes[at..]);
        }
        self.bytes.extend_from_slice(&trailer);
        self.pieces.clear();
    }

    /// The packet's parts: headers, the payload where it lies in registered memory, trailer.
    pub(crate) fn parts<'a>(&'a self, mem: &'a Registry) -> impl Iterator<Item = &'a [u8]> + Clone {
        let (head, tail) = match self.payload_at {
            None => (&self.bytes[..], &[][..]),
            Some(h) => self.bytes.split_at(h),
        };
        let pieces = self.payload_at.map_or(&[][..], |_| &self.pieces[..]);
        core::iter::once(head)
            .chain(pieces.iter().filter_map(|&(a, l)| mem.slice(a, l as usize)))
            .chain(core::iter::once(tail).filter(|t| !t.is_empty()))
    }

    /// Whether the packet is an ACK, NAK or RNR NAK (RC or XRC ACKNOWLEDGE, IBA 9.7.5.1):
    /// a response that carries no data, whose late arrival a requester drops as stale. A READ
    /// response or atomic ACK arriving after a later response of its QP is a lost response to
    /// the requester (IBA 9.7.5.1.5: it goes back for it).
    pub(crate) fn is_acknowledge(&self) -> bool {
        use uroce_wire::opcode::Opcode;
        let opcode = self.bytes.first().copied();
        opcode == Some(Opcode::RC_ACKNOWLEDGE.0) || opcode == Some(Opcode::XRC_ACKNOWLEDGE.0)
    }

    /// The destination QPN and PSN of a plain ACK (an RC or XRC ACKNOWLEDGE whose AETH
    /// syndrome says ACK, IBA 9.7.5.1), not one sent alone on purpose: what a later ACK of
    /// the same QP makes redundant. `None` for every other packet, NAKs included.
    pub(crate) fn plain_ack(&self) -> Option<(u32, uroce_wire::Psn)> {
        let b = &self.bytes;
        // AETH (after the 12-byte BTH): syndrome bits 7:5 are 000 for an ACK.
        if !self.is_acknowledge() || self.alone || b.get(12)? >> 5 != 0 {
            return None;
        }
        let psn = u32::from_be_bytes([0, *b.get(9)?, *b.get(10)?, *b.get(11)?]);
        Some((dest_qpn(b)?, uroce_wire::Psn::new(psn)?))
    }

    /// The packet's length if every piece of its payload is still in registered memory (the
    /// most [`Outgoing::parts`] can come to), without looking the pieces up.
    pub(crate) fn len_bound(&self) -> usize {
        self.bytes.len() + usize::try_from(self.zero_copy_bytes()).unwrap_or(usize::MAX)
    }

    /// The payload bytes sent from registered memory.
    pub(crate) fn zero_copy_bytes(&self) -> u64 {
        self.payload_at.map_or(0, |_| self.pieces.iter().map(|&(_, l)| u64::from(l)).sum())
    }
}

/// The destination QPN of a RoCEv2 packet (BTH bytes 5..8, IBA 9.2), if it has a BTH.
pub(crate) fn dest_qpn(packet: &[u8]) -> Option<u32> {
    let b = packet.get(5..8)?;
    Some(u32::from_be_bytes([0, b[0], b[1], b[2]]))
}

/// The path a packet takes to its destination QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// The kernel's UDP sockets (another host; any endpoint with `UROCE_FABRIC=udp`).
    Udp,
    /// A shared-memory ring to a local endpoint.
    Shm,
}

impl Path {
    /// The name `uroce qp` shows.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Udp => "udp",
            Self::Shm => "shm",
        }
    }
}

/// Where the engine's received packets go: the datagram's addressing, its bytes, and whether
/// its path guarantees its integrity (`true`: shared memory, whose sender may have left the
/// ICRC zero; the engine then skips that check, and a capture computes it).
pub(crate) type Sink<'a> = dyn FnMut(&RxInfo, &[u8], bool) + 'a;

/// The ICRC field's length.
const ICRC_LEN: usize = 4;

/// `bytes` with its ICRC computed (for a packet that crossed an intact path with it zero).
pub(crate) fn with_icrc(rx: &RxInfo, bytes: &[u8]) -> Vec<u8> {
    let mut copy = bytes.to_vec();
    seal(rx.src, SocketAddr::new(rx.dst, uroce_wire::ROCE_V2_PORT), &mut copy);
    copy
}

/// Computes the ICRC of `packet`, sent from `src` to `dst`, into its last four bytes (IBA
/// Annex A17.3.3).
pub(crate) fn seal(src: SocketAddr, dst: SocketAddr, packet: &mut [u8]) {
    if let (Ok(pseudo), Some(end)) =
        (PseudoHeader::for_endpoints(src, dst), packet.len().checked_sub(ICRC_LEN))
        && let Ok(crc) = icrc::compute(&pseudo, &packet[..end])
    {
        packet[end..].copy_from_slice(&icrc::to_wire(crc));
    }
}

/// Where a local peer's application thread was last seen ([`Fabric::peer_seen`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerSeen {
    /// The CPU it last polled or waited on.
    pub(crate) cpu: u32,
    /// Whether this endpoint, not the peer, is the one to move when the two keep sharing a
    /// CPU: the one in the higher slot (both deciding at once would move both, together).
    pub(crate) moves: bool,
}

/// A way packets move. Implementations count what they do in [`NetCounters`]; a packet they
/// cannot deliver is lost, as on a wire, and counted.
pub(crate) trait Fabric: Send {
    /// Sends `out` (emptied: what is left in it afterwards is recycled by the caller).
    fn transmit(&mut self, out: &mut Vec<Outgoing>, mem: &Registry, c: &mut NetCounters);

    /// Hands what has arrived to `sink`, a bounded amount at a time (a flood cannot keep the
    /// caller here for ever). Returns how many packets it handed over.
    fn receive(&mut self, now: Instant, c: &mut NetCounters, sink: &mut Sink<'_>) -> usize;

    /// The descriptors a sleeping progress thread waits on.
    fn wait_fds(&self, fds: &mut Vec<RawFd>);

    /// Called before the progress thread sleeps on [`Fabric::wait_fds`] — or, `beside_poller`,
    /// while an application thread busy-polls, on the wake-up through which local senders
    /// reach it once that thread has stopped ([`shm::BusyMark`]): `false` if packets are
    /// already waiting (sleeping now could miss them).
    fn prepare_sleep(&mut self, _beside_poller: bool) -> bool {
        true
    }

    /// Called when the progress thread wakes from that sleep.
    fn woken(&mut self) {}

    /// When packets wait for room on a path: how soon to try again (the progress thread then
    /// comes back to send them, instead of sleeping until something arrives).
    fn backlog_retry(&self) -> Option<Duration> {
        None
    }

    /// When the fabric has work of its own to finish (a steering probe round to end,
    /// [`steer`]): the progress thread comes back then, asleep or not.
    fn own_deadline(&self) -> Option<Instant> {
        None
    }

    /// Bytes handed to local peers that they have not read yet (a closing device waits for
    /// them: once it is gone, a peer that never opened its ring could not find them).
    fn unread(&self) -> u64 {
        0
    }

    /// Receives the traffic of exactly these multicast groups.
    fn sync_multicast(&mut self, groups: &[IpAddr]) -> io::Result<()>;

    /// The path packets to QP `qpn` at `ip` take now (for `uroce qp`, and the hold rule of
    /// [`crate::device::NetDevice::with`]).
    fn path_to(&self, _ip: IpAddr, _qpn: u32) -> Path {
        Path::Udp
    }

    /// Whether everything that reached this endpoint lately came from local peers, which wake
    /// its progress thread themselves once its application thread stops polling (they see the
    /// poller's stamp lapse, [`shm::BusyMark`]): a poll that ends its busy-poll mark then need
    /// not wake the thread. A datagram through the kernel's sockets, whose sender cannot see
    /// the stamp, would wait for the thread's next look-in instead.
    fn peers_wake_a_stopped_poller(&self, _now: Instant) -> bool {
        false
    }

    /// Tells local peers that this endpoint's application thread polls on `cpu`.
    fn publish_cpu(&self, _cpu: u32) {}

    /// Where the application thread of the local peer that sent last polled or waited last,
    /// when the fabric knows (over shared memory; through UDP when one local endpoint alone
    /// holds the sender's address).
    fn peer_seen(&self) -> Option<PeerSeen> {
        None
    }

    /// The UDP source port a packet of flow `flow` (the engine's per-QP port) leaves from:
    /// the fabric may send a flow from a port of its own, and everything that sees the packet
    /// (its ICRC, a capture) must see that port.
    fn source_port(&self, flow: u16) -> u16 {
        flow
    }
}

/// The [`Fabric`] methods a wrapper (capture, faults) hands to the fabric it wraps unchanged.
macro_rules! delegate_to_inner {
    () => {
        fn wait_fds(&self, fds: &mut Vec<std::os::fd::RawFd>) {
            self.inner.wait_fds(fds);
        }

        fn prepare_sleep(&mut self, beside_poller: bool) -> bool {
            self.inner.prepare_sleep(beside_poller)
        }

        fn woken(&mut self) {
            self.inner.woken();
        }

        fn backlog_retry(&self) -> Option<uroce_engine::Duration> {
            self.inner.backlog_retry()
        }

        fn own_deadline(&self) -> Option<uroce_engine::Instant> {
            self.inner.own_deadline()
        }

        fn unread(&self) -> u64 {
            self.inner.unread()
        }

        fn sync_multicast(&mut self, groups: &[core::net::IpAddr]) -> std::io::Result<()> {
            self.inner.sync_multicast(groups)
        }

        fn path_to(&self, ip: core::net::IpAddr, qpn: u32) -> crate::fabric::Path {
            self.inner.path_to(ip, qpn)
        }

        fn peers_wake_a_stopped_poller(&self, now: uroce_engine::Instant) -> bool {
            self.inner.peers_wake_a_stopped_poller(now)
        }

        fn publish_cpu(&self, cpu: u32) {
            self.inner.publish_cpu(cpu);
        }

        fn peer_seen(&self) -> Option<$crate::fabric::PeerSeen> {
            self.inner.peer_seen()
        }

        fn source_port(&self, flow: u16) -> u16 {
            self.inner.source_port(flow)
        }
    };
}
pub(crate) use delegate_to_inner;

impl<F: Fabric + ?Sized> Fabric for Box<F> {
    fn transmit(&mut self, out: &mut Vec<Outgoing>, mem: &Registry, c: &mut NetCounters) {
        (**self).transmit(out, mem, c);
    }

    fn receive(&mut self, now: Instant, c: &mut NetCounters, sink: &mut Sink<'_>) -> usize {
        (**self).receive(now, c, sink)
    }

    fn wait_fds(&self, fds: &mut Vec<RawFd>) {
        (**self).wait_fds(fds);
    }

    fn prepare_sleep(&mut self, beside_poller: bool) -> bool {
        (**self).prepare_sleep(beside_poller)
    }

    fn woken(&mut self) {
        (**self).woken();
    }

    fn backlog_retry(&self) -> Option<Duration> {
        (**self).backlog_retry()
    }

    fn own_deadline(&self) -> Option<Instant> {
        (**self).own_deadline()
    }

    fn unread(&self) -> u64 {
        (**self).unread()
    }

    fn sync_multicast(&mut self, groups: &[IpAddr]) -> io::Result<()> {
        (**self).sync_multicast(groups)
    }

    fn path_to(&self, ip: IpAddr, qpn: u32) -> Path {
        (**self).path_to(ip, qpn)
    }

    fn peers_wake_a_stopped_poller(&self, now: Instant) -> bool {
        (**self).peers_wake_a_stopped_poller(now)
    }

    fn publish_cpu(&self, cpu: u32) {
        (**self).publish_cpu(cpu);
    }

    fn peer_seen(&self) -> Option<PeerSeen> {
        (**self).peer_seen()
    }

    fn source_port(&self, flow: u16) -> u16 {
        (**self).source_port(flow)
    }
}
