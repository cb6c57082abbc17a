//! Communication management messages (IBA 12.6): the class data of CM MADs
//! ([`mad::class::CM`], class version 2, method `Send`), as Linux's `ib_cm` puts them on the
//! wire (`include/rdma/ibta_vol1_c12.h` names every field at the same place).
//!
//! Each message is 232 bytes after the MAD header; fields are big-endian, and a field of a few
//! bits is numbered from the byte's most significant bit, as the IBA draws them. Private data
//! is carried whole (its field's full length, zero-padded): the CM does not know how much of
//! it the application used; the RDMA CM's header ([`crate::cma`]) says so where it matters.

use core::fmt;

use crate::mad::{self, DATA_LEN, HEADER_LEN, MAD_LEN};
use crate::types::{Psn, QKey, Qpn};
use crate::{Error, Result, be16, be24, be32, be64, write_be};

/// The CM's class version (IBA 12.6.1).
pub const CLASS_VERSION: u8 = 2;

/// Attribute IDs of the CM messages (IBA 12.6.1, table 104).
pub mod attr {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// ConnectRequest.
    pub const REQ: u16 = 0x0010;
    /// MsgRcptAck.
    pub const MRA: u16 = 0x0011;
    /// ConnectReject.
    pub const REJ: u16 = 0x0012;
    /// ConnectReply.
    pub const REP: u16 = 0x0013;
    /// ReadyToUse.
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest.
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply.
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResReq.
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResReqResp.
    pub const SIDR_REP: u16 = 0x0018;
    /// LoadAlternatePath.
    pub const LAP: u16 = 0x0019;
    /// AlternatePathResponse.
    pub const APR: u16 = 0x001A;
}

/// Private data lengths (IBA 12.6, each message's layout).
pub mod private_len {
    /// REQ.
    pub const REQ: usize = 92;
    /// MRA.
    pub const MRA: usize = 222;
    /// REJ.
    pub const REJ: usize = 148;
    /// REP.
    pub const REP: usize = 196;
    /// RTU.
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
    /// SIDR_REQ.
    pub const SIDR_REQ: usize = 216;
    /// SIDR_REP.
    pub const SIDR_REP: usize = 136;
}

/// REJ reasons (IBA 12.6.7.2, table 112) that uroce sends or acts on.
pub mod reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// No resources available (uroce: the listener's backlog or the connection limit is full).
    pub const NO_RESOURCES: u16 = 3;
    /// Timeout: the sender waited too long for the message that should have followed.
    pub const TIMEOUT: u16 = 4;
    /// Stale connection: the QPN or comm ID is already in a connection (IBA 12.9.8.3).
    pub const STALE_CONN: u16 = 10;
    /// Invalid service ID: nobody listens on it.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Invalid transport service type: the listener's QP is not of the type the REQ asks for.
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    /// The passive side's consumer rejected the connection.
    pub const CONSUMER_REJECT: u16 = 28;
    /// Invalid communication ID: the message names a connection the receiver does not have.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Duplicate local comm ID.
    pub const DUPLICATE_LOCAL_COMM_ID: u16 = 30;
}

/// The transport service a REQ asks for (IBA 12.6.5, "Transport Service Type").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportType {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Reliable datagram.
    Rd,
    /// Extended (XRC; the "Extended Transport Type" field says which).
    Extended,
}

impl TransportType {
    const fn from_bits(b: u8) -> Self {
        match b & 3 {
            0 => Self::Rc,
            1 => Self::Uc,
            2 => Self::Rd,
            _ => Self::Extended,
        }
    }
    const fn bits(self) -> u8 {
        match self {
            Self::Rc => 0,
            Self::Uc => 1,
            Self::Rd => 2,
            Self::Extended => 3,
        }
    }
}

/// Which message a REJ or MRA refers to (IBA 12.6.6, 12.6.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgRef {
    /// The REQ.
    Req,
    /// The REP.
    Rep,
    /// Another message (a LAP, for MRA).
    Other,
}

impl MsgRef {
    const fn from_bits(b: u8) -> Self {
        match b & 3 {
            0 => Self::Req,
            1 => Self::Rep,
            _ => Self::Other,
        }
    }
    const fn bits(self) -> u8 {
        match self {
            Self::Req => 0,
            Self::Rep => 1,
            Self::Other => 2,
        }
    }
}

