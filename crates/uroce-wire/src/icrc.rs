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
use crate::{Error, ROCE_V2_PORT, Result};

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// Longest IP header (IPv4 with 40 bytes of options) plus the UDP header.
const MAX_PSEUDO_LEN: usize = 60 + UDP_HEADER_LEN;

/// IBA Annex A17.3.3: eight bytes of ones stand in for the LRH of a native IB packet.
const LRH_STAND_IN: [u8; 8] = [0xFF; 8];

/// The part of the ICRC input that precedes the BTH: eight bytes of ones and the IP and UDP
/// headers with their variant fields masked, held as the CRC of those bytes.
///
/// Build one per flow with [`PseudoHeader::for_endpoints`] (what uroce sends; the length fields
/// are then set for each packet) or from captured bytes with [`PseudoHeader::from_headers`] (the
/// header exactly as captured, lengths included, so that a corrupted length shows as a bad ICRC).
///
/// The prefix is hashed once, at construction. The CRC is affine over GF(2), so changing the
/// length fields changes the prefix CRC by the XOR of one precomputed value per set bit of the
/// four length bytes; a packet then costs a CRC over its own bytes only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PseudoHeader {
    /// CRC-32 of the prefix, with the length fields as captured, or zero if set per packet.
    prefix_crc: u32,
    /// For per-packet lengths: the change in `prefix_crc` caused by each bit (LSB first) of the
    /// IP length field (IPv4 total length or IPv6 payload length) and of the UDP length field,
    /// most significant byte first.
    length_bits: Option<[[u32; 8]; 4]>,
    /// IP header length (20..=60 for IPv4, 40 for IPv6).
    ip_len: usize,
    /// UDP destination port.
    dst_port: u16,
}

impl PseudoHeader {
    /// The headers uroce's sender produces from `src` to `dst` (see
    /// [`IpRepr::for_addrs`]); the UDP checksum and TTL do not matter, being masked.
    pub fn for_endpoints(src: SocketAddr, dst: SocketAddr) -> Result<Self> {
        let ip = IpRepr::for_addrs(src.ip(), dst.ip())?;
        let udp = UdpRepr { src_port: src.port(), dst_port: dst.port(), checksum: 0 };
        let mut buf = [0u8; MAX_PSEUDO_LEN];
        let ip_len = ip.header_len();
        let ipv6 = matches!(ip, IpRepr::V6(_));
        ip.emit(&mut buf, UDP_HEADER_LEN)?;
        udp.emit(&mut buf[ip_len..], 0)?;
        // Offsets of the four length bytes within the headers.
        let ip_len_field = if ipv6 { 4 } else { 2 };
        let offsets = [ip_len_field, ip_len_field + 1, ip_len + 4, ip_len + 5];
        for &o in &offsets {
            buf[o] = 0;
        }
        let header_len = ip_len + UDP_HEADER_LEN;
        let (masked, _) = mask(&buf[..header_len])?;
        let prefix_crc = prefix_crc_of(&masked[..header_len]);
        // f(bit) = crc(e_bit) ^ crc(0…0): the linear part of the CRC, for one bit set.
        let zero = prefix_crc_of(&[0u8; MAX_PSEUDO_LEN][..header_len]);
        let mut length_bits = [[0u32; 8]; 4];
        for (row, &o) in length_bits.iter_mut().zip(&offsets) {
            for (bit, slot) in row.iter_mut().enumerate() {
                let mut e = [0u8; MAX_PSEUDO_LEN];
                e[o] = 1 << bit;
                *slot = prefix_crc_of(&e[..header_len]) ^ zero;
            }
        }
        Ok(Self { prefix_crc, length_bits: Some(length_bits), ip_len, dst_port: dst.port() })
    }

