//! The requester: turns send WQEs into request packets (IBA 9.7; Linux rxe_req.c).
//!
//! Heads up, read these first, in IBA 9.7 (reliable service): PSNs (one per packet; a READ
//! reserves one per response packet), segmentation (FIRST and MIDDLE carry exactly one path
//! MTU), and when the requester asks for acknowledgement. Retransmission rewinds `next_wqe`,
//! `next_pkt` and `next_psn` (see `completer::rewind`); this module just sends from there.

use uroce_wire::opcode::Opcode;
use uroce_wire::{ExtHeaders, PacketRepr, atomic_eth, bth, deth, ieth, immdt, reth, xrceth};

use crate::completer;
use crate::ctx::{Ctx, Transmit};
use crate::memory::MemoryAccess;
use crate::qp::Qp;
use crate::sg;
use crate::time::Instant;
use crate::types::{QpType, SendFlags, Sge, WcStatus, WrOpcode};

/// Whether `qp` has as many packets in flight as it may: sent (up to `next_psn`, which goes
/// back on a retry) and not acknowledged, against the device's limit and the QP's loss-driven
/// window.
pub(crate) fn window_full(qp: &Qp, max_inflight_pkts: u32) -> bool {
    let (inflight, window) = in_flight(qp, max_inflight_pkts);
    inflight >= window
}

/// Packets in flight and the window they are held to (see [`window_full`]).
fn in_flight(qp: &Qp, max_inflight_pkts: u32) -> (i32, i32) {
    let inflight = qp.req.next_psn.distance(qp.req.una);
    let mut window = max_inflight_pkts;
    if qp.req.cwnd != 0 {
        window = window.min(qp.req.cwnd);
    }
    (inflight, i32::try_from(window).unwrap_or(i32::MAX))
}

