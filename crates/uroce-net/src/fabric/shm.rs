//! Shared-memory rings between the endpoints of one host: no system call on the data path
//! while both sides poll.
//!
//! Each ordered pair of endpoints (slots of the [`HostDir`]) that exchanges packets has one
//! single-producer single-consumer byte ring, a file `ring-S-G-T-H` of the host directory that
//! the sender creates and the receiver finds through the inbound bitmap of its slot. A record
//! is a 64-byte header (length, the datagram's addresses, TOS and TTL) and the whole RoCEv2
//! packet, padded to 64 bytes; the producer publishes a batch with one store of its tail (and
//! a long batch every [`PUBLISH_EVERY`] bytes on the way, so the consumer can start on it),
//! the consumer frees a batch with one store of its head.
//!
//! **Bounds.** A ring holds [`RING_BYTES`]. A packet that does not fit is dropped and counted
//! (`shm_tx_ring_full`), as a full switch queue drops: RC retransmits, UC and UD lose it.
//!
//! **Sleep.** A receiver about to sleep sets its slot's `waiting` flag and looks at its rings
//! once more; a producer that publishes checks the flag after its tail store and, if set,
//! clears it and writes a byte to the receiver's FIFO (`wake-T-H`), which the sleeping
//! progress thread polls. While the receiver polls, senders make no system call.
//!
//! **Sleep beside a poller.** While the receiver's application thread busy-polls, that thread
//! reads the rings, and its progress thread sleeps with `waiting` 2: a sender then wakes it
//! only if the poller's stamp (`busy_at`, [`BusyMark`]) is older than [`POLLER_GONE_NS`] —
//! the application has gone on to other work (an MPI rank reducing what it received) and a
//! request for it (a READ of its memory, an atomic) would otherwise wait for its next poll or
//! the progress thread's next look-in (1–5 ms). A request that lands just before the
//! poller stops is served by the progress thread's look-in, or sooner by its requester's
//! tail-loss probe, whose packet finds the stamp stale.
//!
//! **Trust.** A record is copied out of the ring before the engine sees it and every header
//! field is checked: another process of the same user can write anything into a ring it
//! can open, and at worst that is a forged packet, which the engine judges as it judges
//! packets from the wire (ICRC, QPN, PSN, keys).

use core::net::{IpAddr, SocketAddr};
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

use uroce_engine::RxInfo;

use super::{Outgoing, PeerSeen, Sink};
use crate::device::NetCounters;
use crate::host::{FIRST_SLOT, HostDir, LAST_SLOT, SLOTS, SlotId, mapped, open_shared, unmapped};
use crate::sys::memory::Registry;
use crate::sys::shm::{self, Mapping};

/// Bytes of records a ring holds (power of two).
pub(crate) const RING_BYTES: usize = 2 << 20;
const HEAD: usize = 0; // u64: consumer position (bytes, ever increasing)
const TAIL: usize = 64; // u64: producer position
const DATA: usize = 4096;
const FILE_BYTES: usize = DATA + RING_BYTES;

/// A record's header: length, kind, packet length, the datagram's source, TOS and TTL (its
/// destination is the receiving endpoint's own address). Small, so a 64-byte message's
/// record fills two cache lines, not three.
const RECORD_HEADER: usize = 32;
const KIND_PACKET: u32 = 1;
const KIND_PAD: u32 = 2;
/// A packet whose ICRC the sender left zero: memory between processes of one host does not
/// corrupt, so neither side spends a CRC over it (captures compute it).
const KIND_PACKET_NO_ICRC: u32 = 3;
/// The largest packet a record carries (a 4096-byte MTU packet with every header is 4,140).
const MAX_PACKET: usize = 9216;
/// While packets through UDP come from an address no single local endpoint holds, the
/// slots are searched for one again once in this many of those packets.
const PEER_LOOKUP_EVERY: u32 = 4096;
/// Records a receive takes from one ring before it moves on.
const RX_BUDGET: usize = 64;
/// A batch publishes its tail whenever this many of its bytes are unpublished, not only at its
/// end ([`Shm::commit`]): the receiver copies the first packets of a READ response out while
/// the sender still copies the last ones in. A batch is up to 64 packets (256 KiB), and a
/// 512 KiB READ waited for the first 256 KiB to be written before its reader could start.
const PUBLISH_EVERY: u64 = 16 << 10;

/// Why a packet could not be queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// The ring has no room now.
    Ring,
    /// The endpoint has left (or the packet is larger than any record).
    Gone,
}

struct OutRing {
    to: SlotId,
    map: Mapping,
    wake: Option<OwnedFd>,
    tail: u64,
    /// The consumer's head as last read (it only grows, so a stale value only underestimates
    /// the free space).
    head: u64,
    /// The tail as last published.
    published: u64,
    dirty: bool,
}

impl OutRing {
    /// Makes what was written up to the tail readable.
    fn publish(&mut self) {
        self.map.u64_at(TAIL).store(self.tail, Ordering::Release);
        self.published = self.tail;
    }
}

struct InRing {
    from: SlotId,
    map: Mapping,
    head: u64,
}

/// The shared-memory side of one endpoint.
pub(crate) struct Shm {
    dir: Arc<HostDir>,
    me: SlotId,
    /// The endpoint's device address: the destination of every packet it receives here.
    addr: IpAddr,
    wake: Arc<OwnedFd>,
    out: Vec<Option<OutRing>>,
    /// The slots `out` has rings to (a poll walks these, not all 256).
    out_active: Vec<u8>,
    inbound: Vec<Option<InRing>>,
    in_active: Vec<u8>,
    /// Rounds since the inbound rings were checked against the slots' generations.
    rounds: u32,
    /// Inbound rings not found when looked for, by sender slot: the generation looked for.
    missing: Vec<Option<u32>>,
    seen_epoch: u32,
    /// An inbound ring whose sender left still held records: look again next round.
    draining: bool,
    /// The endpoint whose packets were received last: the peer this one most likely waits
    /// for.
    last_sender: Option<SlotId>,
    /// A local endpoint's address that packets came from through UDP, and the endpoint that
    /// holds it when one alone does; looked up again when that one leaves, or every
    /// [`PEER_LOOKUP_EVERY`] asks while none is known.
    udp_peer: Option<(IpAddr, Option<SlotId>, u32)>,
    buf: Vec<u8>,
}

impl Shm {
    /// The shared-memory side of endpoint `me`; creates its wake-up FIFO.
    pub(crate) fn new(dir: Arc<HostDir>, me: SlotId, addr: IpAddr) -> io::Result<Self> {
        let path = dir.wake_path(me);
        shm::make_fifo(&path)?;
        let wake = Arc::new(shm::open_fifo(&path, true)?);
        Ok(Self {
            dir,
            me,
            addr,
            wake,
            out: (0..SLOTS).map(|_| None).collect(),
            out_active: Vec::new(),
            inbound: (0..SLOTS).map(|_| None).collect(),
            in_active: Vec::new(),
            rounds: 0,
            missing: vec![None; SLOTS],
            seen_epoch: u32::MAX,
            draining: false,
            last_sender: None,
            udp_peer: None,
            buf: vec![0; MAX_PACKET],
        })
    }

