//! An adversary between two communication managers (and a third address that only forges):
//! the bytes of an input choose what each consumer does (connect, accept, reject, leave a
//! request unanswered, disconnect, destroy, SIDR) and what the network does with every MAD
//! (deliver, lose, duplicate, reorder, corrupt, forge from a captured MAD or from nothing), and
//! the CM's promises are checked as the schedule runs:
//!
//! - every MAD a CM sends parses as the CM message it is meant to be;
//! - a CM never holds more than [`uroce_cm::Config::max_connections`] connections, nor more
//!   than [`uroce_cm::Config::max_connections_per_remote`] with any one address, whatever the
//!   peers send;
//! - one MAD in makes a bounded number of MADs and events out, and is refused under at most
//!   one counter;
//! - a connection the consumer started ends its handshake once: established, rejected or
//!   unreachable, and never two of them;
//! - once the input ends the network heals, the consumers answer and then destroy every
//!   connection, time runs past every timer, and both CMs hold nothing (no connection, SIDR
//!   request, timer or index entry): no state outlives its connection, whatever a peer did
//!   to it.
//!
//! [`run`] is what the `cm` fuzz target calls; the simulator's tests run it over seeded inputs.

use core::net::IpAddr;
use std::collections::{BTreeSet, VecDeque};

use uroce_cm::{AcceptParams, Cm, CommId, Config, ConnectParams, Event};
use uroce_engine::{Duration, Instant};
use uroce_wire::cm::{CmMad, TransportType};
use uroce_wire::mad::MAD_LEN;
use uroce_wire::{Psn, QKey, Qpn};

use crate::adversary::Input;
pub use crate::adversary::Violation;

/// The service each CM listens on.
const SERVICE: u64 = 0x0106_0000_0000_4791;
const MAX_CONNECTIONS: usize = 12;
/// Less than [`MAX_CONNECTIONS`], so that the forging third address can fill its share.
const MAX_CONNECTIONS_PER_REMOTE: usize = 8;
const BACKLOG: usize = 4;
/// MADs in flight towards each CM before the network loses more.
const MAX_IN_FLIGHT: usize = 256;
/// MADs one received MAD may cause (an answer, and a REJ or MRA at most) before that counts
/// as amplification.
const MAX_ANSWERS_PER_MAD: usize = 2;
/// MADs or events one step may produce at all: every connection and SIDR request timing out
/// at once, each sending once.
const MAX_OUTPUT_PER_STEP: usize = 8 * 4096;
const HEAL_ROUNDS: usize = 20_000;
const HISTORY: usize = 16;

/// How far a run got.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reached {
    /// Operations taken from the input.
    pub steps: usize,
    /// MADs handed to a CM.
    pub delivered: u64,
    /// Handshakes that ended established.
    pub established: u64,
    /// Handshakes that ended rejected.
    pub rejected: u64,
    /// Handshakes that ended unreachable.
    pub unreachable: u64,
    /// Requests a listener heard.
    pub requests: u64,
}

impl core::ops::AddAssign for Reached {
    fn add_assign(&mut self, o: Self) {
        self.steps += o.steps;
        self.delivered += o.delivered;
        self.established += o.established;
        self.rejected += o.rejected;
        self.unreachable += o.unreachable;
        self.requests += o.requests;
    }
}

/// Runs the schedule `input` describes and checks it; see the module documentation.
pub fn run(input: &[u8]) -> Result<Reached, Violation> {
    let mut w = World::new();
    let mut input = Input { bytes: input, at: 0 };
    while let Some(op) = input.next() {
        w.step(op, &mut input)?;
        w.reached.steps += 1;
        w.step += 1;
    }
    w.heal()?;
    Ok(w.reached)
}

fn addr(i: usize) -> IpAddr {
    IpAddr::from([10, 0, 0, [1, 2, 3][i.min(2)]])
}

