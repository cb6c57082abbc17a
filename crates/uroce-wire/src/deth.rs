//! Datagram extended transport header, 8 bytes (IBA 9.3.2): on every UD packet.
//!
//! ```text
//! bytes 0-3  Q_Key
//! byte 4     reserved
//! bytes 5-7  source QP
//! ```

use core::fmt;

use crate::Result;
use crate::types::{QKey, Qpn};

/// Length of the DETH in bytes.
pub const HEADER_LEN: usize = 8;

/// Byte ranges of the DETH fields.
pub mod field {
    use crate::Field;
    /// Queue key.
    pub const QKEY: Field = 0..4;
    /// Reserved byte.
    pub const RESERVED: usize = 4;
    /// Source queue pair.
    pub const SRC_QP: Field = 5..8;
}

crate::header_view!("a datagram extended transport header");

impl<T: AsRef<[u8]>> Packet<T> {
    /// Queue key.
    pub fn qkey(&self) -> QKey {
        QKey(crate::be32(self.field(field::QKEY)))
    }
    /// Source queue pair.
    pub fn src_qp(&self) -> Qpn {
        Qpn::from_masked(crate::be24(self.field(field::SRC_QP)))
    }
}

/// The DETH as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Queue key.
    pub qkey: QKey,
    /// Source queue pair.
    pub src_qp: Qpn,
}

impl Repr {
    /// Reads a DETH.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self { qkey: packet.qkey(), src_qp: packet.src_qp() })
    }
    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header, with the reserved byte zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set(field::QKEY, u64::from(self.qkey.0));
        packet.buffer.as_mut()[field::RESERVED] = 0;
        packet.set(field::SRC_QP, u64::from(self.src_qp.get()));
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "deth(qkey={} sqp={})", self.qkey, self.src_qp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_emit_roundtrip() {
        let bytes = [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x11];
        let repr = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr, Repr { qkey: QKey(0x8001_0000), src_qp: Qpn::from_masked(0x11) });
        let mut out = [0xAAu8; HEADER_LEN];
        repr.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }
}
