//! Tag matching (rdma-core `tag_matching.md`) under random loss, duplication, corruption and
//! reordering, across many seeds.
//!
//! Host A's RC QP sends to host B's RC QP, which takes its receives from a TM-SRQ. Each
//! message is, at random: an eager message for a tag B posted, one for a tag nobody posted, a
//! NO_TAG message, a rendezvous request for a posted tag (the data in A's memory), or one whose
//! tag's buffer is too small for its data. B's "software" posts the tags and enough ordinary
//! SRQ buffers before A sends, and reports the count of unexpected messages (a sync) each time
//! it sees one, as an MPI library does: at once, or on odd seeds some steps later.
//! After each run:
//!
//! - every SEND at A completes successfully, once, in order;
//! - every message is delivered at B exactly once: a message for a posted tag matched (unless
//!   it arrived while software had not yet reported an unexpected message), into its tag's
//!   buffer (an eager
//!   payload without its TMH, a rendezvous's data READ from A), or whole into an SRQ buffer
//!   (unexpected or NO_TAG), or, for a rendezvous too large for its tag, with its headers in
//!   the tag's buffer (`TM_RNDV_INCOMPLETE`); messages are delivered in the order they were
//!   sent (each message's first completion), and the unexpected count agrees with B's;
//! - a FIN reaches A exactly for each rendezvous B's device carried out, in order, holding the
//!   request's TMH and RVH with the FIN opcode; none for the others;
//! - the tags no message took are still there (a DEL succeeds), the others are gone.
//!
//! `UROCE_SEED_BASE` and `UROCE_SEEDS` choose the seeds (`cargo test --release -p uroce-sim
//! --test tm_sweep`); a failure names the seed and the command that reruns exactly it.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::cast_possible_truncation, reason = "test sizes and offsets are small")]

use std::net::IpAddr;

use uroce_engine::tm::{self, TagOp, TagOpError, TagOpKind};
use uroce_engine::{
    Access, CqHandle, Device, DeviceConfig, Duration, MemoryRegion, Mtu, PathAttr, Psn, QKey,
    QpCap, QpInitAttr, QpType, Qpn, RecvWr, SendWr, Sge, SrqHandle, TmFlags, VecMemory, WcOpcode,
    WcStatus, WorkCompletion, WrOpcode,
};
use uroce_sim::{DeviceNode, Fabric, LinkConfig, Rng, SWEEP_RELIABILITY, sweep};

const DEFAULT_SEEDS: u64 = if cfg!(debug_assertions) { 100 } else { 1000 };
const MEM: u64 = 8 << 20;
const BASE: [u64; 2] = [0x1000_0000, 0x2000_0000];
const A: usize = 0;
const B: usize = 1;
/// Every message has a 16 KiB slot of its own in each of the areas below.
const SLOT: u64 = 16 << 10;
/// At A: the messages from 0, the rendezvous data from here, the FIN buffers from `FINS`.
const DATA: u64 = 2 << 20;
const FINS: u64 = 6 << 20;
/// At B: the tags' buffers from 0, the ordinary SRQ buffers from here.
const PLAIN: u64 = 2 << 20;
/// A tag too small for the rendezvous data it is given (its headers fit).
const SMALL_TAG: u32 = 48;
/// The work-request id of ordinary SRQ buffer `i`.
const PLAIN_ID: u64 = 1 << 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Eager,
    Unposted,
    NoTag,
    Rndv,
    RndvTooBig,
}

#[derive(Clone, Copy, Debug)]
struct Msg {
    kind: Kind,
    /// Bytes after the TMH: the eager payload, or the rendezvous data.
    len: u32,
}

impl Msg {
    fn tag(self, k: usize) -> u64 {
        match self.kind {
            Kind::Unposted => 0xDEAD_0000 + k as u64,
            _ => 1000 + k as u64,
        }
    }

    fn posted(self) -> bool {
        matches!(self.kind, Kind::Eager | Kind::Rndv | Kind::RndvTooBig)
    }

    fn rendezvous(self) -> bool {
        matches!(self.kind, Kind::Rndv | Kind::RndvTooBig)
    }
}

fn pattern(seed: u64, k: usize, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed ^ (k as u64) << 32 ^ 0x7d);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

