//! Unreliable datagram service and multicast on the simulated fabric: each rule scripted, then a
//! seed sweep under loss, duplication, corruption and reordering.
//!
//! UD promises little, and that little exactly: a datagram is one packet; it arrives whole or
//! not at all, into one receive WQE, behind the 40-byte GRH area, with its source QP; a wrong
//! Q_Key never delivers; no ordering or uniqueness beyond what the network gave. The sweep
//! checks exactly that, and on a clean link that everything arrives once, in order.
//!
//! `UROCE_SEED_BASE` and `UROCE_SEEDS` choose the sweep's seeds, as in `rc_sweep`.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::cast_possible_truncation, reason = "test sizes and offsets are small")]

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::rc::Rc;

use uroce_engine::{
    Access, AhAttr, AhHandle, AsyncEvent, CqHandle, Device, DeviceConfig, Duration, McastError,
    MemoryRegion, ModifyError, Mtu, PdHandle, PostError, Psn, QKey, QpAttr, QpCap, QpInitAttr,
    QpState, QpType, Qpn, RecvWr, SendWr, Sge, SrqHandle, UdDest, VecMemory, WcOpcode, WcStatus,
    WorkCompletion, WrOpcode,
};
use uroce_sim::{Action, DeviceNode, Fabric, LinkConfig, Rng, sweep};
use uroce_wire::ip::internet_checksum;

type Net = Fabric<DeviceNode<VecMemory>>;

const DEFAULT_SEEDS: u64 = if cfg!(debug_assertions) { 100 } else { 1000 };
const MEM: u64 = 8 << 20;
const BASE: u64 = 0x1000_0000;
const QKEY: QKey = QKey(0x1111_2222);
/// Memory is cut in slots large enough for a GRH and a 4096-byte payload.
const SLOT: u64 = 8 << 10;
/// Receive buffers start at this slot; send buffers use the slots below.
const RECV_SLOTS: u64 = 256;
/// RoCE bytes around a UD payload: BTH 12, DETH 8, ICRC 4.
const UD_OVERHEAD: usize = 12 + 8 + 4;

struct UdHost {
    node: usize,
    addr: IpAddr,
    pd: PdHandle,
    cq: CqHandle,
    mr: MemoryRegion,
    qps: Vec<Qpn>,
    srq: Option<SrqHandle>,
}

fn ud_up(dev: &mut Device<VecMemory>, qp: Qpn, qkey: QKey) {
    dev.init_qp(qp, Access::NONE, qkey).unwrap();
    dev.ready_datagram_qp(qp, Psn::ZERO).unwrap();
}

/// Adds a device at `addr` with `qkeys.len()` UD QPs in RTS, one per Q_Key, their receives
/// in one SRQ if `with_srq`.
fn ud_host(net: &mut Net, addr: &str, port_mtu: Mtu, qkeys: &[QKey], with_srq: bool) -> UdHost {
    let addr: IpAddr = addr.parse().unwrap();
    let mut mem = VecMemory::new();
    mem.insert(BASE, vec![0; MEM as usize]);
    let seed = net.seed().wrapping_mul(31).wrapping_add(addr_seed(addr));
    let config = DeviceConfig { port_mtu, ..DeviceConfig::new(addr, seed) };
    let mut dev = Device::new(config, mem);
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(1 << 14).unwrap();
    let mr = dev.reg_mr(pd, BASE, MEM, Access::LOCAL_WRITE).unwrap();
    let srq = with_srq.then(|| dev.create_srq(pd, 4096, 2).unwrap());
    let cap = QpCap { max_send_wr: 1024, max_recv_wr: 1024, max_recv_sge: 2, ..QpCap::default() };
    let mut qps = Vec::new();
    for &qkey in qkeys {
        let init = QpInitAttr {
            qp_type: QpType::Ud,
            pd,
            send_cq: cq,
            recv_cq: cq,
            cap,
            sq_sig_all: true,
            srq,
            xrcd: None,
        };
        let qp = dev.create_qp(init).unwrap();
        ud_up(&mut dev, qp, qkey);
        qps.push(qp);
    }
    // Odd seeds send the way the socket runtime does: payloads left in memory.
    let node = net.add_node(DeviceNode::new(dev).gathering(net.seed() % 2 == 1));
    UdHost { node, addr, pd, cq, mr, qps, srq }
}

fn addr_seed(addr: IpAddr) -> u64 {
    match addr {
        IpAddr::V4(a) => u64::from(a.to_bits()),
        IpAddr::V6(a) => a.to_bits() as u64,
    }
}

