//! A device: the engine's top-level object. It owns the protection domains, memory regions,
//! completion queues and queue pairs of one RoCEv2 address, takes packets and time in, and
//! gives packets and deadlines out.

use core::net::{IpAddr, SocketAddr};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use uroce_wire::icrc::{IdRecovery, Ipv4IdPolicy, PseudoCache, PseudoHeader};
use uroce_wire::ip::{IpRepr, Ipv4Repr, Ipv6Repr};
use uroce_wire::opcode::OpFlags;
use uroce_wire::{PacketRepr, Psn, Qpn, RKey, ROCE_V2_PORT, bth};

use crate::counters::Counters;
use crate::cq::{Arm, Cq};
use crate::memory::MemoryAccess;
use crate::mr::{MemoryRegion, MrTable};
use crate::qp::{ModifyError, PostError, Qp, QpAttr, QpInitAttr, RecvWqe, SendWqe};
use crate::rng::Rng;
use crate::srq::Srq;
use crate::time::Instant;
use crate::types::{
    Access, AhAttr, AhHandle, CqHandle, LKey, Mtu, MwHandle, MwType, PdHandle, QpState, QpType,
    RecvWr, SendWr, SrqHandle, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
use crate::watch::QpWatch;
use crate::{completer, requester, responder};

/// How a device is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceConfig {
    /// The address the device sends from and receives at (its RoCEv2 GID).
    pub addr: IpAddr,
    /// The 256-bit seed of every random choice the device makes (memory keys, the first QPN,
    /// initial PSNs through [`Device::random_psn`]): secret on a real device
    /// ([`DeviceConfig::secret`]), a test's number in the simulator ([`DeviceConfig::new`]).
    pub seed: [u8; 32],
    /// Packets a QP may have sent and not had acknowledged.
    pub max_inflight_pkts: u32,
    /// The requester asks for an ACK at least every this many packets of a long message.
    pub ack_req_interval: u32,
    /// The port's active MTU (`ibv_port_attr.active_mtu`): the largest UD datagram, and the
    /// most a connected QP's path MTU should be. A runtime derives it from the interface MTU
    /// less the IP, UDP, BTH and ICRC overhead, as RoCE NICs do.
    pub port_mtu: Mtu,
    /// The QPNs this device may hand out. Several engines serving one host-wide device (one
    /// per process) each take a disjoint block, so QPNs stay unique per device (IBA 10.2.4:
    /// a QPN names one QP of the channel adapter).
    pub qpns: QpnBlock,
    /// The IPv4 identifications a received packet's ICRC may have been computed with (the
    /// receiver cannot see the IP header; IBA Annex A17.3.3 covers the field). By default what
    /// a Linux sender using GSO produces, as uroce does.
    pub ipv4_id_policy: Ipv4IdPolicy,
}

impl DeviceConfig {
    /// Defaults for a device at `addr` whose every choice is reproducible from `seed` (for the
    /// simulator and tests: anyone who knows the seed can derive the keys).
    pub const fn new(addr: IpAddr, seed: u64) -> Self {
        Self::secret(addr, crate::rng::expand(seed))
    }

    /// Defaults for a real device at `addr`, seeded with 256 bits from the operating system's
    /// randomness: its keys, QPNs and PSNs cannot be derived from the ones a peer sees (IBA
    /// 10.6.3.3 leaves key choice to the CA; 9.7.2 wants initial PSNs hard to predict).
    pub const fn secret(addr: IpAddr, seed: [u8; 32]) -> Self {
        Self {
            addr,
            seed,
            max_inflight_pkts: 256,
            ack_req_interval: 32,
            port_mtu: Mtu::Mtu4096,
            qpns: QpnBlock::ALL,
            ipv4_id_policy: Ipv4IdPolicy::LinuxGso,
        }
    }
}

/// A range of queue pair numbers, `first..first + len`, from which `create_qp` allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpnBlock {
    /// The first QPN of the block.
    pub first: u32,
    /// How many QPNs it holds.
    pub len: u32,
}

impl QpnBlock {
    /// Every QPN a device may give an ordinary QP: above the special QPs 0 and 1 (and the
    /// range rxe keeps for them, 0..0x10), below the multicast QPN 0xFFFFFF.
    pub const ALL: Self = Self { first: 0x10, len: 0x00FF_FFFF - 0x10 };

    /// Whether `qpn` lies in the block.
    pub const fn contains(self, qpn: u32) -> bool {
        qpn >= self.first && qpn - self.first < self.len
    }
}

/// What a device supports (`ibv_device_attr`'s limits). Creating an object beyond them is a
/// typed error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Queue pairs at once.
    pub max_qp: u32,
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// Scatter/gather elements per work request.
    pub max_sge: u32,
    /// Completions per completion queue.
    pub max_cqe: u32,
    /// Memory regions at once.
    pub max_mr: u32,
    /// Memory windows at once.
    pub max_mw: u32,
    /// Bytes of inline data per send work request.
    pub max_inline_data: u32,
    /// READ and atomic requests a QP may have outstanding, or serve, at once.
    pub max_qp_rd_atom: u8,
    /// Longest message: 2^31 bytes (IBA 9.7).
    pub max_msg_sz: u32,
    /// Address handles at once.
    pub max_ah: u32,
    /// Multicast groups with at least one QP attached.
    pub max_mcast_grp: u32,
    /// QPs attached to one multicast group.
    pub max_mcast_qp_attach: u32,
    /// Attachments over all groups.
    pub max_total_mcast_qp_attach: u32,
}

/// The limits every uroce device has.
pub const DEVICE_ATTR: DeviceAttr = DeviceAttr {
    max_qp: 1 << 16,
    max_qp_wr: 1 << 15,
    max_sge: 32,
    max_cqe: 1 << 20,
    max_mr: 1 << 20,
    max_mw: 1 << 20,
    max_inline_data: 1024,
    max_qp_rd_atom: crate::qp::MAX_RD_ATOMIC,
    max_msg_sz: 1 << 31,
    max_ah: 1 << 16,
    max_mcast_grp: 1 << 10,
    max_mcast_qp_attach: 64,
    max_total_mcast_qp_attach: 1 << 16,
};

/// Why destroying an object failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestroyError {
    /// No such object.
    Unknown,
    /// Another object still uses it (a QP its CQ or SRQ; an MR, QP, SRQ or AH its PD).
    InUse,
}

