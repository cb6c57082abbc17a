//! The fabric of a host-wide device: shared memory to the device's (and the host's) other
//! local endpoints, UDP to everything else.
//!
//! A packet goes through shared memory when its destination address is a local device and its
//! destination QPN belongs to a live endpoint there (the QPN's slot, see [`crate::host`]);
//! otherwise through the kernel's UDP path. `UROCE_FABRIC=udp` sends everything through UDP.
//!
//! **A full ring pauses, it does not drop.** Like a RoCE fabric with priority flow control
//! (IEEE 802.1Qbb), the local path is lossless: a packet that finds its ring full waits in a
//! bounded backlog, and the packets behind it to the same endpoint wait with it, in order; the
//! backlog is retried with a back-off from 20 µs to 1 ms, and what waits for an endpoint whose
//! process is gone is let go. An RC packet keeps its payload in registered memory, read when
//! it goes (its work request completes only once the packet is acknowledged; a region
//! deregistered meanwhile loses the packet, and RC sends it again); a UC or UD packet, whose
//! work request has completed already, is copied out first, as the verbs let the application
//! reuse the buffer then. Only past [`BACKLOG`] packets (2,048 for one endpoint) is one
//! dropped (`shm_tx_ring_full`). A
//! READ response of 16 MiB is 4,096 packets sent at once: dropping what a 2 MiB ring cannot
//! hold would turn every large READ into retries.
//!
//! The device's port is shared (`SO_REUSEPORT`), so the kernel hands a datagram from the wire
//! to any one of the device's processes: the owner of its destination QPN once the group has a
//! steering program ([`super::steer`]), where the flow's hash says before. The one that
//! receives a datagram for a QPN it does not own forwards it, unchanged, into the owner's ring
//! (`udp_rx_forwarded`): routing by destination QPN, as a NIC demultiplexes.

use core::net::{IpAddr, SocketAddr};
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;

use uroce_engine::{Duration, Instant, RxInfo};
use uroce_wire::ROCE_V2_PORT;
use uroce_wire::steer_probe::Probe;

use super::Path;
use super::shm::{Full, Shm};
use super::steer::Steering;
use super::udp::Udp;
use super::{Fabric, Outgoing, Sink};
use crate::device::NetCounters;
use crate::host::SlotId;
use crate::sys::memory::Registry;

/// UDP plus, where a host directory could be opened, shared memory.
pub(crate) struct HostFabric {
    addr: IpAddr,
    udp: Udp,
    shm: Option<Shm>,
    /// `UROCE_FABRIC=udp`: send every packet through UDP (received ones for another local
    /// endpoint are still handed over in shared memory: that is the device's own routing).
    udp_only: bool,
    udp_out: Vec<Outgoing>,
    done: Vec<Outgoing>,
    /// Packets waiting for room in a ring, in order: destination slot, length, packet (its
    /// payload still in registered memory).
    backlog: VecDeque<(SlotId, usize, Outgoing)>,
    backlog_spare: VecDeque<(SlotId, usize, Outgoing)>,
    /// Packets in the backlog, by destination slot.
    queued: [u32; 256],
    /// How soon to try the backlog again.
    retry: Duration,
    /// Scratch: the local endpoint each packet of a batch goes to, if any.
    routes: Vec<Option<SlotId>>,
    /// When the sockets were last read, and whether that read found datagrams.
    udp_polled: Instant,
    udp_hot: bool,
    /// When the sockets last delivered a datagram to this endpoint (not one forwarded).
    udp_delivered_at: Option<Instant>,
    /// Until when shared memory counts as busy (it delivered a packet recently).
    shm_busy_until: Instant,
    /// The progress thread woke from a sleep on the sockets: read them.
    woke: bool,
    /// Steering of the port's datagrams to the endpoint owning their QPN (with a host
    /// directory only: without one, no other process shares the port).
    steering: Option<Steering>,
}

