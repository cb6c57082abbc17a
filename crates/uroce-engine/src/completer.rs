//! The completer: takes responses (ACK, NAK, RNR NAK, READ responses, atomic ACKs) and timers,
//! completes send WQEs in order, and rewinds the requester when something was lost (IBA 9.7;
//! Linux rxe_comp.c).
//!
//! Heads up, read these first, in IBA 9.7 (reliable service): an ACK for PSN n completes every
//! WQE that ends at or before n, and a NAK implicitly acknowledges what precedes it; the RNR
//! NAK and its timer; the local ACK timeout; and the "implied NAK": an acknowledgement that
//! passes a READ or atomic whose response never arrived means the response was lost.

use uroce_wire::aeth::{NakCode, Syndrome};
use uroce_wire::opcode::{OpFlags, Opcode};
use uroce_wire::{PacketRepr, Psn};

use crate::ctx::{Ctx, flush_wc};
use crate::memory::MemoryAccess;
use crate::qp::Qp;
use crate::requester;
use crate::sg;
use crate::time::{Duration, Instant};
use crate::types::{QpState, WcOpcode, WcStatus, WorkCompletion, WrOpcode};

/// A response packet for `qp` (already checked: ICRC, transport, peer, QP state).
pub(crate) fn on_response<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    now: Instant,
    packet: &PacketRepr<'_>,
) {
    let psn = packet.bth.psn;
    // A response must be for a PSN this requester has sent.
    if !psn.is_before(qp.req.high_psn) {
        ctx.counters.drop_stale_response += 1;
        return;
    }
    // XRC's responses are RC's, in XRC's opcode range.
    let op = packet.bth.opcode.as_rc();
    if op == Opcode::RC_ACKNOWLEDGE {
        let Some(aeth) = packet.ext.aeth else { return };
        on_ack(qp, ctx, now, psn, aeth.syndrome);
    } else if op == Opcode::RC_ATOMIC_ACKNOWLEDGE {
        on_atomic_ack(qp, ctx, now, psn, packet.ext.atomic_ack_eth.map_or(0, |a| a.orig));
    } else {
        on_read_response(qp, ctx, now, packet);
    }
    drain(qp, ctx);
    if qp.has_request_work(now) {
        ctx.schedule(qp);
    }
}

fn on_ack<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    now: Instant,
    psn: Psn,
    syndrome: Syndrome,
) {
    // Stale: acknowledges nothing new (older than the oldest unacknowledged PSN minus one).
    // A NAK or RNR NAK names the PSN the responder expects, which must still be unacknowledged:
    // one for an acknowledged PSN is an old copy (IBA 9.7.5: a requester ignores responses
    // outside its outstanding window), and going back to a PSN no WQE holds any more would
    // leave the QP with nothing to resend and no timer.
    let nak = !matches!(syndrome, Syndrome::Ack(_));
    if psn.next().is_before(qp.req.una) || (nak && psn.is_before(qp.req.una)) {
        ctx.counters.drop_stale_response += 1;
        return;
    }
    // An ACK covers its PSN; a NAK or RNR NAK covers what precedes it (IBA 9.7). But an
    // acknowledgement that passes a READ or atomic whose response has not arrived means that
    // response was lost: go back to it (an implied NAK) instead.
    let upto = if matches!(syndrome, Syndrome::Ack(_)) { psn.next() } else { psn };
    if let Some(from) = implied_nak(qp, upto) {
        advance_una(qp, now, from);
        implied_nak_retry(qp, ctx, now, from);
        return;
    }
    advance_una(qp, now, upto);
    match syndrome {
        Syndrome::Ack(_) => {}
        Syndrome::RnrNak(timer) => {
            ctx.counters.rnr_naks_rcvd += 1;
            qp.counters.rnr_naks_rcvd += 1;
            drain(qp, ctx);
            // rnr_retry 7 means retry forever (IBA 9.7); only rnr_retry has that meaning.
            if qp.rnr_retry != 7 {
                if qp.req.rnr_retries_left == 0 {
                    ctx.counters.rnr_retry_exceeded += 1;
                    fail_front(qp, ctx, WcStatus::RNR_RETRY_EXC_ERR);
                    return;
                }
                qp.req.rnr_retries_left -= 1;
            }
            let wait = Duration::from_micros(u64::from(timer.micros()));
            qp.req.rnr_resume = Some((now + wait, psn));
            qp.req.ack_deadline = None;
        }
        Syndrome::Nak(NakCode::PSN_SEQUENCE_ERROR) => {
            ctx.counters.seq_naks_rcvd += 1;
            qp.counters.seq_naks_rcvd += 1;
            drain(qp, ctx);
            retry(qp, ctx, now, psn);
        }
        Syndrome::Nak(code) => {
            // IBA 9.7: the NAKed request fails; everything before it succeeded.
            drain(qp, ctx);
            let status = match code {
                NakCode::INVALID_REQUEST => WcStatus::REM_INV_REQ_ERR,
                NakCode::REMOTE_ACCESS_ERROR => WcStatus::REM_ACCESS_ERR,
                NakCode::REMOTE_OPERATIONAL_ERROR => WcStatus::REM_OP_ERR,
                NakCode::INVALID_RD_REQUEST => WcStatus::REM_INV_RD_REQ_ERR,
                _ => WcStatus::BAD_RESP_ERR,
            };
            fail_front(qp, ctx, status);
        }
        Syndrome::Reserved(_) => ctx.counters.drop_stale_response += 1,
    }
}

