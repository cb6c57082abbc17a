//! RDMA extended transport header, 16 bytes (IBA 9.3.3): on RDMA WRITE FIRST/ONLY and READ
//! requests, naming the remote buffer.
//!
//! ```text
//! bytes 0-7    virtual address
//! bytes 8-11   R_Key
//! bytes 12-15  DMA length (of the whole message)
//! ```

use core::fmt;

use crate::Result;
use crate::types::RKey;

/// Length of the RETH in bytes.
pub const HEADER_LEN: usize = 16;

/// Byte ranges of the RETH fields.
pub mod field {
    use crate::Field;
    /// Virtual address.
    pub const VA: Field = 0..8;
    /// Remote key.
    pub const RKEY: Field = 8..12;
    /// DMA length.
    pub const DMA_LEN: Field = 12..16;
}

crate::header_view!("an RDMA extended transport header");

impl<T: AsRef<[u8]>> Packet<T> {
    /// Remote virtual address.
    pub fn va(&self) -> u64 {
        crate::be64(self.field(field::VA))
    }
    /// Remote key.
    pub fn rkey(&self) -> RKey {
        RKey(crate::be32(self.field(field::RKEY)))
    }
    /// Length of the whole message in bytes.
    pub fn dma_len(&self) -> u32 {
        crate::be32(self.field(field::DMA_LEN))
    }
}

/// The RETH as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: RKey,
    /// Length of the whole message in bytes.
    pub dma_len: u32,
}

impl Repr {
    /// Reads a RETH.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self { va: packet.va(), rkey: packet.rkey(), dma_len: packet.dma_len() })
    }
    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set(field::VA, self.va);
        packet.set(field::RKEY, u64::from(self.rkey.0));
        packet.set(field::DMA_LEN, u64::from(self.dma_len));
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reth(va={:#x} rkey={} len={})", self.va, self.rkey, self.dma_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BYTES: [u8; 16] = [
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x78, 0x00, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x01, 0x00,
        0x00,
    ];

    #[test]
    fn parse_emit_roundtrip() {
        let repr = Repr::parse(&Packet::new_checked(&BYTES[..]).unwrap()).unwrap();
        assert_eq!(repr, Repr { va: 0x7f12_3456_7800, rkey: RKey(0xdead_beef), dma_len: 65536 });
        let mut out = [0u8; HEADER_LEN];
        repr.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, BYTES);
        assert!(Packet::new_checked(&BYTES[..15]).is_err());
    }
}
