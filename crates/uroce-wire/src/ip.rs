//! The IPv4/IPv6 and UDP headers that carry a RoCEv2 packet: enough to read captures, to
//! write pcaps that Wireshark decodes, and to feed the ICRC the header the kernel will emit.
//!
//! Only what RoCEv2 needs: no fragments, no IPv6 extension headers (a packet with either is
//! reported as not carrying UDP).

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::{Error, Result, be16, be32, write_be};

/// Length of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// Length of the IPv6 fixed header.
pub const IPV6_HEADER_LEN: usize = 40;
/// Length of the UDP header.
pub const UDP_HEADER_LEN: usize = 8;
/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;
/// TTL (hop limit) uroce puts in captures; it is masked out of the ICRC.
pub const DEFAULT_TTL: u8 = 64;

/// IPv4 header fields (RFC 791) other than lengths, protocol and checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// DSCP and ECN (the old TOS byte).
    pub tos: u8,
    /// Identification.
    pub ident: u16,
    /// Don't-fragment flag.
    pub dont_frag: bool,
    /// Time to live.
    pub ttl: u8,
}

/// IPv6 fixed-header fields (RFC 8200) other than the payload length and next header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Repr {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
}

/// An IPv4 or IPv6 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpRepr {
    /// IPv4.
    V4(Ipv4Repr),
    /// IPv6.
    V6(Ipv6Repr),
}

impl IpRepr {
    /// The header uroce's sender produces for a datagram from `src` to `dst`: no options,
    /// TOS/traffic class 0, IPv4 identification 0 with DF set (what Linux emits for an
    /// unconnected socket with `IP_PMTUDISC_DO`), TTL 64.
    pub fn for_addrs(src: IpAddr, dst: IpAddr) -> Result<Self> {
        match (src, dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => Ok(Self::V4(Ipv4Repr {
                src,
                dst,
                tos: 0,
                ident: 0,
                dont_frag: true,
                ttl: DEFAULT_TTL,
            })),
            (IpAddr::V6(src), IpAddr::V6(dst)) => Ok(Self::V6(Ipv6Repr {
                src,
                dst,
                traffic_class: 0,
                flow_label: 0,
                hop_limit: DEFAULT_TTL,
            })),
            _ => Err(Error::BadIpHeader),
        }
    }

    /// Source address.
    pub fn src(&self) -> IpAddr {
        match self {
            Self::V4(r) => IpAddr::V4(r.src),
            Self::V6(r) => IpAddr::V6(r.src),
        }
    }

    /// Destination address.
    pub fn dst(&self) -> IpAddr {
        match self {
            Self::V4(r) => IpAddr::V4(r.dst),
            Self::V6(r) => IpAddr::V6(r.dst),
        }
    }

    /// Length of the emitted header.
    pub const fn header_len(&self) -> usize {
        match self {
            Self::V4(_) => IPV4_HEADER_LEN,
            Self::V6(_) => IPV6_HEADER_LEN,
        }
    }

