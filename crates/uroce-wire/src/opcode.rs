//! The opcode table: what every RC, UC, UD, XRC and CNP opcode means and which headers follow
//! it.
//!
//! One `const` table indexed by the opcode byte (as Linux rxe's `rxe_opcode.c`), built from
//! IBA 9.2 table "OpCode field", the XRC opcodes of IBA Annex A14 and the CNP of IBA Annex
//! A17.9.3. An opcode outside the table
//! stays representable as an [`Opcode`] and prints as hex; only its layout is unknown.

use core::fmt;
use core::ops::{BitOr, BitOrAssign};

use crate::bth;

/// The BTH opcode byte. Any of the 256 values is representable; [`Opcode::info`] says what
/// the known ones mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

/// The transport service an opcode belongs to: the top three bits of the opcode (IBA 9.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable connection, `000xxxxx`.
    Rc,
    /// Unreliable connection, `001xxxxx`.
    Uc,
    /// Reliable datagram, `010xxxxx` (not implemented by uroce or RoCE hardware).
    Rd,
    /// Unreliable datagram, `011xxxxx`.
    Ud,
    /// Congestion notification packet, `100xxxxx` (RoCEv2 uses 0x81 only).
    Cnp,
    /// Extended reliable connection, `101xxxxx`.
    Xrc,
    /// Manufacturer specific, `11xxxxxx`.
    Vendor,
}

impl Transport {
    /// The short upper-case name used in packet displays.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Rc => "RC",
            Self::Uc => "UC",
            Self::Rd => "RD",
            Self::Ud => "UD",
            Self::Cnp => "CNP",
            Self::Xrc => "XRC",
            Self::Vendor => "VENDOR",
        }
    }
}

/// An extension header that may follow the BTH (IBA 9.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtHeader {
    /// RDMA extended transport header, 16 bytes (IBA 9.3.3).
    Reth,
    /// ACK extended transport header, 4 bytes (IBA 9.3.5).
    Aeth,
    /// Atomic extended transport header, 28 bytes (IBA 9.3.4).
    AtomicEth,
    /// Atomic acknowledge extended transport header, 8 bytes (IBA 9.3.6).
    AtomicAckEth,
    /// Immediate data, 4 bytes (IBA 9.3.7).
    ImmDt,
    /// Invalidate extended transport header, 4 bytes (IBA 9.3.8).
    Ieth,
    /// Datagram extended transport header, 8 bytes (IBA 9.3.2).
    Deth,
    /// XRC extended transport header, 4 bytes: first after the BTH of every XRC request
    /// (IBA Annex A14).
    Xrceth,
    /// The 16 reserved bytes that follow the BTH of a RoCEv2 CNP (IBA Annex A17.9.3).
    CnpReserved,
}

impl ExtHeader {
    /// The header's length in bytes.
    pub const fn wire_len(self) -> usize {
        match self {
            Self::Reth => crate::reth::HEADER_LEN,
            Self::Aeth => crate::aeth::HEADER_LEN,
            Self::AtomicEth => crate::atomic_eth::HEADER_LEN,
            Self::AtomicAckEth => crate::atomic_ack_eth::HEADER_LEN,
            Self::ImmDt => crate::immdt::HEADER_LEN,
            Self::Ieth => crate::ieth::HEADER_LEN,
            Self::Deth => crate::deth::HEADER_LEN,
            Self::Xrceth => crate::xrceth::HEADER_LEN,
            Self::CnpReserved => CNP_RESERVED_LEN,
        }
    }
}

/// Length of the reserved block after a CNP's BTH.
pub const CNP_RESERVED_LEN: usize = 16;

/// What role an opcode plays: a set of flags in the spirit of rxe's `RXE_*_MASK`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct OpFlags(u16);

