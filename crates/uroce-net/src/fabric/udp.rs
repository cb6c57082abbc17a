//! The kernel's UDP path: the device's port 4791 (shared by every process of the device
//! through `SO_REUSEPORT`), a fixed pool of send sockets, and multicast group sockets.
//!
//! A UDP socket sends from the one port it is bound to, and RoCEv2 wants a source port per
//! flow (IBA Annex A17.4.2.1: entropy for ECMP). A socket per flow would cost a descriptor
//! per QP, so a process with many QPs runs out and its QPs fail far from the cause. Instead
//! the device binds [`SEND_SOCKETS`] sockets when it opens, each on a port the kernel picks,
//! and each flow (the engine's per-QP source port) is sent from one of them: descriptors are
//! bounded whatever the number of QPs, a device that cannot get them fails to open, and the
//! flows still spread over that many ports.
//!
//! Unicast packets leave from a sibling of their send socket connected to their destination
//! (same address and port, through `SO_REUSEPORT`): the kernel then keeps the route with the
//! socket instead of looking it up for every datagram (on IPv4 loopback 0.37 µs of a 4.0 µs
//! UD SEND). At most [`CONNECTED_SOCKETS`] are kept; past that the least recently used is
//! closed for a newcomer once idle for [`EVICT_IDLE_AFTER`] sends, and until then the newcomer
//! leaves unconnected, as does a packet for which no socket can be opened (descriptors
//! exhausted). Over IPv4 a connected
//! socket numbers its datagrams' identification, which the ICRC covers, from a per-socket
//! counter that starts at a random value (Linux's `ip_select_ident_segs`), where an
//! unconnected one with `DF` set writes 0 (and 0…n−1 across a segmented send). The counter
//! cannot be read, so each connected IPv4 socket sends one empty probe to its unconnected
//! sibling when it opens and reads the identification from the kernel's copy of it
//! ([`sys::next_ipv4_id`]); from then on each packet is sealed for the identification it will
//! carry, and a socket whose count a refused send may have disturbed is closed. Receivers
//! that accept only an unconnected socket's identifications (`UROCE_ICRC_IP_ID=linux`) need
//! senders that stay unconnected: a device set so does.
//!
//! Packets of one QP to one destination leave in as few system calls as the kernel allows: a
//! run of equal-sized packets (the last may be shorter) is one segmented send (UDP GSO, up to
//! [`GSO_MAX_SEGMENTS`] packets), and a receiving socket asks for coalesced runs (UDP GRO), so
//! a 64 KiB message costs one send and one receive instead of sixteen of each. The kernel
//! numbers the segments of one send 0, 1, …, n−1 in the IPv4 identification, which the ICRC
//! covers: segment k is sealed for identification k here, and receivers recover it
//! ([`uroce_wire::icrc::IdRecovery`]). Where the kernel or the interface cannot segment, the
//! first refused send turns segmentation off and every packet goes alone.

use core::net::{IpAddr, SocketAddr};
use std::io;
use std::net::UdpSocket;
use std::os::fd::{AsRawFd, RawFd};

use uroce_engine::{Instant, RxInfo};
use uroce_wire::ROCE_V2_PORT;
use uroce_wire::icrc::PseudoCache;

use super::{Fabric, Outgoing, Sink};
use crate::device::NetCounters;
use crate::sys::memory::Registry;
use crate::sys::{self, Datagram, RecvBatch, SendBatch, SendStop};

const RECV_BATCH: usize = 32;

/// Most packets in one segmented send: Linux's `UDP_MAX_SEGMENTS` (64 from 4.18; 128 since 6.x,
/// where the receiver's [`uroce_wire::icrc::Ipv4IdPolicy::LinuxGso`] allows for it).
pub(crate) const GSO_MAX_SEGMENTS: usize = 64;

/// Most bytes in one segmented send: one UDP payload of an IP packet (65,535 less the IPv4
/// and UDP headers), with room to spare.
const GSO_MAX_BYTES: usize = 65_000;

/// Send sockets per device address and process: the flows its QPs spread over.
pub(crate) const SEND_SOCKETS: usize = 16;

/// Connected send sockets kept per device address and process (one per source port and
/// destination in use).
const CONNECTED_SOCKETS: usize = 32;

/// Sends from connected sockets after a failure to open one before the next try.
const CONNECT_RETRY_AFTER: u64 = 4096;