/// What the consumer of one CM does with requests: answer at once, or leave them waiting.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Answer {
    Accept,
    Reject,
    Wait,
}

struct Side {
    cm: Cm,
    answer: Answer,
    /// Connections this consumer started whose handshake has not ended.
    connecting: BTreeSet<CommId>,
    /// Every connection the consumer has heard of and not destroyed.
    known: BTreeSet<CommId>,
    /// Requests heard and not answered.
    pending: VecDeque<CommId>,
    /// Comm IDs whose handshake ended (so a second ending is caught).
    ended: BTreeSet<CommId>,
}

struct World {
    sides: [Side; 2],
    /// `wire[i]`: MADs on their way to CM `i`, with their source address.
    wire: [VecDeque<(IpAddr, [u8; MAD_LEN])>; 2],
    history: VecDeque<[u8; MAD_LEN]>,
    now: Instant,
    step: usize,
    reached: Reached,
}

fn config(i: u8) -> Config {
    let mut c = Config::new(1 + i, 0x100 * (1 + u32::from(i)), 0x1000 + u64::from(i));
    // Short timers, so that a healing run reaches every timeout in few rounds.
    c.response_timeout = 4;
    c.max_cm_retries = 3;
    c.packet_lifetime = 2;
    c.max_connections = MAX_CONNECTIONS;
    c.max_connections_per_remote = MAX_CONNECTIONS_PER_REMOTE;
    c
}

impl World {
    fn new() -> Self {
        let sides = [0, 1].map(|i| {
            let mut cm = Cm::new(config(i));
            let _ = cm.listen(SERVICE, BACKLOG);
            Side {
                cm,
                answer: Answer::Accept,
                connecting: BTreeSet::new(),
                known: BTreeSet::new(),
                pending: VecDeque::new(),
                ended: BTreeSet::new(),
            }
        });
        Self {
            sides,
            wire: Default::default(),
            history: VecDeque::new(),
            now: Instant::ZERO,
            step: 0,
            reached: Reached::default(),
        }
    }

    fn violation(&self, rule: &'static str, detail: String) -> Violation {
        Violation { rule, detail, step: self.step }
    }

    fn step(&mut self, op: u8, input: &mut Input<'_>) -> Result<(), Violation> {
        let side = usize::from(input.byte() & 1);
        match op % 12 {
            0 | 1 => {
                let service =
                    if input.byte().is_multiple_of(4) { u64::from(input.u32()) } else { SERVICE };
                let p = connect_params(addr(side), addr(1 - side), service, input.u32());
                if let Ok(id) = self.sides[side].cm.connect(self.now, &p) {
                    self.sides[side].connecting.insert(id);
                    self.sides[side].known.insert(id);
                }
            }
            2 => {
                self.sides[side].answer = match input.byte() % 3 {
                    0 => Answer::Accept,
                    1 => Answer::Reject,
                    _ => Answer::Wait,
                };
            }
            3 => {
                let id = self.pick(side, input);
                if let Some(id) = id {
                    let _ = self.sides[side].cm.disconnect(self.now, id);
                }
            }
            4 => {
                if let Some(id) = self.pick(side, input) {
                    self.destroy(side, id);
                }
            }
            5 => {
                let _ = self.sides[side].cm.sidr_request(self.now, addr(1 - side), SERVICE, &[]);
            }
            6 | 7 => {
                if let Some((from, mad)) = self.wire[side].pop_front() {
                    self.deliver(side, from, &mad)?;
                }
            }
            8 => {
                // Lose one, or let a later one overtake it.
                let n = self.wire[side].len();
                let k = usize::from(input.byte());
                if n > 1 && k & 1 == 1 {
                    if let Some(m) = self.wire[side].remove(k % n) {
                        self.wire[side].push_front(m);
                    }
                } else {
                    self.wire[side].pop_front();
                }
            }
            9 => {
                if let Some(&(from, mad)) = self.wire[side].front() {
                    self.deliver(side, from, &mad)?; // a duplicate
                }
            }
            10 => {
                // Corrupt the next MAD, or forge one from a captured MAD, from either peer or
                // from the third address.
                let how = input.byte();
                let mut mad = match self.wire[side].pop_front() {
                    Some((_, m)) if how & 1 == 0 => m,
                    _ => {
                        let n = self.history.len();
                        let k = usize::from(input.byte());
                        if n == 0 { [0u8; MAD_LEN] } else { self.history[k % n] }
                    }
                };
                for _ in 0..=(how >> 5) {
                    let (at, value) = (usize::from(input.byte()), input.byte());
                    mad[at % MAD_LEN] = value;
                }
                let from = if how & 2 == 0 { addr(1 - side) } else { addr(2) };
                self.deliver(side, from, &mad)?;
            }
            _ => {
                let b = u64::from(input.byte());
                self.advance(Duration::from_micros((b + 1) * (b + 1) * 4))?;
            }
        }
        self.settle()
    }