/// Builds the next request packet of `qp` into `buf`, if the QP may send one now.
pub(crate) fn poll<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    now: Instant,
    buf: &mut Vec<u8>,
) -> Option<Transmit> {
    if !qp.has_request_work(now) {
        return None;
    }
    // Local operations (memory window binds, local invalidations) run when their turn in the
    // send queue comes, and put nothing on the wire (IBA 10.6.7.2, 10.8).
    while qp.req.sq.get(qp.req.next_wqe).is_some_and(|w| w.wr.opcode.is_local()) {
        let idx = qp.req.next_wqe;
        if !qp.req.sq.get(idx).is_some_and(|w| w.started) {
            if !start_wqe(qp, ctx, idx) {
                return None;
            }
            if !run_local(qp, ctx, idx) {
                return None;
            }
        }
        qp.req.next_wqe += 1;
        completer::drain(qp, ctx);
        if !qp.has_request_work(now) {
            return None;
        }
    }
    let idx = qp.req.next_wqe;
    let (inflight, window) = in_flight(qp, ctx.config.max_inflight_pkts);
    if inflight >= window {
        return None;
    }
    if !qp.req.sq.get(idx)?.started && !start_wqe(qp, ctx, idx) {
        return None;
    }
    let w = qp.req.sq.get(idx)?;
    if w.error.is_some() {
        return None;
    }
    // A UD WQE whose address handle was destroyed after the post (IBA 11.2.4.3 leaves this to
    // the consumer; a local QP operation error is what hardware reports).
    let ud = w.wr.ud.filter(|_| qp.init.qp_type == QpType::Ud);
    if ud.is_some_and(|ud| !ctx.ahs.contains_key(&ud.ah.0)) {
        fail_at_start(qp, ctx, idx, WcStatus::LOC_QP_OP_ERR);
        return None;
    }
    let mtu = qp.mtu.bytes();
    let k = qp.req.next_pkt;
    let psn = w.first_psn.add(k);
    let first = k == 0;
    let last = k + 1 >= w.npkts;
    let op = w.wr.opcode;
    let mut ext = ExtHeaders::default();
    let remote =
        w.wr.remote.unwrap_or(crate::types::RemoteAddr { addr: 0, rkey: uroce_wire::RKey(0) });
    let opcode = match op {
        WrOpcode::RdmaRead => {
            // After a loss, ask again only for the responses from packet `k` on.
            let skip = k * mtu;
            let va = remote.addr.wrapping_add(u64::from(skip));
            let dma_len = w.len - skip;
            ext.reth = Some(reth::Repr { va, rkey: remote.rkey, dma_len });
            Opcode::RC_RDMA_READ_REQUEST
        }
        WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => {
            let (swap_add, compare) = if op == WrOpcode::AtomicCmpAndSwp {
                (w.wr.swap, w.wr.compare_add)
            } else {
                (w.wr.compare_add, 0)
            };
            ext.atomic_eth =
                Some(atomic_eth::Repr { va: remote.addr, rkey: remote.rkey, swap_add, compare });
            if op == WrOpcode::AtomicCmpAndSwp {
                Opcode::RC_COMPARE_SWAP
            } else {
                Opcode::RC_FETCH_ADD
            }
        }
        // The 8 bytes travel as the payload, the place in a RETH (IBA 1.5).
        WrOpcode::AtomicWrite => {
            ext.reth = Some(reth::Repr { va: remote.addr, rkey: remote.rkey, dma_len: 8 });
            Opcode::RC_ATOMIC_WRITE
        }
        // Handled above; never reaches the wire.
        WrOpcode::LocalInv | WrOpcode::BindMw => return None,
        // IBA 9.4.1.2: the last packet of a SEND with invalidate carries the key in an IETH.
        WrOpcode::SendWithInv if last => {
            ext.ieth = w.wr.invalidate_rkey.map(|rkey| ieth::Repr { rkey });
            if first {
                Opcode::RC_SEND_ONLY_WITH_INVALIDATE
            } else {
                Opcode::RC_SEND_LAST_WITH_INVALIDATE
            }
        }
        WrOpcode::Send
        | WrOpcode::SendWithImm
        | WrOpcode::SendWithInv
        | WrOpcode::RdmaWrite
        | WrOpcode::RdmaWriteWithImm => {
            let is_write = matches!(op, WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm);
            if is_write && first {
                ext.reth = Some(reth::Repr { va: remote.addr, rkey: remote.rkey, dma_len: w.len });
            }
            if last && op.has_imm() {
                ext.immdt = w.wr.imm.map(|imm| immdt::Repr { imm });
            }
            let with_imm = last && op.has_imm();
            match (is_write, first, last, with_imm) {
                (false, true, true, false) => Opcode::RC_SEND_ONLY,
                (false, true, true, true) => Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
                (false, true, false, _) => Opcode::RC_SEND_FIRST,
                (false, false, false, _) => Opcode::RC_SEND_MIDDLE,
                (false, false, true, false) => Opcode::RC_SEND_LAST,
                (false, false, true, true) => Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
                (true, true, true, false) => Opcode::RC_RDMA_WRITE_ONLY,
                (true, true, true, true) => Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
                (true, true, false, _) => Opcode::RC_RDMA_WRITE_FIRST,
                (true, false, false, _) => Opcode::RC_RDMA_WRITE_MIDDLE,
                (true, false, true, false) => Opcode::RC_RDMA_WRITE_LAST,
                (true, false, true, true) => Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
            }
        }
    };
    // Payload: the k-th MTU-sized slice of the message.
    let payload_len =
        if op.is_read_or_atomic() { 0 } else { w.len.saturating_sub(k * mtu).min(mtu) };
    ctx.scratch.clear();
    ctx.pieces.clear();
    if payload_len > 0 {
        let offset = k * mtu;
        if let Some(data) = &w.wr.inline_data {
            let start = offset as usize;
            ctx.scratch.extend_from_slice(data.get(start..start + payload_len as usize)?);
        } else if gather(ctx, qp.init.pd, &w.wr.sg_list, offset, payload_len).is_err() {
            // The region went away under an in-flight WQE (IBA 10.6: local protection).
            fail_at_start(qp, ctx, idx, WcStatus::LOC_PROT_ERR);
            return None;
        }
    }
    // AckReq on the last packet of every message, and periodically inside long ones so the
    // window keeps moving (IBA 9.7).
    qp.req.since_ack_req = qp.req.since_ack_req.saturating_add(1);
    // The packet that fills the window asks too: without an ACK the window never reopens.
    let fills_window = inflight + 1 >= window;
    let ack_req = last || fills_window || qp.req.since_ack_req >= ctx.config.ack_req_interval;
    if ack_req {
        qp.req.since_ack_req = 0;
    }
    let reliable = qp.init.qp_type.is_reliable();
    // UC, UD and XRC use the same operation codes in their own ranges; UC and UD never ask
    // for an ACK.
    let opcode = Opcode(opcode.0 | qp.init.qp_type.opcode_base());
    // IBA Annex A14: every XRC request names the XRC SRQ at the target that takes it.
    if qp.init.qp_type == QpType::XrcIni {
        ext.xrceth = Some(xrceth::Repr { srqn: w.wr.xrc_remote_srqn });
    }
    let dest_qpn = match ud {
        Some(ud) => {
            // IBA 10.2.5: a Q_Key with the high bit set in the WR means the QP's own.
            let qkey = if ud.remote_qkey.0 & 0x8000_0000 != 0 { qp.qkey } else { ud.remote_qkey };
            ext.deth = Some(deth::Repr { qkey, src_qp: qp.qpn });
            ud.remote_qpn
        }
        None => qp.dest_qpn,
    };
    let mut b = bth::Repr::new(opcode, dest_qpn, psn);
    b.ack_req = ack_req && reliable;
    b.solicited = last && w.wr.flags.contains(SendFlags::SOLICITED) && !op.is_read_or_atomic();
    // The payload is inline data in `scratch`, or pieces of registered memory.
    let (scratch, pieces) = (core::mem::take(&mut ctx.scratch), core::mem::take(&mut ctx.pieces));
    let repr = PacketRepr::new(b, ext, &scratch);
    let tx = match ud {
        Some(ud) => ctx.emit_ud(ud.ah, qp.src_port, &repr, &pieces, buf),
        None => ctx.emit(qp, &repr, &pieces, buf),
    };
    (ctx.scratch, ctx.pieces) = (scratch, pieces);
    let tx = tx?;

    // Advance. A READ's request is one packet but its responses use `npkts` PSNs.
    let (npkts, first_psn) = (w.npkts, w.first_psn);
    if op == WrOpcode::RdmaRead || last {
        qp.req.next_wqe += 1;
        qp.req.next_pkt = 0;
        qp.req.next_psn = first_psn.add(npkts);
    } else {
        qp.req.next_pkt += 1;
        qp.req.next_psn = psn.next();
    }
    let fresh = !psn.is_before(qp.req.high_psn);
    if !fresh {
        ctx.counters.retransmitted_pkts += 1;
        qp.counters.retransmitted_pkts += 1;
    }
    if qp.req.next_psn.is_after(qp.req.high_psn) {
        qp.req.high_psn = qp.req.next_psn;
    }
    if !reliable {
        // UC and UD: a WQE is complete once its last packet is on the wire (IBA 9.8).
        qp.req.una = qp.req.next_psn;
        completer::drain(qp, ctx);
    } else {
        if qp.req.ack_deadline.is_none() {
            qp.req.ack_deadline = qp.ack_timeout().map(|t| now + t);
        }
        // Time one packet at a time, and only one sent once (Karn's rule: the ACK of a
        // retransmitted packet does not say which copy it answers).
        if fresh && b.ack_req && qp.req.timing.is_none() {
            qp.req.timing = Some((psn, now));
        }
        if qp.req.probe_at.is_none() {
            qp.req.probe_at = completer::probe_timeout(qp).map(|t| now + t);
        }
    }
    Some(tx)
}

