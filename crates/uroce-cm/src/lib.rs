//! The InfiniBand communication manager (IBA chapter 12) as a sans-IO state machine, after
//! Linux's `ib_cm`: connection establishment (REQ, MRA, REP, RTU, REJ), release (DREQ, DREP,
//! TimeWait) and service ID resolution (SIDR) for UD.
//!
//! The CM reads no clock and touches no socket: MADs come in through [`Cm::handle_mad`], go out
//! through [`Cm::poll_transmit`] (a destination address and 256 bytes for QP1), time through
//! [`Cm::poll_timeout`]/[`Cm::handle_timeout`], and what the consumer must hear through
//! [`Cm::poll_event`]. The RDMA CM (address resolution, port spaces, the private-data header
//! of [`uroce_wire::cma`], QP transitions) sits above it.
//!
//! # Timing (IBA 12.4, 12.9.6)
//!
//! A message that expects an answer (REQ, REP, DREQ, SIDR_REQ) is sent again when the answer
//! does not come within 4.096 µs × 2^t of the peer's CM response timeout `t` plus twice the
//! packet lifetime, up to its max CM retries; an MRA stretches the wait by the service timeout
//! it names. When the retries run out the consumer hears it: [`Event::Unreachable`] for a
//! REQ or REP, [`Event::Disconnected`] for a DREQ, [`Event::SidrTimeout`]. A released
//! connection waits in TimeWait (12.9.7) before its comm ID is forgotten, answering
//! duplicates meanwhile.
//!
//! # Comm IDs and routing
//!
//! Every comm ID (and SIDR request ID) this CM allocates has [`Config::id_prefix`] in its top
//! byte: on a host where every process runs its own CM behind one QP1, the receiver's ID in a
//! message names the process that owns the connection ([`uroce_wire::cm::Message::receiver_id`]);
//! REQs and SIDR_REQs are routed by service ID instead.
//!
//! # A process that dies
//!
//! `ib_cm` lives in the kernel and outlives the processes it serves: when one dies, the
//! kernel destroys its ids, and a live connection sends its DREQ (`cm_destroy_id`). This CM
//! dies with its process. So its owner publishes what it holds established
//! ([`Cm::established`], again whenever [`Cm::changes`] moves), and a CM that survives it on
//! the host releases those connections in its stead: the peer itself takes the DREQ as
//! received ([`Cm::peer_gone`]); another endpoint of the dead one's address sends it
//! ([`Cm::release_gone`]).
//!
//! # Bounds
//!
//! At most [`Config::max_connections`] connections exist at once, and at most
//! [`Config::max_connections_per_remote`] of them that one remote address asked for: a REQ
//! past either is rejected with "no resources", so one peer cannot take every connection from
//! the others. A listener holds at most its backlog of requests the consumer has not
//! answered. SIDR requests are bounded the same way ([`MAX_SIDR`], [`MAX_SIDR_PER_REMOTE`]).
//! Every MAD refused is counted in [`Counters`], by reason. What a MAD costs does not grow
//! with the number of connections: connections are found by comm ID, by the peer's comm ID
//! and by the peer's QP, and timers are kept by deadline.
#![forbid(unsafe_code)]

mod timers;

use core::net::IpAddr;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use timers::Timers;

pub use uroce_engine::{Duration, Instant};
use uroce_wire::cm::{
    CmMad, Dreq, Ids, Message, Mra, MsgRef, Path, Rej, Rep, Req, SidrRep, SidrReq, TransportType,
    reason, sidr_status,
};
use uroce_wire::mad::MAD_LEN;
use uroce_wire::{Psn, QKey, Qpn};

/// A communication ID (IBA 12.6.2): names one end of one connection.
pub type CommId = u32;

/// A MAD to send: to QP1 at this address.
pub type Outgoing = (IpAddr, [u8; MAD_LEN]);

/// The [`Config::id_prefix`] in comm ID `id`: on a host, the endpoint whose CM allocated it.
pub const fn id_prefix_of(id: CommId) -> u8 {
    (id >> 24) as u8
}

/// An established connection as its CM's owner publishes it: what another CM needs to
/// release it should the owner's process die without doing so (a DREQ's fields, IBA 12.6.11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Established {
    /// Its comm ID.
    pub id: CommId,
    /// The peer's address.
    pub remote: IpAddr,
    /// The peer's comm ID.
    pub remote_id: CommId,
    /// The peer's QP.
    pub remote_qpn: Qpn,
}

/// How often a DREQ sent for a dead process's connection is sent again ([`Cm::release_gone`]):
/// nobody is left to hear the DREP (it goes to the dead endpoint), so a few tries, not the
/// connection's full retries.
const GONE_DREQ_RETRIES: u8 = 2;

/// How a CM is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// The top byte of every comm ID this CM allocates.
    pub id_prefix: u8,
    /// Where the low 24 bits of comm IDs start (random on a real device, so a restarted
    /// process does not reuse its predecessor's IDs).
    pub id_seed: u32,
    /// The CA GUID sent in REQ and REP.
    pub ca_guid: u64,
    /// This CM's response timeout (5 bits: 4.096 µs × 2^t), sent in REQs and MRAs.
    pub response_timeout: u8,
    /// How many times this CM sends a REQ before giving up (4 bits).
    pub max_cm_retries: u8,
    /// The path's packet lifetime (5 bits), counted twice in every wait.
    pub packet_lifetime: u8,
    /// Connections at once, in every state.
    pub max_connections: usize,
    /// Connections at once that one remote address asked for (passive ones, in every state
    /// until forgotten): a REQ past it is rejected, so a peer that floods requests leaves room
    /// for the others. Connections the consumer asks for do not count.
    pub max_connections_per_remote: usize,
}

impl Config {
    /// What uroce uses: response timeout 2^18 × 4.096 µs (1.07 s), 15 retries, packet
    /// lifetime 2^14 × 4.096 µs (67 ms), 65,536 connections, a quarter of them (16,384)
    /// with any one remote address.
    pub const fn new(id_prefix: u8, id_seed: u32, ca_guid: u64) -> Self {
        Self {
            id_prefix,
            id_seed,
            ca_guid,
            response_timeout: 18,
            max_cm_retries: 15,
            packet_lifetime: 14,
            max_connections: 65_536,
            max_connections_per_remote: 16_384,
        }
    }
}

/// 4.096 µs × 2^t, the IBA's encoding of every CM and transport timeout (IBA 12.6.5).
pub const fn exp_time(t: u8) -> Duration {
    let t = if t > 31 { 31 } else { t };
    Duration::from_nanos(4096 << t)
}

/// What the active side asks for (an `ib_cm_req_param`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    /// The passive side's address.
    pub remote: IpAddr,
    /// The local address (the path's source GID).
    pub local: IpAddr,
    /// The service (for the RDMA CM: port space and port).
    pub service_id: u64,
    /// The local QP.
    pub qpn: Qpn,
    /// The local QP's first PSN.
    pub starting_psn: Psn,
    /// RC or UC.
    pub transport: TransportType,
    /// READ/atomic requests the local QP accepts at once.
    pub responder_resources: u8,
    /// READ/atomic requests the local QP issues at once.
    pub initiator_depth: u8,
    /// Path MTU (IBA encoding).
    pub path_mtu: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The local QP uses an SRQ.
    pub srq: bool,
    /// The QP's local ACK timeout (5 bits).
    pub local_ack_timeout: u8,
    /// Private data (at most 92 bytes).
    pub private_data: Vec<u8>,
}