impl OpFlags {
    /// No flags.
    pub const NONE: Self = Self(0);
    /// A request, sent by the requester to the responder.
    pub const REQUEST: Self = Self(1 << 0);
    /// A response (ACK, atomic ACK or RDMA READ response), sent by the responder.
    pub const RESPONSE: Self = Self(1 << 1);
    /// The first packet of a message (with `LAST`: the only one).
    pub const FIRST: Self = Self(1 << 2);
    /// A middle packet of a message.
    pub const MIDDLE: Self = Self(1 << 3);
    /// The last packet of a message (with `FIRST`: the only one).
    pub const LAST: Self = Self(1 << 4);
    /// Carries payload bytes (possibly zero for an ONLY packet).
    pub const PAYLOAD: Self = Self(1 << 5);
    /// Carries immediate data.
    pub const IMMEDIATE: Self = Self(1 << 6);
    /// Carries an R_Key to invalidate.
    pub const INVALIDATE: Self = Self(1 << 7);
    /// Consumes a receive WQE at the responder.
    pub const RECV_WQE: Self = Self(1 << 8);
    /// Part of a SEND.
    pub const SEND: Self = Self(1 << 9);
    /// Part of an RDMA WRITE.
    pub const WRITE: Self = Self(1 << 10);
    /// An RDMA READ request or response.
    pub const READ: Self = Self(1 << 11);
    /// An atomic request or atomic acknowledge.
    pub const ATOMIC: Self = Self(1 << 12);
    /// A request that the responder must answer once the message is complete: an ACK for a
    /// SEND or WRITE (possibly coalesced), the response for a READ or atomic (RC only).
    pub const NEEDS_ACK: Self = Self(1 << 13);
    /// Completes a message at the responder (the last packet of a SEND or of a WRITE with
    /// immediate), generating a receive completion.
    pub const COMPLETES_RECV: Self = Self(1 << 14);
    /// An RDMA ATOMIC WRITE (IBA 1.5): 8 bytes stored at once at an aligned remote address.
    pub const ATOMIC_WRITE: Self = Self(1 << 15);

    /// Whether every flag in `other` is set in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// The raw bits.
    pub const fn bits(self) -> u16 {
        self.0
    }

    const fn or(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

impl BitOr for OpFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.or(rhs)
    }
}

impl BitOrAssign for OpFlags {
    fn bitor_assign(&mut self, rhs: Self) {
        *self = self.or(rhs);
    }
}

/// Everything the table knows about one opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// The operation name without the transport, as in IBA and rdma-core (`SEND_FIRST`).
    pub name: &'static str,
    /// The transport service.
    pub transport: Transport,
    /// The role flags.
    pub flags: OpFlags,
    /// The extension headers that follow the BTH, in wire order.
    pub headers: &'static [ExtHeader],
    /// BTH plus extension headers, in bytes.
    pub header_len: usize,
}

impl OpcodeInfo {
    /// Whether `flag` (one or more flags) is set.
    pub const fn has(&self, flag: OpFlags) -> bool {
        self.flags.contains(flag)
    }

    /// Byte offset of `header` from the start of the BTH, if the opcode carries it.
    pub fn offset_of(&self, header: ExtHeader) -> Option<usize> {
        let mut offset = bth::HEADER_LEN;
        for &h in self.headers {
            if h == header {
                return Some(offset);
            }
            offset += h.wire_len();
        }
        None
    }
}

/// Operations within a transport: the low five bits of the opcode (IBA 9.2).
pub mod op {
    #![allow(missing_docs, reason = "names are the IBA opcode names, documented by the table")]
    pub const SEND_FIRST: u8 = 0x00;
    pub const SEND_MIDDLE: u8 = 0x01;
    pub const SEND_LAST: u8 = 0x02;
    pub const SEND_LAST_WITH_IMMEDIATE: u8 = 0x03;
    pub const SEND_ONLY: u8 = 0x04;
    pub const SEND_ONLY_WITH_IMMEDIATE: u8 = 0x05;
    pub const RDMA_WRITE_FIRST: u8 = 0x06;
    pub const RDMA_WRITE_MIDDLE: u8 = 0x07;
    pub const RDMA_WRITE_LAST: u8 = 0x08;
    pub const RDMA_WRITE_LAST_WITH_IMMEDIATE: u8 = 0x09;
    pub const RDMA_WRITE_ONLY: u8 = 0x0A;
    pub const RDMA_WRITE_ONLY_WITH_IMMEDIATE: u8 = 0x0B;
    pub const RDMA_READ_REQUEST: u8 = 0x0C;
    pub const RDMA_READ_RESPONSE_FIRST: u8 = 0x0D;
    pub const RDMA_READ_RESPONSE_MIDDLE: u8 = 0x0E;
    pub const RDMA_READ_RESPONSE_LAST: u8 = 0x0F;
    pub const RDMA_READ_RESPONSE_ONLY: u8 = 0x10;
    pub const ACKNOWLEDGE: u8 = 0x11;
    pub const ATOMIC_ACKNOWLEDGE: u8 = 0x12;
    pub const COMPARE_SWAP: u8 = 0x13;
    pub const FETCH_ADD: u8 = 0x14;
    pub const SEND_LAST_WITH_INVALIDATE: u8 = 0x16;
    pub const SEND_ONLY_WITH_INVALIDATE: u8 = 0x17;
    pub const ATOMIC_WRITE: u8 = 0x1D;
}