/// Message `k` as A sends it: TMH, then the payload or the RVH of its data.
fn wire_message(seed: u64, k: usize, m: Msg, a_rkey: u32) -> Vec<u8> {
    let op = match m.kind {
        Kind::Eager | Kind::Unposted => tm::tmh_op::EAGER,
        Kind::NoTag => tm::tmh_op::NO_TAG,
        Kind::Rndv | Kind::RndvTooBig => tm::tmh_op::RNDV,
    };
    let mut msg = vec![op, 0, 0, 0];
    msg.extend_from_slice(&(k as u32).to_be_bytes());
    msg.extend_from_slice(&m.tag(k).to_be_bytes());
    if m.rendezvous() {
        msg.extend_from_slice(&(BASE[A] + DATA + k as u64 * SLOT).to_be_bytes());
        msg.extend_from_slice(&a_rkey.to_be_bytes());
        msg.extend_from_slice(&m.len.to_be_bytes());
    } else {
        msg.extend_from_slice(&pattern(seed, k, m.len as usize));
    }
    msg
}

struct World {
    fabric: Fabric<DeviceNode<VecMemory>>,
    qp: [Qpn; 2],
    cq: [CqHandle; 2],
    mr: [MemoryRegion; 2],
    srq: SrqHandle,
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
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mut made = Vec::new();
    for dev in &mut devs {
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(4096).unwrap();
        let mr = dev.reg_mr(pd, BASE[made.len()], MEM, access).unwrap();
        made.push((pd, cq, mr));
    }
    let (b_pd, b_cq, _) = made[B];
    let srq = devs[B].create_tm_srq(b_pd, b_cq, 256, 1, tm::MAX_NUM_TAGS, 16).unwrap();
    let cap = QpCap { max_send_wr: 256, max_recv_wr: 256, ..QpCap::default() };
    let qp: [Qpn; 2] = core::array::from_fn(|i| {
        let (pd, cq, _) = made[i];
        let srq = (i == B).then_some(srq);
        devs[i].create_qp(QpInitAttr { cap, srq, ..QpInitAttr::new(QpType::Rc, pd, cq) }).unwrap()
    });
    let mut rng = Rng::new(seed ^ 0x7417);
    let psn: [Psn; 2] = core::array::from_fn(|_| Psn::from_masked(rng.next_u64() as u32));
    for i in [A, B] {
        let peer = 1 - i;
        devs[i].init_qp(qp[i], access, QKey(0)).unwrap();
        let path = PathAttr {
            dest: addrs[peer],
            dest_qpn: qp[peer],
            mtu,
            sq_psn: psn[i],
            rq_psn: psn[peer],
        };
        devs[i].connect_qp(qp[i], &path, &SWEEP_RELIABILITY).unwrap();
    }
    for (i, dev) in devs.into_iter().enumerate() {
        fabric.add_node(DeviceNode::new(dev).gathering((seed + i as u64) % 2 == 1));
    }
    fabric.set_all_links(link);
    let cq = [made[A].1, made[B].1];
    let mr = [made[A].2, made[B].2];
    World { fabric, qp, cq, mr, srq }
}

/// The message a completion at B is for: a tag's buffer carries the message's index as its
/// wr_id; an ordinary SRQ buffer holds the message whole, whose TMH's context names it.
fn message_of(wc: &WorkCompletion, b_mem: &[u8]) -> usize {
    if wc.wr_id >= PLAIN_ID {
        let at = (PLAIN + (wc.wr_id - PLAIN_ID) * SLOT) as usize;
        u32::from_be_bytes(b_mem[at + 4..at + 8].try_into().unwrap()) as usize
    } else {
        wc.wr_id as usize
    }
}

/// What B saw of one message.
#[derive(Debug, Default, Clone)]
struct Seen {
    /// Completions in the order they came (on B's one CQ).
    wcs: Vec<WorkCompletion>,
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
    let kinds = [Kind::Eager, Kind::Unposted, Kind::NoTag, Kind::Rndv, Kind::RndvTooBig];
    let msgs: Vec<Msg> = (0..rng.gen_range(4..40))
        .map(|_| {
            let kind = kinds[rng.gen_range(0..5) as usize];
            let len = match kind {
                Kind::RndvTooBig => rng.gen_range(u64::from(SMALL_TAG) + 1..SLOT + 1) as u32,
                _ => rng.gen_range(0..SLOT - 64) as u32,
            };
            Msg { kind, len }
        })
        .collect();
    let n = msgs.len();
    let a_rkey = w.mr[A].rkey.0;