    /// The host directory this endpoint is in.
    pub(crate) fn dir(&self) -> &HostDir {
        &self.dir
    }

    /// This endpoint's slot.
    pub(crate) fn me(&self) -> SlotId {
        self.me
    }

    /// The live local endpoint that owns `qpn` at `ip`, if any (never this one): the slot
    /// in the QPN's top byte, in the generation that holds it now. A packet routed to it
    /// goes to that incarnation only, never to a successor that reuses the slot (and its
    /// QPNs).
    pub(crate) fn owner_of(&self, ip: IpAddr, qpn: u32) -> Option<SlotId> {
        let index = u8::try_from(qpn >> 16).ok()?;
        if index == self.me.index || index > LAST_SLOT {
            return None;
        }
        let (generation, addr) = self.dir.live(index)?;
        (addr == ip).then_some(SlotId { index, generation })
    }

    /// The live local endpoint a packet to `ip` belongs to, if it is not this one: by its
    /// destination QPN ([`Shm::owner_of`]), or, for a MAD to QP1 (which every endpoint of a
    /// device shares), by what the MAD names: a REQ or SIDR_REQ goes to the endpoint listening
    /// on its service ID ([`crate::ports`]); every other CM message to the endpoint whose CM
    /// allocated the receiver's comm ID (its top byte is the slot, [`uroce_cm::Config`]). A MAD
    /// nobody else claims stays here: this endpoint's CM answers it (a REJ when nobody
    /// listens).
    pub(crate) fn owner_of_packet(&self, ip: IpAddr, packet: &[u8]) -> Option<SlotId> {
        let qpn = super::dest_qpn(packet)?;
        if qpn != uroce_wire::mad::GSI_QPN {
            return self.owner_of(ip, qpn);
        }
        // BTH (12 bytes) and DETH (8) before the MAD.
        let mad = packet.get(20..20 + uroce_wire::mad::MAD_LEN)?;
        let m = uroce_wire::cm::CmMad::parse(mad).ok()?;
        // A listener whose process is gone takes no requests (they are rejected here).
        let live = |i: u8| self.dir.running_generation(i);
        let owner = match m.message {
            uroce_wire::cm::Message::Req(r) => self.dir.ports.listener(ip, r.service_id, &live),
            uroce_wire::cm::Message::SidrReq(r) => self.dir.ports.listener(ip, r.service_id, &live),
            other => {
                let index = uroce_cm::id_prefix_of(other.receiver_id()?);
                let (generation, addr) = self.dir.live(index)?;
                (addr == ip).then_some(SlotId { index, generation })
            }
        }?;
        (owner.index != self.me.index).then_some(owner)
    }

    /// The ring to endpoint `to`, opened (created) if need be; `None` if that incarnation is
    /// no longer live when a ring has to be opened.
    fn ring_to(&mut self, to: SlotId) -> Option<&mut OutRing> {
        let i = usize::from(to.index);
        let fresh = self.out[i].as_ref().is_some_and(|r| r.to == to);
        if !fresh {
            if self.dir.live(to.index).map(|(g, _)| g) != Some(to.generation) {
                return None;
            }
            self.out[i] = self.open_out(to).ok();
            self.out_active.retain(|&k| usize::from(k) != i);
            if self.out[i].is_some() {
                self.out_active.push(to.index);
            }
        }
        self.out[i].as_mut()
    }

    fn open_out(&self, to: SlotId) -> io::Result<OutRing> {
        let file = open_shared(&self.dir.ring_path(self.me, to), FILE_BYTES)?;
        let map = Mapping::new(&file, FILE_BYTES)?;
        let tail = map.u64_at(TAIL).load(Ordering::Acquire);
        let head = map.u64_at(HEAD).load(Ordering::Acquire);
        // Announce the ring: the bit names this sender, the epoch says "look again".
        let bit = usize::from(self.me.index);
        self.dir.inbound(to.index, bit / 64).fetch_or(1 << (bit % 64), Ordering::AcqRel);
        self.dir.rings_epoch(to.index).fetch_add(1, Ordering::AcqRel);
        let wake = shm::open_fifo(&self.dir.wake_path(to), false).ok();
        Ok(OutRing { to, map, wake, tail, head, published: tail, dirty: false })
    }