/// The PSN to go back to if acknowledging everything before `upto` would pass a READ or
/// atomic whose response has not (all) arrived.
fn implied_nak(qp: &Qp, upto: Psn) -> Option<Psn> {
    for w in qp.req.sq.iter().take_while(|w| w.started) {
        if !w.first_psn.is_before(upto) {
            break;
        }
        if w.wr.opcode.is_read_or_atomic() && !w.done && w.error.is_none() {
            let missing = w.first_psn.add(w.resp_pkts);
            return missing.is_before(upto).then_some(missing);
        }
    }
    None
}

fn on_atomic_ack<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    now: Instant,
    psn: Psn,
    orig: u64,
) {
    let pd = qp.init.pd;
    let Some(idx) = awaiting(qp, ctx, now, |w| w.wr.opcode.is_atomic() && w.first_psn == psn)
    else {
        return;
    };
    let w = &mut qp.req.sq[idx];
    let Some(sge) = w.wr.sg_list.first().copied() else {
        return;
    };
    let placed = ctx
        .mrs
        .check_local(sge.lkey, pd, sge.addr, 8, true)
        .is_ok_and(|host| ctx.mem.write(host, &orig.to_ne_bytes()).is_ok());
    if !placed {
        w.error = Some(WcStatus::LOC_PROT_ERR);
    } else {
        w.resp_pkts = 1;
        w.done = true;
        qp.req.rd_atomic_outstanding -= 1;
    }
    advance_una(qp, now, psn.next());
}

fn on_read_response<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    now: Instant,
    packet: &PacketRepr<'_>,
) {
    let psn = packet.bth.psn;
    let pd = qp.init.pd;
    let mtu = qp.mtu.bytes();
    let Some(idx) =
        awaiting(qp, ctx, now, |w| w.wr.opcode == WrOpcode::RdmaRead && w.error.is_none())
    else {
        return;
    };
    let w = &mut qp.req.sq[idx];
    let expected = w.first_psn.add(w.resp_pkts);
    if psn != expected {
        if psn.is_before(expected) {
            // A replayed response we already have.
            ctx.counters.drop_stale_response += 1;
        } else {
            // A gap in the responses: ask again from the first missing one (IBA 9.7).
            implied_nak_retry(qp, ctx, now, expected);
        }
        return;
    }
    let k = w.resp_pkts;
    // The response that ends the READ must say LAST (or ONLY), and only it. Whether a packet
    // says FIRST or MIDDLE depends on which request it answers (the original, or one that asked
    // again from a missing packet), so either is accepted; the PSN places the data.
    let is_last = k + 1 == w.npkts;
    let says_last = packet.bth.opcode.info().is_some_and(|i| i.has(OpFlags::LAST));
    let want = w.len.saturating_sub(k * mtu).min(mtu) as usize;
    if says_last != is_last || packet.payload.len() != want {
        ctx.counters.drop_stale_response += 1;
        return;
    }
    if sg::scatter(ctx, pd, &w.wr.sg_list, u64::from(k * mtu), packet.payload).is_err() {
        w.error = Some(WcStatus::LOC_PROT_ERR);
        return;
    }
    w.resp_pkts += 1;
    if w.resp_pkts == w.npkts {
        w.done = true;
        qp.req.rd_atomic_outstanding -= 1;
    }
    advance_una(qp, now, psn.next());
}

