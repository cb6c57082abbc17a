//! The RDMA tests, both roles: a QP of the test's transport on each side, buffers, and the
//! loops that move data and time it.

use core::cell::Cell;
use core::time::Duration;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use uroce::{
    Access, Ah, Context, Cq, Endpoint, Mr, Pd, QKey, Qp, QpType, Qpn, WcOpcode, WcStatus,
    WorkCompletion,
};

use super::{Op, Params, Pattern, TestDef, now};

/// Q_Key of the UD tests.
const QKEY: QKey = QKey(0x5045_5246);
/// The GRH area in front of every UD receive.
const GRH: usize = 40;
/// How long a side waits for one completion before it calls the test failed.
const STALL: Duration = Duration::from_secs(10);
/// UC and UD may lose a message: a ping-pong round unanswered this long is counted lost and the
/// next one starts.
const LOST: Duration = Duration::from_millis(200);

/// One side's QP and buffers for a test.
pub(crate) struct Side {
    pd: Pd,
    qp_type: QpType,
    cq: Cq,
    /// The test's QPs: one, or `--qps` of them for streams (work spread round robin).
    qps: Vec<Qp>,
    /// Source of SENDs and WRITEs, landing place of READs and atomic results.
    buf: Mr,
    /// The region offered to the peer: target of its WRITEs, source of its READs, home of the
    /// word its atomics work on; the write-poll test polls its last byte.
    target: Mr,
    /// Receive slots: `slots` of `slot` bytes per QP.
    recv: Mr,
    slot: usize,
    slots: usize,
    /// UD: the peer's address handle and its QPs.
    ud: Option<(Ah, Vec<Qpn>)>,
    /// The peer's buffer, for one-sided operations.
    remote: Option<uroce::RemoteMr>,
    events: bool,
    /// SENDs of at most this many bytes go inline.
    inline: usize,
    /// Completions taken but not yet consumed.
    pending: Vec<WorkCompletion>,
    /// Which of `qps` work was posted on (bit k: QP k; at most 64 QPs).
    used: Cell<u64>,
    /// SENDs posted inline.
    inlined: Cell<u64>,
}

impl Side {
    /// Creates this side's QPs and buffers; returns the endpoints to send to the peer.
    pub(crate) fn new(
        ctx: &Context,
        test: &TestDef,
        p: &Params,
    ) -> Result<(Self, Vec<Endpoint>), String> {
        let qp_type = test.transport.ok_or("not an RDMA test")?;
        let e = |e: uroce::Error| e.to_string();
        let pd = ctx.alloc_pd();
        let depth = p.depth.max(1);
        let n = p.qps.max(1) as usize;
        let slot = if qp_type == QpType::Ud { p.size + GRH } else { p.size };
        // Enough receives for a window in flight, within 256 MiB. UC and UD have no RNR NAK:
        // a message that finds no receive posted is lost, so an unreliable stream keeps a deep
        // queue (up to 4,096 receives or 16 MiB, as deep as perftest's), not the sender's
        // window.
        let unreliable_stream =
            qp_type != QpType::Rc && matches!(test.pattern, Pattern::Stream | Pattern::BiStream);
        let wanted = if unreliable_stream {
            ((16 << 20) / slot.max(1)).clamp(depth as usize * 2, 4096)
        } else {
            depth as usize * 2
        };
        let slots = wanted.min((256 << 20) / slot.max(1)).max(2);
        let recv_depth = u32::try_from(slots).unwrap_or(u32::MAX).saturating_add(8);
        let cq = ctx.create_cq((depth as usize * 2 + slots + 64) * n).map_err(e)?;
        let mut qps = Vec::with_capacity(n);
        for _ in 0..n {
            let mut qp = pd
                .qp(qp_type, &cq)
                .depth(depth * 2 + 8, recv_depth)
                .qkey(QKEY)
                .max_inline(p.inline.max(256));
            // Without --mtu, the builder's default: the port's active MTU (connecting takes
            // the smaller of the two ends').
            if let Some(mtu) = p.mtu {
                qp = qp.mtu(mtu);
            }
            let qp = qp.build().map_err(e)?;
            qps.push(qp);
        }
        let all = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        // Atomics target an 8-byte word; everything else a message-sized buffer.
        let buf = pd.register(p.size.max(8), Access::LOCAL_WRITE).map_err(e)?;
        let target = pd.register(p.size.max(8), all).map_err(e)?;
        let recv = pd.register(slot * slots * n, Access::LOCAL_WRITE).map_err(e)?;
        let endpoints = qps.iter().map(|q| q.endpoint().with_region(target.remote())).collect();
        let side = Self {
            pd,
            qp_type,
            cq,
            qps,
            buf,
            target,
            recv,
            slot,
            slots,
            ud: None,
            remote: None,
            events: p.events,
            inline: p.inline as usize,
            pending: Vec::new(),
            used: Cell::new(0),
            inlined: Cell::new(0),
        };
        Ok((side, endpoints))
    }

