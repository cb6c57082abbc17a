//! An adversary between two devices: the bytes of an input (a fuzzer's, or a seeded
//! generator's) choose the verbs each side posts and what the network does with every packet
//! — deliver, lose, duplicate, reorder, replay, corrupt and reseal, or forge — and the
//! promises an RNIC keeps are checked as the schedule runs:
//!
//! - every packet a device receives is accepted, or refused under exactly one named counter
//!   ([`Counters::packet_fate`]);
//! - no byte of memory outside the registered region changes;
//! - a work request completes at most once, on its own QP, and a work queue completes in the
//!   order its requests were posted (IBA 10.8: a WQE completes after every earlier WQE of its
//!   queue); an unsignaled send completes only with an error (`ibv_post_send(3)`);
//! - one packet in makes a bounded number of packets out;
//! - once the input ends the network heals (every packet delivered, time runs on), and every
//!   signaled send on a QP that was not reset completes within the retry budget: successfully,
//!   with an error or flushed. No schedule leaves a QP waiting for ever.
//!
//! [`run`] is what the `engine` fuzz target calls; the simulator's own tests run it over
//! seeded inputs, so the checks themselves are exercised on every test run.

use core::net::{IpAddr, SocketAddr};
use core::ops::AddAssign;
use std::collections::{HashMap, VecDeque};

use uroce_engine::{
    Access, AhAttr, AhHandle, Counters, CqHandle, Device, DeviceConfig, Duration, Instant, LKey,
    MemoryRegion, Mtu, PacketFate, PathAttr, Psn, QKey, QpAttr, QpInitAttr, QpState, QpType, Qpn,
    RKey, RecvWr, Reliability, RemoteAddr, RnrTimer, SendFlags, SendWr, Sge, UdDest, VecMemory,
    WcStatus, WorkCompletion, WrOpcode,
};
use uroce_wire::ROCE_V2_PORT;
use uroce_wire::icrc::{self, PseudoHeader};

/// Each side's memory: one buffer, of which the first [`REGISTERED`] bytes are registered.
const BASE: u64 = 0x10_0000;
const LEN: usize = 0x4000;
const REGISTERED: usize = 0x3000;
/// What the unregistered tail of each buffer holds; it must never change.
const GUARD: u8 = 0x5A;
/// The network holds at most this many packets towards each side; more are lost, as a switch
/// queue loses them.
const MAX_IN_FLIGHT: usize = 512;
/// Packets one input may make a device send before that counts as amplification.
const MAX_OUTPUT_PER_STEP: usize = 20_000;
/// Rounds of the healed network before a QP still waiting counts as hung. A round delivers
/// everything in flight and jumps to the next timer; the retry budget (timeout 4, three
/// tries, three RNR tries) fits in a few dozen.
const HEAL_ROUNDS: usize = 4_000;
/// Packets remembered per direction for replay.
const HISTORY: usize = 16;
const QKEY: QKey = QKey(0x11);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Rc,
    Uc,
    Ud,
}

const KINDS: [Kind; 3] = [Kind::Rc, Kind::Uc, Kind::Ud];

/// A broken promise: which one, how, and at which step of the schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The promise.
    pub rule: &'static str,
    /// What was seen.
    pub detail: String,
    /// The schedule step (operations from the input, then healing rounds).
    pub step: usize,
}

impl core::fmt::Display for Violation {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "step {}: {}: {}", self.step, self.rule, self.detail)
    }
}

impl std::error::Error for Violation {}

/// How far a run got: what the seeded tests check so that the schedules are known to reach the
/// paths they are meant to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reached {
    /// Operations taken from the input.
    pub steps: usize,
    /// Packets handed to a device.
    pub delivered: u64,
    /// Of those, refused or dropped under a named rule.
    pub refused: u64,
    /// Work requests posted.
    pub posted: u64,
    /// Completions with `SUCCESS`.
    pub successes: u64,
    /// Completions with an error other than a flush.
    pub errors: u64,
    /// Flushed completions.
    pub flushes: u64,
}

