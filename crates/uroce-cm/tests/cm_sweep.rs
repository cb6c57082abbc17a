//! The CM in virtual time between two hosts over a network that drops, duplicates and reorders
//! MADs: handshakes, rejections and releases for many seeds at 0–10 % loss, every invariant
//! checked; and peers that vanish mid-handshake or mid-release, where both sides must hear
//! of the failure.

#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::cast_possible_truncation, reason = "small test indices and seeds")]

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use uroce_cm::{
    AcceptParams, Cm, CommId, Config, ConnectParams, Duration, Event, Instant, RequestInfo,
};
use uroce_engine::seeded::Rng;
use uroce_wire::cm::{TransportType, reason};
use uroce_wire::{Psn, Qpn};

#[derive(Clone, Copy)]
struct Faults {
    loss: f64,
    dup: f64,
    /// Up to this much extra delay per MAD: reorders.
    jitter_us: u64,
}

const SERVICE: u64 = 0x0106_1c06;

struct Host {
    addr: IpAddr,
    cm: Cm,
    events: Vec<Event>,
}

struct Net {
    now: Instant,
    hosts: [Host; 2],
    /// In flight: delivery time, sequence (for a stable order), destination host, MAD.
    flight: BTreeMap<(Instant, u64), (usize, IpAddr, [u8; 256])>,
    seq: u64,
    rng: Rng,
    faults: Faults,
    /// Host `i` is cut off from the network (vanished).
    cut: [bool; 2],
    /// The transaction ID of each DREQ sent, by its sender's comm ID: a DREP must carry it.
    dreq_tids: HashMap<u32, u64>,
}

impl Net {
    fn new(seed: u64, faults: Faults) -> Self {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let host = |addr, prefix, seed| Host {
            addr,
            cm: Cm::new(Config::new(prefix, seed, 0x1000 + u64::from(prefix))),
            events: Vec::new(),
        };
        Self {
            now: Instant::ZERO,
            hosts: [host(a, 1, seed as u32), host(b, 2, (seed >> 7) as u32)],
            flight: BTreeMap::new(),
            seq: 0,
            rng: Rng::new(seed),
            faults,
            cut: [false; 2],
            dreq_tids: HashMap::new(),
        }
    }

    fn index_of(&self, addr: IpAddr) -> usize {
        usize::from(self.hosts[1].addr == addr)
    }

    /// Moves every MAD the CMs want to send into the network.
    fn collect(&mut self) {
        for i in 0..2 {
            while let Some((to, mad)) = self.hosts[i].cm.poll_transmit() {
                let from = self.hosts[i].addr;
                let j = self.index_of(to);
                if self.cut[i] || self.cut[j] || self.rng.gen_bool(self.faults.loss) {
                    continue;
                }
                let copies = if self.rng.gen_bool(self.faults.dup) { 2 } else { 1 };
                for _ in 0..copies {
                    let delay = 5 + self.rng.gen_range(0..self.faults.jitter_us + 1);
                    self.seq += 1;
                    let at = self.now + Duration::from_micros(delay);
                    self.flight.insert((at, self.seq), (j, from, mad));
                }
            }
        }
    }

    /// Advances to the next MAD or timer; false when nothing is left to happen before `until`.
    fn step(&mut self, until: Instant) -> bool {
        self.collect();
        let next_mad = self.flight.keys().next().map(|k| k.0);
        let next_timer = self.hosts.iter().filter_map(|h| h.cm.poll_timeout()).min();
        let Some(next) = [next_mad, next_timer].into_iter().flatten().min() else {
            return false;
        };
        if next > until {
            return false;
        }
        self.now = self.now.max(next);
        while let Some(entry) = self.flight.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let (j, from, mad) = entry.remove();
            if let Ok(m) = uroce_wire::cm::CmMad::parse(&mad) {
                match m.message {
                    uroce_wire::cm::Message::Dreq(d) => {
                        self.dreq_tids.insert(d.local_comm_id, m.tid);
                    }
                    uroce_wire::cm::Message::Drep(d) => {
                        if let Some(&t) = self.dreq_tids.get(&d.remote_comm_id) {
                            assert_eq!(m.tid, t, "a DREP carries its DREQ's transaction ID");
                        }
                    }
                    _ => {}
                }
            }
            self.hosts[j].cm.handle_mad(self.now, from, &mad);
        }
        for h in &mut self.hosts {
            if h.cm.poll_timeout().is_some_and(|t| t <= self.now) {
                h.cm.handle_timeout(self.now);
            }
        }
        for h in &mut self.hosts {
            while let Some(e) = h.cm.poll_event() {
                h.events.push(e);
            }
        }
        true
    }
}