    // A's memory: the messages, the rendezvous data; a receive for each possible FIN.
    for (k, &m) in msgs.iter().enumerate() {
        let msg = wire_message(seed, k, m, a_rkey);
        let mem = w.fabric.node_mut(A).dev.memory_mut().buffer_mut(BASE[A]).unwrap();
        let at = k * SLOT as usize;
        mem[at..at + msg.len()].copy_from_slice(&msg);
        if m.rendezvous() {
            let at = (DATA + k as u64 * SLOT) as usize;
            mem[at..at + m.len as usize].copy_from_slice(&pattern(seed, k, m.len as usize));
        }
    }
    let rendezvous = msgs.iter().filter(|m| m.rendezvous()).count();
    for j in 0..rendezvous {
        let sge = Sge { addr: BASE[A] + FINS + j as u64 * 64, length: 64, lkey: w.mr[A].lkey };
        w.fabric
            .node_mut(A)
            .dev
            .post_recv(w.qp[A], RecvWr { wr_id: j as u64, sg_list: vec![sge].into() })
            .unwrap();
    }
    // B: a tag for each message that names a posted one, an ordinary buffer for each message.
    let mut handles = vec![None; n];
    for (k, &m) in msgs.iter().enumerate().filter(|(_, m)| m.posted()) {
        let length = if m.kind == Kind::RndvTooBig { SMALL_TAG } else { SLOT as u32 };
        let sge = Sge { addr: BASE[B] + k as u64 * SLOT, length, lkey: w.mr[B].lkey };
        let kind = TagOpKind::Add {
            recv_wr_id: k as u64,
            sg_list: vec![sge],
            tag: m.tag(k),
            mask: u64::MAX,
        };
        let op = TagOp { wr_id: k as u64, kind, signaled: false, sync: false, unexpected_cnt: 0 };
        handles[k] = w.fabric.node_mut(B).dev.post_srq_op(w.srq, &op).map_err(|e| e.to_string())?;
    }
    for i in 0..n {
        let sge = Sge {
            addr: BASE[B] + PLAIN + i as u64 * SLOT,
            length: SLOT as u32,
            lkey: w.mr[B].lkey,
        };
        let wr = RecvWr { wr_id: PLAIN_ID + i as u64, sg_list: vec![sge].into() };
        w.fabric.node_mut(B).dev.post_srq_recv(w.srq, wr).unwrap();
    }
    let batch: Vec<SendWr> = msgs
        .iter()
        .enumerate()
        .map(|(k, &m)| {
            let len = tm::TMH_LEN as u32 + if m.rendezvous() { tm::RVH_LEN as u32 } else { m.len };
            let sge = Sge { addr: BASE[A] + k as u64 * SLOT, length: len, lkey: w.mr[A].lkey };
            SendWr::new(k as u64, WrOpcode::Send, vec![sge])
        })
        .collect();
    w.fabric.node_mut(A).dev.post_send_batch(w.qp[A], batch).map_err(|e| format!("{e:?}"))?;