impl AddAssign for Reached {
    fn add_assign(&mut self, o: Self) {
        self.steps += o.steps;
        self.delivered += o.delivered;
        self.refused += o.refused;
        self.posted += o.posted;
        self.successes += o.successes;
        self.errors += o.errors;
        self.flushes += o.flushes;
    }
}

/// Runs the schedule `input` describes and checks it; see the module documentation.
pub fn run(input: &[u8]) -> Result<Reached, Violation> {
    let mut world = World::new();
    let mut input = Input { bytes: input, at: 0 };
    while let Some(op) = input.next() {
        world.step(op, &mut input)?;
        world.reached.steps += 1;
        world.step += 1;
    }
    world.heal()?;
    world.check_memory()?;
    Ok(world.reached)
}

/// Two connected devices as a target for packets from elsewhere (the fuzz target of the
/// shared-memory ring reader hands it what the reader took): each packet goes to the second
/// device, checked as the schedule's own are, and [`Victim::finish`] heals the network and
/// checks the rest.
pub struct Victim(World);

impl Victim {
    /// The two devices, connected, with nothing posted.
    pub fn new() -> Self {
        let mut w = World::new();
        // Traffic of their own, so that forged packets meet QPs with work in flight.
        let mut input =
            Input { bytes: &[3, 1, 0, 1, 0, 0, 64, 0, 2, 0, 0, 0, 0, 1, 0, 0, 64, 0, 2], at: 0 };
        while let Some(op) = input.next() {
            let _ = w.step(op, &mut input);
        }
        Self(w)
    }

    /// The QPNs of the device packets go to: RC, UC and UD.
    pub fn qpns(&self) -> [Qpn; 3] {
        self.0.sides[1].qps
    }

    /// Hands `payload` from `src` to the second device; `intact` says that its ICRC is not
    /// to be checked (the shared-memory path's packets without one).
    pub fn receive(
        &mut self,
        src: SocketAddr,
        payload: &[u8],
        intact: bool,
    ) -> Result<(), Violation> {
        let p = Packet { src, payload: payload.to_vec() };
        self.0.deliver_as(1, &p, intact)
    }

    /// Heals the network and checks what [`run`] checks at its end.
    pub fn finish(mut self) -> Result<Reached, Violation> {
        self.0.heal()?;
        self.0.check_memory()?;
        Ok(self.0.reached)
    }
}

impl Default for Victim {
    fn default() -> Self {
        Self::new()
    }
}

/// An adversary's input, read a byte at a time (both adversaries share it).
pub(crate) struct Input<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) at: usize,
}

impl Input<'_> {
    pub(crate) fn next(&mut self) -> Option<u8> {
        let b = self.bytes.get(self.at).copied();
        self.at += 1;
        b
    }
    /// The next byte, zero once the input is used up.
    pub(crate) fn byte(&mut self) -> u8 {
        self.next().unwrap_or(0)
    }
    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }
    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }
}

struct Side {
    dev: Device<VecMemory>,
    cq: CqHandle,
    mr: MemoryRegion,
    /// An address handle to the other side.
    ah: AhHandle,
    /// The QPs, in [`KINDS`] order.
    qps: [Qpn; 3],
}

/// A packet on its way to a side.
#[derive(Clone)]
struct Packet {
    src: SocketAddr,
    payload: Vec<u8>,
}

/// What the checker knows of one posted work request.
#[derive(Debug, Clone, Copy)]
struct Posted {
    side: usize,
    qp: Qpn,
    send: bool,
    signaled: bool,
}

struct World {
    sides: [Side; 2],
    /// `wire[i]`: packets on their way to side `i`.
    wire: [VecDeque<Packet>; 2],
    history: [VecDeque<Packet>; 2],
    now: Instant,
    next_wr_id: u64,
    posted: HashMap<u64, Posted>,
    /// Per (side, QP) and queue (send = 0, receive = 1): work requests in posting order that
    /// have not completed.
    queues: HashMap<(usize, Qpn, usize), VecDeque<u64>>,
    wcs: Vec<WorkCompletion>,
    buf: Vec<u8>,
    step: usize,
    reached: Reached,
}

fn addr(side: usize) -> IpAddr {
    IpAddr::from([10, 0, 0, if side == 0 { 1 } else { 2 }])
}