fn connect_params(remote: IpAddr, local: IpAddr, k: u32) -> ConnectParams {
    ConnectParams {
        remote,
        local,
        service_id: SERVICE,
        qpn: Qpn::from_masked(0x01_0000 + k),
        starting_psn: Psn::from_masked(0x10_0000 + k),
        transport: TransportType::Rc,
        responder_resources: 4,
        initiator_depth: 4,
        path_mtu: 5,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: false,
        local_ack_timeout: 14,
        private_data: vec![k as u8; 56],
    }
}

/// What one connection went through, as each side saw it.
#[derive(Default, Debug)]
struct Story {
    requested: u32,
    replied: u32,
    established: [u32; 2],
    rejected: u32,
    unreachable: [u32; 2],
    disconnected: [u32; 2],
    request: Option<RequestInfo>,
    reply_qpn: Option<(Qpn, Psn)>,
}

/// The consumer on both sides: B accepts every request but the third (rejected); A confirms
/// every reply; once established, A releases the even connections and B the odd ones; a
/// released side answers the peer's DREQ.
fn run(seed: u64, faults: Faults, conns: u32) {
    let mut net = Net::new(seed, faults);
    let (a, b) = (net.hosts[0].addr, net.hosts[1].addr);
    net.hosts[1].cm.listen(SERVICE, 16).unwrap();
    let mut active: HashMap<CommId, u32> = HashMap::new();
    let mut passive: HashMap<CommId, u32> = HashMap::new();
    let mut stories: Vec<Story> = (0..conns).map(|_| Story::default()).collect();
    for k in 0..conns {
        let id = net.hosts[0].cm.connect(net.now, &connect_params(b, a, k)).unwrap();
        active.insert(id, k);
    }
    let deadline = Instant::ZERO + Duration::from_secs(600);
    while net.step(deadline) {
        let now = net.now;
        for side in 0..2 {
            let events = core::mem::take(&mut net.hosts[side].events);
            for e in events {
                let cm = &mut net.hosts[side].cm;
                match e {
                    Event::Request { id, from, info } => {
                        assert_eq!((side, from), (1, a));
                        let k = u32::from(info.private_data[0]);
                        assert!(passive.insert(id, k).is_none());
                        let s = &mut stories[k as usize];
                        s.requested += 1;
                        // A REQ whose REJ was lost comes again once the passive side has
                        // forgotten it (after TimeWait): only a rejected one may.
                        assert!(
                            s.requested == 1 || k == 2,
                            "seed {seed}: connection {k} requested twice"
                        );
                        assert_eq!(info.remote_qpn, Qpn::from_masked(0x01_0000 + k));
                        assert_eq!(info.starting_psn, Psn::from_masked(0x10_0000 + k));
                        assert_eq!(&info.private_data[..56], &[k as u8; 56][..]);
                        s.request = Some(info);
                        if k == 2 {
                            cm.reject(now, id, reason::CONSUMER_REJECT, b"no").unwrap();
                        } else {
                            let p = AcceptParams {
                                qpn: Qpn::from_masked(0x02_0000 + k),
                                starting_psn: Psn::from_masked(0x20_0000 + k),
                                responder_resources: 4,
                                initiator_depth: 4,
                                rnr_retry_count: 7,
                                srq: false,
                                private_data: vec![k as u8; 8],
                            };
                            cm.accept(now, id, &p).unwrap();
                        }
                    }
                    Event::Reply { id, info } => {
                        assert_eq!(side, 0);
                        let k = active[&id];
                        let s = &mut stories[k as usize];
                        s.replied += 1;
                        assert_eq!(s.replied, 1, "seed {seed}: connection {k} replied twice");
                        assert_eq!(&info.private_data[..8], &[k as u8; 8][..]);
                        s.reply_qpn = Some((info.remote_qpn, info.starting_psn));
                        cm.ready(id).unwrap();
                    }
                    Event::Established { id } => {
                        let k = if side == 0 { active[&id] } else { passive[&id] };
                        stories[k as usize].established[side] += 1;
                        if (k % 2 == 0) == (side == 0) {
                            cm.disconnect(now, id).unwrap();
                        }
                    }
                    Event::Rejected { id, reason: why, private_data } => {
                        assert_eq!(side, 0);
                        let k = active[&id];
                        assert_eq!((k, why), (2, reason::CONSUMER_REJECT), "seed {seed}");
                        assert_eq!(&private_data[..2], b"no");
                        stories[k as usize].rejected += 1;
                    }
                    Event::Unreachable { id } => {
                        let k = if side == 0 { active[&id] } else { passive[&id] };
                        stories[k as usize].unreachable[side] += 1;
                    }
                    Event::DisconnectRequest { id, .. } => {
                        let k = if side == 0 { active[&id] } else { passive[&id] };
                        stories[k as usize].disconnected[side] += 1;
                        cm.disconnect(now, id).unwrap();
                    }
                    Event::Disconnected { id } => {
                        let k = if side == 0 { active[&id] } else { passive[&id] };
                        stories[k as usize].disconnected[side] += 1;
                    }
                    Event::TimewaitExit { .. } => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
    }
    for (k, s) in stories.iter().enumerate() {
        let k = k as u32;
        if faults.loss <= 0.1 {
            // 16 tries of each message at 10 % loss: failure is below 10^-15.
            if k == 2 {
                assert_eq!((s.rejected, s.established), (1, [0, 0]), "seed {seed}: {s:?}");
                continue;
            }
            assert_eq!(s.requested, 1, "seed {seed} conn {k}: {s:?}");
            assert_eq!(s.established, [1, 1], "seed {seed} conn {k}: {s:?}");
            assert_eq!(s.disconnected, [1, 1], "seed {seed} conn {k}: {s:?}");
            assert_eq!(s.unreachable, [0, 0], "seed {seed} conn {k}: {s:?}");
            // Both sides agree on QPNs and PSNs.
            assert_eq!(
                s.reply_qpn,
                Some((Qpn::from_masked(0x02_0000 + k), Psn::from_masked(0x20_0000 + k)))
            );
        }
    }
    // Everything ends: TimeWait over, nothing left on either side.
    for h in &net.hosts {
        assert_eq!(h.cm.connections(), 0, "seed {seed}: connections left over");
        assert!(h.cm.poll_timeout().is_none());
    }
}

#[test]
fn handshakes_and_releases_hold_under_loss_duplication_and_reordering() {
    for (loss, dup, jitter_us) in
        [(0.0, 0.0, 0), (0.001, 0.01, 50), (0.01, 0.05, 500), (0.05, 0.05, 2000), (0.1, 0.1, 5000)]
    {
        for seed in 0..40 {
            run(seed * 7919 + 1, Faults { loss, dup, jitter_us }, 6);
        }
    }
}

#[test]
fn the_timeouts_follow_the_response_timeout_fields() {
    // A REQ into the void: 1 + 15 sends, each wait 4.096 µs × 2^18 + 2 × 4.096 µs × 2^14.
    let mut net = Net::new(1, Faults { loss: 0.0, dup: 0.0, jitter_us: 0 });
    net.cut[1] = true;
    let (a, b) = (net.hosts[0].addr, net.hosts[1].addr);
    let id = net.hosts[0].cm.connect(net.now, &connect_params(b, a, 0)).unwrap();
    while net.step(Instant::ZERO + Duration::from_secs(100)) {}
    assert_eq!(net.hosts[0].events, [Event::Unreachable { id }]);
    let wait = uroce_cm::exp_time(18) + uroce_cm::exp_time(14) + uroce_cm::exp_time(14);
    assert_eq!(net.now.as_nanos(), wait.as_nanos() * 16);
    assert_eq!(net.hosts[0].cm.counters().tx_mads, 16);
    assert_eq!(net.hosts[0].cm.connections(), 0);
}

#[test]
fn a_peer_that_vanishes_is_reported_on_both_sides() {
    // B vanishes after receiving the REQ and accepting: A's REQs go unanswered (Unreachable),
    // B's REPs too (Unreachable).
    let mut net = Net::new(3, Faults { loss: 0.0, dup: 0.0, jitter_us: 0 });
    let (a, b) = (net.hosts[0].addr, net.hosts[1].addr);
    net.hosts[1].cm.listen(SERVICE, 0).unwrap();
    let ida = net.hosts[0].cm.connect(net.now, &connect_params(b, a, 0)).unwrap();
    while net.hosts[1].events.is_empty() {
        assert!(net.step(Instant::ZERO + Duration::from_secs(1)));
    }
    let Event::Request { id: idb, .. } = net.hosts[1].events.remove(0) else { panic!() };
    net.cut = [true, true];
    net.hosts[1].cm.accept(net.now, idb, &accept_params()).unwrap();
    while net.step(Instant::ZERO + Duration::from_secs(100)) {}
    assert_eq!(net.hosts[0].events, [Event::Unreachable { id: ida }]);
    assert_eq!(net.hosts[1].events, [Event::Unreachable { id: idb }]);

    // A release into the void still releases (DREQ timeout: IBA 12.9.7).
    let mut net = Net::new(4, Faults { loss: 0.0, dup: 0.0, jitter_us: 0 });
    let (ida, _) = establish(&mut net);
    net.cut = [true, true];
    net.hosts[0].cm.disconnect(net.now, ida).unwrap();
    while net.step(Instant::ZERO + Duration::from_secs(200)) {}
    assert!(net.hosts[0].events.contains(&Event::Disconnected { id: ida }));
}

fn accept_params() -> AcceptParams {
    AcceptParams {
        qpn: Qpn::from_masked(7),
        starting_psn: Psn::from_masked(7),
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        srq: false,
        private_data: Vec::new(),
    }
}

/// One connection from A to B, established on both sides over a perfect network.
fn establish(net: &mut Net) -> (CommId, CommId) {
    let (a, b) = (net.hosts[0].addr, net.hosts[1].addr);
    net.hosts[1].cm.listen(SERVICE, 0).unwrap();
    let ida = net.hosts[0].cm.connect(net.now, &connect_params(b, a, 0)).unwrap();
    let mut idb = None;
    loop {
        assert!(net.step(Instant::ZERO + Duration::from_secs(1)));
        let now = net.now;
        for e in core::mem::take(&mut net.hosts[1].events) {
            if let Event::Request { id, .. } = e {
                net.hosts[1].cm.accept(now, id, &accept_params()).unwrap();
                idb = Some(id);
            }
        }
        for e in core::mem::take(&mut net.hosts[0].events) {
            if let Event::Reply { id, .. } = e {
                net.hosts[0].cm.ready(id).unwrap();
            }
        }
        let established = Some(uroce_cm::ConnState::Established);
        if let Some(idb) = idb
            && net.hosts[1].cm.state(idb) == established
            && net.hosts[0].cm.state(ida) == established
        {
            return (ida, idb);
        }
    }
}

#[test]
fn a_late_dreq_after_both_releases_timed_out_is_answered_with_one_drep() {
    // Both ends send a DREQ at once into a partition; each DREQ times out and both wait in
    // TimeWait. The partition heals with a copy of A's DREQ still in flight: B must answer it
    // with a DREP, and A that DREP with nothing. The CM once answered a DREQ in TimeWait with
    // the last MAD it had sent, its own DREQ here, and the two ends exchanged DREQs for as
    // long as TimeWait lasted.
    use uroce_wire::cm::{CmMad, Message};
    let mut net = Net::new(6, Faults { loss: 0.0, dup: 0.0, jitter_us: 0 });
    let (ida, idb) = establish(&mut net);
    let (a, b) = (net.hosts[0].addr, net.hosts[1].addr);
    net.hosts[0].cm.disconnect(net.now, ida).unwrap();
    net.hosts[1].cm.disconnect(net.now, idb).unwrap();
    let (to_b, dreq) = net.hosts[0].cm.poll_transmit().unwrap();
    assert_eq!(to_b, b);
    let dreq_tid = CmMad::parse(&dreq).unwrap().tid;
    net.cut = [true, true];
    let timewait = Some(uroce_cm::ConnState::TimeWait);
    while (net.hosts[0].cm.state(ida), net.hosts[1].cm.state(idb)) != (timewait, timewait) {
        assert!(net.step(Instant::ZERO + Duration::from_secs(300)));
    }
    net.cut = [false, false];

    net.hosts[1].cm.handle_mad(net.now, a, &dreq);
    let (to, answer) = net.hosts[1].cm.poll_transmit().unwrap();
    assert_eq!(to, a);
    let answer_mad = CmMad::parse(&answer).unwrap();
    assert!(matches!(answer_mad.message, Message::Drep(_)), "{answer_mad:?}");
    assert_eq!(answer_mad.tid, dreq_tid, "the DREP carries the DREQ's transaction ID");
    assert!(net.hosts[1].cm.poll_transmit().is_none());
    net.hosts[0].cm.handle_mad(net.now, b, &answer);
    assert!(net.hosts[0].cm.poll_transmit().is_none(), "a DREP in TimeWait is not answered");
}

#[test]
fn requests_nobody_listens_for_are_rejected_and_a_flood_is_bounded_by_the_backlog() {
    let mut net = Net::new(5, Faults { loss: 0.0, dup: 0.0, jitter_us: 0 });
    let (a, b) = (net.hosts[0].addr, net.hosts[1].addr);
    let id = net.hosts[0].cm.connect(net.now, &connect_params(b, a, 0)).unwrap();
    while net.step(Instant::ZERO + Duration::from_secs(1)) {}
    match &net.hosts[0].events[..] {
        [Event::Rejected { id: r, reason: why, .. }] => {
            assert_eq!((*r, *why), (id, reason::INVALID_SERVICE_ID));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(net.hosts[1].cm.counters().no_listener, 1);

    // Backlog 4, nobody answers: 4 requests wait, the other 16 are rejected.
    let mut net = Net::new(6, Faults { loss: 0.0, dup: 0.0, jitter_us: 0 });
    net.hosts[1].cm.listen(SERVICE, 4).unwrap();
    for k in 0..20 {
        net.hosts[0].cm.connect(net.now, &connect_params(b, a, k)).unwrap();
    }
    while net.step(Instant::ZERO + Duration::from_millis(100)) {}
    let requests =
        net.hosts[1].events.iter().filter(|e| matches!(e, Event::Request { .. })).count();
    let rejected = net.hosts[0]
        .events
        .iter()
        .filter(|e| matches!(e, Event::Rejected { reason: reason::NO_RESOURCES, .. }))
        .count();
    assert_eq!((requests, rejected), (4, 16));
    assert_eq!(net.hosts[1].cm.connections(), 4);
}

#[test]
fn a_slow_consumer_gets_an_mra_and_no_second_request() {
    let mut net = Net::new(8, Faults { loss: 0.0, dup: 0.0, jitter_us: 0 });
    let (a, b) = (net.hosts[0].addr, net.hosts[1].addr);
    net.hosts[1].cm.listen(SERVICE, 0).unwrap();
    let ida = net.hosts[0].cm.connect(net.now, &connect_params(b, a, 0)).unwrap();
    // Nobody answers for 5 s: A sends the REQ again, B answers MRA, A waits longer.
    while net.step(Instant::ZERO + Duration::from_secs(5)) {}
    let requests =
        net.hosts[1].events.iter().filter(|e| matches!(e, Event::Request { .. })).count();
    assert_eq!(requests, 1);
    assert!(net.hosts[1].cm.counters().dup_req >= 1);
    assert_eq!(net.hosts[0].cm.state(ida), Some(uroce_cm::ConnState::MraReqRcvd));
}

#[test]
fn malformed_and_foreign_mads_are_counted_not_acted_on() {
    let mut cm = Cm::new(Config::new(1, 0, 1));
    let from: IpAddr = "10.0.0.9".parse().unwrap();
    cm.handle_mad(Instant::ZERO, from, &[0u8; 10]);
    let mut mad = uroce_wire::examples::sample_cm_messages()[0];
    mad[2] = 9; // class version
    cm.handle_mad(Instant::ZERO, from, &mad);
    let mut lap = uroce_wire::examples::sample_cm_messages()[3];
    lap[16..18].copy_from_slice(&uroce_wire::cm::attr::LAP.to_be_bytes());
    cm.handle_mad(Instant::ZERO, from, &lap);
    // An RTU for a connection this CM never had.
    cm.handle_mad(Instant::ZERO, from, &uroce_wire::examples::sample_cm_messages()[3]);
    let c = cm.counters();
    assert_eq!((c.rx_mads, c.drop_malformed, c.drop_unsupported, c.drop_unknown_id), (4, 2, 1, 1));
    assert!(cm.poll_event().is_none());
    // A DREQ for an unknown connection is answered with a DREP.
    cm.handle_mad(Instant::ZERO, from, &uroce_wire::examples::sample_cm_messages()[4]);
    let (to, drep) = cm.poll_transmit().unwrap();
    assert_eq!(to, from);
    assert_eq!(&drep[16..18], &uroce_wire::cm::attr::DREP.to_be_bytes());
}