    /// Queues `packet` (with its datagram metadata) for the local endpoint `to`.
    pub(crate) fn push<'a>(
        &mut self,
        to: SlotId,
        rx: &RxInfo,
        parts: impl Iterator<Item = &'a [u8]>,
        len: usize,
        icrc: bool,
        c: &mut NetCounters,
    ) -> bool {
        match self.try_push(to, rx, parts, len, icrc) {
            Ok(()) => {
                c.shm_tx_packets += 1;
                true
            }
            Err(Full::Gone) => {
                c.shm_tx_no_endpoint += 1;
                false
            }
            Err(Full::Ring) => {
                c.shm_tx_ring_full += 1;
                false
            }
        }
    }

    /// As [`Shm::push`], saying why a packet did not go.
    pub(crate) fn try_push<'a>(
        &mut self,
        to: SlotId,
        rx: &RxInfo,
        parts: impl Iterator<Item = &'a [u8]>,
        len: usize,
        icrc: bool,
    ) -> Result<(), Full> {
        let Some(ring) = self.ring_to(to) else {
            return Err(Full::Gone);
        };
        if len > MAX_PACKET {
            return Err(Full::Gone);
        }
        let need = (RECORD_HEADER + len).next_multiple_of(64) as u64;
        let cap = RING_BYTES as u64;
        let at = ring.tail % cap;
        let pad = if at + need > cap { cap - at } else { 0 };
        if (ring.tail + pad + need).saturating_sub(ring.head) > cap {
            ring.head = ring.map.u64_at(HEAD).load(Ordering::Acquire);
            if (ring.tail + pad + need).saturating_sub(ring.head) > cap {
                return Err(Full::Ring);
            }
        }
        if pad > 0 {
            let mut h = [0u8; 8];
            h[..4].copy_from_slice(&u32::try_from(pad).unwrap_or(0).to_le_bytes());
            h[4..].copy_from_slice(&KIND_PAD.to_le_bytes());
            ring.map.write(DATA + usize::try_from(at).unwrap_or(0), &h);
            ring.tail += pad;
        }
        // The parts first, then the header with what they came to: `len` bounds them (a part
        // that could not be had is left out, as it is from a datagram), and the record is
        // published only by `commit`, so the reader never sees it half written.
        let base = DATA + usize::try_from(ring.tail % cap).unwrap_or(0);
        let mut written = 0;
        for p in parts {
            let room = len - written;
            let p = &p[..p.len().min(room)];
            ring.map.write(base + RECORD_HEADER + written, p);
            written += p.len();
        }
        let need = (RECORD_HEADER + written).next_multiple_of(64) as u64;
        ring.map.write(base, &record_header(need, rx, written, icrc));
        ring.tail += need;
        ring.dirty = true;
        if ring.tail - ring.published >= PUBLISH_EVERY {
            ring.publish();
        }
        Ok(())
    }

    /// Queues an engine packet for the local endpoint `to`. A packet for an endpoint that is
    /// gone is lost here and counted; one that finds the ring full is the caller's to keep.
    pub(crate) fn push_outgoing(
        &mut self,
        to: SlotId,
        src: SocketAddr,
        o: &Outgoing,
        mem: &Registry,
        c: &mut NetCounters,
    ) -> Result<(), Full> {
        let rx = RxInfo::new(src, o.dst.ip());
        // The registry is asked for the payload's pieces once: the length is the most they
        // can come to.
        let pushed = self.try_push(to, &rx, o.parts(mem), o.len_bound(), !o.icrc_deferred);
        if pushed == Err(Full::Gone) {
            c.shm_tx_no_endpoint += 1;
        }
        pushed?;
        c.shm_tx_packets += 1;
        if o.payload_at.is_some() {
            c.tx_zero_copy += 1;
            c.tx_zero_copy_bytes += o.zero_copy_bytes();
        }
        Ok(())
    }

    /// Publishes what was queued, and wakes the receivers that sleep.
    pub(crate) fn commit(&mut self, c: &mut NetCounters) {
        let out = &mut self.out;
        for &k in &self.out_active {
            let Some(ring) = out[usize::from(k)].as_mut().filter(|r| r.dirty) else { continue };
            ring.dirty = false;
            ring.publish();
            // Pairs with the receiver's fence between setting `waiting` and its last look.
            fence(Ordering::SeqCst);
            let waiting = self.dir.waiting(ring.to.index);
            let (wake, poller_stopped) = match waiting.load(Ordering::Relaxed) {
                NOT_WAITING => (false, false),
                SLEEPS_BESIDE_POLLER => {
                    let take_over = poller_gone(&self.dir, ring.to.index)
                        && waiting
                            .compare_exchange(
                                SLEEPS_BESIDE_POLLER,
                                NOT_WAITING,
                                Ordering::AcqRel,
                                Ordering::Relaxed,
                            )
                            .is_ok();
                    (take_over, take_over)
                }
                _ => (waiting.swap(NOT_WAITING, Ordering::AcqRel) != NOT_WAITING, false),
            };
            if wake {
                if ring.wake.is_none() {
                    ring.wake = shm::open_fifo(&self.dir.wake_path(ring.to), false).ok();
                }
                if let Some(fd) = &ring.wake {
                    shm::poke(fd.as_raw_fd());
                    c.shm_wakeups_sent += 1;
                    c.shm_wakeups_stopped_poller += u64::from(poller_stopped);
                }
            }
        }
    }

    /// Bytes published to local endpoints that still run and not read by them yet (a look
    /// at `/proc` for each ring that holds some: for a closing device, not the data path).
    pub(crate) fn unread(&self) -> u64 {
        let unread =
            |r: &OutRing| r.tail.saturating_sub(r.map.u64_at(HEAD).load(Ordering::Acquire));
        let reader_runs =
            |r: &OutRing| self.dir.running_generation(r.to.index) == Some(r.to.generation);
        let waiting = self.out.iter().flatten().filter(|r| unread(r) > 0 && reader_runs(r));
        waiting.map(unread).sum()
    }

    /// Whether the endpoint in slot `to` still runs.
    pub(crate) fn endpoint_alive(&self, to: u8) -> bool {
        self.dir.alive(to)
    }

    /// Refreshes the inbound rings from the bitmap: opens new senders' rings, forgets those
    /// of senders that left.
    fn refresh_inbound(&mut self) {
        let epoch = self.dir.rings_epoch(self.me.index).load(Ordering::Acquire);
        self.rounds = self.rounds.wrapping_add(1);
        // A new ring always bumps the epoch; a sender that left is noticed within 1,024
        // rounds (its ring stays readable meanwhile).
        if epoch == self.seen_epoch && !self.rounds.is_multiple_of(1024) && !self.draining {
            return;
        }
        self.draining = false;
        if epoch != self.seen_epoch {
            self.seen_epoch = epoch;
            self.missing.iter_mut().for_each(|m| *m = None);
        }
        for k in 0..4 {
            let bits = self.dir.inbound(self.me.index, k).load(Ordering::Acquire);
            let mut b = bits;
            while b != 0 {
                let bit = b.trailing_zeros() as usize;
                b &= b - 1;
                let s = k * 64 + bit;
                let Ok(index) = u8::try_from(s) else { continue };
                let live = self.dir.live(index).map(|(generation, _)| generation);
                if let Some(r) = &self.inbound[s]
                    && live != Some(r.from.generation)
                    && r.map.u64_at(TAIL).load(Ordering::Acquire) != r.head
                {
                    // Its sender left (or the slot has a new one) with records unread: they
                    // were sent (a UD send completed), so they are delivered first; its
                    // successor's ring, if any, is opened once this one is empty.
                    self.draining = true;
                    continue;
                }
                let Some(generation) = live else {
                    self.inbound[s] = None;
                    continue;
                };
                if self.inbound[s].as_ref().is_some_and(|r| r.from.generation == generation)
                    || self.missing[s] == Some(generation)
                {
                    continue;
                }
                let from = SlotId { index, generation };
                match self.open_in(from) {
                    Ok(r) => self.inbound[s] = Some(r),
                    Err(_) => {
                        self.inbound[s] = None;
                        self.missing[s] = Some(generation);
                    }
                }
            }
        }
        let inbound = &self.inbound;
        self.in_active = (0..=u8::MAX).filter(|&k| inbound[usize::from(k)].is_some()).collect();
    }

    fn open_in(&self, from: SlotId) -> io::Result<InRing> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.dir.ring_path(from, self.me))?;
        if file.metadata()?.len() < FILE_BYTES as u64 {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        let map = Mapping::new(&file, FILE_BYTES)?;
        let head = map.u64_at(HEAD).load(Ordering::Acquire);
        Ok(InRing { from, map, head })
    }

    /// Hands every record waiting in the inbound rings to `sink`, a bounded number per ring.
    pub(crate) fn receive(&mut self, c: &mut NetCounters, sink: &mut Sink<'_>) -> usize {
        self.refresh_inbound();
        let mut total = 0;
        let (buf, own) = (&mut self.buf, self.addr);
        let inbound = &mut self.inbound;
        for &k in &self.in_active {
            let Some(ring) = inbound[usize::from(k)].as_mut() else { continue };
            let tail = ring.map.u64_at(TAIL).load(Ordering::Acquire);
            let start = ring.head;
            let taken = drain(own, &ring.map, &mut ring.head, tail, buf, c, sink);
            // Only when it moved: the producer reads this line to see its free space, and a
            // store on every empty poll would pull it away from the producer each time.
            if ring.head != start {
                ring.map.u64_at(HEAD).store(ring.head, Ordering::Release);
            }
            if taken > 0 {
                self.last_sender = Some(ring.from);
            }
            total += taken;
        }
        total
    }

    /// Whether any inbound ring holds records (or a new one appeared).
    fn pending(&self) -> bool {
        if self.dir.rings_epoch(self.me.index).load(Ordering::Acquire) != self.seen_epoch {
            return true;
        }
        let inbound = &self.inbound;
        let active = self.in_active.iter().filter_map(|&k| inbound[usize::from(k)].as_ref());
        active.clone().any(|r| r.map.u64_at(TAIL).load(Ordering::Acquire) != r.head)
    }

    /// Records that this endpoint's application thread polls on `cpu`.
    pub(crate) fn publish_cpu(&self, cpu: u32) {
        let word = self.dir.waiter_cpu(self.me.index);
        let v = cpu.saturating_add(1);
        // Stored only when it changes: the line is read by every sender.
        if word.load(Ordering::Relaxed) != v {
            word.store(v, Ordering::Relaxed);
        }
    }

    /// Where the application thread of the endpoint that sent to this one last polled or
    /// waited, if it said and still holds its slot.
    pub(crate) fn peer_seen(&self) -> Option<PeerSeen> {
        let peer = self.last_sender?;
        let v = self.dir.waiter_cpu(peer.index).load(Ordering::Relaxed);
        let seen = PeerSeen { cpu: v.wrapping_sub(1), moves: self.me.index > peer.index };
        (v != 0 && self.dir.holds(peer.index, peer.generation)).then_some(seen)
    }

    /// Packets came through UDP from `ip`: if one other endpoint of this host holds that
    /// address, it is now the last sender ([`Shm::peer_seen`]); otherwise none is known (a
    /// remote host, or several processes sharing the address).
    pub(crate) fn received_through_udp(&mut self, ip: IpAddr) {
        let known = match self.udp_peer {
            Some((at, Some(slot), _)) if at == ip => self.dir.holds(slot.index, slot.generation),
            Some((at, None, asks)) if at == ip => asks % PEER_LOOKUP_EVERY != 0,
            _ => false,
        };
        if !known {
            let asks = self.udp_peer.filter(|p| p.0 == ip).map_or(0, |p| p.2);
            self.udp_peer = Some((ip, self.sole_holder(ip), asks));
        }
        if let Some((_, slot, asks)) = &mut self.udp_peer {
            *asks = asks.wrapping_add(1);
            self.last_sender = *slot;
        }
    }

    /// The one live endpoint other than this one whose device address is `ip`, if exactly
    /// one is.
    fn sole_holder(&self, ip: IpAddr) -> Option<SlotId> {
        let mut found = None;
        for index in FIRST_SLOT..=LAST_SLOT {
            if index == self.me.index {
                continue;
            }
            if let Some((generation, addr)) = self.dir.live(index)
                && addr == ip
            {
                if found.is_some() {
                    return None;
                }
                found = Some(SlotId { index, generation });
            }
        }
        found
    }

    /// Before sleeping: ask senders for a wake-up (`beside_poller`: once the application
    /// thread that busy-polls has stopped, see [`BusyMark`]), then look once more.
    pub(crate) fn prepare_sleep(&mut self, beside_poller: bool) -> bool {
        let waiting = if beside_poller {
            // Older wake-ups out first: one that comes after the flag is set must stay.
            shm::drain(self.wake.as_raw_fd());
            SLEEPS_BESIDE_POLLER
        } else {
            SLEEPS
        };
        self.dir.waiting(self.me.index).store(waiting, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.pending() {
            self.dir.waiting(self.me.index).store(NOT_WAITING, Ordering::Release);
            return false;
        }
        true
    }

    /// After waking: no more wake-ups wanted; empty the FIFO.
    pub(crate) fn woken(&mut self) {
        self.dir.waiting(self.me.index).store(NOT_WAITING, Ordering::Release);
        shm::drain(self.wake.as_raw_fd());
    }

    /// The handle through which this endpoint's threads publish its busy-poll stamp and its
    /// progress thread sleeps beside a poller, without the device lock. `mono_at_origin`:
    /// `CLOCK_MONOTONIC` at the device clock's origin.
    pub(crate) fn busy_mark(&self, mono_at_origin: u64) -> BusyMark {
        BusyMark {
            dir: Arc::clone(&self.dir),
            index: self.me.index,
            wake: Arc::clone(&self.wake),
            mono_at_origin,
        }
    }

    /// The FIFO a sleeper waits on.
    pub(crate) fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }
}

