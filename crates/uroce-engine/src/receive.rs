//! The receive path: every check a datagram passes before a QP sees it (ICRC, BTH, QPN,
//! transport, P_Key, state, peer, Q_Key), each refusal counted, then the QP's responder or
//! completer, or every QP attached to a multicast group.

use core::net::SocketAddr;

use uroce_wire::icrc::{IdRecovery, PseudoCache, PseudoHeader, RxFlow};
use uroce_wire::opcode::OpFlags;
use uroce_wire::{PacketRepr, Qpn, ROCE_V2_PORT, bth};

use crate::counters::Counters;
use crate::ctx::{AsyncEvent, Ctx, RxInfo};
use crate::device::Device;
use crate::memory::MemoryAccess;
use crate::qp::Qp;
use crate::time::Instant;
use crate::types::{QpState, QpType};
use crate::{completer, responder};

impl<M: MemoryAccess> Device<M> {
    /// Takes in one received UDP payload (BTH through ICRC) that arrived as `rx` says.
    ///
    /// Every packet that is not processed increments exactly one drop counter (or
    /// `icrc_errors`); a multicast packet counts once as received, and then once more for each
    /// attached QP that refuses it. Nothing here panics on any input.
    pub fn handle_datagram(&mut self, now: Instant, rx: &RxInfo, payload: &[u8]) {
        self.ctx.intact = false;
        self.handle(now, rx, payload);
    }

    /// As [`Device::handle_datagram`], for a datagram whose path guarantees its integrity
    /// (shared memory between processes of one host): its ICRC is not checked (IBA Annex
    /// A17.3.3 has the ICRC protect what the link layer does not; memory is not a lossy link),
    /// and may be left zero by the sender. Every other check is made.
    pub fn handle_datagram_intact(&mut self, now: Instant, rx: &RxInfo, payload: &[u8]) {
        self.ctx.intact = true;
        self.handle(now, rx, payload);
        self.ctx.intact = false;
    }

    /// Sends gathered packets with their ICRC left zero (`Transmit::icrc_deferred`): the
    /// runtime computes it for the paths that need it (UDP, capture) and skips it where the
    /// receiver takes the packet with [`Device::handle_datagram_intact`].
    pub fn set_defer_icrc(&mut self, defer: bool) {
        self.ctx.defer_icrc = defer;
    }

    fn handle(&mut self, now: Instant, rx: &RxInfo, payload: &[u8]) {
        self.ctx.advance_clock(now);
        self.handle_unwatched(now, rx, payload);
        if let Ok(view) = bth::Packet::new_checked(payload)
            && view.dest_qp() != Qpn::MULTICAST
        {
            self.watch(view.dest_qp().get());
        }
    }

    fn handle_unwatched(&mut self, now: Instant, rx: &RxInfo, payload: &[u8]) {
        let intact = self.ctx.intact;
        let c = &mut self.ctx.counters;
        let Ok(view) = bth::Packet::new_checked(payload) else {
            c.drop_malformed += 1;
            return;
        };
        let dest_qp = view.dest_qp();
        // IBA 10.5.2: multicast packets carry destination QPN 0xFFFFFF, and only they do.
        let multicast = rx.dst.is_multicast();
        if multicast != (dest_qp == Qpn::MULTICAST)
            || (!multicast && rx.dst != self.ctx.config.addr)
        {
            c.drop_bad_dest += 1;
            return;
        }
        if multicast {
            self.handle_multicast(now, rx, payload);
            return;
        }
        if dest_qp.get() == uroce_wire::mad::GSI_QPN {
            if let Some(packet) =
                verify_datagram(&mut self.ud_rx_pseudo, &mut self.icrc, c, rx, payload, intact)
                && self.gsi.receive(rx.src.ip(), &packet, c)
            {
                count_rcvd(&mut self.ctx.counters, payload.len());
            }
            return;
        }
        let Some(qp) = self.qps.get_mut(&dest_qp.get()) else {
            c.drop_unknown_qp += 1;
            return;
        };
        if qp.init.qp_type == QpType::Ud {
            let Some(packet) =
                verify_datagram(&mut self.ud_rx_pseudo, &mut self.icrc, c, rx, payload, intact)
            else {
                return;
            };
            if deliver_ud(qp, &mut self.ctx, rx, &packet, payload.len()) {
                count_rcvd(&mut self.ctx.counters, payload.len());
            }
            return;
        }
        // ICRC first (IBA Annex A17.3.3): the flow from this peer is kept per QP.
        let flow = match &mut qp.rx_flow {
            Some((from, flow)) if *from == rx.src => flow,
            other => {
                let local = SocketAddr::new(rx.dst, ROCE_V2_PORT);
                let Ok(p) = PseudoHeader::for_endpoints(rx.src, local) else {
                    c.drop_wrong_peer += 1;
                    return;
                };
                &mut other.insert((rx.src, RxFlow::new(p))).1
            }
        };
        let Some(packet) = verify_and_parse(flow, &mut self.icrc, c, payload, intact) else {
            return;
        };
        // Header checks (IBA 9.6: transport, partition, source; rxe_recv.c hdr_check).
        if !headers_fit(qp, &packet, c) {
            return;
        }
        if qp.av.is_none_or(|av| av.dest != rx.src.ip()) {
            c.drop_wrong_peer += 1;
            return;
        }
        let Some(info) = packet.bth.opcode.info() else {
            c.drop_malformed += 1;
            return;
        };
        if info.has(OpFlags::REQUEST) {
            if !qp.can_receive() {
                c.drop_bad_state += 1;
                return;
            }
            count_rcvd(c, payload.len());
            count_qp_rcvd(qp, payload.len());
            // IBA 11.6.3: the first packet received in RTR establishes communication.
            if qp.state == QpState::Rtr && !qp.comm_established {
                qp.comm_established = true;
                self.ctx.async_events.push_back(AsyncEvent::CommEstablished(qp.qpn));
            }
            responder::on_request(qp, &mut self.ctx, now, &packet);
        } else {
            if !matches!(qp.state, QpState::Rts | QpState::Sqd) {
                c.drop_bad_state += 1;
                return;
            }
            count_rcvd(c, payload.len());
            count_qp_rcvd(qp, payload.len());
            completer::on_response(qp, &mut self.ctx, now, &packet);
        }
    }

