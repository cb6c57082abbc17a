//! The responder: executes requests in PSN order and answers them (IBA 9.7; Linux
//! rxe_resp.c: ChkPsn → ChkOpSeq → ChkOpValid → ChkResource → ChkLength → ChkRkey → Execute →
//! Ack).
//!
//! Heads up, read these first, in IBA 9.7 (reliable service), the responder's rules: PSN
//! checks (the expected PSN executes; one ahead is a sequence error NAKed once; behind is a
//! duplicate that is re-acknowledged, a duplicate READ replayed and a duplicate atomic answered
//! from the saved result, never re-executed), the opcode sequence, the length and R_Key checks
//! (nothing is written unless every check passes), and the RNR NAK when no receive WQE is
//! posted.

use uroce_wire::aeth::{CreditCode, NakCode, Syndrome};
use uroce_wire::opcode::{OpFlags, Opcode};
use uroce_wire::{ExtHeaders, PacketRepr, Psn, aeth, atomic_ack_eth, bth};

use crate::completer;
use crate::ctx::{AsyncEvent, Ctx, Transmit};
use crate::memory::MemoryAccess;
use crate::qp::{InMessage, NakSent, Qp, RecvWqe, Resource, ResourceKind, Response};
use crate::sg::{ScatterError, scatter};
use crate::time::Instant;
use crate::tm::{self, Delivery, Header};
use crate::types::{
    Access, QpState, QpType, RecvWr, TmFlags, TmInfo, WcOpcode, WcStatus, WorkCompletion,
};

/// How long after a sequence NAK a packet asking for an acknowledgement gets the NAK again:
/// longer than the burst behind a gap takes to arrive, no longer than the requester's
/// shortest tail-loss probe wait (`completer::probe_timeout`, at least 200 µs after its last
/// packet, itself sent after the NAK arrived).
const RENAK_AFTER: crate::time::Duration = crate::time::Duration::from_micros(200);

/// A request packet for `qp` (already checked: ICRC, transport, peer, QP state).
pub(crate) fn on_request<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    now: Instant,
    packet: &PacketRepr<'_>,
) {
    if qp.init.qp_type == QpType::Uc {
        uc_request(qp, ctx, packet);
        return;
    }
    let psn = packet.bth.psn;
    let distance = psn.distance(qp.resp.epsn);
    if distance > 0 {
        // Ahead: a packet was lost. NAK once per gap, carrying the expected PSN. Again only
        // when a packet asks for an acknowledgement well after that NAK (the requester's
        // tail-loss probe: the NAK may have been lost, and without an answer the requester
        // waits for its ACK timeout), never for the burst of packets right behind the gap.
        match qp.resp.nak {
            NakSent::None => {
                ctx.counters.rcv_seq_err += 1;
                qp.counters.rcv_seq_err += 1;
            }
            NakSent::Sequence(at) if packet.bth.ack_req && now >= at + RENAK_AFTER => {
                ctx.counters.drop_out_of_sequence += 1;
            }
            NakSent::Sequence(_) | NakSent::Rnr => {
                ctx.counters.drop_out_of_sequence += 1;
                return;
            }
        }
        qp.resp.nak = NakSent::Sequence(now);
        let (epsn, msn) = (qp.resp.epsn, qp.resp.msn);
        queue(
            qp,
            ctx,
            Response::Ack { psn: epsn, syndrome: nak(NakCode::PSN_SEQUENCE_ERROR), msn },
        );
        return;
    }
    if distance < 0 {
        duplicate(qp, ctx, packet);
        return;
    }
    execute(qp, ctx, packet);
}

/// Gives up the message in progress: a SEND's receive WQE goes back to the head of the receive
/// queue, to take the next message; it is never completed with part of one.
fn abandon<M>(qp: &mut Qp, ctx: &mut Ctx<M>) {
    if let Some(InMessage::Send { wqe, .. }) = qp.resp.current.take() {
        ctx.unpop_recv(qp, wqe);
    }
}

/// A UC request (IBA 9.8): no acknowledgements and no retransmission. A PSN behind the expected
/// one is a duplicate and dropped; one ahead means packets were lost: the message in progress is
/// abandoned and reception resumes at the next FIRST or ONLY, so a message arrives whole or not
/// at all.
fn uc_request<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, packet: &PacketRepr<'_>) {
    let psn = packet.bth.psn;
    let Some(info) = packet.bth.opcode.info() else { return };
    let starts = info.has(OpFlags::FIRST);
    if psn.is_before(qp.resp.epsn) {
        // A duplicate (the network copied a packet): already seen, never delivered twice.
        ctx.counters.dup_req += 1;
        qp.counters.dup_req += 1;
        return;
    }
    if psn != qp.resp.epsn {
        ctx.counters.rcv_seq_err += 1;
        qp.counters.rcv_seq_err += 1;
        abandon(qp, ctx);
        qp.resp.uc_dropping = true;
    }
    qp.resp.epsn = psn.next();
    if starts {
        // A new message: whatever was open is gone (its end was lost).
        abandon(qp, ctx);
        qp.resp.uc_dropping = false;
    } else if qp.resp.uc_dropping {
        ctx.counters.drop_out_of_sequence += 1;
        return;
    }
    let mtu = qp.mtu.bytes() as usize;
    let len = packet.payload.len();
    let sequence_ok = match &qp.resp.current {
        None => starts,
        Some(InMessage::Send { .. }) => !starts && info.has(OpFlags::SEND),
        Some(InMessage::Write { .. }) => !starts && info.has(OpFlags::WRITE),
    };
    let right = if info.has(OpFlags::WRITE) { Access::REMOTE_WRITE } else { Access::NONE };
    let length_ok = if info.has(OpFlags::LAST) { len <= mtu } else { len == mtu };
    if !sequence_ok || !qp.access.contains(right) || !length_ok {
        fatal(qp, ctx, psn, NakCode::INVALID_REQUEST, None);
        return;
    }
    let placed =
        if info.has(OpFlags::SEND) { send(qp, ctx, packet) } else { write(qp, ctx, packet) };
    if !placed && qp.state != QpState::Error {
        abandon(qp, ctx);
        qp.resp.uc_dropping = !info.has(OpFlags::LAST);
    }
}

