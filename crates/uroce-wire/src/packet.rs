//! Whole RoCEv2 packets: `BTH ‖ extension headers ‖ payload ‖ pad ‖ ICRC`, parsed in one call
//! and built in one pass.

use core::fmt;

use crate::icrc::{self, ICRC_LEN, PseudoHeader};
use crate::opcode::{ExtHeader, OpFlags, OpcodeInfo};
use crate::{Error, Result};
use crate::{aeth, atomic_ack_eth, atomic_eth, bth, deth, ieth, immdt, reth, xrceth};

/// The extension headers of one packet. Which are present is fixed by the opcode
/// ([`OpcodeInfo::headers`]); the CNP's reserved block is not represented (it is sent as zeros).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtHeaders {
    /// RDMA extended transport header.
    pub reth: Option<reth::Repr>,
    /// ACK extended transport header.
    pub aeth: Option<aeth::Repr>,
    /// Atomic extended transport header.
    pub atomic_eth: Option<atomic_eth::Repr>,
    /// Atomic acknowledge extended transport header.
    pub atomic_ack_eth: Option<atomic_ack_eth::Repr>,
    /// Immediate data.
    pub immdt: Option<immdt::Repr>,
    /// Invalidate extended transport header.
    pub ieth: Option<ieth::Repr>,
    /// Datagram extended transport header.
    pub deth: Option<deth::Repr>,
    /// XRC extended transport header.
    pub xrceth: Option<xrceth::Repr>,
}

impl ExtHeaders {
    /// Whether `header` is present.
    fn has(&self, header: ExtHeader) -> bool {
        match header {
            ExtHeader::Reth => self.reth.is_some(),
            ExtHeader::Aeth => self.aeth.is_some(),
            ExtHeader::AtomicEth => self.atomic_eth.is_some(),
            ExtHeader::AtomicAckEth => self.atomic_ack_eth.is_some(),
            ExtHeader::ImmDt => self.immdt.is_some(),
            ExtHeader::Ieth => self.ieth.is_some(),
            ExtHeader::Deth => self.deth.is_some(),
            ExtHeader::Xrceth => self.xrceth.is_some(),
            ExtHeader::CnpReserved => true,
        }
    }

    /// Whether exactly the headers `info` lists are present.
    fn matches(&self, info: &OpcodeInfo) -> bool {
        const ALL: [ExtHeader; 8] = [
            ExtHeader::Xrceth,
            ExtHeader::Reth,
            ExtHeader::Aeth,
            ExtHeader::AtomicEth,
            ExtHeader::AtomicAckEth,
            ExtHeader::ImmDt,
            ExtHeader::Ieth,
            ExtHeader::Deth,
        ];
        ALL.iter().all(|&h| self.has(h) == info.headers.contains(&h))
    }

    /// Reads the headers `info` lists from `bytes`, which starts right after the BTH and holds
    /// them all (the caller checked the length).
    fn parse(info: &OpcodeInfo, bytes: &[u8]) -> Result<Self> {
        let mut ext = Self::default();
        let mut at = 0;
        for &h in info.headers {
            let b = bytes.get(at..at + h.wire_len()).ok_or(Error::Truncated)?;
            match h {
                ExtHeader::Reth => {
                    ext.reth = Some(reth::Repr::parse(&reth::Packet::new_checked(b)?)?)
                }
                ExtHeader::Aeth => {
                    ext.aeth = Some(aeth::Repr::parse(&aeth::Packet::new_checked(b)?)?)
                }
                ExtHeader::AtomicEth => {
                    ext.atomic_eth =
                        Some(atomic_eth::Repr::parse(&atomic_eth::Packet::new_checked(b)?)?);
                }
                ExtHeader::AtomicAckEth => {
                    ext.atomic_ack_eth = Some(atomic_ack_eth::Repr::parse(
                        &atomic_ack_eth::Packet::new_checked(b)?,
                    )?);
                }
                ExtHeader::ImmDt => {
                    ext.immdt = Some(immdt::Repr::parse(&immdt::Packet::new_checked(b)?)?);
                }
                ExtHeader::Ieth => {
                    ext.ieth = Some(ieth::Repr::parse(&ieth::Packet::new_checked(b)?)?)
                }
                ExtHeader::Deth => {
                    ext.deth = Some(deth::Repr::parse(&deth::Packet::new_checked(b)?)?)
                }
                ExtHeader::Xrceth => {
                    ext.xrceth = Some(xrceth::Repr::parse(&xrceth::Packet::new_checked(b)?)?);
                }
                ExtHeader::CnpReserved => {}
            }
            at += h.wire_len();
        }
        Ok(ext)
    }

