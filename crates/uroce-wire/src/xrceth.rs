//! XRC extended transport header, 4 bytes (IBA Annex A14, "XRCETH"): on every XRC request,
//! right after the BTH; names the XRC shared receive queue at the target that the request
//! is for (its receive WQE, completion queue and protection domain).
//!
//! ```text
//! byte 0     reserved
//! bytes 1-3  XRC SRQ number
//! ```

use core::fmt;

use crate::Result;

/// Length of the XRCETH in bytes.
pub const HEADER_LEN: usize = 4;

/// Byte ranges of the XRCETH fields.
pub mod field {
    use crate::Field;
    /// Reserved byte.
    pub const RESERVED: usize = 0;
    /// The XRC SRQ number (24 bits).
    pub const SRQN: Field = 1..4;
}

crate::header_view!("an XRC extended transport header");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The XRC SRQ number.
    pub fn srqn(&self) -> u32 {
        crate::be24(self.field(field::SRQN))
    }
}

/// The XRCETH as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// The XRC SRQ number (24 bits; higher bits are not sent).
    pub srqn: u32,
}

impl Repr {
    /// Reads an XRCETH.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self { srqn: packet.srqn() })
    }
    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header, with the reserved byte zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.buffer.as_mut()[field::RESERVED] = 0;
        packet.set(field::SRQN, u64::from(self.srqn & 0x00FF_FFFF));
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "xrceth(srqn={:#x})", self.srqn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_emit_roundtrip() {
        let bytes = [0x00, 0x12, 0x34, 0x56];
        let repr = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr.srqn, 0x12_3456);
        let mut out = [0xFFu8; HEADER_LEN];
        repr.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        // The reserved byte is ignored on receipt and zero when sent.
        let odd = [0xAB, 0x00, 0x00, 0x01];
        assert_eq!(Repr::parse(&Packet::new_checked(&odd[..]).unwrap()).unwrap().srqn, 1);
        assert!(Packet::new_checked(&bytes[..3]).is_err());
    }
}