fn dev<'a>(net: &'a mut Net, h: &UdHost) -> &'a mut Device<VecMemory> {
    &mut net.node_mut(h.node).dev
}

/// Posts receive `wr_id` into receive slot `wr_id`: one element, or on odd ids the GRH area
/// and the payload in two (as an application that keeps headers apart does).
fn post_ud_recv(net: &mut Net, h: &UdHost, qp: usize, wr_id: u64, payload_room: u32) {
    let at = BASE + (RECV_SLOTS + wr_id) * SLOT;
    let lkey = h.mr.lkey;
    let sg_list = if wr_id % 2 == 1 {
        vec![Sge { addr: at, length: 40, lkey }, Sge { addr: at + 64, length: payload_room, lkey }]
    } else {
        vec![Sge { addr: at, length: 40 + payload_room, lkey }]
    };
    let wr = RecvWr { wr_id, sg_list: sg_list.into() };
    let d = dev(net, h);
    match h.srq {
        Some(srq) => d.post_srq_recv(srq, wr).unwrap(),
        None => d.post_recv(h.qps[qp], wr).unwrap(),
    }
}

/// The GRH area and the payload of receive `wr_id` of `len` bytes.
fn received(net: &Net, h: &UdHost, wr_id: u64, len: usize) -> (Vec<u8>, Vec<u8>) {
    let mem = net.node(h.node).dev.memory().buffer(BASE).unwrap();
    let at = ((RECV_SLOTS + wr_id) * SLOT) as usize;
    let payload_at = if wr_id % 2 == 1 { at + 64 } else { at + 40 };
    (mem[at..at + 40].to_vec(), mem[payload_at..payload_at + len].to_vec())
}

fn pattern(seed: u64, id: u32, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed ^ (u64::from(id) << 24));
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

/// Writes `data` into send slot `slot` of `h` and returns the element that names it.
fn stage(net: &mut Net, h: &UdHost, slot: u64, data: &[u8]) -> Sge {
    let at = (slot * SLOT) as usize;
    let mem = dev(net, h).memory_mut().buffer_mut(BASE).unwrap();
    mem[at..at + data.len()].copy_from_slice(data);
    Sge { addr: BASE + slot * SLOT, length: data.len() as u32, lkey: h.mr.lkey }
}

fn ud_send(wr_id: u64, sge: Sge, ah: AhHandle, remote_qpn: Qpn, qkey: QKey) -> SendWr {
    let mut wr = SendWr::new(wr_id, WrOpcode::Send, vec![sge]);
    wr.ud = Some(UdDest { ah, remote_qpn, remote_qkey: qkey });
    wr
}

fn poll(net: &mut Net, h: &UdHost) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let cq = h.cq;
    dev(net, h).poll_cq(cq, usize::MAX, &mut out);
    out
}

fn recvs(wcs: &[WorkCompletion]) -> Vec<WorkCompletion> {
    wcs.iter().filter(|w| w.opcode == WcOpcode::Recv).copied().collect()
}