/// The started, unfinished WQE a READ response or atomic ACK is for: the first one `is_for`
/// picks. A response for none is stale and dropped. Responses arrive in order, so if a READ or
/// atomic before it still waits for its own response, that response was lost: go back to it.
fn awaiting<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    now: Instant,
    is_for: impl Fn(&crate::qp::SendWqe) -> bool,
) -> Option<usize> {
    let Some(idx) = qp.req.sq.iter().position(|w| w.started && !w.done && is_for(w)) else {
        ctx.counters.drop_stale_response += 1;
        return None;
    };
    if let Some(from) = earlier_unanswered(qp, idx) {
        implied_nak_retry(qp, ctx, now, from);
        return None;
    }
    Some(idx)
}

/// The PSN to resend from if a READ or atomic before `idx` is still waiting for its response.
fn earlier_unanswered(qp: &Qp, idx: usize) -> Option<Psn> {
    qp.req
        .sq
        .iter()
        .take(idx)
        .find(|w| w.wr.opcode.is_read_or_atomic() && !w.done && w.error.is_none())
        .map(|w| w.first_psn.add(w.resp_pkts))
}

/// Records that every PSN before `una` is acknowledged; forward progress resets the retry
/// counters (IBA 9.7) and restarts or stops the ACK timer.
fn advance_una(qp: &mut Qp, now: Instant, una: Psn) {
    if una.is_after(qp.req.una) && !una.is_after(qp.req.high_psn) {
        // Congestion avoidance: CWND_GROWTH more packets of window per window acknowledged.
        if qp.req.cwnd != 0 {
            let acked = u32::try_from(una.distance(qp.req.una)).unwrap_or(0);
            qp.req.cwnd_acked = qp.req.cwnd_acked.saturating_add(acked);
            let step = (qp.req.cwnd / CWND_GROWTH).max(1);
            while qp.req.cwnd_acked >= step {
                qp.req.cwnd_acked -= step;
                qp.req.cwnd = qp.req.cwnd.saturating_add(1);
            }
        }
        if let Some((timed, sent)) = qp.req.timing
            && una.is_after(timed)
        {
            qp.req.timing = None;
            let sample = now.saturating_since(sent);
            // RFC 6298's smoothing, srtt ← 7/8 srtt + 1/8 sample.
            qp.req.srtt = Some(match qp.req.srtt {
                None => sample,
                Some(s) => Duration::from_nanos((s.as_nanos() * 7 + sample.as_nanos()) / 8),
            });
        }
        qp.req.una = una;
        qp.req.recovering = None;
        qp.req.retries_left = qp.retry_cnt;
        qp.req.rnr_retries_left = qp.rnr_retry;
        let outstanding = qp.req.awaits_ack();
        qp.req.ack_deadline = if outstanding { qp.ack_timeout().map(|t| now + t) } else { None };
        qp.req.probes = 0;
        qp.req.probe_at = if outstanding { probe_timeout(qp).map(|t| now + t) } else { None };
    }
}

/// The shortest wait before a tail-loss probe: well above a round trip between processes of a
/// host (tens of microseconds) and the wake-up of a sleeping thread, far below the ACK timeouts
/// applications set (`timeout` 14, 67 ms, is common).
const MIN_PROBE: Duration = Duration::from_micros(200);

/// Probes sent, each after twice the last wait, before only the ACK timer is left.
const MAX_PROBES: u8 = 6;

/// How long `qp` waits without an acknowledgement before it probes for a lost tail: twice the
/// smoothed round trip, at least [`MIN_PROBE`], at most a quarter of the ACK timeout (the probe
/// must come well before it), doubled for each probe already sent; that quarter before any
/// round trip was measured (RFC 8985 §7.2 waits a second without one: a QP's first burst may
/// queue for longer than any round trip, and probing it would only add to the queue). `None`
/// when the ACK timeout is infinite or too short for a probe to help.
pub(crate) fn probe_timeout(qp: &Qp) -> Option<Duration> {
    let limit = qp.ack_timeout()?.as_nanos() / 4;
    let base = qp.req.srtt.map_or(limit, |s| s.as_nanos() * 2).max(MIN_PROBE.as_nanos());
    let wait = base << qp.req.probes.min(8);
    (limit >= MIN_PROBE.as_nanos()).then(|| Duration::from_nanos(wait.min(limit)))
}