/// The path a REQ describes (IBA 12.6.5, "Primary/Alternate … " fields). On RoCE the LIDs
/// are the permissive LID 0xFFFF and the GIDs are the IP addresses (IPv4-mapped for IPv4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Path {
    /// Local port LID.
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: [u8; 16],
    /// Remote port GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits, IBA 9.11 encoding).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Whether the remote port is in the local subnet.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits: 4.096 µs × 2^t).
    pub local_ack_timeout: u8,
}

const PATH_LEN: usize = 44;

impl Path {
    fn parse(b: &[u8]) -> Self {
        Self {
            local_lid: be16(&b[0..2]),
            remote_lid: be16(&b[2..4]),
            local_gid: gid(&b[4..20]),
            remote_gid: gid(&b[20..36]),
            flow_label: be32(&b[36..40]) >> 12,
            packet_rate: bits(b[39], 2, 6),
            traffic_class: b[40],
            hop_limit: b[41],
            sl: bits(b[42], 0, 4),
            subnet_local: bits(b[42], 4, 1) == 1,
            local_ack_timeout: bits(b[43], 0, 5),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        write_be(&mut b[0..2], u64::from(self.local_lid));
        write_be(&mut b[2..4], u64::from(self.remote_lid));
        b[4..20].copy_from_slice(&self.local_gid);
        b[20..36].copy_from_slice(&self.remote_gid);
        write_be(&mut b[36..40], u64::from((self.flow_label & 0xF_FFFF) << 12));
        b[39] = put(0, 2, 6, self.packet_rate);
        b[40] = self.traffic_class;
        b[41] = self.hop_limit;
        b[42] = put(put(0, 0, 4, self.sl), 4, 1, u8::from(self.subnet_local));
        b[43] = put(0, 0, 5, self.local_ack_timeout);
    }

    /// Whether this path is present (an absent alternate path is all zeros).
    pub fn is_present(&self) -> bool {
        *self != Self::default()
    }
}

fn gid(b: &[u8]) -> [u8; 16] {
    let mut g = [0; 16];
    g.copy_from_slice(&b[..16]);
    g
}

/// Bits `start..start+n` of `byte`, bit 0 being the most significant (IBA's numbering).
const fn bits(byte: u8, start: u32, n: u32) -> u8 {
    (byte >> (8 - start - n)) & (u8::MAX >> (8 - n))
}

/// `byte` with bits `start..start+n` set to `value`'s low `n` bits.
const fn put(byte: u8, start: u32, n: u32, value: u8) -> u8 {
    let mask = (u8::MAX >> (8 - n)) << (8 - start - n);
    (byte & !mask) | ((value << (8 - start - n)) & mask)
}

/// Copies `data` into a private-data field, zero-padding it; too long is an error.
fn put_private(field: &mut [u8], data: &[u8]) -> Result<()> {
    if data.len() > field.len() {
        return Err(Error::FieldOutOfRange);
    }
    field[..data.len()].copy_from_slice(data);
    field[data.len()..].fill(0);
    Ok(())
}

/// ConnectRequest (IBA 12.6.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Req<'a> {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// Vendor ID (24 bits).
    pub vendor_id: u32,
    /// The service the connection is for (the RDMA CM's port space and port, [`crate::cma`]).
    pub service_id: u64,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// The sender QP's Q_Key (meaningful for RD).
    pub local_qkey: QKey,
    /// The sender's QP.
    pub local_qpn: Qpn,
    /// RDMA READ/atomic requests the sender accepts at once.
    pub responder_resources: u8,
    /// Local EE context (RD; 24 bits).
    pub local_eecn: u32,
    /// RDMA READ/atomic requests the sender issues at once.
    pub initiator_depth: u8,
    /// Remote EE context (RD; 24 bits).
    pub remote_eecn: u32,
    /// How long the passive side may take to answer (5 bits: 4.096 µs × 2^t).
    pub remote_cm_response_timeout: u8,
    /// Transport service.
    pub transport: TransportType,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// The first PSN the sender will send.
    pub starting_psn: Psn,
    /// How long the sender takes to answer (5 bits).
    pub local_cm_response_timeout: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU (4 bits, IBA encoding: 1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits; 7 is infinite).
    pub rnr_retry_count: u8,
    /// How many times the CM sends a message before giving up (4 bits).
    pub max_cm_retries: u8,
    /// The sender's QP has an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits).
    pub extended_transport: u8,
    /// The primary path.
    pub primary: Path,
    /// The alternate path (all zeros when there is none).
    pub alternate: Path,
    /// Private data (92 bytes on the wire).
    pub private_data: &'a [u8],
}