/// Sends from connected sockets since the least recently used was last sent from, at least,
/// before it is closed for another destination: a process sending to more destinations than
/// it keeps sockets for sends the rest unconnected instead of opening (and, over IPv4,
/// probing) a socket for nearly every datagram.
const EVICT_IDLE_AFTER: u64 = 4 * CONNECTED_SOCKETS as u64;

/// A send socket's sibling connected to one destination.
struct Connected {
    port: u16,
    dst: SocketAddr,
    sock: UdpSocket,
    /// When it was last sent from ([`Udp::uses`] then), for eviction.
    used: u64,
    /// IPv4: the identification its next datagram carries ([`sys::next_ipv4_id`]; one more
    /// per datagram sent, the segments of a segmented one counting up from theirs).
    next_id: Option<u16>,
}

/// Which kernel offloads a device's UDP path uses (`UROCE_GSO=0`, `UROCE_GRO=0` turn them off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offloads {
    pub(crate) gso: bool,
    pub(crate) gro: bool,
    /// IPv4 unicast leaves from connected sockets (the route kept with the socket), whose
    /// datagrams carry identifications from a per-socket counter: only when the device's
    /// receivers accept any identification, so that devices set alike understand each other.
    pub(crate) connected_ipv4: bool,
}

/// UDP sockets of one device address.
pub(crate) struct Udp {
    addr: IpAddr,
    main: UdpSocket,
    /// The send sockets, each with the port it is bound to ([`Udp::source_port`] maps a flow
    /// to one of them).
    send_socks: Vec<(u16, UdpSocket)>,
    /// Connected siblings of the send sockets, at most [`CONNECTED_SOCKETS`].
    connected: Vec<Connected>,
    /// Sends from connected sockets so far: the clock of their eviction.
    uses: u64,
    /// When a connected socket last could not be opened (no descriptor left, say): none is
    /// tried again for [`CONNECT_RETRY_AFTER`] sends.
    connect_failed_at: Option<u64>,
    /// Receive sockets of the multicast groups QPs are attached to.
    mcast_socks: Vec<(IpAddr, UdpSocket)>,
    recv: RecvBatch,
    /// Segmented sends are on (asked for, offered by the kernel, and not yet refused).
    gso: bool,
    /// The ICRC prefix of each flow (source port, destination), computed once.
    pseudo: PseudoCache,
    /// Reused between sends: packet lengths, and the runs planned.
    lens: Vec<usize>,
    runs: Vec<Run>,
    send: SendBatch,
    /// A datagram too large for its route was reported on standard error (once per device).
    told_too_big: bool,
    /// IPv4 unicast leaves from connected sockets ([`Offloads::connected_ipv4`]).
    connect_ipv4: bool,
}

/// Packets `first..first + count` of a batch, sent as one datagram, cut into `segment`-byte
/// datagrams by the kernel when `count` > 1.
#[derive(Debug, Clone, Copy)]
struct Run {
    first: usize,
    count: usize,
    segment: usize,
}

/// Whether packets to `dst` leave from a connected socket: unicast (a group is no one peer),
/// IPv4 only with `ipv4` (see the module's documentation).
fn connectable(dst: SocketAddr, ipv4: bool) -> bool {
    !dst.ip().is_multicast() && (dst.is_ipv6() || ipv4)
}

/// Cuts `run` (packets of one source port, their lengths in `lens`) into datagrams, in `runs`:
/// with segmentation on (`gso`), each is a stretch of packets to one destination, all of one
/// length but the last, which may be shorter (udp(7): every segment but the last is
/// `gso_size`); a packet marked [`Outgoing::alone`] is a datagram by itself.
fn plan(runs: &mut Vec<Run>, lens: &[usize], run: &[Outgoing], gso: bool) {
    runs.clear();
    let mut i = 0;
    while i < run.len() {
        let segment = lens[i];
        let most = if gso && !run[i].alone {
            GSO_MAX_SEGMENTS.min(GSO_MAX_BYTES / segment.max(1)).max(1)
        } else {
            1
        };
        let mut j = i + 1;
        while j < run.len()
            && j - i < most
            && run[j].dst == run[i].dst
            && !run[j].alone
            && lens[j] <= segment
        {
            j += 1;
            if lens[j - 1] < segment {
                break;
            }
        }
        runs.push(Run { first: i, count: j - i, segment });
        i = j;
    }
}