/// `waiting` values: awake (or polling), asleep, asleep beside a busy-polling application
/// thread (wake only once its stamp is stale).
const NOT_WAITING: u32 = 0;
const SLEEPS: u32 = 1;
const SLEEPS_BESIDE_POLLER: u32 = 2;

/// A busy-poll stamp older than this says the application thread stopped polling: its
/// progress thread is woken for what arrives. Well above the gap between two polls of a
/// polling loop (the stamp moves every [`STAMP_STEP_NS`], with the clock a poll reads on one
/// round in sixteen), below the progress thread's look-in (1–5 ms). Not lower: on a
/// machine with more spinning threads than cores a poller is often descheduled for tens of
/// microseconds, and at 30 µs its progress thread took over 2,000–3,700 times a second under
/// a 64-byte SEND stream, taking the lock and the CPU from it (0.6× the messages a second).
pub(crate) const POLLER_GONE_NS: u64 = 200_000;
/// The stamp is written when it has moved this far: the line it shares with `waiting` is read
/// by every sender, and a write per poll would take it from all of them.
const STAMP_STEP_NS: u64 = 20_000;

/// Whether slot `index`'s application thread has not busy-polled for [`POLLER_GONE_NS`].
fn poller_gone(dir: &HostDir, index: u8) -> bool {
    let at = dir.busy_at(index).load(Ordering::Acquire);
    at == 0 || crate::sys::monotonic_ns().saturating_sub(at) > POLLER_GONE_NS
}

