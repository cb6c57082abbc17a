//! Immediate data, 4 bytes (IBA 9.3.7): opaque to the transport, delivered in the receive
//! completion. Kept in network byte order as `ibv_wc.imm_data` is.

use core::fmt;

use crate::Result;

/// Length of the ImmDt in bytes.
pub const HEADER_LEN: usize = 4;

crate::header_view!("an immediate data header");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The four bytes, as they are on the wire.
    pub fn imm(&self) -> [u8; 4] {
        let b = self.buffer.as_ref();
        [b[0], b[1], b[2], b[3]]
    }
}

/// The ImmDt as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Immediate data, in network byte order.
    pub imm: [u8; 4],
}

impl Repr {
    /// Reads an ImmDt.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self { imm: packet.imm() })
    }
    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.buffer.as_mut()[..HEADER_LEN].copy_from_slice(&self.imm);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "imm={:#010x}", u32::from_be_bytes(self.imm))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_emit_roundtrip() {
        let bytes = [0xca, 0xfe, 0xf0, 0x0d];
        let repr = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr.to_string(), "imm=0xcafef00d");
        let mut out = [0u8; HEADER_LEN];
        repr.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }
}