fn qp_type(kind: Kind) -> QpType {
    match kind {
        Kind::Rc => QpType::Rc,
        Kind::Uc => QpType::Uc,
        Kind::Ud => QpType::Ud,
    }
}

/// Reset → Init → RTR → RTS for `kind`, towards `peer` (ignored for UD), with the PSNs given.
fn bring_up(
    dev: &mut Device<VecMemory>,
    qp: Qpn,
    kind: Kind,
    peer: (IpAddr, Qpn),
    sq_psn: Psn,
    rq_psn: Psn,
) -> bool {
    let remote = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let access = if kind == Kind::Rc { remote } else { Access::REMOTE_WRITE };
    if dev.init_qp(qp, access, QKEY).is_err() {
        return false;
    }
    if kind == Kind::Ud {
        return dev.ready_datagram_qp(qp, sq_psn).is_ok();
    }
    let path = PathAttr { dest: peer.0, dest_qpn: peer.1, mtu: Mtu::Mtu256, sq_psn, rq_psn };
    let reliability = Reliability {
        timeout: 4,
        retry_cnt: 2,
        rnr_retry: 2,
        min_rnr_timer: RnrTimer::from_masked(1),
        max_rd_atomic: 2,
        max_dest_rd_atomic: 2,
    };
    dev.connect_qp(qp, &path, &reliability).is_ok()
}

impl World {
    fn new() -> Self {
        let sides = [0, 1].map(|i| {
            let mut mem = VecMemory::new();
            let mut bytes = vec![0u8; LEN];
            bytes[REGISTERED..].fill(GUARD);
            mem.insert(BASE, bytes);
            let mut dev = Device::new(DeviceConfig::new(addr(i), 0x5eed + i as u64), mem);
            let pd = dev.alloc_pd();
            let cq = dev.create_cq(4096).ok();
            let all = Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC;
            let mr = dev.reg_mr(pd, BASE, REGISTERED as u64, all).ok();
            let ah = dev.create_ah(pd, AhAttr::new(addr(1 - i))).ok();
            let (Some(cq), Some(mr), Some(ah)) = (cq, mr, ah) else {
                unreachable!("a fresh device has room for one CQ, MR and AH")
            };
            let qps = KINDS.map(|kind| {
                let init =
                    QpInitAttr { sq_sig_all: false, ..QpInitAttr::new(qp_type(kind), pd, cq) };
                dev.create_qp(init).unwrap_or_else(|e| unreachable!("create_qp: {e:?}"))
            });
            Side { dev, cq, mr, ah, qps }
        });
        let mut w = Self {
            sides,
            wire: Default::default(),
            history: Default::default(),
            now: Instant::ZERO,
            next_wr_id: 1,
            posted: HashMap::new(),
            queues: HashMap::new(),
            wcs: Vec::new(),
            buf: Vec::with_capacity(4200),
            step: 0,
            reached: Reached::default(),
        };
        for i in 0..2 {
            for (k, kind) in KINDS.into_iter().enumerate() {
                let peer = (addr(1 - i), w.sides[1 - i].qps[k]);
                let (qp, psn) = (w.sides[i].qps[k], Psn::from_masked(100));
                let up = bring_up(&mut w.sides[i].dev, qp, kind, peer, psn, psn);
                assert!(up, "the initial bring-up is valid");
            }
        }
        w
    }

    fn violation(&self, rule: &'static str, detail: String) -> Violation {
        Violation { rule, detail, step: self.step }
    }

