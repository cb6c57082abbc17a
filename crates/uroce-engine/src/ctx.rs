//! What the protocol steps share (`Ctx`): the device but its QPs — configuration, regions,
//! CQs, SRQs, address handles, counters, events — and the packets they emit (`Transmit`,
//! `RxInfo`). The requester, responder and completer take a QP and this beside it, as rxe's
//! do with `rxe_dev`.

use core::net::{IpAddr, SocketAddr};
use std::collections::{BTreeMap, VecDeque};

use uroce_wire::icrc::PseudoHeader;
use uroce_wire::ip::{IpRepr, Ipv4Repr, Ipv6Repr};
use uroce_wire::{PacketRepr, Qpn, ROCE_V2_PORT};

use crate::attr::DeviceConfig;
use crate::counters::Counters;
use crate::cq::Cq;
use crate::memory::MemoryAccess;
use crate::mr::MrTable;
use crate::qp::{Qp, RecvWqe};
use crate::rng::Rng;
use crate::srq::Srq;
use crate::time::Instant;
use crate::types::{
    AhAttr, AhHandle, CqHandle, PdHandle, SrqHandle, WcOpcode, WcStatus, WorkCompletion,
};

/// A packet to send: `poll_transmit` wrote its bytes (BTH through ICRC) into the caller's
/// buffer; send them in a UDP datagram from `src_port` to `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Destination: the peer's address, UDP port 4791.
    pub dst: SocketAddr,
    /// UDP source port (per-QP flow entropy).
    pub src_port: u16,
    /// From [`Device::poll_transmit_gather`](crate::Device::poll_transmit_gather) only: `Some(h)` when the payload stayed in
    /// registered memory. The datagram is then the buffer's first `h` bytes (headers), the
    /// memory pieces, and the rest of the buffer (pad and ICRC). `None`: the buffer holds it all.
    pub payload_at: Option<usize>,
    /// The ICRC field is zero, left for the runtime to compute where the path needs it
    /// ([`Device::set_defer_icrc`](crate::Device::set_defer_icrc)); only for packets with `payload_at`.
    pub icrc_deferred: bool,
    /// Send it as a datagram of its own, never segmented with the packets beside it: it is a
    /// copy sent in case the first is lost ([`Device::destroy_qp`](crate::Device::destroy_qp)'s
    /// farewell ACKs). A segmented send stays one buffer until the interface cuts it, and a
    /// drop on the way there (a queue, a veth's netfilter hook) takes every segment at once.
    pub alone: bool,
}

/// A piece of a packet's payload in registered memory: address and length.
pub type Piece = (u64, u32);

/// A received datagram's addressing and the IP header fields a UD receive reports in its GRH
/// area; a runtime gets the last three from `IP_RECVTOS`/`IP_RECVTTL` (or the IPv6
/// equivalents) and may leave the defaults of [`RxInfo::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxInfo {
    /// Sender address and UDP port.
    pub src: SocketAddr,
    /// Destination address: the device's own, or a multicast group it joined.
    pub dst: IpAddr,
    /// IPv4 TOS or IPv6 traffic class.
    pub tclass: u8,
    /// IPv4 TTL or IPv6 hop limit.
    pub hop_limit: u8,
    /// IPv6 flow label (20 bits; 0 for IPv4).
    pub flow_label: u32,
}

impl RxInfo {
    /// A datagram from `src` to `dst` with traffic class 0, hop limit 64 and no flow label:
    /// what uroce senders emit.
    pub const fn new(src: SocketAddr, dst: IpAddr) -> Self {
        Self { src, dst, tclass: 0, hop_limit: uroce_wire::ip::DEFAULT_TTL, flow_label: 0 }
    }