/// A UD datagram (IBA 9.8.2; 10.2.5), already checked for transport, partition and state.
///
/// The datagram (its DETH and Q_Key already checked) takes the next receive WQE: its first 40
/// bytes get the network header (`grh`), the payload follows, and the completion reports the
/// GRH, the source QP and the payload length plus 40, as on hardware. With no receive WQE posted it is
/// dropped (UD has no RNR NAK). UD has no sequence: each datagram that arrives is delivered,
/// once per copy; loss and duplicates are the application's to handle, as on any UD fabric.
///
/// A receive buffer too small for the datagram completes with `LOC_LEN_ERR` and the QP enters
/// Error, the same rule the UC responder follows (IBA 10.8.3: a local error affecting the
/// receive queue). Linux rxe differs here: it drops such a datagram and keeps the WQE.
pub(crate) fn ud_request<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    packet: &PacketRepr<'_>,
    deth: uroce_wire::deth::Repr,
    grh: &[u8; 40],
) {
    let Some(wqe) = ctx.pop_recv(qp) else {
        ctx.counters.drop_rnr += 1;
        return;
    };
    let mut data = core::mem::take(&mut ctx.scratch);
    data.clear();
    data.extend_from_slice(grh);
    data.extend_from_slice(packet.payload);
    let placed = scatter(ctx, qp.init.pd, &wqe.wr.sg_list, 0, &data);
    let byte_len = u32::try_from(data.len()).unwrap_or(u32::MAX);
    ctx.scratch = data;
    let psn = packet.bth.psn;
    match placed {
        Ok(()) => {
            let imm = packet.ext.immdt.map(|i| i.imm);
            let mut wc =
                recv_wc(qp, wqe.wr.wr_id, WcStatus::SUCCESS, WcOpcode::Recv, byte_len, imm);
            wc.src_qp = deth.src_qp;
            wc.grh = true;
            // The IPv4 form leaves the first 20 bytes zero; an IPv6 header starts with 6.
            wc.ipv4 = grh[0] >> 4 != 6;
            ctx.complete_solicited(qp.init.recv_cq, wc, packet.bth.solicited);
        }
        Err(ScatterError::Length) => {
            fatal(qp, ctx, psn, NakCode::INVALID_REQUEST, Some((wqe, WcStatus::LOC_LEN_ERR)));
        }
        Err(ScatterError::Protection) => {
            let recv = Some((wqe, WcStatus::LOC_PROT_ERR));
            fatal(qp, ctx, psn, NakCode::REMOTE_OPERATIONAL_ERROR, recv);
        }
    }
}

fn nak(code: NakCode) -> Syndrome {
    Syndrome::Nak(code)
}

