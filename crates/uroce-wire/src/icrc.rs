//! The invariant CRC of a RoCEv2 packet (IBA Annex A17.3.3).
//!
//! CRC-32 (the IEEE/zlib one: reflected polynomial 0xEDB88320, initial value and final xor
//! all ones) over
//!
//! ```text
//! 8 bytes of 0xFF (in place of the IB LRH) ‖ IP header ‖ UDP header ‖ BTH ‖ ext headers ‖
//! payload ‖ pad
//! ```
//!
//! with the fields that routers may change replaced by ones first: IPv4 TOS, TTL and header
//! checksum; IPv6 traffic class, flow label and hop limit; the UDP checksum; and BTH byte 4
//! (FECN, BECN and reserved bits). The result is carried little-endian, least significant byte
//! first. IP lengths, the IPv4 identification and flags, the addresses and the ports are covered,
//! which is why a sender must know the IP header the kernel will emit: uroce sends IPv4 with
//! identification 0 and DF (see [`crate::ip::IpRepr::for_addrs`]).
//!
//! The CRC itself is `crc32fast`, which uses carry-less multiplication (PCLMULQDQ on x86-64,
//! PMULL on aarch64) when the CPU has it.

use core::net::SocketAddr;

use crate::bth;
use crate::ip::{IpRepr, UDP_HEADER_LEN, UdpRepr, parse_udp_datagram};
use crate::{Error, ROCE_V2_PORT, Result, write_be};

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// Longest IP header (IPv4 with 40 bytes of options) plus the UDP header.
const MAX_PSEUDO_LEN: usize = 60 + UDP_HEADER_LEN;

/// The IP and UDP headers of a RoCEv2 datagram with the variant fields already masked: the
/// part of the ICRC input that precedes the BTH.
///
/// Build one per flow with [`PseudoHeader::for_endpoints`] (what uroce sends; the length fields
/// are then set for each packet) or from captured bytes with [`PseudoHeader::from_headers`] (the
/// header exactly as captured, lengths included, so that a corrupted length shows as a bad ICRC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PseudoHeader {
    bytes: [u8; MAX_PSEUDO_LEN],
    /// IP header length (20..=60 for IPv4, 40 for IPv6).
    ip_len: usize,
    ipv6: bool,
    /// Whether the IP and UDP length fields are filled in per packet.
    lengths_per_packet: bool,
}

impl PseudoHeader {
    /// The headers uroce's sender produces from `src` to `dst` (see
    /// [`IpRepr::for_addrs`]); the UDP checksum and TTL do not matter, being masked.
    pub fn for_endpoints(src: SocketAddr, dst: SocketAddr) -> Result<Self> {
        let ip = IpRepr::for_addrs(src.ip(), dst.ip())?;
        let udp = UdpRepr { src_port: src.port(), dst_port: dst.port(), checksum: 0 };
        let mut buf = [0u8; MAX_PSEUDO_LEN];
        let ip_len = ip.header_len();
        ip.emit(&mut buf, UDP_HEADER_LEN)?;
        udp.emit(&mut buf[ip_len..], 0)?;
        let mut pseudo = Self::from_headers(&buf[..ip_len + UDP_HEADER_LEN])?;
        pseudo.lengths_per_packet = true;
        Ok(pseudo)
    }

    /// The headers as captured: `headers` is the IP header (with any IPv4 options) followed by
    /// the UDP header, nothing else.
    pub fn from_headers(headers: &[u8]) -> Result<Self> {
        let first = *headers.first().ok_or(Error::Truncated)?;
        let (ip_len, ipv6) = match first >> 4 {
            4 => (usize::from(first & 0x0F) * 4, false),
            6 => (crate::ip::IPV6_HEADER_LEN, true),
            _ => return Err(Error::BadIpHeader),
        };
        if headers.len() != ip_len + UDP_HEADER_LEN || ip_len < crate::ip::IPV4_HEADER_LEN {
            return Err(Error::BadIpHeader);
        }
        let mut bytes = [0u8; MAX_PSEUDO_LEN];
        bytes[..headers.len()].copy_from_slice(headers);
        if ipv6 {
            // Traffic class (low nibble of byte 0, high nibble of byte 1), flow label, hop limit.
            bytes[0] |= 0x0F;
            bytes[1..4].fill(0xFF);
            bytes[7] = 0xFF;
        } else {
            bytes[1] = 0xFF; // TOS
            bytes[8] = 0xFF; // TTL
            bytes[10..12].fill(0xFF); // header checksum
        }
        bytes[ip_len + 6..ip_len + 8].fill(0xFF); // UDP checksum
        Ok(Self { bytes, ip_len, ipv6, lengths_per_packet: false })
    }

    /// The pseudo-header of a captured datagram (IP header onwards), and its UDP payload.
    pub fn from_datagram(ip_packet: &[u8]) -> Result<(Self, &[u8])> {
        let d = parse_udp_datagram(ip_packet)?;
        Ok((Self::from_headers(d.headers)?, d.payload))
    }