impl Udp {
    /// Binds the device's RoCEv2 port on `addr`, shared with the device's other processes.
    pub(crate) fn bind(addr: IpAddr, offloads: Offloads) -> io::Result<Self> {
        let main = sys::udp_socket(SocketAddr::new(addr, ROCE_V2_PORT), false, true)?;
        let gro = offloads.gro && sys::enable_gro(&main).is_ok();
        let gso = offloads.gso && sys::gso_supported(&main);
        let len = if gro { sys::MAX_GRO_DATAGRAM } else { sys::MAX_DATAGRAM };
        let mut send_socks = Vec::with_capacity(SEND_SOCKETS);
        for _ in 0..SEND_SOCKETS {
            // Shared, so that connected siblings can bind the same port.
            let s = sys::udp_socket(SocketAddr::new(addr, 0), false, true)?;
            sys::set_multicast_if(&s, addr)?;
            send_socks.push((s.local_addr()?.port(), s));
        }
        Ok(Self {
            addr,
            main,
            send_socks,
            connected: Vec::new(),
            uses: 0,
            connect_failed_at: None,
            mcast_socks: Vec::new(),
            recv: RecvBatch::new(RECV_BATCH, len),
            gso,
            pseudo: PseudoCache::new(4096),
            lens: Vec::new(),
            runs: Vec::new(),
            send: SendBatch::default(),
            told_too_big: false,
            connect_ipv4: offloads.connected_ipv4,
        })
    }

    /// The MTU of the address's interface.
    pub(crate) fn interface_mtu(&self) -> Option<u32> {
        sys::interface_mtu(&self.main, self.addr)
    }

    /// Says once, on standard error, why datagrams of `len` bytes to `dst` are lost: the
    /// kernel refuses them as larger than the route carries, so the QP sending them can only
    /// end in retry exhaustion. A NIC's link drops such frames without a word; this names the
    /// cause and the fix.
    fn tell_too_big(&mut self, len: usize, dst: SocketAddr) {
        if core::mem::replace(&mut self.told_too_big, true) {
            return;
        }
        let port = self.interface_mtu().map_or_else(
            || "the port's active MTU (ibv_query_port)".to_string(),
            |m| {
                format!(
                    "{} bytes, the port's active MTU for this {m}-byte interface",
                    crate::device::port_mtu_for(m).bytes()
                )
            },
        );
        eprintln!(
            "uroce: {}: the kernel refuses {len}-byte datagrams to {dst} as larger than the \
             route carries (EMSGSIZE): a QP's path MTU exceeds the interface's, and its packets \
             are lost; connect it with a path MTU of at most {port}",
            self.addr
        );
    }

    /// Sends `datagrams` to this device's own port, from a send socket ([`super::steer`]'s
    /// probes).
    pub(crate) fn send_to_own_port(
        &self,
        datagrams: &[[u8; uroce_wire::steer_probe::LEN]],
    ) -> io::Result<()> {
        let (_, sock) = self.send_socks.first().ok_or(io::ErrorKind::NotConnected)?;
        let to = SocketAddr::new(self.addr, ROCE_V2_PORT);
        for d in datagrams {
            sock.send_to(d, to)?;
        }
        Ok(())
    }

    /// Gives the port's `SO_REUSEPORT` group `program` ([`super::steer`]).
    pub(crate) fn steer(&self, program: &[libc::sock_filter]) -> io::Result<()> {
        sys::attach_reuseport_program(&self.main, program)
    }

    /// The source port flow `flow` (the engine's per-QP port) is sent from: one of the send
    /// sockets' ports. Consecutive QPNs have consecutive flows, so QPs spread evenly.
    pub(crate) fn source_port(&self, flow: u16) -> u16 {
        self.send_socks.get(usize::from(flow) % SEND_SOCKETS.max(1)).map_or(flow, |s| s.0)
    }

    /// The socket of `socks` (the send sockets) bound to `port`.
    fn send_sock(socks: &[(u16, UdpSocket)], port: u16) -> Option<&UdpSocket> {
        socks.iter().find(|s| s.0 == port).map(|s| &s.1)
    }