    /// Writes the header for a UDP payload of `udp_len` bytes (UDP header included), with a
    /// valid IPv4 header checksum. `buf` must hold [`IpRepr::header_len`] bytes.
    pub fn emit(&self, buf: &mut [u8], udp_len: usize) -> Result<()> {
        let hlen = self.header_len();
        let Some(h) = buf.get_mut(..hlen) else {
            return Err(Error::BufferTooSmall);
        };
        match self {
            Self::V4(r) => {
                let total = u16::try_from(hlen + udp_len).map_err(|_| Error::FieldOutOfRange)?;
                h[0] = 0x45;
                h[1] = r.tos;
                write_be(&mut h[2..4], u64::from(total));
                write_be(&mut h[4..6], u64::from(r.ident));
                write_be(&mut h[6..8], if r.dont_frag { 0x4000 } else { 0 });
                h[8] = r.ttl;
                h[9] = PROTO_UDP;
                h[10..12].fill(0);
                h[12..16].copy_from_slice(&r.src.octets());
                h[16..20].copy_from_slice(&r.dst.octets());
                let sum = internet_checksum(&[h]);
                write_be(&mut h[10..12], u64::from(sum));
            }
            Self::V6(r) => {
                let plen = u16::try_from(udp_len).map_err(|_| Error::FieldOutOfRange)?;
                let word = (6u32 << 28)
                    | (u32::from(r.traffic_class) << 20)
                    | (r.flow_label & 0x000F_FFFF);
                write_be(&mut h[0..4], u64::from(word));
                write_be(&mut h[4..6], u64::from(plen));
                h[6] = PROTO_UDP;
                h[7] = r.hop_limit;
                h[8..24].copy_from_slice(&r.src.octets());
                h[24..40].copy_from_slice(&r.dst.octets());
            }
        }
        Ok(())
    }
}

/// UDP header fields (RFC 768) other than the length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpRepr {
    /// Source port; RoCEv2 senders use it for flow entropy.
    pub src_port: u16,
    /// Destination port; 4791 for RoCEv2.
    pub dst_port: u16,
    /// The checksum as carried (0 = none, allowed over IPv4). Masked out of the ICRC.
    pub checksum: u16,
}

impl UdpRepr {
    /// Writes the UDP header for `payload_len` bytes of payload.
    pub fn emit(&self, buf: &mut [u8], payload_len: usize) -> Result<()> {
        let Some(h) = buf.get_mut(..UDP_HEADER_LEN) else {
            return Err(Error::BufferTooSmall);
        };
        let len =
            u16::try_from(UDP_HEADER_LEN + payload_len).map_err(|_| Error::FieldOutOfRange)?;
        write_be(&mut h[0..2], u64::from(self.src_port));
        write_be(&mut h[2..4], u64::from(self.dst_port));
        write_be(&mut h[4..6], u64::from(len));
        write_be(&mut h[6..8], u64::from(self.checksum));
        Ok(())
    }
}

/// A UDP datagram read from bytes that start at the IP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpDatagram<'a> {
    /// The IP header.
    pub ip: IpRepr,
    /// The UDP header.
    pub udp: UdpRepr,
    /// The IP and UDP header bytes, as they are (what the ICRC covers before the BTH).
    pub headers: &'a [u8],
    /// The UDP payload, cut to the UDP length (trailing link-layer padding is dropped).
    pub payload: &'a [u8],
}

impl UdpDatagram<'_> {
    /// Source socket address.
    pub fn src(&self) -> SocketAddr {
        SocketAddr::new(self.ip.src(), self.udp.src_port)
    }
    /// Destination socket address.
    pub fn dst(&self) -> SocketAddr {
        SocketAddr::new(self.ip.dst(), self.udp.dst_port)
    }
}

/// Reads an IPv4 or IPv6 packet carrying UDP from `bytes` (which may have trailing padding):
/// the IP and UDP length fields must agree with the bytes present.
pub fn parse_udp_datagram(bytes: &[u8]) -> Result<UdpDatagram<'_>> {
    let (ip, ip_hlen, ip_end) = read_ip_header(bytes)?;
    // A fragment (MF set or a non-zero offset) cannot be decoded on its own.
    if matches!(ip, IpRepr::V4(_)) && be16(&bytes[6..8]) & 0x3FFF != 0 {
        return Err(Error::NotUdp);
    }
    let packet = bytes.get(..ip_end).ok_or(Error::Truncated)?;
    let udp = read_udp_header(packet, ip_hlen)?;
    let udp_len = usize::from(be16(&packet[ip_hlen + 4..ip_hlen + 6]));
    if udp_len < UDP_HEADER_LEN || ip_hlen + udp_len > packet.len() {
        return Err(Error::BadUdpLength);
    }
    Ok(UdpDatagram {
        ip,
        udp,
        headers: &packet[..ip_hlen + UDP_HEADER_LEN],
        payload: &packet[ip_hlen + UDP_HEADER_LEN..ip_hlen + udp_len],
    })
}

