//! Queue pairs: their state machine, attributes and queues. The protocol steps that act on
//! them are in `requester.rs`, `completer.rs` and `responder.rs`.

use core::fmt;
use core::net::SocketAddr;
use std::collections::VecDeque;

use uroce_wire::aeth::Syndrome;
use uroce_wire::icrc::{PseudoHeader, RxFlow};
use uroce_wire::{Msn, Psn, QKey, Qpn, RKey};

use crate::time::{Duration, Instant};
use crate::types::{
    Access, AddressVector, CqHandle, Mtu, PdHandle, QpState, QpType, RecvWr, RnrTimer, SendWr,
    WrOpcode,
};

/// Limits of a QP's queues (`ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    /// Send WQEs outstanding at once.
    pub max_send_wr: u32,
    /// Receive WQEs outstanding at once.
    pub max_recv_wr: u32,
    /// Scatter/gather elements per send WQE.
    pub max_send_sge: u32,
    /// Scatter/gather elements per receive WQE.
    pub max_recv_sge: u32,
    /// Bytes of inline data per send WQE.
    pub max_inline_data: u32,
}

impl QpCap {
    /// 256 WRs each way, 4 scatter/gather elements each, 256 bytes inline.
    pub const DEFAULT: Self = Self {
        max_send_wr: 256,
        max_recv_wr: 256,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 256,
    };
}