/// A received REQ's parameters, as the passive consumer needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    /// The service asked for.
    pub service_id: u64,
    /// The active side's QP.
    pub remote_qpn: Qpn,
    /// Its first PSN: the passive QP's expected PSN.
    pub starting_psn: Psn,
    /// RC or UC.
    pub transport: TransportType,
    /// The active side's responder resources (the passive side's initiator depth at most).
    pub responder_resources: u8,
    /// The active side's initiator depth (the passive side's responder resources at least).
    pub initiator_depth: u8,
    /// Path MTU (IBA encoding).
    pub path_mtu: u8,
    /// Transport retry count.
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// The active QP uses an SRQ.
    pub srq: bool,
    /// The path's local ACK timeout.
    pub local_ack_timeout: u8,
    /// The path's source and destination GIDs (the active and passive addresses).
    pub primary: Path,
    /// Private data as received (92 bytes).
    pub private_data: Vec<u8>,
}

/// What the passive side answers (an `ib_cm_rep_param`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptParams {
    /// The local QP.
    pub qpn: Qpn,
    /// The local QP's first PSN.
    pub starting_psn: Psn,
    /// READ/atomic requests the local QP accepts at once.
    pub responder_resources: u8,
    /// READ/atomic requests the local QP issues at once.
    pub initiator_depth: u8,
    /// RNR retry count the active side should use.
    pub rnr_retry_count: u8,
    /// The local QP uses an SRQ.
    pub srq: bool,
    /// Private data (at most 196 bytes).
    pub private_data: Vec<u8>,
}

/// A received REP's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyInfo {
    /// The passive side's QP.
    pub remote_qpn: Qpn,
    /// Its first PSN.
    pub starting_psn: Psn,
    /// Its responder resources.
    pub responder_resources: u8,
    /// Its initiator depth.
    pub initiator_depth: u8,
    /// RNR retry count to use.
    pub rnr_retry_count: u8,
    /// The passive QP uses an SRQ.
    pub srq: bool,
    /// Private data as received (196 bytes).
    pub private_data: Vec<u8>,
}

/// What the consumer must hear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A REQ for a service listened on: answer with [`Cm::accept`] or [`Cm::reject`].
    Request {
        /// The new connection's local comm ID.
        id: CommId,
        /// Who asks.
        from: IpAddr,
        /// The REQ.
        info: RequestInfo,
    },
    /// The passive side accepted: bring the QP to RTR and RTS, then [`Cm::ready`] (RTU).
    Reply {
        /// The connection.
        id: CommId,
        /// The REP.
        info: ReplyInfo,
    },
    /// The connection is established (RTU sent or received).
    Established {
        /// The connection.
        id: CommId,
    },
    /// The peer rejected the REQ or REP.
    Rejected {
        /// The connection (gone now).
        id: CommId,
        /// Why (IBA table 112).
        reason: u16,
        /// The REJ's private data (148 bytes).
        private_data: Vec<u8>,
    },
    /// The REQ or REP went unanswered through every retry (the connection is gone).
    Unreachable {
        /// The connection.
        id: CommId,
    },
    /// The peer sent a DREQ: answer with [`Cm::disconnect`] (DREP).
    DisconnectRequest {
        /// The connection.
        id: CommId,
        /// The DREQ's private data (220 bytes).
        private_data: Vec<u8>,
    },
    /// Our DREQ was answered, or timed out: the connection is released.
    Disconnected {
        /// The connection.
        id: CommId,
    },
    /// The comm ID left TimeWait and is forgotten.
    TimewaitExit {
        /// The connection.
        id: CommId,
    },
    /// A SIDR_REQ for a service listened on: answer with [`Cm::sidr_reply`].
    SidrRequest {
        /// The local handle of the request.
        id: u32,
        /// Who asks.
        from: IpAddr,
        /// The service.
        service_id: u64,
        /// Private data as received (216 bytes).
        private_data: Vec<u8>,
    },
    /// The answer to [`Cm::sidr_request`].
    SidrReply {
        /// The request.
        id: u32,
        /// IBA table 118 ([`uroce_wire::cm::sidr_status`]).
        status: u8,
        /// The service's UD QP.
        qpn: Qpn,
        /// Its Q_Key.
        qkey: QKey,
        /// Private data as received (136 bytes).
        private_data: Vec<u8>,
    },
    /// A SIDR_REQ went unanswered through every retry.
    SidrTimeout {
        /// The request.
        id: u32,
    },
}

/// A consumer call the CM refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// No such connection (or SIDR request).
    UnknownId(CommId),
    /// The connection is not in a state where the call applies (IBA 12.9.6).
    InvalidState(CommId, ConnState),
    /// Someone listens on the service already.
    ServiceInUse(u64),
    /// The CM holds [`Config::max_connections`] already.
    TooManyConnections,
    /// Private data longer than the message carries.
    PrivateDataTooLong,
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::UnknownId(id) => write!(f, "no connection with comm ID {id:#010x}"),
            Self::InvalidState(id, s) => {
                write!(f, "connection {id:#010x} is in state {s:?}, where this call does not apply")
            }
            Self::ServiceInUse(s) => write!(f, "service ID {s:#018x} is listened on already"),
            Self::TooManyConnections => f.write_str("the CM's connection limit is reached"),
            Self::PrivateDataTooLong => f.write_str("private data longer than the message holds"),
        }
    }
}

impl std::error::Error for Error {}

/// A connection's state (IBA 12.9.6, figures 146–148).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// Active: REQ sent, waiting for REP.
    ReqSent,
    /// Active: the passive side sent MRA; waiting longer.
    MraReqRcvd,
    /// Passive: REQ received, the consumer has not answered.
    ReqRcvd,
    /// Passive: as `ReqRcvd`, and MRA sent for a duplicate REQ.
    MraReqSent,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Active: REP received, the consumer has not sent RTU.
    RepRcvd,
    /// Both sides may use the QPs.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// DREQ received, the consumer has not answered.
    DreqRcvd,
    /// Released; duplicates are answered until the wait ends.
    TimeWait,
}

/// MADs counted by what became of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// MADs taken in.
    pub rx_mads: u64,
    /// MADs sent (retransmissions included).
    pub tx_mads: u64,
    /// Retransmissions after a timeout.
    pub retransmits: u64,
    /// Dropped: not a CM MAD this CM can parse.
    pub drop_malformed: u64,
    /// Dropped: a CM attribute or method the CM does not handle (LAP, APR, ClassPortInfo).
    pub drop_unsupported: u64,
    /// Dropped: names a comm ID (or SIDR request) this CM does not have, or has with another
    /// peer.
    pub drop_unknown_id: u64,
    /// Dropped: a message the connection's state does not expect.
    pub drop_wrong_state: u64,
    /// Duplicate REQs (answered with MRA or REP, or ignored).
    pub dup_req: u64,
    /// REQs and SIDR_REQs for a service nobody listens on (answered with REJ or SIDR_REP).
    pub no_listener: u64,
    /// REQs (and SIDR_REQs) refused because the listener's backlog or the connection limit
    /// is full.
    pub backlog_full: u64,
    /// REQs and SIDR_REQs refused because their sender holds its share already
    /// ([`Config::max_connections_per_remote`], [`MAX_SIDR_PER_REMOTE`]); answered with REJ
    /// "no resources" or SIDR_REP "no QP".
    pub remote_full: u64,
    /// REQs refused as stale: the QP is in a live connection already (IBA 12.9.8.3.1).
    pub stale: u64,
    /// Connections released for a process that died holding them ([`Cm::peer_gone`],
    /// [`Cm::release_gone`]).
    pub released_for_gone: u64,
}

