//! Management datagrams (IBA 13.4): the 256-byte payload of a UD packet to or from a QP's
//! general services interface (QP1, the GSI), starting with a 24-byte common header.
//!
//! ```text
//! byte 0      BaseVersion (1)
//! byte 1      MgmtClass
//! byte 2      ClassVersion
//! byte 3      R (1 bit) | Method (7 bits)
//! bytes 4-5   Status
//! bytes 6-7   ClassSpecific
//! bytes 8-15  TransactionID
//! bytes 16-17 AttributeID
//! bytes 18-19 reserved
//! bytes 20-23 AttributeModifier
//! bytes 24-255 class data
//! ```

use core::fmt;

use crate::packet::{ExtHeaders, PacketRepr};
use crate::types::{PKey, Psn, QKey, Qpn};
use crate::{Error, Opcode, Result, be16, be32, be64, bth, deth, write_be};

/// A MAD is exactly this long on a UD QP (IBA 13.4.2).
pub const MAD_LEN: usize = 256;
/// Length of the common MAD header.
pub const HEADER_LEN: usize = 24;
/// Bytes of class data after the header.
pub const DATA_LEN: usize = MAD_LEN - HEADER_LEN;
/// `BaseVersion` of every MAD this crate knows (IBA 13.4.3).
pub const BASE_VERSION: u8 = 1;
/// The Q_Key of QP1 (IBA 13.4.6.1, "GSI"): every GMP is sent with it, and QP1 takes no other.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The general services interface's QP number (IBA 13.4.6.1).
pub const GSI_QPN: u32 = 1;

/// Management classes (IBA 13.4.4, table 145) that appear here.
pub mod class {
    /// Communication management (IBA 12).
    pub const CM: u8 = 0x07;
}

/// MAD methods (IBA 13.4.5).
pub mod method {
    /// A datagram that asks for no response MAD (CM messages are all `Send`).
    pub const SEND: u8 = 0x03;
}

/// The common MAD header as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Management class.
    pub mgmt_class: u8,
    /// Version of the class's format.
    pub class_version: u8,
    /// Method, with the response bit (0x80).
    pub method: u8,
    /// Status (IBA 13.4.7); 0 in a request.
    pub status: u16,
    /// Class-specific field.
    pub class_specific: u16,
    /// Transaction identifier: pairs a response with its request.
    pub tid: u64,
    /// Which attribute (for the CM: which message) the data holds.
    pub attr_id: u16,
    /// Attribute modifier.
    pub attr_mod: u32,
}

impl Header {
    /// Reads the header of a MAD; the buffer must be a whole MAD.
    pub fn parse(mad: &[u8]) -> Result<Self> {
        if mad.len() != MAD_LEN {
            return Err(Error::Truncated);
        }
        if mad[0] != BASE_VERSION {
            return Err(Error::BadMadVersion(mad[0]));
        }
        Ok(Self {
            mgmt_class: mad[1],
            class_version: mad[2],
            method: mad[3],
            status: be16(&mad[4..6]),
            class_specific: be16(&mad[6..8]),
            tid: be64(&mad[8..16]),
            attr_id: be16(&mad[16..18]),
            attr_mod: be32(&mad[20..24]),
        })
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `mad`, reserved bytes zero.
    pub fn emit(&self, mad: &mut [u8; MAD_LEN]) {
        mad[0] = BASE_VERSION;
        mad[1] = self.mgmt_class;
        mad[2] = self.class_version;
        mad[3] = self.method;
        write_be(&mut mad[4..6], u64::from(self.status));
        write_be(&mut mad[6..8], u64::from(self.class_specific));
        write_be(&mut mad[8..16], self.tid);
        write_be(&mut mad[16..18], u64::from(self.attr_id));
        mad[18] = 0;
        mad[19] = 0;
        write_be(&mut mad[20..24], u64::from(self.attr_mod));
    }
}

impl fmt::Display for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "mad(class={:#04x} v{} method={:#04x} status={:#06x} tid={:#018x} attr={:#06x})",
            self.mgmt_class, self.class_version, self.method, self.status, self.tid, self.attr_id
        )
    }
}

/// A general management packet (IBA 13.5.1): `mad` sent from QP1 to QP1 in a UD SEND with
/// the GSI's Q_Key and the default partition, as RoCE devices send CM MADs. QP1 numbers its
/// packets with `psn` (the receiver does not check UD PSNs).
pub fn gmp(mad: &[u8], psn: Psn) -> PacketRepr<'_> {
    let mut b = bth::Repr::new(Opcode::UD_SEND_ONLY, Qpn::from_masked(GSI_QPN), psn);
    b.pkey = PKey::DEFAULT;
    let ext = ExtHeaders {
        deth: Some(deth::Repr { qkey: QKey(GSI_QKEY), src_qp: Qpn::from_masked(GSI_QPN) }),
        ..ExtHeaders::default()
    };
    PacketRepr::new(b, ext, mad)
}

/// The MAD a received packet carries, if it is a well-formed GMP: a UD SEND to QP1 from QP1
/// with the GSI's Q_Key and a payload of exactly one MAD. Anything else is an error naming
/// the first rule broken.
pub fn gmp_payload<'a>(packet: &PacketRepr<'a>) -> Result<&'a [u8]> {
    let deth = packet.ext.deth.ok_or(Error::HeaderMismatch(packet.bth.opcode))?;
    if packet.bth.opcode != Opcode::UD_SEND_ONLY
        || packet.bth.dest_qp.get() != GSI_QPN
        || deth.src_qp.get() != GSI_QPN
        || deth.qkey.0 != GSI_QKEY
    {
        return Err(Error::NotGmp);
    }
    if packet.payload.len() != MAD_LEN {
        return Err(Error::Truncated);
    }
    Ok(packet.payload)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn header_roundtrip_and_refusals() {
        let h = Header {
            mgmt_class: class::CM,
            class_version: 2,
            method: method::SEND,
            status: 0,
            class_specific: 0,
            tid: 0x0102_0304_0506_0708,
            attr_id: 0x0010,
            attr_mod: 0,
        };
        let mut mad = [0xAAu8; MAD_LEN];
        h.emit(&mut mad);
        assert_eq!(&mad[..4], &[1, 7, 2, 3]);
        assert_eq!(&mad[16..20], &[0, 0x10, 0, 0]);
        assert_eq!(Header::parse(&mad).unwrap(), h);
        assert_eq!(Header::parse(&mad[..255]), Err(Error::Truncated));
        mad[0] = 2;
        assert_eq!(Header::parse(&mad), Err(Error::BadMadVersion(2)));
    }
}