/// An endpoint's busy-poll stamp in the host directory and its wake-up FIFO: published by its
/// application thread as it polls, slept beside by its progress thread.
pub(crate) struct BusyMark {
    dir: Arc<HostDir>,
    index: u8,
    wake: Arc<OwnedFd>,
    mono_at_origin: u64,
}

impl BusyMark {
    /// The application thread busy-polled at device time `now_ns`.
    pub(crate) fn publish(&self, now_ns: u64) {
        let now = self.mono_at_origin.saturating_add(now_ns).max(1);
        let stamp = self.dir.busy_at(self.index);
        if now.saturating_sub(stamp.load(Ordering::Relaxed)) >= STAMP_STEP_NS {
            stamp.store(now, Ordering::Release);
        }
    }

    /// For the progress thread going back to sleep beside the poller without the device
    /// lock (after a look-in): empties the FIFO of older wake-ups, asks senders for one once
    /// the stamp is stale ([`Shm::prepare_sleep`] asks the first time, and looks at the rings
    /// once more), and returns the FIFO to poll. `None`: a sender woke the thread since it
    /// last looked (it took the flag and wrote to the FIFO just after that look): take over
    /// now instead of sleeping on a wake-up already spent.
    pub(crate) fn sleep_beside_poller(&self) -> Option<RawFd> {
        let written = shm::drain(self.wake.as_raw_fd());
        let waiting = self.dir.waiting(self.index);
        let was = waiting.swap(SLEEPS_BESIDE_POLLER, Ordering::SeqCst);
        if written && was == NOT_WAITING {
            waiting.store(NOT_WAITING, Ordering::Release);
            return None;
        }
        Some(self.wake.as_raw_fd())
    }

    /// Whether the application thread has not busy-polled for [`POLLER_GONE_NS`] (as its
    /// senders judge it).
    pub(crate) fn poller_stopped(&self) -> bool {
        poller_gone(&self.dir, self.index)
    }

    /// The FIFO a thread sleeping beside the poller polls.
    pub(crate) fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// After that sleep: whether a sender woke the thread (the poller has stopped, and a
    /// packet waits).
    pub(crate) fn poked(&self) -> bool {
        self.dir.waiting(self.index).load(Ordering::Acquire) != SLEEPS_BESIDE_POLLER
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // The rings this endpoint created, and its FIFO, die with it; receivers holding a
        // mapping keep it until they notice the slot's new generation.
        for ring in self.out.iter().flatten() {
            let _ = std::fs::remove_file(self.dir.ring_path(self.me, ring.to));
        }
        let _ = std::fs::remove_file(self.dir.wake_path(self.me));
    }
}

/// What a ring's consumer reads through: the shared mapping, or (for fuzzing) plain bytes.
pub(crate) trait RingBytes {
    /// Copies `dst.len()` bytes at `offset` of the ring file; false when out of range.
    fn read(&self, offset: usize, dst: &mut [u8]) -> bool;
}

impl RingBytes for Mapping {
    fn read(&self, offset: usize, dst: &mut [u8]) -> bool {
        Self::read(self, offset, dst)
    }
}

/// Takes the records published between `*head` and `tail` (at most [`RX_BUDGET`] packets)
/// and hands each packet to `sink`; returns how many. `tail` comes from the producer, so
/// nothing about it is trusted: a record that is not one this protocol writes is counted
/// (`shm_rx_malformed`) and everything published is skipped. A tail behind the head means a
/// tail published earlier was false (the producer's own only grows): the head goes back to
/// it, so the ring works again from the producer's next record instead of waiting until the
/// producer's tail passes the false one.
fn drain<R: RingBytes + ?Sized>(
    own: IpAddr,
    ring: &R,
    head: &mut u64,
    tail: u64,
    buf: &mut [u8],
    c: &mut NetCounters,
    sink: &mut Sink<'_>,
) -> usize {
    if tail < *head {
        *head = tail;
    }
    let mut taken = 0;
    while *head < tail && taken < RX_BUDGET {
        match read_record(own, ring, *head, tail, buf) {
            Ok((advance, Some((rx, len, intact)))) => {
                *head += advance;
                taken += 1;
                c.shm_rx_packets += 1;
                sink(&rx, &buf[..len], intact);
            }
            Ok((advance, None)) => *head += advance,
            Err(()) => {
                c.shm_rx_malformed += 1;
                *head = tail;
            }
        }
    }
    taken
}

/// The ring reader on bytes a hostile producer chose, for the fuzz target: `data` sits in the
/// ring's data area at `head`'s position (every other byte reads as zero) and the producer
/// claims `head..tail` is published. Drains it as the consumer does, round after round,
/// handing every packet to `sink`; `Err` says which of the reader's own promises broke (the
/// head passes the tail, or a packet is longer than any record).
pub(crate) fn fuzz_ring(
    data: &[u8],
    head: u64,
    tail: u64,
    sink: &mut Sink<'_>,
) -> Result<NetCounters, String> {
    struct Sparse<'a> {
        at: usize,
        data: &'a [u8],
    }
    impl RingBytes for Sparse<'_> {
        fn read(&self, offset: usize, dst: &mut [u8]) -> bool {
            let Some(end) = offset.checked_add(dst.len()).filter(|&end| end <= FILE_BYTES) else {
                return false;
            };
            dst.fill(0);
            // The part of `offset..end` that overlaps `at..at + data.len()`.
            let (from, to) = (offset.max(self.at), end.min(self.at + self.data.len()));
            if from < to {
                dst[from - offset..to - offset]
                    .copy_from_slice(&self.data[from - self.at..to - self.at]);
            }
            true
        }
    }
    let at = DATA + usize::try_from(head % RING_BYTES as u64).map_err(|e| e.to_string())?;
    let ring = Sparse { at, data };
    let own = IpAddr::from([127, 0, 0, 3]);
    let (mut c, mut pos, mut buf) = (NetCounters::default(), head, vec![0u8; MAX_PACKET]);
    let mut longest = 0;
    for _ in 0..RING_BYTES / 64 {
        let before = pos;
        let mut check = |rx: &RxInfo, p: &[u8], intact: bool| {
            longest = longest.max(p.len());
            sink(rx, p, intact);
        };
        drain(own, &ring, &mut pos, tail, &mut buf, &mut c, &mut check);
        if pos > tail.max(head) {
            return Err(format!("head {pos} passed tail {tail}"));
        }
        if longest > MAX_PACKET {
            return Err(format!("a {longest}-byte packet, longer than any record holds"));
        }
        if pos == before {
            break;
        }
    }
    Ok(c)
}