impl Default for QpCap {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What `create_qp` needs (`ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInitAttr {
    /// Transport.
    pub qp_type: QpType,
    /// Protection domain: the QP may only use regions of this PD.
    pub pd: PdHandle,
    /// Where send completions go.
    pub send_cq: CqHandle,
    /// Where receive completions go.
    pub recv_cq: CqHandle,
    /// Queue limits.
    pub cap: QpCap,
    /// Every send WR is signaled, whatever its flags (`sq_sig_all`).
    pub sq_sig_all: bool,
    /// Take receive WQEs from this shared receive queue instead of the QP's own.
    pub srq: Option<crate::types::SrqHandle>,
    /// An XRC target's domain. An XRC target has no PD, CQs or SRQ of its own: while a
    /// message is received, `pd`, `recv_cq` and `srq` are those of the XRC SRQ it names.
    pub xrcd: Option<crate::types::XrcdHandle>,
}

impl QpInitAttr {
    /// A QP of `qp_type` in `pd` completing both queues on `cq`, with the default queue
    /// limits, every send WR signaled and its own receive queue; change a field with
    /// `QpInitAttr { sq_sig_all: false, ..QpInitAttr::new(…) }`.
    pub const fn new(qp_type: QpType, pd: PdHandle, cq: CqHandle) -> Self {
        Self {
            qp_type,
            pd,
            send_cq: cq,
            recv_cq: cq,
            cap: QpCap::DEFAULT,
            sq_sig_all: true,
            srq: None,
            xrcd: None,
        }
    }

    /// An XRC target QP in `xrcd` (`IBV_QPT_XRC_RECV` with `IBV_QP_INIT_ATTR_XRCD`): no
    /// queues, PD or CQs of its own (IBA Annex A14).
    pub const fn xrc_target(xrcd: crate::types::XrcdHandle) -> Self {
        let mut init = Self::new(QpType::XrcTgt, PdHandle(0), CqHandle(0));
        init.cap = QpCap {
            max_send_wr: 0,
            max_recv_wr: 0,
            max_send_sge: 0,
            max_recv_sge: 0,
            max_inline_data: 0,
        };
        init.xrcd = Some(xrcd);
        init
    }
}

/// Attributes for `modify_qp` (`ibv_qp_attr` with its mask: a `Some` field is in the mask).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpAttr {
    /// The state to move to.
    pub state: Option<QpState>,
    /// The state the caller believes the QP is in (`IBV_QP_CUR_STATE`): a modify whose
    /// belief is wrong is refused (IBA 11.2.5.2).
    pub cur_state: Option<QpState>,
    /// Partition key index (uroce has one partition, index 0).
    pub pkey_index: Option<u16>,
    /// Port (uroce devices have port 1).
    pub port_num: Option<u8>,
    /// Remote operations the responder allows.
    pub access_flags: Option<Access>,
    /// Path MTU.
    pub path_mtu: Option<Mtu>,
    /// The peer's address.
    pub av: Option<AddressVector>,
    /// The peer's QPN.
    pub dest_qp_num: Option<Qpn>,
    /// First PSN the responder expects.
    pub rq_psn: Option<Psn>,
    /// READ and atomic requests the responder keeps resources for (1–16).
    pub max_dest_rd_atomic: Option<u8>,
    /// RNR NAK delay this responder asks for.
    pub min_rnr_timer: Option<RnrTimer>,
    /// First PSN the requester sends.
    pub sq_psn: Option<Psn>,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout; 0 waits forever (IBA 9.7).
    pub timeout: Option<u8>,
    /// Retries after an ACK timeout or a sequence NAK (0–7).
    pub retry_cnt: Option<u8>,
    /// Retries after an RNR NAK (0–7; 7 means forever, IBA 9.7).
    pub rnr_retry: Option<u8>,
    /// READ and atomic requests the requester keeps outstanding (1–16).
    pub max_rd_atomic: Option<u8>,
    /// UD: the Q_Key incoming datagrams must carry, and the one sent when a work request asks
    /// for the QP's own (IBA 10.2.5).
    pub qkey: Option<QKey>,
}

/// Why `modify_qp` refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModifyError {
    /// No such QP.
    UnknownQp(Qpn),
    /// The state machine has no such transition (IBA 10.3).
    InvalidTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// The transition requires an attribute that was not given (`ibv_modify_qp(3)`).
    MissingAttribute {
        /// The attribute, as rdma-core names its mask bit.
        attr: &'static str,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// The transition does not take an attribute that was given (IBA 11.2.5.2; Linux's
    /// `ib_modify_qp_is_ok`).
    UnexpectedAttribute {
        /// The attribute, as rdma-core names its mask bit.
        attr: &'static str,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// `IBV_QP_CUR_STATE` names a state the QP is not in.
    NotInState {
        /// The state the caller named.
        believed: QpState,
        /// The QP's state.
        actual: QpState,
    },
    /// An attribute is outside its range.
    InvalidValue {
        /// The attribute.
        attr: &'static str,
        /// The rule it breaks.
        rule: &'static str,
    },
}

impl fmt::Display for ModifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownQp(q) => write!(f, "no QP {q}"),
            Self::InvalidTransition { from, to } => write!(f, "no transition {from:?} -> {to:?}"),
            Self::MissingAttribute { attr, from, to } => {
                write!(f, "{from:?} -> {to:?} requires {attr}")
            }
            Self::UnexpectedAttribute { attr, from, to } => {
                write!(f, "{from:?} -> {to:?} does not take {attr}")
            }
            Self::NotInState { believed, actual } => {
                write!(f, "IBV_QP_CUR_STATE is {believed:?} but the QP is in {actual:?}")
            }
            Self::InvalidValue { attr, rule } => write!(f, "{attr}: {rule}"),
        }
    }
}

impl std::error::Error for ModifyError {}

/// Why a post was refused. Nothing was queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// No such QP.
    UnknownQp(Qpn),
    /// Sends need RTS (or SQD/Error), receives need Init or later (`ibv_post_send(3)`).
    InvalidState(QpState),
    /// The queue already holds `max_send_wr` / `max_recv_wr` WQEs.
    QueueFull,
    /// More scatter/gather elements than `max_send_sge` / `max_recv_sge`.
    TooManySge,
    /// Inline data longer than `max_inline_data`.
    InlineTooLong,
    /// A message longer than 2^31 bytes (IBA 9.7: RC messages are at most 2^31 bytes).
    MessageTooLong,
    /// An RDMA or atomic opcode without a remote address.
    MissingRemote,
    /// An atomic whose local buffer is not one 8-byte element, or an atomic write of other
    /// than 8 bytes.
    BadAtomicSge,
    /// Immediate data missing on a `*WithImm` opcode.
    MissingImm,
    /// The QP's transport does not have this operation (UC has no READ or atomics).
    UnsupportedOpcode,
    /// The QP takes its receives from a shared receive queue: post them there.
    UsesSrq,
    /// No shared receive queue with this handle.
    UnknownSrq,
    /// A UD send without a destination (`wr.ud`).
    MissingAddressHandle,
    /// No address handle with this handle in the QP's protection domain.
    UnknownAh,
    /// A bind work request without its binding.
    MissingBind,
    /// A local invalidate or SEND with invalidate without the key.
    MissingInvalidateKey,
    /// An XRC QP has no receive queue: receives go to an XRC SRQ (IBA Annex A14).
    NoReceiveQueue,
    /// An XRC target QP has no send queue.
    NoSendQueue,
    /// A UD message longer than the path MTU: a datagram is one packet (IBA 9.8.2).
    ExceedsMtu {
        /// The message length.
        len: u64,
        /// The MTU.
        mtu: u32,
    },
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownQp(q) => write!(f, "no QP {q}"),
            Self::InvalidState(s) => write!(f, "QP in state {s:?} cannot take this post"),
            Self::QueueFull => f.write_str("work queue full"),
            Self::TooManySge => f.write_str("more scatter/gather elements than the QP allows"),
            Self::InlineTooLong => f.write_str("inline data longer than max_inline_data"),
            Self::MessageTooLong => f.write_str("message longer than 2^31 bytes"),
            Self::MissingRemote => {
                f.write_str("RDMA or atomic work request without remote address")
            }
            Self::BadAtomicSge => f.write_str(
                "an atomic needs 8 bytes (compare-and-swap and fetch-and-add in one element)",
            ),
            Self::MissingImm => f.write_str("immediate opcode without immediate data"),
            Self::UnsupportedOpcode => f.write_str("operation not supported by the QP's transport"),
            Self::UsesSrq => f.write_str("the QP uses a shared receive queue; post receives there"),
            Self::UnknownSrq => f.write_str("no such shared receive queue"),
            Self::MissingAddressHandle => f.write_str("UD send without an address handle"),
            Self::UnknownAh => f.write_str("no such address handle in the QP's protection domain"),
            Self::MissingBind => f.write_str("bind work request without a window and binding"),
            Self::MissingInvalidateKey => f.write_str("invalidation without the key to invalidate"),
            Self::NoReceiveQueue => {
                f.write_str("an XRC QP has no receive queue; post receives to the XRC SRQ")
            }
            Self::NoSendQueue => f.write_str("an XRC target QP has no send queue"),
            Self::ExceedsMtu { len, mtu } => {
                write!(f, "a {len}-byte datagram exceeds the {mtu}-byte MTU")
            }
        }
    }
}

impl std::error::Error for PostError {}

/// A send WQE and its progress.
#[derive(Debug)]
pub(crate) struct SendWqe {
    pub(crate) wr: SendWr,
    /// Message length in bytes.
    pub(crate) len: u32,
    /// Packets (PSNs) the message occupies; a READ occupies one per response packet.
    pub(crate) npkts: u32,
    /// Assigned when the WQE first goes on the wire.
    pub(crate) first_psn: Psn,
    pub(crate) started: bool,
    /// READ: response packets received in order; atomic: 1 once the ACK arrived.
    pub(crate) resp_pkts: u32,
    /// READ or atomic: all response data is in.
    pub(crate) done: bool,
    pub(crate) signaled: bool,
    /// A local error found when the WQE was started; reported when it reaches the front.
    pub(crate) error: Option<crate::types::WcStatus>,
    /// Work the device queued itself (a TM-SRQ's rendezvous): it completes to the device,
    /// never on the send CQ.
    pub(crate) device_op: Option<Box<crate::tm::DeviceOp>>,
}

impl SendWqe {
    /// A WQE not yet started for a checked `wr` of `len` bytes on a path of `mtu` bytes.
    pub(crate) fn new(
        wr: SendWr,
        len: u32,
        mtu: u32,
        signaled: bool,
        device_op: Option<Box<crate::tm::DeviceOp>>,
    ) -> Self {
        let npkts = match wr.opcode {
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => 1,
            WrOpcode::LocalInv | WrOpcode::BindMw => 0,
            _ => len.div_ceil(mtu).max(1),
        };
        Self {
            wr,
            len,
            npkts,
            first_psn: Psn::ZERO,
            started: false,
            resp_pkts: 0,
            done: false,
            signaled,
            error: None,
            device_op,
        }
    }

    pub(crate) fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts.saturating_sub(1))
    }
}

/// A receive WQE.
#[derive(Debug)]
pub(crate) struct RecvWqe {
    pub(crate) wr: RecvWr,
}

/// The requester's progress through the send queue (IBA 9.7; rxe_req.c).
#[derive(Debug, Default)]
pub(crate) struct Requester {
    /// Posted WQEs not yet completed, oldest first.
    pub(crate) sq: VecDeque<SendWqe>,
    /// Index in `sq` of the first WQE with packets still to send.
    pub(crate) next_wqe: usize,
    /// Packets of `sq[next_wqe]` already sent.
    pub(crate) next_pkt: u32,
    /// PSN of the next packet to send.
    pub(crate) next_psn: Psn,
    /// Oldest PSN not yet acknowledged.
    pub(crate) una: Psn,
    /// Retries left before `RETRY_EXC_ERR`.
    pub(crate) retries_left: u8,
    /// RNR retries left before `RNR_RETRY_EXC_ERR` (unused when `rnr_retry` is 7).
    pub(crate) rnr_retries_left: u8,
    /// ACK timeout deadline while packets are outstanding.
    pub(crate) ack_deadline: Option<Instant>,
    /// After an RNR NAK: when to resume, and from which PSN.
    pub(crate) rnr_resume: Option<(Instant, Psn)>,
    /// Packets sent since the last one with AckReq.
    pub(crate) since_ack_req: u32,
    /// One past the highest PSN ever sent: PSNs before it that go out again are retransmits.
    pub(crate) high_psn: Psn,
    /// Go-back-N from this PSN is under way; further signs of the same loss are ignored.
    pub(crate) recovering: Option<Psn>,
    /// READ and atomic WQEs started and still waiting for their response (against
    /// `max_rd_atomic` and the fence).
    pub(crate) rd_atomic_outstanding: u32,
    /// Packets the requester may have unacknowledged now (besides the device's
    /// `max_inflight_pkts`): cut to 7/10 at each loss, grown by eight per window of
    /// acknowledged packets. Go-back-N resends everything after a lost packet, so on a lossy
    /// path a smaller window wastes less. 0 until the first loss: no limit of its own.
    pub(crate) cwnd: u32,
    /// Packets acknowledged toward the next growth of `cwnd`.
    pub(crate) cwnd_acked: u32,
    /// When to probe for a lost tail ([`crate::completer`]'s tail-loss probe): armed while
    /// packets are outstanding, pushed back by every acknowledgement that makes progress.
    pub(crate) probe_at: Option<Instant>,
    /// Probes sent since the last progress.
    pub(crate) probes: u8,
    /// Smoothed round-trip time, from acknowledgements of packets sent once (Karn's rule).
    pub(crate) srtt: Option<Duration>,
    /// The packet being timed for `srtt`: its PSN and when it went out.
    pub(crate) timing: Option<(Psn, Instant)>,
}

impl Requester {
    /// The instant the earliest of its timers is due: the ACK timeout, the tail-loss probe,
    /// the end of an RNR wait.
    pub(crate) fn next_timer(&self) -> Option<Instant> {
        [self.ack_deadline, self.probe_at, self.rnr_resume.map(|(t, _)| t)]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether packets are on the wire and not yet acknowledged.
    pub(crate) fn awaits_ack(&self) -> bool {
        self.una.is_before(self.high_psn)
    }
}

/// A message the responder is in the middle of.
#[derive(Debug)]
pub(crate) enum InMessage {
    /// A multi-packet SEND: its receive WQE, the bytes placed so far, and (at a TM-SRQ) how
    /// it is delivered.
    Send { wqe: RecvWqe, written: u32, delivery: crate::tm::Delivery },
    /// A multi-packet RDMA WRITE.
    Write { va: u64, rkey: RKey, dma_len: u32, written: u32 },
}

/// What a READ or atomic request left behind, to answer a duplicate of it (IBA 9.7;
/// rxe's `resp_res`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Resource {
    pub(crate) first_psn: Psn,
    pub(crate) kind: ResourceKind,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum ResourceKind {
    Read { va: u64, rkey: RKey, len: u32, npkts: u32 },
    Atomic { orig: u64 },
}

/// A response waiting to go out. `replay` marks the answer to a duplicate request, which the
/// requester sent again for a request it still counts once: only the others count against
/// `max_dest_rd_atomic`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Response {
    Ack {
        psn: Psn,
        syndrome: Syndrome,
        msn: Msn,
    },
    Read {
        first_psn: Psn,
        va: u64,
        rkey: RKey,
        /// The PD the READ is checked against: the QP's, or an XRC target's SRQ's when the
        /// request came (a later request may name another).
        pd: PdHandle,
        len: u32,
        npkts: u32,
        next: u32,
        msn: Msn,
        replay: bool,
    },
    Atomic {
        psn: Psn,
        orig: u64,
        msn: Msn,
        replay: bool,
    },
}

impl Response {
    /// A READ or atomic answer for a request first seen, not a duplicate.
    pub(crate) const fn answers_new_request(&self) -> bool {
        matches!(self, Self::Read { replay: false, .. } | Self::Atomic { replay: false, .. })
    }

    pub(crate) fn set_replay(&mut self, on: bool) {
        if let Self::Read { replay, .. } | Self::Atomic { replay, .. } = self {
            *replay = on;
        }
    }
}

/// Which NAK the responder sent for the packets behind its expected PSN.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum NakSent {
    /// None: the next packet ahead of the expected PSN is a new gap.
    #[default]
    None,
    /// A sequence NAK for a gap, last sent at this instant (it is sent again for a packet that
    /// asks for an acknowledgement long enough after).
    Sequence(Instant),
    /// An RNR NAK, which stands for the packets behind it on its own.
    Rnr,
}

/// The responder's state (IBA 9.7; rxe_resp.c).
#[derive(Debug, Default)]
pub(crate) struct Responder {
    /// Expected PSN.
    pub(crate) epsn: Psn,
    /// Messages completed.
    pub(crate) msn: Msn,
    /// The NAK standing for the packets behind the expected PSN, if one went out: further
    /// out-of-order packets are dropped until the requester comes back to it.
    pub(crate) nak: NakSent,
    pub(crate) current: Option<InMessage>,
    /// UC: the rest of the current message is being dropped, until a FIRST or ONLY.
    pub(crate) uc_dropping: bool,
    pub(crate) resources: VecDeque<Resource>,
    pub(crate) out: VecDeque<Response>,
}

/// A queue pair.
#[derive(Debug)]
pub(crate) struct Qp {
    pub(crate) qpn: Qpn,
    pub(crate) init: QpInitAttr,
    pub(crate) state: QpState,
    pub(crate) access: Access,
    pub(crate) mtu: Mtu,
    pub(crate) av: Option<AddressVector>,
    pub(crate) dest_qpn: Qpn,
    /// UDP source port: per-QP flow entropy (RoCEv2, IBA Annex A17.4.2.1), as rxe derives it.
    pub(crate) src_port: u16,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) min_rnr_timer: RnrTimer,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
    /// ICRC prefix for what this QP sends.
    pub(crate) tx_pseudo: Option<PseudoHeader>,
    /// The last peer address this QP received from, and its flow: the ICRC prefix and the
    /// IPv4 identification expected next.
    pub(crate) rx_flow: Option<(SocketAddr, RxFlow)>,
    pub(crate) req: Requester,
    pub(crate) resp: Responder,
    pub(crate) rq: VecDeque<RecvWqe>,
    /// UD: the Q_Key (IBA 10.2.5).
    pub(crate) qkey: QKey,
    /// Queued on the device's transmit rotation.
    pub(crate) scheduled: bool,
    /// The communication-established event was raised.
    pub(crate) comm_established: bool,
    pub(crate) counters: crate::counters::QpCounters,
    /// The completion status that moved the QP to Error (`None`: not in Error, or moved there
    /// by `ibv_modify_qp`), for `uroce qp`.
    pub(crate) error_status: Option<crate::WcStatus>,
    /// Its entries in the device's [`crate::watch::QpWatch`].
    pub(crate) watched: crate::watch::Watched,
}

/// Largest READ and atomic depth a uroce device supports (`max_qp_rd_atom`).
pub const MAX_RD_ATOMIC: u8 = 16;

impl Qp {
    pub(crate) fn new(qpn: Qpn, init: QpInitAttr) -> Self {
        // 0xC000 | 14 bits of the QPN: the dynamic port range, one flow per QP.
        let src_port = 0xC000 | u16::try_from(qpn.get() & 0x3FFF).unwrap_or(0);
        Self {
            qpn,
            init,
            state: QpState::Reset,
            access: Access::NONE,
            mtu: Mtu::Mtu1024,
            av: None,
            dest_qpn: Qpn::QP0,
            src_port,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: RnrTimer::from_masked(12),
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            tx_pseudo: None,
            rx_flow: None,
            req: Requester::default(),
            resp: Responder::default(),
            rq: VecDeque::new(),
            qkey: QKey(0),
            scheduled: false,
            comm_established: false,
            error_status: None,
            watched: crate::watch::Watched::default(),
            counters: crate::counters::QpCounters::default(),
        }
    }

    /// The local ACK timeout, `None` for infinite (IBA 9.7: 4.096 µs × 2^timeout).
    pub(crate) fn ack_timeout(&self) -> Option<Duration> {
        (self.timeout != 0).then(|| Duration::from_nanos(4_096u64 << self.timeout.min(31)))
    }

    /// Validates and applies `attr`: the transition and its attributes against the table of
    /// [`crate::qp_transitions`] (IBA 10.3.1, 11.2.5.2), then each value. On error nothing
    /// changes. Returns the previous state.
    pub(crate) fn modify(&mut self, attr: &QpAttr) -> Result<QpState, ModifyError> {
        use crate::qp_transitions::{Attrs, transition};
        let from = self.state;
        let to = attr.state.unwrap_or(from);
        let t = transition(self.init.qp_type, from, to)
            .ok_or(ModifyError::InvalidTransition { from, to })?;
        let given = Attrs::of(attr);
        if let Some(attr) = t.required.without(given).first_name() {
            return Err(ModifyError::MissingAttribute { attr, from, to });
        }
        if let Some(attr) = given.without(t.required | t.optional).first_name() {
            return Err(ModifyError::UnexpectedAttribute { attr, from, to });
        }
        if let Some(believed) = attr.cur_state.filter(|&b| b != from) {
            return Err(ModifyError::NotInState { believed, actual: from });
        }
        let check = |v: Option<u8>, max: u8, attr: &'static str, rule: &'static str| match v {
            Some(v) if v > max => Err(ModifyError::InvalidValue { attr, rule }),
            _ => Ok(()),
        };
        check(attr.retry_cnt, 7, "retry_cnt", "at most 7")?;
        check(attr.rnr_retry, 7, "rnr_retry", "at most 7")?;
        check(attr.timeout, 31, "timeout", "at most 31")?;
        check(attr.max_rd_atomic, MAX_RD_ATOMIC, "max_rd_atomic", "at most max_qp_rd_atom (16)")?;
        check(attr.max_dest_rd_atomic, MAX_RD_ATOMIC, "max_dest_rd_atomic", "at most 16")?;
        if attr.pkey_index.is_some_and(|i| i != 0) {
            return Err(ModifyError::InvalidValue {
                attr: "pkey_index",
                rule: "the P_Key table has one entry",
            });
        }
        if attr.port_num.is_some_and(|p| p != 1) {
            return Err(ModifyError::InvalidValue {
                attr: "port_num",
                rule: "the device has port 1 only",
            });
        }

        if let Some(a) = attr.access_flags {
            self.access = a;
        }
        if let Some(m) = attr.path_mtu {
            self.mtu = m;
        }
        if let Some(av) = attr.av {
            self.av = Some(av);
        }
        if let Some(q) = attr.dest_qp_num {
            self.dest_qpn = q;
        }
        if let Some(p) = attr.rq_psn {
            self.resp.epsn = p;
        }
        if let Some(n) = attr.max_dest_rd_atomic {
            self.max_dest_rd_atomic = n.max(1);
        }
        if let Some(t) = attr.min_rnr_timer {
            self.min_rnr_timer = t;
        }
        if let Some(p) = attr.sq_psn {
            self.req.next_psn = p;
            self.req.una = p;
            self.req.high_psn = p;
        }
        if let Some(t) = attr.timeout {
            self.timeout = t;
        }
        if let Some(r) = attr.retry_cnt {
            self.retry_cnt = r;
            self.req.retries_left = r;
        }
        if let Some(r) = attr.rnr_retry {
            self.rnr_retry = r;
            self.req.rnr_retries_left = r;
        }
        if let Some(n) = attr.max_rd_atomic {
            self.max_rd_atomic = n.max(1);
        }
        if let Some(q) = attr.qkey {
            self.qkey = q;
        }
        self.state = to;
        Ok(from)
    }

    /// Whether the requester may start new work.
    pub(crate) fn can_send(&self) -> bool {
        self.state == QpState::Rts
    }

    /// Whether the responder accepts requests (IBA 10.3: from RTR on).
    /// Whether a send or receive work request of this QP is not yet completed.
    pub(crate) fn has_outstanding_work(&self) -> bool {
        !self.req.sq.is_empty() || !self.rq.is_empty()
    }

    /// The PD, CQs and SRQ this QP holds (what destroying them must wait for): its own, or
    /// none for an XRC target, whose are borrowed from the XRC SRQ each message names.
    pub(crate) fn held(&self) -> Option<&QpInitAttr> {
        (self.init.qp_type != QpType::XrcTgt).then_some(&self.init)
    }

    pub(crate) fn can_receive(&self) -> bool {
        matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd)
    }

    /// Whether the requester has anything to put on the wire now.
    /// In SQD (send queue drain, IBA 10.3) the WQEs already started are finished, sent again
    /// if need be, but no new one starts.
    pub(crate) fn has_request_work(&self, now: Instant) -> bool {
        let next = self.req.sq.get(self.req.next_wqe);
        let may_send = match self.state {
            QpState::Rts => next.is_some(),
            QpState::Sqd => next.is_some_and(|w| w.started),
            _ => false,
        };
        may_send && self.req.rnr_resume.is_none_or(|(t, _)| t <= now)
    }
}

#[cfg(test)]
mod size_tests {
    /// README's "Resource bounds" states what a QP and its work requests cost; this keeps it
    /// true.
    #[test]
    fn a_qp_and_its_work_requests_cost_what_the_readme_says() {
        let sizes = [
            ("a QP", size_of::<super::Qp>(), 1024),
            ("a send WQE", size_of::<super::SendWqe>(), 200),
            ("a receive WQE", size_of::<super::RecvWqe>(), 48),
            ("a queued response", size_of::<super::Response>(), 40),
        ];
        for (what, size, stated) in sizes {
            assert!(size <= stated, "{what} takes {size} bytes, README says {stated}: update it");
        }
    }
}