    /// The connected sibling of send socket `port` for `dst`, opened if need be (evicting the
    /// least recently used past [`CONNECTED_SOCKETS`]); `None` for a destination that is not
    /// [`connectable`], or when none can be opened (or, for IPv4, its identification learnt).
    fn connected_for(&mut self, port: u16, dst: SocketAddr, c: &mut NetCounters) -> Option<usize> {
        if !connectable(dst, self.connect_ipv4) {
            return None;
        }
        self.uses += 1;
        if let Some(i) = self.connected.iter().position(|k| k.port == port && k.dst == dst) {
            self.connected[i].used = self.uses;
            return Some(i);
        }
        if self.connect_failed_at.is_some_and(|at| self.uses - at < CONNECT_RETRY_AFTER) {
            return None;
        }
        let oldest = self.connected.iter().enumerate().min_by_key(|(_, k)| k.used);
        let evict = match oldest {
            _ if self.connected.len() < CONNECTED_SOCKETS => None,
            Some((i, k)) if self.uses - k.used >= EVICT_IDLE_AFTER => Some(i),
            _ => return None,
        };
        let src = SocketAddr::new(self.addr, port);
        let open = || -> io::Result<(UdpSocket, Option<u16>)> {
            let s = sys::udp_socket(src, false, true)?;
            s.connect(dst)?;
            let SocketAddr::V4(probe_to) = src else { return Ok((s, None)) };
            // The probe goes to the unconnected send socket of the same port, which reads
            // nothing: it is emptied here.
            let next_id = sys::next_ipv4_id(&s, probe_to);
            if let Some(sibling) = Self::send_sock(&self.send_socks, port) {
                while sibling.recv(&mut [0u8; 16]).is_ok() {}
            }
            Ok((s, Some(next_id?)))
        };
        let Ok((sock, next_id)) = open() else {
            c.tx_connect_failed += 1;
            self.connect_failed_at = Some(self.uses);
            return None;
        };
        c.tx_sockets_connected += 1;
        let k = Connected { port, dst, sock, used: self.uses, next_id };
        let Some(i) = evict else {
            self.connected.push(k);
            return Some(self.connected.len() - 1);
        };
        self.connected[i] = k;
        Some(i)
    }