impl<'a> Req<'a> {
    fn parse(d: &'a [u8]) -> Self {
        Self {
            local_comm_id: be32(&d[0..4]),
            vendor_id: be24(&d[5..8]),
            service_id: be64(&d[8..16]),
            local_ca_guid: be64(&d[16..24]),
            local_qkey: QKey(be32(&d[28..32])),
            local_qpn: Qpn::from_masked(be24(&d[32..35])),
            responder_resources: d[35],
            local_eecn: be24(&d[36..39]),
            initiator_depth: d[39],
            remote_eecn: be24(&d[40..43]),
            remote_cm_response_timeout: bits(d[43], 0, 5),
            transport: TransportType::from_bits(bits(d[43], 5, 2)),
            end_to_end_flow_control: bits(d[43], 7, 1) == 1,
            starting_psn: Psn::from_masked(be24(&d[44..47])),
            local_cm_response_timeout: bits(d[47], 0, 5),
            retry_count: bits(d[47], 5, 3),
            pkey: be16(&d[48..50]),
            path_mtu: bits(d[50], 0, 4),
            rdc_exists: bits(d[50], 4, 1) == 1,
            rnr_retry_count: bits(d[50], 5, 3),
            max_cm_retries: bits(d[51], 0, 4),
            srq: bits(d[51], 4, 1) == 1,
            extended_transport: bits(d[51], 5, 3),
            primary: Path::parse(&d[52..52 + PATH_LEN]),
            alternate: Path::parse(&d[96..96 + PATH_LEN]),
            private_data: &d[140..232],
        }
    }

    fn emit(&self, d: &mut [u8]) -> Result<()> {
        write_be(&mut d[0..4], u64::from(self.local_comm_id));
        write_be(&mut d[4..8], u64::from(self.vendor_id & 0xFF_FFFF));
        write_be(&mut d[8..16], self.service_id);
        write_be(&mut d[16..24], self.local_ca_guid);
        write_be(&mut d[28..32], u64::from(self.local_qkey.0));
        write_be(&mut d[32..35], u64::from(self.local_qpn.get()));
        d[35] = self.responder_resources;
        write_be(&mut d[36..39], u64::from(self.local_eecn));
        d[39] = self.initiator_depth;
        write_be(&mut d[40..43], u64::from(self.remote_eecn));
        d[43] = put(
            put(put(0, 0, 5, self.remote_cm_response_timeout), 5, 2, self.transport.bits()),
            7,
            1,
            u8::from(self.end_to_end_flow_control),
        );
        write_be(&mut d[44..47], u64::from(self.starting_psn.get()));
        d[47] = put(put(0, 0, 5, self.local_cm_response_timeout), 5, 3, self.retry_count);
        write_be(&mut d[48..50], u64::from(self.pkey));
        d[50] = put(
            put(put(0, 0, 4, self.path_mtu), 4, 1, u8::from(self.rdc_exists)),
            5,
            3,
            self.rnr_retry_count,
        );
        d[51] = put(
            put(put(0, 0, 4, self.max_cm_retries), 4, 1, u8::from(self.srq)),
            5,
            3,
            self.extended_transport,
        );
        self.primary.emit(&mut d[52..52 + PATH_LEN]);
        self.alternate.emit(&mut d[96..96 + PATH_LEN]);
        put_private(&mut d[140..232], self.private_data)
    }
}

/// MsgRcptAck (IBA 12.6.6): "received; the answer will take longer".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mra<'a> {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The message acknowledged.
    pub message: MsgRef,
    /// How long the sender will take (5 bits: 4.096 µs × 2^t).
    pub service_timeout: u8,
    /// Private data (222 bytes on the wire).
    pub private_data: &'a [u8],
}

/// ConnectReject (IBA 12.6.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rej<'a> {
    /// The sender's communication ID (0 when it has none).
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The message rejected.
    pub message: MsgRef,
    /// Bytes of `ari` that are meaningful (7 bits).
    pub reject_info_len: u8,
    /// Why ([`reason`]).
    pub reason: u16,
    /// Additional rejection information (72 bytes).
    pub ari: &'a [u8],
    /// Private data (148 bytes on the wire).
    pub private_data: &'a [u8],
}

