//! XRC (IBA Annex A14) under random loss, duplication, corruption and reordering, across many
//! seeds, and the errors an XRC target gives.
//!
//! Host B has one XRC domain with two XRC SRQs, each in a PD of its own with a CQ of its own,
//! and two XRC target QPs in the domain; host A has two XRC initiators, one connected to each
//! target. A posts SENDs, RDMA WRITEs, READs and fetch-and-adds through both initiators, each
//! naming one of the two SRQs at random. After each run:
//!
//! - every work request at A completes successfully, once, in order per initiator;
//! - each SEND completes on the CQ of the SRQ it named — never the other — with the number of
//!   the target QP it came through, its length, and its bytes in that SRQ's buffer;
//! - WRITEs and READs reach the memory of the PD of the SRQ they named, byte for byte, and each
//!   fetch-and-add is applied exactly once, however often its packets were lost or duplicated.
//!
//! `UROCE_SEED_BASE` and `UROCE_SEEDS` choose the seeds (`cargo test --release -p uroce-sim
//! --test xrc_sweep`); a failure names the seed and the command that reruns exactly it.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::cast_possible_truncation, reason = "test sizes and offsets are small")]

use std::net::IpAddr;

use uroce_engine::{
    Access, CqHandle, CreateError, DestroyError, Device, DeviceConfig, Duration, MemoryRegion, Mtu,
    PathAttr, PostError, Psn, QKey, QpCap, QpInitAttr, QpType, Qpn, RecvWr, RemoteAddr, SendWr,
    Sge, SrqHandle, VecMemory, WcOpcode, WcStatus, WorkCompletion, WrOpcode, XrcdHandle,
};
use uroce_sim::{DeviceNode, Fabric, LinkConfig, Rng, SWEEP_RELIABILITY, sweep};

const DEFAULT_SEEDS: u64 = if cfg!(debug_assertions) { 100 } else { 1000 };
const MEM: u64 = 8 << 20;
const BASE: [u64; 2] = [0x1000_0000, 0x2000_0000];
const A: usize = 0;
const B: usize = 1;
/// Each of B's two PDs has a region of half of B's memory.
const HALF: u64 = MEM / 2;
/// Every operation has a 16 KiB slot of its own at both ends.
const SLOT: u64 = 16 << 10;
/// Where, in each half of B's memory, the receive buffers begin (WRITE and READ slots lie
/// below; the fetch-and-add counters at the very start).
const RECV_AT: u64 = 2 << 20;

fn pattern(seed: u64, k: usize, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed ^ (k as u64) << 32 ^ 0x7c);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

struct World {
    fabric: Fabric<DeviceNode<VecMemory>>,
    /// A's initiators; B's targets (initiator `i` is connected to target `i`).
    ini: [Qpn; 2],
    tgt: [Qpn; 2],
    a_cq: CqHandle,
    a_mr: MemoryRegion,
    /// B's XRC SRQs, their CQs and the regions of their PDs.
    srq: [SrqHandle; 2],
    b_cq: [CqHandle; 2],
    b_mr: [MemoryRegion; 2],
    xrcd: XrcdHandle,
}