    /// One of the connections the consumer knows, chosen by the input.
    fn pick(&self, side: usize, input: &mut Input<'_>) -> Option<CommId> {
        let known = &self.sides[side].known;
        let k = usize::from(input.byte());
        known.iter().nth(k % known.len().max(1)).copied()
    }

    fn destroy(&mut self, side: usize, id: CommId) {
        let s = &mut self.sides[side];
        s.cm.destroy(self.now, id);
        s.known.remove(&id);
        s.connecting.remove(&id);
        s.pending.retain(|&p| p != id);
    }

    fn deliver(&mut self, to: usize, from: IpAddr, mad: &[u8; MAD_LEN]) -> Result<(), Violation> {
        let cm = &mut self.sides[to].cm;
        let before = *cm.counters();
        cm.handle_mad(self.now, from, mad);
        let after = *cm.counters();
        self.reached.delivered += 1;
        let refusals = [
            after.drop_malformed - before.drop_malformed,
            after.drop_unsupported - before.drop_unsupported,
            after.drop_unknown_id - before.drop_unknown_id,
            after.drop_wrong_state - before.drop_wrong_state,
            after.no_listener - before.no_listener,
            after.backlog_full - before.backlog_full,
            after.remote_full - before.remote_full,
            after.stale - before.stale,
        ];
        // Only a MAD from an address adds to what that address holds.
        let (n, r) = (cm.connections_from(from), cm.sidr_requests_from(from));
        if n > MAX_CONNECTIONS_PER_REMOTE || r > uroce_cm::MAX_SIDR_PER_REMOTE {
            let detail = format!("CM {to} holds {n} connections and {r} SIDR requests of {from}");
            return Err(self.violation("one peer stays within its share", detail));
        }
        if refusals.iter().sum::<u64>() > 1 || after.rx_mads != before.rx_mads + 1 {
            let detail = format!("{before:?} → {after:?}");
            return Err(self.violation("a MAD is received once and refused at most once", detail));
        }
        if self.history.len() >= HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(*mad);
        // What the MAD made the CM send, before anything else can add to it.
        let answers = self.transmit(to)?;
        if answers > MAX_ANSWERS_PER_MAD {
            let detail = format!("CM {to} answered one MAD with {answers}");
            return Err(self.violation("bounded output", detail));
        }
        Ok(())
    }

    fn advance(&mut self, by: Duration) -> Result<(), Violation> {
        self.now += by;
        for s in &mut self.sides {
            if s.cm.poll_timeout().is_some_and(|t| t <= self.now) {
                s.cm.handle_timeout(self.now);
            }
        }
        Ok(())
    }