    /// The 40-byte GRH area of a UD receive buffer (rdma-core's `ibv_grh`, as RoCEv2 devices
    /// fill it): an IPv6 header, or 20 zero bytes and then the IPv4 header.
    ///
    /// The header is rebuilt, not copied: user space does not see the IP header of a UDP
    /// datagram. The fields the ICRC covers (addresses, lengths, IPv4 identification 0 and DF)
    /// are exactly those of the packet, or its ICRC would not have verified; TOS, TTL and flow
    /// label come from `self`; the IPv4 checksum is computed.
    pub(crate) fn grh(&self, udp_payload_len: usize) -> [u8; 40] {
        let mut grh = [0u8; 40];
        let udp_len = uroce_wire::ip::UDP_HEADER_LEN + udp_payload_len;
        let (ip, at) = match (self.src.ip(), self.dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                let v4 = Ipv4Repr {
                    src,
                    dst,
                    tos: self.tclass,
                    ident: 0,
                    dont_frag: true,
                    ttl: self.hop_limit,
                };
                (IpRepr::V4(v4), 20)
            }
            (src, dst) => {
                let v6 = |a: IpAddr| match a {
                    IpAddr::V4(a) => a.to_ipv6_mapped(),
                    IpAddr::V6(a) => a,
                };
                let r = Ipv6Repr {
                    src: v6(src),
                    dst: v6(dst),
                    traffic_class: self.tclass,
                    flow_label: self.flow_label,
                    hop_limit: self.hop_limit,
                };
                (IpRepr::V6(r), 0)
            }
        };
        // Cannot fail: the buffer holds the header and a datagram is shorter than 64 KiB.
        let _ = ip.emit(&mut grh[at..], udp_len);
        grh
    }
}

/// An address handle.
#[derive(Debug)]
pub(crate) struct Ah {
    pub(crate) pd: PdHandle,
    pub(crate) attr: AhAttr,
    /// ICRC prefix for the last UDP source port used with this handle.
    pub(crate) pseudo: Option<(u16, PseudoHeader)>,
}

/// What the protocol steps share: everything of the device but its QPs, so a step can hold one
/// QP mutably beside it.
pub(crate) struct Ctx<M> {
    pub(crate) config: DeviceConfig,
    /// The latest time the runtime has passed in: what completions are stamped with. Never
    /// goes back, though callers on several threads may pass their readings out of order.
    pub(crate) now: Instant,
    pub(crate) mrs: MrTable,
    pub(crate) mem: M,
    pub(crate) cqs: BTreeMap<u32, Cq>,
    pub(crate) counters: Counters,
    pub(crate) rng: Rng,
    /// QPs with something to transmit, in turn.
    pub(crate) rotation: VecDeque<Qpn>,
    /// Payload staging for the packet being built.
    pub(crate) scratch: Vec<u8>,
    /// Shared receive queues.
    pub(crate) srqs: BTreeMap<u32, Srq>,
    /// Completion queues whose armed notification fired, oldest first.
    pub(crate) cq_events: VecDeque<CqHandle>,
    /// Asynchronous events not yet taken.
    pub(crate) async_events: VecDeque<AsyncEvent>,
    /// Address handles.
    pub(crate) ahs: BTreeMap<u32, Ah>,
    /// The caller of `poll_transmit_gather` takes payloads as memory pieces.
    pub(crate) gather: bool,
    /// Leave the ICRC of gathered packets to the runtime ([`Device::set_defer_icrc`](crate::Device::set_defer_icrc)).
    pub(crate) defer_icrc: bool,
    /// The datagram being handled came over a path that guarantees its integrity
    /// ([`Device::handle_datagram_intact`](crate::Device::handle_datagram_intact)): its ICRC is not checked.
    pub(crate) intact: bool,
    /// The memory pieces of the packet just built in gather mode.
    pub(crate) tx_pieces: Vec<Piece>,
    /// Payload pieces being assembled by a protocol step.
    pub(crate) pieces: Vec<Piece>,
    /// Payload copied out of memory when it cannot stay there.
    pub(crate) copy_buf: Vec<u8>,
}

/// An asynchronous event (`ibv_get_async_event`; IBA 11.6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// A QP entered the Error state because of a transport error (`IBV_EVENT_QP_FATAL`).
    QpFatal(Qpn),
    /// The first packet arrived at a QP in RTR (`IBV_EVENT_COMM_EST`).
    CommEstablished(Qpn),
    /// A peer's request found the memory it names gone — a page of its region unmapped after
    /// registration — and the QP entered Error (IBA 11.6.3.1, local access violation work
    /// queue error: `IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessError(Qpn),
    /// A completion queue overflowed (`IBV_EVENT_CQ_ERR`).
    CqError(CqHandle),
    /// A shared receive queue fell below its armed limit (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    SrqLimitReached(SrqHandle),
    /// A QP that takes receives from an SRQ entered Error: no WQE of the SRQ will be consumed
    /// by it any more (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    LastWqeReached(Qpn),
}

impl<M> Ctx<M> {
    /// Takes in a time the runtime passed.
    pub(crate) fn advance_clock(&mut self, now: Instant) {
        self.now = self.now.max(now);
    }