impl fmt::Display for DestroyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unknown => "no such object",
            Self::InUse => "another object still uses it",
        })
    }
}

impl std::error::Error for DestroyError {}

/// Why `resize_cq` refused; the queue is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResizeCqError {
    /// No such CQ.
    UnknownCq,
    /// The capacity is 0 or above `max_cqe`.
    OutOfRange,
    /// Fewer entries than the completions queued now.
    BelowQueued {
        /// Completions in the queue.
        queued: usize,
    },
}

impl fmt::Display for ResizeCqError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownCq => f.write_str("no such CQ"),
            Self::OutOfRange => write!(f, "cqe outside 1..={}", DEVICE_ATTR.max_cqe),
            Self::BelowQueued { queued } => write!(f, "{queued} completions are queued"),
        }
    }
}

impl std::error::Error for ResizeCqError {}

/// Why creating an object failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateError {
    /// No protection domain with this handle.
    UnknownPd,
    /// No completion queue with this handle.
    UnknownCq,
    /// No shared receive queue with this handle.
    UnknownSrq,
    /// The SRQ belongs to another protection domain than the QP.
    SrqOfAnotherPd,
    /// An address handle whose destination is of the other IP family than the device.
    AhAddressFamily,
    /// A requested size is beyond the device's limit (`ibv_query_device`).
    ExceedsLimit {
        /// The attribute, as `ibv_device_attr` names it.
        limit: &'static str,
        /// What was asked for.
        requested: u64,
        /// What the device supports.
        max: u64,
    },
}

impl core::fmt::Display for CreateError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::UnknownPd => f.write_str("no such protection domain"),
            Self::UnknownCq => f.write_str("no such completion queue"),
            Self::UnknownSrq => f.write_str("no such shared receive queue"),
            Self::SrqOfAnotherPd => f.write_str("the SRQ belongs to another protection domain"),
            Self::AhAddressFamily => {
                f.write_str("the destination is of another IP family than the device")
            }
            Self::ExceedsLimit { limit, requested, max } => {
                write!(f, "{requested} exceeds the device's {limit} of {max}")
            }
        }
    }
}

impl std::error::Error for CreateError {}

fn within(limit: &'static str, requested: u64, max: u64) -> Result<(), CreateError> {
    if requested > max { Err(CreateError::ExceedsLimit { limit, requested, max }) } else { Ok(()) }
}

/// A packet to send: `poll_transmit` wrote its bytes (BTH through ICRC) into the caller's
/// buffer; send them in a UDP datagram from `src_port` to `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Destination: the peer's address, UDP port 4791.
    pub dst: SocketAddr,
    /// UDP source port (per-QP flow entropy).
    pub src_port: u16,
    /// From [`Device::poll_transmit_gather`] only: `Some(h)` when the payload stayed in
    /// registered memory. The datagram is then the buffer's first `h` bytes (headers), the
    /// memory pieces, and the rest of the buffer (pad and ICRC). `None`: the buffer holds it all.
    pub payload_at: Option<usize>,
    /// The ICRC field is zero, left for the runtime to compute where the path needs it
    /// ([`Device::set_defer_icrc`]); only for packets with `payload_at`.
    pub icrc_deferred: bool,
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
    pseudo: Option<(u16, PseudoHeader)>,
}

/// Why attaching a QP to a multicast group, or detaching it, failed (`ibv_attach_mcast(3)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McastError {
    /// No such QP.
    UnknownQp(Qpn),
    /// Only UD QPs take multicast (IBA 10.5.2).
    NotUd(Qpn),
    /// The address is not an IPv4 or IPv6 multicast address of the device's family.
    NotMulticast(IpAddr),
    /// Detaching a QP that is not attached to the group.
    NotAttached,
    /// Beyond `max_mcast_grp`, `max_mcast_qp_attach` or `max_total_mcast_qp_attach`.
    ExceedsLimit(&'static str),
}

impl core::fmt::Display for McastError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::UnknownQp(q) => write!(f, "no QP {q}"),
            Self::NotUd(q) => write!(f, "QP {q} is not UD; only UD QPs join multicast groups"),
            Self::NotMulticast(a) => write!(f, "{a} is not a multicast address of this family"),
            Self::NotAttached => f.write_str("the QP is not attached to the group"),
            Self::ExceedsLimit(l) => write!(f, "the device's {l} is reached"),
        }
    }
}

impl std::error::Error for McastError {}

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
    /// Leave the ICRC of gathered packets to the runtime ([`Device::set_defer_icrc`]).
    pub(crate) defer_icrc: bool,
    /// The datagram being handled came over a path that guarantees its integrity
    /// ([`Device::handle_datagram_intact`]): its ICRC is not checked.
    pub(crate) intact: bool,
    /// The memory pieces of the packet just built in gather mode.
    pub(crate) tx_pieces: Vec<Piece>,
    /// Payload pieces being assembled by a protocol step.
    pub(crate) pieces: Vec<Piece>,
    /// Payload copied out of memory when it cannot stay there.
    copy_buf: Vec<u8>,
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
    /// lends them, else copied once into the packet.
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
            let lent: Option<Vec<&[u8]>> = if self.gather {
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
        })
    }
}

/// A RoCEv2 device: the transport of one address, as a deterministic state machine.
///
/// Inputs: `handle_datagram`, `handle_timeout`, the verbs (`post_send`, `post_recv`,
/// `modify_qp`, …). Outputs: `poll_transmit`, `poll_timeout`, `poll_cq`. Given the same seed
/// and the same inputs at the same instants, it produces the same outputs.
pub struct Device<M> {
    ctx: Ctx<M>,
    pub(crate) qps: BTreeMap<u32, Qp>,
    /// The QPs with a timer running or work outstanding.
    watch: QpWatch,
    /// Multicast groups and the QPs attached to each, in attach order.
    mcast: BTreeMap<IpAddr, Vec<Qpn>>,
    /// ICRC prefixes for datagrams reaching UD QPs, by (source, destination): a UD QP hears
    /// from many peers, so the per-QP cache of connected QPs would thrash.
    ud_rx_pseudo: PseudoCache,
    /// Verifies received ICRCs, finding the IPv4 identification each was computed with.
    icrc: IdRecovery,
    /// QP1.
    gsi: crate::gsi::Gsi,
    next_ah: u32,
    next_qpn: u32,
    /// The protection domains allocated and not deallocated.
    pds: BTreeSet<u32>,
    next_pd: u32,
    next_cq: u32,
    next_srq: u32,
}