/// ConnectReply (IBA 12.6.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rep<'a> {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The sender QP's Q_Key.
    pub local_qkey: QKey,
    /// The sender's QP.
    pub local_qpn: Qpn,
    /// Local EE context (24 bits).
    pub local_eecn: u32,
    /// The first PSN the sender will send.
    pub starting_psn: Psn,
    /// RDMA READ/atomic requests the sender accepts at once.
    pub responder_resources: u8,
    /// RDMA READ/atomic requests the sender issues at once.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The sender's QP has an SRQ.
    pub srq: bool,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// Private data (196 bytes on the wire).
    pub private_data: &'a [u8],
}

/// ReadyToUse (IBA 12.6.9), DisconnectReply (12.6.11): comm IDs and private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids<'a> {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data (224 bytes on the wire).
    pub private_data: &'a [u8],
}

/// DisconnectRequest (IBA 12.6.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dreq<'a> {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QP (24 bits).
    pub remote_qpn: Qpn,
    /// Private data (220 bytes on the wire).
    pub private_data: &'a [u8],
}

/// ServiceIDResReq (IBA 12.11.1): resolve a service to a UD QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrReq<'a> {
    /// The requester's ID for this resolution.
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// The service.
    pub service_id: u64,
    /// Private data (216 bytes on the wire).
    pub private_data: &'a [u8],
}

/// SIDR_REP status values (IBA 12.11.2, table 118).
pub mod sidr_status {
    /// The QP is valid.
    pub const OK: u8 = 0;
    /// No such service.
    pub const UNSUPPORTED_SERVICE: u8 = 1;
    /// The service rejected the request.
    pub const REJECTED: u8 = 2;
    /// No QP available.
    pub const NO_QP: u8 = 3;
}

/// ServiceIDResReqResp (IBA 12.11.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrRep<'a> {
    /// The request this answers.
    pub request_id: u32,
    /// Status ([`sidr_status`]).
    pub status: u8,
    /// Bytes of `class_port_info` that are meaningful.
    pub additional_info_len: u8,
    /// The service's UD QP.
    pub qpn: Qpn,
    /// The service.
    pub service_id: u64,
    /// The QP's Q_Key.
    pub qkey: QKey,
    /// Redirection information (72 bytes).
    pub class_port_info: &'a [u8],
    /// Private data (136 bytes on the wire).
    pub private_data: &'a [u8],
}