/// The GRH area a receive must hold for a datagram of `roce_len` bytes (BTH through ICRC) from
/// `src` to `dst`: the IPv6 header, or 20 zero bytes and the IPv4 header.
fn expected_grh(src: IpAddr, dst: IpAddr, roce_len: usize) -> [u8; 40] {
    let mut g = [0u8; 40];
    let udp_len = 8 + roce_len;
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let h = &mut g[20..];
            h[0] = 0x45;
            h[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
            h[6] = 0x40; // DF
            h[8] = 64;
            h[9] = 17;
            h[12..16].copy_from_slice(&s.octets());
            h[16..20].copy_from_slice(&d.octets());
            let sum = internet_checksum(&[h]);
            h[10..12].copy_from_slice(&sum.to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            g[0] = 0x60;
            g[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            g[6] = 17;
            g[7] = 64;
            g[8..24].copy_from_slice(&s.octets());
            g[24..40].copy_from_slice(&d.octets());
        }
        _ => unreachable!("one family per fabric"),
    }
    g
}

fn roce_len(payload: usize, imm: bool) -> usize {
    UD_OVERHEAD + usize::from(imm) * 4 + payload.next_multiple_of(4)
}

fn two_hosts(a: &str, b: &str, mtu: Mtu) -> (Net, [UdHost; 2]) {
    let mut net = Fabric::new(1);
    net.set_all_links(LinkConfig::default().delay(Duration::from_micros(2)));
    let ha = ud_host(&mut net, a, mtu, &[QKEY], false);
    let hb = ud_host(&mut net, b, mtu, &[QKEY], false);
    (net, [ha, hb])
}

fn ah_to(net: &mut Net, from: &UdHost, to: IpAddr) -> AhHandle {
    let pd = from.pd;
    dev(net, from).create_ah(pd, AhAttr::new(to)).unwrap()
}

#[test]
fn a_datagram_lands_behind_its_grh_with_source_qp_and_length_plus_40() {
    for (a, b) in [("10.0.0.1", "10.0.0.2"), ("fd00::1", "fd00::2")] {
        for mtu in Mtu::ALL {
            let (mut net, [ha, hb]) = two_hosts(a, b, mtu);
            let ah = ah_to(&mut net, &ha, hb.addr);
            for (k, len) in [0usize, 1, 3, 4, 100, mtu.bytes() as usize].into_iter().enumerate() {
                let k = k as u64;
                post_ud_recv(&mut net, &hb, 0, k, 4096);
                let data = pattern(7, k as u32, len);
                let sge = stage(&mut net, &ha, k, &data);
                let mut wr = ud_send(k, sge, ah, hb.qps[0], QKEY);
                if k.is_multiple_of(2) {
                    wr.opcode = WrOpcode::SendWithImm;
                    wr.imm = Some([1, 2, 3, k as u8]);
                }
                dev(&mut net, &ha).post_send(ha.qps[0], wr).unwrap();
                net.run_for(Duration::from_millis(1));
                let sent = poll(&mut net, &ha);
                assert_eq!(sent.len(), 1);
                assert_eq!((sent[0].wr_id, sent[0].status), (k, WcStatus::SUCCESS));
                let got = recvs(&poll(&mut net, &hb));
                assert_eq!(got.len(), 1, "{a} mtu {mtu:?} len {len}");
                let wc = got[0];
                assert_eq!(wc.status, WcStatus::SUCCESS);
                assert!(wc.grh, "UD receives carry the GRH flag");
                assert_eq!(wc.byte_len as usize, len + 40, "payload length plus 40");
                assert_eq!((wc.src_qp, wc.qp_num), (ha.qps[0], hb.qps[0]));
                assert_eq!(wc.imm, (k.is_multiple_of(2)).then_some([1, 2, 3, k as u8]));
                let (grh, payload) = received(&net, &hb, k, len);
                let want = expected_grh(ha.addr, hb.addr, roce_len(len, k.is_multiple_of(2)));
                assert_eq!(grh, want, "{a}: the GRH area holds the packet's IP header");
                assert_eq!(payload, data);
            }
        }
    }
}

#[test]
fn ud_posts_are_checked_and_fail_with_typed_errors() {
    let (mut net, [ha, hb]) = two_hosts("10.0.0.1", "10.0.0.2", Mtu::Mtu1024);
    let ah = ah_to(&mut net, &ha, hb.addr);
    let big = stage(&mut net, &ha, 0, &[7; 1025]);
    let d = dev(&mut net, &ha);
    let qp = ha.qps[0];
    // One packet per datagram, up to the port MTU (IBA 9.8.2).
    let err = d.post_send(qp, ud_send(1, big, ah, hb.qps[0], QKEY)).unwrap_err();
    assert_eq!(err, PostError::ExceedsMtu { len: 1025, mtu: 1024 });
    let ok = Sge { length: 1024, ..big };
    d.post_send(qp, ud_send(2, ok, ah, hb.qps[0], QKEY)).unwrap();
    // UD has SEND only.
    for op in [WrOpcode::RdmaWrite, WrOpcode::RdmaRead, WrOpcode::AtomicFetchAndAdd] {
        let mut wr = ud_send(3, Sge { length: 8, ..big }, ah, hb.qps[0], QKEY);
        wr.opcode = op;
        wr.remote = Some(uroce_engine::RemoteAddr { addr: 0, rkey: uroce_engine::RKey(1) });
        assert_eq!(d.post_send(qp, wr), Err(PostError::UnsupportedOpcode), "{op:?}");
    }
    let mut no_ah = ud_send(4, ok, ah, hb.qps[0], QKEY);
    no_ah.ud = None;
    assert_eq!(d.post_send(qp, no_ah), Err(PostError::MissingAddressHandle));
    // An address handle of another protection domain is not this QP's.
    let other_pd = d.alloc_pd();
    let foreign = d.create_ah(other_pd, AhAttr::new(hb.addr)).unwrap();
    assert_eq!(
        d.post_send(qp, ud_send(5, ok, foreign, hb.qps[0], QKEY)),
        Err(PostError::UnknownAh)
    );
    // An IPv6 destination for an IPv4 device.
    let v6 = AhAttr::new("fd00::2".parse().unwrap());
    assert!(d.create_ah(ha.pd, v6).is_err());
    // The UD state machine wants a Q_Key and has no path MTU (ibv_modify_qp(3)).
    let init = QpInitAttr::new(QpType::Ud, ha.pd, ha.cq);
    let fresh = d.create_qp(init).unwrap();
    let attr = QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        ..QpAttr::default()
    };
    assert!(matches!(
        d.modify_qp(fresh, &attr),
        Err(ModifyError::MissingAttribute { attr: "IBV_QP_QKEY", .. })
    ));
    let with_mtu = QpAttr { qkey: Some(QKEY), path_mtu: Some(Mtu::Mtu256), ..attr };
    assert!(matches!(
        d.modify_qp(fresh, &with_mtu),
        Err(ModifyError::UnexpectedAttribute { attr: "IBV_QP_PATH_MTU", .. })
    ));
    // The valid datagram went out and arrived.
    post_ud_recv(&mut net, &hb, 0, 0, 1024);
    net.run_for(Duration::from_millis(1));
    assert_eq!(recvs(&poll(&mut net, &hb)).len(), 1);
}