    /// Moves every MAD the CMs send onto the wire and lets the consumers answer their events,
    /// checking the bounds and the handshake rule.
    fn settle(&mut self) -> Result<(), Violation> {
        // Each round either moves something or ends; a consumer's answers and the MADs they
        // send settle within a few rounds.
        for _ in 0..64 {
            let mut moved = false;
            for i in 0..2 {
                moved |= self.transmit(i)? > 0;
                moved |= self.consume(i)?;
                let n = self.sides[i].cm.connections();
                if n > MAX_CONNECTIONS {
                    let detail = format!("CM {i} holds {n} connections");
                    return Err(self.violation("connections stay within the limit", detail));
                }
            }
            if !moved {
                return Ok(());
            }
        }
        Err(self.violation("the consumers and CMs settle", "still moving after 64 rounds".into()))
    }

    /// Puts what CM `i` sends on the wire; returns how many MADs.
    fn transmit(&mut self, i: usize) -> Result<usize, Violation> {
        let mut n = 0;
        while let Some((dst, mad)) = self.sides[i].cm.poll_transmit() {
            n += 1;
            if n > MAX_OUTPUT_PER_STEP {
                let detail = format!("CM {i} sent more than {MAX_OUTPUT_PER_STEP} MADs");
                return Err(self.violation("bounded output", detail));
            }
            if let Err(e) = CmMad::parse(&mad) {
                let detail = format!("CM {i} sent a MAD that does not parse: {e:?}");
                return Err(self.violation("every MAD sent is well formed", detail));
            }
            let Some(to) = (0..2).find(|&k| addr(k) == dst) else { continue };
            if self.wire[to].len() >= MAX_IN_FLIGHT {
                self.wire[to].pop_front();
            }
            self.wire[to].push_back((addr(i), mad));
        }
        Ok(n)
    }

    fn consume(&mut self, i: usize) -> Result<bool, Violation> {
        let mut n = 0;
        while let Some(e) = self.sides[i].cm.poll_event() {
            n += 1;
            if n > MAX_OUTPUT_PER_STEP {
                let detail = format!("CM {i} raised more than {MAX_OUTPUT_PER_STEP} events");
                return Err(self.violation("bounded output", detail));
            }
            self.on_event(i, e)?;
        }
        // The consumer answers requests as its policy says.
        let s = &mut self.sides[i];
        while s.answer != Answer::Wait
            && let Some(id) = s.pending.pop_front()
        {
            n += 1;
            let _ = match s.answer {
                Answer::Reject => s.cm.reject(self.now, id, 28, &[]),
                _ => s.cm.accept(self.now, id, &accept_params(id)),
            };
        }
        Ok(n > 0)
    }

    fn on_event(&mut self, i: usize, e: Event) -> Result<(), Violation> {
        let ended = match e {
            Event::Request { id, .. } => {
                self.reached.requests += 1;
                self.sides[i].known.insert(id);
                self.sides[i].pending.push_back(id);
                None
            }
            Event::Reply { id, .. } => {
                // The active consumer confirms (RTU), unless it is rejecting everything.
                let s = &mut self.sides[i];
                let _ = match s.answer {
                    Answer::Reject => s.cm.reject(self.now, id, 28, &[]),
                    _ => s.cm.ready(id),
                };
                if s.answer == Answer::Reject { Some(id) } else { None }
            }
            Event::Established { id } => {
                self.reached.established += 1;
                Some(id)
            }
            Event::Rejected { id, .. } => {
                self.reached.rejected += 1;
                Some(id)
            }
            Event::Unreachable { id } => {
                self.reached.unreachable += 1;
                Some(id)
            }
            Event::DisconnectRequest { id, .. } => {
                let _ = self.sides[i].cm.disconnect(self.now, id);
                None
            }
            Event::SidrRequest { id, .. } => {
                let _ = self.sides[i].cm.sidr_reply(id, 0, Qpn::from_masked(0x99), QKey(7), &[]);
                None
            }
            Event::Disconnected { .. }
            | Event::TimewaitExit { .. }
            | Event::SidrReply { .. }
            | Event::SidrTimeout { .. } => None,
        };
        let Some(id) = ended else { return Ok(()) };
        let s = &mut self.sides[i];
        s.connecting.remove(&id);
        if !s.ended.insert(id) {
            let detail = format!("CM {i}: connection {id:#x} ended its handshake again");
            return Err(self.violation("a handshake ends once", detail));
        }
        Ok(())
    }