fn setup(seed: u64, mtu: Mtu, link: LinkConfig) -> World {
    let mut fabric = Fabric::new(seed);
    let addrs: [IpAddr; 2] = ["127.0.0.2".parse().unwrap(), "127.0.0.3".parse().unwrap()];
    let mut devs: Vec<Device<VecMemory>> = (0..2)
        .map(|i| {
            let mut mem = VecMemory::new();
            mem.insert(BASE[i], vec![0; MEM as usize]);
            Device::new(DeviceConfig::new(addrs[i], seed * 2 + i as u64), mem)
        })
        .collect();
    let remote =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;

    let a = &mut devs[A];
    let a_pd = a.alloc_pd();
    let a_cq = a.create_cq(4096).unwrap();
    let a_mr = a.reg_mr(a_pd, BASE[A], MEM, Access::LOCAL_WRITE).unwrap();
    let cap = QpCap { max_send_wr: 256, max_recv_wr: 0, max_recv_sge: 0, ..QpCap::default() };
    let ini: [Qpn; 2] = core::array::from_fn(|_| {
        let init = QpInitAttr { cap, ..QpInitAttr::new(QpType::XrcIni, a_pd, a_cq) };
        a.create_qp(init).unwrap()
    });

    let b = &mut devs[B];
    let xrcd = b.alloc_xrcd();
    let b_cq: [CqHandle; 2] = core::array::from_fn(|_| b.create_cq(4096).unwrap());
    let b_mr: [MemoryRegion; 2] = core::array::from_fn(|j| {
        let pd = b.alloc_pd();
        b.reg_mr(pd, BASE[B] + j as u64 * HALF, HALF, remote).unwrap()
    });
    let srq: [SrqHandle; 2] =
        core::array::from_fn(|j| b.create_xrc_srq(b_mr[j].pd, xrcd, b_cq[j], 256, 1).unwrap());
    let tgt: [Qpn; 2] =
        core::array::from_fn(|_| b.create_qp(QpInitAttr::xrc_target(xrcd)).unwrap());

    let mut rng = Rng::new(seed ^ 0x3177);
    for i in 0..2 {
        let (ps, pt) =
            (Psn::from_masked(rng.next_u64() as u32), Psn::from_masked(rng.next_u64() as u32));
        let a = &mut devs[A];
        a.init_qp(ini[i], Access::NONE, QKey(0)).unwrap();
        let path = PathAttr { dest: addrs[B], dest_qpn: tgt[i], mtu, sq_psn: ps, rq_psn: pt };
        a.connect_qp(ini[i], &path, &SWEEP_RELIABILITY).unwrap();
        let b = &mut devs[B];
        b.init_qp(tgt[i], remote, QKey(0)).unwrap();
        let path = PathAttr { dest: addrs[A], dest_qpn: ini[i], mtu, sq_psn: pt, rq_psn: ps };
        b.connect_qp(tgt[i], &path, &SWEEP_RELIABILITY).unwrap();
    }
    for (i, dev) in devs.into_iter().enumerate() {
        fabric.add_node(DeviceNode::new(dev).gathering((seed + i as u64) % 2 == 1));
    }
    fabric.set_all_links(link);
    World { fabric, ini, tgt, a_cq, a_mr, srq, b_cq, b_mr, xrcd }
}

/// One planned operation: through which initiator, naming which SRQ, what and how long.
#[derive(Clone, Copy, Debug)]
struct Op {
    ini: usize,
    srq: usize,
    opcode: WrOpcode,
    len: u32,
}

/// Where operation `k`'s bytes are at B, in the half of SRQ `srq`'s PD (`recv`: for a SEND,
/// its receive buffer).
fn b_slot(k: usize, srq: usize, recv: bool) -> u64 {
    let base = BASE[B] + srq as u64 * HALF + SLOT;
    base + if recv { RECV_AT } else { 0 } + k as u64 * SLOT
}

/// Where a fetch-and-add counter of SRQ `srq`'s half is.
fn counter(srq: usize) -> u64 {
    BASE[B] + srq as u64 * HALF
}

fn drain(w: &mut World, host: usize, cq: CqHandle, out: &mut Vec<WorkCompletion>) {
    w.fabric.node_mut(host).dev.poll_cq(cq, usize::MAX, out);
}

