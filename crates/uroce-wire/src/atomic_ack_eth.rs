//! Atomic acknowledge extended transport header, 8 bytes (IBA 9.3.6): the value the target
//! held before the atomic operation, on ATOMIC_ACKNOWLEDGE.

use core::fmt;

use crate::Result;

/// Length of the AtomicAckETH in bytes.
pub const HEADER_LEN: usize = 8;

/// Byte ranges of the AtomicAckETH fields.
pub mod field {
    use crate::Field;
    /// Original remote value.
    pub const ORIG: Field = 0..8;
}

crate::header_view!("an atomic acknowledge extended transport header");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The value at the target before the operation.
    pub fn orig(&self) -> u64 {
        crate::be64(self.field(field::ORIG))
    }
}

/// The AtomicAckETH as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// The value at the target before the operation.
    pub orig: u64,
}

impl Repr {
    /// Reads an AtomicAckETH.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self { orig: packet.orig() })
    }
    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set(field::ORIG, self.orig);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "atomic_ack(orig={:#x})", self.orig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_emit_roundtrip() {
        let bytes = [0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08];
        let repr = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr.orig, 0x0102_0304_0506_0708);
        let mut out = [0u8; HEADER_LEN];
        repr.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }
}