    /// The network heals and the consumers answer, then release everything: both CMs must
    /// end up holding nothing.
    fn heal(&mut self) -> Result<(), Violation> {
        for s in &mut self.sides {
            s.answer = Answer::Accept;
        }
        self.run_out()?;
        // Every handshake the consumers started has ended by now.
        for (i, s) in self.sides.iter().enumerate() {
            if let Some(id) = s.connecting.first() {
                let state = s.cm.state(*id);
                let detail = format!("CM {i}: connection {id:#x} still in {state:?}");
                return Err(self.violation("every handshake ends once the network heals", detail));
            }
        }
        for i in 0..2 {
            let ids: Vec<CommId> = self.sides[i].known.iter().copied().collect();
            for id in ids {
                self.destroy(i, id);
            }
        }
        self.run_out()?;
        for (i, s) in self.sides.iter().enumerate() {
            if !s.cm.is_empty() {
                let n = s.cm.connections();
                let detail = format!(
                    "CM {i} holds state ({n} connections) after all were destroyed: {:?}",
                    s.cm
                );
                return Err(self.violation("no CM state outlives its connection", detail));
            }
        }
        Ok(())
    }

    /// Delivers everything and runs every timer until nothing is left to happen.
    fn run_out(&mut self) -> Result<(), Violation> {
        for _ in 0..HEAL_ROUNDS {
            self.step += 1;
            self.settle()?;
            let mut exchanged = 0;
            while let Some(to) = (0..2).find(|&k| !self.wire[k].is_empty()) {
                exchanged += 1;
                if exchanged > 4 * MAX_IN_FLIGHT {
                    let detail =
                        format!("{exchanged} MADs exchanged at {:?} with no timer", self.now);
                    return Err(self.violation("MADs answer MADs without end", detail));
                }
                if let Some((from, mad)) = self.wire[to].pop_front() {
                    self.deliver(to, from, &mad)?;
                }
                self.settle()?;
            }
            let next = self.sides.iter().filter_map(|s| s.cm.poll_timeout()).min();
            let Some(next) = next else { return Ok(()) };
            self.advance(next.saturating_since(self.now))?;
        }
        Err(self.violation("timers run out", format!("still due after {HEAL_ROUNDS} rounds")))
    }
}

fn connect_params(local: IpAddr, remote: IpAddr, service_id: u64, psn: u32) -> ConnectParams {
    ConnectParams {
        remote,
        local,
        service_id,
        qpn: Qpn::from_masked(0x40 + psn % 7),
        starting_psn: Psn::from_masked(psn),
        transport: TransportType::Rc,
        responder_resources: 2,
        initiator_depth: 2,
        path_mtu: 3,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: false,
        local_ack_timeout: 14,
        private_data: vec![0xAB; 8],
    }
}

fn accept_params(id: CommId) -> AcceptParams {
    AcceptParams {
        qpn: Qpn::from_masked(0x80 + id % 5),
        starting_psn: Psn::from_masked(id),
        responder_resources: 2,
        initiator_depth: 2,
        rnr_retry_count: 7,
        srq: false,
        private_data: vec![0xCD; 4],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_schedule_is_clean() {
        assert!(run(&[]).is_ok());
    }

    #[test]
    fn a_connection_is_established_and_released() {
        // Side 0 connects to the listener; the input ends and the network heals.
        let r = run(&[0, 0, 1]).unwrap_or_else(|v| panic!("{v}"));
        assert_eq!((r.requests, r.established), (1, 2), "{r:?}");
    }
}
