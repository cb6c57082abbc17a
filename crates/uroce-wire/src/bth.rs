//! Base transport header, 12 bytes, first in every RoCEv2 packet (IBA 9.2).
//!
//! ```text
//! byte 0     opcode
//! byte 1     SE(0x80) MigReq(0x40) PadCnt(0x30) TVer(0x0F)
//! bytes 2-3  P_Key
//! byte 4     FECN(0x80) BECN(0x40) reserved — replaced by ones in the ICRC
//! bytes 5-7  destination QP
//! byte 8     AckReq(0x80) reserved(0x7F)
//! bytes 9-11 PSN
//! ```

use core::fmt;

use crate::opcode::Opcode;
use crate::types::{PKey, Psn, Qpn};
use crate::{Error, Result};

/// Length of the BTH in bytes.
pub const HEADER_LEN: usize = 12;

/// Byte ranges and masks of the BTH fields.
pub mod field {
    use crate::Field;
    /// Opcode byte.
    pub const OPCODE: usize = 0;
    /// SE, MigReq, PadCnt, TVer.
    pub const FLAGS: usize = 1;
    /// Partition key.
    pub const PKEY: Field = 2..4;
    /// FECN, BECN and reserved bits (the ICRC's "resv8a", masked to ones).
    pub const ECN: usize = 4;
    /// Destination QP.
    pub const DEST_QP: Field = 5..8;
    /// AckReq and reserved bits.
    pub const ACK_REQ: usize = 8;
    /// Packet sequence number.
    pub const PSN: Field = 9..12;

    /// Solicited event, in `FLAGS`.
    pub const SE_MASK: u8 = 0x80;
    /// Migration request, in `FLAGS`.
    pub const MIG_MASK: u8 = 0x40;
    /// Pad count, in `FLAGS`.
    pub const PAD_MASK: u8 = 0x30;
    /// Shift of the pad count in `FLAGS`.
    pub const PAD_SHIFT: u8 = 4;
    /// Transport header version, in `FLAGS`.
    pub const TVER_MASK: u8 = 0x0F;
    /// Forward explicit congestion notification, in `ECN`.
    pub const FECN_MASK: u8 = 0x80;
    /// Backward explicit congestion notification, in `ECN`.
    pub const BECN_MASK: u8 = 0x40;
    /// Acknowledge request, in `ACK_REQ`.
    pub const ACK_REQ_MASK: u8 = 0x80;
}

crate::header_view!("a base transport header");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref()[field::OPCODE])
    }

    fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    /// Solicited event: the receiver should raise a solicited completion event (IBA 9.2, SE).
    pub fn solicited(&self) -> bool {
        self.flags() & field::SE_MASK != 0
    }

    /// Migration request bit (automatic path migration; unused by RoCE).
    pub fn mig_req(&self) -> bool {
        self.flags() & field::MIG_MASK != 0
    }

    /// Number of pad bytes (0–3) after the payload.
    pub fn pad_count(&self) -> u8 {
        (self.flags() & field::PAD_MASK) >> field::PAD_SHIFT
    }

    /// Transport header version; must be 0.
    pub fn tver(&self) -> u8 {
        self.flags() & field::TVER_MASK
    }

    /// Partition key.
    pub fn pkey(&self) -> PKey {
        PKey(crate::be16(self.field(field::PKEY)))
    }

    /// Forward ECN: congestion was seen on the way here.
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::ECN] & field::FECN_MASK != 0
    }

    /// Backward ECN: the peer saw congestion.
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::ECN] & field::BECN_MASK != 0
    }

    /// Destination queue pair.
    pub fn dest_qp(&self) -> Qpn {
        Qpn::from_masked(crate::be24(self.field(field::DEST_QP)))
    }

    /// The requester asks for an acknowledgement of this packet.
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQ] & field::ACK_REQ_MASK != 0
    }

    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::from_masked(crate::be24(self.field(field::PSN)))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Writes the opcode.
    pub fn set_opcode(&mut self, opcode: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = opcode.0;
    }

    /// Writes SE, MigReq, PadCnt (low two bits of `pad_count`) and TVer 0.
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad_count: u8) {
        let mut b = (pad_count << field::PAD_SHIFT) & field::PAD_MASK;
        if solicited {
            b |= field::SE_MASK;
        }
        if mig_req {
            b |= field::MIG_MASK;
        }
        self.buffer.as_mut()[field::FLAGS] = b;
    }

    /// Writes the partition key.
    pub fn set_pkey(&mut self, pkey: PKey) {
        self.set(field::PKEY, u64::from(pkey.0));
    }

    /// Writes FECN and BECN, with the reserved bits zero.
    pub fn set_ecn(&mut self, fecn: bool, becn: bool) {
        let mut b = 0;
        if fecn {
            b |= field::FECN_MASK;
        }
        if becn {
            b |= field::BECN_MASK;
        }
        self.buffer.as_mut()[field::ECN] = b;
    }

    /// Writes the destination QP.
    pub fn set_dest_qp(&mut self, qpn: Qpn) {
        self.set(field::DEST_QP, u64::from(qpn.get()));
    }

    /// Writes AckReq, with the reserved bits zero.
    pub fn set_ack_req(&mut self, ack_req: bool) {
        self.buffer.as_mut()[field::ACK_REQ] = if ack_req { field::ACK_REQ_MASK } else { 0 };
    }

    /// Writes the PSN.
    pub fn set_psn(&mut self, psn: Psn) {
        self.set(field::PSN, u64::from(psn.get()));
    }
}