fn run_seed(seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let loss = [0.0, 0.001, 0.01, 0.02][(seed % 4) as usize];
    let mut link = LinkConfig::default().delay(Duration::from_micros(2)).loss(loss);
    if (seed / 4) % 2 == 1 {
        link = link.duplicate(0.01).corrupt(0.002).reorder(0.01, Duration::from_micros(20));
    }
    let mtu = Mtu::ALL[rng.gen_range(0..5) as usize];
    let mut w = setup(seed, mtu, link);
    let kinds =
        [WrOpcode::Send, WrOpcode::RdmaWrite, WrOpcode::RdmaRead, WrOpcode::AtomicFetchAndAdd];
    let ops: Vec<Op> = (0..rng.gen_range(4..40))
        .map(|_| {
            let opcode = kinds[rng.gen_range(0..4) as usize];
            let len = if opcode == WrOpcode::AtomicFetchAndAdd {
                8
            } else {
                rng.gen_range(1..SLOT + 1) as u32
            };
            Op { ini: rng.gen_range(0..2) as usize, srq: rng.gen_range(0..2) as usize, opcode, len }
        })
        .collect();

    // Sources and READ targets: A's slot k holds operation k's pattern; B's slot holds the
    // pattern a READ fetches.
    for (k, op) in ops.iter().enumerate() {
        let data = pattern(seed, k, op.len as usize);
        let at = k * SLOT as usize;
        let a = w.fabric.node_mut(A).dev.memory_mut().buffer_mut(BASE[A]).unwrap();
        if op.opcode == WrOpcode::RdmaRead {
            a[at..at + data.len()].fill(0);
            let b = w.fabric.node_mut(B).dev.memory_mut().buffer_mut(BASE[B]).unwrap();
            let off = (b_slot(k, op.srq, false) - BASE[B]) as usize;
            b[off..off + data.len()].copy_from_slice(&data);
        } else {
            a[at..at + data.len()].copy_from_slice(&data);
        }
    }
    // Receive buffers, one per SEND, in the SRQ it names (their order within an SRQ is the
    // order SENDs arrive, which across the two initiators is any).
    for (k, op) in ops.iter().enumerate().filter(|(_, o)| o.opcode == WrOpcode::Send) {
        let sge =
            Sge { addr: b_slot(k, op.srq, true), length: SLOT as u32, lkey: w.b_mr[op.srq].lkey };
        let wr = RecvWr { wr_id: k as u64, sg_list: vec![sge].into() };
        w.fabric.node_mut(B).dev.post_srq_recv(w.srq[op.srq], wr).unwrap();
    }
    let mut adds = [0u64; 2];
    let mut batches: [Vec<SendWr>; 2] = [Vec::new(), Vec::new()];
    for (k, op) in ops.iter().enumerate() {
        let sge = Sge { addr: BASE[A] + k as u64 * SLOT, length: op.len, lkey: w.a_mr.lkey };
        let mut wr = SendWr::new(k as u64, op.opcode, vec![sge]);
        wr.xrc_remote_srqn = w.srq[op.srq].get();
        let rkey = w.b_mr[op.srq].rkey;
        match op.opcode {
            WrOpcode::RdmaWrite | WrOpcode::RdmaRead => {
                wr.remote = Some(RemoteAddr { addr: b_slot(k, op.srq, false), rkey });
            }
            WrOpcode::AtomicFetchAndAdd => {
                wr.remote = Some(RemoteAddr { addr: counter(op.srq), rkey });
                wr.compare_add = 1 + k as u64;
                adds[op.srq] += 1 + k as u64;
            }
            _ => {}
        }
        batches[op.ini].push(wr);
    }
    let total = ops.len();
    for (i, batch) in batches.into_iter().enumerate() {
        if !batch.is_empty() {
            let qp = w.ini[i];
            w.fabric.node_mut(A).dev.post_send_batch(qp, batch).map_err(|e| format!("{e:?}"))?;
        }
    }
    let mut sent = Vec::new();
    let deadline = w.fabric.now() + Duration::from_secs(10);
    while sent.len() < total {
        let progressed = w.fabric.step();
        let cq = w.a_cq;
        drain(&mut w, A, cq, &mut sent);
        if w.fabric.now() > deadline || (!progressed && sent.len() < total) {
            return Err(format!("{} of {total} completions at A: {sent:?}", sent.len()));
        }
    }
    w.fabric.run_for(Duration::from_millis(5));
    let mut recvs: [Vec<WorkCompletion>; 2] = [Vec::new(), Vec::new()];
    for (j, r) in recvs.iter_mut().enumerate() {
        let cq = w.b_cq[j];
        drain(&mut w, B, cq, r);
    }

    // A: every operation once, successfully, in posting order per initiator.
    for i in 0..2 {
        let want: Vec<u64> = (0..total).filter(|&k| ops[k].ini == i).map(|k| k as u64).collect();
        let got: Vec<u64> = sent
            .iter()
            .filter(|wc| ops.get(wc.wr_id as usize).is_some_and(|o| o.ini == i))
            .map(|wc| wc.wr_id)
            .collect();
        if got != want {
            return Err(format!("initiator {i}: completions {got:?}, expected {want:?}"));
        }
    }
    if let Some(bad) = sent.iter().find(|wc| wc.status != WcStatus::SUCCESS) {
        return Err(format!("at A: {bad:?}"));
    }
    // B: each SEND on its SRQ's CQ, through its target, whole. SENDs to one SRQ take its
    // receive WQEs in the order they arrive, so each receive is matched to the SEND whose
    // length and bytes it holds.
    let b = w.fabric.node_mut(B).dev.memory_mut().buffer_mut(BASE[B]).unwrap().to_vec();
    let data_of = |k: usize| pattern(seed, k, ops[k].len as usize);
    for (j, r) in recvs.iter().enumerate() {
        let mut unmatched: Vec<usize> =
            (0..total).filter(|&k| ops[k].opcode == WrOpcode::Send && ops[k].srq == j).collect();
        if r.len() != unmatched.len() {
            return Err(format!("SRQ {j}'s CQ: {} receives for {unmatched:?}: {r:?}", r.len()));
        }
        for wc in r {
            let buf = (b_slot(wc.wr_id as usize, j, true) - BASE[B]) as usize;
            let held = &b[buf..buf + wc.byte_len as usize];
            let Some(at) = unmatched.iter().position(|&k| {
                ops[k].len == wc.byte_len && w.tgt[ops[k].ini] == wc.qp_num && held == data_of(k)
            }) else {
                return Err(format!("SRQ {j}: a receive matching no SEND to it: {wc:?}"));
            };
            unmatched.remove(at);
            if (wc.status, wc.opcode) != (WcStatus::SUCCESS, WcOpcode::Recv) {
                return Err(format!("SRQ {j}: {wc:?}"));
            }
        }
    }
    // Memory at both ends.
    let a = w.fabric.node_mut(A).dev.memory_mut().buffer_mut(BASE[A]).unwrap().to_vec();
    for (k, op) in ops.iter().enumerate() {
        let len = op.len as usize;
        let at_a = k * SLOT as usize;
        match op.opcode {
            WrOpcode::RdmaWrite => {
                let off = (b_slot(k, op.srq, false) - BASE[B]) as usize;
                if b[off..off + len] != data_of(k)[..] {
                    return Err(format!("WRITE {k} did not land whole in SRQ {}'s memory", op.srq));
                }
            }
            WrOpcode::RdmaRead if a[at_a..at_a + len] != data_of(k)[..] => {
                return Err(format!("READ {k} did not bring back SRQ {}'s bytes", op.srq));
            }
            _ => {}
        }
    }
    for (j, &sum) in adds.iter().enumerate() {
        let off = (counter(j) - BASE[B]) as usize;
        let value = u64::from_le_bytes(b[off..off + 8].try_into().unwrap());
        if value != sum {
            return Err(format!("SRQ {j}'s counter is {value}, the adds sum to {sum}"));
        }
    }
    Ok(())
}

