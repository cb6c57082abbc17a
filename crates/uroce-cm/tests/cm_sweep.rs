//! The CM in virtual time between two hosts over the simulator's fabric, whose links drop,
//! duplicate and reorder MADs: handshakes, rejections and releases for many seeds at 0–10 %
//! loss, every invariant checked; peers that vanish mid-handshake or mid-release, where both
//! sides must hear of the failure; and a peer that floods requests, which gets its share and
//! no more.

#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::cast_possible_truncation, reason = "small test indices and seeds")]

use std::collections::HashMap;
use std::net::IpAddr;

use uroce_cm::{
    AcceptParams, Cm, CommId, Config, ConnectParams, Duration, Event, Instant, RequestInfo,
};
use uroce_sim::{CmNode, Fabric, Faults, LinkConfig};
use uroce_wire::cm::{CmMad, Message, TransportType, reason};
use uroce_wire::{Psn, Qpn};

const SERVICE: u64 = 0x0106_1c06;

/// Two CMs, A (node 0, 10.0.0.1) and B (node 1, 10.0.0.2), on links with a 5 µs delay, up to
/// `jitter_us` more (which reorders), and `faults`.
fn net(seed: u64, faults: Faults, jitter_us: u64) -> Fabric<CmNode> {
    let mut f = Fabric::new(seed);
    let link = LinkConfig::default()
        .delay(Duration::from_micros(5))
        .jitter(Duration::from_micros(jitter_us))
        .faults(faults, Duration::ZERO);
    f.set_all_links(link);
    for (addr, prefix, id_seed) in
        [("10.0.0.1", 1, seed as u32), ("10.0.0.2", 2, (seed >> 7) as u32)]
    {
        let cm = Cm::new(Config::new(prefix, id_seed, 0x1000 + u64::from(prefix)));
        f.add_node(CmNode::new(addr.parse().unwrap(), cm));
    }
    f
}

fn perfect(seed: u64) -> Fabric<CmNode> {
    net(seed, Faults::default(), 0)
}

fn addrs(f: &Fabric<CmNode>) -> (IpAddr, IpAddr) {
    use uroce_sim::Node;
    (f[0].addr(), f[1].addr())
}

/// Cuts every link (both hosts vanish from the network), or heals them.
fn cut(f: &mut Fabric<CmNode>, cut: bool) {
    let loss = if cut { 1.0 } else { 0.0 };
    f.set_all_links(LinkConfig::default().delay(Duration::from_micros(5)).loss(loss));
}