    /// Connects QP `i` to the peer's endpoint `i` (UD: an address handle to the peer).
    pub(crate) fn connect(&mut self, peers: &[Endpoint]) -> Result<(), String> {
        if peers.len() != self.qps.len() {
            return Err(format!("the peer has {} QPs, this side {}", peers.len(), self.qps.len()));
        }
        for (qp, peer) in self.qps.iter().zip(peers) {
            qp.connect(peer).map_err(|e| e.to_string())?;
        }
        let first = peers.first().ok_or("no peer endpoint")?;
        self.remote = first.regions.first().copied();
        if self.qp_type == QpType::Ud {
            let ah = self.pd.create_ah(first.gid).map_err(|e| e.to_string())?;
            self.ud = Some((ah, peers.iter().map(|p| p.qpn).collect()));
        }
        Ok(())
    }

    /// The QP of ping-pongs and round trips.
    fn qp(&self) -> &Qp {
        self.used.set(self.used.get() | 1);
        &self.qps[0]
    }

    /// The QP work request `k` of a stream goes on (round robin).
    fn qp_for(&self, k: u64) -> &Qp {
        let i = usize::try_from(k % self.qps.len() as u64).unwrap_or(0);
        self.used.set(
            self.used.get() | u32::try_from(i).ok().and_then(|i| 1u64.checked_shl(i)).unwrap_or(0),
        );
        &self.qps[i]
    }

    /// How many QPs work was posted on.
    pub(crate) fn qps_used(&self) -> usize {
        self.used.get().count_ones() as usize
    }

    /// How many SENDs went inline.
    pub(crate) fn inline_posts(&self) -> u64 {
        self.inlined.get()
    }

    /// Receive slots over all QPs.
    fn recv_slots(&self) -> u64 {
        (self.slots * self.qps.len()) as u64
    }

    /// Posts the receive of slot `k` (modulo all slots) on the QP that slot belongs to.
    fn post_recv(&self, k: u64) -> Result<(), String> {
        let s = usize::try_from(k % self.recv_slots()).unwrap_or(0);
        self.qps[s / self.slots]
            .post_recv(s as u64, &self.recv, s * self.slot..(s + 1) * self.slot)
            .map_err(|e| e.to_string())
    }

    fn send(&self, wr_id: u64, len: usize) -> Result<(), String> {
        if len <= self.inline {
            // Inline: the bytes are copied now, as the CPU writes them into the WQE on an RNIC.
            let data = self.buf.to_vec(0..len).map_err(|e| e.to_string())?;
            let to = self.ud.as_ref().map(|(ah, qpns)| (ah, peer_qpn(qpns, wr_id), QKEY));
            self.inlined.set(self.inlined.get() + 1);
            return self.qp_for(wr_id).send_inline(wr_id, &data, to).map_err(|e| e.to_string());
        }
        let qp = self.qp_for(wr_id);
        let r = match &self.ud {
            Some((ah, qpns)) => {
                qp.send_to(wr_id, &self.buf, 0..len, ah, peer_qpn(qpns, wr_id), QKEY)
            }
            None => qp.send(wr_id, &self.buf, 0..len),
        };
        r.map_err(|e| e.to_string())
    }

    fn remote(&self) -> Result<uroce::RemoteMr, String> {
        self.remote.ok_or_else(|| "the peer offered no region".to_string())
    }

