//! The RDMA tests, both roles: a QP of the test's transport on each side, buffers, and the
//! loops that move data and time it.

use core::cell::Cell;
use core::time::Duration;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use uroce::{Endpoint, QpType, Qpn, RemoteAddr, RemoteMr};

use super::backend::{Completion, Device, Kind, Queues, SidePlan, Work};
use super::{Op, Params, Pattern, TestDef, now};

/// The GRH area in front of every UD receive.
const GRH: usize = 40;
/// How long a side waits for one completion before it calls the test failed.
const STALL: Duration = Duration::from_secs(10);
/// The harness reads the clock once in this many polls of a busy wait for a completion, and
/// once per this many completions of a timed stream: a read on each was a cost of the
/// harness, not of the stack measured.
const CLOCK_STRIDE: u32 = 64;
/// UC and UD may lose a message: a ping-pong round unanswered this long is counted lost and the
/// next one starts.
const LOST: Duration = Duration::from_millis(200);

/// One side's QPs and buffers for a test, on whichever backend, and the loops' bookkeeping.
pub(crate) struct Side {
    qp_type: QpType,
    queues: Box<dyn Queues>,
    /// QPs of the test: one, or `--qps` of them for streams (work spread round robin).
    qp_count: usize,
    /// Receive slots: `slots` of `slot` bytes per QP.
    slot: usize,
    slots: usize,
    /// UD: the peer's QPs.
    peer_qpns: Vec<Qpn>,
    /// The peer's buffer, for one-sided operations.
    remote: Option<RemoteMr>,
    events: bool,
    /// SENDs of at most this many bytes go inline.
    inline: usize,
    /// Completions taken but not yet consumed (in reverse: the next one last).
    pending: Vec<Completion>,
    /// Which QPs work was posted on (bit k: QP k; at most 64 QPs).
    used: Cell<u64>,
    /// SENDs posted inline.
    inlined: Cell<u64>,
    /// Polls of the CQ (and waits on it) so far.
    polls: u64,
}

impl Side {
    /// Creates this side's QPs and buffers on `device`; returns the endpoints to send to the
    /// peer.
    pub(crate) fn new(
        device: &dyn Device,
        test: &TestDef,
        p: &Params,
    ) -> Result<(Self, Vec<Endpoint>), String> {
        let qp_type = test.transport.ok_or("not an RDMA test")?;
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
        let plan = SidePlan {
            qp_type,
            qps: n,
            send_depth: depth * 2 + 8,
            recv_depth: u32::try_from(slots).unwrap_or(u32::MAX).saturating_add(8),
            cq_depth: (depth as usize * 2 + slots + 64) * n,
            // Atomics target an 8-byte word; everything else a message-sized buffer.
            buf_len: p.size.max(8),
            recv_len: slot * slots * n,
            max_inline: p.inline.max(256),
            mtu: p.mtu,
            events: p.events,
        };
        let (queues, endpoints) = device.side(&plan)?;
        let side = Self {
            qp_type,
            queues,
            qp_count: n,
            slot,
            slots,
            peer_qpns: Vec::new(),
            remote: None,
            events: p.events,
            inline: p.inline as usize,
            pending: Vec::new(),
            used: Cell::new(0),
            inlined: Cell::new(0),
            polls: 0,
        };
        Ok((side, endpoints))
    }

    /// Connects QP `i` to the peer's endpoint `i` (UD: an address handle to the peer).
    pub(crate) fn connect(&mut self, peers: &[Endpoint]) -> Result<(), String> {
        if peers.len() != self.qp_count {
            return Err(format!("the peer has {} QPs, this side {}", peers.len(), self.qp_count));
        }
        self.queues.connect(peers)?;
        let first = peers.first().ok_or("no peer endpoint")?;
        self.remote = first.regions.first().copied();
        if self.qp_type == QpType::Ud {
            self.peer_qpns = peers.iter().map(|p| p.qpn).collect();
        }
        Ok(())
    }

    /// Posts `work` on the QP of ping-pongs and round trips.
    fn post_first(&self, wr_id: u64, work: Work) -> Result<(), String> {
        self.used.set(self.used.get() | 1);
        self.queues.post(0, wr_id, work)
    }

    /// Posts stream work request `k` on its QP (round robin).
    fn post_nth(&self, k: u64, work: Work) -> Result<(), String> {
        let i = usize::try_from(k % self.qp_count as u64).unwrap_or(0);
        self.used.set(
            self.used.get() | u32::try_from(i).ok().and_then(|i| 1u64.checked_shl(i)).unwrap_or(0),
        );
        self.queues.post(i, k, work)
    }