/// Every DREP carries the transaction ID of the DREQ it answers (IBA 12.6.11), checked on
/// everything the CMs sent.
fn check_drep_tids(f: &Fabric<CmNode>, seed: u64) {
    let mut dreq_tids: HashMap<(usize, CommId), u64> = HashMap::new();
    for sent in f.sent() {
        let Ok(m) = CmMad::parse(&sent.datagram.payload) else { continue };
        match m.message {
            Message::Dreq(d) => {
                dreq_tids.insert((sent.from, d.local_comm_id), m.tid);
            }
            Message::Drep(d) => {
                if let Some(&t) = dreq_tids.get(&(1 - sent.from, d.remote_comm_id)) {
                    assert_eq!(m.tid, t, "seed {seed}: a DREP carries its DREQ's transaction ID");
                }
            }
            _ => {}
        }
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
fn run(seed: u64, faults: Faults, jitter_us: u64, conns: u32) {
    let mut net = net(seed, faults, jitter_us);
    net.record_sent(true);
    let (a, b) = addrs(&net);
    net[1].cm.listen(SERVICE, 16).unwrap();
    let mut active: HashMap<CommId, u32> = HashMap::new();
    let mut passive: HashMap<CommId, u32> = HashMap::new();
    let mut stories: Vec<Story> = (0..conns).map(|_| Story::default()).collect();
    for k in 0..conns {
        let now = net.now();
        let id = net[0].cm.connect(now, &connect_params(b, a, k)).unwrap();
        active.insert(id, k);
    }
    let deadline = Instant::ZERO + Duration::from_secs(600);
    while net.run_until(deadline, CmNode::has_events) {
        let now = net.now();
        for side in 0..2 {
            let events = core::mem::take(&mut net[side].events);
            for e in events {
                let cm = &mut net[side].cm;
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
    check_drep_tids(&net, seed);
    // Everything ends: TimeWait over, nothing left on either side.
    for side in 0..2 {
        assert!(net[side].cm.is_empty(), "seed {seed}: state left over: {:?}", net[side].cm);
    }
}

#[test]
fn handshakes_and_releases_hold_under_loss_duplication_and_reordering() {
    for (loss, dup, jitter_us) in
        [(0.0, 0.0, 0), (0.001, 0.01, 50), (0.01, 0.05, 500), (0.05, 0.05, 2000), (0.1, 0.1, 5000)]
    {
        for seed in 0..40 {
            run(seed * 7919 + 1, Faults { loss, dup, ..Faults::default() }, jitter_us, 6);
        }
    }
}

#[test]
fn the_timeouts_follow_the_response_timeout_fields() {
    // A REQ into the void: 1 + 15 sends, each wait 4.096 µs × 2^18 + 2 × 4.096 µs × 2^14.
    let mut net = perfect(1);
    cut(&mut net, true);
    let (a, b) = addrs(&net);
    let now = net.now();
    let id = net[0].cm.connect(now, &connect_params(b, a, 0)).unwrap();
    assert!(net.run_until(Instant::ZERO + Duration::from_secs(100), CmNode::has_events));
    assert_eq!(net[0].events, [Event::Unreachable { id }]);
    let wait = uroce_cm::exp_time(18) + uroce_cm::exp_time(14) + uroce_cm::exp_time(14);
    assert_eq!(net.now().as_nanos(), wait.as_nanos() * 16);
    assert_eq!(net[0].cm.counters().tx_mads, 16);
    assert!(net[0].cm.is_empty());
}

/// Runs until nothing is left to happen before `secs`, then collects every event.
fn run_out(net: &mut Fabric<CmNode>, secs: u64) {
    net.run_until(Instant::ZERO + Duration::from_secs(secs), |_| false);
    CmNode::has_events(net);
}

#[test]
fn a_peer_that_vanishes_is_reported_on_both_sides() {
    // B vanishes after receiving the REQ and accepting: A's REQs go unanswered (Unreachable),
    // B's REPs too (Unreachable).
    let mut net = perfect(3);
    let (a, b) = addrs(&net);
    net[1].cm.listen(SERVICE, 0).unwrap();
    let now = net.now();
    let ida = net[0].cm.connect(now, &connect_params(b, a, 0)).unwrap();
    assert!(net.run_until(Instant::ZERO + Duration::from_secs(1), CmNode::has_events));
    let Event::Request { id: idb, .. } = net[1].events.remove(0) else { panic!() };
    cut(&mut net, true);
    let now = net.now();
    net[1].cm.accept(now, idb, &accept_params()).unwrap();
    run_out(&mut net, 100);
    assert_eq!(net[0].events, [Event::Unreachable { id: ida }]);
    assert_eq!(net[1].events, [Event::Unreachable { id: idb }]);

    // A release into the void still releases (DREQ timeout: IBA 12.9.7).
    let mut net = perfect(4);
    let (ida, _) = establish(&mut net);
    cut(&mut net, true);
    let now = net.now();
    net[0].cm.disconnect(now, ida).unwrap();
    run_out(&mut net, 200);
    assert!(net[0].events.contains(&Event::Disconnected { id: ida }));
}

#[test]
fn a_peer_that_exits_after_answering_a_dreq_repeats_its_drep() {
    // A releases; B answers with a DREP that is lost and then exits, so nobody will answer A's
    // retried DREQ. The DREP B repeats on its way out releases A at once, not after its retries.
    let mut net = perfect(5);
    let (ida, _) = establish(&mut net);
    let dreps_dropped = std::rc::Rc::new(std::cell::Cell::new(0));
    let counter = std::rc::Rc::clone(&dreps_dropped);
    net.set_filter(1, 0, move |d, _| {
        let drep = CmMad::parse(&d.payload).is_ok_and(|m| matches!(m.message, Message::Drep(_)));
        if drep && counter.get() == 0 {
            counter.set(1);
            uroce_sim::Action::Drop
        } else {
            uroce_sim::Action::Pass
        }
    });
    let now = net.now();
    net[0].cm.disconnect(now, ida).unwrap();
    assert!(net.run_until(now + Duration::from_millis(10), CmNode::has_events));
    let Event::DisconnectRequest { id: idb, .. } = net[1].events.remove(0) else { panic!() };
    let now = net.now();
    net[1].cm.disconnect(now, idb).unwrap();
    let now = net.now();
    assert!(!net.run_until(now + Duration::from_millis(10), CmNode::has_events));
    assert_eq!(dreps_dropped.get(), 1, "the first DREP is lost");
    // Until A's retry could come (B's response timeout and twice the packet lifetime), B
    // should stay to answer it.
    let until = net[1].cm.answering_until().unwrap();
    assert!(until > net.now() + Duration::from_secs(1), "{until:?}");
    assert_eq!(net[0].cm.answering_until(), None, "A answered no DREQ");
    assert_eq!(net[1].cm.repeat_dreps(), 1);
    // B is gone from here on; A's DREQ retry would come only after about 1.1 s.
    net.set_link(0, 1, LinkConfig::default().loss(1.0));
    let now = net.now();
    assert!(net.run_until(now + Duration::from_millis(10), CmNode::has_events));
    assert_eq!(net[0].events, [Event::Disconnected { id: ida }]);
    assert_eq!(net[0].cm.counters().retransmits, 0);
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
fn establish(net: &mut Fabric<CmNode>) -> (CommId, CommId) {
    let (a, b) = addrs(net);
    net[1].cm.listen(SERVICE, 0).unwrap();
    let now = net.now();
    let ida = net[0].cm.connect(now, &connect_params(b, a, 0)).unwrap();
    let mut idb = None;
    loop {
        assert!(net.run_until(Instant::ZERO + Duration::from_secs(1), CmNode::has_events));
        let now = net.now();
        for e in core::mem::take(&mut net[1].events) {
            if let Event::Request { id, .. } = e {
                net[1].cm.accept(now, id, &accept_params()).unwrap();
                idb = Some(id);
            }
        }
        for e in core::mem::take(&mut net[0].events) {
            if let Event::Reply { id, .. } = e {
                net[0].cm.ready(id).unwrap();
            }
        }
        let established = Some(uroce_cm::ConnState::Established);
        if let Some(idb) = idb
            && net[1].cm.state(idb) == established
            && net[0].cm.state(ida) == established
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
    let mut net = perfect(6);
    let (ida, idb) = establish(&mut net);
    let (a, b) = addrs(&net);
    let now = net.now();
    net[0].cm.disconnect(now, ida).unwrap();
    net[1].cm.disconnect(now, idb).unwrap();
    let (to_b, dreq) = net[0].cm.poll_transmit().unwrap();
    assert_eq!(to_b, b);
    let dreq_tid = CmMad::parse(&dreq).unwrap().tid;
    cut(&mut net, true);
    let timewait = Some(uroce_cm::ConnState::TimeWait);
    let deadline = Instant::ZERO + Duration::from_secs(300);
    let both_in_timewait =
        |f: &mut Fabric<CmNode>| (f[0].cm.state(ida), f[1].cm.state(idb)) == (timewait, timewait);
    assert!(net.run_until(deadline, both_in_timewait));
    cut(&mut net, false);

    let now = net.now();
    net[1].cm.handle_mad(now, a, &dreq);
    let (to, answer) = net[1].cm.poll_transmit().unwrap();
    assert_eq!(to, a);
    let answer_mad = CmMad::parse(&answer).unwrap();
    assert!(matches!(answer_mad.message, Message::Drep(_)), "{answer_mad:?}");
    assert_eq!(answer_mad.tid, dreq_tid, "the DREP carries the DREQ's transaction ID");
    assert!(net[1].cm.poll_transmit().is_none());
    net[0].cm.handle_mad(now, b, &answer);
    assert!(net[0].cm.poll_transmit().is_none(), "a DREP in TimeWait is not answered");
}

#[test]
fn requests_nobody_listens_for_are_rejected_and_a_flood_is_bounded_by_the_backlog() {
    let mut net = perfect(5);
    let (a, b) = addrs(&net);
    let now = net.now();
    let id = net[0].cm.connect(now, &connect_params(b, a, 0)).unwrap();
    run_out(&mut net, 1);
    match &net[0].events[..] {
        [Event::Rejected { id: r, reason: why, .. }] => {
            assert_eq!((*r, *why), (id, reason::INVALID_SERVICE_ID));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(net[1].cm.counters().no_listener, 1);

    // Backlog 4, nobody answers: 4 requests wait, the other 16 are rejected.
    let mut net = perfect(6);
    net[1].cm.listen(SERVICE, 4).unwrap();
    for k in 0..20 {
        let now = net.now();
        net[0].cm.connect(now, &connect_params(b, a, k)).unwrap();
    }
    net.run_for(Duration::from_millis(100));
    CmNode::has_events(&mut net);
    let requests = net[1].events.iter().filter(|e| matches!(e, Event::Request { .. })).count();
    let rejected = net[0]
        .events
        .iter()
        .filter(|e| matches!(e, Event::Rejected { reason: reason::NO_RESOURCES, .. }))
        .count();
    assert_eq!((requests, rejected), (4, 16));
    assert_eq!(net[1].cm.connections(), 4);
}

#[test]
fn a_peer_that_floods_requests_gets_its_share_and_the_others_still_connect() {
    // A floods B with REQs, each from a new comm ID and QP, and never confirms a REP; B's
    // consumer accepts everything. A may hold 32 of B's 64 connections; past them B answers
    // "no resources" and counts each refusal. C, a second peer, then connects as usual.
    let mut net = perfect(9);
    let (a, b) = addrs(&net);
    let c: IpAddr = "10.0.0.3".parse().unwrap();
    net.add_node(CmNode::new(c, Cm::new(Config::new(3, 0x33, 0x1003))));
    let mut config = Config::new(2, 0x22, 0x1002);
    config.max_connections = 64;
    config.max_connections_per_remote = 32;
    net[1].cm = Cm::new(config);
    net[1].cm.listen(SERVICE, 0).unwrap();
    // Until `ms`: B accepts every request, C confirms every reply, A hears its REPs and its
    // rejections and does nothing with them.
    let serve = |net: &mut Fabric<CmNode>, ms| {
        let deadline = Instant::ZERO + Duration::from_millis(ms);
        while net.run_until(deadline, CmNode::has_events) {
            let now = net.now();
            for e in core::mem::take(&mut net[1].events) {
                if let Event::Request { id, .. } = e {
                    net[1].cm.accept(now, id, &accept_params()).unwrap();
                }
            }
            for e in core::mem::take(&mut net[2].events) {
                if let Event::Reply { id, .. } = e {
                    net[2].cm.ready(id).unwrap();
                }
            }
            net[0].events.clear();
        }
    };
    for k in 0..100 {
        let now = net.now();
        net[0].cm.connect(now, &connect_params(b, a, k)).unwrap();
    }
    serve(&mut net, 10);
    assert_eq!(net[1].cm.connections_from(a), 32);
    assert_eq!(net[1].cm.counters().remote_full, 68);
    assert_eq!(net[1].cm.counters().backlog_full, 0);

    let now = net.now();
    let idc = net[2].cm.connect(now, &connect_params(b, c, 0)).unwrap();
    serve(&mut net, 20);
    assert_eq!(net[2].cm.state(idc), Some(uroce_cm::ConnState::Established));
    assert_eq!(net[1].cm.connections_from(c), 1);

    // A's half-open connections time out on B (Unreachable after every REP retry), and with
    // them everything B kept about A.
    run_out(&mut net, 100);
    assert_eq!(net[1].cm.connections_from(a), 0);
}

#[test]
fn a_peer_that_floods_sidr_requests_gets_its_share() {
    let mut net = perfect(10);
    let (a, b) = addrs(&net);
    net[1].cm.listen(SERVICE, 0).unwrap();
    let n = uroce_cm::MAX_SIDR_PER_REMOTE + 10;
    for _ in 0..n {
        let now = net.now();
        net[0].cm.sidr_request(now, b, SERVICE, &[]).unwrap();
    }
    // B's consumer answers none of them.
    net.run_for(Duration::from_millis(1));
    assert_eq!(net[1].cm.sidr_requests_from(a), uroce_cm::MAX_SIDR_PER_REMOTE);
    assert_eq!(net[1].cm.counters().remote_full, 10);
}

#[test]
fn a_slow_consumer_gets_an_mra_and_no_second_request() {
    let mut net = perfect(8);
    let (a, b) = addrs(&net);
    net[1].cm.listen(SERVICE, 0).unwrap();
    let now = net.now();
    let ida = net[0].cm.connect(now, &connect_params(b, a, 0)).unwrap();
    // Nobody answers for 5 s: A sends the REQ again, B answers MRA, A waits longer.
    run_out(&mut net, 5);
    let requests = net[1].events.iter().filter(|e| matches!(e, Event::Request { .. })).count();
    assert_eq!(requests, 1);
    assert!(net[1].cm.counters().dup_req >= 1);
    assert_eq!(net[0].cm.state(ida), Some(uroce_cm::ConnState::MraReqRcvd));
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

/// B heard that connection `idb` was released (and nothing else), answers, and runs out.
fn answer_release(net: &mut Fabric<CmNode>, idb: CommId) {
    assert!(
        matches!(net[1].events.as_slice(), [Event::DisconnectRequest { id, .. }] if *id == idb)
    );
    net[1].events.clear();
    let now = net.now();
    net[1].cm.disconnect(now, idb).unwrap();
    run_out(net, 100);
}

/// A process that dies holding an established connection cannot send its DREQ (the kernel's
/// CM would). What its CM published ([`Cm::established`]) lets a survivor release it: the
/// peer itself takes the DREQ as received and its consumer hears the release; or another
/// endpoint of the dead one's address (here its successor) sends the DREQ under the dead
/// connection's comm ID, a few times at most, and forgets it once answered or given up.
#[test]
fn a_connection_of_a_process_that_died_is_released_by_a_survivor() {
    // The peer releases it.
    let mut net = perfect(6);
    let (a, b) = addrs(&net);
    let changes = net[0].cm.changes();
    let (ida, idb) = establish(&mut net);
    assert_ne!(net[0].cm.changes(), changes);
    let gone: Vec<_> = net[0].cm.established().collect();
    assert_eq!(gone.len(), 1);
    let gone = gone[0];
    assert_eq!((gone.id, gone.remote, gone.remote_id), (ida, b, idb));
    cut(&mut net, true); // A's process dies.
    let now = net.now();
    assert!(!net[1].cm.peer_gone(now, b, &gone), "not from the connection's peer address");
    assert!(net[1].cm.peer_gone(now, a, &gone));
    CmNode::has_events(&mut net);
    answer_release(&mut net, idb);
    assert_eq!(net[1].cm.established().count(), 0);
    assert!(net[1].cm.is_empty(), "the peer's side ends in TimeWait and is forgotten");
    assert_eq!(net[1].cm.counters().released_for_gone, 1);

    // Another endpoint of A's address releases it: A's successor, with a CM of its own.
    for lose_dreps in [false, true] {
        let mut net = perfect(7);
        net.record_sent(true);
        let (ida, idb) = establish(&mut net);
        let gone = net[0].cm.established().next().unwrap();
        net[0].cm = Cm::new(Config::new(3, 9, 0x1003));
        if lose_dreps {
            net.set_filter(1, 0, |d, _| {
                let drep =
                    CmMad::parse(&d.payload).is_ok_and(|m| matches!(m.message, Message::Drep(_)));
                if drep { uroce_sim::Action::Drop } else { uroce_sim::Action::Pass }
            });
        }
        let now = net.now();
        assert!(net[0].cm.release_gone(now, &gone));
        assert!(!net[0].cm.release_gone(now, &gone), "held already");
        assert!(net.run_until(now + Duration::from_millis(10), CmNode::has_events));
        answer_release(&mut net, idb);
        assert!(net[0].events.is_empty(), "the successor's consumer hears nothing of it");
        assert!(net[0].cm.is_empty(), "lose_dreps {lose_dreps}: it forgets the connection");
        let dreqs = net
            .sent()
            .iter()
            .filter(|s| s.from == 0)
            .filter_map(|s| CmMad::parse(&s.datagram.payload).ok())
            .filter(|m| matches!(m.message, Message::Dreq(d) if d.local_comm_id == ida))
            .count();
        assert_eq!(dreqs, if lose_dreps { 3 } else { 1 }, "lose_dreps {lose_dreps}");
    }
}