    /// A datagram to a multicast group: checked once, then offered to every attached QP, each
    /// with its own receive queue and checks (IBA 10.5.2).
    fn handle_multicast(&mut self, _now: Instant, rx: &RxInfo, payload: &[u8]) {
        let c = &mut self.ctx.counters;
        let Some(members) = self.mcast.get_mut(&rx.dst).map(core::mem::take) else {
            c.drop_bad_dest += 1;
            return;
        };
        let intact = self.ctx.intact;
        if let Some(packet) =
            verify_datagram(&mut self.ud_rx_pseudo, &mut self.icrc, c, rx, payload, intact)
        {
            let mut taken = false;
            for qpn in &members {
                if let Some(qp) = self.qps.get_mut(&qpn.get()) {
                    taken |= deliver_ud(qp, &mut self.ctx, rx, &packet, payload.len());
                    self.watch.update(qp);
                }
            }
            if taken {
                count_rcvd(&mut self.ctx.counters, payload.len());
            }
        }
        if let Some(slot) = self.mcast.get_mut(&rx.dst) {
            *slot = members;
        }
    }
}

/// Verifies the ICRC of a datagram for a UD QP and parses it, counting a failure.
fn verify_datagram<'a>(
    cache: &mut PseudoCache,
    icrc: &mut IdRecovery,
    c: &mut Counters,
    rx: &RxInfo,
    payload: &'a [u8],
    intact: bool,
) -> Option<PacketRepr<'a>> {
    let Ok(flow) = cache.flow(rx.src, SocketAddr::new(rx.dst, ROCE_V2_PORT)) else {
        c.drop_bad_dest += 1;
        return None;
    };
    verify_and_parse(flow, icrc, c, payload, intact)
}

/// Verifies the ICRC (IBA Annex A17.3.3) and parses the packet, counting a failure.
fn verify_and_parse<'a>(
    flow: &mut RxFlow,
    icrc: &mut IdRecovery,
    c: &mut Counters,
    payload: &'a [u8],
    intact: bool,
) -> Option<PacketRepr<'a>> {
    if !intact && let Err(e) = flow.verify(icrc, payload) {
        match e {
            uroce_wire::Error::IcrcUnexpectedIpId(_) => c.drop_unexpected_ip_id += 1,
            _ => c.icrc_errors += 1,
        }
        return None;
    }
    match PacketRepr::parse_ignoring_icrc(payload) {
        Ok(parsed) => Some(parsed.repr),
        Err(_) => {
            c.drop_malformed += 1;
            None
        }
    }
}

/// The header checks every QP makes (IBA 9.6; rxe_recv.c hdr_check): the opcode's transport is
/// the QP's and the partition is the default one. A failure is counted.
fn headers_fit(qp: &Qp, packet: &PacketRepr<'_>, c: &mut Counters) -> bool {
    if packet.bth.opcode.transport() != qp.init.qp_type.transport() {
        c.drop_wrong_transport += 1;
        return false;
    }
    // XRC's halves share a transport: the initiator takes only responses, the target only
    // requests (IBA Annex A14).
    let request = packet.bth.opcode.info().is_some_and(|i| i.has(OpFlags::REQUEST));
    let wrong_half = match qp.init.qp_type {
        QpType::XrcIni => request,
        QpType::XrcTgt => !request,
        _ => false,
    };
    if wrong_half {
        c.drop_wrong_transport += 1;
        return false;
    }
    if packet.bth.pkey.base() != uroce_wire::PKey::DEFAULT.base() {
        c.drop_bad_pkey += 1;
        return false;
    }
    true
}

/// A packet the device accepted.
fn count_rcvd(c: &mut Counters, len: usize) {
    c.rcvd_pkts += 1;
    c.rcvd_bytes += len as u64;
}

/// A packet a QP accepted.
fn count_qp_rcvd(qp: &mut Qp, len: usize) {
    qp.counters.rcvd_pkts += 1;
    qp.counters.rcvd_bytes += len as u64;
}

/// Offers a verified datagram to UD QP `qp`: the header checks (transport, partition, state),
/// then the responder. Returns whether the QP took it past those checks; a refusal is counted.
fn deliver_ud<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    rx: &RxInfo,
    packet: &PacketRepr<'_>,
    udp_payload_len: usize,
) -> bool {
    let c = &mut ctx.counters;
    // Only UD QPs reach here (unicast by type, multicast by attachment, which takes UD only), so
    // the shared transport check is UD's.
    if !headers_fit(qp, packet, c) {
        return false;
    }
    if !qp.can_receive() {
        c.drop_bad_state += 1;
        return false;
    }
    let Some(deth) = packet.ext.deth else {
        c.drop_malformed += 1;
        return false;
    };
    // IBA 10.2.5 (rxe_recv.c check_keys): a datagram whose Q_Key is not the QP's is refused
    // with the header checks, before the QP takes it.
    if deth.qkey != qp.qkey {
        c.drop_bad_qkey += 1;
        return false;
    }
    count_qp_rcvd(qp, udp_payload_len);
    responder::ud_request(qp, ctx, packet, deth, &rx.grh(udp_payload_len));
    true
}