    /// Puts `qp` on the transmit rotation if it is not there.
    pub(crate) fn schedule(&mut self, qp: &mut Qp) {
        if !qp.scheduled {
            qp.scheduled = true;
            self.rotation.push_back(qp.qpn);
        }
    }

    /// Delivers a completion, counting it if its queue is full.
    pub(crate) fn complete(&mut self, cq: CqHandle, wc: WorkCompletion) {
        self.complete_solicited(cq, wc, false);
    }

    /// Delivers a completion that may be solicited (a received message whose last packet had
    /// the SE bit), raising the CQ's notification or CQ error as it does.
    pub(crate) fn complete_solicited(
        &mut self,
        cq: CqHandle,
        mut wc: WorkCompletion,
        solicited: bool,
    ) {
        let Some(q) = self.cqs.get_mut(&cq.0) else { return };
        wc.timestamp = self.now;
        let pushed = q.push(wc, solicited);
        if !pushed.stored {
            self.counters.cq_overflows += 1;
        }
        if pushed.first_overflow {
            self.async_events.push_back(AsyncEvent::CqError(cq));
        }
        if pushed.notify {
            self.cq_events.push_back(cq);
        }
    }

    /// Takes the next receive WQE for `qp`: from its SRQ if it has one (raising the limit
    /// event if that crosses it), else from its own queue.
    pub(crate) fn pop_recv(&mut self, qp: &mut Qp) -> Option<RecvWqe> {
        let Some(h) = qp.init.srq else { return qp.rq.pop_front() };
        let (wqe, crossed) = self.srqs.get_mut(&h.0)?.pop();
        if crossed {
            self.async_events.push_back(AsyncEvent::SrqLimitReached(h));
        }
        wqe
    }

    /// Gives a receive WQE back to the head of the queue it came from.
    pub(crate) fn unpop_recv(&mut self, qp: &mut Qp, wqe: RecvWqe) {
        match qp.init.srq.and_then(|h| self.srqs.get_mut(&h.0)) {
            Some(srq) => srq.wqes.push_front(wqe),
            None => qp.rq.push_front(wqe),
        }
    }

    /// The CQ `qp`'s receives complete on: its SRQ's when that names one (XRC, TM-SRQ),
    /// else its receive CQ.
    pub(crate) fn recv_cq(&self, qp: &Qp) -> CqHandle {
        qp.init.srq.and_then(|h| self.srqs.get(&h.0)).and_then(Srq::cq).unwrap_or(qp.init.recv_cq)
    }

    /// Receive WQEs waiting for `qp`.
    pub(crate) fn recvs_posted(&self, qp: &Qp) -> usize {
        match qp.init.srq {
            Some(h) => self.srqs.get(&h.0).map_or(0, |s| s.wqes.len()),
            None => qp.rq.len(),
        }
    }

    /// The QP entered Error because of a transport error: the affiliated asynchronous event.
    pub(crate) fn qp_fatal(&mut self, qpn: Qpn) {
        self.async_events.push_back(AsyncEvent::QpFatal(qpn));
    }
}

impl<M: MemoryAccess> Ctx<M> {
    /// Builds `repr` into `buf` for connected `qp`, counting it; its payload is its own or,
    /// when `pieces` is not empty, those pieces of registered memory.
    pub(crate) fn emit(
        &mut self,
        qp: &Qp,
        repr: &PacketRepr<'_>,
        pieces: &[Piece],
        buf: &mut Vec<u8>,
    ) -> Option<Transmit> {
        let (pseudo, av) = (qp.tx_pseudo?, qp.av?);
        self.emit_to(&pseudo, av.dest, qp.src_port, repr, pieces, buf)
    }

    /// Builds UD packet `repr` into `buf` for the destination of address handle `ah`, from
    /// `qp_port` unless the handle's flow label picks the port. `None` if the handle is gone.
    pub(crate) fn emit_ud(
        &mut self,
        ah: AhHandle,
        qp_port: u16,
        repr: &PacketRepr<'_>,
        pieces: &[Piece],
        buf: &mut Vec<u8>,
    ) -> Option<Transmit> {
        let local = self.config.addr;
        let h = self.ahs.get_mut(&ah.0)?;
        let port = h.attr.udp_sport().unwrap_or(qp_port);
        let pseudo = match h.pseudo {
            Some((p, pseudo)) if p == port => pseudo,
            _ => {
                let dst = SocketAddr::new(h.attr.dest, ROCE_V2_PORT);
                let pseudo = PseudoHeader::for_endpoints(SocketAddr::new(local, port), dst).ok()?;
                h.pseudo = Some((port, pseudo));
                pseudo
            }
        };
        let dest = h.attr.dest;
        self.emit_to(&pseudo, dest, port, repr, pieces, buf)
    }