#[test]
fn q_key_rules_no_receive_and_a_destroyed_address_handle() {
    let (mut net, [ha, hb]) = two_hosts("10.0.0.1", "10.0.0.2", Mtu::Mtu4096);
    let ah = ah_to(&mut net, &ha, hb.addr);
    let sge = stage(&mut net, &ha, 0, b"hello");
    let (qa, qb) = (ha.qps[0], hb.qps[0]);
    for r in 0..4 {
        post_ud_recv(&mut net, &hb, 0, r, 4096);
    }
    // A wrong Q_Key is dropped and counted (IBA 10.2.5); a high-bit Q_Key in the WR means the
    // sending QP's own, which is the right one here.
    dev(&mut net, &ha).post_send(qa, ud_send(1, sge, ah, qb, QKey(0x1234))).unwrap();
    dev(&mut net, &ha).post_send(qa, ud_send(2, sge, ah, qb, QKey(0x8000_0000))).unwrap();
    net.run_for(Duration::from_millis(1));
    let sent: Vec<_> = poll(&mut net, &ha).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        sent,
        [(1, WcStatus::SUCCESS), (2, WcStatus::SUCCESS)],
        "UD sends complete on the wire"
    );
    let got = recvs(&poll(&mut net, &hb));
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].wr_id, 0, "the controlled Q_Key's datagram took the first receive");
    assert_eq!(net.node(hb.node).dev.counters().drop_bad_qkey, 1);
    // No receive posted: the datagram is dropped, not NAKed; the sender never knows.
    let (mut net, [ha, hb]) = two_hosts("10.0.0.1", "10.0.0.2", Mtu::Mtu4096);
    let ah = ah_to(&mut net, &ha, hb.addr);
    let sge = stage(&mut net, &ha, 0, b"hello");
    dev(&mut net, &ha).post_send(ha.qps[0], ud_send(1, sge, ah, hb.qps[0], QKEY)).unwrap();
    net.run_for(Duration::from_millis(1));
    assert_eq!(poll(&mut net, &ha)[0].status, WcStatus::SUCCESS);
    assert_eq!(net.node(hb.node).dev.counters().drop_rnr, 1);
    assert_eq!(net.node(ha.node).dev.counters().rnr_naks_rcvd, 0);
    // The address handle goes away between post and transmission: a local QP operation error.
    dev(&mut net, &ha).post_send(ha.qps[0], ud_send(2, sge, ah, hb.qps[0], QKEY)).unwrap();
    assert!(dev(&mut net, &ha).destroy_ah(ah));
    net.run_for(Duration::from_millis(1));
    let wcs = poll(&mut net, &ha);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (2, WcStatus::LOC_QP_OP_ERR));
}

#[test]
fn a_receive_too_small_for_grh_and_payload_is_a_local_length_error() {
    let (mut net, [ha, hb]) = two_hosts("10.0.0.1", "10.0.0.2", Mtu::Mtu4096);
    let ah = ah_to(&mut net, &ha, hb.addr);
    let sge = stage(&mut net, &ha, 0, &[9; 100]);
    // Room for 99 payload bytes after the GRH: one short. Two more receives behind it.
    post_ud_recv(&mut net, &hb, 0, 0, 99);
    post_ud_recv(&mut net, &hb, 0, 2, 4096);
    post_ud_recv(&mut net, &hb, 0, 4, 4096);
    dev(&mut net, &ha).post_send(ha.qps[0], ud_send(1, sge, ah, hb.qps[0], QKEY)).unwrap();
    net.run_for(Duration::from_millis(1));
    let got: Vec<_> = poll(&mut net, &hb).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        [(0, WcStatus::LOC_LEN_ERR), (2, WcStatus::WR_FLUSH_ERR), (4, WcStatus::WR_FLUSH_ERR)]
    );
    let d = dev(&mut net, &hb);
    assert_eq!(d.qp_state(hb.qps[0]), Some(QpState::Error));
    assert_eq!(d.poll_async_event(), Some(AsyncEvent::QpFatal(hb.qps[0])));
    // Nothing was written past the buffer.
    let (_, spill) = received(&net, &hb, 0, 100);
    assert!(spill[99..].iter().all(|&b| b == 0));
}