/// A record header: total length, kind, packet length, source port, TOS, TTL, source
/// address.
fn record_header(total: u64, rx: &RxInfo, len: usize, icrc: bool) -> [u8; RECORD_HEADER] {
    let mut h = [0u8; RECORD_HEADER];
    let kind = if icrc { KIND_PACKET } else { KIND_PACKET_NO_ICRC };
    h[0..4].copy_from_slice(&u32::try_from(total).unwrap_or(0).to_le_bytes());
    h[4..8].copy_from_slice(&kind.to_le_bytes());
    h[8..12].copy_from_slice(&u32::try_from(len).unwrap_or(0).to_le_bytes());
    h[12..14].copy_from_slice(&rx.src.port().to_le_bytes());
    h[14] = rx.tclass;
    h[15] = rx.hop_limit;
    h[16..32].copy_from_slice(&mapped(rx.src.ip()));
    h
}

/// A packet record's metadata: the datagram's addressing, the packet's length, and whether its
/// ICRC was left out.
type Record = (RxInfo, usize, bool);

/// Reads the record at `pos` (below `tail`) into `buf`: how far to advance, and the packet's
/// metadata and length if it is a packet (a pad record carries none). `Err` for anything that
/// is not a well-formed record.
fn read_record<R: RingBytes + ?Sized>(
    own: IpAddr,
    map: &R,
    pos: u64,
    tail: u64,
    buf: &mut [u8],
) -> Result<(u64, Option<Record>), ()> {
    let cap = RING_BYTES as u64;
    let at = DATA + usize::try_from(pos % cap).map_err(|_| ())?;
    let mut h = [0u8; RECORD_HEADER];
    let room = usize::try_from(cap - pos % cap).map_err(|_| ())?;
    let hl = RECORD_HEADER.min(room);
    if !map.read(at, &mut h[..hl]) {
        return Err(());
    }
    let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let total = u64::from(word(0));
    if total == 0 || total % 64 != 0 || total > tail - pos || total > cap - pos % cap {
        return Err(());
    }
    match word(4) {
        KIND_PAD => Ok((total, None)),
        kind @ (KIND_PACKET | KIND_PACKET_NO_ICRC) => {
            let len = usize::try_from(word(8)).map_err(|_| ())?;
            if len > buf.len() || (RECORD_HEADER + len) as u64 > total {
                return Err(());
            }
            if !map.read(at + RECORD_HEADER, &mut buf[..len]) {
                return Err(());
            }
            let ip = |i: usize| {
                let mut b = [0u8; 16];
                b.copy_from_slice(&h[i..i + 16]);
                unmapped(b)
            };
            let rx = RxInfo {
                src: SocketAddr::new(ip(16), u16::from_le_bytes([h[12], h[13]])),
                dst: own,
                tclass: h[14],
                hop_limit: h[15],
                // uroce senders and the kernel's UDP path here give none.
                flow_label: 0,
            };
            Ok((total, Some((rx, len, kind == KIND_PACKET_NO_ICRC))))
        }
        _ => Err(()),
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation, reason = "test patterns wrap on purpose")]
mod tests {
    use super::*;