/// The BTH as values. Reserved bits are not kept: receivers ignore them and senders write 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration request.
    pub mig_req: bool,
    /// Pad bytes after the payload, 0–3.
    pub pad_count: u8,
    /// Partition key.
    pub pkey: PKey,
    /// Forward ECN.
    pub fecn: bool,
    /// Backward ECN.
    pub becn: bool,
    /// Destination QP.
    pub dest_qp: Qpn,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl Repr {
    /// A BTH for `opcode` to `dest_qp` at `psn`, with every other field at its usual value.
    pub const fn new(opcode: Opcode, dest_qp: Qpn, psn: Psn) -> Self {
        Self {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Reads a BTH, rejecting a transport version other than 0.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self> {
        packet.check_len()?;
        let tver = packet.tver();
        if tver != 0 {
            return Err(Error::BadTver(tver));
        }
        Ok(Self {
            opcode: packet.opcode(),
            solicited: packet.solicited(),
            mig_req: packet.mig_req(),
            pad_count: packet.pad_count(),
            pkey: packet.pkey(),
            fecn: packet.fecn(),
            becn: packet.becn(),
            dest_qp: packet.dest_qp(),
            ack_req: packet.ack_req(),
            psn: packet.psn(),
        })
    }

    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header. A pad count above 3 is an error.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        if self.pad_count > 3 {
            return Err(Error::FieldOutOfRange);
        }
        packet.set_opcode(self.opcode);
        packet.set_flags(self.solicited, self.mig_req, self.pad_count);
        packet.set_pkey(self.pkey);
        packet.set_ecn(self.fecn, self.becn);
        packet.set_dest_qp(self.dest_qp);
        packet.set_ack_req(self.ack_req);
        packet.set_psn(self.psn);
        Ok(())
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} dqp={} psn={}", self.opcode, self.dest_qp, self.psn)?;
        for (set, name) in [
            (self.ack_req, "ackreq"),
            (self.solicited, "se"),
            (self.mig_req, "migreq"),
            (self.fecn, "fecn"),
            (self.becn, "becn"),
        ] {
            if set {
                write!(f, " {name}")?;
            }
        }
        if self.pkey != PKey::DEFAULT {
            write!(f, " pkey={}", self.pkey)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // RC SEND_ONLY from Linux rxe (the `rxe_rc_send_only` vector): AckReq, dest QP 0x3b.
    const BYTES: [u8; 12] =
        [0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x3b, 0x80, 0x72, 0x7d, 0x6d];

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::RC_SEND_ONLY);
        assert_eq!(p.pkey(), PKey::DEFAULT);
        assert_eq!(p.dest_qp().get(), 0x3b);
        assert!(p.ack_req());
        assert_eq!(p.psn().get(), 0x72_7d6d);
        assert_eq!(p.pad_count(), 0);
        assert_eq!(p.tver(), 0);
    }

    #[test]
    fn parse_emit_roundtrip() {
        let repr = Repr::parse(&Packet::new_checked(&BYTES[..]).unwrap()).unwrap();
        let mut out = [0u8; HEADER_LEN];
        repr.emit(&mut Packet::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out, BYTES);
    }

    #[test]
    fn rejects_short_buffer_and_nonzero_tver() {
        assert_eq!(Packet::new_checked(&BYTES[..11]).unwrap_err(), Error::Truncated);
        let mut b = BYTES;
        b[1] |= 0x01;
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::BadTver(1)));
    }

    #[test]
    fn emit_rejects_pad_count_above_three() {
        let mut repr = Repr::new(Opcode::RC_SEND_ONLY, Qpn::QP1, Psn::ZERO);
        repr.pad_count = 4;
        let mut out = [0u8; HEADER_LEN];
        assert_eq!(
            repr.emit(&mut Packet::new_unchecked(&mut out[..])),
            Err(Error::FieldOutOfRange)
        );
    }
}
