//! No input from the network panics the engine or makes it touch memory it must not: real
//! packets of a live connection, mutated and with their ICRC recomputed (so that they get past
//! the ICRC check and into the responder and completer), and arbitrary bytes, are fed to a
//! device in every QP state that receives; the target's memory outside the region the test's
//! own traffic writes stays untouched.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::cast_possible_truncation, reason = "small test values")]

use std::net::SocketAddr;

use proptest::prelude::*;
use uroce_engine::*;
use uroce_wire::ROCE_V2_PORT;
use uroce_wire::icrc::{self, PseudoHeader};

const BASE: [u64; 2] = [0x10_0000, 0x20_0000];
const LEN: u64 = 1 << 16;
/// The part of B's memory the legitimate traffic writes; the rest must stay zero.
const WRITABLE: u64 = 0x8000;

/// What the counters say became of one packet, checked against the engine's promise (every
/// refused packet increments exactly one named counter): `Err` says how it was broken.
fn fate(before: &Counters, after: &Counters) -> Result<(), String> {
    Counters::packet_fate(before, after).map(drop)
}

struct Side {
    dev: Device<VecMemory>,
    cq: CqHandle,
    qp: Qpn,
    mr: MemoryRegion,
}

fn pair() -> [Side; 2] {
    let addrs = ["127.0.0.2", "127.0.0.3"];
    let mut s: Vec<Side> = (0..2)
        .map(|i| {
            let mut mem = VecMemory::new();
            mem.insert(BASE[i], vec![0; LEN as usize]);
            let mut dev = Device::new(DeviceConfig::new(addrs[i].parse().unwrap(), i as u64), mem);
            let pd = dev.alloc_pd();
            let cq = dev.create_cq(4096).unwrap();
            let all = Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC;
            // B registers only the writable part for remote access.
            let len = if i == 1 { WRITABLE } else { LEN };
            let mr = dev.reg_mr(pd, BASE[i], len, all).unwrap();
            let init = QpInitAttr::new(QpType::Rc, pd, cq);
            let qp = dev.create_qp(init).unwrap();
            Side { dev, cq, qp, mr }
        })
        .collect();
    let (qpns, ips) = ([s[0].qp, s[1].qp], [s[0].dev.addr(), s[1].dev.addr()]);
    for (i, h) in s.iter_mut().enumerate() {
        let all = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        h.dev.init_qp(h.qp, all, QKey(0)).unwrap();
        let path = PathAttr {
            dest: ips[1 - i],
            dest_qpn: qpns[1 - i],
            mtu: Mtu::Mtu256,
            sq_psn: Psn::from_masked(100),
            rq_psn: Psn::from_masked(100),
        };
        let reliability = Reliability {
            timeout: 4,
            retry_cnt: 2,
            rnr_retry: 2,
            min_rnr_timer: RnrTimer::from_masked(1),
            max_rd_atomic: 4,
            max_dest_rd_atomic: 4,
        };
        h.dev.connect_qp(h.qp, &path, &reliability).unwrap();
    }
    s.try_into().ok().unwrap()
}

/// The packets A sends for a mix of operations, before any reach B.
fn requests(s: &mut [Side; 2]) -> Vec<(SocketAddr, Vec<u8>)> {
    let (mr_a, mr_b) = (s[0].mr, s[1].mr);
    for k in 0..4 {
        let sge = Sge { addr: BASE[1] + k * 0x1000, length: 0x1000, lkey: mr_b.lkey };
        s[1].dev.post_recv(s[1].qp, RecvWr { wr_id: k, sg_list: vec![sge].into() }).unwrap();
    }
    let remote = Some(RemoteAddr { addr: BASE[1] + 0x4000, rkey: mr_b.rkey });
    let sge = |len| vec![Sge { addr: BASE[0], length: len, lkey: mr_a.lkey }];
    let mut wrs = vec![
        SendWr::new(1, WrOpcode::Send, sge(600)),
        SendWr::new(2, WrOpcode::RdmaWrite, sge(700)),
        SendWr::new(3, WrOpcode::RdmaRead, sge(900)),
        SendWr::new(4, WrOpcode::AtomicFetchAndAdd, sge(8)),
        SendWr::new(5, WrOpcode::SendWithImm, sge(10)),
        SendWr::new(6, WrOpcode::RdmaWriteWithImm, sge(300)),
    ];
    for wr in &mut wrs[1..] {
        wr.remote = remote;
        wr.imm = Some([1, 2, 3, 4]);
    }
    for wr in wrs {
        s[0].dev.post_send(s[0].qp, wr).unwrap();
    }
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while let Some(tx) = s[0].dev.poll_transmit(Instant::ZERO, &mut buf) {
        out.push((SocketAddr::new(s[0].dev.addr(), tx.src_port), buf.clone()));
    }
    out
}