/// A request behind the expected PSN: already executed, so never executed again.
fn duplicate<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, packet: &PacketRepr<'_>) {
    ctx.counters.dup_req += 1;
    qp.counters.dup_req += 1;
    let psn = packet.bth.psn;
    let op = packet.bth.opcode.as_rc();
    let msn = qp.resp.msn;
    // A duplicate READ is answered from the memory of the SRQ it names (IBA Annex A14),
    // without disturbing the message in progress; one that names none of the domain's is
    // not answered.
    let pd = match crate::xrc::target_of(qp, ctx, packet) {
        Ok(target) => target.map_or(qp.init.pd, |(_, pd, _)| pd),
        Err(_) => {
            ctx.counters.drop_dup_no_resource += 1;
            return;
        }
    };
    if op == Opcode::RC_RDMA_READ_REQUEST
        || op == Opcode::RC_COMPARE_SWAP
        || op == Opcode::RC_FETCH_ADD
    {
        let mtu = qp.mtu.bytes();
        let found = qp.resp.resources.iter().find_map(|r| {
            let k = u32::try_from(psn.distance(r.first_psn)).ok()?;
            match r.kind {
                // A duplicate READ may ask for the tail of the original (from a lost response
                // on): it must name exactly that tail (IBA 9.7).
                ResourceKind::Read { va, rkey, len, npkts } if k < npkts => {
                    let reth = packet.ext.reth?;
                    let skip = k * mtu;
                    let tail = reth.va == va.wrapping_add(u64::from(skip))
                        && reth.rkey == rkey
                        && reth.dma_len == len - skip;
                    tail.then_some(Response::Read {
                        first_psn: psn,
                        va: reth.va,
                        rkey,
                        pd,
                        len: reth.dma_len,
                        npkts: npkts - k,
                        next: 0,
                        msn,
                        replay: true,
                    })
                }
                ResourceKind::Atomic { orig } if k == 0 => {
                    Some(Response::Atomic { psn, orig, msn, replay: true })
                }
                _ => None,
            }
        });
        let Some(mut response) = found else {
            ctx.counters.drop_dup_no_resource += 1;
            return;
        };
        // Answering it again while the queue is at its bound would let a peer that repeats
        // requests grow it without end.
        if queued_read_atomic(qp).0 >= MAX_QUEUED_READ_ATOMIC {
            ctx.counters.drop_dup_no_resource += 1;
            return;
        }
        // The requester wants the responses from this PSN on: a replay of the same READ still
        // queued is superseded (otherwise duplicated requests would multiply the responses).
        if let Response::Read { first_psn, npkts, .. } = response {
            let end = first_psn.add(npkts);
            let replays_same_range = |r: &Response| match *r {
                Response::Read { first_psn: f, next, .. } => {
                    let at = f.add(next);
                    !at.is_before(first_psn) && at.is_before(end)
                }
                _ => false,
            };
            supersede(qp, &mut response, replays_same_range);
        }
        if let Response::Atomic { psn, .. } = response {
            supersede(
                qp,
                &mut response,
                |r| matches!(*r, Response::Atomic { psn: p, .. } if p == psn),
            );
        }
        queue(qp, ctx, response);
    } else if packet.bth.ack_req {
        // Re-acknowledge everything executed so far (IBA 9.7).
        let last = qp.resp.epsn.sub(1);
        queue(qp, ctx, Response::Ack { psn: last, syndrome: ack_syndrome(qp, ctx), msn });
    }
}

/// Removes the queued answers `replaced` picks, which `response` supersedes. If one of them
/// answered a request first seen, `response` takes its place as that request's answer: the
/// requester still waits for it.
fn supersede(qp: &mut Qp, response: &mut Response, replaced: impl Fn(&Response) -> bool) {
    let mut took_new = false;
    qp.resp.out.retain(|r| {
        let gone = replaced(r);
        took_new |= gone && r.answers_new_request();
        !gone
    });
    if took_new {
        response.set_replay(false);
    }
}

/// The ACK syndrome with the credits this responder can advertise: receive WQEs posted
/// (IBA 9.7; Linux rxe always says "unlimited").
fn ack_syndrome<M>(qp: &Qp, ctx: &Ctx<M>) -> Syndrome {
    let posted = u32::try_from(ctx.recvs_posted(qp)).unwrap_or(u32::MAX);
    Syndrome::Ack(CreditCode::for_available(posted))
}

/// Queues a response; an ACK replaces a queued ACK not yet sent (coalescing).
fn queue<M>(qp: &mut Qp, ctx: &mut Ctx<M>, response: Response) {
    let is_ack = |r: &Response| matches!(r, Response::Ack { syndrome: Syndrome::Ack(_), .. });
    if is_ack(&response) && qp.resp.out.back().is_some_and(is_ack) {
        qp.resp.out.pop_back();
    }
    qp.resp.out.push_back(response);
    ctx.schedule(qp);
}

/// A fatal responder error: NAK the request, complete the receive WQE (if any) with
/// `recv_status`, and move the QP to Error (IBA 9.7 "Class B/C/D errors").
fn fatal<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    psn: Psn,
    code: NakCode,
    recv: Option<(RecvWqe, WcStatus)>,
) {
    fatal_raising(qp, ctx, psn, code, recv, AsyncEvent::QpFatal);
}

/// A peer's request found its memory gone (a page of the region unmapped after
/// registration): to the peer a remote access error, as for a key that does not allow the
/// access (IBA 9.7.5.2.4); to the application the local access violation event (IBA
/// 11.6.3.1), as a ConnectX raises for a responder's access violation.
fn memory_gone<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, psn: Psn) {
    ctx.counters.memory_faults += 1;
    fatal_raising(qp, ctx, psn, NakCode::REMOTE_ACCESS_ERROR, None, AsyncEvent::QpAccessError);
}

