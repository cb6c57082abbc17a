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

/// Which kernel offloads a device's UDP path uses (`UROCE_GSO=0`, `UROCE_GRO=0` turn them off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offloads {
    pub(crate) gso: bool,
    pub(crate) gro: bool,
}

/// UDP sockets of one device address.
pub(crate) struct Udp {
    addr: IpAddr,
    main: UdpSocket,
    /// The send sockets, each with the port it is bound to ([`Udp::source_port`] maps a flow
    /// to one of them).
    send_socks: Vec<(u16, UdpSocket)>,
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
}

/// Packets `first..first + count` of a batch, sent as one datagram, cut into `segment`-byte
/// datagrams by the kernel when `count` > 1.
#[derive(Debug, Clone, Copy)]
struct Run {
    first: usize,
    count: usize,
    segment: usize,
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
            let s = sys::udp_socket(SocketAddr::new(addr, 0), false, false)?;
            sys::set_multicast_if(&s, addr)?;
            send_socks.push((s.local_addr()?.port(), s));
        }
        Ok(Self {
            addr,
            main,
            send_socks,
            mcast_socks: Vec::new(),
            recv: RecvBatch::new(RECV_BATCH, len),
            gso,
            pseudo: PseudoCache::new(4096),
            lens: Vec::new(),
            runs: Vec::new(),
            send: SendBatch::default(),
            told_too_big: false,
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

    /// The source port flow `flow` (the engine's per-QP port) is sent from: one of the send
    /// sockets' ports. Consecutive QPNs have consecutive flows, so QPs spread evenly.
    pub(crate) fn source_port(&self, flow: u16) -> u16 {
        self.send_socks.get(usize::from(flow) % SEND_SOCKETS.max(1)).map_or(flow, |s| s.0)
    }

    /// The socket of `socks` (the send sockets) bound to `port`.
    fn send_sock(socks: &[(u16, UdpSocket)], port: u16) -> Option<&UdpSocket> {
        socks.iter().find(|s| s.0 == port).map(|s| &s.1)
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
        loop {
            let rest = &mut run[done..];
            self.lens.clear();
            self.lens.extend(rest.iter().map(|o| o.parts(mem).map(<[u8]>::len).sum::<usize>()));
            plan(&mut self.runs, &self.lens, rest, self.gso);
            let src = SocketAddr::new(self.addr, port);
            for r in &self.runs {
                let run = &mut rest[r.first..r.first + r.count];
                // One destination per run (`plan`), so one pseudo-header.
                let Some(Ok(pseudo)) = run.first().map(|o| self.pseudo.get(src, o.dst)) else {
                    continue;
                };
                for (k, o) in run.iter_mut().enumerate() {
                    let id = if r.count > 1 { u16::try_from(k).unwrap_or(0) } else { 0 };
                    o.seal(mem, &pseudo, id);
                }
            }
            let Some(sock) = Self::send_sock(&self.send_socks, port) else {
                return done;
            };
            let rest = &*rest;
            let datagrams = self.runs.iter().map(|r| Datagram {
                dst: rest[r.first].dst,
                parts: rest[r.first..r.first + r.count].iter().flat_map(|o| o.parts(mem)),
                segment: (r.count > 1).then(|| u16::try_from(r.segment).unwrap_or(u16::MAX)),
            });
            let (sent, stop) = self.send.send(sock, datagrams);
            c.tx_batches += 1;
            for r in &self.runs[..sent] {
                c.tx_datagrams += r.count as u64;
                if r.count > 1 {
                    c.tx_gso_sends += 1;
                    c.tx_gso_segments += r.count as u64;
                }
            }
            let taken: usize = self.runs[..sent].iter().map(|r| r.count).sum();
            if let (Some(SendStop::Refused(e)), Some(r)) = (&stop, self.runs.get(sent))
                && e.raw_os_error() == Some(libc::EMSGSIZE)
            {
                c.tx_too_big += r.count as u64;
                let len = if r.count > 1 { r.segment } else { self.lens[r.first] };
                self.tell_too_big(len, rest[r.first].dst);
            }
            let refused_segmented = matches!(
                (&stop, self.runs.get(sent)),
                (Some(SendStop::Refused(e)), Some(r))
                    if r.count > 1 && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL | libc::EOPNOTSUPP))
            );
            done += taken;
            if refused_segmented {
                // This path cannot segment: from now on every packet goes alone.
                self.gso = false;
                c.tx_gso_refused += 1;
                continue;
            }
            return done;
        }
    }

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
        for (_, sock) in &self.mcast_socks {
            n += Self::drain(&mut self.recv, sock, self.addr, c, sink);
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
}