/// Recomputes the ICRC of a (mutated) packet so that it passes the receiver's check.
fn reseal(src: SocketAddr, dst: SocketAddr, packet: &mut [u8]) {
    if packet.len() < 16 {
        return;
    }
    let pseudo = PseudoHeader::for_endpoints(src, dst).unwrap();
    let n = packet.len() - 4;
    let crc = icrc::compute(&pseudo, &packet[..n]).unwrap();
    packet[n..].copy_from_slice(&icrc::to_wire(crc));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn mutated_packets_never_panic_or_write_outside_the_region(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..3),
        reorder in any::<prop::sample::Index>(),
        to_error in any::<bool>(),
    ) {
        let mut s = pair();
        let mut packets = requests(&mut s);
        let dst = SocketAddr::new(s[1].dev.addr(), ROCE_V2_PORT);
        for (which, at, value) in edits {
            let n = packets.len();
            let (src, p) = &mut packets[which.index(n)];
            let i = at.index(p.len());
            p[i] = value;
            reseal(*src, dst, p);
        }
        for cut in cuts {
            let n = packets.len();
            let (src, p) = &mut packets[cut.index(n)];
            let keep = cut.index(p.len() + 1);
            p.truncate(keep);
            reseal(*src, dst, p);
        }
        let k = reorder.index(packets.len());
        packets.rotate_left(k);
        if to_error {
            s[1].dev.modify_qp(s[1].qp, &QpAttr { state: Some(QpState::Error), ..QpAttr::default() }).unwrap();
        }
        let mut buf = Vec::new();
        let mut wcs = Vec::new();
        let mut now = Instant::ZERO;
        for round in 0..3 {
            for (src, p) in &packets {
                let before = *s[1].dev.counters();
                s[1].dev.handle_datagram(now, &RxInfo::new(*src, s[1].dev.addr()), p);
                // Accepted, or refused under exactly one named rule.
                let r = fate(&before, s[1].dev.counters());
                prop_assert!(r.is_ok(), "{:?}", r);
            }
            // Whatever B answers goes back to A, and A's answers to B.
            for _ in 0..4 {
                let mut to_a = Vec::new();
                while let Some(tx) = s[1].dev.poll_transmit(now, &mut buf) {
                    to_a.push((SocketAddr::new(s[1].dev.addr(), tx.src_port), buf.clone()));
                }
                for (src, p) in &to_a {
                    s[0].dev.handle_datagram(now, &RxInfo::new(*src, s[0].dev.addr()), p);
                }
                while let Some(tx) = s[0].dev.poll_transmit(now, &mut buf) {
                    let src = SocketAddr::new(s[0].dev.addr(), tx.src_port);
                    s[1].dev.handle_datagram(now, &RxInfo::new(src, s[1].dev.addr()), &buf);
                }
            }
            now += Duration::from_millis(10 * (round + 1));
            s[0].dev.handle_timeout(now);
            s[1].dev.handle_timeout(now);
            s[0].dev.poll_cq(s[0].cq, usize::MAX, &mut wcs);
            s[1].dev.poll_cq(s[1].cq, usize::MAX, &mut wcs);
        }
        let mem = s[1].dev.memory().buffer(BASE[1]).unwrap();
        prop_assert!(mem[WRITABLE as usize..].iter().all(|&b| b == 0), "wrote outside the registered region");
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400), seal in any::<bool>()) {
        let mut s = pair();
        let src = SocketAddr::new(s[0].dev.addr(), 0xC000);
        let dst = SocketAddr::new(s[1].dev.addr(), ROCE_V2_PORT);
        let mut p = bytes;
        // Aim some at the live QP so they get past the QPN lookup.
        if seal && p.len() >= 16 {
            p[5..8].copy_from_slice(&s[1].qp.get().to_be_bytes()[1..]);
            reseal(src, dst, &mut p);
        }
        let before = *s[1].dev.counters();
        s[1].dev.handle_datagram(Instant::ZERO, &RxInfo::new(src, s[1].dev.addr()), &p);
        let r = fate(&before, s[1].dev.counters());
        prop_assert!(r.is_ok(), "{:?}", r);
        let mut buf = Vec::new();
        while s[1].dev.poll_transmit(Instant::ZERO, &mut buf).is_some() {}
        s[1].dev.handle_timeout(Instant::from_nanos(1 << 40));
    }
}