    /// Writes a whole packet into `buf`, its ICRC computed or (for a runtime that seals
    /// packets itself) left zero.
    fn emit_whole(
        &self,
        repr: &PacketRepr<'_>,
        pseudo: &PseudoHeader,
        buf: &mut [u8],
    ) -> Option<usize> {
        if self.defer_icrc { repr.emit_without_icrc(buf) } else { repr.emit(pseudo, buf) }.ok()
    }

    /// Builds the packet: `repr`'s own payload, or (when `pieces` is not empty) the payload
    /// in those pieces of registered memory — left in place in gather mode when the memory
    /// lends them and there are at least [`GATHER_MIN_PAYLOAD`] bytes, else copied once into
    /// the packet.
    fn emit_to(
        &mut self,
        pseudo: &PseudoHeader,
        dest: IpAddr,
        src_port: u16,
        repr: &PacketRepr<'_>,
        pieces: &[Piece],
        buf: &mut Vec<u8>,
    ) -> Option<Transmit> {
        let mut payload_at = None;
        let len = if pieces.is_empty() {
            let len = repr.buffer_len().ok()?;
            buf.clear();
            buf.resize(len, 0);
            self.emit_whole(repr, pseudo, buf)?
        } else {
            let payload: u64 = pieces.iter().map(|&(_, l)| u64::from(l)).sum();
            let lent: Option<Vec<&[u8]>> = if self.gather && payload >= GATHER_MIN_PAYLOAD {
                pieces.iter().map(|&(a, l)| self.mem.slice(a, l as usize)).collect()
            } else {
                None
            };
            if let Some(parts) = lent {
                let h = if self.defer_icrc {
                    repr.emit_gathered_without_icrc(&parts, buf).ok()?
                } else {
                    repr.emit_gathered(pseudo, &parts, buf).ok()?
                };
                let payload: usize = parts.iter().map(|p| p.len()).sum();
                self.tx_pieces.clear();
                self.tx_pieces.extend_from_slice(pieces);
                payload_at = Some(h);
                buf.len() + payload
            } else {
                let mut data = core::mem::take(&mut self.copy_buf);
                data.clear();
                for &(a, l) in pieces {
                    let at = data.len();
                    data.resize(at + l as usize, 0);
                    // Checked readable when the work request started; a page unmapped since
                    // goes out as zeros, counted, rather than as a fault.
                    if self.mem.read(a, &mut data[at..]).is_err() {
                        self.counters.memory_faults += 1;
                    }
                }
                let full = PacketRepr::new(repr.bth, repr.ext, &data);
                let len = full.buffer_len().ok();
                if let Some(len) = len {
                    buf.clear();
                    buf.resize(len, 0);
                }
                let emitted = len.and_then(|_| self.emit_whole(&full, pseudo, buf));
                self.copy_buf = data;
                emitted?
            }
        };
        self.counters.sent_pkts += 1;
        self.counters.sent_bytes += len as u64;
        let icrc_deferred = self.defer_icrc;
        Some(Transmit {
            dst: SocketAddr::new(dest, ROCE_V2_PORT),
            src_port,
            payload_at,
            icrc_deferred,
            alone: false,
        })
    }
}

/// Payloads smaller than this are copied into their packet even in gather mode: the kernel
/// takes each gathered piece as an I/O vector element of its own, which costs more than
/// copying a few hundred bytes (a 64-byte SEND's packet went out as three elements).
const GATHER_MIN_PAYLOAD: u64 = 256;

/// A flushed completion.
pub(crate) fn flush_wc(qpn: Qpn, wr_id: u64, opcode: WcOpcode) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status: WcStatus::WR_FLUSH_ERR,
        opcode,
        byte_len: 0,
        imm: None,
        qp_num: qpn,
        src_qp: Qpn::QP0,
        grh: false,
        ipv4: false,
        timestamp: Instant::ZERO,
        tm: None,
        invalidated_rkey: None,
    }
}