    /// One operation of the schedule.
    fn step(&mut self, op: u8, input: &mut Input<'_>) -> Result<(), Violation> {
        let side = usize::from(input.byte() & 1);
        match op % 14 {
            0..=2 => self.post_send(side, input),
            3 => self.post_recv(side, input),
            4 | 5 => self.deliver_front(side),
            6 => {
                self.wire[side].pop_front();
                Ok(())
            }
            7 => {
                // Duplicate: deliver the front packet and leave it in flight.
                let Some(p) = self.wire[side].front().cloned() else { return Ok(()) };
                self.deliver(side, &p)
            }
            8 => {
                // Reorder: a later packet overtakes the ones ahead of it.
                let n = self.wire[side].len();
                if n > 1 {
                    let k = usize::from(input.byte()) % n;
                    if let Some(p) = self.wire[side].remove(k) {
                        self.wire[side].push_front(p);
                    }
                }
                Ok(())
            }
            9 => self.corrupt(side, input),
            10 => self.forge(side, input),
            11 => {
                // Replay an old packet.
                let n = self.history[side].len();
                let k = usize::from(input.byte());
                let Some(p) = (n > 0).then(|| self.history[side][k % n].clone()) else {
                    return Ok(());
                };
                self.deliver(side, &p)
            }
            12 => {
                let b = u64::from(input.byte());
                self.advance(Duration::from_micros((b + 1) * (b + 1)))
            }
            _ => self.modify(side, input),
        }
    }

    fn sge(&self, side: usize, input: &mut Input<'_>) -> Sge {
        let (offset, len) = (u64::from(input.u16()) % LEN as u64, u32::from(input.u16() % 1200));
        let lkey = match input.byte() % 8 {
            0 => LKey(input.u32()),
            1 => self.sides[1 - side].mr.lkey,
            _ => self.sides[side].mr.lkey,
        };
        Sge { addr: BASE + offset, length: len, lkey }
    }

    fn post_send(&mut self, side: usize, input: &mut Input<'_>) -> Result<(), Violation> {
        let k = usize::from(input.byte()) % 3;
        let kind = KINDS[k];
        let opcodes: &[WrOpcode] = match kind {
            Kind::Rc => &[
                WrOpcode::Send,
                WrOpcode::SendWithImm,
                WrOpcode::RdmaWrite,
                WrOpcode::RdmaWriteWithImm,
                WrOpcode::RdmaRead,
                WrOpcode::AtomicCmpAndSwp,
                WrOpcode::AtomicFetchAndAdd,
            ],
            Kind::Uc => &[
                WrOpcode::Send,
                WrOpcode::SendWithImm,
                WrOpcode::RdmaWrite,
                WrOpcode::RdmaWriteWithImm,
            ],
            Kind::Ud => &[WrOpcode::Send, WrOpcode::SendWithImm],
        };
        let opcode = opcodes[usize::from(input.byte()) % opcodes.len()];
        let shape = input.byte();
        let sges = usize::from(shape & 3);
        let mut sg_list: Vec<Sge> = (0..sges).map(|_| self.sge(side, input)).collect();
        if opcode.is_atomic() {
            sg_list.truncate(1);
            for s in &mut sg_list {
                s.length = 8;
                s.addr &= !7;
            }
        }
        let id = self.next_wr_id;
        self.next_wr_id += 1;
        let mut wr = SendWr::new(id, opcode, sg_list);
        let signaled = shape & 4 == 0;
        wr.flags = if signaled { SendFlags::SIGNALED } else { SendFlags::NONE };
        if shape & 8 != 0 {
            wr.flags = wr.flags | SendFlags::FENCE;
        }
        if shape & 16 != 0 {
            wr.flags = wr.flags | SendFlags::SOLICITED;
        }
        if shape & 32 != 0 && !opcode.is_read_or_atomic() {
            let n = usize::from(input.byte()) % 300;
            wr.inline_data = Some((0..n).map(|_| input.byte()).collect());
        }
        wr.imm = Some(input.u32().to_be_bytes());
        let peer = &self.sides[1 - side];
        let rkey = match input.byte() % 8 {
            0 => RKey(input.u32()),
            _ => peer.mr.rkey,
        };
        let remote_offset = u64::from(input.u16()) % LEN as u64;
        let remote_offset = if opcode.is_atomic() { remote_offset & !7 } else { remote_offset };
        wr.remote = Some(RemoteAddr { addr: BASE + remote_offset, rkey });
        wr.compare_add = u64::from(input.u32());
        wr.swap = u64::from(input.u32());
        if kind == Kind::Ud {
            let remote_qpn = match input.byte() % 8 {
                0 => Qpn::from_masked(input.u32()),
                _ => peer.qps[2],
            };
            let remote_qkey = if input.byte().is_multiple_of(8) { QKey(input.u32()) } else { QKEY };
            wr.ud = Some(UdDest { ah: self.sides[side].ah, remote_qpn, remote_qkey });
        }
        let qp = self.sides[side].qps[k];
        if self.sides[side].dev.post_send(qp, wr).is_ok() {
            self.track(id, Posted { side, qp, send: true, signaled });
        }
        self.collect()
    }