    /// Sends `run` (packets from source port `port`); returns how many the kernel took.
    fn send_run(
        &mut self,
        port: u16,
        run: &mut [Outgoing],
        mem: &Registry,
        c: &mut NetCounters,
    ) -> usize {
        let mut done = 0;
        // A connected IPv4 socket that failed is closed and the rest planned again, once.
        let mut replanned = false;
        'plan: loop {
            let rest = &mut run[done..];
            self.lens.clear();
            self.lens.extend(rest.iter().map(|o| o.parts(mem).map(<[u8]>::len).sum::<usize>()));
            plan(&mut self.runs, &self.lens, rest, self.gso);
            let src = SocketAddr::new(self.addr, port);
            let ipv4 = self.connect_ipv4;
            // The runs to one destination a socket can be connected to leave together, from
            // that socket; a stretch of runs to others, in one call from the unconnected one.
            let mut first_run = 0;
            while first_run < self.runs.len() {
                let dst = rest[self.runs[first_run].first].dst;
                let runs_to_dst = self.runs[first_run..]
                    .iter()
                    .position(|r| {
                        let to = rest[r.first].dst;
                        if connectable(dst, ipv4) { to != dst } else { connectable(to, ipv4) }
                    })
                    .unwrap_or(self.runs.len() - first_run);
                let connected = self.connected_for(port, dst, c);
                let group = &self.runs[first_run..first_run + runs_to_dst];
                // Each packet sealed for the identification it will carry (the ICRC covers
                // it): from a connected IPv4 socket datagram i of the group gets the socket's
                // next plus i; from an unconnected one (`DF` set) a datagram sent alone gets 0.
                // The segments of a segmented datagram count up from its identification.
                let first_id = connected.and_then(|i| self.connected[i].next_id);
                for (i, r) in group.iter().enumerate() {
                    let run = &mut rest[r.first..r.first + r.count];
                    // One destination per run (`plan`), so one pseudo-header.
                    let Some(Ok(pseudo)) = run.first().map(|o| self.pseudo.get(src, o.dst)) else {
                        continue;
                    };
                    // Identifications wrap, as the kernel's do.
                    #[expect(clippy::cast_possible_truncation, reason = "modulo 2¹⁶")]
                    let id = first_id.map_or(0, |f| f.wrapping_add(i as u16));
                    for (k, o) in run.iter_mut().enumerate() {
                        let k = if r.count > 1 { u16::try_from(k).unwrap_or(0) } else { 0 };
                        o.seal(mem, &pseudo, id.wrapping_add(k));
                    }
                }
                let rest = &*rest;
                let sock = match connected {
                    Some(i) => &self.connected[i].sock,
                    None => match Self::send_sock(&self.send_socks, port) {
                        Some(s) => s,
                        None => return done,
                    },
                };
                let datagrams = || {
                    group.iter().map(|r| Datagram {
                        dst: connected.is_none().then(|| rest[r.first].dst),
                        parts: rest[r.first..r.first + r.count].iter().flat_map(|o| o.parts(mem)),
                        segment: (r.count > 1)
                            .then(|| u16::try_from(r.segment).unwrap_or(u16::MAX)),
                    })
                };
                let (mut sent, mut stop) = self.send.send(sock, datagrams());
                // A connected socket reports an ICMP error that came back for an earlier
                // datagram (the peer's port closed for a moment, say) on its next send, which
                // then does not go (nor take an identification: the kernel returns the error
                // before it builds the packet): once reported, the error is cleared.
                if connected.is_some()
                    && sent == 0
                    && stop.as_ref().is_some_and(SendStop::is_icmp_report)
                {
                    c.tx_icmp_errors += 1;
                    (sent, stop) = self.send.send(sock, datagrams());
                }
                c.tx_batches += 1;
                for r in &group[..sent] {
                    c.tx_datagrams += r.count as u64;
                    if r.count > 1 {
                        c.tx_gso_sends += 1;
                        c.tx_gso_segments += r.count as u64;
                    }
                }
                done += group[..sent].iter().map(|r| r.count).sum::<usize>();
                if let Some(i) = connected
                    && let Some(next) = &mut self.connected[i].next_id
                {
                    #[expect(clippy::cast_possible_truncation, reason = "modulo 2¹⁶")]
                    let sent = sent as u16;
                    *next = next.wrapping_add(sent);
                }
                if sent == group.len() {
                    first_run += runs_to_dst;
                    continue;
                }
                let stopped_at = group[sent];
                if let Some(SendStop::Refused(e)) = &stop
                    && e.raw_os_error() == Some(libc::EMSGSIZE)
                {
                    c.tx_too_big += stopped_at.count as u64;
                    let len = if stopped_at.count > 1 {
                        stopped_at.segment
                    } else {
                        self.lens[stopped_at.first]
                    };
                    self.tell_too_big(len, rest[stopped_at.first].dst);
                }
                let refused_segmented = stopped_at.count > 1
                    && matches!(&stop, Some(SendStop::Refused(e))
                        if matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL | libc::EOPNOTSUPP)));
                // A refusal may come after the kernel numbered the datagram (a segmented send
                // it cannot segment, `EINVAL`/`EIO` from `udp_send_skb`): a connected IPv4
                // socket's count is then unknown, and the socket is closed. A full buffer, a
                // datagram too large for the route and a reported ICMP error are refused
                // before the packet is built (`sock_alloc_send_pskb`, `__ip_append_data`).
                let numbered = match &stop {
                    Some(e @ SendStop::Refused(r)) => {
                        r.raw_os_error() != Some(libc::EMSGSIZE) && !e.is_icmp_report()
                    }
                    _ => false,
                };
                let uncounted =
                    connected.filter(|&i| numbered && self.connected[i].next_id.is_some());
                if let Some(i) = uncounted {
                    self.connected.swap_remove(i);
                    c.tx_sockets_closed += 1;
                }
                if refused_segmented {
                    // This path cannot segment: from now on every packet goes alone.
                    self.gso = false;
                    c.tx_gso_refused += 1;
                    continue 'plan;
                }
                if uncounted.is_some() && !core::mem::replace(&mut replanned, true) {
                    continue 'plan;
                }
                return done;
            }
            return done;
        }
    }

    /// Receives what waits on `sock`, bound to `addr`: every datagram's destination (the
    /// kernel is asked for it only on a socket bound to no address, `sys::udp_socket`).
    fn drain(
        recv: &mut RecvBatch,
        sock: &UdpSocket,
        addr: IpAddr,
        c: &mut NetCounters,
        sink: &mut Sink<'_>,
    ) -> usize {
        let mut total = 0;
        for _ in 0..16 {
            let Ok(n) = recv.recv(sock) else { break };
            if n == 0 {
                break;
            }
            c.rx_batches += 1;
            for i in 0..n {
                let meta = recv.meta[i];
                let rx = RxInfo {
                    src: meta.src,
                    dst: meta.dst.unwrap_or(addr),
                    tclass: meta.tclass,
                    hop_limit: meta.hop_limit,
                    flow_label: 0,
                };
                let payload = recv.payload(i);
                // A coalesced run (UDP GRO) is cut where the sender's datagrams ended; an
                // empty datagram (cut short by the kernel) still goes on, to be counted.
                let mut packets = 0;
                if meta.segment == 0 || payload.is_empty() {
                    sink(&rx, payload, false);
                    packets = 1;
                } else {
                    for p in payload.chunks(usize::from(meta.segment)) {
                        sink(&rx, p, false);
                        packets += 1;
                    }
                }
                if meta.segment != 0 {
                    c.rx_gro_datagrams += 1;
                    c.rx_gro_segments += packets as u64;
                }
                c.rx_datagrams += packets as u64;
                total += packets;
            }
            if n < RECV_BATCH {
                break;
            }
        }
        total
    }
}