impl<M: MemoryAccess> Device<M> {
    /// A device at `config.addr` whose application memory is `mem`.
    pub fn new(config: DeviceConfig, mem: M) -> Self {
        let mut rng = Rng::from_seed(config.seed);
        // QPNs start at a seeded point of the block (rxe starts at 17, above QPs 0 and 1).
        let block = config.qpns;
        let next_qpn = block.first + rng.next_u32() % block.len.clamp(1, 0x1_0000);
        // QP1's source port, in the dynamic range as every QP's.
        let gsi_port = 0xC000 | (rng.next_u32() & 0x3FFF) as u16;
        Self {
            ctx: Ctx {
                config,
                now: Instant::ZERO,
                mrs: MrTable::default(),
                mem,
                cqs: BTreeMap::new(),
                counters: Counters::default(),
                rng,
                rotation: VecDeque::new(),
                scratch: Vec::new(),
                srqs: BTreeMap::new(),
                cq_events: VecDeque::new(),
                async_events: VecDeque::new(),
                ahs: BTreeMap::new(),
                gather: false,
                defer_icrc: false,
                intact: false,
                tx_pieces: Vec::new(),
                pieces: Vec::new(),
                copy_buf: Vec::new(),
            },
            qps: BTreeMap::new(),
            watch: QpWatch::default(),
            mcast: BTreeMap::new(),
            ud_rx_pseudo: PseudoCache::new(1024),
            icrc: IdRecovery::new(config.ipv4_id_policy),
            gsi: crate::gsi::Gsi::new(gsi_port),
            next_ah: 1,
            next_qpn,
            pds: BTreeSet::new(),
            next_pd: 1,
            next_cq: 1,
            next_srq: 1,
        }
    }

    /// The device's address.
    pub fn addr(&self) -> IpAddr {
        self.ctx.config.addr
    }

    /// GID index 0: the address as a RoCEv2 GID (an IPv4 address IPv4-mapped, RFC 4291).
    pub fn gid(&self) -> [u8; 16] {
        match self.ctx.config.addr {
            IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            IpAddr::V6(a) => a.octets(),
        }
    }

    /// The port's active MTU (`ibv_port_attr.active_mtu`).
    pub fn port_mtu(&self) -> Mtu {
        self.ctx.config.port_mtu
    }

    /// The device's limits (`ibv_query_device`).
    pub fn attr(&self) -> DeviceAttr {
        DEVICE_ATTR
    }

    /// Application memory.
    pub fn memory(&self) -> &M {
        &self.ctx.mem
    }

    /// Application memory, mutably.
    pub fn memory_mut(&mut self) -> &mut M {
        &mut self.ctx.mem
    }

    /// Counters.
    pub fn counters(&self) -> &Counters {
        &self.ctx.counters
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&mut self) -> PdHandle {
        let pd = PdHandle(self.next_pd);
        self.next_pd += 1;
        self.pds.insert(pd.0);
        pd
    }

    /// Deallocates a protection domain (`ibv_dealloc_pd`). Refused while a memory region, QP,
    /// SRQ or address handle still belongs to it (the verb fails with `EBUSY`, as the kernel
    /// refuses a PD whose use count is not zero). Handles are never reused.
    pub fn dealloc_pd(&mut self, pd: PdHandle) -> Result<(), DestroyError> {
        if !self.pds.contains(&pd.0) {
            return Err(DestroyError::Unknown);
        }
        let used = self.ctx.mrs.any_in(pd)
            || self.ctx.mrs.any_window_in(pd)
            || self.qps.values().any(|qp| qp.init.pd == pd)
            || self.ctx.srqs.values().any(|s| s.pd == pd)
            || self.ctx.ahs.values().any(|ah| ah.pd == pd);
        if used {
            return Err(DestroyError::InUse);
        }
        self.pds.remove(&pd.0);
        Ok(())
    }

    /// Whether `pd` is allocated.
    fn has_pd(&self, pd: PdHandle) -> bool {
        self.pds.contains(&pd.0)
    }

    /// Registers `length` bytes at virtual address `addr` with `access` rights.
    pub fn reg_mr(
        &mut self,
        pd: PdHandle,
        addr: u64,
        length: u64,
        access: Access,
    ) -> Result<MemoryRegion, CreateError> {
        self.reg_mr_at(pd, addr, addr, length, access)
    }

    /// Registers `length` bytes at host address `host` whose keys name `iova..iova + length`
    /// (`ibv_reg_mr_iova(3)`; `iova` 0 for a zero-based region, as device memory is).
    pub fn reg_mr_at(
        &mut self,
        pd: PdHandle,
        iova: u64,
        host: u64,
        length: u64,
        access: Access,
    ) -> Result<MemoryRegion, CreateError> {
        if !self.has_pd(pd) {
            return Err(CreateError::UnknownPd);
        }
        within("max_mr", self.ctx.mrs.len() as u64 + 1, u64::from(DEVICE_ATTR.max_mr))?;
        Ok(self.ctx.mrs.register(&mut self.ctx.rng, pd, (iova, host), length, access))
    }

    /// Region `lkey`, if registered.
    pub fn mr(&self, lkey: LKey) -> Option<MemoryRegion> {
        self.ctx.mrs.get(lkey)
    }

    /// Re-registers region `lkey` (`ibv_rereg_mr`): a new PD, range and access, the same keys,
    /// which from now on reach the new range with the new rights only. Returns the region as
    /// it was; `None` if the key is unknown, an error (nothing changed) for an unknown PD.
    pub fn rereg_mr(
        &mut self,
        lkey: LKey,
        pd: PdHandle,
        addr: u64,
        length: u64,
        access: Access,
    ) -> Option<Result<MemoryRegion, CreateError>> {
        if !self.has_pd(pd) {
            return Some(Err(CreateError::UnknownPd));
        }
        self.ctx.mrs.update(lkey, pd, addr, length, access).map(Ok)
    }

