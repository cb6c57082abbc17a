//! The RoCEv2 wire format: InfiniBand transport headers carried in UDP datagrams to port 4791.
//!
//! A RoCEv2 packet, as it sits in the UDP payload, is
//! `BTH ‖ extension headers ‖ payload ‖ pad ‖ ICRC` (IBA Annex A17, "RoCEv2"). This crate
//! holds everything needed to read and write that: one module per header, each with a
//! zero-copy view (`Packet<T: AsRef<[u8]>>`) and a validated representation (`Repr`) with
//! `parse`/`emit`, after smoltcp's `wire` module; the opcode table ([`opcode`]); the 24-bit
//! sequence and queue-pair numbers and the keys ([`types`]); the invariant CRC ([`icrc`]);
//! whole packets ([`packet`]); the IPv4/IPv6/UDP headers around them ([`ip`]); and pcap
//! files that Wireshark decodes ([`pcap`]).
//!
//! # Panic contract
//!
//! No function in this crate panics on any input bytes. Views are created with
//! `new_checked`, which verifies that the buffer holds the whole header; accessors on a view
//! made with `new_unchecked` over too short a buffer may panic, so only `new_checked` views
//! see untrusted bytes. `Repr::parse` never panics; `Repr::emit` writes into a buffer of at
//! least `Repr::buffer_len()` bytes and panics otherwise, which is a bug in the caller, never
//! a consequence of network input. The fuzz target in `fuzz/` holds this crate to it.
//!
//! # What is checked where
//!
//! Parsing a packet checks, in order: the length covers the BTH, the transport version
//! (TVer) is 0, the opcode is one this crate knows, the length covers the extension headers
//! the opcode implies plus the pad and ICRC, the pad count fits the payload, opcodes that
//! carry no payload have none, and the ICRC matches (IBA Annex A17.3.3). Each failure is a
//! distinct [`Error`] variant so that receivers can count drops by reason.
#![forbid(unsafe_code)]

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod cm;
pub mod cma;
pub mod deth;
mod error;
pub mod examples;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod ip;
pub mod mad;
pub mod opcode;
pub mod packet;
pub mod pcap;
pub mod reth;
pub mod steer_probe;
pub mod types;
pub mod xrceth;

pub use error::{Error, Result};
pub use opcode::{ExtHeader, OpFlags, Opcode, Transport};
pub use packet::{ExtHeaders, PacketRepr, ParsedPacket};
pub use types::{Msn, PKey, Psn, QKey, Qpn, RKey};

/// UDP destination port assigned to RoCEv2 (IANA; IBA Annex A17.2.1).
pub const ROCE_V2_PORT: u16 = 4791;

/// A byte range of a header field, as smoltcp's `wire::field`.
pub(crate) type Field = core::ops::Range<usize>;

/// Reads a big-endian `u16` from the first two bytes of `b`.
#[inline]
pub(crate) fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

/// Reads a big-endian 24-bit value from the first three bytes of `b`.
#[inline]
pub(crate) fn be24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}

/// Reads a big-endian `u32` from the first four bytes of `b`.
#[inline]
pub(crate) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Reads a big-endian `u64` from the first eight bytes of `b`.
#[inline]
pub(crate) fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// Writes the low `bytes.len()` bytes of `value` big-endian into `bytes`.
#[inline]
pub(crate) fn write_be(bytes: &mut [u8], value: u64) {
    let mut v = value;
    for b in bytes.iter_mut().rev() {
        *b = (v & 0xFF) as u8;
        v >>= 8;
    }
}

/// Defines a header's zero-copy view: `Packet<T>` with `new_unchecked`, `new_checked`,
/// `check_len`, `into_inner` and `as_bytes`, for a header of a fixed length `HEADER_LEN`.
macro_rules! header_view {
    ($what:literal) => {
        #[doc = concat!("A read/write view of ", $what, " at the start of a buffer.")]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct Packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> Packet<T> {
            /// Wraps a buffer without checking its length; accessors may panic if it is short.
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps a buffer after checking that it holds the whole header.
            pub fn new_checked(buffer: T) -> $crate::Result<Self> {
                let packet = Self::new_unchecked(buffer);
                packet.check_len()?;
                Ok(packet)
            }

            /// Checks that the buffer holds the whole header.
            pub fn check_len(&self) -> $crate::Result<()> {
                if self.buffer.as_ref().len() < HEADER_LEN {
                    Err($crate::Error::Truncated)
                } else {
                    Ok(())
                }
            }

            /// Returns the underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// The header's bytes.
            pub fn as_bytes(&self) -> &[u8] {
                &self.buffer.as_ref()[..HEADER_LEN]
            }

            #[allow(dead_code, reason = "not every header has a multi-byte field to read")]
            fn field(&self, field: $crate::Field) -> &[u8] {
                &self.buffer.as_ref()[field]
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            #[allow(dead_code, reason = "not every header has a multi-byte field to set")]
            fn set(&mut self, field: $crate::Field, value: u64) {
                $crate::write_be(&mut self.buffer.as_mut()[field], value);
            }
        }
    };
}
pub(crate) use header_view;