/// While shared memory carries traffic, the sockets (a system call each, almost always empty
/// then) are read at most this often, unless the last read found datagrams.
const UDP_POLL_INTERVAL: Duration = Duration::from_micros(20);
/// How long shared memory counts as busy after it delivered a packet.
const SHM_BUSY: Duration = Duration::from_micros(200);
/// After this long with no datagram for the endpoint from its sockets, its traffic counts as
/// local only ([`Fabric::peers_wake_a_stopped_poller`]).
const UDP_QUIET: Duration = Duration::from_millis(10);

/// Packets the backlog holds before it drops, in all and for one endpoint.
pub(crate) const BACKLOG: usize = 16_384;
const BACKLOG_PER_ENDPOINT: u32 = 2048;
/// How soon a backlog is tried again: at first, and at most (doubling while nothing moves).
const RETRY_FIRST: Duration = Duration::from_micros(20);
const RETRY_MAX: Duration = Duration::from_millis(1);

impl HostFabric {
    pub(crate) fn new(addr: IpAddr, udp: Udp, shm: Option<Shm>, udp_only: bool) -> Self {
        let (udp_out, done, backlog) = (Vec::new(), Vec::new(), VecDeque::new());
        let zero = Instant::from_nanos(0);
        let steering = shm.as_ref().map(|s| Steering::new(s.me(), addr));
        Self {
            addr,
            udp,
            shm,
            udp_only,
            udp_out,
            done,
            backlog,
            backlog_spare: VecDeque::new(),
            queued: [0; 256],
            retry: RETRY_FIRST,
            routes: Vec::new(),
            udp_polled: zero,
            udp_hot: true,
            udp_delivered_at: None,
            shm_busy_until: zero,
            woke: true,
            steering,
        }
    }

    /// Sends what waits in the backlog, oldest first, while the rings take it.
    fn drain_backlog(&mut self, mem: &Registry, c: &mut NetCounters) {
        let Some(shm) = self.shm.as_mut() else { return };
        if self.backlog.is_empty() {
            return;
        }
        let mut blocked = [false; 256];
        let mut moved = false;
        let mut kept = core::mem::take(&mut self.backlog_spare);
        while let Some((slot, len, o)) = self.backlog.pop_front() {
            let i = usize::from(slot.index);
            if blocked[i] {
                kept.push_back((slot, len, o));
                continue;
            }
            // The payload is read where it lies, now: a region deregistered meanwhile no
            // longer resolves, and the packet is lost (RC sends it again).
            if o.parts(mem).map(<[u8]>::len).sum::<usize>() != len {
                c.shm_tx_payload_gone += 1;
                self.queued[i] -= 1;
                self.done.push(o);
                continue;
            }
            let src = SocketAddr::new(self.addr, o.port);
            match shm.push_outgoing(slot, src, &o, mem, c) {
                Err(Full::Ring) => {
                    blocked[i] = true;
                    kept.push_back((slot, len, o));
                }
                gone_or_sent => {
                    moved |= gone_or_sent.is_ok();
                    self.queued[i] -= 1;
                    self.done.push(o);
                }
            }
        }
        self.backlog_spare = core::mem::replace(&mut self.backlog, kept);
        if moved {
            self.retry = RETRY_FIRST;
            return;
        }
        // Nothing moved: back off, and once at the longest wait, let go of what waits for an
        // endpoint whose process is gone (killed: it will never read its ring).
        if self.retry < RETRY_MAX {
            self.retry =
                Duration::from_nanos((self.retry.as_nanos() * 2).min(RETRY_MAX.as_nanos()));
            return;
        }
        let Some(shm) = self.shm.as_ref() else { return };
        let dead: Vec<u8> =
            (0..=u8::MAX).filter(|&k| blocked[usize::from(k)] && !shm.endpoint_alive(k)).collect();
        if dead.is_empty() {
            return;
        }
        let (queued, done) = (&mut self.queued, &mut self.done);
        self.backlog.retain_mut(|(slot, _, o)| {
            if !dead.contains(&slot.index) {
                return true;
            }
            queued[usize::from(slot.index)] -= 1;
            c.shm_tx_no_endpoint += 1;
            done.push(core::mem::replace(o, Outgoing::empty()));
            false
        });
    }
}