    fn post_recv(&mut self, side: usize, input: &mut Input<'_>) -> Result<(), Violation> {
        let k = usize::from(input.byte()) % 3;
        let sges = usize::from(input.byte() % 3);
        let sg_list = (0..sges).map(|_| self.sge(side, input)).collect();
        let id = self.next_wr_id;
        self.next_wr_id += 1;
        let qp = self.sides[side].qps[k];
        if self.sides[side].dev.post_recv(qp, RecvWr { wr_id: id, sg_list }).is_ok() {
            self.track(id, Posted { side, qp, send: false, signaled: true });
        }
        self.collect()
    }

    fn track(&mut self, id: u64, p: Posted) {
        self.reached.posted += 1;
        self.posted.insert(id, p);
        self.queues.entry((p.side, p.qp, usize::from(!p.send))).or_default().push_back(id);
    }

    /// Takes every packet both devices have to send and puts it on the wire.
    fn collect(&mut self) -> Result<(), Violation> {
        for i in 0..2 {
            let mut n = 0;
            while let Some(tx) = self.sides[i].dev.poll_transmit(self.now, &mut self.buf) {
                n += 1;
                if n > MAX_OUTPUT_PER_STEP {
                    let detail = format!("side {i} sent more than {MAX_OUTPUT_PER_STEP} packets");
                    return Err(self.violation("bounded output", detail));
                }
                let to = usize::from(tx.dst.ip() != addr(0));
                if tx.dst.ip() != addr(to) {
                    continue; // not routed: only the two devices are on this network
                }
                let p = Packet {
                    src: SocketAddr::new(addr(i), tx.src_port),
                    payload: self.buf.clone(),
                };
                if self.wire[to].len() >= MAX_IN_FLIGHT {
                    self.wire[to].pop_front();
                }
                self.wire[to].push_back(p);
            }
        }
        self.poll_cqs()
    }

    fn deliver_front(&mut self, to: usize) -> Result<(), Violation> {
        match self.wire[to].pop_front() {
            Some(p) => self.deliver(to, &p),
            None => Ok(()),
        }
    }

    fn deliver(&mut self, to: usize, p: &Packet) -> Result<(), Violation> {
        self.deliver_as(to, p, false)
    }

    fn deliver_as(&mut self, to: usize, p: &Packet, intact: bool) -> Result<(), Violation> {
        let dev = &mut self.sides[to].dev;
        let before = *dev.counters();
        let rx = uroce_engine::RxInfo::new(p.src, addr(to));
        if intact {
            dev.handle_datagram_intact(self.now, &rx, &p.payload);
        } else {
            dev.handle_datagram(self.now, &rx, &p.payload);
        }
        self.reached.delivered += 1;
        match Counters::packet_fate(&before, dev.counters()) {
            Ok(PacketFate::Accepted) => {}
            Ok(_) => self.reached.refused += 1,
            Err(e) => return Err(self.violation("one named counter per refused packet", e)),
        }
        if self.history[to].len() >= HISTORY {
            self.history[to].pop_front();
        }
        self.history[to].push_back(p.clone());
        self.collect()
    }

    /// Edits the front packet (some bytes, maybe its length), reseals it or not, delivers it.
    fn corrupt(&mut self, to: usize, input: &mut Input<'_>) -> Result<(), Violation> {
        let Some(mut p) = self.wire[to].pop_front() else { return Ok(()) };
        let how = input.byte();
        for _ in 0..=(how & 3) {
            let (at, value) = (usize::from(input.u16()), input.byte());
            if let Some(n) = p.payload.len().checked_sub(1) {
                p.payload[at % (n + 1)] = value;
            }
        }
        if how & 4 != 0 {
            let keep = usize::from(input.u16()) % (p.payload.len() + 1);
            p.payload.truncate(keep);
        }
        if how & 8 == 0 {
            reseal(p.src, addr(to), &mut p.payload);
        }
        self.deliver(to, &p)
    }