    /// The headers as captured: `headers` is the IP header (with any IPv4 options) followed by
    /// the UDP header, nothing else.
    pub fn from_headers(headers: &[u8]) -> Result<Self> {
        let (masked, ip_len) = mask(headers)?;
        let dst_port = u16::from_be_bytes([masked[ip_len + 2], masked[ip_len + 3]]);
        let prefix_crc = prefix_crc_of(&masked[..headers.len()]);
        Ok(Self { prefix_crc, length_bits: None, ip_len, dst_port })
    }

    /// The pseudo-header of a captured datagram (IP header onwards), and its UDP payload.
    pub fn from_datagram(ip_packet: &[u8]) -> Result<(Self, &[u8])> {
        let d = parse_udp_datagram(ip_packet)?;
        Ok((Self::from_headers(d.headers)?, d.payload))
    }

    /// The CRC of the prefix for a RoCE packet of `roce_len` bytes (BTH through ICRC).
    fn crc_for(&self, roce_len: usize) -> u32 {
        let Some(bits) = &self.length_bits else {
            return self.prefix_crc;
        };
        let udp_len = UDP_HEADER_LEN + roce_len;
        // IPv4 counts its own header in the total length; IPv6's payload length does not.
        let ip_field =
            if self.ip_len == crate::ip::IPV6_HEADER_LEN { udp_len } else { self.ip_len + udp_len };
        let [ip_hi, ip_lo] = u16::try_from(ip_field).unwrap_or(u16::MAX).to_be_bytes();
        let [udp_hi, udp_lo] = u16::try_from(udp_len).unwrap_or(u16::MAX).to_be_bytes();
        let mut crc = self.prefix_crc;
        for (row, byte) in bits.iter().zip([ip_hi, ip_lo, udp_hi, udp_lo]) {
            for (bit, value) in row.iter().enumerate() {
                // All ones where the bit is set: no branch on packet lengths.
                let select = 0u32.wrapping_sub(u32::from(byte >> bit) & 1);
                crc ^= value & select;
            }
        }
        crc
    }

    /// Whether the UDP destination port is RoCEv2's.
    pub fn is_roce_port(&self) -> bool {
        self.dst_port == ROCE_V2_PORT
    }
}

/// Copies IP and UDP headers with the fields the ICRC ignores set to ones; returns the copy and
/// the IP header length.
fn mask(headers: &[u8]) -> Result<([u8; MAX_PSEUDO_LEN], usize)> {
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
    Ok((bytes, ip_len))
}

/// CRC-32 of the LRH stand-in followed by `masked_headers`.
fn prefix_crc_of(masked_headers: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&LRH_STAND_IN);
    h.update(masked_headers);
    h.finalize()
}

/// The ICRC of a packet given as consecutive parts that together run from the first byte of the
/// BTH to the last pad byte (the ICRC itself excluded). The first part must hold the whole BTH.
pub fn compute_parts(pseudo: &PseudoHeader, parts: &[&[u8]]) -> Result<u32> {
    let Some((first, rest)) = parts.split_first() else {
        return Err(Error::Truncated);
    };
    if first.len() < bth::HEADER_LEN {
        return Err(Error::Truncated);
    }
    let roce_len: usize = parts.iter().map(|p| p.len()).sum::<usize>() + ICRC_LEN;
    // The CRC is fastest over few, long calls: the masked BTH and what follows it in the first
    // part are gathered in one stack buffer.
    let mut buf = [0u8; CONTIGUOUS];
    let take = first.len().min(CONTIGUOUS);
    buf[..take].copy_from_slice(&first[..take]);
    buf[bth::field::ECN] = 0xFF; // BTH byte 4: FECN, BECN, resv6a
    let mut h = crc32fast::Hasher::new_with_initial(pseudo.crc_for(roce_len));
    h.update(&buf[..take]);
    for p in core::iter::once(&&first[take..]).chain(rest) {
        if !p.is_empty() {
            h.update(p);
        }
    }
    Ok(h.finalize())
}

/// Size of the stack buffer that gathers the start of a packet for the CRC.
const CONTIGUOUS: usize = 128;

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
