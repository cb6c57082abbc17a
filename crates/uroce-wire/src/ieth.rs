//! Invalidate extended transport header, 4 bytes (IBA 9.3.8): the R_Key that a SEND with
//! invalidate asks the responder to invalidate.

use core::fmt;

use crate::Result;
use crate::types::RKey;

/// Length of the IETH in bytes.
pub const HEADER_LEN: usize = 4;

/// Byte ranges of the IETH fields.
pub mod field {
    use crate::Field;
    /// Remote key to invalidate.
    pub const RKEY: Field = 0..4;
}

crate::header_view!("an invalidate extended transport header");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The R_Key to invalidate.
    pub fn rkey(&self) -> RKey {
        RKey(crate::be32(self.field(field::RKEY)))
    }
}

/// The IETH as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// The R_Key to invalidate.
    pub rkey: RKey,
}

impl Repr {
    /// Reads an IETH.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self { rkey: packet.rkey() })
    }
    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set(field::RKEY, u64::from(self.rkey.0));
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ieth(rkey={})", self.rkey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_emit_roundtrip() {
        let bytes = [0x00, 0x00, 0x12, 0x34];
        let repr = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr.rkey, RKey(0x1234));
        let mut out = [0u8; HEADER_LEN];
        repr.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }
}