    /// The masked headers, with their length fields set for a RoCE packet of `roce_len` bytes
    /// (BTH through ICRC) unless they were captured.
    fn with_len(&self, roce_len: usize) -> ([u8; MAX_PSEUDO_LEN], usize) {
        let mut b = self.bytes;
        if !self.lengths_per_packet {
            return (b, self.ip_len + UDP_HEADER_LEN);
        }
        let udp_len = (UDP_HEADER_LEN + roce_len) as u64;
        if self.ipv6 {
            write_be(&mut b[4..6], udp_len);
        } else {
            write_be(&mut b[2..4], self.ip_len as u64 + udp_len);
        }
        write_be(&mut b[self.ip_len + 4..self.ip_len + 6], udp_len);
        (b, self.ip_len + UDP_HEADER_LEN)
    }

    /// Whether the UDP destination port is RoCEv2's.
    pub fn is_roce_port(&self) -> bool {
        let p = self.ip_len + 2;
        u16::from_be_bytes([self.bytes[p], self.bytes[p + 1]]) == ROCE_V2_PORT
    }
}

/// The ICRC of a packet given as consecutive parts that together run from the first byte of the
/// BTH to the last pad byte (the ICRC itself excluded). The first part must hold the whole BTH.
pub fn compute_parts(pseudo: &PseudoHeader, parts: &[&[u8]]) -> Result<u32> {
    let Some((first, rest)) = parts.split_first() else { return Err(Error::Truncated) };
    if first.len() < bth::HEADER_LEN {
        return Err(Error::Truncated);
    }
    let roce_len: usize = parts.iter().map(|p| p.len()).sum::<usize>() + ICRC_LEN;
    let (head, head_len) = pseudo.with_len(roce_len);
    let mut h = crc32fast::Hasher::new();
    // IBA Annex A17.3.3: eight bytes of ones stand in for the LRH of a native IB packet.
    h.update(&[0xFF; 8]);
    h.update(&head[..head_len]);
    h.update(&first[..bth::field::ECN]);
    h.update(&[0xFF]); // BTH byte 4: FECN, BECN, resv6a
    h.update(&first[bth::field::ECN + 1..]);
    for p in rest {
        h.update(p);
    }
    Ok(h.finalize())
}

/// The ICRC of `roce` (BTH through pad, without the ICRC).
pub fn compute(pseudo: &PseudoHeader, roce_without_icrc: &[u8]) -> Result<u32> {
    compute_parts(pseudo, &[roce_without_icrc])
}

/// The ICRC a packet carries in its last four bytes.
pub fn carried(roce: &[u8]) -> Result<u32> {
    let n = roce.len().checked_sub(ICRC_LEN).ok_or(Error::Truncated)?;
    let t = &roce[n..];
    Ok(u32::from_le_bytes([t[0], t[1], t[2], t[3]]))
}

/// Checks the ICRC of a whole packet (BTH through ICRC).
pub fn verify(pseudo: &PseudoHeader, roce: &[u8]) -> Result<()> {
    let found = carried(roce)?;
    let computed = compute(pseudo, &roce[..roce.len() - ICRC_LEN])?;
    if found == computed { Ok(()) } else { Err(Error::IcrcMismatch { found, computed }) }
}

/// The four ICRC bytes as they go on the wire.
pub const fn to_wire(icrc: u32) -> [u8; ICRC_LEN] {
    icrc.to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    #[test]
    fn rxe_ack_vector_verifies() {
        let pkt = hex(
            "4500003069c5400040119c7b0a01103d0a01103ec42012b7001c00001100ffff000000210059dfd71f000001e61d8892",
        );
        let (pseudo, roce) = PseudoHeader::from_datagram(&pkt).unwrap();
        assert!(pseudo.is_roce_port());
        verify(&pseudo, roce).unwrap();
    }

    #[test]
    fn masked_fields_do_not_change_the_icrc_and_covered_ones_do() {
        let mut pkt = hex(
            "4500003069c5400040119c7b0a01103d0a01103ec42012b7001c00001100ffff000000210059dfd71f000001e61d8892",
        );
        // TTL, TOS, IP checksum, UDP checksum, BTH byte 4: masked.
        for (i, v) in [(8usize, 1u8), (1, 0xb8), (10, 0), (26, 0x12), (32, 0xC0)] {
            pkt[i] = v;
        }
        let (pseudo, roce) = PseudoHeader::from_datagram(&pkt).unwrap();
        verify(&pseudo, roce).unwrap();
        // IP identification is covered.
        pkt[5] ^= 1;
        let (pseudo, roce) = PseudoHeader::from_datagram(&pkt).unwrap();
        assert!(matches!(verify(&pseudo, roce), Err(Error::IcrcMismatch { .. })));
    }

    #[test]
    fn split_parts_match_contiguous() {
        let pkt = hex(
            "4500003cb1ca40004011546a0a01103e0a01103dda1812b7002800000400ffff0000003b80727d6d362e323000000000000000000000000018960ce7",
        );
        let (pseudo, roce) = PseudoHeader::from_datagram(&pkt).unwrap();
        let body = &roce[..roce.len() - ICRC_LEN];
        let whole = compute(&pseudo, body).unwrap();
        assert_eq!(compute_parts(&pseudo, &[&body[..12], &body[12..15], &body[15..]]), Ok(whole));
        assert_eq!(to_wire(whole), roce[roce.len() - 4..]);
    }
}