/// A device with one UD QP in RTS, attached to 239.0.0.9, with `recvs` receives of 256 bytes
/// at the start of its memory; only those bytes are registered.
fn ud_target(recvs: u64) -> (Device<VecMemory>, Qpn) {
    let mut mem = VecMemory::new();
    mem.insert(BASE[1], vec![0; LEN as usize]);
    let mut dev = Device::new(DeviceConfig::new("127.0.0.3".parse().unwrap(), 5), mem);
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(64).unwrap();
    let mr = dev.reg_mr(pd, BASE[1], recvs * 256, Access::LOCAL_WRITE).unwrap();
    let init = QpInitAttr::new(QpType::Ud, pd, cq);
    let qp = dev.create_qp(init).unwrap();
    dev.init_qp(qp, Access::NONE, QKey(0x11)).unwrap();
    dev.ready_datagram_qp(qp, Psn::ZERO).unwrap();
    dev.attach_mcast(qp, "239.0.0.9".parse().unwrap()).unwrap();
    for k in 0..recvs {
        let sge = Sge { addr: BASE[1] + k * 256, length: 256, lkey: mr.lkey };
        dev.post_recv(qp, RecvWr { wr_id: k, sg_list: vec![sge].into() }).unwrap();
    }
    (dev, qp)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Arbitrary datagrams for a UD QP, unicast or to its group, most of them sealed with a
    /// valid ICRC and a UD opcode and the QP's Q_Key so that they reach the responder: no
    /// panic, each accepted or refused under one named counter, and nothing written beyond
    /// the receive buffers.
    #[test]
    fn ud_datagrams_of_arbitrary_bytes_never_panic_or_spill(
        packets in proptest::collection::vec(
            (proptest::collection::vec(any::<u8>(), 0..400), any::<bool>(), 0u8..4),
            1..12,
        ),
    ) {
        let (mut dev, qp) = ud_target(4);
        let src = SocketAddr::new("127.0.0.2".parse().unwrap(), 0xC123);
        let group: std::net::IpAddr = "239.0.0.9".parse().unwrap();
        for (mut p, to_group, shape) in packets {
            let dst = if to_group { group } else { dev.addr() };
            if shape > 0 && p.len() >= 24 {
                p[0] = 0x64 + (shape & 1); // UD SEND_ONLY (with immediate)
                p[1] &= 0xC0; // no pad, TVer 0
                p[2..4].copy_from_slice(&[0xFF, 0xFF]); // the default P_Key
                let qpn = if to_group { Qpn::MULTICAST } else { qp };
                p[5..8].copy_from_slice(&qpn.get().to_be_bytes()[1..]);
                if shape > 1 {
                    p[12..16].copy_from_slice(&0x11u32.to_be_bytes());
                }
                reseal(src, SocketAddr::new(dst, ROCE_V2_PORT), &mut p);
            }
            let before = *dev.counters();
            dev.handle_datagram(Instant::ZERO, &RxInfo::new(src, dst), &p);
            // One member: accepted, or refused under exactly one named rule.
            let r = fate(&before, dev.counters());
            prop_assert!(r.is_ok(), "{:?}", r);
        }
        let mut buf = Vec::new();
        while dev.poll_transmit(Instant::ZERO, &mut buf).is_some() {}
        let mem = dev.memory().buffer(BASE[1]).unwrap();
        prop_assert!(mem[4 * 256..].iter().all(|&b| b == 0), "wrote outside the receive buffers");
    }
}