    // Run. B's software reports each unexpected message it sees, at once or, on odd seeds,
    // some steps later (as a busy library does); until then tagged messages arrive unexpected.
    let lag_steps = if seed % 2 == 1 { rng.gen_range(1..400) } else { 0 };
    let (mut at_a, mut at_b) = (Vec::new(), Vec::new());
    // Unexpected messages seen, and reported (with the step the report is due at).
    let (mut unexpected, mut reported, mut due) = (0u32, 0u32, None::<u64>);
    // For each message, whether it may arrive unexpected for a posted tag: software had not
    // reported every unexpected message before it when the step that delivered the message
    // before it began.
    let mut may_miss = vec![false; n];
    let mut window_reported = 0u32;
    let mut delivered = vec![false; n];
    let deadline = w.fabric.now() + Duration::from_secs(10);
    let sends_done =
        |at_a: &[WorkCompletion]| at_a.iter().filter(|c| c.opcode == WcOpcode::Send).count();
    for step in 0u64.. {
        let reported_at_start = reported;
        let progressed = w.fabric.step();
        let mut got = Vec::new();
        w.fabric.node_mut(A).dev.poll_cq(w.cq[A], usize::MAX, &mut got);
        at_a.append(&mut got);
        w.fabric.node_mut(B).dev.poll_cq(w.cq[B], usize::MAX, &mut got);
        for wc in got {
            let b_mem = w.fabric.node_mut(B).dev.memory_mut().buffer_mut(BASE[B]).unwrap();
            let k = message_of(&wc, b_mem);
            if let Some(first) = delivered.get_mut(k).filter(|d| !**d) {
                *first = true;
                may_miss[k] = window_reported < unexpected;
                if wc.opcode == WcOpcode::TmRecv && wc.tm.is_some_and(|t| t.flags == TmFlags::NONE)
                {
                    unexpected += 1;
                    due = Some(step + lag_steps);
                }
                // The next message's first packet came after this step began (perhaps in it,
                // before software could answer what this step delivered).
                window_reported = reported_at_start;
            }
            at_b.push(wc);
        }
        if due.is_some_and(|d| step >= d) {
            due = None;
            reported = unexpected;
            let op = TagOp {
                wr_id: 0,
                kind: TagOpKind::Sync,
                signaled: false,
                sync: true,
                unexpected_cnt: reported,
            };
            w.fabric.node_mut(B).dev.post_srq_op(w.srq, &op).map_err(|e| e.to_string())?;
        }
        if sends_done(&at_a) == n && !progressed && due.is_none() {
            break;
        }
        if w.fabric.now() > deadline || (!progressed && sends_done(&at_a) < n && due.is_none()) {
            return Err(format!("{} of {n} sends completed: {at_a:?}", sends_done(&at_a)));
        }
    }
    w.fabric.run_for(Duration::from_millis(5));
    let mut got = Vec::new();
    w.fabric.node_mut(A).dev.poll_cq(w.cq[A], usize::MAX, &mut got);
    at_a.append(&mut got);
    w.fabric.node_mut(B).dev.poll_cq(w.cq[B], usize::MAX, &mut got);
    at_b.extend(got);

    // A: every SEND once, successfully, in order; the FINs.
    let sends: Vec<u64> =
        at_a.iter().filter(|c| c.opcode == WcOpcode::Send).map(|c| c.wr_id).collect();
    if sends != (0..n as u64).collect::<Vec<_>>() {
        return Err(format!("SEND completions {sends:?} for {n} messages"));
    }
    if let Some(bad) = at_a.iter().find(|c| c.status != WcStatus::SUCCESS) {
        return Err(format!("at A: {bad:?}"));
    }
    let fins = at_a.iter().filter(|c| c.opcode == WcOpcode::Recv).count();