/// Transport bases: the top three bits (IBA 9.2).
const RC: u8 = 0x00;
const UC: u8 = 0x20;
const UD: u8 = 0x60;
const XRC: u8 = 0xA0;

macro_rules! opcodes {
    ($($(#[$doc:meta])* $const_name:ident = $value:expr;)*) => {
        impl Opcode {
            $($(#[$doc])* pub const $const_name: Self = Self($value);)*
        }
    };
}

opcodes! {
    /// RC SEND first packet.
    RC_SEND_FIRST = RC | op::SEND_FIRST;
    /// RC SEND middle packet.
    RC_SEND_MIDDLE = RC | op::SEND_MIDDLE;
    /// RC SEND last packet.
    RC_SEND_LAST = RC | op::SEND_LAST;
    /// RC SEND last packet with immediate data.
    RC_SEND_LAST_WITH_IMMEDIATE = RC | op::SEND_LAST_WITH_IMMEDIATE;
    /// RC SEND in one packet.
    RC_SEND_ONLY = RC | op::SEND_ONLY;
    /// RC SEND in one packet with immediate data.
    RC_SEND_ONLY_WITH_IMMEDIATE = RC | op::SEND_ONLY_WITH_IMMEDIATE;
    /// RC RDMA WRITE first packet.
    RC_RDMA_WRITE_FIRST = RC | op::RDMA_WRITE_FIRST;
    /// RC RDMA WRITE middle packet.
    RC_RDMA_WRITE_MIDDLE = RC | op::RDMA_WRITE_MIDDLE;
    /// RC RDMA WRITE last packet.
    RC_RDMA_WRITE_LAST = RC | op::RDMA_WRITE_LAST;
    /// RC RDMA WRITE last packet with immediate data.
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = RC | op::RDMA_WRITE_LAST_WITH_IMMEDIATE;
    /// RC RDMA WRITE in one packet.
    RC_RDMA_WRITE_ONLY = RC | op::RDMA_WRITE_ONLY;
    /// RC RDMA WRITE in one packet with immediate data.
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = RC | op::RDMA_WRITE_ONLY_WITH_IMMEDIATE;
    /// RC RDMA READ request.
    RC_RDMA_READ_REQUEST = RC | op::RDMA_READ_REQUEST;
    /// RC RDMA READ response, first packet.
    RC_RDMA_READ_RESPONSE_FIRST = RC | op::RDMA_READ_RESPONSE_FIRST;
    /// RC RDMA READ response, middle packet.
    RC_RDMA_READ_RESPONSE_MIDDLE = RC | op::RDMA_READ_RESPONSE_MIDDLE;
    /// RC RDMA READ response, last packet.
    RC_RDMA_READ_RESPONSE_LAST = RC | op::RDMA_READ_RESPONSE_LAST;
    /// RC RDMA READ response in one packet.
    RC_RDMA_READ_RESPONSE_ONLY = RC | op::RDMA_READ_RESPONSE_ONLY;
    /// RC acknowledge (ACK, RNR NAK or NAK, by the AETH syndrome).
    RC_ACKNOWLEDGE = RC | op::ACKNOWLEDGE;
    /// RC atomic acknowledge.
    RC_ATOMIC_ACKNOWLEDGE = RC | op::ATOMIC_ACKNOWLEDGE;
    /// RC atomic compare and swap.
    RC_COMPARE_SWAP = RC | op::COMPARE_SWAP;
    /// RC atomic fetch and add.
    RC_FETCH_ADD = RC | op::FETCH_ADD;
    /// RC SEND last packet with invalidate.
    RC_SEND_LAST_WITH_INVALIDATE = RC | op::SEND_LAST_WITH_INVALIDATE;
    /// RC SEND in one packet with invalidate.
    RC_SEND_ONLY_WITH_INVALIDATE = RC | op::SEND_ONLY_WITH_INVALIDATE;
    /// RC RDMA ATOMIC WRITE (IBA 1.5; rxe's `IB_OPCODE_RC_ATOMIC_WRITE`).
    RC_ATOMIC_WRITE = RC | op::ATOMIC_WRITE;
    /// UC SEND first packet.
    UC_SEND_FIRST = UC | op::SEND_FIRST;
    /// UC SEND middle packet.
    UC_SEND_MIDDLE = UC | op::SEND_MIDDLE;
    /// UC SEND last packet.
    UC_SEND_LAST = UC | op::SEND_LAST;
    /// UC SEND last packet with immediate data.
    UC_SEND_LAST_WITH_IMMEDIATE = UC | op::SEND_LAST_WITH_IMMEDIATE;
    /// UC SEND in one packet.
    UC_SEND_ONLY = UC | op::SEND_ONLY;
    /// UC SEND in one packet with immediate data.
    UC_SEND_ONLY_WITH_IMMEDIATE = UC | op::SEND_ONLY_WITH_IMMEDIATE;
    /// UC RDMA WRITE first packet.
    UC_RDMA_WRITE_FIRST = UC | op::RDMA_WRITE_FIRST;
    /// UC RDMA WRITE middle packet.
    UC_RDMA_WRITE_MIDDLE = UC | op::RDMA_WRITE_MIDDLE;
    /// UC RDMA WRITE last packet.
    UC_RDMA_WRITE_LAST = UC | op::RDMA_WRITE_LAST;
    /// UC RDMA WRITE last packet with immediate data.
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = UC | op::RDMA_WRITE_LAST_WITH_IMMEDIATE;
    /// UC RDMA WRITE in one packet.
    UC_RDMA_WRITE_ONLY = UC | op::RDMA_WRITE_ONLY;
    /// UC RDMA WRITE in one packet with immediate data.
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = UC | op::RDMA_WRITE_ONLY_WITH_IMMEDIATE;
    /// UD SEND (always one packet).
    UD_SEND_ONLY = UD | op::SEND_ONLY;
    /// UD SEND with immediate data.
    UD_SEND_ONLY_WITH_IMMEDIATE = UD | op::SEND_ONLY_WITH_IMMEDIATE;
    /// XRC SEND in one packet.
    XRC_SEND_ONLY = XRC | op::SEND_ONLY;
    /// XRC RDMA WRITE in one packet.
    XRC_RDMA_WRITE_ONLY = XRC | op::RDMA_WRITE_ONLY;
    /// XRC RDMA READ request.
    XRC_RDMA_READ_REQUEST = XRC | op::RDMA_READ_REQUEST;
    /// XRC acknowledge.
    XRC_ACKNOWLEDGE = XRC | op::ACKNOWLEDGE;
    /// XRC atomic fetch and add.
    XRC_FETCH_ADD = XRC | op::FETCH_ADD;
    /// RoCEv2 congestion notification packet (IBA Annex A17.9.3).
    CNP = 0x81;
}

impl Opcode {
    /// The table entry, or `None` for an opcode this crate does not lay out.
    pub const fn info(self) -> Option<&'static OpcodeInfo> {
        TABLE[self.0 as usize].as_ref()
    }

    /// The transport named by the top bits, known opcode or not.
    pub const fn transport(self) -> Transport {
        match self.0 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            4 => Transport::Cnp,
            5 => Transport::Xrc,
            _ => Transport::Vendor,
        }
    }

    /// RC's opcode for the same operation (the low five bits, IBA 9.2): RC and XRC share
    /// every operation and its rules, so one comparison serves both.
    pub const fn as_rc(self) -> Self {
        Self(self.0 & 0x1F)
    }

    /// Whether the table has this opcode.
    pub const fn is_known(self) -> bool {
        self.info().is_some()
    }

    /// Every opcode the table knows, in numeric order.
    pub fn all_known() -> impl Iterator<Item = Self> {
        (0..=u8::MAX).map(Self).filter(|op| op.is_known())
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.info() {
            Some(info) if info.transport == Transport::Cnp => f.write_str("CNP"),
            Some(info) => write!(f, "{}_{}", info.transport.name(), info.name),
            None => write!(f, "UNKNOWN({:#04x})", self.0),
        }
    }
}

const fn headers_len(headers: &[ExtHeader]) -> usize {
    let mut len = bth::HEADER_LEN;
    let mut i = 0;
    while i < headers.len() {
        len += headers[i].wire_len();
        i += 1;
    }
    len
}

const fn entry(
    name: &'static str,
    transport: Transport,
    flags: OpFlags,
    headers: &'static [ExtHeader],
) -> Option<OpcodeInfo> {
    Some(OpcodeInfo { name, transport, flags, headers, header_len: headers_len(headers) })
}

use ExtHeader::{Aeth, AtomicAckEth, AtomicEth, CnpReserved, Deth, Ieth, ImmDt, Reth, Xrceth};

const REQ: OpFlags = OpFlags::REQUEST;
const RESP: OpFlags = OpFlags::RESPONSE;
const FIRST: OpFlags = OpFlags::FIRST;
const MIDDLE: OpFlags = OpFlags::MIDDLE;
const LAST: OpFlags = OpFlags::LAST;
const ONLY: OpFlags = FIRST.or(LAST);
const PAYLOAD: OpFlags = OpFlags::PAYLOAD;
const IMM: OpFlags = OpFlags::IMMEDIATE;
const INV: OpFlags = OpFlags::INVALIDATE;
const RWQE: OpFlags = OpFlags::RECV_WQE;
const SEND: OpFlags = OpFlags::SEND;
const WRITE: OpFlags = OpFlags::WRITE;
const READ: OpFlags = OpFlags::READ;
const ATOMIC: OpFlags = OpFlags::ATOMIC;
const ACK: OpFlags = OpFlags::NEEDS_ACK;
const COMP: OpFlags = OpFlags::COMPLETES_RECV;

/// Flag sets shared by the SEND and WRITE operations of RC and UC.
const fn f(flags: &[OpFlags]) -> OpFlags {
    let mut acc = OpFlags::NONE;
    let mut i = 0;
    while i < flags.len() {
        acc = acc.or(flags[i]);
        i += 1;
    }
    acc
}

/// The extension headers of each request kind of a connected transport: RC and UC carry
/// none before their own, XRC puts the XRCETH first (IBA Annex A14).
struct RequestHeaders {
    none: &'static [ExtHeader],
    imm: &'static [ExtHeader],
    reth: &'static [ExtHeader],
    reth_imm: &'static [ExtHeader],
    inv: &'static [ExtHeader],
    atomic: &'static [ExtHeader],
}

const PLAIN: RequestHeaders = RequestHeaders {
    none: &[],
    imm: &[ImmDt],
    reth: &[Reth],
    reth_imm: &[Reth, ImmDt],
    inv: &[Ieth],
    atomic: &[AtomicEth],
};

const WITH_XRCETH: RequestHeaders = RequestHeaders {
    none: &[Xrceth],
    imm: &[Xrceth, ImmDt],
    reth: &[Xrceth, Reth],
    reth_imm: &[Xrceth, Reth, ImmDt],
    inv: &[Xrceth, Ieth],
    atomic: &[Xrceth, AtomicEth],
};

/// Fills the SEND and RDMA WRITE entries (0x00..=0x0B) of a connected transport. RC and XRC
/// add `NEEDS_ACK` to the packets that end a message; UC never acknowledges.
const fn connected_send_write(
    table: &mut [Option<OpcodeInfo>; 256],
    base: u8,
    transport: Transport,
    ack: OpFlags,
    h: &RequestHeaders,
) {
    let b = base as usize;
    let send = f(&[REQ, SEND, PAYLOAD]);
    let write = f(&[REQ, WRITE, PAYLOAD]);
    table[b + op::SEND_FIRST as usize] =
        entry("SEND_FIRST", transport, f(&[send, FIRST, RWQE]), h.none);
    table[b + op::SEND_MIDDLE as usize] =
        entry("SEND_MIDDLE", transport, f(&[send, MIDDLE]), h.none);
    table[b + op::SEND_LAST as usize] =
        entry("SEND_LAST", transport, f(&[send, LAST, COMP, ack]), h.none);
    table[b + op::SEND_LAST_WITH_IMMEDIATE as usize] =
        entry("SEND_LAST_WITH_IMMEDIATE", transport, f(&[send, LAST, IMM, COMP, ack]), h.imm);
    table[b + op::SEND_ONLY as usize] =
        entry("SEND_ONLY", transport, f(&[send, ONLY, RWQE, COMP, ack]), h.none);
    table[b + op::SEND_ONLY_WITH_IMMEDIATE as usize] =
        entry("SEND_ONLY_WITH_IMMEDIATE", transport, f(&[send, ONLY, IMM, RWQE, COMP, ack]), h.imm);
    table[b + op::RDMA_WRITE_FIRST as usize] =
        entry("RDMA_WRITE_FIRST", transport, f(&[write, FIRST]), h.reth);
    table[b + op::RDMA_WRITE_MIDDLE as usize] =
        entry("RDMA_WRITE_MIDDLE", transport, f(&[write, MIDDLE]), h.none);
    table[b + op::RDMA_WRITE_LAST as usize] =
        entry("RDMA_WRITE_LAST", transport, f(&[write, LAST, ack]), h.none);
    // WRITE with immediate consumes a receive WQE and completes it (IBA 9.4).
    table[b + op::RDMA_WRITE_LAST_WITH_IMMEDIATE as usize] = entry(
        "RDMA_WRITE_LAST_WITH_IMMEDIATE",
        transport,
        f(&[write, LAST, IMM, RWQE, COMP, ack]),
        h.imm,
    );
    table[b + op::RDMA_WRITE_ONLY as usize] =
        entry("RDMA_WRITE_ONLY", transport, f(&[write, ONLY, ack]), h.reth);
    table[b + op::RDMA_WRITE_ONLY_WITH_IMMEDIATE as usize] = entry(
        "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        transport,
        f(&[write, ONLY, IMM, RWQE, COMP, ack]),
        h.reth_imm,
    );
}

/// Fills READ, the responses, the atomics and SEND with invalidate (0x0C..=0x17) of a
/// reliable transport: RC, or XRC whose requests carry the XRCETH and whose responses
/// are RC's (IBA Annex A14).
const fn reliable_rest(
    t: &mut [Option<OpcodeInfo>; 256],
    base: u8,
    rc: Transport,
    h: &RequestHeaders,
) {
    let b = base as usize;
    let read_resp = f(&[RESP, READ, PAYLOAD]);
    t[b + op::RDMA_READ_REQUEST as usize] =
        entry("RDMA_READ_REQUEST", rc, f(&[REQ, READ, ONLY, ACK]), h.reth);
    t[b + op::RDMA_READ_RESPONSE_FIRST as usize] =
        entry("RDMA_READ_RESPONSE_FIRST", rc, f(&[read_resp, FIRST]), &[Aeth]);
    t[b + op::RDMA_READ_RESPONSE_MIDDLE as usize] =
        entry("RDMA_READ_RESPONSE_MIDDLE", rc, f(&[read_resp, MIDDLE]), &[]);
    t[b + op::RDMA_READ_RESPONSE_LAST as usize] =
        entry("RDMA_READ_RESPONSE_LAST", rc, f(&[read_resp, LAST]), &[Aeth]);
    t[b + op::RDMA_READ_RESPONSE_ONLY as usize] =
        entry("RDMA_READ_RESPONSE_ONLY", rc, f(&[read_resp, ONLY]), &[Aeth]);
    t[b + op::ACKNOWLEDGE as usize] = entry("ACKNOWLEDGE", rc, f(&[RESP, ONLY]), &[Aeth]);
    t[b + op::ATOMIC_ACKNOWLEDGE as usize] =
        entry("ATOMIC_ACKNOWLEDGE", rc, f(&[RESP, ATOMIC, ONLY]), &[Aeth, AtomicAckEth]);
    t[b + op::COMPARE_SWAP as usize] =
        entry("COMPARE_SWAP", rc, f(&[REQ, ATOMIC, ONLY, ACK]), h.atomic);
    t[b + op::FETCH_ADD as usize] = entry("FETCH_ADD", rc, f(&[REQ, ATOMIC, ONLY, ACK]), h.atomic);
    t[b + op::SEND_LAST_WITH_INVALIDATE as usize] = entry(
        "SEND_LAST_WITH_INVALIDATE",
        rc,
        f(&[REQ, SEND, PAYLOAD, LAST, INV, COMP, ACK]),
        h.inv,
    );
    t[b + op::SEND_ONLY_WITH_INVALIDATE as usize] = entry(
        "SEND_ONLY_WITH_INVALIDATE",
        rc,
        f(&[REQ, SEND, PAYLOAD, ONLY, INV, RWQE, COMP, ACK]),
        h.inv,
    );
}

/// The table itself, indexed by the opcode byte.
static TABLE: [Option<OpcodeInfo>; 256] = {
    let mut t: [Option<OpcodeInfo>; 256] = [None; 256];
    connected_send_write(&mut t, RC, Transport::Rc, ACK, &PLAIN);
    connected_send_write(&mut t, UC, Transport::Uc, OpFlags::NONE, &PLAIN);
    connected_send_write(&mut t, XRC, Transport::Xrc, ACK, &WITH_XRCETH);
    reliable_rest(&mut t, RC, Transport::Rc, &PLAIN);
    reliable_rest(&mut t, XRC, Transport::Xrc, &WITH_XRCETH);

    // IBA 1.5's RDMA ATOMIC WRITE: a RETH and 8 bytes of payload, answered by an ACK; RC
    // only, as rxe and ConnectX-7 offer it.
    t[RC as usize + op::ATOMIC_WRITE as usize] = entry(
        "ATOMIC_WRITE",
        Transport::Rc,
        f(&[REQ, OpFlags::ATOMIC_WRITE, PAYLOAD, ONLY, ACK]),
        &[Reth],
    );

    let ud = Transport::Ud;
    let ud_send = f(&[REQ, SEND, PAYLOAD, ONLY, RWQE, COMP]);
    t[(UD | op::SEND_ONLY) as usize] = entry("SEND_ONLY", ud, ud_send, &[Deth]);
    t[(UD | op::SEND_ONLY_WITH_IMMEDIATE) as usize] =
        entry("SEND_ONLY_WITH_IMMEDIATE", ud, f(&[ud_send, IMM]), &[Deth, ImmDt]);

    t[0x81] = entry("CNP", Transport::Cnp, OpFlags::NONE, &[CnpReserved]);
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_every_opcode_of_roce_notes() {
        let rc: Vec<u8> = (0x00..=0x14).chain([0x16, 0x17, 0x1D]).collect();
        let uc: Vec<u8> = (0x20..=0x2B).collect();
        let xrc: Vec<u8> = (0xA0..=0xB4).chain([0xB6, 0xB7]).collect();
        let expected: Vec<u8> =
            rc.into_iter().chain(uc).chain([0x64, 0x65, 0x81]).chain(xrc).collect();
        let known: Vec<u8> = Opcode::all_known().map(|op| op.0).collect();
        assert_eq!(known, expected);
    }

    #[test]
    fn header_offsets_add_up_to_header_len() {
        for op in Opcode::all_known() {
            let info = op.info().unwrap();
            let mut offset = bth::HEADER_LEN;
            for &h in info.headers {
                assert_eq!(info.offset_of(h), Some(offset), "{op}");
                offset += h.wire_len();
            }
            assert_eq!(offset, info.header_len, "{op}");
            assert_eq!(info.transport, op.transport(), "{op}");
        }
    }

    #[test]
    fn roles_are_consistent() {
        for op in Opcode::all_known() {
            let info = op.info().unwrap();
            let req = info.has(OpFlags::REQUEST);
            let resp = info.has(OpFlags::RESPONSE);
            if info.transport != Transport::Cnp {
                assert!(req ^ resp, "{op}: request xor response");
                let pos = [OpFlags::FIRST, OpFlags::MIDDLE, OpFlags::LAST]
                    .iter()
                    .filter(|&&fl| info.has(fl))
                    .count();
                assert!(pos == 1 || (info.has(ONLY) && pos == 2), "{op}: position");
            }
            assert_eq!(info.has(IMM), info.headers.contains(&ImmDt), "{op}: immediate");
            assert_eq!(info.has(INV), info.headers.contains(&Ieth), "{op}: invalidate");
            // IBA Annex A14: every XRC request carries the XRCETH, first; responses do not.
            let xrc_request = info.transport == Transport::Xrc && info.has(REQ);
            assert_eq!(info.headers.first() == Some(&Xrceth), xrc_request, "{op}: XRCETH");
            assert_eq!(info.headers.contains(&Xrceth), xrc_request, "{op}: XRCETH");
            if info.transport == Transport::Xrc {
                // The same operation as RC's, offset by the transport base.
                let rc = op.as_rc().info().unwrap();
                assert_eq!((rc.name, rc.flags), (info.name, info.flags), "{op}");
            }
            if info.has(OpFlags::NEEDS_ACK) {
                assert!(
                    matches!(info.transport, Transport::Rc | Transport::Xrc),
                    "{op}: only RC and XRC acknowledge"
                );
                assert!(info.has(LAST), "{op}: the ACK follows the last packet");
            }
            if info.has(RWQE) {
                // A SEND takes its receive WQE at its first packet; a WRITE with immediate
                // takes one only where the immediate arrives (IBA 9.4).
                assert!(
                    info.has(FIRST) || info.has(WRITE | IMM),
                    "{op}: where a receive WQE is consumed"
                );
            }
        }
    }

    #[test]
    fn named_constants_match_table() {
        assert_eq!(Opcode::RC_SEND_ONLY.to_string(), "RC_SEND_ONLY");
        assert_eq!(Opcode::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.0, 0x2B);
        assert_eq!(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.to_string(), "UD_SEND_ONLY_WITH_IMMEDIATE");
        assert_eq!(Opcode::CNP.to_string(), "CNP");
        assert_eq!(Opcode(0x15).to_string(), "UNKNOWN(0x15)");
        assert_eq!(Opcode(0x15).transport(), Transport::Rc);
        assert_eq!(Opcode(0xC3).transport(), Transport::Vendor);
        assert_eq!(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.info().unwrap().header_len, 32);
        assert_eq!(Opcode::RC_COMPARE_SWAP.info().unwrap().header_len, 40);
        assert_eq!(Opcode::RC_ATOMIC_ACKNOWLEDGE.info().unwrap().header_len, 24);
        assert_eq!(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.info().unwrap().header_len, 24);
        assert_eq!(Opcode::XRC_SEND_ONLY.0, 0xA4);
        assert_eq!(Opcode::XRC_SEND_ONLY.to_string(), "XRC_SEND_ONLY");
        assert_eq!(Opcode::XRC_RDMA_WRITE_ONLY.info().unwrap().header_len, 32);
        assert_eq!(Opcode::XRC_FETCH_ADD.info().unwrap().header_len, 44);
        assert_eq!(Opcode::XRC_ACKNOWLEDGE.info().unwrap().header_len, 16);
        assert_eq!(Opcode::XRC_RDMA_READ_REQUEST.info().unwrap().offset_of(Reth), Some(16));
    }
}