    fn dir(name: &str) -> (Arc<HostDir>, std::path::PathBuf) {
        let p = std::env::temp_dir().join(format!("uroce-shm-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        (Arc::new(HostDir::open_at(&p, shm::effective_uid()).expect("dir")), p)
    }

    /// Two endpoints of 127.0.0.2 in a fresh directory: sender, receiver, the receiver's
    /// slot, the directory.
    fn two_endpoints(name: &str) -> (Shm, Shm, SlotId, std::path::PathBuf) {
        let (dir, p) = dir(name);
        let ip: IpAddr = "127.0.0.2".parse().expect("ip");
        let (a, b) = (dir.claim(ip).expect("a"), dir.claim(ip).expect("b"));
        let tx = Shm::new(Arc::clone(&dir), a, ip).expect("tx");
        let rx = Shm::new(Arc::clone(&dir), b, ip).expect("rx");
        (tx, rx, b, p)
    }

    fn rx(dst: IpAddr) -> RxInfo {
        RxInfo::new("127.0.0.9:49152".parse().expect("addr"), dst)
    }

    #[test]
    fn packets_cross_in_order_with_their_metadata_and_wrap_around() {
        let (mut tx, mut rxs, b, p) = two_endpoints("order");
        let ip: IpAddr = "127.0.0.2".parse().expect("ip");
        let mut c = NetCounters::default();
        let mut got = Vec::new();
        // Enough rounds of odd sizes to wrap the ring several times.
        let mut sent = 0u32;
        for round in 0..200u32 {
            for k in 0..20u32 {
                let len = 100 + ((round * 20 + k) * 37 % 4000) as usize;
                let pkt: Vec<u8> = (0..len).map(|i| (i as u32 ^ sent) as u8).collect();
                assert!(tx.push(b, &rx(ip), core::iter::once(&pkt[..]), len, true, &mut c));
                sent += 1;
            }
            tx.commit(&mut c);
            rxs.receive(&mut c, &mut |info: &RxInfo, bytes: &[u8], _: bool| {
                assert_eq!(info.dst, ip);
                assert_eq!(info.src.port(), 49152);
                got.push(bytes.to_vec());
            });
        }
        assert_eq!(got.len(), sent as usize);
        for (n, pkt) in got.iter().enumerate() {
            assert!(pkt.iter().enumerate().all(|(i, &x)| x == (i as u32 ^ n as u32) as u8));
        }
        assert_eq!(c.shm_rx_malformed, 0);
        let _ = std::fs::remove_dir_all(&p);
    }

    /// A long batch is published as it is written, not only at its commit: the reader takes
    /// the first packets of a large READ response while the rest are still being written.
    /// Only the commit looks for a sleeping reader to wake.
    #[test]
    fn a_long_batch_is_readable_before_its_commit() {
        let (mut tx, mut rxs, b, p) = two_endpoints("early");
        let ip: IpAddr = "127.0.0.2".parse().expect("ip");
        let mut c = NetCounters::default();
        let pkt = vec![7u8; 4096];
        let mut got = 0;
        let mut take = |rxs: &mut Shm, c: &mut NetCounters| {
            rxs.receive(c, &mut |_: &RxInfo, bytes: &[u8], _: bool| {
                assert_eq!(bytes.len(), 4096);
                got += 1;
            });
            got
        };
        // Fewer bytes than the step stay unpublished until the commit.
        assert!(tx.push(b, &rx(ip), core::iter::once(&pkt[..]), 4096, true, &mut c));
        assert_eq!(take(&mut rxs, &mut c), 0);
        for _ in 1..16 {
            assert!(tx.push(b, &rx(ip), core::iter::once(&pkt[..]), 4096, true, &mut c));
        }
        let early = take(&mut rxs, &mut c);
        assert!(early >= 12, "{early} of 16 packets readable before the commit");
        assert!(rxs.prepare_sleep(false), "nothing unread: the reader may sleep");
        tx.commit(&mut c);
        assert_eq!(c.shm_wakeups_sent, 1, "the commit wakes the reader that went to sleep");
        assert_eq!(take(&mut rxs, &mut c), 16);
        let _ = std::fs::remove_dir_all(&p);
    }

    /// A sender that fills a ring and leaves at once (a process that closes its device right
    /// after its last UD send completed): everything it sent is still delivered, before the
    /// ring of the slot's next holder. Once, the receiver forgot the ring when it noticed the
    /// sender gone, unread records and all (`ib_send_bw -c UD` then waited for ever).
    #[test]
    fn records_of_a_sender_that_left_are_delivered_before_its_successors() {
        let (dir, p) = dir("left");
        let ip: IpAddr = "127.0.0.2".parse().expect("ip");
        let (a, b) = (dir.claim(ip).expect("a"), dir.claim(ip).expect("b"));
        let mut tx = Shm::new(Arc::clone(&dir), a, ip).expect("tx");
        let mut rxs = Shm::new(Arc::clone(&dir), b, ip).expect("rx");
        let mut c = NetCounters::default();
        let mut got = Vec::new();
        let take = |rxs: &mut Shm, c: &mut NetCounters, got: &mut Vec<u8>| {
            rxs.receive(c, &mut |_: &RxInfo, bytes: &[u8], _: bool| got.push(bytes[0]));
        };
        let pkt = vec![1u8; 4000];
        let mut sent = 0;
        while tx.push(b, &rx(ip), core::iter::once(&pkt[..]), pkt.len(), true, &mut c) {
            sent += 1;
        }
        tx.commit(&mut c);
        take(&mut rxs, &mut c, &mut got);
        assert_eq!(got.len(), RX_BUDGET, "one round takes its budget");
        dir.release(a);
        drop(tx);
        // The slot's next holder sends too: the receiver notices the new generation at once.
        let a2 = dir.claim(ip).expect("a2");
        assert_eq!(a2.index, a.index, "the slot is reused");
        let mut tx2 = Shm::new(Arc::clone(&dir), a2, ip).expect("tx2");
        let second = [2u8; 100];
        assert!(tx2.push(b, &rx(ip), core::iter::once(&second[..]), 100, true, &mut c));
        tx2.commit(&mut c);
        for _ in 0..4096 {
            take(&mut rxs, &mut c, &mut got);
        }
        assert_eq!(got.len(), sent + 1, "every record of the sender that left, and the new one");
        assert!(got[..sent].iter().all(|&x| x == 1) && got[sent] == 2, "in order");
        assert_eq!(c.shm_rx_malformed, 0);
        let _ = std::fs::remove_dir_all(&p);
    }

    /// What a closing device waits for: bytes its peers have not read, but only of peers
    /// that still run (a killed peer's slot stays live until someone claims it).
    #[test]
    fn unread_bytes_count_until_read_and_not_for_a_dead_reader() {
        let (mut tx, mut rxs, b, p) = two_endpoints("unread");
        let ip: IpAddr = "127.0.0.2".parse().expect("ip");
        let mut c = NetCounters::default();
        let pkt = [3u8; 1000];
        for _ in 0..3 {
            assert!(tx.push(b, &rx(ip), core::iter::once(&pkt[..]), 1000, true, &mut c));
        }
        tx.commit(&mut c);
        let each = (RECORD_HEADER + 1000).next_multiple_of(64) as u64;
        assert_eq!(tx.unread(), 3 * each);
        rxs.receive(&mut c, &mut |_: &RxInfo, _: &[u8], _: bool| {});
        assert_eq!(tx.unread(), 0, "read");
        assert!(tx.push(b, &rx(ip), core::iter::once(&pkt[..]), 1000, true, &mut c));
        tx.commit(&mut c);
        assert_eq!(tx.unread(), each);
        // The reader's process is gone.
        tx.dir.set_holder(b.index, b.generation, crate::host::exited_pid());
        assert_eq!(tx.unread(), 0, "nobody will read it");
        let _ = std::fs::remove_dir_all(&p);
    }

    #[test]
    fn a_full_ring_drops_and_counts_and_garbage_is_skipped_not_trusted() {
        let (mut tx, mut rxs, b, p) = two_endpoints("full");
        let ip: IpAddr = "127.0.0.2".parse().expect("ip");
        let mut c = NetCounters::default();
        let pkt = vec![7u8; 4000];
        let mut pushed = 0;
        for _ in 0..1000 {
            if tx.push(b, &rx(ip), core::iter::once(&pkt[..]), pkt.len(), true, &mut c) {
                pushed += 1;
            }
        }
        assert_eq!(pushed, RING_BYTES / (RECORD_HEADER + pkt.len()).next_multiple_of(64));
        assert_eq!(c.shm_tx_ring_full, 1000 - pushed as u64);
        tx.commit(&mut c);
        // Another process scribbles over a record's header.
        let ring = tx.out[usize::from(b.index)].as_ref().expect("ring");
        ring.map.write(DATA, &[0xFF; 8]);
        let mut n = 0;
        rxs.receive(&mut c, &mut |_: &RxInfo, _: &[u8], _: bool| n += 1);
        assert_eq!((n, c.shm_rx_malformed), (0, 1));
        // The ring goes on working after the garbage.
        assert!(tx.push(b, &rx(ip), core::iter::once(&pkt[..]), pkt.len(), true, &mut c));
        tx.commit(&mut c);
        rxs.receive(&mut c, &mut |_: &RxInfo, bytes: &[u8], _: bool| {
            assert_eq!(bytes, &pkt[..]);
            n += 1;
        });
        assert_eq!(n, 1);
        let _ = std::fs::remove_dir_all(&p);
    }

    #[test]
    fn the_fuzzing_reader_takes_a_published_record_and_refuses_garbage() {
        let ip: IpAddr = "127.0.0.2".parse().expect("ip");
        let pkt = [9u8; 100];
        let total = (RECORD_HEADER + pkt.len()).next_multiple_of(64);
        let mut record = record_header(total as u64, &rx(ip), pkt.len(), false).to_vec();
        record.extend_from_slice(&pkt);
        record.resize(total, 0);
        // A record without ICRC that ends exactly at the ring's end, on the third lap.
        let head = 3 * RING_BYTES as u64 - total as u64;
        let mut got = Vec::new();
        let mut sink = |r: &RxInfo, p: &[u8], intact: bool| got.push((r.src.ip(), p.len(), intact));
        let c = fuzz_ring(&record, head, head + total as u64, &mut sink).expect("reader");
        assert_eq!((c.shm_rx_packets, c.shm_rx_malformed), (1, 0));
        assert_eq!(got, [(rx(ip).src.ip(), pkt.len(), true)]);
        let mut sink = |_: &RxInfo, _: &[u8], _: bool| panic!("garbage delivered");
        let c = fuzz_ring(&[0xFF; 64], 0, 4096, &mut sink).expect("reader");
        assert_eq!((c.shm_rx_packets, c.shm_rx_malformed), (0, 1));
    }

    #[test]
    fn a_sleeping_receiver_is_woken_and_a_polling_one_is_not() {
        let (mut tx, mut rxs, b, p) = two_endpoints("wake");
        let ip: IpAddr = "127.0.0.2".parse().expect("ip");
        let mut c = NetCounters::default();
        let pkt = [1u8; 64];
        assert!(tx.push(b, &rx(ip), core::iter::once(&pkt[..]), 64, true, &mut c));
        tx.commit(&mut c);
        assert_eq!(c.shm_wakeups_sent, 0, "nobody asked for a wake-up");
        assert!(!rxs.prepare_sleep(false), "a packet is waiting: do not sleep");
        rxs.receive(&mut c, &mut |_: &RxInfo, _: &[u8], _: bool| {});
        assert!(rxs.prepare_sleep(false));
        assert!(tx.push(b, &rx(ip), core::iter::once(&pkt[..]), 64, true, &mut c));
        tx.commit(&mut c);
        assert_eq!(c.shm_wakeups_sent, 1);
        crate::sys::poll_readable(&[rxs.wake_fd()], 1000).expect("poll");
        rxs.woken();
        let _ = std::fs::remove_dir_all(&p);
    }

    /// Beside a busy-polling application thread the progress thread is woken only once that
    /// thread's stamp is stale: never while it polls (its packets are its own to take), at
    /// once when it stopped polling (went on to other work).
    #[test]
    fn a_progress_thread_beside_a_poller_is_woken_only_once_the_poller_stopped() {
        let (mut tx, rxs, b, p) = two_endpoints("beside");
        let ip: IpAddr = "127.0.0.2".parse().expect("ip");
        let mut c = NetCounters::default();
        let pkt = [1u8; 64];
        let send = |tx: &mut Shm, c: &mut NetCounters| {
            assert!(tx.push(b, &rx(ip), core::iter::once(&pkt[..]), 64, true, c));
            tx.commit(c);
        };
        // Stamps a second ahead of the host clock: fresh however slowly the test runs.
        let mark = rxs.busy_mark(crate::sys::monotonic_ns() + 1_000_000_000);
        let fifo = mark.sleep_beside_poller().expect("nobody woke it");
        mark.publish(1);
        send(&mut tx, &mut c);
        assert_eq!(c.shm_wakeups_sent, 0, "the poller takes it");
        assert!(!mark.poked() && !crate::sys::readable_now(fifo));
        // The poller stopped: its stamp is older than the limit when the next packet comes.
        let stale = crate::sys::monotonic_ns() - POLLER_GONE_NS - 1;
        rxs.dir.busy_at(b.index).store(stale, Ordering::Relaxed);
        send(&mut tx, &mut c);
        assert_eq!(c.shm_wakeups_sent, 1, "the poller stopped: its progress thread takes over");
        assert_eq!(c.shm_wakeups_stopped_poller, 1);
        assert!(mark.poked() && crate::sys::readable_now(fifo));
        send(&mut tx, &mut c);
        assert_eq!(c.shm_wakeups_sent, 1, "one wake-up until it sleeps again");
        // A thread that missed that wake-up (it looked just before it came) takes over
        // instead of sleeping on it.
        assert_eq!(mark.sleep_beside_poller(), None);
        assert!(!crate::sys::readable_now(fifo), "the wake-up is taken");
        // Asleep beside it again, once it polls again: its packets are its own again.
        assert_eq!(mark.sleep_beside_poller(), Some(fifo));
        mark.publish(2);
        send(&mut tx, &mut c);
        assert_eq!(c.shm_wakeups_sent, 1);
        assert!(!mark.poked());
        let _ = std::fs::remove_dir_all(&p);
    }

    /// A receiver learns where the endpoint that sent to it last polls, once it has received
    /// from it, and forgets it when that endpoint leaves its slot.
    #[test]
    fn a_receiver_sees_the_cpu_its_last_sender_polls_on() {
        let (mut tx, mut rxs, b, p) = two_endpoints("cpu");
        let ip: IpAddr = "127.0.0.2".parse().expect("ip");
        let mut c = NetCounters::default();
        tx.publish_cpu(1);
        assert_eq!(rxs.peer_seen().map(|p| p.cpu), None, "nothing received yet");
        let pkt = [1u8; 64];
        assert!(tx.push(b, &rx(ip), core::iter::once(&pkt[..]), 64, true, &mut c));
        tx.commit(&mut c);
        rxs.receive(&mut c, &mut |_: &RxInfo, _: &[u8], _: bool| {});
        assert_eq!(rxs.peer_seen().map(|p| p.cpu), Some(1));
        assert_eq!(rxs.peer_seen().map(|p| p.moves), Some(rxs.me.index > tx.me.index));
        tx.publish_cpu(0);
        assert_eq!(rxs.peer_seen().map(|p| p.cpu), Some(0), "CPU 0 is a CPU, not 'unknown'");
        tx.dir.release(tx.me);
        assert_eq!(rxs.peer_seen().map(|p| p.cpu), None, "the sender left");
        let _ = std::fs::remove_dir_all(&p);
    }

    /// Through UDP the sender is known by its address: the one local endpoint that holds
    /// it, and nobody when none or several do.
    #[test]
    fn a_udp_sender_is_the_endpoint_that_alone_holds_its_address() {
        let (dir, p) = dir("udp-peer");
        let ip = |s: &str| -> IpAddr { s.parse().expect("ip") };
        let me =
            Shm::new(Arc::clone(&dir), dir.claim(ip("127.0.0.2")).expect("me"), ip("127.0.0.2"));
        let mut me = me.expect("me");
        let peer =
            Shm::new(Arc::clone(&dir), dir.claim(ip("127.0.0.3")).expect("a"), ip("127.0.0.3"));
        let peer = peer.expect("peer");
        peer.publish_cpu(1);
        me.received_through_udp(ip("127.0.0.3"));
        assert_eq!(me.peer_seen().map(|p| p.cpu), Some(1));
        me.received_through_udp(ip("192.0.2.1"));
        assert_eq!(me.peer_seen().map(|p| p.cpu), None, "a remote host");
        // Looked up afresh: the address changed.
        let twin = dir.claim(ip("127.0.0.3")).expect("twin");
        me.received_through_udp(ip("127.0.0.3"));
        assert_eq!(me.peer_seen().map(|p| p.cpu), None, "two endpoints share the address");
        dir.release(twin);
        for _ in 0..PEER_LOOKUP_EVERY {
            me.received_through_udp(ip("127.0.0.3"));
        }
        assert_eq!(me.peer_seen().map(|p| p.cpu), Some(1), "looked up again");
        let _ = std::fs::remove_dir_all(&p);
    }
}