    /// Allocates a memory window of `pd` (`ibv_alloc_mw`; IBA 10.6.7.1): unbound, with its
    /// handle and first key.
    pub fn alloc_mw(
        &mut self,
        pd: PdHandle,
        kind: MwType,
    ) -> Result<(MwHandle, RKey), CreateError> {
        if !self.pds.contains(&pd.0) {
            return Err(CreateError::UnknownPd);
        }
        within("max_mw", self.ctx.mrs.windows() as u64 + 1, u64::from(DEVICE_ATTR.max_mw))?;
        Ok(self.ctx.mrs.alloc_window(&mut self.ctx.rng, pd, kind))
    }

    /// Deallocates a window (`ibv_dealloc_mw`): its key stops working at once, bound or not.
    pub fn dealloc_mw(&mut self, mw: MwHandle) -> Result<(), DestroyError> {
        self.ctx.mrs.dealloc_window(mw).map(|_| ()).ok_or(DestroyError::Unknown)
    }

    /// A window's current key: what the last successful bind gave it.
    pub fn mw_rkey(&self, mw: MwHandle) -> Option<RKey> {
        self.ctx.mrs.window(mw).map(|(_, _, rkey)| rkey)
    }

    /// Deregisters a region: its keys stop working at once. `None` if the key is unknown.
    pub fn dereg_mr(&mut self, lkey: LKey) -> Option<MemoryRegion> {
        self.ctx.mrs.deregister(lkey)
    }

    /// Number of registered regions.
    pub fn mr_count(&self) -> usize {
        self.ctx.mrs.len()
    }

    /// Whether a work request not yet completed names `lkey` in its scatter/gather list: a
    /// send WQE (not inline), a receive WQE of a QP or an SRQ, or the receive a message in
    /// progress is landing in. A runtime defers deregistering such a region, so the memory an
    /// outstanding work request uses stays alive until its completion.
    pub fn lkey_in_use(&self, lkey: LKey) -> bool {
        let names = |sges: &[crate::types::Sge]| sges.iter().any(|s| s.lkey == lkey);
        let recv_uses = |w: &RecvWqe| names(&w.wr.sg_list);
        self.qps.values().any(|qp| {
            qp.req.sq.iter().any(|w| w.wr.inline_data.is_none() && names(&w.wr.sg_list))
                || qp.rq.iter().any(recv_uses)
                || matches!(&qp.resp.current, Some(crate::qp::InMessage::Send { wqe, .. }) if recv_uses(wqe))
        }) || self.ctx.srqs.values().any(|s| s.wqes.iter().any(recv_uses))
    }

    /// Whether RC QP `qpn` has packets on the wire not yet acknowledged: an acknowledgement is
    /// coming, and with it a round of progress.
    pub fn awaits_ack(&self, qpn: Qpn) -> bool {
        self.qps
            .get(&qpn.get())
            .is_some_and(|qp| qp.init.qp_type == QpType::Rc && qp.req.awaits_ack())
    }

    /// Whether any work request could still complete: a send WQE not yet completed, or a
    /// receive WQE posted to a QP or an SRQ. Without any, polling a CQ cannot find anything new
    /// (only an incoming one-sided operation can happen, and it completes nothing).
    pub fn has_pending_work(&self) -> bool {
        self.watch.any_busy() || self.ctx.srqs.values().any(|s| !s.wqes.is_empty())
    }

    /// Creates a completion queue that holds `capacity` completions.
    pub fn create_cq(&mut self, capacity: usize) -> Result<CqHandle, CreateError> {
        within("max_cqe", capacity as u64, u64::from(DEVICE_ATTR.max_cqe))?;
        let cq = CqHandle(self.next_cq);
        self.next_cq += 1;
        self.ctx.cqs.insert(cq.0, Cq::new(capacity));
        Ok(cq)
    }

    /// Changes a completion queue's capacity (`ibv_resize_cq`), keeping what it holds. Refused
    /// outside 1..=`max_cqe`, and below the completions queued now.
    pub fn resize_cq(&mut self, cq: CqHandle, capacity: usize) -> Result<(), ResizeCqError> {
        if capacity == 0 || capacity > DEVICE_ATTR.max_cqe as usize {
            return Err(ResizeCqError::OutOfRange);
        }
        let q = self.ctx.cqs.get_mut(&cq.0).ok_or(ResizeCqError::UnknownCq)?;
        let queued = q.len();
        if q.resize(capacity) { Ok(()) } else { Err(ResizeCqError::BelowQueued { queued }) }
    }

    /// Destroys a completion queue (`ibv_destroy_cq`). Refused while a QP still uses it
    /// (the verb fails with `EBUSY` then).
    pub fn destroy_cq(&mut self, cq: CqHandle) -> Result<(), DestroyError> {
        if !self.ctx.cqs.contains_key(&cq.0) {
            return Err(DestroyError::Unknown);
        }
        if self.qps.values().any(|qp| qp.init.send_cq == cq || qp.init.recv_cq == cq) {
            return Err(DestroyError::InUse);
        }
        self.ctx.cqs.remove(&cq.0);
        self.ctx.cq_events.retain(|&c| c != cq);
        Ok(())
    }

    /// Takes up to `max` completions from `cq`, oldest first, appending them to `out`; returns
    /// how many.
    pub fn poll_cq(&mut self, cq: CqHandle, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        let Some(q) = self.ctx.cqs.get_mut(&cq.0) else {
            return 0;
        };
        let mut n = 0;
        while n < max {
            let Some(wc) = q.pop() else { break };
            out.push(wc);
            n += 1;
        }
        n
    }

    /// Arms `cq` to notify its next completion, or with `solicited_only` its next solicited or
    /// unsuccessful one (`ibv_req_notify_cq`). One notification per arming; completions already
    /// queued do not count. `false` for an unknown CQ.
    pub fn req_notify_cq(&mut self, cq: CqHandle, solicited_only: bool) -> bool {
        let arm = if solicited_only { Arm::Solicited } else { Arm::Any };
        self.ctx.cqs.get_mut(&cq.0).map(|q| q.arm(arm)).is_some()
    }

    /// Whether `cq` is armed (`ibv_req_notify_cq`) and its notification has not fired yet:
    /// whoever polls it means to sleep until an event.
    pub fn cq_armed(&self, cq: CqHandle) -> bool {
        self.ctx.cqs.get(&cq.0).is_some_and(Cq::armed)
    }

    /// The next completion queue whose notification fired (what a completion channel delivers:
    /// `ibv_get_cq_event`), oldest first.
    pub fn poll_cq_event(&mut self) -> Option<CqHandle> {
        self.ctx.cq_events.pop_front()
    }

