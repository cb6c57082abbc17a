//! Errors of the wire format, one variant per rule a packet can break.

use core::fmt;

use crate::opcode::Opcode;

/// Why a packet could not be parsed or built.
///
/// Each variant names the rule broken, so a receiver can count its drops by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The buffer ends before a header or field that must be there.
    Truncated,
    /// The BTH transport header version (TVer) is not 0 (IBA 9.2, BTH).
    BadTver(u8),
    /// The opcode is not one this crate knows how to lay out (reserved, RD, XRC or vendor).
    UnknownOpcode(Opcode),
    /// The pad count in the BTH exceeds the payload, or pads a packet that carries no payload
    /// (IBA 9.2: PadCnt pads the payload to a multiple of 4 bytes).
    BadPadCount(u8),
    /// An opcode that carries no payload (ACK, READ request, atomics, CNP) came with some.
    UnexpectedPayload,
    /// The invariant CRC does not match the packet (IBA Annex A17.3.3).
    IcrcMismatch {
        /// What the packet carries.
        found: u32,
        /// What the bytes hash to.
        computed: u32,
    },
    /// The ICRC is right only for an IPv4 identification the receiver's policy says no sender of
    /// its peers uses ([`crate::icrc::Ipv4IdPolicy`]): more likely corruption than such a peer.
    IcrcUnexpectedIpId(u16),
    /// Building: the extension headers given do not match those the opcode requires.
    HeaderMismatch(Opcode),
    /// Building: the output buffer is shorter than the packet.
    BufferTooSmall,
    /// Building: a field holds a value outside its range (e.g. a pad count above 3).
    FieldOutOfRange,
    /// The IP header is not IPv4 or IPv6, or its lengths are inconsistent.
    BadIpHeader,
    /// The IP packet is not UDP (protocol/next header 17).
    NotUdp,
    /// The UDP length field disagrees with the bytes present.
    BadUdpLength,
    /// A MAD's `BaseVersion` is not 1 (IBA 13.4.3).
    BadMadVersion(u8),
    /// A MAD to the CM is of another management class or class version (IBA 12.6.1: class
    /// 0x07, version 2).
    NotCmMad {
        /// The MAD's management class.
        class: u8,
        /// Its class version.
        version: u8,
    },
    /// A CM MAD whose method is not `Send` or whose attribute is not a message the CM takes
    /// (ClassPortInfo, LAP and APR are not handled: RoCE has no alternate paths).
    UnsupportedCmMessage(u16),
    /// A packet to QP1 that is not a GMP: not a UD SEND from QP1 with the GSI's Q_Key
    /// (IBA 13.5.1).
    NotGmp,
    /// The RDMA CM private-data header has an unknown version or IP version.
    BadCmaHeader,
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = core::result::Result<T, Error>;

impl Error {
    /// A short stable name, suitable for a drop counter (`drop_truncated`, …).
    pub fn counter_name(&self) -> &'static str {
        match self {
            Self::Truncated => "truncated",
            Self::BadTver(_) => "bad_tver",
            Self::UnknownOpcode(_) => "unknown_opcode",
            Self::BadPadCount(_) => "bad_pad_count",
            Self::UnexpectedPayload => "unexpected_payload",
            Self::IcrcMismatch { .. } => "icrc_mismatch",
            Self::IcrcUnexpectedIpId(_) => "icrc_unexpected_ip_id",
            Self::HeaderMismatch(_) => "header_mismatch",
            Self::BufferTooSmall => "buffer_too_small",
            Self::FieldOutOfRange => "field_out_of_range",
            Self::BadMadVersion(_) => "bad_mad_version",
            Self::NotCmMad { .. } => "not_cm_mad",
            Self::UnsupportedCmMessage(_) => "unsupported_cm_message",
            Self::BadCmaHeader => "bad_cma_header",
            Self::NotGmp => "not_gmp",
            Self::BadIpHeader => "bad_ip_header",
            Self::NotUdp => "not_udp",
            Self::BadUdpLength => "bad_udp_length",
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated => f.write_str("truncated: the packet ends inside a header"),
            Self::BadTver(v) => write!(f, "BTH transport version is {v}, must be 0"),
            Self::UnknownOpcode(op) => write!(f, "unknown opcode {op}"),
            Self::BadPadCount(n) => write!(f, "pad count {n} does not fit the payload"),
            Self::UnexpectedPayload => f.write_str("payload on an opcode that carries none"),
            Self::IcrcMismatch { found, computed } => {
                write!(f, "ICRC mismatch: packet has {found:#010x}, bytes give {computed:#010x}")
            }
            Self::IcrcUnexpectedIpId(id) => write!(
                f,
                "ICRC right only for IPv4 identification {id}, which the receiver's policy refuses"
            ),
            Self::HeaderMismatch(op) => {
                write!(f, "extension headers do not match those opcode {op} requires")
            }
            Self::BufferTooSmall => f.write_str("output buffer too small for the packet"),
            Self::FieldOutOfRange => f.write_str("a field value is outside its range"),
            Self::BadIpHeader => f.write_str("not a valid IPv4 or IPv6 header"),
            Self::NotUdp => f.write_str("IP packet does not carry UDP"),
            Self::BadUdpLength => f.write_str("UDP length disagrees with the datagram"),
            Self::BadMadVersion(v) => write!(f, "MAD base version is {v}, must be 1"),
            Self::NotCmMad { class, version } => write!(
                f,
                "MAD class {class:#04x} version {version} is not the CM's (class 0x07, version 2)"
            ),
            Self::UnsupportedCmMessage(a) => {
                write!(f, "CM attribute {a:#06x} (or its method) is not a message the CM takes")
            }
            Self::NotGmp => {
                f.write_str("a packet to QP1 that is not a UD SEND from QP1 with Q_Key 0x80010000")
            }
            Self::BadCmaHeader => f.write_str("RDMA CM private-data header version is unknown"),
        }
    }
}

impl std::error::Error for Error {}