/// Reads an IP packet carrying UDP from exactly `bytes`, without checking the IP and UDP
/// length fields: the payload is everything after the UDP header. For a tool that verifies
/// the ICRC over exactly the bytes it was given, where a corrupted length field must show as
/// a bad ICRC rather than as a different packet.
pub fn parse_udp_datagram_lenient(bytes: &[u8]) -> Result<UdpDatagram<'_>> {
    let (ip, ip_hlen, _) = read_ip_header(bytes)?;
    let udp = read_udp_header(bytes, ip_hlen)?;
    let (headers, payload) = bytes.split_at(ip_hlen + UDP_HEADER_LEN);
    Ok(UdpDatagram { ip, udp, headers, payload })
}

/// Reads the IP header: its values, its length and where the IP packet ends by its length
/// field. Protocols other than UDP are rejected.
fn read_ip_header(bytes: &[u8]) -> Result<(IpRepr, usize, usize)> {
    let first = *bytes.first().ok_or(Error::Truncated)?;
    match first >> 4 {
        4 => {
            let ihl = usize::from(first & 0x0F) * 4;
            if ihl < IPV4_HEADER_LEN {
                return Err(Error::BadIpHeader);
            }
            let h = bytes.get(..ihl).ok_or(Error::Truncated)?;
            let total = usize::from(be16(&h[2..4]));
            let flags_frag = be16(&h[6..8]);
            if h[9] != PROTO_UDP {
                return Err(Error::NotUdp);
            }
            let ip = IpRepr::V4(Ipv4Repr {
                src: Ipv4Addr::new(h[12], h[13], h[14], h[15]),
                dst: Ipv4Addr::new(h[16], h[17], h[18], h[19]),
                tos: h[1],
                ident: be16(&h[4..6]),
                dont_frag: flags_frag & 0x4000 != 0,
                ttl: h[8],
            });
            Ok((ip, ihl, total))
        }
        6 => {
            let h = bytes.get(..IPV6_HEADER_LEN).ok_or(Error::Truncated)?;
            if h[6] != PROTO_UDP {
                return Err(Error::NotUdp);
            }
            let word = be32(&h[0..4]);
            let mut src = [0u8; 16];
            src.copy_from_slice(&h[8..24]);
            let mut dst = [0u8; 16];
            dst.copy_from_slice(&h[24..40]);
            let ip = IpRepr::V6(Ipv6Repr {
                src: Ipv6Addr::from(src),
                dst: Ipv6Addr::from(dst),
                traffic_class: (h[0] << 4) | (h[1] >> 4),
                flow_label: word & 0x000F_FFFF,
                hop_limit: h[7],
            });
            Ok((ip, IPV6_HEADER_LEN, IPV6_HEADER_LEN + usize::from(be16(&h[4..6]))))
        }
        _ => Err(Error::BadIpHeader),
    }
}

/// Reads the UDP header that follows an IP header of `ip_hlen` bytes.
fn read_udp_header(packet: &[u8], ip_hlen: usize) -> Result<UdpRepr> {
    let udp = packet.get(ip_hlen..ip_hlen + UDP_HEADER_LEN).ok_or(Error::Truncated)?;
    Ok(UdpRepr {
        src_port: be16(&udp[0..2]),
        dst_port: be16(&udp[2..4]),
        checksum: be16(&udp[6..8]),
    })
}

/// The RFC 1071 one's-complement checksum of the concatenated parts (each of even length
/// except possibly the last).
pub fn internet_checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u64 = 0;
    for part in parts {
        let mut chunks = part.chunks_exact(2);
        for c in &mut chunks {
            sum += u64::from(u16::from_be_bytes([c[0], c[1]]));
        }
        if let [last] = chunks.remainder() {
            sum += u64::from(*last) << 8;
        }
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    // Folded above: the sum fits 16 bits.
    !u16::try_from(sum).unwrap_or(u16::MAX)
}