/// The tail-loss probe (after TCP's, RFC 8985 §7): packets are outstanding, the requester can
/// send nothing (all is sent, or the window is full: a go-back-N resend waits for
/// acknowledgements), and no acknowledgement came for [`probe_timeout`]. The last packet sent
/// may have been lost (no later packet shows the responder a gap, so no sequence NAK comes) —
/// or all of a resend, which leaves one segmented datagram where a drop before the interface
/// takes every segment — or the responder's NAK or ACK may have been: the requester sends that
/// packet again, asking for an ACK. A responder that has it answers with a duplicate ACK; one
/// that lost it takes it, or NAKs the gap before it. Either answer moves the requester on
/// within a round trip instead of the ACK timeout. IBA 9.7 lets a requester resend any
/// unacknowledged packet; the probe does not count as a retry (only the ACK timer's and the
/// NAKs' go-back-N do) and does not shrink the window.
fn probe<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, now: Instant) {
    qp.req.probe_at = None;
    let sending = matches!(qp.state, QpState::Rts | QpState::Sqd);
    let all_sent = qp.req.next_psn == qp.req.high_psn;
    let blocked = all_sent || requester::window_full(qp, ctx.config.max_inflight_pkts);
    if !sending
        || !blocked
        || qp.req.rnr_resume.is_some()
        || !qp.req.awaits_ack()
        || qp.req.probes >= MAX_PROBES
    {
        return;
    }
    // The last packet sent, unless that is inside a READ's responses, where asking again for
    // the last response is what probes.
    let last = qp.req.next_psn.sub(1);
    let deadline = qp.req.ack_deadline;
    rewind(qp, now, last);
    qp.req.ack_deadline = deadline;
    // A NAK that answers the probe starts go-back-N again even for the loss already being
    // recovered from: the first recovery's packets were lost too.
    qp.req.recovering = None;
    qp.req.probes += 1;
    qp.req.probe_at = probe_timeout(qp).map(|t| now + t);
    ctx.counters.tail_probes += 1;
    qp.counters.tail_probes += 1;
    ctx.schedule(qp);
}

/// Completes, in order, every WQE at the front of the send queue that is finished: SEND and
/// WRITE once acknowledged, READ and atomics once their data is in; a WQE marked failed ends
/// with its error and moves the QP to Error.
pub(crate) fn drain<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>) {
    while let Some(w) = qp.req.sq.front() {
        if let Some(status) = w.error {
            fail_front(qp, ctx, status);
            return;
        }
        // A local operation at the front ran (`done`) once every WQE before it completed.
        let finished = w.started
            && if w.wr.opcode.is_read_or_atomic() || w.wr.opcode.is_local() {
                w.done
            } else {
                w.last_psn().is_before(qp.req.una)
            };
        if !finished {
            return;
        }
        let Some(w) = pop_front(qp) else {
            return;
        };
        if let Some(op) = w.device_op {
            crate::tm::device_op_ended(qp, ctx, *op, WcStatus::SUCCESS);
            continue;
        }
        if w.signaled {
            let wc = WorkCompletion {
                wr_id: w.wr.wr_id,
                status: WcStatus::SUCCESS,
                opcode: WcOpcode::from(w.wr.opcode),
                byte_len: w.len,
                imm: None,
                qp_num: qp.qpn,
                src_qp: qp.dest_qpn,
                grh: false,
                ipv4: false,
                timestamp: Instant::ZERO,
                tm: None,
                invalidated_rkey: None,
            };
            ctx.complete(qp.init.send_cq, wc);
        }
    }
}

/// Removes the oldest WQE. If the requester was (re)sending it, it carries on with the next
/// one from that one's start (or with new PSNs if it has not started).
fn pop_front(qp: &mut Qp) -> Option<crate::qp::SendWqe> {
    let w = qp.req.sq.pop_front()?;
    if w.started && w.wr.opcode.is_read_or_atomic() && !w.done {
        qp.req.rd_atomic_outstanding -= 1;
    }
    if qp.req.next_wqe > 0 {
        qp.req.next_wqe -= 1;
    } else {
        qp.req.next_pkt = 0;
        qp.req.next_psn = match qp.req.sq.front() {
            Some(next) if next.started => next.first_psn,
            _ => qp.req.high_psn,
        };
    }
    Some(w)
}