    /// The next asynchronous event (`ibv_get_async_event`).
    pub fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.ctx.async_events.pop_front()
    }

    /// Whether `cq` lost a completion because it was full.
    pub fn cq_overflowed(&self, cq: CqHandle) -> bool {
        self.ctx.cqs.get(&cq.0).is_some_and(Cq::overflowed)
    }

    /// Completions waiting in `cq`.
    pub fn cq_len(&self, cq: CqHandle) -> usize {
        self.ctx.cqs.get(&cq.0).map_or(0, Cq::len)
    }

    /// Creates a shared receive queue of up to `max_wr` WQEs of up to `max_sge` elements.
    pub fn create_srq(
        &mut self,
        pd: PdHandle,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<SrqHandle, CreateError> {
        if !self.has_pd(pd) {
            return Err(CreateError::UnknownPd);
        }
        within("max_srq_wr", u64::from(max_wr), u64::from(DEVICE_ATTR.max_qp_wr))?;
        within("max_srq_sge", u64::from(max_sge), u64::from(DEVICE_ATTR.max_sge))?;
        let h = SrqHandle(self.next_srq);
        self.next_srq += 1;
        self.ctx.srqs.insert(h.0, Srq::new(pd, max_wr, max_sge));
        Ok(h)
    }

    /// Destroys a shared receive queue (`ibv_destroy_srq`); its WQEs go with it. Refused while
    /// a QP still takes receives from it (`EBUSY`).
    pub fn destroy_srq(&mut self, srq: SrqHandle) -> Result<(), DestroyError> {
        if !self.ctx.srqs.contains_key(&srq.0) {
            return Err(DestroyError::Unknown);
        }
        if self.qps.values().any(|qp| qp.init.srq == Some(srq)) {
            return Err(DestroyError::InUse);
        }
        self.ctx.srqs.remove(&srq.0);
        Ok(())
    }

    /// Posts a receive WQE to a shared receive queue (`ibv_post_srq_recv`).
    pub fn post_srq_recv(&mut self, srq: SrqHandle, wr: RecvWr) -> Result<(), PostError> {
        let Some(s) = self.ctx.srqs.get_mut(&srq.0) else { return Err(PostError::UnknownSrq) };
        if wr.sg_list.len() > s.max_sge as usize {
            return Err(PostError::TooManySge);
        }
        if s.wqes.len() >= s.max_wr as usize {
            return Err(PostError::QueueFull);
        }
        s.wqes.push_back(RecvWqe { wr });
        Ok(())
    }

    /// Arms the SRQ's limit: one SRQ_LIMIT_REACHED event when fewer than `limit` WQEs remain
    /// (`ibv_modify_srq` with `IBV_SRQ_LIMIT`; 0 disarms). `false` for an unknown SRQ.
    pub fn arm_srq_limit(&mut self, srq: SrqHandle, limit: u32) -> bool {
        self.ctx.srqs.get_mut(&srq.0).map(|s| s.limit = limit).is_some()
    }

    /// The SRQ's armed limit, 0 once it fired or when never armed (`ibv_query_srq`).
    pub fn srq_limit(&self, srq: SrqHandle) -> Option<u32> {
        self.ctx.srqs.get(&srq.0).map(|s| s.limit)
    }

    /// Receive WQEs waiting in an SRQ.
    pub fn srq_len(&self, srq: SrqHandle) -> usize {
        self.ctx.srqs.get(&srq.0).map_or(0, |s| s.wqes.len())
    }

    /// Creates an address handle for UD sends to `attr.dest` (`ibv_create_ah`).
    pub fn create_ah(&mut self, pd: PdHandle, attr: AhAttr) -> Result<AhHandle, CreateError> {
        if !self.has_pd(pd) {
            return Err(CreateError::UnknownPd);
        }
        if attr.dest.is_ipv4() != self.ctx.config.addr.is_ipv4() {
            return Err(CreateError::AhAddressFamily);
        }
        within("max_ah", self.ctx.ahs.len() as u64 + 1, u64::from(DEVICE_ATTR.max_ah))?;
        let h = AhHandle(self.next_ah);
        self.next_ah += 1;
        self.ctx.ahs.insert(h.0, Ah { pd, attr, pseudo: None });
        Ok(h)
    }

    /// Destroys an address handle; work requests already posted with it fail when they are
    /// reached. `false` if there is no such handle.
    pub fn destroy_ah(&mut self, ah: AhHandle) -> bool {
        self.ctx.ahs.remove(&ah.0).is_some()
    }

    /// Attaches UD QP `qpn` to multicast group `group` (`ibv_attach_mcast`): datagrams to the
    /// group's address with destination QPN 0xFFFFFF are delivered to it (IBA 10.5.2).
    /// Attaching twice is not an error. A runtime joins the IP group for the groups that
    /// [`Device::multicast_groups`] lists.
    pub fn attach_mcast(&mut self, qpn: Qpn, group: IpAddr) -> Result<(), McastError> {
        let qp = self.qps.get(&qpn.get()).ok_or(McastError::UnknownQp(qpn))?;
        if qp.init.qp_type != QpType::Ud {
            return Err(McastError::NotUd(qpn));
        }
        if !group.is_multicast() || group.is_ipv4() != self.ctx.config.addr.is_ipv4() {
            return Err(McastError::NotMulticast(group));
        }
        let total: usize = self.mcast.values().map(Vec::len).sum();
        let groups = self.mcast.len();
        let members = self.mcast.get(&group);
        if members.is_some_and(|m| m.contains(&qpn)) {
            return Ok(());
        }
        let a = DEVICE_ATTR;
        if members.is_none() && groups >= a.max_mcast_grp as usize {
            return Err(McastError::ExceedsLimit("max_mcast_grp"));
        }
        if members.is_some_and(|m| m.len() >= a.max_mcast_qp_attach as usize) {
            return Err(McastError::ExceedsLimit("max_mcast_qp_attach"));
        }
        if total >= a.max_total_mcast_qp_attach as usize {
            return Err(McastError::ExceedsLimit("max_total_mcast_qp_attach"));
        }
        self.mcast.entry(group).or_default().push(qpn);
        Ok(())
    }

    /// Detaches `qpn` from `group` (`ibv_detach_mcast`).
    pub fn detach_mcast(&mut self, qpn: Qpn, group: IpAddr) -> Result<(), McastError> {
        if !self.qps.contains_key(&qpn.get()) {
            return Err(McastError::UnknownQp(qpn));
        }
        let members = self.mcast.get_mut(&group).ok_or(McastError::NotAttached)?;
        let at = members.iter().position(|&q| q == qpn).ok_or(McastError::NotAttached)?;
        members.remove(at);
        if members.is_empty() {
            self.mcast.remove(&group);
        }
        Ok(())
    }

    /// The multicast groups at least one QP is attached to: the IP groups a runtime joins.
    pub fn multicast_groups(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.mcast.keys().copied()
    }

    /// Creates a queue pair in the Reset state and returns its number.
    pub fn create_qp(&mut self, init: QpInitAttr) -> Result<Qpn, CreateError> {
        if !self.has_pd(init.pd) {
            return Err(CreateError::UnknownPd);
        }
        let cqs = &self.ctx.cqs;
        if !cqs.contains_key(&init.send_cq.0) || !cqs.contains_key(&init.recv_cq.0) {
            return Err(CreateError::UnknownCq);
        }
        if let Some(srq) = init.srq {
            // Receive buffers are checked against the QP's PD, so the SRQ must share it.
            match self.ctx.srqs.get(&srq.0) {
                Some(s) if s.pd == init.pd => {}
                Some(_) => return Err(CreateError::SrqOfAnotherPd),
                None => return Err(CreateError::UnknownSrq),
            }
        }
        let (a, c) = (DEVICE_ATTR, init.cap);
        within("max_qp", self.qps.len() as u64 + 1, u64::from(a.max_qp))?;
        within("max_qp_wr", u64::from(c.max_send_wr.max(c.max_recv_wr)), u64::from(a.max_qp_wr))?;
        within("max_sge", u64::from(c.max_send_sge.max(c.max_recv_sge)), u64::from(a.max_sge))?;
        within("max_inline_data", u64::from(c.max_inline_data), u64::from(a.max_inline_data))?;
        let block = self.ctx.config.qpns;
        // The block may be nearly full of live QPs: skip the numbers still in use.
        let mut candidate = self.next_qpn;
        for _ in 0..block.len {
            if !block.contains(candidate) {
                candidate = block.first;
            }
            if !self.qps.contains_key(&candidate) && candidate != Qpn::MULTICAST.get() {
                break;
            }
            candidate += 1;
        }
        if self.qps.contains_key(&candidate) || !block.contains(candidate) {
            let max = u64::from(block.len);
            return Err(CreateError::ExceedsLimit { limit: "max_qp", requested: max + 1, max });
        }
        let qpn = Qpn::from_masked(candidate);
        self.next_qpn = candidate + 1;
        let mut qp = Qp::new(qpn, init);
        if init.qp_type == QpType::Ud {
            qp.mtu = self.ctx.config.port_mtu;
        }
        self.qps.insert(qpn.get(), qp);
        Ok(qpn)
    }

    /// Destroys a queue pair, detaching it from its multicast groups; packets for it are
    /// dropped from then on.
    pub fn destroy_qp(&mut self, qpn: Qpn) -> bool {
        self.mcast.retain(|_, members| {
            members.retain(|&q| q != qpn);
            !members.is_empty()
        });
        let Some(mut qp) = self.qps.remove(&qpn.get()) else { return false };
        self.watch.forget(&mut qp);
        true
    }

    /// Records in the watch what QP `qpn` has running and outstanding, after an input that
    /// reached it.
    fn watch(&mut self, qpn: u32) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            self.watch.update(qp);
        }
    }

    /// A one-line account of a QP's transport state (requester position, acknowledged PSN,
    /// timers, the send queue, the responder's expected PSN), for traces and test failures.
    pub fn describe_qp(&self, qpn: Qpn) -> Option<String> {
        let q = self.qps.get(&qpn.get())?;
        let r = &q.req;
        let sq: Vec<_> =
            r.sq.iter()
                .map(|w| (w.wr.wr_id, w.wr.opcode, w.first_psn.get(), w.npkts, w.resp_pkts, w.done))
                .collect();
        Some(format!(
            "qp {} {:?}: next wqe {} pkt {} psn {}, una {}, high {}, ack timer {:?}, rnr {:?}, \
             recovering {:?}, retries left {}, sq {:?}; responder epsn {}, {} responses queued",
            q.qpn,
            q.state,
            r.next_wqe,
            r.next_pkt,
            r.next_psn,
            r.una,
            r.high_psn,
            r.ack_deadline,
            r.rnr_resume,
            r.recovering,
            r.retries_left,
            sq,
            q.resp.epsn,
            q.resp.out.len()
        ))
    }

    /// A PSN for a QP to start from, from the device's generator (IBA 9.7.2: hard for anyone
    /// to predict, so a stale or forged packet does not fall in the window by chance).
    pub fn random_psn(&mut self) -> Psn {
        Psn::from_masked(self.ctx.rng.next_u32())
    }

    /// A QP's counters.
    pub fn qp_counters(&self, qpn: Qpn) -> Option<crate::counters::QpCounters> {
        self.qps.get(&qpn.get()).map(|q| q.counters)
    }

    /// The state of a QP.
    pub fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
        self.qps.get(&qpn.get()).map(|q| q.state)
    }

    /// The transport of a QP.
    pub fn qp_type(&self, qpn: Qpn) -> Option<QpType> {
        self.qps.get(&qpn.get()).map(|q| q.init.qp_type)
    }

    /// Moves a QP through its state machine (IBA 10.3; `ibv_modify_qp(3)`).
    pub fn modify_qp(&mut self, qpn: Qpn, attr: &QpAttr) -> Result<(), ModifyError> {
        let r = self.modify_qp_unwatched(qpn, attr);
        self.watch(qpn.get());
        r
    }

    fn modify_qp_unwatched(&mut self, qpn: Qpn, attr: &QpAttr) -> Result<(), ModifyError> {
        let qp = self.qps.get_mut(&qpn.get()).ok_or(ModifyError::UnknownQp(qpn))?;
        let from = qp.modify(attr)?;
        match qp.state {
            QpState::Rtr | QpState::Rts if qp.tx_pseudo.is_none() || attr.av.is_some() => {
                if let Some(av) = qp.av {
                    let src = SocketAddr::new(self.ctx.config.addr, qp.src_port);
                    let dst = SocketAddr::new(av.dest, ROCE_V2_PORT);
                    qp.tx_pseudo = PseudoHeader::for_endpoints(src, dst).ok();
                }
            }
            QpState::Error if from != QpState::Error => completer::enter_error(qp, &mut self.ctx),
            QpState::Reset if from != QpState::Reset => {
                // Its completions not yet polled go with it, as ConnectX drivers clean the CQs
                // of a QP moved to Reset (mlx4/mlx5 `cq_clean`): a QP brought back to RTS
                // does not hand its new work the flushes of its old.
                for cq in [qp.init.send_cq, qp.init.recv_cq] {
                    if let Some(q) = self.ctx.cqs.get_mut(&cq.0) {
                        q.forget_qp(qpn);
                    }
                }
                let (init, mtu, watched) = (qp.init, qp.mtu, qp.watched);
                *qp = Qp::new(qpn, init);
                qp.watched = watched;
                if init.qp_type == QpType::Ud {
                    qp.mtu = mtu;
                }
            }
            _ => {}
        }
        if qp.has_request_work(Instant::ZERO) {
            self.ctx.schedule(qp);
        }
        Ok(())
    }

    /// Posts a send work request (`ibv_post_send`). On a QP in the Error state it completes at
    /// once with `WR_FLUSH_ERR`, as verbs specify.
    pub fn post_send(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), PostError> {
        let r = self.post_send_unwatched(qpn, wr);
        self.watch(qpn.get());
        r
    }

    /// Posts `wrs` all or none (`ibv_wr_complete(3)`: a failure aborts the entire posting):
    /// every request is checked, and the queue's room for all of them, before any is posted.
    /// The error names the first request refused.
    pub fn post_send_batch(
        &mut self,
        qpn: Qpn,
        wrs: Vec<SendWr>,
    ) -> Result<(), (usize, PostError)> {
        let qp = self.qps.get(&qpn.get()).ok_or((0, PostError::UnknownQp(qpn)))?;
        let room = (qp.init.cap.max_send_wr as usize).saturating_sub(qp.req.sq.len());
        if wrs.len() > room {
            return Err((room, PostError::QueueFull));
        }
        for (i, wr) in wrs.iter().enumerate() {
            validate_send(qp, wr).map_err(|e| (i, e))?;
            if qp.init.qp_type == QpType::Ud {
                let ud = wr.ud.ok_or((i, PostError::MissingAddressHandle))?;
                if self.ctx.ahs.get(&ud.ah.0).is_none_or(|ah| ah.pd != qp.init.pd) {
                    return Err((i, PostError::UnknownAh));
                }
            }
        }
        for (i, wr) in wrs.into_iter().enumerate() {
            // Checked above, with room for all: cannot fail.
            self.post_send_unwatched(qpn, wr).map_err(|e| (i, e))?;
        }
        self.watch(qpn.get());
        Ok(())
    }

    fn post_send_unwatched(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), PostError> {
        let qp = self.qps.get_mut(&qpn.get()).ok_or(PostError::UnknownQp(qpn))?;
        let len = validate_send(qp, &wr)?;
        if qp.init.qp_type == QpType::Ud {
            let ud = wr.ud.ok_or(PostError::MissingAddressHandle)?;
            if self.ctx.ahs.get(&ud.ah.0).is_none_or(|ah| ah.pd != qp.init.pd) {
                return Err(PostError::UnknownAh);
            }
        }
        let signaled = qp.init.sq_sig_all || wr.flags.contains(crate::types::SendFlags::SIGNALED);
        if qp.state == QpState::Error {
            let wc = flush_wc(qpn, wr.wr_id, wr.opcode.into());
            self.ctx.complete(qp.init.send_cq, wc);
            return Ok(());
        }
        let mtu = qp.mtu.bytes();
        let npkts = match wr.opcode {
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => 1,
            WrOpcode::LocalInv | WrOpcode::BindMw => 0,
            _ => len.div_ceil(mtu).max(1),
        };
        qp.req.sq.push_back(SendWqe {
            wr,
            len,
            npkts,
            first_psn: Psn::ZERO,
            started: false,
            resp_pkts: 0,
            done: false,
            signaled,
            error: None,
        });
        if qp.can_send() {
            self.ctx.schedule(qp);
        }
        Ok(())
    }

    /// Posts a receive work request (`ibv_post_recv`).
    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), PostError> {
        let qp = self.qps.get_mut(&qpn.get()).ok_or(PostError::UnknownQp(qpn))?;
        if qp.state == QpState::Reset {
            return Err(PostError::InvalidState(qp.state));
        }
        if qp.init.srq.is_some() {
            return Err(PostError::UsesSrq);
        }
        if wr.sg_list.len() > qp.init.cap.max_recv_sge as usize {
            return Err(PostError::TooManySge);
        }
        if qp.rq.len() >= qp.init.cap.max_recv_wr as usize {
            return Err(PostError::QueueFull);
        }
        if qp.state == QpState::Error {
            let wc = flush_wc(qpn, wr.wr_id, WcOpcode::Recv);
            self.ctx.complete(qp.init.recv_cq, wc);
            return Ok(());
        }
        qp.rq.push_back(RecvWqe { wr });
        self.watch.update(qp);
        Ok(())
    }

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
        // ICRC first (IBA Annex A17.3.3): the prefix for this peer is kept per QP.
        let pseudo = match qp.rx_pseudo {
            Some((from, p)) if from == rx.src => p,
            _ => {
                let local = SocketAddr::new(rx.dst, ROCE_V2_PORT);
                let Ok(p) = PseudoHeader::for_endpoints(rx.src, local) else {
                    c.drop_wrong_peer += 1;
                    return;
                };
                qp.rx_pseudo = Some((rx.src, p));
                p
            }
        };
        let Some(packet) = verify_and_parse(&pseudo, &mut self.icrc, c, payload, intact) else {
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

    /// As [`Device::poll_transmit`], but a payload in registered memory stays there, for a
    /// runtime that sends with scatter/gather I/O: when [`Transmit::payload_at`] is `Some(h)`,
    /// the datagram is `buf[..h]`, then the memory `pieces` (address, length) in order, then
    /// `buf[h..]`; the ICRC already covers them. Payloads that are not in registered memory
    /// (inline data) and packets without payload come whole in `buf`. The pieces must go out
    /// before any other input reaches the device, which may change that memory.
    pub fn poll_transmit_gather(
        &mut self,
        now: Instant,
        buf: &mut Vec<u8>,
        pieces: &mut Vec<Piece>,
    ) -> Option<Transmit> {
        self.ctx.gather = true;
        let tx = self.poll_transmit(now, buf);
        self.ctx.gather = false;
        pieces.clear();
        if tx.is_some_and(|t| t.payload_at.is_some()) {
            core::mem::swap(pieces, &mut self.ctx.tx_pieces);
        }
        tx
    }

    /// Writes the next packet to send into `buf` (replacing its contents) and says where it
    /// goes; `None` when nothing is ready. Call until `None` after every input.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        self.ctx.advance_clock(now);
        let local = self.ctx.config.addr;
        if let Some(tx) =
            self.gsi.poll_transmit(local, self.ctx.defer_icrc, buf, &mut self.ctx.counters)
        {
            return Some(tx);
        }
        for _ in 0..self.ctx.rotation.len() {
            let qpn = self.ctx.rotation.pop_front()?;
            let Some(qp) = self.qps.get_mut(&qpn.get()) else {
                continue;
            };
            qp.scheduled = false;
            let tx = responder::poll(qp, &mut self.ctx, buf)
                .or_else(|| requester::poll(qp, &mut self.ctx, now, buf));
            self.watch.update(qp);
            if let Some(tx) = tx {
                qp.counters.sent_pkts += 1;
                qp.counters.sent_bytes += buf.len() as u64;
                self.ctx.schedule(qp);
                return Some(tx);
            }
        }
        None
    }

    /// Queues a MAD to send from QP1 to QP1 at `dst` (IBA 13.5.1); it goes out with the next
    /// [`Device::poll_transmit`]. Past [`crate::gsi::GSI_QUEUE`] waiting, it is dropped and
    /// counted (`drop_gsi_overflow`), as a send queue that is full.
    pub fn gsi_send(&mut self, dst: IpAddr, mad: &[u8; uroce_wire::mad::MAD_LEN]) {
        self.gsi.queue_send(dst, mad, &mut self.ctx.counters);
    }

    /// The next MAD received on QP1, oldest first.
    pub fn poll_gsi(&mut self) -> Option<crate::GsiMad> {
        self.gsi.take()
    }

    /// The earliest instant at which `handle_timeout` has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.watch.next_due()
    }

    /// Runs the timers due at `now`: ACK timeouts, tail-loss probes and RNR waits.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.ctx.advance_clock(now);
        for qpn in self.watch.due_at(now) {
            if let Some(qp) = self.qps.get_mut(&qpn) {
                completer::on_timer(qp, &mut self.ctx, now);
                self.watch.update(qp);
            }
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
    let Ok(pseudo) = cache.get(rx.src, SocketAddr::new(rx.dst, ROCE_V2_PORT)) else {
        c.drop_bad_dest += 1;
        return None;
    };
    verify_and_parse(&pseudo, icrc, c, payload, intact)
}