impl Fabric for Udp {
    /// Per run of one source port: one `sendmmsg` of as few datagrams as segmentation allows,
    /// each gathered from the packets' headers, their payload in registered memory and their
    /// trailers (no copy in user space).
    fn transmit(&mut self, out: &mut Vec<Outgoing>, mem: &Registry, c: &mut NetCounters) {
        let mut start = 0;
        while start < out.len() {
            let port = out[start].port;
            let end =
                out[start..].iter().position(|o| o.port != port).map_or(out.len(), |k| start + k);
            let sent = self.send_run(port, &mut out[start..end], mem, c);
            for o in out[start..start + sent].iter().filter(|o| o.payload_at.is_some()) {
                c.tx_zero_copy += 1;
                c.tx_zero_copy_bytes += o.zero_copy_bytes();
            }
            c.tx_errors += (end - start - sent) as u64;
            start = end;
        }
    }

    fn receive(&mut self, _now: Instant, c: &mut NetCounters, sink: &mut Sink<'_>) -> usize {
        let mut n = Self::drain(&mut self.recv, &self.main, self.addr, c, sink);
        for (group, sock) in &self.mcast_socks {
            n += Self::drain(&mut self.recv, sock, *group, c, sink);
        }
        n
    }

    fn source_port(&self, flow: u16) -> u16 {
        Self::source_port(self, flow)
    }

    fn wait_fds(&self, fds: &mut Vec<RawFd>) {
        fds.push(self.main.as_raw_fd());
        fds.extend(self.mcast_socks.iter().map(|(_, s)| s.as_raw_fd()));
    }