    /// How many QPs work was posted on.
    pub(crate) fn qps_used(&self) -> usize {
        self.used.get().count_ones() as usize
    }

    /// How many SENDs went inline.
    pub(crate) fn inline_posts(&self) -> u64 {
        self.inlined.get()
    }

    /// How many times this side polled its CQ or waited on it.
    pub(crate) fn polls(&self) -> u64 {
        self.polls
    }

    /// Receive slots over all QPs.
    fn recv_slots(&self) -> u64 {
        (self.slots * self.qp_count) as u64
    }

    /// Posts the receive of slot `k` (modulo all slots) on the QP that slot belongs to.
    fn post_recv(&self, k: u64) -> Result<(), String> {
        let s = usize::try_from(k % self.recv_slots()).unwrap_or(0);
        self.queues.post_recv(s / self.slots, s as u64, s * self.slot, self.slot)
    }

    /// A SEND of `len` bytes as work request `wr_id` (UD: to the peer's QPs round robin).
    fn send(&self, wr_id: u64, len: usize) -> Result<(), String> {
        let inline = len <= self.inline;
        if inline {
            self.inlined.set(self.inlined.get() + 1);
        }
        let to = (!self.peer_qpns.is_empty()).then(|| peer_qpn(&self.peer_qpns, wr_id));
        self.post_nth(wr_id, Work::Send { len, inline, to })
    }

    fn remote(&self) -> Result<RemoteMr, String> {
        self.remote.ok_or_else(|| "the peer offered no region".to_string())
    }

    /// The start of the peer's region.
    fn remote_at0(&self) -> Result<RemoteAddr, String> {
        Ok(self.remote()?.at(0))
    }

    /// The next completion, busy polling or sleeping on events; fails on an error status or a
    /// stall.
    fn next(&mut self) -> Result<Completion, String> {
        self.next_within(STALL)?.ok_or_else(|| format!("no completion for {STALL:?}"))
    }

    /// The next completion within `limit` (a wait for events checks it on every return, a
    /// busy poll once in [`CLOCK_STRIDE`] polls), or `None`.
    fn next_within(&mut self, limit: Duration) -> Result<Option<Completion>, String> {
        if self.pending.is_empty() {
            let start = now();
            // The limit is a stall's (seconds): the clock is read once in CLOCK_STRIDE
            // empty polls, not on each, which would lengthen every round of a busy poll.
            let mut empty: u32 = 0;
            while self.pending.is_empty() {
                self.polls += 1;
                if self.events {
                    self.queues.wait(limit, &mut self.pending)?;
                } else {
                    self.queues.poll(&mut self.pending)?;
                }
                empty = empty.wrapping_add(1);
                if self.pending.is_empty()
                    && (self.events || empty.is_multiple_of(CLOCK_STRIDE))
                    && start.elapsed() > limit
                {
                    return Ok(None);
                }
            }
            self.pending.reverse();
        }
        let wc = self.pending.pop().ok_or("no completion")?;
        if let Some(e) = wc.error {
            return Err(e);
        }
        Ok(Some(wc))
    }