/// Starts WQE `idx`: waits for the fence and the READ/atomic limit, assigns its PSNs and checks
/// its local keys. Returns whether it may go on the wire now.
fn start_wqe<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, idx: usize) -> bool {
    // WQEs start in order, so every READ or atomic still waiting for its response is before
    // `idx`.
    let outstanding_rd = qp.req.rd_atomic_outstanding;
    let Some(w) = qp.req.sq.get(idx) else {
        return false;
    };
    // IBA 10.8: a fenced WQE waits for every earlier READ and atomic to complete.
    if w.wr.flags.contains(SendFlags::FENCE) && outstanding_rd > 0 {
        return false;
    }
    // IBA 9.7: at most max_rd_atomic READ/atomic requests outstanding (ORA).
    if w.wr.opcode.is_read_or_atomic() && outstanding_rd >= u32::from(qp.max_rd_atomic) {
        return false;
    }
    let write = w.wr.opcode.is_read_or_atomic();
    // What a send gathers must be there now: registration pins nothing, and a page the
    // application unmapped since fails the work request, not the process.
    let mut gone = false;
    let local_ok = w.wr.inline_data.is_some()
        || w.wr.sg_list.iter().all(|s| {
            ctx.mrs.check_local(s.lkey, qp.init.pd, s.addr, u64::from(s.length), write).is_ok_and(
                |host| {
                    write || {
                        gone = ctx.mem.check_readable(host, s.length as usize).is_err();
                        !gone
                    }
                },
            )
        });
    ctx.counters.memory_faults += u64::from(gone);
    let first_psn = qp.req.next_psn;
    let Some(w) = qp.req.sq.get_mut(idx) else {
        return false;
    };
    w.first_psn = first_psn;
    w.started = true;
    if w.wr.opcode.is_read_or_atomic() {
        qp.req.rd_atomic_outstanding += 1;
    }
    if !local_ok {
        fail_at_start(qp, ctx, idx, WcStatus::LOC_PROT_ERR);
        return false;
    }
    true
}