/// Whether `o` is a CM message (QP1) for this very address: the one packet `UROCE_FABRIC=udp`
/// still hands to another local process through its ring. Sent as a datagram to our own
/// address it lands in any of the address's sockets (they share the port), this process's own
/// too, which forwards it only at its next receive: never, if the process exits first. An
/// `rdma_disconnect` just before exit then lost its DREQ, and the peer waited for
/// `RDMA_CM_EVENT_DISCONNECTED` for ever (a process's kernel sends it for a dead process; here
/// none can). Data still goes through UDP: a lost data packet is resent by its sender, a MAD of
/// a sender that is gone by nobody.
fn cm_to_own(o: &Outgoing, own: IpAddr) -> bool {
    o.dst.ip() == own && super::dest_qpn(&o.bytes) == Some(uroce_wire::mad::GSI_QPN)
}

impl Fabric for HostFabric {
    fn transmit(&mut self, out: &mut Vec<Outgoing>, mem: &Registry, c: &mut NetCounters) {
        // Without rings, or through the kernel only (`UROCE_FABRIC=udp`) with nothing for a
        // ring (a MAD to this address's QP1, in another process of the device; one waiting
        // for a full ring): the sockets take the batch as it is.
        let own = self.addr;
        if self.shm.is_none()
            || (self.udp_only && self.backlog.is_empty() && !out.iter().any(|o| cm_to_own(o, own)))
        {
            self.udp.transmit(out, mem, c);
            return;
        }
        self.drain_backlog(mem, c);
        let Some(shm) = self.shm.as_mut() else { return };
        // Every packet's route first, while the headers the engine just wrote are in cache
        // (copying payloads into rings evicts them).
        let (own, udp_only) = (self.addr, self.udp_only);
        self.routes.clear();
        self.routes.extend(out.iter().map(|o| {
            let may_be_local = o.dst.port() == ROCE_V2_PORT && (!udp_only || cm_to_own(o, own));
            may_be_local.then(|| shm.owner_of_packet(o.dst.ip(), &o.bytes)).flatten()
        }));
        if udp_only {
            c.udp_gsi_handed_over += self.routes.iter().flatten().count() as u64;
        }
        for (mut o, local) in out.drain(..).zip(self.routes.drain(..)) {
            let Some(slot) = local else {
                self.udp_out.push(o);
                continue;
            };
            let i = usize::from(slot.index);
            let src = SocketAddr::new(self.addr, o.port);
            // Behind packets already waiting for this endpoint, in order.
            let full =
                self.queued[i] > 0 || shm.push_outgoing(slot, src, &o, mem, c) == Err(Full::Ring);
            if !full {
                self.done.push(o);
            } else if self.backlog.len() < BACKLOG && self.queued[i] < BACKLOG_PER_ENDPOINT {
                // IBA 9.2: the opcode's top three bits name the transport (0: RC). A UC or UD
                // send has completed: the application may reuse its buffer now.
                if o.bytes.first().is_some_and(|op| op >> 5 != 0) {
                    o.materialize(mem);
                }
                let len = o.parts(mem).map(<[u8]>::len).sum();
                self.queued[i] += 1;
                self.backlog.push_back((slot, len, o));
            } else {
                c.shm_tx_ring_full += 1;
                self.done.push(o);
            }
        }
        shm.commit(c);
        self.udp.transmit(&mut self.udp_out, mem, c);
        out.append(&mut self.udp_out);
        out.append(&mut self.done);
    }