/// One CM message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    /// REQ.
    Req(Req<'a>),
    /// MRA.
    Mra(Mra<'a>),
    /// REJ.
    Rej(Rej<'a>),
    /// REP.
    Rep(Rep<'a>),
    /// RTU.
    Rtu(Ids<'a>),
    /// DREQ.
    Dreq(Dreq<'a>),
    /// DREP.
    Drep(Ids<'a>),
    /// SIDR_REQ.
    SidrReq(SidrReq<'a>),
    /// SIDR_REP.
    SidrRep(SidrRep<'a>),
}

impl Message<'_> {
    /// The message's attribute ID.
    pub const fn attr_id(&self) -> u16 {
        match self {
            Self::Req(_) => attr::REQ,
            Self::Mra(_) => attr::MRA,
            Self::Rej(_) => attr::REJ,
            Self::Rep(_) => attr::REP,
            Self::Rtu(_) => attr::RTU,
            Self::Dreq(_) => attr::DREQ,
            Self::Drep(_) => attr::DREP,
            Self::SidrReq(_) => attr::SIDR_REQ,
            Self::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// The message's name as the IBA abbreviates it.
    pub const fn name(&self) -> &'static str {
        match self {
            Self::Req(_) => "REQ",
            Self::Mra(_) => "MRA",
            Self::Rej(_) => "REJ",
            Self::Rep(_) => "REP",
            Self::Rtu(_) => "RTU",
            Self::Dreq(_) => "DREQ",
            Self::Drep(_) => "DREP",
            Self::SidrReq(_) => "SIDR_REQ",
            Self::SidrRep(_) => "SIDR_REP",
        }
    }

    /// The receiver's communication ID (or SIDR request ID) where the message names one: what a
    /// host with many CM agents routes by. `None` for REQ and SIDR_REQ, which are routed by
    /// service ID, and for a REJ or MRA of a REQ when it carries none.
    pub const fn receiver_id(&self) -> Option<u32> {
        match self {
            Self::Req(_) | Self::SidrReq(_) => None,
            Self::Mra(m) => Some(m.remote_comm_id),
            Self::Rej(r) => Some(r.remote_comm_id),
            Self::Rep(r) => Some(r.remote_comm_id),
            Self::Rtu(i) | Self::Drep(i) => Some(i.remote_comm_id),
            Self::Dreq(d) => Some(d.remote_comm_id),
            Self::SidrRep(s) => Some(s.request_id),
        }
    }
}

/// A whole CM MAD: the transaction ID and the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmMad<'a> {
    /// Transaction ID (a REP and RTU carry their REQ's, a DREP its DREQ's).
    pub tid: u64,
    /// The message.
    pub message: Message<'a>,
}

impl<'a> CmMad<'a> {
    /// Reads a CM MAD (256 bytes). Another class, version or method, or an attribute the CM
    /// does not handle (ClassPortInfo, LAP, APR), is an error naming why.
    pub fn parse(mad: &'a [u8]) -> Result<Self> {
        let h = mad::Header::parse(mad)?;
        if h.mgmt_class != mad::class::CM || h.class_version != CLASS_VERSION {
            return Err(Error::NotCmMad { class: h.mgmt_class, version: h.class_version });
        }
        if h.method != mad::method::SEND {
            return Err(Error::UnsupportedCmMessage(h.attr_id));
        }
        let d = &mad[HEADER_LEN..];
        let message = match h.attr_id {
            attr::REQ => Message::Req(Req::parse(d)),
            attr::MRA => Message::Mra(Mra {
                local_comm_id: be32(&d[0..4]),
                remote_comm_id: be32(&d[4..8]),
                message: MsgRef::from_bits(bits(d[8], 0, 2)),
                service_timeout: bits(d[9], 0, 5),
                private_data: &d[10..],
            }),
            attr::REJ => Message::Rej(Rej {
                local_comm_id: be32(&d[0..4]),
                remote_comm_id: be32(&d[4..8]),
                message: MsgRef::from_bits(bits(d[8], 0, 2)),
                reject_info_len: bits(d[9], 0, 7),
                reason: be16(&d[10..12]),
                ari: &d[12..84],
                private_data: &d[84..],
            }),
            attr::REP => Message::Rep(Rep {
                local_comm_id: be32(&d[0..4]),
                remote_comm_id: be32(&d[4..8]),
                local_qkey: QKey(be32(&d[8..12])),
                local_qpn: Qpn::from_masked(be24(&d[12..15])),
                local_eecn: be24(&d[16..19]),
                starting_psn: Psn::from_masked(be24(&d[20..23])),
                responder_resources: d[24],
                initiator_depth: d[25],
                target_ack_delay: bits(d[26], 0, 5),
                failover_accepted: bits(d[26], 5, 2),
                end_to_end_flow_control: bits(d[26], 7, 1) == 1,
                rnr_retry_count: bits(d[27], 0, 3),
                srq: bits(d[27], 3, 1) == 1,
                local_ca_guid: be64(&d[28..36]),
                private_data: &d[36..],
            }),
            attr::RTU => Message::Rtu(ids(d)),
            attr::DREQ => Message::Dreq(Dreq {
                local_comm_id: be32(&d[0..4]),
                remote_comm_id: be32(&d[4..8]),
                remote_qpn: Qpn::from_masked(be24(&d[8..11])),
                private_data: &d[12..],
            }),
            attr::DREP => Message::Drep(ids(d)),
            attr::SIDR_REQ => Message::SidrReq(SidrReq {
                request_id: be32(&d[0..4]),
                pkey: be16(&d[4..6]),
                service_id: be64(&d[8..16]),
                private_data: &d[16..],
            }),
            attr::SIDR_REP => Message::SidrRep(SidrRep {
                request_id: be32(&d[0..4]),
                status: d[4],
                additional_info_len: d[5],
                qpn: Qpn::from_masked(be24(&d[8..11])),
                service_id: be64(&d[12..20]),
                qkey: QKey(be32(&d[20..24])),
                class_port_info: &d[24..96],
                private_data: &d[96..],
            }),
            other => return Err(Error::UnsupportedCmMessage(other)),
        };
        Ok(Self { tid: h.tid, message })
    }

    /// Writes the MAD: header, then the message with reserved fields zero and private data
    /// zero-padded. Private data longer than the message's field is an error.
    pub fn emit(&self, mad: &mut [u8; MAD_LEN]) -> Result<()> {
        mad::Header {
            mgmt_class: mad::class::CM,
            class_version: CLASS_VERSION,
            method: mad::method::SEND,
            status: 0,
            class_specific: 0,
            tid: self.tid,
            attr_id: self.message.attr_id(),
            attr_mod: 0,
        }
        .emit(mad);
        let d = &mut mad[HEADER_LEN..];
        d.fill(0);
        debug_assert_eq!(d.len(), DATA_LEN);
        match &self.message {
            Message::Req(r) => r.emit(d)?,
            Message::Mra(m) => {
                write_ids(d, m.local_comm_id, m.remote_comm_id);
                d[8] = put(0, 0, 2, m.message.bits());
                d[9] = put(0, 0, 5, m.service_timeout);
                put_private(&mut d[10..], m.private_data)?;
            }
            Message::Rej(r) => {
                write_ids(d, r.local_comm_id, r.remote_comm_id);
                d[8] = put(0, 0, 2, r.message.bits());
                d[9] = put(0, 0, 7, r.reject_info_len);
                write_be(&mut d[10..12], u64::from(r.reason));
                put_private(&mut d[12..84], r.ari)?;
                put_private(&mut d[84..], r.private_data)?;
            }
            Message::Rep(r) => {
                write_ids(d, r.local_comm_id, r.remote_comm_id);
                write_be(&mut d[8..12], u64::from(r.local_qkey.0));
                write_be(&mut d[12..15], u64::from(r.local_qpn.get()));
                write_be(&mut d[16..19], u64::from(r.local_eecn & 0xFF_FFFF));
                write_be(&mut d[20..23], u64::from(r.starting_psn.get()));
                d[24] = r.responder_resources;
                d[25] = r.initiator_depth;
                d[26] = put(
                    put(put(0, 0, 5, r.target_ack_delay), 5, 2, r.failover_accepted),
                    7,
                    1,
                    u8::from(r.end_to_end_flow_control),
                );
                d[27] = put(put(0, 0, 3, r.rnr_retry_count), 3, 1, u8::from(r.srq));
                write_be(&mut d[28..36], r.local_ca_guid);
                put_private(&mut d[36..], r.private_data)?;
            }
            Message::Rtu(i) | Message::Drep(i) => {
                write_ids(d, i.local_comm_id, i.remote_comm_id);
                put_private(&mut d[8..], i.private_data)?;
            }
            Message::Dreq(r) => {
                write_ids(d, r.local_comm_id, r.remote_comm_id);
                write_be(&mut d[8..11], u64::from(r.remote_qpn.get()));
                put_private(&mut d[12..], r.private_data)?;
            }
            Message::SidrReq(s) => {
                write_be(&mut d[0..4], u64::from(s.request_id));
                write_be(&mut d[4..6], u64::from(s.pkey));
                write_be(&mut d[8..16], s.service_id);
                put_private(&mut d[16..], s.private_data)?;
            }
            Message::SidrRep(s) => {
                write_be(&mut d[0..4], u64::from(s.request_id));
                d[4] = s.status;
                d[5] = s.additional_info_len;
                write_be(&mut d[8..11], u64::from(s.qpn.get()));
                write_be(&mut d[12..20], s.service_id);
                write_be(&mut d[20..24], u64::from(s.qkey.0));
                put_private(&mut d[24..96], s.class_port_info)?;
                put_private(&mut d[96..], s.private_data)?;
            }
        }
        Ok(())
    }

    /// The MAD's bytes.
    pub fn to_bytes(&self) -> Result<[u8; MAD_LEN]> {
        let mut mad = [0u8; MAD_LEN];
        self.emit(&mut mad)?;
        Ok(mad)
    }
}

fn ids(d: &[u8]) -> Ids<'_> {
    Ids { local_comm_id: be32(&d[0..4]), remote_comm_id: be32(&d[4..8]), private_data: &d[8..] }
}

fn write_ids(d: &mut [u8], local: u32, remote: u32) {
    write_be(&mut d[0..4], u64::from(local));
    write_be(&mut d[4..8], u64::from(remote));
}

/// The fields a person debugging a connection looks at, on one line.
impl fmt::Display for CmMad<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cm {} tid={:#x}", self.message.name(), self.tid)?;
        match &self.message {
            Message::Req(r) => write!(
                f,
                " lcid={:#010x} sid={:#018x} qpn={} psn={} {:?} mtu={} rr={} id={} \
                 retry={} rnr_retry={} max_cm_retries={} resp_timeout={}/{} ack_timeout={} \
                 srq={}",
                r.local_comm_id,
                r.service_id,
                r.local_qpn,
                r.starting_psn,
                r.transport,
                256u32 << r.path_mtu.saturating_sub(1).min(4),
                r.responder_resources,
                r.initiator_depth,
                r.retry_count,
                r.rnr_retry_count,
                r.max_cm_retries,
                r.local_cm_response_timeout,
                r.remote_cm_response_timeout,
                r.primary.local_ack_timeout,
                u8::from(r.srq),
            ),
            Message::Mra(m) => write!(
                f,
                " lcid={:#010x} rcid={:#010x} of={:?} service_timeout={}",
                m.local_comm_id, m.remote_comm_id, m.message, m.service_timeout
            ),
            Message::Rej(r) => write!(
                f,
                " lcid={:#010x} rcid={:#010x} of={:?} reason={}",
                r.local_comm_id, r.remote_comm_id, r.message, r.reason
            ),
            Message::Rep(r) => write!(
                f,
                " lcid={:#010x} rcid={:#010x} qpn={} psn={} rr={} id={} rnr_retry={} srq={}",
                r.local_comm_id,
                r.remote_comm_id,
                r.local_qpn,
                r.starting_psn,
                r.responder_resources,
                r.initiator_depth,
                r.rnr_retry_count,
                u8::from(r.srq),
            ),
            Message::Rtu(i) | Message::Drep(i) => {
                write!(f, " lcid={:#010x} rcid={:#010x}", i.local_comm_id, i.remote_comm_id)
            }
            Message::Dreq(d) => write!(
                f,
                " lcid={:#010x} rcid={:#010x} rqpn={}",
                d.local_comm_id, d.remote_comm_id, d.remote_qpn
            ),
            Message::SidrReq(s) => {
                write!(f, " req_id={:#010x} sid={:#018x}", s.request_id, s.service_id)
            }
            Message::SidrRep(s) => write!(
                f,
                " req_id={:#010x} status={} qpn={} qkey={:#x}",
                s.request_id, s.status, s.qpn, s.qkey.0
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    pub(crate) fn sample_req(private: &[u8]) -> Req<'_> {
        Req {
            local_comm_id: 0x1234_5678,
            vendor_id: 0,
            service_id: 0x0000_0000_0106_4e20,
            local_ca_guid: 0x0202_03ff_fe04_0506,
            local_qkey: QKey(0),
            local_qpn: Qpn::from_masked(0x01_0011),
            responder_resources: 4,
            local_eecn: 0,
            initiator_depth: 4,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport: TransportType::Rc,
            end_to_end_flow_control: true,
            starting_psn: Psn::from_masked(0xAB_CDEF),
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: 0xFFFF,
            path_mtu: 5,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            extended_transport: 0,
            primary: Path {
                local_lid: 0xFFFF,
                remote_lid: 0xFFFF,
                local_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 2],
                remote_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 3],
                flow_label: 0xABCDE,
                packet_rate: 0x3F,
                traffic_class: 0,
                hop_limit: 64,
                sl: 3,
                subnet_local: false,
                local_ack_timeout: 18,
            },
            alternate: Path::default(),
            private_data: private,
        }
    }

    #[test]
    fn req_fields_sit_where_the_iba_puts_them() {
        let mad =
            CmMad { tid: 7, message: Message::Req(sample_req(&[0xEE; 3])) }.to_bytes().unwrap();
        let d = &mad[HEADER_LEN..];
        assert_eq!(&mad[..4], &[1, 7, 2, 3]);
        assert_eq!(&mad[16..18], &[0, 0x10]);
        assert_eq!(&d[0..4], &[0x12, 0x34, 0x56, 0x78]);
        assert_eq!(&d[8..16], &[0, 0, 0, 0, 1, 6, 0x4e, 0x20]);
        assert_eq!(&d[32..36], &[0x01, 0x00, 0x11, 4]);
        // Remote response timeout 20 (10100), RC (00), flow control 1.
        assert_eq!(d[43], 0b1010_0001);
        assert_eq!(&d[44..48], &[0xAB, 0xCD, 0xEF, 0b1010_0111]);
        assert_eq!(d[50], 0b0101_0111); // MTU 5, no RDC, RNR retry 7
        assert_eq!(d[51], 0b1111_0000); // 15 CM retries, no SRQ
        assert_eq!(&d[88..92], &[0xAB, 0xCD, 0xE0, 0x3F]);
        assert_eq!(d[94], 0b0011_0000);
        assert_eq!(d[95], 18 << 3);
        assert_eq!(&d[140..144], &[0xEE, 0xEE, 0xEE, 0]);
        let back = CmMad::parse(&mad).unwrap();
        let Message::Req(r) = back.message else { panic!("not a REQ") };
        assert_eq!(r, Req { private_data: r.private_data, ..sample_req(&[]) });
        assert_eq!(&r.private_data[..4], &[0xEE, 0xEE, 0xEE, 0]);
        assert_eq!(r.private_data.len(), private_len::REQ);
    }

    #[test]
    fn every_message_roundtrips() {
        let ari = [0u8; 72];
        let cpi = [0u8; 72];
        let p = [9u8; 5];
        let msgs = [
            Message::Mra(Mra {
                local_comm_id: 1,
                remote_comm_id: 2,
                message: MsgRef::Rep,
                service_timeout: 21,
                private_data: &p,
            }),
            Message::Rej(Rej {
                local_comm_id: 1,
                remote_comm_id: 2,
                message: MsgRef::Req,
                reject_info_len: 0,
                reason: reason::CONSUMER_REJECT,
                ari: &ari,
                private_data: &p,
            }),
            Message::Rep(Rep {
                local_comm_id: 3,
                remote_comm_id: 4,
                local_qkey: QKey(0),
                local_qpn: Qpn::from_masked(0x20_0001),
                local_eecn: 0,
                starting_psn: Psn::from_masked(0x12_3456),
                responder_resources: 1,
                initiator_depth: 2,
                target_ack_delay: 15,
                failover_accepted: 3,
                end_to_end_flow_control: true,
                rnr_retry_count: 6,
                srq: true,
                local_ca_guid: 0xAA,
                private_data: &p,
            }),
            Message::Rtu(Ids { local_comm_id: 5, remote_comm_id: 6, private_data: &p }),
            Message::Dreq(Dreq {
                local_comm_id: 7,
                remote_comm_id: 8,
                remote_qpn: Qpn::from_masked(0x12),
                private_data: &p,
            }),
            Message::Drep(Ids { local_comm_id: 9, remote_comm_id: 10, private_data: &p }),
            Message::SidrReq(SidrReq {
                request_id: 11,
                pkey: 0xFFFF,
                service_id: 0x0111_0001,
                private_data: &p,
            }),
            Message::SidrRep(SidrRep {
                request_id: 12,
                status: sidr_status::OK,
                additional_info_len: 0,
                qpn: Qpn::from_masked(0x30_0004),
                service_id: 0x0111_0001,
                qkey: QKey(0x1234),
                class_port_info: &cpi,
                private_data: &p,
            }),
        ];
        for m in msgs {
            let bytes = CmMad { tid: 99, message: m }.to_bytes().unwrap();
            let back = CmMad::parse(&bytes).unwrap();
            assert_eq!(back.tid, 99);
            assert_eq!(back.message.attr_id(), m.attr_id());
            // Private data comes back padded to its field: compare the re-emitted bytes.
            assert_eq!(back.to_bytes().unwrap(), bytes, "{}", m.name());
        }
    }

    #[test]
    fn refusals_name_their_rule() {
        let mut mad = CmMad {
            tid: 1,
            message: Message::Rtu(Ids { local_comm_id: 1, remote_comm_id: 2, private_data: &[] }),
        }
        .to_bytes()
        .unwrap();
        mad[16..18].copy_from_slice(&attr::LAP.to_be_bytes());
        assert_eq!(CmMad::parse(&mad), Err(Error::UnsupportedCmMessage(attr::LAP)));
        mad[2] = 1;
        assert_eq!(CmMad::parse(&mad), Err(Error::NotCmMad { class: 7, version: 1 }));
        let long = [0u8; 93];
        let too_long = CmMad { tid: 1, message: Message::Req(sample_req(&long)) };
        assert_eq!(too_long.to_bytes(), Err(Error::FieldOutOfRange));
    }
}