/// Ends the oldest WQE with `status` (reported even if unsignaled), then moves the QP to Error.
pub(crate) fn fail_front<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, status: WcStatus) {
    if let Some(w) = pop_front(qp) {
        if let Some(op) = w.device_op {
            crate::tm::device_op_ended(qp, ctx, *op, status);
            qp.error_status = Some(status);
            ctx.qp_fatal(qp.qpn);
            enter_error(qp, ctx);
            return;
        }
        let wc = WorkCompletion {
            wr_id: w.wr.wr_id,
            status,
            opcode: WcOpcode::from(w.wr.opcode),
            byte_len: 0,
            imm: None,
            qp_num: qp.qpn,
            src_qp: qp.dest_qpn,
            grh: false,
            ipv4: false,
            timestamp: Instant::ZERO,
            tm: None,
            invalidated_rkey: None,
        };
        ctx.complete(qp.init.send_cq, wc);
    }
    qp.error_status = Some(status);
    ctx.qp_fatal(qp.qpn);
    enter_error(qp, ctx);
}

/// Moves the QP to Error: every outstanding send and receive WQE completes with
/// `WR_FLUSH_ERR`, signaled or not (IBA 10.3; `ibv_modify_qp(3)`). Error NAKs already
/// queued still go out.
pub(crate) fn enter_error<M>(qp: &mut Qp, ctx: &mut Ctx<M>) {
    qp.state = QpState::Error;
    let qpn = qp.qpn;
    while let Some(w) = qp.req.sq.pop_front() {
        match w.device_op {
            Some(op) => crate::tm::device_op_ended(qp, ctx, *op, WcStatus::WR_FLUSH_ERR),
            None => {
                let wc = flush_wc(qpn, w.wr.wr_id, WcOpcode::from(w.wr.opcode));
                ctx.complete(qp.init.send_cq, wc);
            }
        }
    }
    if let Some(message) = qp.resp.current.take() {
        crate::tm::abandon_message(ctx, qp, &message);
        if let crate::qp::InMessage::Send { wqe, .. } = message {
            ctx.complete(ctx.recv_cq(qp), flush_wc(qpn, wqe.wr.wr_id, WcOpcode::Recv));
        }
    }
    if qp.init.srq.is_some() {
        // The SRQ's WQEs stay for its other QPs; this one will take no more (IBA 11.6.3).
        ctx.async_events.push_back(crate::ctx::AsyncEvent::LastWqeReached(qpn));
    }
    while let Some(r) = qp.rq.pop_front() {
        ctx.complete(qp.init.recv_cq, flush_wc(qpn, r.wr.wr_id, WcOpcode::Recv));
    }
    qp.req.next_wqe = 0;
    qp.req.rd_atomic_outstanding = 0;
    qp.req.ack_deadline = None;
    qp.req.rnr_resume = None;
    qp.resp.resources.clear();
    qp.resp.out.retain(|r| matches!(r, crate::qp::Response::Ack { .. }));
    if !qp.resp.out.is_empty() {
        ctx.schedule(qp);
    }
}

/// A retry because a response shows another was lost (an implied NAK), counted as one.
fn implied_nak_retry<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, now: Instant, from: Psn) {
    if retry(qp, ctx, now, from) {
        ctx.counters.implied_naks += 1;
    }
}

/// One retry of the transport (sequence NAK or implied NAK): go back to `from`, or end with
/// `RETRY_EXC_ERR` when `retry_cnt` retries are used up (IBA 9.7; a `retry_cnt` of 7 is seven
/// retries, not infinity, unlike Linux rxe). Returns whether this was a new retry.
///
/// A loss shows up as a burst of signs (every later READ response, a duplicated NAK, an ACK
/// overtaking the responses): once go-back-N from `from` is under way, further signs of the
/// same loss are ignored until the requester makes progress, so one loss costs one retry. Only
/// the ACK timer retries the same PSN again.
fn retry<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, now: Instant, from: Psn) -> bool {
    if qp.req.recovering == Some(from) {
        return false;
    }
    force_retry(qp, ctx, now, from);
    true
}