/// Runs local WQE `idx` (started): binds its window or invalidates its key in the memory
/// table. A failure ends it with the memory-management error, `IBV_WC_MW_BIND_ERR` (IBA
/// 10.6.7.2.4, rxe alike), and the QP in Error. Returns whether it succeeded.
fn run_local<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, idx: usize) -> bool {
    let Some(w) = qp.req.sq.get(idx) else { return false };
    let (pd, qpn) = (qp.init.pd, qp.qpn);
    let ok = match (w.wr.opcode, &w.wr.bind, w.wr.invalidate_rkey) {
        (WrOpcode::BindMw, Some(b), _) => match ctx.mrs.bind(b, pd, qpn) {
            Ok(_) => true,
            Err(_) => {
                ctx.counters.mw_bind_errors += 1;
                false
            }
        },
        (WrOpcode::LocalInv, _, Some(rkey)) => match ctx.mrs.invalidate(rkey, pd, qpn, false) {
            Ok(()) => true,
            Err(_) => {
                ctx.counters.invalidate_errors += 1;
                false
            }
        },
        _ => false,
    };
    if !ok {
        fail_at_start(qp, ctx, idx, WcStatus::MW_BIND_ERR);
        return false;
    }
    if let Some(w) = qp.req.sq.get_mut(idx) {
        w.done = true;
    }
    true
}

/// Marks WQE `idx` failed; the error completes when every earlier WQE has (completions stay in
/// order), and then the QP enters Error.
fn fail_at_start<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, idx: usize, status: WcStatus) {
    if let Some(w) = qp.req.sq.get_mut(idx) {
        w.error = Some(status);
    }
    completer::drain(qp, ctx);
}

/// Finds the registered memory that holds bytes `offset..offset + len` of the message
/// described by `sges`, checking each element's key for a QP of `pd`, and lists it in
/// `ctx.pieces` (host address, length).
fn gather<M: MemoryAccess>(
    ctx: &mut Ctx<M>,
    pd: crate::types::PdHandle,
    sges: &[Sge],
    offset: u32,
    len: u32,
) -> Result<(), crate::mr::AccessError> {
    for (s, addr, _, take) in sg::pieces(sges, u64::from(offset), len as usize) {
        let host = ctx.mrs.check_local(s.lkey, pd, addr, take as u64, false)?;
        // `take` is at most one MTU.
        ctx.pieces.push((host, u32::try_from(take).unwrap_or(u32::MAX)));
    }
    Ok(())
}