    /// Writes the headers `info` lists into `buf`, which holds them all. The caller checked
    /// that `self` matches `info`.
    fn emit(&self, info: &OpcodeInfo, buf: &mut [u8]) {
        let mut at = 0;
        for &h in info.headers {
            let b = &mut buf[at..at + h.wire_len()];
            match h {
                ExtHeader::Reth => {
                    emit_opt(self.reth, |r| r.emit(&mut reth::Packet::new_unchecked(b)))
                }
                ExtHeader::Aeth => {
                    emit_opt(self.aeth, |r| r.emit(&mut aeth::Packet::new_unchecked(b)))
                }
                ExtHeader::AtomicEth => emit_opt(self.atomic_eth, |r| {
                    r.emit(&mut atomic_eth::Packet::new_unchecked(b));
                }),
                ExtHeader::AtomicAckEth => emit_opt(self.atomic_ack_eth, |r| {
                    r.emit(&mut atomic_ack_eth::Packet::new_unchecked(b));
                }),
                ExtHeader::ImmDt => {
                    emit_opt(self.immdt, |r| r.emit(&mut immdt::Packet::new_unchecked(b)));
                }
                ExtHeader::Ieth => {
                    emit_opt(self.ieth, |r| r.emit(&mut ieth::Packet::new_unchecked(b)))
                }
                ExtHeader::Deth => {
                    emit_opt(self.deth, |r| r.emit(&mut deth::Packet::new_unchecked(b)))
                }
                ExtHeader::Xrceth => {
                    emit_opt(self.xrceth, |r| r.emit(&mut xrceth::Packet::new_unchecked(b)));
                }
                ExtHeader::CnpReserved => b.fill(0),
            }
            at += h.wire_len();
        }
    }
}

fn emit_opt<R>(repr: Option<R>, emit: impl FnOnce(R)) {
    if let Some(r) = repr {
        emit(r);
    }
}

impl fmt::Display for ExtHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Wire order for every opcode: XRCETH or DETH, RETH, AETH, AtomicETH, AtomicAckETH,
        // ImmDt, IETH.
        if let Some(h) = &self.xrceth {
            write!(f, " {h}")?;
        }
        if let Some(h) = &self.deth {
            write!(f, " {h}")?;
        }
        if let Some(h) = &self.reth {
            write!(f, " {h}")?;
        }
        if let Some(h) = &self.aeth {
            write!(f, " {h}")?;
        }
        if let Some(h) = &self.atomic_eth {
            write!(f, " {h}")?;
        }
        if let Some(h) = &self.atomic_ack_eth {
            write!(f, " {h}")?;
        }
        if let Some(h) = &self.immdt {
            write!(f, " {h}")?;
        }
        if let Some(h) = &self.ieth {
            write!(f, " {h}")?;
        }
        Ok(())
    }
}

/// A RoCEv2 packet as values, borrowing its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketRepr<'a> {
    /// The base transport header. On emit, `pad_count` is replaced by the one the payload needs.
    pub bth: bth::Repr,
    /// The extension headers the opcode requires.
    pub ext: ExtHeaders,
    /// The payload, without pad.
    pub payload: &'a [u8],
}

/// A parsed packet: the values and the ICRC it carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedPacket<'a> {
    /// Headers and payload.
    pub repr: PacketRepr<'a>,
    /// The ICRC carried in the last four bytes.
    pub icrc: u32,
}

/// Pad bytes that bring `payload_len` to a multiple of four (IBA 9.2, PadCnt).
pub const fn pad_for(payload_len: usize) -> usize {
    (4 - payload_len % 4) % 4
}

/// [`pad_for`] as the BTH's 2-bit pad count.
const fn pad_count_for(payload_len: usize) -> u8 {
    [0, 3, 2, 1][payload_len % 4]
}

impl<'a> PacketRepr<'a> {
    /// A packet with the pad count in `bth` set for `payload`.
    pub fn new(mut bth: bth::Repr, ext: ExtHeaders, payload: &'a [u8]) -> Self {
        bth.pad_count = pad_count_for(payload.len());
        Self { bth, ext, payload }
    }