#[test]
fn a_flow_label_picks_the_udp_source_port_and_zero_keeps_the_qps() {
    let (mut net, [ha, hb]) = two_hosts("10.0.0.1", "10.0.0.2", Mtu::Mtu4096);
    let ports = Rc::new(RefCell::new(Vec::new()));
    let seen = Rc::clone(&ports);
    net.set_filter(ha.node, hb.node, move |d, _| {
        seen.borrow_mut().push(d.src.port());
        Action::Pass
    });
    let d = dev(&mut net, &ha);
    let plain = d.create_ah(ha.pd, AhAttr::new(hb.addr)).unwrap();
    let labeled = d.create_ah(ha.pd, AhAttr { dest: hb.addr, flow_label: 0xABCDE }).unwrap();
    let sge = stage(&mut net, &ha, 0, b"x");
    for (i, ah) in [plain, labeled, plain].into_iter().enumerate() {
        post_ud_recv(&mut net, &hb, 0, i as u64, 64);
        dev(&mut net, &ha)
            .post_send(ha.qps[0], ud_send(i as u64, sge, ah, hb.qps[0], QKEY))
            .unwrap();
    }
    net.run_for(Duration::from_millis(1));
    let ports = ports.borrow();
    // rdma-core's rdma_flow_label_to_udp_sport: low 14 bits XOR high 6, in 0xC000..=0xFFFF.
    let folded = 0xC000 | ((0xABCDE & 0x3FFF) ^ (0xABCDE >> 14)) as u16;
    assert_eq!(ports.len(), 3);
    assert_eq!(ports[1], folded);
    assert_eq!(ports[0], ports[2]);
    assert_ne!(ports[0], folded);
    assert!(ports[0] >= 0xC000);
    // Each arrived, ICRC and all.
    assert_eq!(recvs(&poll(&mut net, &hb)).len(), 3);
}

#[test]
fn ud_qps_share_a_shared_receive_queue() {
    let mut net = Fabric::new(3);
    net.set_all_links(LinkConfig::default().delay(Duration::from_micros(2)));
    let ha = ud_host(&mut net, "10.0.0.1", Mtu::Mtu1024, &[QKEY], false);
    let hb = ud_host(&mut net, "10.0.0.2", Mtu::Mtu1024, &[QKEY, QKEY, QKEY], true);
    let ah = ah_to(&mut net, &ha, hb.addr);
    for r in 0..6 {
        post_ud_recv(&mut net, &hb, 0, r, 1024);
    }
    let srq = hb.srq.unwrap();
    assert!(dev(&mut net, &hb).arm_srq_limit(srq, 2));
    let sge = stage(&mut net, &ha, 0, b"shared");
    for k in 0..6u64 {
        let to = hb.qps[(k % 3) as usize];
        dev(&mut net, &ha).post_send(ha.qps[0], ud_send(k, sge, ah, to, QKEY)).unwrap();
    }
    net.run_for(Duration::from_millis(1));
    let got = recvs(&poll(&mut net, &hb));
    // Receives are taken in post order, whichever QP the datagram was for.
    let order: Vec<_> = got.iter().map(|w| (w.wr_id, w.qp_num)).collect();
    let want: Vec<_> = (0..6u64).map(|k| (k, hb.qps[(k % 3) as usize])).collect();
    assert_eq!(order, want);
    let d = dev(&mut net, &hb);
    assert_eq!(d.poll_async_event(), Some(AsyncEvent::SrqLimitReached(srq)));
    assert_eq!(d.poll_async_event(), None, "one event per arming");
}