fn fatal_raising<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    psn: Psn,
    code: NakCode,
    recv: Option<(RecvWqe, WcStatus)>,
    event: fn(uroce_wire::Qpn) -> AsyncEvent,
) {
    if !qp.init.qp_type.is_reliable() {
        // UC and UD answer nothing (IBA 9.8): a request the checks refuse is dropped with the
        // rest of its message; only a failure of the local receive buffer ends the QP.
        match recv {
            Some((wqe, status @ (WcStatus::LOC_LEN_ERR | WcStatus::LOC_PROT_ERR))) => {
                let wc = recv_wc(qp, wqe.wr.wr_id, status, WcOpcode::Recv, 0, None);
                ctx.complete(ctx.recv_cq(qp), wc);
                qp.error_status = Some(status);
                ctx.async_events.push_back(event(qp.qpn));
                completer::enter_error(qp, ctx);
            }
            other => {
                if let Some((wqe, _)) = other {
                    ctx.unpop_recv(qp, wqe);
                }
                abandon(qp, ctx);
                ctx.counters.drop_uc_invalid += 1;
                qp.resp.uc_dropping = true;
            }
        }
        return;
    }
    ctx.counters.err_naks_sent += 1;
    let msn = qp.resp.msn;
    queue(qp, ctx, Response::Ack { psn, syndrome: nak(code), msn });
    // The responder's view of why it stopped: the receive's status, or the NAK it sent.
    qp.error_status = Some(match recv {
        Some((_, status)) => status,
        None if code == NakCode::INVALID_REQUEST => WcStatus::REM_INV_REQ_ERR,
        None if code == NakCode::REMOTE_ACCESS_ERROR => WcStatus::REM_ACCESS_ERR,
        None => WcStatus::REM_OP_ERR,
    });
    if let Some((wqe, status)) = recv {
        let wc = recv_wc(qp, wqe.wr.wr_id, status, WcOpcode::Recv, 0, None);
        ctx.complete(ctx.recv_cq(qp), wc);
    }
    ctx.async_events.push_back(event(qp.qpn));
    completer::enter_error(qp, ctx);
}

pub(crate) fn recv_wc(
    qp: &Qp,
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    byte_len: u32,
    imm: Option<[u8; 4]>,
) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status,
        opcode,
        byte_len,
        imm,
        qp_num: qp.qpn,
        src_qp: qp.dest_qpn,
        grh: false,
        ipv4: false,
        timestamp: Instant::ZERO,
        tm: None,
        invalidated_rkey: None,
    }
}

/// The request at the expected PSN.
fn execute<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, packet: &PacketRepr<'_>) {
    let psn = packet.bth.psn;
    let op = packet.bth.opcode;
    let Some(info) = op.info() else { return };
    let mtu = qp.mtu.bytes() as usize;
    let len = packet.payload.len();

    // ChkOpSeq (IBA 9.7): a FIRST or ONLY starts a message only when none is open; a
    // MIDDLE or LAST continues the open one of the same kind.
    let continues =
        info.has(OpFlags::MIDDLE) || (info.has(OpFlags::LAST) && !info.has(OpFlags::FIRST));
    let sequence_ok = match &qp.resp.current {
        None => !continues,
        Some(InMessage::Send { .. }) => continues && info.has(OpFlags::SEND),
        Some(InMessage::Write { .. }) => continues && info.has(OpFlags::WRITE),
    };
    // ChkOpValid: the QP must allow the remote operation (rxe: unsupported opcode → NAK-INV).
    let right = if info.has(OpFlags::WRITE) || info.has(OpFlags::ATOMIC_WRITE) {
        Access::REMOTE_WRITE
    } else if info.has(OpFlags::READ) {
        Access::REMOTE_READ
    } else if info.has(OpFlags::ATOMIC) {
        Access::REMOTE_ATOMIC
    } else {
        Access::NONE
    };
    // ChkLength: FIRST and MIDDLE carry exactly one MTU, LAST and ONLY at most one (IBA 9.7).
    let length_ok = if info.has(OpFlags::LAST) { len <= mtu } else { len == mtu };
    // ChkResource (IBA 9.5: a requester keeps at most the responder's resources of READ and
    // atomic requests outstanding; rxe's RESPST_ERR_TOO_MANY_RDMA_ATM_REQ). A request whose
    // answer has not gone out counts until its last response packet has; the answers to
    // duplicates do not count (the requester resent them for requests it counts once, and
    // can have seen the first answer complete meanwhile), but all answers together stay
    // under a bound a peer cannot push.
    let resources_ok = !(info.has(OpFlags::READ) || info.has(OpFlags::ATOMIC)) || {
        let (all, new) = queued_read_atomic(qp);
        new < usize::from(qp.max_dest_rd_atomic) && all < MAX_QUEUED_READ_ATOMIC
    };
    // IBA Annex A14: an XRC target takes the request into the XRC SRQ it names, which must
    // be in the target's domain; one that names another is an invalid request.
    let xrc_ok = !sequence_ok || crate::xrc::bind_target(qp, ctx, packet).is_ok();
    if !sequence_ok || !xrc_ok || !qp.access.contains(right) || !length_ok || !resources_ok {
        let recv = match qp.resp.current.take() {
            Some(InMessage::Send { wqe, .. }) => Some((wqe, WcStatus::REM_INV_REQ_ERR)),
            _ => None,
        };
        fatal(qp, ctx, psn, NakCode::INVALID_REQUEST, recv);
        return;
    }

    let advanced = if info.has(OpFlags::SEND) {
        send(qp, ctx, packet)
    } else if info.has(OpFlags::WRITE) {
        write(qp, ctx, packet)
    } else if info.has(OpFlags::READ) {
        return read(qp, ctx, packet);
    } else if info.has(OpFlags::ATOMIC) {
        return atomic(qp, ctx, packet);
    } else if info.has(OpFlags::ATOMIC_WRITE) {
        atomic_write(qp, ctx, packet)
    } else {
        false
    };
    if !advanced {
        return;
    }
    qp.resp.epsn = psn.next();
    qp.resp.nak = NakSent::None;
    if info.has(OpFlags::LAST) {
        qp.resp.msn = qp.resp.msn.next();
    }
    if packet.bth.ack_req {
        let (msn, syndrome) = (qp.resp.msn, ack_syndrome(qp, ctx));
        queue(qp, ctx, Response::Ack { psn, syndrome, msn });
    }
}