    /// Takes whatever completions are ready, without waiting, into `out` (emptied first: a
    /// loop hands the same vector every time, so that a poll allocates nothing).
    fn ready(&mut self, out: &mut Vec<Completion>) -> Result<(), String> {
        self.polls += 1;
        out.clear();
        out.extend(self.pending.drain(..).rev());
        self.queues.poll(out)?;
        if let Some(e) = out.iter().find_map(|w| w.error.clone()) {
            return Err(e);
        }
        Ok(())
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
    /// Calls to [`Clock::done_streaming`] since it last read the clock.
    unread: Cell<u32>,
}

impl Clock {
    fn new(p: &Params) -> Self {
        Self { start: now(), limit: p.duration, iters: p.iters, unread: Cell::new(0) }
    }
    fn done(&self, n: u64) -> bool {
        match self.limit {
            Some(d) => self.start.elapsed() >= d,
            None => n >= self.iters,
        }
    }
    /// [`Clock::done`] for a stream, asked once per completion: a timed one reads the clock
    /// on every [`CLOCK_STRIDE`]th call only. A clock read per message was 6 % of the
    /// client's CPU at a million 64-byte messages a second, a cost of the harness, not of the
    /// stack measured (qperf and perftest end a timed run by a signal); the phase overruns its
    /// duration by at most that many completions, microseconds, and its rate is computed from
    /// the time it really took.
    fn done_streaming(&self, n: u64) -> bool {
        if self.limit.is_some() {
            let calls = self.unread.get() + 1;
            if calls < CLOCK_STRIDE {
                self.unread.set(calls);
                return false;
            }
            self.unread.set(0);
        }
        self.done(n)
    }
}

/// The client's loop. Warm-up iterations come first and are not measured.
pub(crate) fn client(side: &mut Side, test: &TestDef, p: &Params) -> Result<Measured, String> {
    let size = p.size;
    let mut m = Measured::default();
    match (test.pattern, test.op) {
        (Pattern::PingPong, Op::Send | Op::WriteImm | Op::WritePoll) => {
            // The answers' receives, as many as the queue has slots for (a 4 MiB round has
            // fewer slots than the window: 256 MiB of them at most); a polled WRITE's answer
            // takes none.
            if test.op != Op::WritePoll {
                for k in 0..u64::from(p.depth).min(side.recv_slots()) {
                    side.post_recv(k)?;
                }
            }
            let mut seq: u64 = 0;
            // The receive the last answer took, posted again once the next message has gone:
            // as the server does, so that no repost waits in a round trip (every other slot
            // is posted, and the answer finds one either way).
            let mut repost: Option<u64> = None;
            let mut round = |side: &mut Side, seq: u64| -> Result<bool, String> {
                match test.op {
                    Op::Send => side.send(seq, size)?,
                    Op::WriteImm => {
                        let to = side.remote_at0()?;
                        side.post_first(seq, Work::Write { len: size, to, imm: Some(0) })?;
                    }
                    _ => {
                        side.queues.write_buf(size - 1, &[mark(seq)])?;
                        let to = side.remote_at0()?;
                        side.post_first(seq, Work::Write { len: size, to, imm: None })?;
                    }
                }
                if let Some(k) = repost.take() {
                    side.post_recv(k)?;
                }
                Ok(match wait_answer(side, test.op, size, mark(seq))? {
                    Answer::Came(taken) => {
                        repost = taken;
                        true
                    }
                    Answer::Lost => false,
                })
            };
            // UC and UD rounds may be lost, but a peer that answers none for a stall's time
            // is gone (a server killed under a count-bound run left its client spinning for
            // ever: the count is of answered rounds).
            let mut unanswered: u32 = 0;
            let mut answered = |ok: bool| {
                unanswered = if ok { 0 } else { unanswered + 1 };
                if LOST * unanswered < STALL {
                    return Ok(());
                }
                Err(format!("the peer stopped answering: {unanswered} rounds in a row unanswered"))
            };
            for _ in 0..p.warmup {
                answered(round(side, seq)?)?;
                seq += 1;
            }
            let clock = Clock::new(p);
            while !clock.done(m.msgs) {
                let t0 = now();
                let ok = round(side, seq)?;
                if ok {
                    m.samples.push(u64::try_from(t0.elapsed().as_nanos() / 2).unwrap_or(u64::MAX));
                    m.msgs += 1;
                } else {
                    m.lost += 1;
                }
                answered(ok)?;
                seq += 1;
            }
            m.seconds = clock.start.elapsed().as_secs_f64();
            m.bytes = m.msgs * size as u64;
        }
        (Pattern::RoundTrip, Op::Read) => {
            let from = side.remote_at0()?;
            for k in 0..p.warmup {
                side.post_first(k, Work::Read { len: size, from })?;
                side.next()?;
            }
            let clock = Clock::new(p);
            while !clock.done(m.msgs) {
                let t0 = now();
                side.post_first(m.msgs, Work::Read { len: size, from })?;
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
                    && clock.done_streaming(done - from)
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
                if wc.kind == Kind::Recv {
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
                if wc.kind == Kind::Recv {
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
    let work = match op {
        Op::Send => return side.send(k, size),
        Op::Write => Work::Write { len: size, to: side.remote()?.into(), imm: None },
        Op::Read => Work::Read { len: size, from: side.remote_at0()? },
        Op::FetchAdd => Work::FetchAdd { at: side.remote_at0()? },
        Op::CompareSwap => Work::CompareSwap { at: side.remote_at0()?, compare: k, swap: k + 1 },
        _ => return Err("not a streaming operation".into()),
    };
    side.post_nth(k, work)
}

/// The byte the write-poll test puts last in the buffer for round `seq` (never 0).
fn mark(seq: u64) -> u8 {
    u8::try_from(seq % 255).unwrap_or(0) + 1
}

/// How a ping-pong round ended.
enum Answer {
    /// The peer answered; the slot of the receive the answer took, if it took one.
    Came(Option<u64>),
    /// No answer came in time (UC and UD lose messages).
    Lost,
}

/// Waits for the peer's answer to a round: a receive (SEND), a receive with immediate (WRITE
/// with immediate), or the last byte of our buffer changing to `mark` (WRITE, polled).
/// [`Answer::Lost`] when an unreliable transport lost the round (no answer within [`LOST`]).
fn wait_answer(side: &mut Side, op: Op, size: usize, mark: u8) -> Result<Answer, String> {
    if op == Op::WritePoll {
        let start = now();
        let mut last = [0u8];
        let mut reaped = Vec::new();
        loop {
            // Polling the CQ drives progress (and reaps the WRITE's own completion).
            side.ready(&mut reaped)?;
            side.queues.read_target(size - 1, &mut last)?;
            if last[0] == mark {
                return Ok(Answer::Came(None));
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
            return Ok(Answer::Lost);
        };
        if matches!(wc.kind, Kind::Recv | Kind::RecvImm) {
            return Ok(Answer::Came(Some(wc.wr_id)));
        }
    }
}

/// The server's receives, every slot posted before it tells the client to go: on UC and UD a
/// message that arrives before its receive is lost (a starved server thread once lost all 300
/// of a UD stream so).
pub(crate) fn server_ready(side: &Side, test: &TestDef) -> Result<(), String> {
    let receives = matches!(test.op, Op::Send | Op::WriteImm) || test.pattern == Pattern::BiStream;
    if receives {
        for k in 0..side.recv_slots() {
            side.post_recv(k)?;
        }
    }
    Ok(())
}

/// The server's loop: answers the client until `stop` is set ([`server_ready`] first). Returns the messages and bytes
/// it received.
pub(crate) fn server(
    side: &mut Side,
    test: &TestDef,
    p: &Params,
    stop: &AtomicBool,
) -> Result<(u64, u64), String> {
    let size = p.size;
    let (mut msgs, mut bytes) = (0u64, 0u64);
    let mut seq = 0u64;
    let mut posted = 0u64;
    let mut done = 0u64;
    let window = u64::from(p.depth);
    if test.passive_target() {
        while !stop.load(Ordering::Acquire) {
            #[expect(clippy::disallowed_methods, reason = "a passive target waits for the end")]
            std::thread::sleep(Duration::from_millis(1));
        }
        return Ok((0, 0));
    }
    let mut wcs = Vec::new();
    while !stop.load(Ordering::Acquire) {
        // The write-poll server answers each WRITE it sees land in its buffer.
        if test.op == Op::WritePoll {
            side.ready(&mut wcs)?;
            let mut last = [0u8];
            side.queues.read_target(size - 1, &mut last)?;
            if last[0] == mark(seq) {
                side.queues.write_buf(size - 1, &[mark(seq)])?;
                let to = side.remote_at0()?;
                side.post_first(seq, Work::Write { len: size, to, imm: None })?;
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
        if side.events {
            wcs.clear();
            wcs.extend(side.pending.drain(..).rev());
            side.queues.wait(Duration::from_millis(20), &mut wcs)?;
        } else {
            side.ready(&mut wcs)?;
        }
        for wc in wcs.drain(..) {
            if let Some(e) = wc.error {
                return Err(e);
            }
            match wc.kind {
                Kind::Recv | Kind::RecvImm => {
                    msgs += 1;
                    let got =
                        if wc.grh { wc.byte_len as usize - GRH } else { wc.byte_len as usize };
                    bytes += if wc.kind == Kind::RecvImm { size as u64 } else { got as u64 };
                    // A ping-pong's answer first, then the receive again: every other slot is
                    // posted ([`server_ready`]), so the next message finds one either way,
                    // and the answer does not wait for the repost.
                    if test.pattern == Pattern::PingPong {
                        if test.op == Op::WriteImm {
                            let to = side.remote_at0()?;
                            side.post_first(seq, Work::Write { len: size, to, imm: Some(0) })?;
                        } else {
                            side.send(seq, size)?;
                        }
                        seq += 1;
                    }
                    side.post_recv(wc.wr_id)?;
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