    fn receive(&mut self, now: Instant, c: &mut NetCounters, sink: &mut Sink<'_>) -> usize {
        let Some(shm) = self.shm.as_mut() else { return self.udp.receive(now, c, sink) };
        let mut n = shm.receive(c, sink);
        if n > 0 {
            self.shm_busy_until = now + SHM_BUSY;
        }
        let due = self.udp_hot
            || core::mem::take(&mut self.woke)
            || now >= self.shm_busy_until
            || now >= self.udp_polled + UDP_POLL_INTERVAL;
        if !due {
            c.udp_polls_skipped += 1;
            return n;
        }
        self.udp_polled = now;
        // What the datagrams do to the counters, while `c` is lent to the sockets' read: made
        // only when one arrives (an idle poll zeroed and added some sixty counters for nothing).
        let mut side: Option<NetCounters> = None;
        let mut delivered = false;
        let steering = &mut self.steering;
        let mut misdelivered = false;
        let from_udp = self.udp.receive(now, c, &mut |rx: &RxInfo, bytes: &[u8], intact| {
            if let Some(probe) = Probe::parse(bytes) {
                if let Some(s) = steering.as_mut() {
                    s.heard(rx.src.ip(), probe);
                }
                side.get_or_insert_with(NetCounters::default).udp_steer_probes_heard += 1;
                return;
            }
            if let Some(slot) = shm.owner_of_packet(rx.dst, bytes) {
                // From the wire, with its ICRC: the owner checks it.
                let side = side.get_or_insert_with(NetCounters::default);
                if shm.push(slot, rx, core::iter::once(bytes), bytes.len(), true, side) {
                    side.udp_rx_forwarded += 1;
                }
                // Steering should have sent it to its owner if the owner has published its
                // place (an owner that has not — it has not probed yet, or it is a uroce
                // without steering — is left to the hash, and asking would not help).
                misdelivered |= super::dest_qpn(bytes) != Some(uroce_wire::mad::GSI_QPN)
                    && shm.dir().steer_index(slot.index).load(Ordering::Relaxed) != 0;
                return;
            }
            shm.received_through_udp(rx.src.ip());
            delivered = true;
            sink(rx, bytes, intact);
        });
        if delivered {
            self.udp_delivered_at = Some(now);
        }
        self.udp_hot = from_udp > 0;
        n += from_udp;
        match side {
            Some(mut side) => {
                shm.commit(&mut side);
                *c += side;
            }
            None => shm.commit(c),
        }
        if let Some(s) = self.steering.as_mut() {
            if misdelivered {
                s.misdelivered(now, shm.dir());
            }
            if s.due(now) {
                s.tick(now, shm.dir(), &self.udp, c);
            }
        }
        n
    }

    fn wait_fds(&self, fds: &mut Vec<RawFd>) {
        self.udp.wait_fds(fds);
        if let Some(shm) = &self.shm {
            fds.push(shm.wake_fd());
        }
    }

    fn prepare_sleep(&mut self, beside_poller: bool) -> bool {
        self.shm.as_mut().is_none_or(|shm| shm.prepare_sleep(beside_poller))
    }

    fn backlog_retry(&self) -> Option<Duration> {
        (!self.backlog.is_empty()).then_some(self.retry)
    }

    fn own_deadline(&self) -> Option<Instant> {
        self.steering.as_ref().and_then(Steering::round_ends)
    }

    fn unread(&self) -> u64 {
        self.shm.as_ref().map_or(0, Shm::unread)
    }

    fn woken(&mut self) {
        self.woke = true;
        if let Some(shm) = &mut self.shm {
            shm.woken();
        }
    }

    fn path_to(&self, ip: IpAddr, qpn: u32) -> Path {
        match &self.shm {
            Some(shm) if !self.udp_only && shm.owner_of(ip, qpn).is_some() => Path::Shm,
            _ => Path::Udp,
        }
    }

    fn peers_wake_a_stopped_poller(&self, now: Instant) -> bool {
        self.shm.is_some()
            && !self.udp_only
            && self.udp_delivered_at.is_none_or(|at| now >= at + UDP_QUIET)
    }

    fn publish_cpu(&self, cpu: u32) {
        if let Some(shm) = &self.shm {
            shm.publish_cpu(cpu);
        }
    }

    fn peer_seen(&self) -> Option<super::PeerSeen> {
        self.shm.as_ref().and_then(Shm::peer_seen)
    }

    fn source_port(&self, flow: u16) -> u16 {
        self.udp.source_port(flow)
    }

    fn sync_multicast(&mut self, groups: &[IpAddr]) -> io::Result<()> {
        self.udp.sync_multicast(groups)
    }
}