/// Takes the receive WQE a message needs, or answers RNR NAK (IBA 9.7). The NAK stands for
/// the packets behind it too: they are dropped without a sequence NAK until the requester
/// comes back to this PSN.
fn take_recv<M>(qp: &mut Qp, ctx: &mut Ctx<M>, psn: Psn) -> Option<RecvWqe> {
    let wqe = ctx.pop_recv(qp);
    if wqe.is_none() && qp.init.qp_type == QpType::Uc {
        // UC has no RNR NAK: the message is dropped (IBA 9.8).
        ctx.counters.drop_rnr += 1;
        qp.resp.uc_dropping = true;
    } else if wqe.is_none() {
        ctx.counters.rnr_naks_sent += 1;
        qp.counters.rnr_naks_sent += 1;
        ctx.counters.drop_rnr += 1;
        qp.resp.nak = NakSent::Rnr;
        let msn = qp.resp.msn;
        let syndrome = Syndrome::RnrNak(qp.min_rnr_timer);
        queue(qp, ctx, Response::Ack { psn, syndrome, msn });
    }
    wqe
}

/// How the first packet of a new SEND is taken.
enum NewSend {
    /// Into this WQE (of the receive queue, or a posted tag's buffer).
    Into(RecvWqe, Delivery),
    /// Whole, by the device: a matched rendezvous request.
    Done,
    /// Not at all: no receive WQE (RNR NAK queued).
    Refused,
}

/// Takes what a new SEND is received into. At a TM-SRQ the first packet's tag-matching
/// header decides (see [`crate::tm`]): a matched eager message goes to its tag's buffer, a
/// matched rendezvous request is carried out by the device, and everything else takes a WQE
/// of the SRQ, a tagged one counted as unexpected.
fn start_send<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    packet: &PacketRepr<'_>,
    info: OpFlags,
) -> NewSend {
    let psn = packet.bth.psn;
    let Some(srq) = qp.init.srq.filter(|h| tm::tag_matching(ctx, *h).is_some()) else {
        return take_recv(qp, ctx, psn)
            .map_or(NewSend::Refused, |w| NewSend::Into(w, Delivery::Plain));
    };
    let whole = info.contains(OpFlags::FIRST) && info.contains(OpFlags::LAST);
    let header = Header::parse(packet.payload, whole);
    let tag = match header {
        Header::Eager(tag) | Header::Rndv { info: tag, .. } => Some(tag),
        Header::Other | Header::NoTag | Header::ForSoftware => None,
    };
    let taken = tag.and_then(|t| tm::tag_matching(ctx, srq)?.take_match(t.tag).map(|m| (t, m)));
    if let Some((tag, (handle, recv_wr_id, sg_list))) = taken {
        let wqe = RecvWqe { wr: RecvWr { wr_id: recv_wr_id, sg_list: sg_list.into() } };
        if let Header::Rndv { va, rkey, len, headers, .. } = header {
            let request =
                tm::Rendezvous { srq, handle, recv_wr_id, info: tag, headers, va, rkey, len };
            tm::start_rendezvous(qp, ctx, request, wqe, packet.payload);
            return NewSend::Done;
        }
        return NewSend::Into(wqe, Delivery::Expected { handle, info: tag });
    }
    let delivery = match header {
        Header::Other => Delivery::Plain,
        Header::NoTag => Delivery::NoTag,
        Header::Eager(_) | Header::Rndv { .. } | Header::ForSoftware => Delivery::Unexpected,
    };
    let Some(wqe) = take_recv(qp, ctx, psn) else { return NewSend::Refused };
    if delivery == Delivery::Unexpected
        && let Some(tm) = tm::tag_matching(ctx, srq)
    {
        tm.count_unexpected();
    }
    NewSend::Into(wqe, delivery)
}