    /// The next completion, busy polling or sleeping on events; fails on an error status or a
    /// stall.
    fn next(&mut self) -> Result<WorkCompletion, String> {
        self.next_within(STALL)?.ok_or_else(|| format!("no completion for {STALL:?}"))
    }

    /// The next completion within `limit`, or `None`.
    fn next_within(&mut self, limit: Duration) -> Result<Option<WorkCompletion>, String> {
        if self.pending.is_empty() {
            let start = now();
            while self.pending.is_empty() {
                if self.events {
                    let got = self.cq.wait(Some(limit)).map_err(|e| e.to_string())?;
                    self.pending.extend(got);
                } else {
                    self.cq.poll(&mut self.pending);
                }
                if self.pending.is_empty() && start.elapsed() > limit {
                    return Ok(None);
                }
            }
            self.pending.reverse();
        }
        let wc = self.pending.pop().ok_or("no completion")?;
        if wc.status != WcStatus::SUCCESS {
            return Err(format!("{:?} completed with {}", wc.opcode, wc.status));
        }
        Ok(Some(wc))
    }

    /// Takes whatever completions are ready, without waiting.
    fn ready(&mut self) -> Result<Vec<WorkCompletion>, String> {
        let mut out = core::mem::take(&mut self.pending);
        out.reverse();
        self.cq.poll(&mut out);
        if let Some(bad) = out.iter().find(|w| w.status != WcStatus::SUCCESS) {
            return Err(format!("{:?} completed with {}", bad.opcode, bad.status));
        }
        Ok(out)
    }
}

/// What a run measured on one side.
#[derive(Debug, Default)]
pub(crate) struct Measured {
    /// Latency samples in nanoseconds (client, latency tests).
    pub(crate) samples: Vec<u64>,
    /// Messages (or operations) completed in the measured phase.
    pub(crate) msgs: u64,
    /// Payload bytes moved in the measured phase (received, where arrival is what counts).
    pub(crate) bytes: u64,
    pub(crate) seconds: f64,
    /// Streams: every operation posted, warm-up included (to scale what the server counted).
    pub(crate) total_posted: u64,
    /// UC/UD ping-pong rounds that went unanswered (a message lost).
    pub(crate) lost: u64,
    /// The options as they took effect on this side.
    pub(crate) applied: super::Applied,
}

/// Whether the measured phase is over.
struct Clock {
    start: Instant,
    limit: Option<Duration>,
    iters: u64,
}

impl Clock {
    fn new(p: &Params) -> Self {
        Self { start: now(), limit: p.duration, iters: p.iters }
    }
    fn done(&self, n: u64) -> bool {
        match self.limit {
            Some(d) => self.start.elapsed() >= d,
            None => n >= self.iters,
        }
    }
}