/// The smallest loss-driven window, in packets.
const MIN_CWND: u32 = 8;

/// Packets the window grows by per window acknowledged (Reno's congestion avoidance grows
/// it by one, RFC 5681 §3.1). A drop on a datacenter path is mostly not congestion (RoCE
/// fabrics signal that with ECN marks, RoCEv2 annex A17), and go-back-N already pays for
/// each loss with a window's resend; growing by one kept a path dropping 1 % of its
/// datagrams at under a third of its window, and `rc_rdma_write_bw -s 64K` at 63 % of its
/// lossless throughput (86 % now; at 10 % loss, 13 % then and 35 % now).
const CWND_GROWTH: u32 = 8;

/// A retry that always counts: the ACK timer's.
fn force_retry<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, now: Instant, from: Psn) {
    qp.req.recovering = Some(from);
    // A loss: the window shrinks to 7/10 (from the device's limit the first time), CUBIC's
    // β (RFC 9438 §4.6). Halving it, as Reno does, cost more than the loss where drops are
    // not congestion: across namespaces at 10 % random loss, `rc_bw -s 4K` kept 1.3 Gbit/s
    // halving and 1.8 at 7/10.
    let current = if qp.req.cwnd == 0 {
        ctx.config.max_inflight_pkts
    } else {
        qp.req.cwnd.min(ctx.config.max_inflight_pkts)
    };
    qp.req.cwnd = (current * 7 / 10).max(MIN_CWND);
    qp.req.cwnd_acked = 0;
    if qp.req.retries_left == 0 {
        ctx.counters.retry_exceeded += 1;
        fail_front(qp, ctx, WcStatus::RETRY_EXC_ERR);
        return;
    }
    qp.req.retries_left -= 1;
    rewind(qp, now, from);
    ctx.schedule(qp);
}

/// Go-back-N: the requester resends from the packet with PSN `from` (a READ is re-requested
/// whole; the completer drops the responses it already has).
fn rewind(qp: &mut Qp, now: Instant, from: Psn) {
    let deadline = qp.ack_timeout().map(|t| now + t);
    let req = &mut qp.req;
    let Some(idx) = req
        .sq
        .iter()
        .take_while(|w| w.started)
        .position(|w| !from.is_before(w.first_psn) && !from.is_after(w.last_psn()))
    else {
        // Nothing to go back to (callers pass an unacknowledged PSN, so this is a bug): the
        // ACK timer stays armed, and its retry from the oldest unacknowledged PSN recovers.
        if req.awaits_ack() && req.ack_deadline.is_none() {
            req.ack_deadline = deadline;
        }
        return;
    };
    let w = &req.sq[idx];
    req.next_wqe = idx;
    // A SEND or WRITE resumes at the packet; a READ asks again for the responses from there on
    // (IBA 9.7); an atomic is one packet.
    req.next_pkt = u32::try_from(from.distance(w.first_psn)).unwrap_or(0);
    req.next_psn = from;
    // Ask for an ACK on the first packet sent again: if the responder is already past it, the
    // ACK tells where it is, so one lost NAK does not cost a whole timeout.
    req.since_ack_req = u32::MAX - 1;
    req.ack_deadline = deadline;
    req.timing = None;
}

/// Timers of `qp` due at `now`.
pub(crate) fn on_timer<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, now: Instant) {
    if let Some((at, from)) = qp.req.rnr_resume
        && at <= now
    {
        qp.req.rnr_resume = None;
        rewind(qp, now, from);
        ctx.schedule(qp);
    }
    if qp.req.probe_at.is_some_and(|t| t <= now) {
        if qp.req.ack_deadline.is_some_and(|t| t <= now) {
            // The ACK timer's retry, due too, resends from the oldest packet: no probe (the
            // requester arms the next one as it sends).
            qp.req.probe_at = None;
        } else {
            probe(qp, ctx, now);
        }
    }
    if qp.req.ack_deadline.is_some_and(|t| t <= now) {
        qp.req.ack_deadline = None;
        let sending = matches!(qp.state, QpState::Rts | QpState::Sqd);
        if sending && qp.req.awaits_ack() {
            ctx.counters.ack_timeouts += 1;
            qp.counters.ack_timeouts += 1;
            let from = qp.req.una;
            force_retry(qp, ctx, now, from);
        }
    }
}