#[derive(Debug, Clone)]
struct Conn {
    remote: IpAddr,
    remote_id: CommId,
    state: ConnState,
    tid: u64,
    service_id: u64,
    passive: bool,
    remote_qpn: Qpn,
    /// The message sent last that awaits an answer, for retransmission and duplicates.
    sent: Option<[u8; MAD_LEN]>,
    /// The wait for one answer, and how many retries remain.
    wait: Duration,
    retries_left: u8,
    timewait: Duration,
    /// The consumer destroyed the ID: no events, the CM finishes alone.
    orphan: bool,
}

#[derive(Debug, Clone)]
struct SidrOut {
    remote: IpAddr,
    sent: [u8; MAD_LEN],
    retries_left: u8,
}

#[derive(Debug, Clone, Copy)]
struct SidrIn {
    remote: IpAddr,
    request_id: u32,
    service_id: u64,
    tid: u64,
}

#[derive(Debug, Clone, Copy)]
struct Listener {
    backlog: usize,
    pending: usize,
}

/// The CM of one port (or one process's share of it).
#[derive(Debug)]
pub struct Cm {
    config: Config,
    next_id: u32,
    next_tid: u64,
    conns: BTreeMap<CommId, Conn>,
    /// Passive connections by the peer's address and comm ID: duplicate REQs.
    by_remote: HashMap<(IpAddr, CommId), CommId>,
    /// Connections by the peer's address and QP, once known: stale REQs.
    by_qp: BTreeSet<(IpAddr, Qpn, CommId)>,
    /// What each remote address holds here; an address holding nothing has no entry.
    load: HashMap<IpAddr, Load>,
    /// The deadline of every connection and outgoing SIDR request that waits for one (their
    /// IDs come from one space, [`Cm::alloc_id`]).
    timers: Timers<u32>,
    listeners: HashMap<u64, Listener>,
    sidr_out: BTreeMap<u32, SidrOut>,
    sidr_in: BTreeMap<u32, SidrIn>,
    /// Unanswered SIDR requests by the requester's address and request ID: duplicates.
    sidr_in_by_remote: HashMap<(IpAddr, u32), u32>,
    out: VecDeque<Outgoing>,
    events: VecDeque<Event>,
    counters: Counters,
    /// When this CM last answered a DREQ: until its peer's next retry, a DREP lost on the
    /// way can still be made good ([`Cm::answering_until`]).
    answered_at: Option<Instant>,
    /// Bumped by everything that may change which connections are established.
    changes: u64,
}

/// How many SIDR requests (each way) may be outstanding.
pub const MAX_SIDR: usize = 4096;

/// How many unanswered SIDR requests one remote address may have here: a quarter of them.
pub const MAX_SIDR_PER_REMOTE: usize = MAX_SIDR / 4;

/// What one remote address made a CM hold.
#[derive(Debug, Clone, Copy, Default)]
struct Load {
    /// Passive connections, in every state.
    conns: usize,
    sidr_in: usize,
}