/// Verifies the ICRC (IBA Annex A17.3.3) and parses the packet, counting a failure.
fn verify_and_parse<'a>(
    pseudo: &PseudoHeader,
    icrc: &mut IdRecovery,
    c: &mut Counters,
    payload: &'a [u8],
    intact: bool,
) -> Option<PacketRepr<'a>> {
    if !intact && let Err(e) = icrc.verify(pseudo, payload) {
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

/// Checks a send WR against the QP and returns the message length.
fn validate_send(qp: &Qp, wr: &SendWr) -> Result<u32, PostError> {
    if !matches!(qp.state, QpState::Rts | QpState::Sqd | QpState::Error) {
        return Err(PostError::InvalidState(qp.state));
    }
    if qp.req.sq.len() >= qp.init.cap.max_send_wr as usize {
        return Err(PostError::QueueFull);
    }
    // IBA 9.8: UC carries SEND and RDMA WRITE only; UD carries SEND only. SEND with
    // invalidate is RC's (its opcodes exist for RC and XRC only); windows are bound and keys
    // invalidated on connected QPs (IBA 10.6.7.2).
    let op = wr.opcode;
    let supported = match qp.init.qp_type {
        QpType::Rc => true,
        QpType::Uc => !op.is_read_or_atomic() && op != WrOpcode::SendWithInv,
        QpType::Ud => matches!(op, WrOpcode::Send | WrOpcode::SendWithImm),
    };
    if !supported {
        return Err(PostError::UnsupportedOpcode);
    }
    match op {
        WrOpcode::BindMw if wr.bind.is_none() => return Err(PostError::MissingBind),
        WrOpcode::LocalInv | WrOpcode::SendWithInv if wr.invalidate_rkey.is_none() => {
            return Err(PostError::MissingInvalidateKey);
        }
        _ => {}
    }
    if wr.opcode.is_rdma() && wr.remote.is_none() {
        return Err(PostError::MissingRemote);
    }
    if wr.opcode.has_imm() && wr.imm.is_none() {
        return Err(PostError::MissingImm);
    }
    let len: u64 = match &wr.inline_data {
        Some(data) => {
            if data.len() > qp.init.cap.max_inline_data as usize || wr.opcode.is_read_or_atomic() {
                return Err(PostError::InlineTooLong);
            }
            data.len() as u64
        }
        None => {
            if wr.sg_list.len() > qp.init.cap.max_send_sge as usize {
                return Err(PostError::TooManySge);
            }
            wr.sg_list.iter().map(|s| u64::from(s.length)).sum()
        }
    };
    if wr.opcode.is_atomic() && (wr.sg_list.len() != 1 || len != 8) {
        return Err(PostError::BadAtomicSge);
    }
    // IBA 9.7: an RC message is at most 2^31 bytes.
    if len > 1 << 31 {
        return Err(PostError::MessageTooLong);
    }
    // IBA 9.8.2: a UD message is one packet.
    if qp.init.qp_type == QpType::Ud && len > u64::from(qp.mtu.bytes()) {
        return Err(PostError::ExceedsMtu { len, mtu: qp.mtu.bytes() });
    }
    u32::try_from(len).map_err(|_| PostError::MessageTooLong)
}

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
        invalidated_rkey: None,
    }
}