/// SEND FIRST/MIDDLE/LAST/ONLY. Returns whether the packet was consumed.
fn send<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, packet: &PacketRepr<'_>) -> bool {
    let psn = packet.bth.psn;
    let info = packet.bth.opcode.info().map_or(OpFlags::NONE, |i| i.flags);
    let (wqe, written, delivery) = match qp.resp.current.take() {
        Some(InMessage::Send { wqe, written, delivery }) => (wqe, written, delivery),
        _ => match start_send(qp, ctx, packet, info) {
            NewSend::Into(wqe, delivery) => (wqe, 0, delivery),
            NewSend::Done => return true,
            NewSend::Refused => return false,
        },
    };
    // A matched message's buffer takes its payload without the TMH.
    let data = match delivery {
        Delivery::Expected { .. } if info.contains(OpFlags::FIRST) => {
            packet.payload.get(tm::TMH_LEN..).unwrap_or(&[])
        }
        _ => packet.payload,
    };
    let failed = match scatter(ctx, qp.init.pd, &wqe.wr.sg_list, u64::from(written), data) {
        Ok(()) => None,
        // IBA 9.7: the receive buffer is too small: LOC_LEN_ERR here,
        // NAK invalid request to the sender (REM_INV_REQ_ERR there).
        Err(ScatterError::Length) => Some((NakCode::INVALID_REQUEST, WcStatus::LOC_LEN_ERR)),
        Err(ScatterError::Protection) => {
            Some((NakCode::REMOTE_OPERATIONAL_ERROR, WcStatus::LOC_PROT_ERR))
        }
    };
    if let Some((code, status)) = failed {
        tm::delivery_ended(ctx, qp, delivery);
        fatal(qp, ctx, psn, code, Some((wqe, status)));
        return false;
    }
    let written = written + u32::try_from(data.len()).unwrap_or(u32::MAX);
    let cq = ctx.recv_cq(qp);
    if !info.contains(OpFlags::LAST) {
        // A matched message of several packets reports the match at once; its data when
        // the last packet is in (tag_matching.md).
        if let (Delivery::Expected { info: tag, .. }, true) =
            (delivery, info.contains(OpFlags::FIRST))
        {
            let flags = TmFlags::MATCH;
            let tm = Some(TmInfo { tag: tag.tag, app_ctx: tag.app_ctx, flags });
            let wc = tm::tm_recv_wc(qp, wqe.wr.wr_id, WcStatus::SUCCESS, 0, tm);
            ctx.complete(cq, wc);
        }
        qp.resp.current = Some(InMessage::Send { wqe, written, delivery });
        return true;
    }
    // IBA 9.4.1.2 / 10.6.7.2.7: a SEND with invalidate frees the type 2 window its IETH
    // names, bound to this QP, before the receive completes; a key that cannot be
    // invalidated is an invalid request (rxe: the receive ends in REM_INV_REQ_ERR).
    let invalidated = packet.ext.ieth.map(|i| i.rkey);
    if let Some(rkey) = invalidated
        && ctx.mrs.invalidate(rkey, qp.init.pd, qp.qpn, true).is_err()
    {
        ctx.counters.invalidate_errors += 1;
        tm::delivery_ended(ctx, qp, delivery);
        let refused = Some((wqe, WcStatus::REM_INV_REQ_ERR));
        fatal(qp, ctx, psn, NakCode::INVALID_REQUEST, refused);
        return false;
    }
    let imm = packet.ext.immdt.map(|i| i.imm);
    let (opcode, tm) = match delivery {
        Delivery::Plain => (WcOpcode::Recv, None),
        Delivery::NoTag => (WcOpcode::TmNoTag, Some(TmInfo::default())),
        Delivery::Unexpected => (WcOpcode::TmRecv, Some(TmInfo::default())),
        // One packet: match and data in one completion. Several: the match was reported
        // with the tag at the first; this one names the buffer by wr_id only, as the
        // rendezvous's data completion does.
        Delivery::Expected { info: tag, .. } if info.contains(OpFlags::FIRST) => {
            let flags = TmFlags::MATCH | TmFlags::DATA_VALID;
            (WcOpcode::TmRecv, Some(TmInfo { tag: tag.tag, app_ctx: tag.app_ctx, flags }))
        }
        Delivery::Expected { .. } => {
            (WcOpcode::TmRecv, Some(TmInfo { flags: TmFlags::DATA_VALID, ..TmInfo::default() }))
        }
    };
    tm::delivery_ended(ctx, qp, delivery);
    let mut wc = recv_wc(qp, wqe.wr.wr_id, WcStatus::SUCCESS, opcode, written, imm);
    wc.invalidated_rkey = invalidated;
    wc.tm = tm;
    ctx.complete_solicited(cq, wc, packet.bth.solicited);
    true
}