/// Three devices: A sends to a group that B joins with two QPs (and has a third that does not
/// join) and C with two (and a third whose Q_Key is another); then one of C's leaves.
fn multicast_scenario(addrs: [&str; 3], group: &str) {
    let mut net = Fabric::new(11);
    net.set_all_links(LinkConfig::default().delay(Duration::from_micros(3)));
    let other = QKey(0x7777);
    let ha = ud_host(&mut net, addrs[0], Mtu::Mtu2048, &[QKEY], false);
    let hb = ud_host(&mut net, addrs[1], Mtu::Mtu2048, &[QKEY, QKEY, QKEY], false);
    let hc = ud_host(&mut net, addrs[2], Mtu::Mtu2048, &[QKEY, QKEY, other], false);
    let group: IpAddr = group.parse().unwrap();
    for (h, attached) in [(&hb, [0, 1]), (&hc, [0, 1])] {
        for i in attached {
            dev(&mut net, h).attach_mcast(h.qps[i], group).unwrap();
            // Twice is not an error (rdma-core: the QP is already a member).
            dev(&mut net, h).attach_mcast(h.qps[i], group).unwrap();
        }
    }
    dev(&mut net, &hc).attach_mcast(hc.qps[2], group).unwrap();
    assert_eq!(net.node(hb.node).dev.multicast_groups().collect::<Vec<_>>(), [group]);
    for h in [&hb, &hc] {
        for qp in 0..3 {
            for r in 0..30 {
                post_ud_recv(&mut net, h, qp, qp as u64 * 32 + r, 2048);
            }
        }
    }
    let ah = ah_to(&mut net, &ha, group);
    let send = |net: &mut Net, range: std::ops::Range<u32>| {
        for k in range {
            let len = (k as usize * 97) % 2049;
            let data = pattern(5, k, len);
            let sge = stage(net, &ha, u64::from(k), &data);
            let mut wr = ud_send(u64::from(k), sge, ah, Qpn::MULTICAST, QKEY);
            wr.opcode = WrOpcode::SendWithImm;
            wr.imm = Some(k.to_be_bytes());
            dev(net, &ha).post_send(ha.qps[0], wr).unwrap();
        }
        net.run_for(Duration::from_millis(2));
    };
    send(&mut net, 0..20);
    // C's second QP leaves; the next datagrams reach three QPs.
    dev(&mut net, &hc).detach_mcast(hc.qps[1], group).unwrap();
    assert_eq!(dev(&mut net, &hc).detach_mcast(hc.qps[1], group), Err(McastError::NotAttached));
    send(&mut net, 20..25);
    assert_eq!(poll(&mut net, &ha).iter().filter(|w| w.status == WcStatus::SUCCESS).count(), 25);
    let b_wcs = recvs(&poll(&mut net, &hb));
    let c_wcs = recvs(&poll(&mut net, &hc));
    let expect = [
        (&hb, &b_wcs, 0, 25),
        (&hb, &b_wcs, 1, 25),
        (&hb, &b_wcs, 2, 0),
        (&hc, &c_wcs, 0, 25),
        (&hc, &c_wcs, 1, 20),
        (&hc, &c_wcs, 2, 0),
    ];
    for (h, wcs, qp, count) in expect {
        let mine: Vec<_> = wcs.iter().filter(|w| w.qp_num == h.qps[qp]).collect();
        let ks: Vec<u32> = mine.iter().map(|w| u32::from_be_bytes(w.imm.unwrap())).collect();
        assert_eq!(ks, (0..count).collect::<Vec<_>>(), "QP {qp} of {}", h.addr);
        for w in mine {
            let k = u32::from_be_bytes(w.imm.unwrap());
            let len = (k as usize * 97) % 2049;
            assert_eq!(
                (w.status, w.src_qp, w.byte_len as usize),
                (WcStatus::SUCCESS, ha.qps[0], len + 40)
            );
            let (grh, payload) = received(&net, h, w.wr_id, len);
            assert_eq!(
                grh,
                expected_grh(ha.addr, group, roce_len(len, true)),
                "the GRH names the group"
            );
            assert_eq!(payload, pattern(5, k, len));
        }
    }
    // The QP with another Q_Key refused every datagram, each counted.
    assert_eq!(net.node(hc.node).dev.counters().drop_bad_qkey, 25);
    // A unicast QPN at a group address, or the multicast QPN at a unicast address, is dropped.
    let d = dev(&mut net, &ha);
    let unicast_ah = d.create_ah(ha.pd, AhAttr::new(hb.addr)).unwrap();
    let sge = stage(&mut net, &ha, 0, b"stray");
    dev(&mut net, &ha).post_send(ha.qps[0], ud_send(90, sge, ah, hb.qps[0], QKEY)).unwrap();
    dev(&mut net, &ha)
        .post_send(ha.qps[0], ud_send(91, sge, unicast_ah, Qpn::MULTICAST, QKEY))
        .unwrap();
    net.run_for(Duration::from_millis(1));
    assert_eq!(net.node(hb.node).dev.counters().drop_bad_dest, 2);
    assert!(recvs(&poll(&mut net, &hb)).is_empty());
    // Only UD QPs join groups, only multicast addresses are groups.
    let d = dev(&mut net, &hb);
    assert_eq!(d.attach_mcast(hb.qps[2], hc.addr), Err(McastError::NotMulticast(hc.addr)));
    let rc = d
        .create_qp(QpInitAttr { sq_sig_all: false, ..QpInitAttr::new(QpType::Rc, hb.pd, hb.cq) })
        .unwrap();
    assert_eq!(d.attach_mcast(rc, group), Err(McastError::NotUd(rc)));
    // Destroying a member detaches it; the group goes when its last member does.
    assert!(d.destroy_qp(hb.qps[0]));
    d.detach_mcast(hb.qps[1], group).unwrap();
    assert_eq!(d.multicast_groups().count(), 0);
}

