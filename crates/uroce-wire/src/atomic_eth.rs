//! Atomic extended transport header, 28 bytes (IBA 9.3.4): on COMPARE_SWAP and FETCH_ADD.
//!
//! ```text
//! bytes 0-7    virtual address (8-byte aligned)
//! bytes 8-11   R_Key
//! bytes 12-19  swap data (compare and swap) or add data (fetch and add)
//! bytes 20-27  compare data (compare and swap only)
//! ```

use core::fmt;

use crate::Result;
use crate::types::RKey;

/// Length of the AtomicETH in bytes.
pub const HEADER_LEN: usize = 28;

/// Byte ranges of the AtomicETH fields.
pub mod field {
    use crate::Field;
    /// Virtual address.
    pub const VA: Field = 0..8;
    /// Remote key.
    pub const RKEY: Field = 8..12;
    /// Swap or add operand.
    pub const SWAP_ADD: Field = 12..20;
    /// Compare operand.
    pub const COMPARE: Field = 20..28;
}

crate::header_view!("an atomic extended transport header");

impl<T: AsRef<[u8]>> Packet<T> {
    /// Remote virtual address.
    pub fn va(&self) -> u64 {
        crate::be64(self.field(field::VA))
    }
    /// Remote key.
    pub fn rkey(&self) -> RKey {
        RKey(crate::be32(self.field(field::RKEY)))
    }
    /// Swap (CAS) or add (FETCH_ADD) operand.
    pub fn swap_add(&self) -> u64 {
        crate::be64(self.field(field::SWAP_ADD))
    }
    /// Compare operand (CAS).
    pub fn compare(&self) -> u64 {
        crate::be64(self.field(field::COMPARE))
    }
}

/// The AtomicETH as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Remote virtual address; the responder requires 8-byte alignment.
    pub va: u64,
    /// Remote key.
    pub rkey: RKey,
    /// Swap (CAS) or add (FETCH_ADD) operand.
    pub swap_add: u64,
    /// Compare operand (CAS; zero for FETCH_ADD).
    pub compare: u64,
}

impl Repr {
    /// Reads an AtomicETH.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self {
            va: packet.va(),
            rkey: packet.rkey(),
            swap_add: packet.swap_add(),
            compare: packet.compare(),
        })
    }
    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set(field::VA, self.va);
        packet.set(field::RKEY, u64::from(self.rkey.0));
        packet.set(field::SWAP_ADD, self.swap_add);
        packet.set(field::COMPARE, self.compare);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "atomic(va={:#x} rkey={} swap_add={:#x} compare={:#x})",
            self.va, self.rkey, self.swap_add, self.compare
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_emit_roundtrip() {
        let repr = Repr { va: 0x1000_0008, rkey: RKey(0x1234), swap_add: 7, compare: u64::MAX };
        let mut out = [0u8; HEADER_LEN];
        repr.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(&out[..8], &[0, 0, 0, 0, 0x10, 0, 0, 0x08]);
        assert_eq!(&out[20..], &[0xff; 8]);
        assert_eq!(Repr::parse(&Packet::new_checked(&out[..]).unwrap()), Ok(repr));
        assert!(Packet::new_checked(&out[..27]).is_err());
    }
}