/// The client's loop. Warm-up iterations come first and are not measured.
pub(crate) fn client(side: &mut Side, test: &TestDef, p: &Params) -> Result<Measured, String> {
    let size = p.size;
    let mut m = Measured::default();
    match (test.pattern, test.op) {
        (Pattern::PingPong, Op::Send | Op::WriteImm | Op::WritePoll) => {
            for k in 0..u64::from(p.depth) {
                side.post_recv(k)?;
            }
            let mut seq: u64 = 0;
            let round = |side: &mut Side, seq: u64| -> Result<bool, String> {
                match test.op {
                    Op::Send => side.send(seq, size)?,
                    Op::WriteImm => {
                        let r = side.remote()?;
                        side.qp()
                            .write_with_imm(seq, &side.buf, 0..size, r.at(0), 0)
                            .map_err(|e| e.to_string())?;
                    }
                    _ => {
                        let mark = mark(seq);
                        side.buf.write(size - 1, &[mark]).map_err(|e| e.to_string())?;
                        let r = side.remote()?;
                        side.qp().write(seq, &side.buf, 0..size, r).map_err(|e| e.to_string())?;
                    }
                }
                wait_answer(side, test.op, size, mark(seq))
            };
            for _ in 0..p.warmup {
                round(side, seq)?;
                seq += 1;
            }
            let clock = Clock::new(p);
            while !clock.done(m.msgs) {
                let t0 = now();
                if round(side, seq)? {
                    m.samples.push(u64::try_from(t0.elapsed().as_nanos() / 2).unwrap_or(u64::MAX));
                    m.msgs += 1;
                } else {
                    m.lost += 1;
                }
                seq += 1;
            }
            m.seconds = clock.start.elapsed().as_secs_f64();
            m.bytes = m.msgs * size as u64;
        }
        (Pattern::RoundTrip, Op::Read) => {
            let r = side.remote()?;
            for k in 0..p.warmup {
                side.qp().read(k, &side.buf, 0..size, r.at(0)).map_err(|e| e.to_string())?;
                side.next()?;
            }
            let clock = Clock::new(p);
            while !clock.done(m.msgs) {
                let t0 = now();
                side.qp().read(m.msgs, &side.buf, 0..size, r.at(0)).map_err(|e| e.to_string())?;
                side.next()?;
                m.samples.push(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
                m.msgs += 1;
            }
            m.seconds = clock.start.elapsed().as_secs_f64();
            m.bytes = m.msgs * size as u64;
        }
        (Pattern::Stream | Pattern::BiStream, _) => {
            let bi = test.pattern == Pattern::BiStream;
            if bi {
                for k in 0..side.recv_slots() {
                    side.post_recv(k)?;
                }
            }
            let window = u64::from(p.depth);
            // Counted in completions: warm-up first, then the measured phase.
            let (mut posted, mut done, mut received) = (0u64, 0u64, 0u64);
            let mut phase: Option<(Clock, u64, u64)> = None;
            loop {
                if phase.is_none() && done >= p.warmup {
                    phase = Some((Clock::new(p), done, received));
                }
                if let Some((clock, from, _)) = &phase
                    && clock.done(done - from)
                {
                    break;
                }
                // Post lists: work requests go out in groups of `post_list`.
                let list = u64::from(p.post_list);
                let before = posted;
                while posted - done + list <= window {
                    for _ in 0..list {
                        post_stream(side, test.op, size, posted)?;
                        posted += 1;
                    }
                }
                // Bursts after the window first filled: what a post list changes.
                let burst = posted - before;
                if burst > 0 && before > 0 {
                    let (lo, hi) = m.applied.post_burst.unwrap_or((burst, burst));
                    m.applied.post_burst = Some((lo.min(burst), hi.max(burst)));
                }
                let wc = side.next()?;
                if wc.opcode == WcOpcode::Recv {
                    received += 1;
                    side.post_recv(wc.wr_id)?;
                } else {
                    done += 1;
                }
            }
            let (clock, from, received_from) = phase.ok_or("no measured phase")?;
            m.seconds = clock.start.elapsed().as_secs_f64();
            m.msgs = done - from;
            m.bytes = (m.msgs + received - received_from) * size as u64;
            m.total_posted = posted;
            // Let the window drain so the next test starts clean.
            while done < posted {
                let wc = side.next()?;
                if wc.opcode == WcOpcode::Recv {
                    side.post_recv(wc.wr_id)?;
                } else {
                    done += 1;
                }
            }
        }
        _ => return Err(format!("{}: no such pattern", test.name)),
    }
    Ok(m)
}

/// Posts streaming operation `k`.
fn post_stream(side: &Side, op: Op, size: usize, k: u64) -> Result<(), String> {
    let e = |e: uroce::Error| e.to_string();
    match op {
        Op::Send => side.send(k, size),
        Op::Write => side.qp_for(k).write(k, &side.buf, 0..size, side.remote()?).map_err(e),
        Op::Read => side.qp_for(k).read(k, &side.buf, 0..size, side.remote()?.at(0)).map_err(e),
        Op::FetchAdd => {
            side.qp_for(k).fetch_add(k, &side.buf, 0, side.remote()?.at(0), 1).map_err(e)
        }
        Op::CompareSwap => {
            side.qp_for(k).compare_swap(k, &side.buf, 0, side.remote()?.at(0), k, k + 1).map_err(e)
        }
        _ => Err("not a streaming operation".into()),
    }
}

/// The byte the write-poll test puts last in the buffer for round `seq` (never 0).
fn mark(seq: u64) -> u8 {
    u8::try_from(seq % 255).unwrap_or(0) + 1
}

/// Waits for the peer's answer to a round: a receive (SEND), a receive with immediate (WRITE
/// with immediate), or the last byte of our buffer changing to `mark` (WRITE, polled).
/// Returns `false` when an unreliable transport lost the round (no answer within [`LOST`]).
fn wait_answer(side: &mut Side, op: Op, size: usize, mark: u8) -> Result<bool, String> {
    if op == Op::WritePoll {
        let start = now();
        let mut last = [0u8];
        loop {
            // Polling the CQ drives progress (and reaps the WRITE's own completion).
            let _ = side.ready()?;
            side.target.read(size - 1, &mut last).map_err(|e| e.to_string())?;
            if last[0] == mark {
                return Ok(true);
            }
            if start.elapsed() > STALL {
                return Err("the peer's WRITE never landed".into());
            }
        }
    }
    let limit = if side.qp_type == QpType::Rc { STALL } else { LOST };
    loop {
        let Some(wc) = side.next_within(limit)? else {
            if side.qp_type == QpType::Rc {
                return Err(format!("no answer for {STALL:?}"));
            }
            return Ok(false);
        };
        if matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
            side.post_recv(wc.wr_id)?;
            return Ok(true);
        }
    }
}