    /// Parses a packet (the UDP payload: BTH through ICRC) and checks its ICRC against the IP
    /// and UDP headers it came in.
    pub fn parse(roce: &'a [u8], pseudo: &PseudoHeader) -> Result<ParsedPacket<'a>> {
        let parsed = Self::parse_ignoring_icrc(roce)?;
        #[cfg(not(fuzzing))]
        icrc::verify(pseudo, roce)?;
        #[cfg(fuzzing)]
        let _ = pseudo;
        Ok(parsed)
    }

    /// Parses a packet without checking its ICRC (for tools that report the ICRC separately).
    /// Every other rule is checked: length, TVer, known opcode, pad count, payload presence.
    pub fn parse_ignoring_icrc(roce: &'a [u8]) -> Result<ParsedPacket<'a>> {
        if roce.len() < bth::HEADER_LEN + ICRC_LEN {
            return Err(Error::Truncated);
        }
        let bth = bth::Repr::parse(&bth::Packet::new_checked(roce)?)?;
        let info = bth.opcode.info().ok_or(Error::UnknownOpcode(bth.opcode))?;
        let body_end = roce.len() - ICRC_LEN;
        if body_end < info.header_len {
            return Err(Error::Truncated);
        }
        let payload_and_pad = body_end - info.header_len;
        let pad = usize::from(bth.pad_count);
        if !info.has(OpFlags::PAYLOAD) {
            if pad != 0 {
                return Err(Error::BadPadCount(bth.pad_count));
            }
            if payload_and_pad != 0 {
                return Err(Error::UnexpectedPayload);
            }
        }
        // The transport packet is a whole number of 4-byte words; the pad makes it so.
        if pad > payload_and_pad || !roce.len().is_multiple_of(4) {
            return Err(Error::BadPadCount(bth.pad_count));
        }
        let ext = ExtHeaders::parse(info, &roce[bth::HEADER_LEN..info.header_len])?;
        let payload = &roce[info.header_len..body_end - pad];
        Ok(ParsedPacket { repr: Self { bth, ext, payload }, icrc: icrc::carried(roce)? })
    }

    /// The opcode's table entry; an error for an opcode without one.
    fn info(&self) -> Result<&'static OpcodeInfo> {
        self.bth.opcode.info().ok_or(Error::UnknownOpcode(self.bth.opcode))
    }

    /// Length of the headers (BTH and extension headers).
    pub fn header_len(&self) -> Result<usize> {
        Ok(self.info()?.header_len)
    }

    /// Length of the whole packet: headers, payload, pad and ICRC.
    pub fn buffer_len(&self) -> Result<usize> {
        let n = self.payload.len();
        Ok(self.header_len()? + n + pad_for(n) + ICRC_LEN)
    }

    /// Checks the headers against the opcode and writes BTH and extension headers into `buf`,
    /// returning their length. With [`PacketRepr::trailer`] this lets a sender put the payload
    /// in between without copying it (scatter/gather).
    pub fn emit_headers(&self, buf: &mut [u8]) -> Result<usize> {
        self.emit_headers_for(self.payload.len(), buf)
    }

    /// [`PacketRepr::emit_headers`] for a payload of `payload_len` bytes held elsewhere.
    fn emit_headers_for(&self, payload_len: usize, buf: &mut [u8]) -> Result<usize> {
        let info = self.info()?;
        if !self.ext.matches(info) {
            return Err(Error::HeaderMismatch(self.bth.opcode));
        }
        if !info.has(OpFlags::PAYLOAD) && payload_len != 0 {
            return Err(Error::UnexpectedPayload);
        }
        let out = buf.get_mut(..info.header_len).ok_or(Error::BufferTooSmall)?;
        let mut bth = self.bth;
        bth.pad_count = pad_count_for(payload_len);
        bth.emit(&mut bth::Packet::new_unchecked(&mut out[..bth::HEADER_LEN]))?;
        self.ext.emit(info, &mut out[bth::HEADER_LEN..]);
        Ok(info.header_len)
    }

    /// The pad and ICRC that follow the payload, given the headers `emit_headers` wrote.
    /// Returns the bytes and how many of them to send (pad count + 4).
    pub fn trailer(&self, headers: &[u8], pseudo: &PseudoHeader) -> Result<([u8; 7], usize)> {
        let pad = pad_for(self.payload.len());
        let zeros = [0u8; 3];
        let crc = icrc::compute_parts(pseudo, &[headers, self.payload, &zeros[..pad]])?;
        let mut t = [0u8; 7];
        t[pad..pad + ICRC_LEN].copy_from_slice(&icrc::to_wire(crc));
        Ok((t, pad + ICRC_LEN))
    }

    /// Writes the headers into `buf` (replacing its contents) and appends pad and ICRC, for a
    /// payload that stays where it is: `parts`, in order, go between headers and trailer (a
    /// scatter/gather send straight from registered memory). Returns the header length `h`:
    /// the datagram is `buf[..h]`, then the parts, then `buf[h..]`. The packet's own payload
    /// must be empty; the parts are its payload.
    pub fn emit_gathered(
        &self,
        pseudo: &PseudoHeader,
        parts: &[&[u8]],
        buf: &mut Vec<u8>,
    ) -> Result<usize> {
        let hlen = self.emit_gathered_without_icrc(parts, buf)?;
        let end = buf.len() - ICRC_LEN;
        let mut all: Vec<&[u8]> = Vec::with_capacity(parts.len() + 2);
        all.push(&buf[..hlen]);
        all.extend_from_slice(parts);
        all.push(&buf[hlen..end]);
        let crc = icrc::compute_parts(pseudo, &all)?;
        buf[end..].copy_from_slice(&icrc::to_wire(crc));
        Ok(hlen)
    }

    /// As [`PacketRepr::emit_gathered`], with the ICRC field left zero, for a runtime that
    /// computes it only where the path needs it.
    pub fn emit_gathered_without_icrc(&self, parts: &[&[u8]], buf: &mut Vec<u8>) -> Result<usize> {
        if !self.payload.is_empty() {
            return Err(Error::UnexpectedPayload);
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        buf.clear();
        buf.resize(self.header_len()?, 0);
        let hlen = self.emit_headers_for(total, buf)?;
        buf.resize(hlen + pad_for(total) + ICRC_LEN, 0);
        Ok(hlen)
    }

    /// Writes the whole packet into `buf` in one pass and returns its length.
    pub fn emit(&self, pseudo: &PseudoHeader, buf: &mut [u8]) -> Result<usize> {
        let total = self.emit_without_icrc(buf)?;
        let body_end = total - ICRC_LEN;
        let crc = icrc::compute(pseudo, &buf[..body_end])?;
        buf[body_end..total].copy_from_slice(&icrc::to_wire(crc));
        Ok(total)
    }

    /// As [`PacketRepr::emit`], with the ICRC field left zero, for a runtime that computes it
    /// only where the path needs it (and for the source port the packet really leaves from).
    pub fn emit_without_icrc(&self, buf: &mut [u8]) -> Result<usize> {
        let total = self.buffer_len()?;
        let out = buf.get_mut(..total).ok_or(Error::BufferTooSmall)?;
        let hlen = self.emit_headers(out)?;
        out[hlen..hlen + self.payload.len()].copy_from_slice(self.payload);
        out[hlen + self.payload.len()..].fill(0);
        Ok(total)
    }
}

/// One line: opcode, destination QP, PSN, flags, extension header fields, payload length.
impl fmt::Display for PacketRepr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{} len={}", self.bth, self.ext, self.payload.len())?;
        if self.bth.pad_count != 0 {
            write!(f, " pad={}", self.bth.pad_count)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use core::net::SocketAddr;

    use super::*;
    use crate::opcode::Opcode;
    use crate::types::{Msn, Psn, Qpn, RKey};

    fn pseudo() -> PseudoHeader {
        let a: SocketAddr = "127.0.0.2:49152".parse().unwrap();
        let b: SocketAddr = "127.0.0.3:4791".parse().unwrap();
        PseudoHeader::for_endpoints(a, b).unwrap()
    }

    fn write_first(payload: &[u8]) -> PacketRepr<'_> {
        let bth = bth::Repr::new(Opcode::RC_RDMA_WRITE_FIRST, Qpn::from_masked(0x11), Psn::MAX);
        let ext = ExtHeaders {
            reth: Some(reth::Repr { va: 0x1000, rkey: RKey(0xabc), dma_len: 4096 }),
            ..ExtHeaders::default()
        };
        PacketRepr::new(bth, ext, payload)
    }

    #[test]
    fn emit_parse_roundtrip_with_pad() {
        let payload = [7u8; 5];
        let repr = write_first(&payload);
        let mut buf = [0u8; 64];
        let n = repr.emit(&pseudo(), &mut buf).unwrap();
        assert_eq!(n, 12 + 16 + 5 + 3 + 4);
        let parsed = PacketRepr::parse(&buf[..n], &pseudo()).unwrap();
        assert_eq!(parsed.repr, repr);
        assert_eq!(parsed.repr.bth.pad_count, 3);
        assert_eq!(
            parsed.repr.to_string(),
            "RC_RDMA_WRITE_FIRST dqp=0x000011 psn=16777215 reth(va=0x1000 rkey=0x00000abc len=4096) len=5 pad=3"
        );
    }

    #[test]
    fn gathered_emit_of_any_split_matches_one_pass() {
        let payload: Vec<u8> = (0..23).collect();
        let repr = write_first(&payload);
        let mut one = [0u8; 96];
        let n = repr.emit(&pseudo(), &mut one).unwrap();
        let bare = write_first(&[]);
        for cut in 0..=payload.len() {
            let (a, b) = payload.split_at(cut);
            let mut buf = Vec::new();
            let h = bare.emit_gathered(&pseudo(), &[a, b], &mut buf).unwrap();
            let wire: Vec<u8> = [&buf[..h], a, b, &buf[h..]].concat();
            assert_eq!(wire, one[..n], "split at {cut}");
        }
        // The packet's own payload must be empty: the parts are the payload.
        assert!(repr.emit_gathered(&pseudo(), &[], &mut Vec::new()).is_err());
    }

    #[test]
    fn scatter_gather_emit_matches_one_pass() {
        let payload = [1u8, 2, 3, 4, 5, 6];
        let repr = write_first(&payload);
        let mut one = [0u8; 64];
        let n = repr.emit(&pseudo(), &mut one).unwrap();
        let mut hdr = [0u8; 28];
        let h = repr.emit_headers(&mut hdr).unwrap();
        let (trailer, tlen) = repr.trailer(&hdr[..h], &pseudo()).unwrap();
        let sg: Vec<u8> = [&hdr[..h], &payload[..], &trailer[..tlen]].concat();
        assert_eq!(sg, one[..n]);
    }

    #[test]
    fn emit_rejects_headers_that_do_not_match_the_opcode() {
        let mut repr = write_first(&[]);
        repr.ext.aeth =
            Some(aeth::Repr { syndrome: aeth::Syndrome::Reserved(0xff), msn: Msn::default() });
        let mut buf = [0u8; 64];
        assert_eq!(repr.emit(&pseudo(), &mut buf), Err(Error::HeaderMismatch(repr.bth.opcode)));
        repr.ext = ExtHeaders::default();
        assert_eq!(repr.emit(&pseudo(), &mut buf), Err(Error::HeaderMismatch(repr.bth.opcode)));
        let ack = PacketRepr::new(
            bth::Repr::new(Opcode::RC_ACKNOWLEDGE, Qpn::QP1, Psn::ZERO),
            ExtHeaders {
                aeth: Some(aeth::Repr {
                    syndrome: aeth::Syndrome::from_byte(0x1f),
                    msn: Msn::default(),
                }),
                ..ExtHeaders::default()
            },
            &[1],
        );
        assert_eq!(ack.emit(&pseudo(), &mut buf), Err(Error::UnexpectedPayload));
        assert_eq!(write_first(&[0; 40]).emit(&pseudo(), &mut buf), Err(Error::BufferTooSmall));
    }

    #[test]
    fn parse_checks_each_rule() {
        let payload = [9u8; 8];
        let mut buf = [0u8; 64];
        let n = write_first(&payload).emit(&pseudo(), &mut buf).unwrap();
        let good = &buf[..n];
        // One flipped payload bit: ICRC mismatch.
        let mut bad = good.to_vec();
        bad[30] ^= 0x10;
        assert!(matches!(PacketRepr::parse(&bad, &pseudo()), Err(Error::IcrcMismatch { .. })));
        // TVer.
        let mut bad = good.to_vec();
        bad[1] |= 0x02;
        assert_eq!(PacketRepr::parse_ignoring_icrc(&bad), Err(Error::BadTver(2)));
        // Unknown opcode.
        let mut bad = good.to_vec();
        bad[0] = 0x15;
        assert_eq!(PacketRepr::parse_ignoring_icrc(&bad), Err(Error::UnknownOpcode(Opcode(0x15))));
        // Truncated inside the RETH.
        assert_eq!(PacketRepr::parse_ignoring_icrc(&good[..24]), Err(Error::Truncated));
        // Pad count larger than the payload, and a length that is not a whole number of words.
        let mut bad = good.to_vec();
        bad[1] = 0x30;
        assert!(PacketRepr::parse_ignoring_icrc(&bad[..12 + 16 + 4]).is_err());
        assert_eq!(
            PacketRepr::parse_ignoring_icrc(&bad[..12 + 16 + 2 + 4]),
            Err(Error::BadPadCount(3))
        );
        // Payload on an ACK.
        let mut ack = vec![0x11, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 5, 0x1f, 0, 0, 0];
        ack.extend_from_slice(&[0; 8]);
        assert_eq!(PacketRepr::parse_ignoring_icrc(&ack), Err(Error::UnexpectedPayload));
    }
}