/// The UDP checksum over the IPv6 pseudo-header (RFC 8200 8.1), which IPv6 makes mandatory.
pub fn udp_checksum_v6(src: Ipv6Addr, dst: Ipv6Addr, udp_header_and_payload: &[u8]) -> u16 {
    let len = u32::try_from(udp_header_and_payload.len()).unwrap_or(u32::MAX).to_be_bytes();
    let next = [0, 0, 0, PROTO_UDP];
    let sum =
        internet_checksum(&[&src.octets(), &dst.octets(), &len, &next, udp_header_and_payload]);
    // A computed zero is sent as all ones (RFC 768).
    if sum == 0 { 0xFFFF } else { sum }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_header_roundtrips_with_checksum() {
        // The IPv4 and UDP headers of the rxe_rc_ack vector.
        let hdr = [
            0x45, 0x00, 0x00, 0x30, 0x69, 0xc5, 0x40, 0x00, 0x40, 0x11, 0x9c, 0x7b, 0x0a, 0x01,
            0x10, 0x3d, 0x0a, 0x01, 0x10, 0x3e, 0xc4, 0x20, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00,
        ];
        let mut bytes = hdr.to_vec();
        bytes.resize(0x30, 0);
        let d = parse_udp_datagram(&bytes).unwrap();
        assert_eq!(d.src().to_string(), "10.1.16.61:50208");
        assert_eq!(d.dst().port(), crate::ROCE_V2_PORT);
        assert_eq!(d.payload.len(), 20);
        let mut out = [0u8; 28];
        d.ip.emit(&mut out, 28).unwrap();
        d.udp.emit(&mut out[20..], 20).unwrap();
        assert_eq!(out, hdr);
    }

    #[test]
    fn trailing_padding_is_cut_and_short_packets_rejected() {
        let ip =
            IpRepr::for_addrs("127.0.0.2".parse().unwrap(), "127.0.0.3".parse().unwrap()).unwrap();
        let mut buf = vec![0u8; 60];
        ip.emit(&mut buf, 8 + 4).unwrap();
        UdpRepr { src_port: 1, dst_port: 4791, checksum: 0 }.emit(&mut buf[20..], 4).unwrap();
        let d = parse_udp_datagram(&buf).unwrap();
        assert_eq!(d.payload.len(), 4);
        assert_eq!(parse_udp_datagram(&buf[..30]), Err(Error::Truncated));
        assert_eq!(parse_udp_datagram(&[0x55]), Err(Error::BadIpHeader));
    }

    #[test]
    fn ipv6_roundtrip_and_checksum() {
        let ip = IpRepr::for_addrs("::1".parse().unwrap(), "::1".parse().unwrap()).unwrap();
        let mut buf = vec![0u8; 40 + 8 + 4];
        ip.emit(&mut buf, 12).unwrap();
        UdpRepr { src_port: 49152, dst_port: 4791, checksum: 0 }.emit(&mut buf[40..], 4).unwrap();
        buf[48..].copy_from_slice(&[1, 2, 3, 4]);
        let d = parse_udp_datagram(&buf).unwrap();
        assert_eq!(d.ip, ip);
        assert_eq!(d.payload, &[1, 2, 3, 4]);
        let c = udp_checksum_v6(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST, &buf[40..]);
        buf[46..48].copy_from_slice(&c.to_be_bytes());
        // Summing the pseudo-header and datagram with the checksum in place gives zero.
        let len = 12u32.to_be_bytes();
        let lo = Ipv6Addr::LOCALHOST.octets();
        assert_eq!(internet_checksum(&[&lo, &lo, &len, &[0, 0, 0, 17], &buf[40..]]), 0);
    }
}