#[test]
fn multicast_reaches_every_attached_qp_on_two_devices_ipv4() {
    multicast_scenario(["10.0.0.1", "10.0.0.2", "10.0.0.3"], "239.1.2.3");
}

#[test]
fn multicast_reaches_every_attached_qp_on_two_devices_ipv6() {
    multicast_scenario(["fd00::1", "fd00::2", "fd00::3"], "ff15::1:2:3");
}

/// One seed of the UD sweep: two devices with two UD QPs each (every third seed on an SRQ),
/// each QP sending datagrams of random size to random QPs of the other device, some with a
/// wrong Q_Key, some with the controlled Q_Key, over the seed's faulty links.
fn run_ud_seed(seed: u64) -> Result<usize, String> {
    let mut rng = Rng::new(seed ^ 0x0D0D);
    let loss = [0.0, 0.001, 0.01, 0.1][(seed % 4) as usize];
    let mixed = (seed / 4) % 2 == 1;
    let mut link = LinkConfig::default().delay(Duration::from_micros(2)).loss(loss);
    if mixed {
        link = link.duplicate(0.02).corrupt(0.005).reorder(0.05, Duration::from_micros(20));
    }
    let mtu = Mtu::ALL[rng.gen_range(0..5) as usize];
    let mut net = Fabric::new(seed);
    net.set_all_links(link);
    let srq = seed.is_multiple_of(3);
    let hosts = [
        ud_host(&mut net, "127.0.0.2", mtu, &[QKEY, QKEY], srq),
        ud_host(&mut net, "127.0.0.3", mtu, &[QKEY, QKEY], srq),
    ];
    // id = host << 20 | qp << 16 | k; what each id is: (len, imm, good Q_Key, target QP).
    let mut sent: BTreeMap<u32, (usize, bool, bool, usize)> = BTreeMap::new();
    let mut expected_at = [[0usize; 2]; 2];
    for (host, h) in hosts.iter().enumerate() {
        let peer = &hosts[1 - host];
        let pd = h.pd;
        let flow_label = if rng.gen_bool(0.5) { rng.gen_range(1..1 << 20) as u32 } else { 0 };
        let ah = dev(&mut net, h).create_ah(pd, AhAttr { dest: peer.addr, flow_label }).unwrap();
        for qp in 0..2 {
            for k in 0..rng.gen_range(5..40) as u32 {
                let id = (host as u32) << 20 | (qp as u32) << 16 | k;
                let imm = rng.gen_bool(0.6);
                let len = rng.gen_range(u64::from(!imm) * 4..u64::from(mtu.bytes()) + 1) as usize;
                let mut data = pattern(seed, id, len);
                if !imm {
                    data[..4].copy_from_slice(&id.to_be_bytes());
                }
                let slot = (qp * 64 + k as usize) as u64;
                let sge = stage(&mut net, h, slot, &data);
                let to = rng.gen_range(0..2) as usize;
                let qkey = match rng.gen_range(0..10) {
                    0 => QKey(0x0BAD),
                    1 => QKey(0x8000_0000),
                    _ => QKEY,
                };
                let mut wr = ud_send(u64::from(id), sge, ah, peer.qps[to], qkey);
                if imm {
                    wr.opcode = WrOpcode::SendWithImm;
                    wr.imm = Some(id.to_be_bytes());
                }
                dev(&mut net, h).post_send(h.qps[qp], wr).map_err(|e| e.to_string())?;
                let good = qkey != QKey(0x0BAD);
                sent.insert(id, (len, imm, good, to));
                expected_at[1 - host][to] += usize::from(good);
            }
            // One datagram too many bytes for the MTU is refused at post time.
            let over = Sge { addr: BASE, length: mtu.bytes() + 1, lkey: h.mr.lkey };
            let err =
                dev(&mut net, h).post_send(h.qps[qp], ud_send(0, over, ah, peer.qps[0], QKEY));
            if !matches!(err, Err(PostError::ExceedsMtu { .. })) {
                return Err(format!("oversized datagram: {err:?}"));
            }
        }
    }
    // Receives for every good datagram twice over (the network may duplicate).
    for (h, expected) in hosts.iter().zip(expected_at) {
        let mut wr_id = 0;
        for (qp, count) in expected.into_iter().enumerate() {
            for _ in 0..2 * count + 2 {
                post_ud_recv(&mut net, h, if srq { 0 } else { qp }, wr_id, mtu.bytes());
                wr_id += 1;
            }
        }
    }
    net.run_for(Duration::from_millis(20));
    let mut delivered = 0;
    for (host, h) in hosts.iter().enumerate() {
        let wcs = poll(&mut net, h);
        let sends: Vec<(u64, WcStatus)> = wcs
            .iter()
            .filter(|w| w.opcode == WcOpcode::Send)
            .map(|w| (w.wr_id, w.status))
            .collect();
        for qp in 0..2u32 {
            let mine: Vec<_> =
                sends.iter().filter(|(id, _)| (id >> 16) & 0xF == u64::from(qp)).copied().collect();
            let want: Vec<_> = sent
                .keys()
                .filter(|id| *id >> 20 == host as u32 && (*id >> 16) & 0xF == qp)
                .map(|&id| (u64::from(id), WcStatus::SUCCESS))
                .collect();
            if mine != want {
                return Err(format!("host {host} QP {qp}: send completions {mine:?}"));
            }
        }
        let sender = &hosts[1 - host];
        let mut times: BTreeMap<u32, usize> = BTreeMap::new();
        let mut last: BTreeMap<(Qpn, Qpn), u32> = BTreeMap::new();
        for wc in recvs(&wcs) {
            if wc.status != WcStatus::SUCCESS || !wc.grh {
                return Err(format!("host {host}: {wc:?}"));
            }
            let len = wc.byte_len as usize - 40;
            let (grh, payload) = received(&net, h, wc.wr_id, len);
            let id = match wc.imm {
                Some(imm) => u32::from_be_bytes(imm),
                None => u32::from_be_bytes(payload[..4].try_into().unwrap()),
            };
            let &(want_len, imm, good, to) =
                sent.get(&id).ok_or(format!("unknown datagram {id:#x}"))?;
            let from_qp = sender.qps[((id >> 16) & 0xF) as usize];
            let mut data = pattern(seed, id, want_len);
            if !imm {
                data[..4].copy_from_slice(&id.to_be_bytes());
            }
            if !good
                || (id >> 20) as usize != 1 - host
                || wc.src_qp != from_qp
                || wc.qp_num != h.qps[to]
                || imm != wc.imm.is_some()
                || len != want_len
                || payload != data
                || grh != expected_grh(sender.addr, h.addr, roce_len(len, imm))
            {
                return Err(format!("host {host}: datagram {id:#x} arrived wrong: {wc:?}"));
            }
            *times.entry(id).or_default() += 1;
            if !mixed {
                let key = (wc.src_qp, wc.qp_num);
                if last.get(&key).is_some_and(|&l| l >= id) {
                    return Err(format!(
                        "host {host}: {id:#x} after {:#x} on an in-order link",
                        last[&key]
                    ));
                }
                last.insert(key, id);
            }
            delivered += 1;
        }
        // At most once per copy the network delivered: once, or twice if duplicated.
        let most = if mixed { 2 } else { 1 };
        if let Some((id, n)) = times.iter().find(|&(_, &n)| n > most) {
            return Err(format!("host {host}: datagram {id:#x} delivered {n} times"));
        }
        if loss == 0.0 && !mixed {
            let good = expected_at[host].iter().sum::<usize>();
            let bad = sent.iter().filter(|(id, v)| (**id >> 20) as usize != host && !v.2).count();
            let c = net.node(h.node).dev.counters();
            if times.len() != good || c.drop_bad_qkey != bad as u64 {
                return Err(format!(
                    "host {host}: {} of {good} on a clean link, {} bad Q_Keys dropped of {bad}",
                    times.len(),
                    c.drop_bad_qkey
                ));
            }
        }
    }
    Ok(delivered)
}

#[test]
fn ud_datagrams_arrive_intact_at_most_once_per_copy_across_seeds() {
    let mut delivered = 0;
    sweep(DEFAULT_SEEDS, |seed| {
        delivered += run_ud_seed(seed)?;
        Ok(())
    });
    eprintln!("ud sweep: {delivered} datagrams delivered intact");
}