    // B: each completion, by message.
    let b_mem = w.fabric.node_mut(B).dev.memory_mut().buffer_mut(BASE[B]).unwrap().to_vec();
    let a_mem = w.fabric.node_mut(A).dev.memory_mut().buffer_mut(BASE[A]).unwrap().to_vec();
    let mut seen: Vec<Seen> = vec![Seen::default(); n];
    let mut first_of: Vec<usize> = Vec::new();
    for wc in &at_b {
        if wc.status != WcStatus::SUCCESS && wc.status != WcStatus::TM_RNDV_INCOMPLETE {
            return Err(format!("at B: {wc:?}"));
        }
        let k = message_of(wc, &b_mem);
        let Some(s) = seen.get_mut(k) else { return Err(format!("at B, for no message: {wc:?}")) };
        if s.wcs.is_empty() {
            first_of.push(k);
        }
        s.wcs.push(*wc);
        // An ordinary buffer holds the message whole.
        if wc.wr_id >= PLAIN_ID {
            let at = (PLAIN + (wc.wr_id - PLAIN_ID) * SLOT) as usize;
            let want = wire_message(seed, k, msgs[k], a_rkey);
            if wc.byte_len as usize != want.len() || b_mem[at..at + want.len()] != want[..] {
                return Err(format!("message {k} is not whole in its SRQ buffer: {wc:?}"));
            }
        }
    }
    if first_of != (0..n).collect::<Vec<_>>() {
        return Err(format!("messages delivered in the order {first_of:?}"));
    }
    let mut unexpected_seen = 0;
    let mut carried_out = Vec::new();
    for (k, (&m, s)) in msgs.iter().zip(&seen).enumerate() {
        let last = s.wcs.last().ok_or_else(|| format!("message {k} ({m:?}) never delivered"))?;
        let flags = |c: &WorkCompletion| c.tm.map(|t| t.flags);
        let whole = last.wr_id >= PLAIN_ID;
        // One QP delivers in order: a message's first packet comes no earlier than the step
        // that delivered the message before it; if software had reported every unexpected
        // message before that step, a message for a posted tag finds matching on.
        if whole && m.posted() && !may_miss[k] {
            return Err(format!(
                "message {k} ({m:?}) for a posted tag went unexpected: {:?}",
                s.wcs
            ));
        }
        if whole {
            let (op, count) = match m.kind {
                Kind::NoTag => (WcOpcode::TmNoTag, 0),
                _ => (WcOpcode::TmRecv, 1),
            };
            if s.wcs.len() != 1 || last.opcode != op || flags(last) != Some(TmFlags::NONE) {
                return Err(format!("message {k} ({m:?}) delivered whole as {:?}", s.wcs));
            }
            unexpected_seen += count;
            continue;
        }
        // Matched: it named a posted tag, and that tag's buffer has what it should.
        if !m.posted() {
            return Err(format!("message {k} ({m:?}) matched: {:?}", s.wcs));
        }
        let tag_at = (k as u64 * SLOT) as usize;
        let first = s.wcs[0];
        if first.tm.map(|t| t.tag) != Some(m.tag(k))
            || !flags(&first).is_some_and(|f| f.contains(TmFlags::MATCH))
        {
            return Err(format!("message {k}: first completion {first:?}"));
        }
        match m.kind {
            Kind::RndvTooBig => {
                let headers = &wire_message(seed, k, m, a_rkey)[..32];
                if s.wcs.len() != 1
                    || last.status != WcStatus::TM_RNDV_INCOMPLETE
                    || b_mem[tag_at..tag_at + 32] != headers[..]
                {
                    return Err(format!("message {k} ({m:?}): {:?}", s.wcs));
                }
            }
            _ => {
                let done = flags(last).is_some_and(|f| f.contains(TmFlags::DATA_VALID));
                let want = pattern(seed, k, m.len as usize);
                if !done || last.byte_len != m.len || b_mem[tag_at..tag_at + want.len()] != want[..]
                {
                    return Err(format!(
                        "message {k} ({m:?}) not in its tag's buffer: {:?}",
                        s.wcs
                    ));
                }
                if m.kind == Kind::Rndv {
                    carried_out.push(k);
                }
            }
        }
    }
    if unexpected_seen != unexpected as usize {
        return Err(format!(
            "{unexpected_seen} messages delivered unexpected, {unexpected} counted"
        ));
    }
    // The FINs: one per rendezvous carried out, in order, the request's headers.
    if fins != carried_out.len() {
        return Err(format!("{fins} FINs for the rendezvous {carried_out:?}"));
    }
    for (j, &k) in carried_out.iter().enumerate() {
        let at = (FINS + j as u64 * 64) as usize;
        let mut want = wire_message(seed, k, msgs[k], a_rkey)[..32].to_vec();
        want[0] = tm::tmh_op::FIN;
        if a_mem[at..at + 32] != want[..] {
            return Err(format!("FIN {j} is not rendezvous {k}'s headers"));
        }
    }
    // Tags: the ones no message took are still there; the others are gone.
    for (k, handle) in handles.iter().enumerate() {
        let Some(h) = *handle else { continue };
        let matched = seen[k].wcs.iter().any(|c| c.wr_id == k as u64);
        let op = TagOp {
            wr_id: 0,
            kind: TagOpKind::Del { handle: h },
            signaled: false,
            sync: false,
            unexpected_cnt: 0,
        };
        let deleted = w.fabric.node_mut(B).dev.post_srq_op(w.srq, &op);
        match (matched, deleted) {
            (true, Err(TagOpError::UnknownHandle(_))) | (false, Ok(None)) => {}
            (m, d) => return Err(format!("tag of message {k} (matched {m}): DEL gave {d:?}")),
        }
    }
    Ok(())
}

#[test]
fn tagged_messages_are_delivered_once_and_in_order_under_faults() {
    let mut runs = 0;
    sweep(DEFAULT_SEEDS, |seed| {
        runs += 1;
        run_seed(seed)
    });
    eprintln!("tm sweep: {runs} runs");
}