/// The server's loop: answers the client until `stop` is set. Returns the messages and bytes
/// it received.
pub(crate) fn server(
    side: &mut Side,
    test: &TestDef,
    p: &Params,
    stop: &AtomicBool,
) -> Result<(u64, u64), String> {
    let size = p.size;
    let (mut msgs, mut bytes) = (0u64, 0u64);
    let receives = matches!(test.op, Op::Send | Op::WriteImm) || test.pattern == Pattern::BiStream;
    if receives {
        for k in 0..side.recv_slots() {
            side.post_recv(k)?;
        }
    }
    let mut seq = 0u64;
    let mut posted = 0u64;
    let mut done = 0u64;
    let window = u64::from(p.depth);
    while !stop.load(Ordering::Acquire) {
        // The write-poll server answers each WRITE it sees land in its buffer.
        if test.op == Op::WritePoll {
            let _ = side.ready()?;
            let mut last = [0u8];
            side.target.read(size - 1, &mut last).map_err(|e| e.to_string())?;
            if last[0] == mark(seq) {
                side.buf.write(size - 1, &[mark(seq)]).map_err(|e| e.to_string())?;
                let r = side.remote()?;
                side.qp().write(seq, &side.buf, 0..size, r).map_err(|e| e.to_string())?;
                seq += 1;
                msgs += 1;
                bytes += size as u64;
            }
            continue;
        }
        if test.pattern == Pattern::BiStream {
            while posted - done < window {
                side.send(posted, size)?;
                posted += 1;
            }
        }
        let wcs = if side.events {
            let mut got =
                side.cq.wait(Some(Duration::from_millis(20))).map_err(|e| e.to_string())?;
            got.append(&mut side.pending);
            got
        } else {
            side.ready()?
        };
        for wc in wcs {
            if wc.status != WcStatus::SUCCESS {
                return Err(format!("{:?} completed with {}", wc.opcode, wc.status));
            }
            match wc.opcode {
                WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => {
                    msgs += 1;
                    let got =
                        if wc.grh { wc.byte_len as usize - GRH } else { wc.byte_len as usize };
                    bytes += if wc.opcode == WcOpcode::RecvRdmaWithImm {
                        size as u64
                    } else {
                        got as u64
                    };
                    side.post_recv(wc.wr_id)?;
                    if test.pattern == Pattern::PingPong {
                        if test.op == Op::WriteImm {
                            let r = side.remote()?;
                            side.qp()
                                .write_with_imm(seq, &side.buf, 0..size, r.at(0), 0)
                                .map_err(|e| e.to_string())?;
                        } else {
                            side.send(seq, size)?;
                        }
                        seq += 1;
                    }
                }
                _ => done += 1,
            }
        }
    }
    Ok((msgs, bytes))
}

/// The peer QP that stream work request `k` goes to (UD: round robin over the peer's QPs).
fn peer_qpn(qpns: &[Qpn], k: u64) -> Qpn {
    qpns[usize::try_from(k % qpns.len() as u64).unwrap_or(0)]
}