    /// Delivers a packet made of input bytes, most of them aimed at one of the side's QPs with
    /// a PSN near the last one seen there and a valid ICRC, so that they reach the transport.
    fn forge(&mut self, to: usize, input: &mut Input<'_>) -> Result<(), Violation> {
        let how = input.byte();
        let len = usize::from(input.byte()) % 96;
        let mut payload: Vec<u8> = (0..len).map(|_| input.byte()).collect();
        if how & 1 == 0 && payload.len() >= 16 {
            let k = usize::from(how >> 1) % 3;
            payload[1] &= 0xC0; // no pad, transport version 0
            payload[2..4].copy_from_slice(&[0xFF, 0xFF]); // the default P_Key
            let qpn = self.sides[to].qps[k].get().to_be_bytes();
            payload[5..8].copy_from_slice(&qpn[1..]);
            if let Some(last) = self.history[to].back().filter(|l| l.payload.len() >= 12) {
                // The PSN of the last packet delivered there, moved a little.
                let psn =
                    u32::from_be_bytes([0, last.payload[9], last.payload[10], last.payload[11]]);
                let psn = psn.wrapping_add(u32::from(how >> 4)).wrapping_sub(4) & 0xFF_FFFF;
                payload[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
            }
        }
        let src = match self.history[to].back() {
            Some(last) if how & 2 == 0 => last.src,
            _ => SocketAddr::new(addr(1 - to), 0xC000 | u16::from(how)),
        };
        if how & 8 == 0 {
            reseal(src, addr(to), &mut payload);
        }
        self.deliver(to, &Packet { src, payload })
    }

    /// Moves the clock on and fires the timers that fell due.
    fn advance(&mut self, by: Duration) -> Result<(), Violation> {
        self.now += by;
        for i in 0..2 {
            if self.sides[i].dev.poll_timeout().is_some_and(|t| t <= self.now) {
                self.sides[i].dev.handle_timeout(self.now);
            }
        }
        self.collect()
    }

    /// A state change the application might make: to Error, SQD and back, or Reset and a new
    /// bring-up (with the peer unaware, PSNs from the input).
    fn modify(&mut self, side: usize, input: &mut Input<'_>) -> Result<(), Violation> {
        let k = usize::from(input.byte()) % 3;
        let qp = self.sides[side].qps[k];
        let attr = |state| QpAttr { state: Some(state), ..QpAttr::default() };
        match input.byte() % 4 {
            0 => {
                let _ = self.sides[side].dev.modify_qp(qp, &attr(QpState::Error));
            }
            1 => {
                let dev = &mut self.sides[side].dev;
                if dev.modify_qp(qp, &attr(QpState::Sqd)).is_ok() {
                    self.collect()?;
                    let _ = self.sides[side].dev.modify_qp(qp, &attr(QpState::Rts));
                }
            }
            _ => {
                // Completions already made stay in the CQ through a reset; take them first.
                self.poll_cqs()?;
                if self.sides[side].dev.modify_qp(qp, &attr(QpState::Reset)).is_ok() {
                    // Reset discards every WQE without a completion (IBA 10.3).
                    for q in 0..2 {
                        for id in self.queues.remove(&(side, qp, q)).unwrap_or_default() {
                            self.posted.remove(&id);
                        }
                    }
                    let peer = (addr(1 - side), self.sides[1 - side].qps[k]);
                    let (sq, rq) = (Psn::from_masked(input.u32()), Psn::from_masked(input.u32()));
                    bring_up(&mut self.sides[side].dev, qp, KINDS[k], peer, sq, rq);
                }
            }
        }
        self.collect()
    }

    fn poll_cqs(&mut self) -> Result<(), Violation> {
        for side in 0..2 {
            let mut wcs = core::mem::take(&mut self.wcs);
            wcs.clear();
            let s = &mut self.sides[side];
            s.dev.poll_cq(s.cq, usize::MAX, &mut wcs);
            if s.dev.cq_overflowed(s.cq) {
                return Err(self.violation("CQ sized for every WQE", "overflowed".into()));
            }
            for wc in &wcs {
                self.complete(side, wc)?;
            }
            self.wcs = wcs;
        }
        Ok(())
    }

    /// Checks one completion against what was posted.
    fn complete(&mut self, side: usize, wc: &WorkCompletion) -> Result<(), Violation> {
        let Some(p) = self.posted.remove(&wc.wr_id) else {
            let detail = format!("{wc:?} completes nothing outstanding (twice, or after a reset)");
            return Err(self.violation("a WR completes at most once", detail));
        };
        if p.side != side || p.qp != wc.qp_num {
            let detail = format!("{wc:?} for a WR posted to {} on side {}", p.qp, p.side);
            return Err(self.violation("a completion names its own QP", detail));
        }
        if !p.signaled && wc.status == WcStatus::SUCCESS {
            return Err(
                self.violation("unsignaled sends complete only in error", format!("{wc:?}"))
            );
        }
        match wc.status {
            WcStatus::SUCCESS => self.reached.successes += 1,
            WcStatus::WR_FLUSH_ERR => self.reached.flushes += 1,
            _ => self.reached.errors += 1,
        }
        let queue = self.queues.entry((side, p.qp, usize::from(!p.send))).or_default();
        let Some(at) = queue.iter().position(|&id| id == wc.wr_id) else {
            return Err(self.violation("the checker tracks every WR", format!("{wc:?}")));
        };
        // Everything ahead of it in the queue is done too: that must be unsignaled sends,
        // which complete silently.
        let ahead: Vec<u64> = queue.drain(..=at).take(at).collect();
        for id in ahead {
            let earlier = self.posted.remove(&id);
            if earlier.is_none_or(|e| e.signaled) {
                let detail = format!("{wc:?} before WR {id}, posted earlier on the same queue");
                return Err(self.violation("a work queue completes in posting order", detail));
            }
        }
        Ok(())
    }

    /// The network heals: everything in flight is delivered and time runs on until no signaled
    /// send is outstanding on a QP, or the rounds run out (a hung QP).
    fn heal(&mut self) -> Result<(), Violation> {
        for _ in 0..HEAL_ROUNDS {
            self.step += 1;
            while let Some(to) = (0..2).find(|&i| !self.wire[i].is_empty()) {
                self.deliver_front(to)?;
            }
            if self.waiting_sends().is_empty() {
                return Ok(());
            }
            let next = self.sides.iter().filter_map(|s| s.dev.poll_timeout()).min();
            let Some(next) = next else { break };
            self.advance(next.saturating_since(self.now))?;
        }
        let waiting = self.waiting_sends();
        if waiting.is_empty() {
            return Ok(());
        }
        let states: Vec<String> = waiting
            .iter()
            .map(|&(side, qp)| {
                let dev = &self.sides[side].dev;
                format!("side {side} {}", dev.describe_qp(qp).unwrap_or_default())
            })
            .collect();
        Err(self
            .violation("every signaled send completes once the network heals", states.join("; ")))
    }

    /// The (side, QP) pairs with a signaled send not yet completed.
    fn waiting_sends(&self) -> Vec<(usize, Qpn)> {
        let mut v: Vec<(usize, Qpn)> = self
            .queues
            .iter()
            .filter(|((_, _, q), ids)| *q == 0 && ids.iter().any(|id| self.posted[id].signaled))
            .map(|(&(side, qp, _), _)| (side, qp))
            .collect();
        v.sort_unstable();
        v
    }

    fn check_memory(&self) -> Result<(), Violation> {
        for (i, s) in self.sides.iter().enumerate() {
            let mem = s.dev.memory().buffer(BASE).unwrap_or_default();
            // One comparison of the whole guard first: this runs on every fuzz input.
            if mem.get(REGISTERED..) == Some(&[GUARD; LEN - REGISTERED][..]) {
                continue;
            }
            if let Some(at) = mem[REGISTERED..].iter().position(|&b| b != GUARD) {
                let detail = format!("side {i}: byte {:#x} past the region", at);
                return Err(self.violation("no write outside a registered region", detail));
            }
        }
        Ok(())
    }
}

/// Recomputes the ICRC of a (changed) packet so that it passes the receiver's check.
fn reseal(src: SocketAddr, dst: IpAddr, packet: &mut [u8]) {
    let Some(n) = packet.len().checked_sub(4).filter(|&n| n >= 12) else { return };
    let Ok(pseudo) = PseudoHeader::for_endpoints(src, SocketAddr::new(dst, ROCE_V2_PORT)) else {
        return;
    };
    if let Ok(crc) = icrc::compute(&pseudo, &packet[..n]) {
        packet[n..].copy_from_slice(&icrc::to_wire(crc));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
mod tests {
    use super::*;

    #[test]
    fn an_empty_schedule_is_clean() {
        assert_eq!(run(&[]).map(|r| r.posted), Ok(0));
    }

    fn wc(wr_id: u64, qp_num: Qpn, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode: uroce_engine::WcOpcode::Send,
            byte_len: 0,
            imm: None,
            qp_num,
            src_qp: Qpn::QP0,
            grh: false,
            ipv4: false,
            timestamp: Instant::ZERO,
            tm: None,
            invalidated_rkey: None,
        }
    }

    /// A world with three sends tracked on side 0's RC QP: signaled, unsignaled, signaled.
    fn three_sends() -> (World, Qpn) {
        let mut w = World::new();
        let qp = w.sides[0].qps[0];
        for (id, signaled) in [(1, true), (2, false), (3, true)] {
            w.track(id, Posted { side: 0, qp, send: true, signaled });
        }
        (w, qp)
    }

    #[test]
    fn the_checker_accepts_completions_in_order_with_unsignaled_ones_implied() {
        let (mut w, qp) = three_sends();
        assert_eq!(w.complete(0, &wc(1, qp, WcStatus::SUCCESS)), Ok(()));
        assert_eq!(w.complete(0, &wc(3, qp, WcStatus::SUCCESS)), Ok(()));
        assert!(w.waiting_sends().is_empty());
    }

    #[test]
    fn the_checker_refuses_each_broken_completion_rule() {
        let rule = |r: Result<(), Violation>| r.err().map(|v| v.rule);
        let (mut w, qp) = three_sends();
        let out_of_order = w.complete(0, &wc(3, qp, WcStatus::SUCCESS));
        assert_eq!(rule(out_of_order), Some("a work queue completes in posting order"));
        let (mut w, qp) = three_sends();
        assert_eq!(w.complete(0, &wc(1, qp, WcStatus::SUCCESS)), Ok(()));
        let twice = w.complete(0, &wc(1, qp, WcStatus::SUCCESS));
        assert_eq!(rule(twice), Some("a WR completes at most once"));
        let silent = w.complete(0, &wc(2, qp, WcStatus::SUCCESS));
        assert_eq!(rule(silent), Some("unsignaled sends complete only in error"));
        let other_qp = w.complete(0, &wc(3, w.sides[0].qps[1], WcStatus::SUCCESS));
        assert_eq!(rule(other_qp), Some("a completion names its own QP"));
        let (w, _) = three_sends();
        assert_eq!(w.waiting_sends().len(), 1, "a signaled send outstanding is waiting");
    }

    #[test]
    fn the_checker_finds_a_write_past_the_region() {
        let mut w = World::new();
        assert_eq!(w.check_memory(), Ok(()));
        let mem = w.sides[1].dev.memory_mut().buffer_mut(BASE).unwrap_or_default();
        mem[REGISTERED + 7] = 0;
        let r = w.check_memory().err().map(|v| v.rule);
        assert_eq!(r, Some("no write outside a registered region"));
    }

    #[test]
    fn a_send_and_its_receive_complete() {
        // post_recv on side 1's RC QP (one SGE at offset 0, 64 bytes), post_send of a SEND
        // from side 0, then the input ends and the network heals.
        let recv = [3, 1, 0, 1, 0, 0, 64, 0, 2];
        let send = [0, 0, 0, 0, 1, 0, 0, 64, 0, 2];
        let r = run(&[&recv[..], &send[..]].concat());
        let r = r.unwrap_or_else(|v| panic!("{v}"));
        assert_eq!((r.posted, r.successes), (2, 2), "{r:?}");
    }
}