/// RDMA WRITE FIRST/MIDDLE/LAST/ONLY (with immediate). Returns whether the packet was consumed.
fn write<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, packet: &PacketRepr<'_>) -> bool {
    let psn = packet.bth.psn;
    let info = packet.bth.opcode.info().map_or(OpFlags::NONE, |i| i.flags);
    let len = u32::try_from(packet.payload.len()).unwrap_or(u32::MAX);
    let (va, rkey, dma_len, written) = match (qp.resp.current.take(), packet.ext.reth) {
        (Some(InMessage::Write { va, rkey, dma_len, written }), _) => (va, rkey, dma_len, written),
        (None, Some(reth)) => (reth.va, reth.rkey, reth.dma_len, 0),
        _ => {
            fatal(qp, ctx, psn, NakCode::INVALID_REQUEST, None);
            return false;
        }
    };
    let last = info.contains(OpFlags::LAST);
    // ChkLength: the packets must add up to the DMA length exactly (IBA 9.7).
    let total = written.saturating_add(len);
    if total > dma_len || (last && total != dma_len) || dma_len > 1 << 31 {
        fatal(qp, ctx, psn, NakCode::INVALID_REQUEST, None);
        return false;
    }
    // ChkRkey, on every packet, so a region deregistered mid-message stops the writes
    // (IBA 9.7). A zero-length WRITE names no memory and is not checked.
    let mut host = va;
    if dma_len > 0 {
        let addr = va.wrapping_add(u64::from(written));
        let (pd, qpn) = (qp.init.pd, qp.qpn);
        let here = ctx.mrs.check_remote(rkey, pd, qpn, addr, u64::from(len), Access::REMOTE_WRITE);
        let whole =
            ctx.mrs.check_remote(rkey, pd, qpn, va, u64::from(dma_len), Access::REMOTE_WRITE);
        match (here, whole) {
            (Ok(at), Ok(_)) => host = at,
            _ => {
                fatal(qp, ctx, psn, NakCode::REMOTE_ACCESS_ERROR, None);
                return false;
            }
        }
    }
    // WRITE with immediate consumes a receive WQE where the immediate arrives (IBA 9.4).
    let recv = if info.contains(OpFlags::IMMEDIATE) {
        match take_recv(qp, ctx, psn) {
            Some(w) => Some(w),
            None => {
                // Keep the message open: the retried LAST comes back to this point.
                qp.resp.current =
                    (written > 0).then_some(InMessage::Write { va, rkey, dma_len, written });
                return false;
            }
        }
    } else {
        None
    };
    // `host`: where this packet's bytes go (the key names `va + written`).
    if ctx.mem.write(host, packet.payload).is_err() {
        if let Some(wqe) = recv {
            ctx.unpop_recv(qp, wqe);
        }
        memory_gone(qp, ctx, psn);
        return false;
    }
    if last {
        if let Some(wqe) = recv {
            let imm = packet.ext.immdt.map(|i| i.imm);
            let wc = recv_wc(
                qp,
                wqe.wr.wr_id,
                WcStatus::SUCCESS,
                WcOpcode::RecvRdmaWithImm,
                dma_len,
                imm,
            );
            ctx.complete_solicited(qp.init.recv_cq, wc, packet.bth.solicited);
        }
    } else {
        qp.resp.current = Some(InMessage::Write { va, rkey, dma_len, written: total });
    }
    true
}

/// RDMA READ request: checks and remembers it; the responses go out from `poll`.
fn read<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, packet: &PacketRepr<'_>) {
    let psn = packet.bth.psn;
    let Some(reth) = packet.ext.reth else { return };
    if reth.dma_len > 1 << 31 {
        fatal(qp, ctx, psn, NakCode::INVALID_REQUEST, None);
        return;
    }
    let host = if reth.dma_len > 0 {
        let (pd, qpn, len) = (qp.init.pd, qp.qpn, u64::from(reth.dma_len));
        match ctx.mrs.check_remote(reth.rkey, pd, qpn, reth.va, len, Access::REMOTE_READ) {
            Ok(host) => host,
            Err(_) => {
                fatal(qp, ctx, psn, NakCode::REMOTE_ACCESS_ERROR, None);
                return;
            }
        }
    } else {
        reth.va
    };
    // Registration pins nothing: the pages must still be there when the READ is taken on
    // (a page unmapped later, while its responses go out, is caught on the way out).
    if ctx.mem.check_readable(host, reth.dma_len as usize).is_err() {
        memory_gone(qp, ctx, psn);
        return;
    }
    let npkts = reth.dma_len.div_ceil(qp.mtu.bytes()).max(1);
    remember(
        qp,
        Resource {
            first_psn: psn,
            kind: ResourceKind::Read { va: reth.va, rkey: reth.rkey, len: reth.dma_len, npkts },
        },
    );
    qp.resp.msn = qp.resp.msn.next();
    qp.resp.epsn = psn.add(npkts);
    qp.resp.nak = NakSent::None;
    let msn = qp.resp.msn;
    queue(
        qp,
        ctx,
        Response::Read {
            first_psn: psn,
            va: reth.va,
            rkey: reth.rkey,
            pd: qp.init.pd,
            len: reth.dma_len,
            npkts,
            next: 0,
            msn,
            replay: false,
        },
    );
}

/// Atomic compare-and-swap or fetch-and-add: executed once, the result kept for duplicates.
fn atomic<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, packet: &PacketRepr<'_>) {
    let psn = packet.bth.psn;
    let Some(a) = packet.ext.atomic_eth else {
        return;
    };
    // IBA 9.4: the target must be 8-byte aligned; a misaligned one is an invalid request.
    if a.va % 8 != 0 {
        fatal(qp, ctx, psn, NakCode::INVALID_REQUEST, None);
        return;
    }
    let Ok(host) = ctx.mrs.check_remote(a.rkey, qp.init.pd, qp.qpn, a.va, 8, Access::REMOTE_ATOMIC)
    else {
        fatal(qp, ctx, psn, NakCode::REMOTE_ACCESS_ERROR, None);
        return;
    };
    let orig = if packet.bth.opcode.as_rc() == Opcode::RC_COMPARE_SWAP {
        ctx.mem.compare_and_swap(host, a.compare, a.swap_add)
    } else {
        ctx.mem.fetch_and_add(host, a.swap_add)
    };
    let Ok(orig) = orig else {
        memory_gone(qp, ctx, psn);
        return;
    };
    remember(qp, Resource { first_psn: psn, kind: ResourceKind::Atomic { orig } });
    qp.resp.msn = qp.resp.msn.next();
    qp.resp.epsn = psn.next();
    qp.resp.nak = NakSent::None;
    let msn = qp.resp.msn;
    queue(qp, ctx, Response::Atomic { psn, orig, msn, replay: false });
}