    fn sync_multicast(&mut self, groups: &[IpAddr]) -> io::Result<()> {
        self.mcast_socks.retain(|(g, _)| groups.contains(g));
        for &g in groups {
            if !self.mcast_socks.iter().any(|(m, _)| *m == g) {
                let s = sys::udp_socket(SocketAddr::new(g, ROCE_V2_PORT), true, false)?;
                sys::join_multicast(&s, g, self.addr)?;
                self.mcast_socks.push((g, s));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(dst: &str, len: usize, alone: bool) -> Outgoing {
        Outgoing { dst: dst.parse().unwrap(), bytes: vec![0; len], alone, ..Outgoing::empty() }
    }

    /// The datagrams `packets` leave in, as (first, count).
    fn planned(packets: &[Outgoing], gso: bool) -> Vec<(usize, usize)> {
        let lens: Vec<usize> = packets.iter().map(|p| p.bytes.len()).collect();
        let mut runs = Vec::new();
        plan(&mut runs, &lens, packets, gso);
        runs.iter().map(|r| (r.first, r.count)).collect()
    }

    #[test]
    fn segments_runs_of_one_destination_and_length_but_never_a_packet_sent_alone() {
        let (a, b) = ("192.0.2.1:4791", "192.0.2.2:4791");
        // Equal lengths to one destination: one send; a shorter packet ends it; a new
        // destination starts another.
        let p = [packet(a, 60, false), packet(a, 60, false), packet(a, 20, false)];
        assert_eq!(planned(&p, true), [(0, 3)]);
        let p = [packet(a, 20, false), packet(a, 20, false), packet(b, 20, false)];
        assert_eq!(planned(&p, true), [(0, 2), (2, 1)]);
        // A last ACK and its two copies (a QP's farewell): three datagrams, so that whatever
        // drops one of them need not drop the others.
        let p = [packet(a, 20, false), packet(a, 20, true), packet(a, 20, true)];
        assert_eq!(planned(&p, true), [(0, 1), (1, 1), (2, 1)]);
        let p = [packet(a, 20, true), packet(a, 20, false), packet(a, 20, false)];
        assert_eq!(planned(&p, true), [(0, 1), (1, 2)]);
        // Without segmentation every packet goes alone anyway.
        let p = [packet(a, 20, false), packet(a, 20, false)];
        assert_eq!(planned(&p, false), [(0, 1), (1, 1)]);
    }

    /// A bound socket on `ip` to receive on, and its address.
    fn receiver(ip: &str) -> (UdpSocket, SocketAddr) {
        let s = UdpSocket::bind((ip, 0)).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let a = s.local_addr().unwrap();
        (s, a)
    }

    /// Sends one 64-byte packet of flow 0 to `dst`.
    fn send_to(udp: &mut Udp, dst: SocketAddr, c: &mut NetCounters) {
        let mut out =
            vec![Outgoing { port: udp.source_port(0), ..packet(&dst.to_string(), 64, false) }];
        udp.transmit(&mut out, &Registry::default(), c);
    }

    /// Where the next datagram `s` receives came from.
    fn received_from(s: &UdpSocket) -> SocketAddr {
        let mut buf = [0u8; 128];
        s.recv_from(&mut buf).unwrap().1
    }

    /// A device on `addr` (its port 4791 shared, as every device's, so it takes none from
    /// another), without GRO; with GSO and connected IPv4 sockets as asked.
    fn device(addr: &str, gso: bool, connected_ipv4: bool) -> Udp {
        Udp::bind(addr.parse().unwrap(), Offloads { gso, gro: false, connected_ipv4 }).unwrap()
    }

    /// A device on IPv6 loopback (nothing here sends to it).
    fn ipv6_device() -> Udp {
        device("::1", false, true)
    }

    #[test]
    fn ipv6_unicast_leaves_from_a_connected_sibling_of_its_send_socket_and_port() {
        let mut udp = ipv6_device();
        let mut c = NetCounters::default();
        let flow_port = udp.source_port(0);
        let (rx, dst) = receiver("::1");
        for _ in 0..3 {
            send_to(&mut udp, dst, &mut c);
            // The flow's port: the receiver's ICRC check covers it.
            assert_eq!(received_from(&rx), SocketAddr::new("::1".parse().unwrap(), flow_port));
        }
        assert_eq!((c.tx_sockets_connected, c.tx_datagrams, c.tx_errors), (1, 3, 0));
        // One per destination while there is room; past it, sockets sent from lately are
        // kept and a newcomer leaves unconnected. Every packet still arrives.
        let others: Vec<_> = (0..CONNECTED_SOCKETS + 8).map(|_| receiver("::1")).collect();
        for (s, a) in &others {
            send_to(&mut udp, *a, &mut c);
            assert_eq!(received_from(s).port(), flow_port);
        }
        assert_eq!(udp.connected.len(), CONNECTED_SOCKETS);
        assert_eq!(c.tx_sockets_connected, CONNECTED_SOCKETS as u64);
        // The least recently used, once idle long enough, is closed for a newcomer.
        let (busy, to) = &others[1];
        for _ in 0..EVICT_IDLE_AFTER {
            send_to(&mut udp, *to, &mut c);
            received_from(busy);
        }
        let (last, at) = &others[CONNECTED_SOCKETS + 7];
        send_to(&mut udp, *at, &mut c);
        assert_eq!(received_from(last).port(), flow_port);
        assert_eq!(c.tx_sockets_connected, CONNECTED_SOCKETS as u64 + 1);
        assert!(udp.connected.iter().any(|k| k.dst == *at));
        assert_eq!(c.tx_errors, 0);
    }

    /// IPv4 unicast leaves from a connected sibling too, each packet sealed for the
    /// identification the kernel gives it: the socket's counter (learnt from a probe that the
    /// unconnected sibling receives and that is taken from it), one more per datagram, the
    /// segments of a segmented one counting up from theirs. That the wire carries these is
    /// what the capture tests check (`crates/uroce-cli/tests/gso.rs`: `uroce decode` verifies
    /// every captured ICRC against its captured header).
    #[test]
    fn ipv4_unicast_leaves_from_a_connected_socket_sealed_for_its_counter() {
        let mut udp = device("127.0.61.2", true, true);
        let mut c = NetCounters::default();
        let (rx, dst) = receiver("127.0.61.3");
        let port = udp.source_port(0);
        let mut sealed = Vec::new();
        for n in [1, 1, 1, 3, 1] {
            let mut out: Vec<Outgoing> =
                (0..n).map(|_| Outgoing { port, ..packet(&dst.to_string(), 64, false) }).collect();
            udp.transmit(&mut out, &Registry::default(), &mut c);
            sealed.extend(out.iter().map(|o| o.ip_id));
        }
        let first = sealed[0];
        let want: Vec<u16> = [0, 1, 2, 3, 4, 5, 4].iter().map(|&k| first.wrapping_add(k)).collect();
        assert_eq!(sealed, want);
        assert_eq!((c.tx_sockets_connected, c.tx_gso_sends, c.tx_errors), (1, 1, 0));
        for _ in 0..7 {
            assert_eq!(received_from(&rx).port(), port);
        }
        let sibling = Udp::send_sock(&udp.send_socks, port).unwrap();
        assert!(sibling.recv(&mut [0u8; 16]).is_err(), "the probe was left waiting");
    }

    /// Receivers set to accept only what an unconnected socket sends: IPv4 leaves unconnected,
    /// sealed for 0.
    #[test]
    fn ipv4_stays_unconnected_where_receivers_check_strictly() {
        let mut udp = device("127.0.61.2", false, false);
        let mut c = NetCounters::default();
        let (rx, dst) = receiver("127.0.61.3");
        send_to(&mut udp, dst, &mut c);
        assert_eq!(received_from(&rx).port(), udp.source_port(0));
        assert_eq!((c.tx_sockets_connected, c.tx_datagrams, c.tx_batches), (0, 1, 1));
        // Packets of one port to several destinations still leave in one system call.
        let (rx2, dst2) = receiver("127.0.61.6");
        let port = udp.source_port(0);
        let mut out: Vec<Outgoing> = [dst, dst2, dst]
            .iter()
            .map(|d| Outgoing { port, ..packet(&d.to_string(), 64, false) })
            .collect();
        udp.transmit(&mut out, &Registry::default(), &mut c);
        assert_eq!((c.tx_datagrams, c.tx_batches, c.tx_errors), (4, 2, 0));
        for from in [received_from(&rx), received_from(&rx2), received_from(&rx)] {
            assert_eq!(from.port(), port);
        }
    }

    #[test]
    fn an_icmp_error_a_connected_socket_reports_does_not_lose_the_next_datagram() {
        let mut udp = ipv6_device();
        let mut c = NetCounters::default();
        // A port nobody has bound yet: the kernel answers port unreachable (loopback's ICMPv6
        // is not rate limited), which the connected socket reports on its next send.
        let (rx, dst) = receiver("::1");
        drop(rx);
        send_to(&mut udp, dst, &mut c);
        let rx = UdpSocket::bind(dst).unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        send_to(&mut udp, dst, &mut c);
        assert_eq!(received_from(&rx).port(), udp.source_port(0));
        assert_eq!((c.tx_icmp_errors, c.tx_errors), (1, 0));
    }

    /// The device's socket is bound to its address, so the kernel need not say where each
    /// datagram went (the message cost a sixth of the receive): the fabric hands every one on
    /// with the device's address as its destination.
    #[test]
    fn the_device_socket_takes_its_destination_from_its_address_not_a_message() {
        let addr: IpAddr = "127.0.61.9".parse().unwrap();
        let mut udp = device("127.0.61.9", false, true);
        let tx = UdpSocket::bind("127.0.61.10:0").unwrap();
        tx.send_to(&[1; 40], SocketAddr::new(addr, ROCE_V2_PORT)).unwrap();
        sys::poll_readable_ns(&[udp.main.as_raw_fd()], Some(5_000_000_000)).unwrap();
        let mut seen = Vec::new();
        let mut c = NetCounters::default();
        udp.receive(Instant::ZERO, &mut c, &mut |rx: &RxInfo, bytes: &[u8], _| {
            seen.push((rx.src, rx.dst, bytes.len()));
        });
        assert_eq!(seen, [(tx.local_addr().unwrap(), addr, 40)]);
        assert_eq!(udp.recv.meta[0].dst, None, "the kernel was asked for the destination");
    }
}