/// A UD SEND_ONLY from QP `src_qp` to `dest_qp` with `qkey` and `payload`, sealed for `dst`.
fn ud_datagram(
    src: SocketAddr,
    dst: std::net::IpAddr,
    dest_qp: Qpn,
    qkey: QKey,
    payload: &[u8],
) -> Vec<u8> {
    let mut p = vec![0x64, 0, 0xFF, 0xFF, 0];
    p.extend_from_slice(&dest_qp.get().to_be_bytes()[1..]);
    p.extend_from_slice(&[0, 0, 0, 7]); // no ACK request, PSN 7
    p.extend_from_slice(&qkey.0.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x12, 0x34]); // source QP 0x1234
    p.extend_from_slice(payload);
    p.extend_from_slice(&[0; 4]);
    reseal(src, SocketAddr::new(dst, ROCE_V2_PORT), &mut p);
    p
}

/// A peer that floods a multicast group: the group holds at most `max_mcast_qp_attach` QPs
/// (the next attach is refused by name), each datagram is offered once to each member, a
/// member with no receive posted drops it and counts (UD has no queue to grow), and a QP
/// outside the group still gets its own datagram in the middle of the flood.
#[test]
fn a_multicast_flood_is_bounded_by_the_attach_limit_and_starves_no_other_qp() {
    let mut mem = VecMemory::new();
    mem.insert(BASE[1], vec![0; LEN as usize]);
    let mut dev = Device::new(DeviceConfig::new("127.0.0.3".parse().unwrap(), 9), mem);
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(4096).unwrap();
    let mr = dev.reg_mr(pd, BASE[1], LEN, Access::LOCAL_WRITE).unwrap();
    let group: std::net::IpAddr = "239.0.0.77".parse().unwrap();
    let limit = DEVICE_ATTR.max_mcast_qp_attach as usize;
    let qps: Vec<Qpn> = (0..=limit)
        .map(|k| {
            let init = QpInitAttr::new(QpType::Ud, pd, cq);
            let qp = dev.create_qp(init).unwrap();
            dev.init_qp(qp, Access::NONE, QKey(0x11)).unwrap();
            dev.ready_datagram_qp(qp, Psn::ZERO).unwrap();
            // Two receives of 128 bytes each, in slot k.
            for r in 0..2u64 {
                let at = BASE[1] + (k as u64 * 2 + r) * 128;
                let sge = Sge { addr: at, length: 128, lkey: mr.lkey };
                dev.post_recv(qp, RecvWr { wr_id: k as u64 * 2 + r, sg_list: vec![sge].into() })
                    .unwrap();
            }
            qp
        })
        .collect();
    let (members, outsider) = qps.split_at(limit);
    for &qp in members {
        dev.attach_mcast(qp, group).unwrap();
    }
    assert_eq!(
        dev.attach_mcast(outsider[0], group),
        Err(McastError::ExceedsLimit("max_mcast_qp_attach"))
    );
    let src = SocketAddr::new("127.0.0.2".parse().unwrap(), 0xC123);
    let flood = ud_datagram(src, group, Qpn::MULTICAST, QKey(0x11), &[0xAB; 16]);
    let own = ud_datagram(src, dev.addr(), outsider[0], QKey(0x11), &[0xCD; 16]);
    const FLOOD: u64 = 1000;
    for k in 0..FLOOD {
        dev.handle_datagram(Instant::ZERO, &RxInfo::new(src, group), &flood);
        if k == FLOOD / 2 {
            dev.handle_datagram(Instant::ZERO, &RxInfo::new(src, dev.addr()), &own);
        }
    }
    let mut wcs = Vec::new();
    dev.poll_cq(cq, usize::MAX, &mut wcs);
    assert!(wcs.iter().all(|w| w.status == WcStatus::SUCCESS), "{wcs:?}");
    let per_qp = |qp: Qpn| wcs.iter().filter(|w| w.qp_num == qp).count();
    assert!(members.iter().all(|&qp| per_qp(qp) == 2), "two datagrams for each member");
    assert_eq!(per_qp(outsider[0]), 1, "the QP outside the group got its own datagram");
    let c = dev.counters();
    assert_eq!(c.drop_rnr, limit as u64 * (FLOOD - 2), "the rest dropped at each member: {c:?}");
    let mut buf = Vec::new();
    assert!(dev.poll_transmit(Instant::ZERO, &mut buf).is_none(), "UD answers nothing");
    let mem = dev.memory().buffer(BASE[1]).unwrap();
    let used = (limit + 1) * 2 * 128;
    assert!(mem[used..].iter().all(|&b| b == 0), "nothing written past the receive buffers");
}