/// RDMA ATOMIC WRITE (IBA 1.5; rxe's `atomic_write_reply`): 8 bytes stored at once at an
/// 8-byte aligned address the key allows writing; anything else is an invalid request.
/// Acknowledged as a WRITE; a duplicate is acknowledged again, never stored again.
fn atomic_write<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, packet: &PacketRepr<'_>) -> bool {
    let psn = packet.bth.psn;
    let Some(reth) = packet.ext.reth else { return false };
    let Ok(bytes) = <[u8; 8]>::try_from(packet.payload) else {
        fatal(qp, ctx, psn, NakCode::INVALID_REQUEST, None);
        return false;
    };
    if reth.va % 8 != 0 || reth.dma_len != 8 {
        fatal(qp, ctx, psn, NakCode::INVALID_REQUEST, None);
        return false;
    }
    let Ok(host) =
        ctx.mrs.check_remote(reth.rkey, qp.init.pd, qp.qpn, reth.va, 8, Access::REMOTE_WRITE)
    else {
        fatal(qp, ctx, psn, NakCode::REMOTE_ACCESS_ERROR, None);
        return false;
    };
    if ctx.mem.atomic_write(host, u64::from_ne_bytes(bytes)).is_err() {
        memory_gone(qp, ctx, psn);
        return false;
    }
    true
}

/// READ and atomic answers, duplicates' included, a QP's responder holds queued at most (about
/// 160 KiB): a bound on what a peer repeating requests can make it hold.
pub(crate) const MAX_QUEUED_READ_ATOMIC: usize = 4096;

/// READ and atomic responses queued and not yet all sent: all of them, and those that answer
/// requests first seen.
fn queued_read_atomic(qp: &Qp) -> (usize, usize) {
    let mut counts = (0, 0);
    for r in &qp.resp.out {
        if matches!(r, Response::Read { .. } | Response::Atomic { .. }) {
            counts.0 += 1;
            counts.1 += usize::from(r.answers_new_request());
        }
    }
    counts
}

/// Keeps a READ or atomic for duplicates, evicting the oldest beyond `max_dest_rd_atomic`.
fn remember(qp: &mut Qp, res: Resource) {
    while qp.resp.resources.len() >= usize::from(qp.max_dest_rd_atomic) {
        qp.resp.resources.pop_front();
    }
    qp.resp.resources.push_back(res);
}

/// Builds the next response of `qp` into `buf`.
pub(crate) fn poll<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    buf: &mut Vec<u8>,
) -> Option<Transmit> {
    let response = *qp.resp.out.front()?;
    let mut ext = ExtHeaders::default();
    let (opcode, psn) = match response {
        Response::Ack { psn, syndrome, msn } => {
            qp.resp.out.pop_front();
            ext.aeth = Some(aeth::Repr { syndrome, msn });
            (Opcode::RC_ACKNOWLEDGE, psn)
        }
        Response::Atomic { psn, orig, msn, .. } => {
            qp.resp.out.pop_front();
            ext.aeth = Some(aeth::Repr { syndrome: ack_syndrome(qp, ctx), msn });
            ext.atomic_ack_eth = Some(atomic_ack_eth::Repr { orig });
            (Opcode::RC_ATOMIC_ACKNOWLEDGE, psn)
        }
        Response::Read { first_psn, va, rkey, pd, len, npkts, next, msn, .. } => {
            let mtu = qp.mtu.bytes();
            let (first, last) = (next == 0, next + 1 >= npkts);
            let opcode = match (first, last) {
                (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
            };
            if first || last {
                ext.aeth = Some(aeth::Repr { syndrome: ack_syndrome(qp, ctx), msn });
            }
            let offset = next * mtu;
            let chunk = len.saturating_sub(offset).min(mtu);
            let addr = va.wrapping_add(u64::from(offset));
            let psn = first_psn.add(next);
            // The region may have been deregistered since the request was checked.
            ctx.pieces.clear();
            if chunk > 0 {
                let qpn = qp.qpn;
                let right = Access::REMOTE_READ;
                let Ok(host) = ctx.mrs.check_remote(rkey, pd, qpn, addr, u64::from(chunk), right)
                else {
                    qp.resp.out.pop_front();
                    fatal(qp, ctx, psn, NakCode::REMOTE_ACCESS_ERROR, None);
                    return poll(qp, ctx, buf);
                };
                ctx.pieces.push((host, chunk));
            }
            if last {
                qp.resp.out.pop_front();
            } else if let Some(Response::Read { next, .. }) = qp.resp.out.front_mut() {
                *next += 1;
            }
            (opcode, psn)
        }
    };
    // XRC answers with RC's responses in its own range.
    let opcode = Opcode(opcode.0 | qp.init.qp_type.opcode_base());
    let b = bth::Repr::new(opcode, qp.dest_qpn, psn);
    // A READ response's payload is a piece of registered memory; nothing else carries one.
    let is_read = matches!(response, Response::Read { .. });
    let pieces = if is_read { core::mem::take(&mut ctx.pieces) } else { Vec::new() };
    let repr = PacketRepr::new(b, ext, &[]);
    let tx = ctx.emit(qp, &repr, &pieces, buf);
    if is_read {
        ctx.pieces = pieces;
    }
    tx
}