impl Cm {
    /// A CM with no connections.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            next_id: config.id_seed,
            next_tid: u64::from(config.id_seed) << 8,
            conns: BTreeMap::new(),
            by_remote: HashMap::new(),
            by_qp: BTreeSet::new(),
            load: HashMap::new(),
            timers: Timers::new(),
            listeners: HashMap::new(),
            sidr_out: BTreeMap::new(),
            sidr_in: BTreeMap::new(),
            sidr_in_by_remote: HashMap::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            counters: Counters::default(),
            answered_at: None,
            changes: 0,
        }
    }

    /// A number that moves whenever the set of [`Cm::established`] connections may have
    /// changed: the owner republishes them then.
    pub const fn changes(&self) -> u64 {
        self.changes
    }

    /// The connections established here, as a surviving CM needs them to release each should
    /// this one's process die ([`Cm::peer_gone`], [`Cm::release_gone`]).
    pub fn established(&self) -> impl Iterator<Item = Established> + '_ {
        self.conns.iter().filter(|(_, c)| c.state == ConnState::Established && !c.orphan).map(
            |(&id, c)| Established {
                id,
                remote: c.remote,
                remote_id: c.remote_id,
                remote_qpn: c.remote_qpn,
            },
        )
    }

    /// `gone`, a connection that the endpoint at `from` held established when its process
    /// died, has its other end here: this CM takes the DREQ that `ib_cm` would have sent for
    /// it (its `cm_destroy_id` in Established, IBA 12.9.7) as received from `from`, and the
    /// consumer hears [`Event::DisconnectRequest`]. `false` if this CM is not its peer.
    pub fn peer_gone(&mut self, now: Instant, from: IpAddr, gone: &Established) -> bool {
        let ours = self
            .conns
            .get(&gone.remote_id)
            .is_some_and(|c| c.remote == from && c.remote_id == gone.id);
        if !ours {
            return false;
        }
        let dreq = Dreq {
            local_comm_id: gone.id,
            remote_comm_id: gone.remote_id,
            remote_qpn: gone.remote_qpn,
            private_data: &[],
        };
        let tid = self.alloc_tid();
        let Ok(bytes) = (CmMad { tid, message: Message::Dreq(dreq) }).to_bytes() else {
            return false;
        };
        self.counters.released_for_gone += 1;
        self.handle_mad(now, from, &bytes);
        true
    }

    /// `gone`, a connection that another endpoint of this CM's own address held established
    /// when its process died, is released from here as `ib_cm` would have released it: a DREQ
    /// under its comm ID to its peer (IBA 12.9.7), sent again twice at most on
    /// the CM's timer, with no events (the connection is this CM's orphan until then).
    /// `false` if its comm ID is in use here.
    pub fn release_gone(&mut self, now: Instant, gone: &Established) -> bool {
        if self.conns.contains_key(&gone.id) {
            return false;
        }
        let c = Conn {
            remote: gone.remote,
            remote_id: gone.remote_id,
            state: ConnState::Established,
            tid: 0,
            service_id: 0,
            passive: false,
            remote_qpn: gone.remote_qpn,
            sent: None,
            wait: Duration::ZERO,
            retries_left: 0,
            timewait: Duration::ZERO,
            orphan: true,
        };
        self.hold(gone.id, c);
        if self.disconnect(now, gone.id).is_err() {
            self.forget(gone.id);
            return false;
        }
        if let Some(c) = self.conns.get_mut(&gone.id) {
            c.retries_left = GONE_DREQ_RETRIES;
        }
        self.counters.released_for_gone += 1;
        true
    }

    /// The MADs counted so far.
    pub const fn counters(&self) -> &Counters {
        &self.counters
    }

    /// A connection's state.
    pub fn state(&self, id: CommId) -> Option<ConnState> {
        self.conns.get(&id).map(|c| c.state)
    }

    /// Connections whose DREQ waits for its DREP (IBA 12.9.7): the peer learns of the release
    /// only if the DREQ, retried on the CM's timer, gets through.
    pub fn releasing(&self) -> usize {
        self.conns.values().filter(|c| c.state == ConnState::DreqSent).count()
    }

    /// The CM's owner is about to end (a process exiting: `ib_cm` outlives the processes it
    /// serves, this CM does not). Every DREP this side sent for a release still in TimeWait
    /// goes out once more: were the first lost, the peer's retried DREQ (IBA 12.9.7) would
    /// find nobody here to answer it, and the peer would hear `Disconnected` only when its
    /// retries run out. Returns how many were sent.
    pub fn repeat_dreps(&mut self) -> usize {
        let mut repeated = 0;
        for c in self.conns.values().filter(|c| c.state == ConnState::TimeWait) {
            let Some(bytes) = c.sent else { continue };
            let is_drep = CmMad::parse(&bytes).is_ok_and(|m| matches!(m.message, Message::Drep(_)));
            if is_drep {
                self.out.push_back((c.remote, bytes));
                repeated += 1;
            }
        }
        self.counters.tx_mads += repeated as u64;
        repeated
    }

    /// Until when a peer may still retry a DREQ this CM answered, should the DREP have been
    /// lost: the peer waits this CM's response timeout plus twice the packet lifetime between
    /// tries (IBA 12.7.36, 12.9.7). A process that ends sooner leaves such a peer waiting out
    /// its retries; one that stays until then answers the retry (a DREQ for a connection gone
    /// is answered too, IBA 12.9.8.6). `None` when it never answered one.
    pub fn answering_until(&self) -> Option<Instant> {
        let wait = exp_time(self.config.response_timeout) + self.lifetime();
        self.answered_at.map(|t| t + wait)
    }

    /// Connections held, in every state.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Connections `remote` asked for (passive ones) held, in every state.
    pub fn connections_from(&self, remote: IpAddr) -> usize {
        self.load.get(&remote).map_or(0, |l| l.conns)
    }

    /// Unanswered SIDR requests from `remote`.
    pub fn sidr_requests_from(&self, remote: IpAddr) -> usize {
        self.load.get(&remote).map_or(0, |l| l.sidr_in)
    }

    /// Whether anything at all is held: connections, SIDR requests either way, timers,
    /// or per-address bookkeeping. Listeners do not count.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
            && self.sidr_out.is_empty()
            && self.sidr_in.is_empty()
            && self.by_remote.is_empty()
            && self.by_qp.is_empty()
            && self.load.is_empty()
            && self.sidr_in_by_remote.is_empty()
            && self.timers.len() == 0
    }

    /// Takes in a new connection and what indexes it.
    fn hold(&mut self, id: CommId, c: Conn) {
        if c.passive {
            self.load.entry(c.remote).or_default().conns += 1;
            self.by_remote.insert((c.remote, c.remote_id), id);
            self.by_qp.insert((c.remote, c.remote_qpn, id));
        }
        self.conns.insert(id, c);
    }

    /// Lets go of a connection and everything that indexes it.
    fn forget(&mut self, id: CommId) {
        let Some(c) = self.conns.remove(&id) else { return };
        if c.passive {
            self.by_remote.remove(&(c.remote, c.remote_id));
            self.unload(c.remote, |l| l.conns -= 1);
        }
        self.by_qp.remove(&(c.remote, c.remote_qpn, id));
        self.timers.set(id, None);
    }

    fn unload(&mut self, remote: IpAddr, f: impl FnOnce(&mut Load)) {
        if let Some(l) = self.load.get_mut(&remote) {
            f(l);
            if l.conns == 0 && l.sidr_in == 0 {
                self.load.remove(&remote);
            }
        }
    }

    /// Whether `remote` holds its share already (connections, or SIDR requests when `sidr`).
    fn remote_full(&self, remote: IpAddr, sidr: bool) -> bool {
        let l = self.load.get(&remote).copied().unwrap_or_default();
        if sidr {
            l.sidr_in >= MAX_SIDR_PER_REMOTE
        } else {
            l.conns >= self.config.max_connections_per_remote
        }
    }

    /// Whether someone listens on `service_id` here.
    pub fn is_listening(&self, service_id: u64) -> bool {
        self.listeners.contains_key(&service_id)
    }

    fn alloc_id(&mut self) -> CommId {
        loop {
            self.next_id = self.next_id.wrapping_add(1);
            let low = self.next_id & 0xFF_FFFF;
            let id = (u32::from(self.config.id_prefix) << 24) | low;
            let taken = self.conns.contains_key(&id)
                || self.sidr_out.contains_key(&id)
                || self.sidr_in.contains_key(&id);
            if low != 0 && !taken {
                return id;
            }
        }
    }

    fn alloc_tid(&mut self) -> u64 {
        self.next_tid = self.next_tid.wrapping_add(1);
        (u64::from(self.config.id_prefix) << 56) | (self.next_tid & 0x00FF_FFFF_FFFF_FFFF)
    }

    fn lifetime(&self) -> Duration {
        let l = exp_time(self.config.packet_lifetime);
        l + l
    }

    fn send(&mut self, to: IpAddr, mad: CmMad<'_>) -> Option<[u8; MAD_LEN]> {
        let bytes = mad.to_bytes().ok()?;
        self.out.push_back((to, bytes));
        self.counters.tx_mads += 1;
        Some(bytes)
    }

    fn event(&mut self, orphan: bool, e: Event) {
        if !orphan {
            self.events.push_back(e);
        }
    }

    /// Listens on `service_id`, holding at most `backlog` unanswered requests (0: 128).
    pub fn listen(&mut self, service_id: u64, backlog: usize) -> Result<(), Error> {
        if self.listeners.contains_key(&service_id) {
            return Err(Error::ServiceInUse(service_id));
        }
        let backlog = if backlog == 0 { 128 } else { backlog };
        self.listeners.insert(service_id, Listener { backlog, pending: 0 });
        Ok(())
    }

    /// Stops listening on `service_id`; requests already delivered stay.
    pub fn unlisten(&mut self, service_id: u64) {
        self.listeners.remove(&service_id);
    }

    /// Sends a REQ (IBA 12.9.6.1): the connection is in `ReqSent` until a REP, REJ or the
    /// last retry.
    pub fn connect(&mut self, now: Instant, p: &ConnectParams) -> Result<CommId, Error> {
        self.changes += 1;
        if self.conns.len() >= self.config.max_connections {
            return Err(Error::TooManyConnections);
        }
        if p.private_data.len() > uroce_wire::cm::private_len::REQ {
            return Err(Error::PrivateDataTooLong);
        }
        let id = self.alloc_id();
        let tid = self.alloc_tid();
        let primary = Path {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            local_gid: gid(p.local),
            remote_gid: gid(p.remote),
            hop_limit: 64,
            local_ack_timeout: p.local_ack_timeout,
            ..Path::default()
        };
        let c = &self.config;
        let req = Req {
            local_comm_id: id,
            vendor_id: 0,
            service_id: p.service_id,
            local_ca_guid: c.ca_guid,
            local_qkey: QKey(0),
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: c.response_timeout,
            transport: p.transport,
            end_to_end_flow_control: true,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: c.response_timeout,
            retry_count: p.retry_count & 7,
            pkey: 0xFFFF,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count & 7,
            max_cm_retries: c.max_cm_retries & 0xF,
            srq: p.srq,
            extended_transport: 0,
            primary,
            alternate: Path::default(),
            private_data: &p.private_data,
        };
        let wait = exp_time(c.response_timeout) + self.lifetime();
        let retries = c.max_cm_retries;
        let sent = self.send(p.remote, CmMad { tid, message: Message::Req(req) });
        self.timers.set(id, Some(now + wait));
        self.hold(
            id,
            Conn {
                remote: p.remote,
                remote_id: 0,
                state: ConnState::ReqSent,
                tid,
                service_id: p.service_id,
                passive: false,
                remote_qpn: Qpn::from_masked(0),
                sent,
                wait,
                retries_left: retries,
                timewait: exp_time(p.local_ack_timeout.saturating_add(1))
                    .min(Duration::from_secs(2)),
                orphan: false,
            },
        );
        Ok(id)
    }

    /// Sends a REP for a request (IBA 12.9.6.2): `RepSent` until the RTU.
    pub fn accept(&mut self, now: Instant, id: CommId, p: &AcceptParams) -> Result<(), Error> {
        self.changes += 1;
        let c = self.conns.get(&id).ok_or(Error::UnknownId(id))?;
        if !matches!(c.state, ConnState::ReqRcvd | ConnState::MraReqSent) {
            return Err(Error::InvalidState(id, c.state));
        }
        if p.private_data.len() > uroce_wire::cm::private_len::REP {
            return Err(Error::PrivateDataTooLong);
        }
        let (remote, remote_id, tid, service) = (c.remote, c.remote_id, c.tid, c.service_id);
        let rep = Rep {
            local_comm_id: id,
            remote_comm_id: remote_id,
            local_qkey: QKey(0),
            local_qpn: p.qpn,
            local_eecn: 0,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: 0,
            failover_accepted: 0,
            end_to_end_flow_control: true,
            rnr_retry_count: p.rnr_retry_count & 7,
            srq: p.srq,
            local_ca_guid: self.config.ca_guid,
            private_data: &p.private_data,
        };
        let sent = self.send(remote, CmMad { tid, message: Message::Rep(rep) });
        self.unpend(service);
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = ConnState::RepSent;
            c.sent = sent;
            self.timers.set(id, Some(now + c.wait));
        }
        Ok(())
    }

    /// Sends a REJ for a request not yet accepted (passive) or a REP not yet confirmed
    /// (active), with `reason` (IBA table 112; the RDMA CM's consumer reject is 28). The
    /// connection is gone.
    pub fn reject(
        &mut self,
        now: Instant,
        id: CommId,
        why: u16,
        private_data: &[u8],
    ) -> Result<(), Error> {
        let c = self.conns.get(&id).ok_or(Error::UnknownId(id))?;
        let message = match c.state {
            ConnState::ReqRcvd | ConnState::MraReqSent => MsgRef::Req,
            ConnState::RepRcvd => MsgRef::Rep,
            s => return Err(Error::InvalidState(id, s)),
        };
        if private_data.len() > uroce_wire::cm::private_len::REJ {
            return Err(Error::PrivateDataTooLong);
        }
        let (remote, remote_id, tid, service, passive) =
            (c.remote, c.remote_id, c.tid, c.service_id, c.passive);
        self.send_rej(remote, tid, id, remote_id, message, why, private_data);
        if passive {
            self.unpend(service);
            self.retire(now, id);
        } else {
            self.forget(id);
        }
        Ok(())
    }

    /// Sends the RTU after a REP (IBA 12.9.6.1): the connection is established.
    pub fn ready(&mut self, id: CommId) -> Result<(), Error> {
        self.changes += 1;
        let c = self.conns.get(&id).ok_or(Error::UnknownId(id))?;
        if c.state != ConnState::RepRcvd {
            return Err(Error::InvalidState(id, c.state));
        }
        let (remote, remote_id, tid, orphan) = (c.remote, c.remote_id, c.tid, c.orphan);
        let rtu = Ids { local_comm_id: id, remote_comm_id: remote_id, private_data: &[] };
        let sent = self.send(remote, CmMad { tid, message: Message::Rtu(rtu) });
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = ConnState::Established;
            // Kept to answer a duplicate REP (our RTU was lost).
            c.sent = sent;
        }
        self.timers.set(id, None);
        self.event(orphan, Event::Established { id });
        Ok(())
    }

    /// The passive QP received a packet before the RTU (IBA 12.9.8.3.3, the "communication
    /// established" event): the RTU was lost, the connection is up.
    pub fn notify_established(&mut self, id: CommId) -> Result<(), Error> {
        self.changes += 1;
        let c = self.conns.get_mut(&id).ok_or(Error::UnknownId(id))?;
        if c.state != ConnState::RepSent {
            return Err(Error::InvalidState(id, c.state));
        }
        c.state = ConnState::Established;
        let orphan = c.orphan;
        self.timers.set(id, None);
        self.event(orphan, Event::Established { id });
        Ok(())
    }

    /// Releases a connection (IBA 12.9.7): from `Established` (or a handshake the consumer
    /// gives up) sends a DREQ and waits for the DREP; after a DREQ received, sends the DREP.
    pub fn disconnect(&mut self, now: Instant, id: CommId) -> Result<(), Error> {
        self.changes += 1;
        let c = self.conns.get(&id).ok_or(Error::UnknownId(id))?;
        let (remote, remote_id, remote_qpn) = (c.remote, c.remote_id, c.remote_qpn);
        match c.state {
            ConnState::Established | ConnState::RepSent | ConnState::RepRcvd => {
                let tid = self.alloc_tid();
                let dreq = Dreq {
                    local_comm_id: id,
                    remote_comm_id: remote_id,
                    remote_qpn,
                    private_data: &[],
                };
                let sent = self.send(remote, CmMad { tid, message: Message::Dreq(dreq) });
                let retries = self.config.max_cm_retries;
                let wait = exp_time(self.config.response_timeout) + self.lifetime();
                if let Some(c) = self.conns.get_mut(&id) {
                    c.state = ConnState::DreqSent;
                    c.tid = tid;
                    c.sent = sent;
                    c.wait = wait;
                    c.retries_left = retries;
                }
                self.timers.set(id, Some(now + wait));
                Ok(())
            }
            ConnState::DreqRcvd => {
                self.send_drep(id, now);
                Ok(())
            }
            s => Err(Error::InvalidState(id, s)),
        }
    }

    /// The consumer is done with `id` (`ib_destroy_cm_id`): a request not answered is
    /// rejected, a live connection released; the CM finishes the exchange without events.
    pub fn destroy(&mut self, now: Instant, id: CommId) {
        self.changes += 1;
        let Some(c) = self.conns.get_mut(&id) else { return };
        c.orphan = true;
        match c.state {
            ConnState::ReqRcvd | ConnState::MraReqSent | ConnState::RepRcvd => {
                let _ = self.reject(now, id, reason::CONSUMER_REJECT, &[]);
            }
            ConnState::Established | ConnState::RepSent | ConnState::DreqRcvd => {
                let _ = self.disconnect(now, id);
            }
            ConnState::ReqSent | ConnState::MraReqRcvd => self.forget(id),
            ConnState::DreqSent | ConnState::TimeWait => {}
        }
    }

    /// Asks `remote` which UD QP serves `service_id` (IBA 12.11): a [`Event::SidrReply`] or
    /// [`Event::SidrTimeout`] follows.
    pub fn sidr_request(
        &mut self,
        now: Instant,
        remote: IpAddr,
        service_id: u64,
        private_data: &[u8],
    ) -> Result<u32, Error> {
        if self.sidr_out.len() >= MAX_SIDR {
            return Err(Error::TooManyConnections);
        }
        if private_data.len() > uroce_wire::cm::private_len::SIDR_REQ {
            return Err(Error::PrivateDataTooLong);
        }
        let id = self.alloc_id();
        let tid = self.alloc_tid();
        let req = SidrReq { request_id: id, pkey: 0xFFFF, service_id, private_data };
        let Some(sent) = self.send(remote, CmMad { tid, message: Message::SidrReq(req) }) else {
            return Err(Error::PrivateDataTooLong);
        };
        let deadline = now + exp_time(self.config.response_timeout) + self.lifetime();
        let retries_left = self.config.max_cm_retries;
        self.sidr_out.insert(id, SidrOut { remote, sent, retries_left });
        self.timers.set(id, Some(deadline));
        Ok(id)
    }

    /// Answers a [`Event::SidrRequest`].
    pub fn sidr_reply(
        &mut self,
        id: u32,
        status: u8,
        qpn: Qpn,
        qkey: QKey,
        private_data: &[u8],
    ) -> Result<(), Error> {
        if private_data.len() > uroce_wire::cm::private_len::SIDR_REP {
            return Err(Error::PrivateDataTooLong);
        }
        let r = self.sidr_in.remove(&id).ok_or(Error::UnknownId(id))?;
        self.sidr_in_by_remote.remove(&(r.remote, r.request_id));
        self.unload(r.remote, |l| l.sidr_in -= 1);
        self.send_sidr_rep(
            r.remote,
            r.tid,
            r.request_id,
            r.service_id,
            status,
            qpn,
            qkey,
            private_data,
        );
        Ok(())
    }

    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<Outgoing> {
        self.out.pop_front()
    }

    /// Whether [`Cm::poll_transmit`] or [`Cm::poll_event`] has something.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty() || !self.events.is_empty()
    }

    /// The next event for the consumer.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The earliest instant at which [`Cm::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// Runs the timers due at `now`, earliest first: retransmissions, given-up handshakes,
    /// TimeWait's end, SIDR requests retried or given up.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.changes += 1;
        for id in self.timers.take_due(now) {
            if self.conns.contains_key(&id) {
                self.conn_timeout(now, id);
            } else {
                self.sidr_timeout(now, id);
            }
        }
    }

    fn sidr_timeout(&mut self, now: Instant, id: u32) {
        let Some(s) = self.sidr_out.get_mut(&id) else { return };
        if s.retries_left == 0 {
            self.sidr_out.remove(&id);
            self.events.push_back(Event::SidrTimeout { id });
            return;
        }
        s.retries_left -= 1;
        let (to, bytes) = (s.remote, s.sent);
        self.out.push_back((to, bytes));
        self.counters.tx_mads += 1;
        self.counters.retransmits += 1;
        let wait = exp_time(self.config.response_timeout) + self.lifetime();
        self.timers.set(id, Some(now + wait));
    }

    fn conn_timeout(&mut self, now: Instant, id: CommId) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        let orphan = c.orphan;
        if c.state == ConnState::TimeWait {
            self.forget(id);
            self.event(orphan, Event::TimewaitExit { id });
            return;
        }
        if c.retries_left > 0 {
            c.retries_left -= 1;
            self.timers.set(id, Some(now + c.wait));
            if let Some(bytes) = c.sent {
                self.out.push_back((c.remote, bytes));
                self.counters.tx_mads += 1;
                self.counters.retransmits += 1;
            }
            return;
        }
        match c.state {
            ConnState::ReqSent | ConnState::MraReqRcvd => {
                self.forget(id);
                self.event(orphan, Event::Unreachable { id });
            }
            ConnState::RepSent => {
                self.retire(now, id);
                self.event(orphan, Event::Unreachable { id });
            }
            ConnState::DreqSent => {
                self.enter_timewait(now, id);
                self.event(orphan, Event::Disconnected { id });
            }
            // Every other state waits for nothing (its timer was taken as it came due).
            _ => {}
        }
    }

    fn enter_timewait(&mut self, now: Instant, id: CommId) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = ConnState::TimeWait;
            self.timers.set(id, Some(now + c.timewait));
            c.retries_left = 0;
        }
    }

    /// A passive connection that ended before it was established waits in TimeWait with no
    /// more events, so a duplicate of its REQ still in the network is not a new request.
    fn retire(&mut self, now: Instant, id: CommId) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.orphan = true;
            c.sent = None;
        }
        self.enter_timewait(now, id);
    }

    fn unpend(&mut self, service: u64) {
        if let Some(l) = self.listeners.get_mut(&service) {
            l.pending = l.pending.saturating_sub(1);
        }
    }

    #[allow(clippy::too_many_arguments, reason = "the REJ's fields")]
    fn send_rej(
        &mut self,
        to: IpAddr,
        tid: u64,
        local: CommId,
        remote: CommId,
        message: MsgRef,
        why: u16,
        private_data: &[u8],
    ) {
        let rej = Rej {
            local_comm_id: local,
            remote_comm_id: remote,
            message,
            reject_info_len: 0,
            reason: why,
            ari: &[],
            private_data,
        };
        self.send(to, CmMad { tid, message: Message::Rej(rej) });
    }

    #[allow(clippy::too_many_arguments, reason = "the SIDR_REP's fields")]
    fn send_sidr_rep(
        &mut self,
        to: IpAddr,
        tid: u64,
        request_id: u32,
        service_id: u64,
        status: u8,
        qpn: Qpn,
        qkey: QKey,
        private_data: &[u8],
    ) {
        let rep = SidrRep {
            request_id,
            status,
            additional_info_len: 0,
            qpn,
            service_id,
            qkey,
            class_port_info: &[],
            private_data,
        };
        self.send(to, CmMad { tid, message: Message::SidrRep(rep) });
    }

    fn send_drep(&mut self, id: CommId, now: Instant) {
        let Some(c) = self.conns.get(&id) else { return };
        self.answered_at = Some(now);
        let (remote, remote_id, tid) = (c.remote, c.remote_id, c.tid);
        let drep = Ids { local_comm_id: id, remote_comm_id: remote_id, private_data: &[] };
        let sent = self.send(remote, CmMad { tid, message: Message::Drep(drep) });
        if let Some(c) = self.conns.get_mut(&id) {
            c.sent = sent;
        }
        self.enter_timewait(now, id);
    }

    /// Takes in a MAD received on QP1 from `from`. Nothing here panics on any input; a MAD not
    /// acted on is counted.
    pub fn handle_mad(&mut self, now: Instant, from: IpAddr, mad: &[u8]) {
        self.changes += 1;
        self.counters.rx_mads += 1;
        let parsed = match CmMad::parse(mad) {
            Ok(p) => p,
            Err(uroce_wire::Error::UnsupportedCmMessage(_)) => {
                self.counters.drop_unsupported += 1;
                return;
            }
            Err(_) => {
                self.counters.drop_malformed += 1;
                return;
            }
        };
        let tid = parsed.tid;
        match parsed.message {
            Message::Req(r) => self.on_req(from, tid, &r),
            Message::SidrReq(s) => self.on_sidr_req(from, tid, &s),
            Message::SidrRep(s) => self.on_sidr_rep(from, &s),
            m => {
                let Some(rid) = m.receiver_id() else { return };
                let known = self.conns.get(&rid).is_some_and(|c| c.remote == from);
                if !known {
                    if let Message::Dreq(d) = m {
                        // IBA 12.9.8.6: a DREQ for a connection not (or no longer) here is
                        // answered, so the peer stops sending it.
                        let drep = Ids {
                            local_comm_id: d.remote_comm_id,
                            remote_comm_id: d.local_comm_id,
                            private_data: &[],
                        };
                        self.send(from, CmMad { tid, message: Message::Drep(drep) });
                        self.answered_at = Some(now);
                    }
                    self.counters.drop_unknown_id += 1;
                    return;
                }
                self.on_conn_message(now, rid, tid, &m);
            }
        }
    }

    fn on_req(&mut self, from: IpAddr, tid: u64, r: &Req<'_>) {
        if let Some(&id) = self.by_remote.get(&(from, r.local_comm_id)) {
            self.counters.dup_req += 1;
            self.on_dup_req(id);
            return;
        }
        // IBA 12.9.8.3.1: a REQ naming a QP already in a live connection with us is stale.
        let qp = (from, r.local_qpn);
        let stale = self
            .by_qp
            .range((qp.0, qp.1, CommId::MIN)..=(qp.0, qp.1, CommId::MAX))
            .filter_map(|&(_, _, id)| self.conns.get(&id))
            .any(|c| matches!(c.state, ConnState::Established | ConnState::RepSent));
        if stale {
            self.counters.stale += 1;
            self.send_rej(from, tid, 0, r.local_comm_id, MsgRef::Req, reason::STALE_CONN, &[]);
            return;
        }
        let Some(l) = self.listeners.get_mut(&r.service_id) else {
            self.counters.no_listener += 1;
            self.send_rej(
                from,
                tid,
                0,
                r.local_comm_id,
                MsgRef::Req,
                reason::INVALID_SERVICE_ID,
                &[],
            );
            return;
        };
        if l.pending >= l.backlog || self.conns.len() >= self.config.max_connections {
            self.counters.backlog_full += 1;
            self.send_rej(from, tid, 0, r.local_comm_id, MsgRef::Req, reason::NO_RESOURCES, &[]);
            return;
        }
        if self.remote_full(from, false) {
            self.counters.remote_full += 1;
            self.send_rej(from, tid, 0, r.local_comm_id, MsgRef::Req, reason::NO_RESOURCES, &[]);
            return;
        }
        if let Some(l) = self.listeners.get_mut(&r.service_id) {
            l.pending += 1;
        }
        let id = self.alloc_id();
        let wait = exp_time(r.local_cm_response_timeout) + self.lifetime();
        self.hold(
            id,
            Conn {
                remote: from,
                remote_id: r.local_comm_id,
                state: ConnState::ReqRcvd,
                tid,
                service_id: r.service_id,
                passive: true,
                remote_qpn: r.local_qpn,
                sent: None,
                wait,
                retries_left: r.max_cm_retries,
                timewait: exp_time(r.primary.local_ack_timeout.saturating_add(1))
                    .min(Duration::from_secs(2)),
                orphan: false,
            },
        );
        let info = RequestInfo {
            service_id: r.service_id,
            remote_qpn: r.local_qpn,
            starting_psn: r.starting_psn,
            transport: r.transport,
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            path_mtu: r.path_mtu,
            retry_count: r.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            srq: r.srq,
            local_ack_timeout: r.primary.local_ack_timeout,
            primary: r.primary,
            private_data: r.private_data.to_vec(),
        };
        self.events.push_back(Event::Request { id, from, info });
    }

    /// IBA 12.9.8.3.2: a REQ again while the consumer has not answered asks for patience
    /// (MRA); after the REP, the REP again.
    fn on_dup_req(&mut self, id: CommId) {
        let Some(c) = self.conns.get(&id) else { return };
        let (remote, remote_id, tid, state, sent) = (c.remote, c.remote_id, c.tid, c.state, c.sent);
        match state {
            ConnState::ReqRcvd | ConnState::MraReqSent => {
                let mra = Mra {
                    local_comm_id: id,
                    remote_comm_id: remote_id,
                    message: MsgRef::Req,
                    service_timeout: self.config.response_timeout,
                    private_data: &[],
                };
                self.send(remote, CmMad { tid, message: Message::Mra(mra) });
                if let Some(c) = self.conns.get_mut(&id) {
                    c.state = ConnState::MraReqSent;
                }
            }
            ConnState::RepSent => {
                if let Some(bytes) = sent {
                    self.out.push_back((remote, bytes));
                    self.counters.tx_mads += 1;
                }
            }
            _ => {}
        }
    }

    fn on_conn_message(&mut self, now: Instant, id: CommId, tid: u64, m: &Message<'_>) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        let orphan = c.orphan;
        // A message from the peer's end must name it (once known).
        let peer = match m {
            Message::Rep(r) => r.local_comm_id,
            Message::Mra(x) => x.local_comm_id,
            Message::Rej(x) => x.local_comm_id,
            Message::Rtu(x) | Message::Drep(x) => x.local_comm_id,
            Message::Dreq(x) => x.local_comm_id,
            _ => 0,
        };
        // Before the REP the active side does not know the peer's ID (an MRA or REJ of the REQ
        // tells it; a REJ may carry none).
        if c.remote_id != 0 && peer != 0 && c.remote_id != peer {
            self.counters.drop_unknown_id += 1;
            return;
        }
        match (m, c.state) {
            (Message::Mra(x), ConnState::ReqSent | ConnState::MraReqRcvd)
                if x.message == MsgRef::Req =>
            {
                c.state = ConnState::MraReqRcvd;
                let l = exp_time(self.config.packet_lifetime);
                self.timers.set(id, Some(now + exp_time(x.service_timeout) + l + l));
            }
            (Message::Mra(x), ConnState::RepSent) if x.message == MsgRef::Rep => {
                let l = exp_time(self.config.packet_lifetime);
                self.timers.set(id, Some(now + exp_time(x.service_timeout) + l + l));
            }
            (Message::Rej(x), ConnState::ReqSent | ConnState::MraReqRcvd | ConnState::RepSent) => {
                let passive = c.passive;
                let e =
                    Event::Rejected { id, reason: x.reason, private_data: x.private_data.to_vec() };
                if passive {
                    self.retire(now, id);
                } else {
                    self.forget(id);
                }
                self.event(orphan, e);
            }
            (Message::Rep(r), ConnState::ReqSent | ConnState::MraReqRcvd) => {
                c.remote_id = r.local_comm_id;
                c.remote_qpn = r.local_qpn;
                c.state = ConnState::RepRcvd;
                c.sent = None;
                self.by_qp.insert((c.remote, r.local_qpn, id));
                self.timers.set(id, None);
                let info = ReplyInfo {
                    remote_qpn: r.local_qpn,
                    starting_psn: r.starting_psn,
                    responder_resources: r.responder_resources,
                    initiator_depth: r.initiator_depth,
                    rnr_retry_count: r.rnr_retry_count,
                    srq: r.srq,
                    private_data: r.private_data.to_vec(),
                };
                self.event(orphan, Event::Reply { id, info });
            }
            (Message::Rep(_), ConnState::Established) => {
                // Our RTU was lost (IBA 12.9.8.3.3): send it again.
                if let Some(bytes) = c.sent {
                    self.out.push_back((c.remote, bytes));
                    self.counters.tx_mads += 1;
                }
            }
            (Message::Rep(_), ConnState::RepRcvd) => {}
            (Message::Rtu(_), ConnState::RepSent) => {
                c.state = ConnState::Established;
                self.timers.set(id, None);
                self.event(orphan, Event::Established { id });
            }
            (Message::Rtu(_), ConnState::Established) => {}
            (Message::Dreq(_), ConnState::Established | ConnState::RepSent) => {
                // The DREP answers this DREQ: it carries its transaction ID (IBA 12.6.11).
                c.tid = tid;
                // A DREQ overtaking the RTU says the active side is established: so are we.
                let overtook = c.state == ConnState::RepSent;
                c.state = ConnState::DreqRcvd;
                self.timers.set(id, None);
                if overtook {
                    self.event(orphan, Event::Established { id });
                }
                let private_data = match m {
                    Message::Dreq(d) => d.private_data.to_vec(),
                    _ => Vec::new(),
                };
                if orphan {
                    self.send_drep(id, now);
                } else {
                    self.events.push_back(Event::DisconnectRequest { id, private_data });
                }
            }
            (Message::Dreq(_), ConnState::DreqSent) => {
                // Both ends released at once: answer, and ours is done too.
                c.tid = tid;
                self.send_drep(id, now);
                self.event(orphan, Event::Disconnected { id });
            }
            (Message::Dreq(_), ConnState::TimeWait) => {
                // A duplicate DREQ (our DREP was lost) gets the answer we sent again. But when
                // what we sent last is our own DREQ (both ends released at once and timed
                // out), it gets a DREP for it, as ib_cm's cm_dreq_handler does in TimeWait:
                // two ends answering each other's DREQ with their own never stop.
                let own_dreq = c
                    .sent
                    .as_ref()
                    .and_then(|b| CmMad::parse(b).ok())
                    .is_some_and(|m| matches!(m.message, Message::Dreq(_)));
                let (remote, remote_id, sent) = (c.remote, c.remote_id, c.sent);
                self.answered_at = Some(now);
                if own_dreq {
                    let drep =
                        Ids { local_comm_id: id, remote_comm_id: remote_id, private_data: &[] };
                    self.send(remote, CmMad { tid, message: Message::Drep(drep) });
                } else if let Some(bytes) = sent {
                    self.out.push_back((remote, bytes));
                    self.counters.tx_mads += 1;
                }
            }
            (Message::Dreq(_), ConnState::DreqRcvd) => {}
            (Message::Drep(_), ConnState::DreqSent) => {
                self.enter_timewait(now, id);
                self.event(orphan, Event::Disconnected { id });
            }
            (Message::Drep(_), ConnState::TimeWait) => {}
            _ => self.counters.drop_wrong_state += 1,
        }
    }

    fn on_sidr_req(&mut self, from: IpAddr, tid: u64, s: &SidrReq<'_>) {
        if self.sidr_in_by_remote.contains_key(&(from, s.request_id)) {
            self.counters.dup_req += 1;
            return;
        }
        // IBA 12.11.2, table 118: the SIDR_REP's status says why no QP is named.
        let refusal = if !self.listeners.contains_key(&s.service_id) {
            self.counters.no_listener += 1;
            Some(sidr_status::UNSUPPORTED_SERVICE)
        } else if self.sidr_in.len() >= MAX_SIDR {
            self.counters.backlog_full += 1;
            Some(sidr_status::NO_QP)
        } else if self.remote_full(from, true) {
            self.counters.remote_full += 1;
            Some(sidr_status::NO_QP)
        } else {
            None
        };
        if let Some(status) = refusal {
            let (id, service, none) = (s.request_id, s.service_id, Qpn::from_masked(0));
            self.send_sidr_rep(from, tid, id, service, status, none, QKey(0), &[]);
            return;
        }
        let id = self.alloc_id();
        self.sidr_in.insert(
            id,
            SidrIn { remote: from, request_id: s.request_id, service_id: s.service_id, tid },
        );
        self.sidr_in_by_remote.insert((from, s.request_id), id);
        self.load.entry(from).or_default().sidr_in += 1;
        self.events.push_back(Event::SidrRequest {
            id,
            from,
            service_id: s.service_id,
            private_data: s.private_data.to_vec(),
        });
    }

    fn on_sidr_rep(&mut self, from: IpAddr, s: &SidrRep<'_>) {
        if self.sidr_out.get(&s.request_id).is_none_or(|o| o.remote != from) {
            self.counters.drop_unknown_id += 1;
            return;
        }
        self.sidr_out.remove(&s.request_id);
        self.timers.set(s.request_id, None);
        self.events.push_back(Event::SidrReply {
            id: s.request_id,
            status: s.status,
            qpn: s.qpn,
            qkey: s.qkey,
            private_data: s.private_data.to_vec(),
        });
    }
}