#[test]
fn xrc_requests_reach_the_srq_they_name_exactly_once_under_faults() {
    let mut runs = 0;
    sweep(DEFAULT_SEEDS, |seed| {
        runs += 1;
        run_seed(seed)
    });
    eprintln!("xrc sweep: {runs} runs");
}

/// Runs until A has one completion; returns it.
fn one_completion(w: &mut World) -> WorkCompletion {
    let mut got = Vec::new();
    let deadline = w.fabric.now() + Duration::from_secs(5);
    while got.is_empty() && w.fabric.now() < deadline {
        w.fabric.step();
        let cq = w.a_cq;
        drain(w, A, cq, &mut got);
    }
    got.pop().expect("a completion")
}

#[test]
fn an_xrc_target_refuses_what_its_domain_does_not_allow() {
    let link = LinkConfig::default().delay(Duration::from_micros(2));
    // An SRQ of another domain, and an SRQ number nobody has: invalid requests (IBA Annex A14).
    for foreign in [true, false] {
        let mut w = setup(1, Mtu::Mtu1024, link.clone());
        let b = &mut w.fabric.node_mut(B).dev;
        let other = b.alloc_xrcd();
        let cq = b.create_cq(16).unwrap();
        let pd = b.alloc_pd();
        let srqn =
            if foreign { b.create_xrc_srq(pd, other, cq, 4, 1).unwrap().get() } else { 0xAB_CDEF };
        let sge = Sge { addr: BASE[A], length: 8, lkey: w.a_mr.lkey };
        let mut wr = SendWr::new(7, WrOpcode::Send, vec![sge]);
        wr.xrc_remote_srqn = srqn;
        let ini = w.ini[0];
        w.fabric.node_mut(A).dev.post_send(ini, wr).unwrap();
        let wc = one_completion(&mut w);
        assert_eq!((wc.wr_id, wc.status), (7, WcStatus::REM_INV_REQ_ERR), "foreign {foreign}");
    }

    // A WRITE with a key of the other SRQ's PD: the named SRQ's PD is the one checked.
    let mut w = setup(2, Mtu::Mtu1024, link.clone());
    let sge = Sge { addr: BASE[A], length: 64, lkey: w.a_mr.lkey };
    let mut wr = SendWr::new(8, WrOpcode::RdmaWrite, vec![sge]);
    wr.xrc_remote_srqn = w.srq[0].get();
    wr.remote = Some(RemoteAddr { addr: b_slot(0, 1, false), rkey: w.b_mr[1].rkey });
    let ini = w.ini[1];
    w.fabric.node_mut(A).dev.post_send(ini, wr).unwrap();
    let wc = one_completion(&mut w);
    assert_eq!((wc.wr_id, wc.status), (8, WcStatus::REM_ACCESS_ERR));
    // ...and through the SRQ of that PD, the same WRITE lands (on the other, healthy target).
    let mut w = setup(3, Mtu::Mtu1024, link);
    let sge = Sge { addr: BASE[A], length: 64, lkey: w.a_mr.lkey };
    let mut wr = SendWr::new(9, WrOpcode::RdmaWrite, vec![sge]);
    wr.xrc_remote_srqn = w.srq[1].get();
    wr.remote = Some(RemoteAddr { addr: b_slot(0, 1, false), rkey: w.b_mr[1].rkey });
    let ini = w.ini[0];
    w.fabric.node_mut(A).dev.post_send(ini, wr).unwrap();
    let wc = one_completion(&mut w);
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::SUCCESS));

    // The halves have only their own queues; objects in use stay.
    let sge = Sge { addr: BASE[A], length: 8, lkey: w.a_mr.lkey };
    let (ini, tgt) = (w.ini[0], w.tgt[0]);
    let a = &mut w.fabric.node_mut(A).dev;
    let recv = RecvWr { wr_id: 1, sg_list: vec![sge].into() };
    assert_eq!(a.post_recv(ini, recv.clone()), Err(PostError::NoReceiveQueue));
    let b = &mut w.fabric.node_mut(B).dev;
    assert_eq!(b.post_recv(tgt, recv), Err(PostError::NoReceiveQueue));
    let send = SendWr::new(1, WrOpcode::Send, vec![sge]);
    assert_eq!(b.post_send(tgt, send), Err(PostError::NoSendQueue));
    assert_eq!(b.dealloc_xrcd(w.xrcd), Err(DestroyError::InUse));
    assert_eq!(b.destroy_cq(w.b_cq[0]), Err(DestroyError::InUse));
    assert_eq!(b.srq_xrcd(w.srq[0]), Some(w.xrcd));
    let srq = w.srq[0];
    let (pd, cq) = (w.b_mr[0].pd, w.b_cq[0]);
    // An XRC target needs a domain; an XRC QP takes no SRQ.
    let stray = b.alloc_xrcd();
    b.dealloc_xrcd(stray).unwrap();
    let init = QpInitAttr::xrc_target(stray);
    assert_eq!(b.create_qp(init), Err(CreateError::UnknownXrcd));
    let init = QpInitAttr { srq: Some(srq), ..QpInitAttr::new(QpType::XrcIni, pd, cq) };
    assert_eq!(b.create_qp(init), Err(CreateError::XrcMisuse));
    // The SRQs go first (a target only borrows them), then the targets, then the domain.
    b.destroy_srq(w.srq[0]).unwrap();
    b.destroy_srq(w.srq[1]).unwrap();
    assert_eq!(b.dealloc_xrcd(w.xrcd), Err(DestroyError::InUse));
    assert!(b.destroy_qp(w.tgt[0]) && b.destroy_qp(w.tgt[1]));
    b.dealloc_xrcd(w.xrcd).unwrap();
    b.destroy_cq(cq).unwrap();
}