/// The RoCEv2 GID of an address (IPv4-mapped for IPv4).
pub fn gid(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The answer a host gives to a REQ or SIDR_REQ that no CM on it takes (a process that
/// received it but runs no CM of its own, with nobody listening): REJ "invalid service ID"
/// (IBA 12.6.7.2) or SIDR_REP "service not supported". `None` for every other MAD.
pub fn answer_unclaimed(mad: &[u8]) -> Option<[u8; MAD_LEN]> {
    let m = CmMad::parse(mad).ok()?;
    let message = match m.message {
        Message::Req(r) => Message::Rej(Rej {
            local_comm_id: 0,
            remote_comm_id: r.local_comm_id,
            message: MsgRef::Req,
            reject_info_len: 0,
            reason: reason::INVALID_SERVICE_ID,
            ari: &[],
            private_data: &[],
        }),
        Message::SidrReq(s) => Message::SidrRep(SidrRep {
            request_id: s.request_id,
            status: sidr_status::UNSUPPORTED_SERVICE,
            additional_info_len: 0,
            qpn: Qpn::from_masked(0),
            service_id: s.service_id,
            qkey: QKey(0),
            class_port_info: &[],
            private_data: &[],
        }),
        _ => return None,
    };
    CmMad { tid: m.tid, message }.to_bytes().ok()
}
#[cfg(test)]
mod size_tests {
    /// README's "Resource bounds" states what a connection costs; this keeps it true.
    #[test]
    fn a_connection_costs_what_the_readme_says() {
        assert!(
            size_of::<super::Conn>() <= 384,
            "{} bytes: update README",
            size_of::<super::Conn>()
        );
    }
}
