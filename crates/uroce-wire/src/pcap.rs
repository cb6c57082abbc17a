//! pcap capture files: a writer that wraps RoCEv2 packets in Ethernet, IP and UDP the way uroce
//! sends them, so that Wireshark and tshark decode them; and a reader for classic pcap and
//! pcapng files as tcpdump, tshark and dumpcap write them.
//!
//! The writer's frames carry an IPv4 header with DF and a valid header checksum, and UDP
//! checksum 0 (allowed over IPv4); over IPv6 the UDP checksum is computed, as IPv6 requires.
//! The IPv4 identification is the one the packet's ICRC was computed for (0 for a datagram
//! sent alone, k for segment k of a GSO send; see [`crate::icrc::IdRecovery`]), or 0 if no
//! identification makes the ICRC right: so `uroce decode` verifies every intact packet and
//! still shows a corrupted one as such.

use core::fmt;
use core::net::{IpAddr, SocketAddr};
use core::time::Duration;
use std::io::{self, Write};

use crate::ip::{IpRepr, UDP_HEADER_LEN, UdpRepr, udp_checksum_v6};

/// Link-layer header types (tcpdump.org LINKTYPE_* values) this module reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkType(pub u32);

impl LinkType {
    /// BSD loopback: a 4-byte address family in the writer's byte order.
    pub const NULL: Self = Self(0);
    /// Ethernet II, optionally with 802.1Q/802.1ad tags.
    pub const ETHERNET: Self = Self(1);
    /// Raw IP (IPv4 or IPv6 by the version nibble).
    pub const RAW: Self = Self(101);
    /// Linux "cooked" capture v1 (`tcpdump -i any`).
    pub const LINUX_SLL: Self = Self(113);
    /// Raw IPv4.
    pub const IPV4: Self = Self(228);
    /// Raw IPv6.
    pub const IPV6: Self = Self(229);
    /// Linux "cooked" capture v2 (`tshark -i any`).
    pub const LINUX_SLL2: Self = Self(276);
}

/// Ethertypes.
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86DD;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_QINQ: u16 = 0x88A8;
const ETH_HEADER_LEN: usize = 14;

/// Classic pcap magic, microsecond timestamps.
const MAGIC_MICROS: u32 = 0xA1B2_C3D4;
/// Classic pcap magic, nanosecond timestamps.
const MAGIC_NANOS: u32 = 0xA1B2_3C4D;
/// pcapng section header block type.
const PCAPNG_SHB: u32 = 0x0A0D_0D0A;
/// pcapng byte-order magic.
const PCAPNG_BOM: u32 = 0x1A2B_3C4D;
/// Snapshot length written: the largest RoCEv2 frame (4096 MTU + headers) fits easily.
const SNAPLEN: u32 = 65_535;

/// Writes a classic pcap file with Ethernet framing.
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    out: W,
    frame: Vec<u8>,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the file header (pcap 2.4, microsecond timestamps, Ethernet).
    pub fn new(mut out: W) -> io::Result<Self> {
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&MAGIC_MICROS.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&4u16.to_le_bytes());
        h.extend_from_slice(&0i32.to_le_bytes()); // thiszone
        h.extend_from_slice(&0u32.to_le_bytes()); // sigfigs
        h.extend_from_slice(&SNAPLEN.to_le_bytes());
        h.extend_from_slice(&LinkType::ETHERNET.0.to_le_bytes());
        out.write_all(&h)?;
        Ok(Self { out, frame: Vec::with_capacity(9000) })
    }

    /// Writes one Ethernet frame with timestamp `ts` (time since the Unix epoch, or any
    /// origin the caller chooses: the writer never reads a clock).
    pub fn write_frame(&mut self, ts: Duration, frame: &[u8]) -> io::Result<()> {
        let len = u32::try_from(frame.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too long"))?;
        let secs = u32::try_from(ts.as_secs()).unwrap_or(u32::MAX);
        let mut rec = [0u8; 16];
        rec[0..4].copy_from_slice(&secs.to_le_bytes());
        rec[4..8].copy_from_slice(&ts.subsec_micros().to_le_bytes());
        rec[8..12].copy_from_slice(&len.min(SNAPLEN).to_le_bytes());
        rec[12..16].copy_from_slice(&len.to_le_bytes());
        self.out.write_all(&rec)?;
        self.out.write_all(&frame[..frame.len().min(SNAPLEN as usize)])
    }

    /// Writes a RoCEv2 packet (BTH through ICRC) sent from `src` to `dst`, framed as uroce
    /// sends it (see [`ethernet_frame`]).
    pub fn write_roce(
        &mut self,
        ts: Duration,
        src: SocketAddr,
        dst: SocketAddr,
        roce: &[u8],
    ) -> io::Result<()> {
        let mut frame = core::mem::take(&mut self.frame);
        let result = ethernet_frame(src, dst, roce, &mut frame)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
            .and_then(|()| self.write_frame(ts, &frame));
        self.frame = frame;
        result
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Flushes and returns the underlying writer.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// A locally administered MAC address derived from an IP address, so captures show one MAC per
/// uroce device: `02:00` followed by the last four bytes of the address.
fn mac_for(ip: IpAddr) -> [u8; 6] {
    let tail = match ip {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(a) => {
            let o = a.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    [0x02, 0x00, tail[0], tail[1], tail[2], tail[3]]
}

/// Replaces `out` with an Ethernet frame carrying `roce` in UDP from `src` to `dst`, with the
/// IP header [`IpRepr::for_addrs`] describes (the one the ICRC covers), its IPv4
/// identification the one the ICRC was computed for.
pub fn ethernet_frame(
    src: SocketAddr,
    dst: SocketAddr,
    roce: &[u8],
    out: &mut Vec<u8>,
) -> crate::Result<()> {
    let mut ip = IpRepr::for_addrs(src.ip(), dst.ip())?;
    if let IpRepr::V4(v4) = &mut ip {
        let pseudo = crate::icrc::PseudoHeader::for_endpoints(src, dst)?;
        let mut ids = crate::icrc::IdRecovery::new(crate::icrc::Ipv4IdPolicy::Any);
        v4.ident = ids.verify(&pseudo, roce).unwrap_or(0);
    }
    let ip_len = ip.header_len();
    let udp_len = UDP_HEADER_LEN + roce.len();
    out.clear();
    out.resize(ETH_HEADER_LEN + ip_len + udp_len, 0);
    out[0..6].copy_from_slice(&mac_for(dst.ip()));
    out[6..12].copy_from_slice(&mac_for(src.ip()));
    let ethertype = if matches!(ip, IpRepr::V4(_)) { ETHERTYPE_IPV4 } else { ETHERTYPE_IPV6 };
    out[12..14].copy_from_slice(&ethertype.to_be_bytes());
    let (ip_buf, rest) = out[ETH_HEADER_LEN..].split_at_mut(ip_len);
    ip.emit(ip_buf, udp_len)?;
    let udp = UdpRepr { src_port: src.port(), dst_port: dst.port(), checksum: 0 };
    udp.emit(rest, roce.len())?;
    rest[UDP_HEADER_LEN..].copy_from_slice(roce);
    if let IpRepr::V6(v6) = ip {
        let sum = udp_checksum_v6(v6.src, v6.dst, rest);
        rest[6..8].copy_from_slice(&sum.to_be_bytes());
    }
    Ok(())
}

/// Why a capture file could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadError {
    /// The file starts with neither a pcap nor a pcapng magic number.
    NotPcap,
    /// The file ends inside a header or record, at this byte offset.
    Truncated(usize),
    /// A pcapng block is malformed (bad length or byte-order magic), at this byte offset.
    BadBlock(usize),
    /// A pcapng packet names an interface that no interface description block declared.
    UnknownInterface(u32),
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotPcap => f.write_str("not a pcap or pcapng file"),
            Self::Truncated(at) => write!(f, "capture truncated at byte {at}"),
            Self::BadBlock(at) => write!(f, "malformed pcapng block at byte {at}"),
            Self::UnknownInterface(id) => write!(f, "packet on undeclared interface {id}"),
        }
    }
}

impl std::error::Error for ReadError {}

/// One captured frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Frame number in the file, from 1 (as Wireshark numbers them).
    pub number: usize,
    /// Capture timestamp.
    pub ts: Duration,
    /// The link-layer type of `data`.
    pub link: LinkType,
    /// The captured bytes (possibly cut at the snapshot length).
    pub data: &'a [u8],
    /// The frame's length on the wire.
    pub orig_len: u32,
}

impl<'a> Frame<'a> {
    /// The IP packet inside the frame, if the link type is known and it carries IPv4 or IPv6.
    pub fn ip_packet(&self) -> Option<&'a [u8]> {
        ip_packet(self.link, self.data)
    }
}

/// Whether `bytes` begins like a pcap or pcapng file.
pub fn looks_like_capture(bytes: &[u8]) -> bool {
    bytes.len() >= 4 && {
        let be = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let le = be.swap_bytes();
        [MAGIC_MICROS, MAGIC_NANOS, PCAPNG_SHB].iter().any(|&m| m == be || m == le)
    }
}

/// Reads every frame of a pcap or pcapng file held in memory.
pub fn read_frames(bytes: &[u8]) -> Result<Vec<Frame<'_>>, ReadError> {
    match read_frames_partial(bytes) {
        (frames, None) => Ok(frames),
        (_, Some(e)) => Err(e),
    }
}

/// As [`read_frames`], but keeps the frames before a problem: every complete frame, and what
/// stopped the reading, if anything did (a capture cut short, as one still being written is,
/// gives its complete frames and [`ReadError::Truncated`]).
pub fn read_frames_partial(bytes: &[u8]) -> (Vec<Frame<'_>>, Option<ReadError>) {
    if bytes.len() < 4 {
        return (Vec::new(), Some(ReadError::NotPcap));
    }
    let magic = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let mut frames = Vec::new();
    let result = if magic == PCAPNG_SHB {
        read_pcapng(bytes, &mut frames)
    } else {
        read_pcap(bytes, &mut frames)
    };
    (frames, result.err())
}

/// A cursor that reads integers in the file's byte order.
struct Reader<'a> {
    bytes: &'a [u8],
    big_endian: bool,
}

impl<'a> Reader<'a> {
    fn slice(&self, at: usize, len: usize) -> Result<&'a [u8], ReadError> {
        at.checked_add(len).and_then(|end| self.bytes.get(at..end)).ok_or(ReadError::Truncated(at))
    }
    fn u16(&self, at: usize) -> Result<u16, ReadError> {
        let b = self.slice(at, 2)?;
        let a = [b[0], b[1]];
        Ok(if self.big_endian { u16::from_be_bytes(a) } else { u16::from_le_bytes(a) })
    }
    fn u32(&self, at: usize) -> Result<u32, ReadError> {
        let b = self.slice(at, 4)?;
        let a = [b[0], b[1], b[2], b[3]];
        Ok(if self.big_endian { u32::from_be_bytes(a) } else { u32::from_le_bytes(a) })
    }
}

fn read_pcap<'a>(bytes: &'a [u8], frames: &mut Vec<Frame<'a>>) -> Result<(), ReadError> {
    let head = bytes.get(..4).ok_or(ReadError::NotPcap)?;
    let le = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let (big_endian, nanos) = match le {
        MAGIC_MICROS => (false, false),
        MAGIC_NANOS => (false, true),
        m if m.swap_bytes() == MAGIC_MICROS => (true, false),
        m if m.swap_bytes() == MAGIC_NANOS => (true, true),
        _ => return Err(ReadError::NotPcap),
    };
    let r = Reader { bytes, big_endian };
    // The link type's low 16 bits; the upper bits may carry FCS information.
    let link = LinkType(r.u32(20)? & 0xFFFF);
    let mut at = 24;
    while at < bytes.len() {
        let secs = r.u32(at)?;
        let frac = r.u32(at + 4)?;
        let caplen = r.u32(at + 8)? as usize;
        let orig_len = r.u32(at + 12)?;
        let data = r.slice(at + 16, caplen)?;
        let ts = Duration::from_secs(u64::from(secs))
            + if nanos {
                Duration::from_nanos(u64::from(frac))
            } else {
                Duration::from_micros(u64::from(frac))
            };
        frames.push(Frame { number: frames.len() + 1, ts, link, data, orig_len });
        at += 16 + caplen;
    }
    Ok(())
}

/// An interface declared in a pcapng section.
#[derive(Clone, Copy)]
struct Interface {
    link: LinkType,
    snaplen: u32,
    /// Timestamp units per second.
    units_per_sec: u64,
}

fn read_pcapng<'a>(bytes: &'a [u8], frames: &mut Vec<Frame<'a>>) -> Result<(), ReadError> {
    let mut interfaces: Vec<Interface> = Vec::new();
    let mut r = Reader { bytes, big_endian: false };
    let mut at = 0;
    while at < bytes.len() {
        let block_type = r.u32(at)?;
        if block_type == PCAPNG_SHB {
            // The byte-order magic decides how this section's integers read.
            let bom = r.slice(at + 8, 4)?;
            r.big_endian = match u32::from_le_bytes([bom[0], bom[1], bom[2], bom[3]]) {
                PCAPNG_BOM => false,
                m if m.swap_bytes() == PCAPNG_BOM => true,
                _ => return Err(ReadError::BadBlock(at)),
            };
            interfaces.clear();
        }
        let len = r.u32(at + 4)? as usize;
        if len < 12 || !len.is_multiple_of(4) {
            return Err(ReadError::BadBlock(at));
        }
        let body = r.slice(at + 8, len - 12)?;
        let body_at = at + 8;
        match block_type {
            // Interface description block.
            1 => {
                let link = LinkType(u32::from(r.u16(body_at)?));
                let snaplen = r.u32(body_at + 4)?;
                let units_per_sec = if_tsresol(&r, body_at + 8, body_at + body.len())?;
                interfaces.push(Interface { link, snaplen, units_per_sec });
            }
            // Enhanced packet block.
            6 => {
                let iface_id = r.u32(body_at)?;
                let iface = *interfaces
                    .get(iface_id as usize)
                    .ok_or(ReadError::UnknownInterface(iface_id))?;
                let ts_units =
                    (u64::from(r.u32(body_at + 4)?) << 32) | u64::from(r.u32(body_at + 8)?);
                let caplen = r.u32(body_at + 12)? as usize;
                let orig_len = r.u32(body_at + 16)?;
                if 20 + caplen > body.len() {
                    return Err(ReadError::BadBlock(at));
                }
                let data = r.slice(body_at + 20, caplen)?;
                frames.push(Frame {
                    number: frames.len() + 1,
                    ts: units_to_duration(ts_units, iface.units_per_sec),
                    link: iface.link,
                    data,
                    orig_len,
                });
            }
            // Simple packet block: interface 0, no timestamp.
            3 => {
                let iface = *interfaces.first().ok_or(ReadError::UnknownInterface(0))?;
                let orig_len = r.u32(body_at)?;
                let mut caplen = orig_len as usize;
                if iface.snaplen != 0 {
                    caplen = caplen.min(iface.snaplen as usize);
                }
                if 4 + caplen > body.len() {
                    return Err(ReadError::BadBlock(at));
                }
                let data = r.slice(body_at + 4, caplen)?;
                frames.push(Frame {
                    number: frames.len() + 1,
                    ts: Duration::ZERO,
                    link: iface.link,
                    data,
                    orig_len,
                });
            }
            _ => {}
        }
        at += len;
    }
    Ok(())
}

/// Reads the `if_tsresol` option (code 9) from an IDB's options; the default is microseconds.
fn if_tsresol(r: &Reader<'_>, mut at: usize, end: usize) -> Result<u64, ReadError> {
    while at + 4 <= end {
        let code = r.u16(at)?;
        let len = usize::from(r.u16(at + 2)?);
        if code == 0 {
            break;
        }
        if code == 9 && len >= 1 {
            let v = r.slice(at + 4, 1)?[0];
            let exp = u32::from(v & 0x7F);
            let base: u64 = if v & 0x80 != 0 { 2 } else { 10 };
            return Ok(base.checked_pow(exp).unwrap_or(u64::MAX));
        }
        at += 4 + len.div_ceil(4) * 4;
    }
    Ok(1_000_000)
}

fn units_to_duration(units: u64, per_sec: u64) -> Duration {
    let per_sec = per_sec.max(1);
    let secs = units / per_sec;
    let rem = u128::from(units % per_sec);
    let nanos = rem * 1_000_000_000 / u128::from(per_sec);
    // `rem < per_sec`, so `nanos` is below one second's worth.
    Duration::new(secs, u32::try_from(nanos).unwrap_or(999_999_999))
}

/// Strips the link-layer header of `frame` and returns the IPv4 or IPv6 packet it carries.
pub fn ip_packet(link: LinkType, frame: &[u8]) -> Option<&[u8]> {
    match link {
        LinkType::ETHERNET => {
            let mut at = 12;
            loop {
                let t = frame.get(at..at + 2)?;
                let ethertype = u16::from_be_bytes([t[0], t[1]]);
                if ethertype == ETHERTYPE_VLAN || ethertype == ETHERTYPE_QINQ {
                    at += 4;
                    continue;
                }
                return is_ip_ethertype(ethertype).then(|| frame.get(at + 2..)).flatten();
            }
        }
        LinkType::RAW | LinkType::IPV4 | LinkType::IPV6 => Some(frame),
        LinkType::NULL => {
            // Address family in the capturing host's byte order: 2 = IPv4; 10, 24, 28, 30 = IPv6.
            let fam = frame.get(..4)?;
            let fam = u32::from_le_bytes([fam[0], fam[1], fam[2], fam[3]]);
            let fam = if fam > 0xFFFF { fam.swap_bytes() } else { fam };
            matches!(fam, 2 | 10 | 24 | 28 | 30).then(|| frame.get(4..)).flatten()
        }
        LinkType::LINUX_SLL => {
            let t = frame.get(14..16)?;
            is_ip_ethertype(u16::from_be_bytes([t[0], t[1]])).then(|| frame.get(16..)).flatten()
        }
        LinkType::LINUX_SLL2 => {
            let t = frame.get(0..2)?;
            is_ip_ethertype(u16::from_be_bytes([t[0], t[1]])).then(|| frame.get(20..)).flatten()
        }
        _ => None,
    }
}

fn is_ip_ethertype(t: u16) -> bool {
    t == ETHERTYPE_IPV4 || t == ETHERTYPE_IPV6
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::icrc::PseudoHeader;
    use crate::ip::parse_udp_datagram;

    const ROCE: [u8; 16] = [0x11, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 5, 0x1f, 0, 0, 1];

    #[test]
    fn written_frames_read_back_with_ip_and_udp_intact() {
        let src: SocketAddr = "127.0.0.2:50000".parse().unwrap();
        let dst: SocketAddr = "127.0.0.3:4791".parse().unwrap();
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_roce(Duration::new(1_700_000_000, 123_456_000), src, dst, &ROCE).unwrap();
        let v6: SocketAddr = "[::1]:4791".parse().unwrap();
        w.write_roce(Duration::from_secs(2), v6, v6, &ROCE).unwrap();
        let bytes = w.into_inner().unwrap();
        assert!(looks_like_capture(&bytes));
        let frames = read_frames(&bytes).unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].ts, Duration::new(1_700_000_000, 123_456_000));
        let d = parse_udp_datagram(frames[0].ip_packet().unwrap()).unwrap();
        assert_eq!((d.src(), d.dst(), d.payload), (src, dst, &ROCE[..]));
        // The IP header is the one the sender's ICRC covered.
        let sender = PseudoHeader::for_endpoints(src, dst).unwrap();
        let captured = PseudoHeader::from_headers(d.headers).unwrap();
        let icrc = |p: &PseudoHeader| crate::icrc::compute(p, &ROCE[..12]).unwrap();
        assert_eq!(icrc(&captured), icrc(&sender));
        let d6 = parse_udp_datagram(frames[1].ip_packet().unwrap()).unwrap();
        assert_eq!(d6.src(), v6);
        assert_ne!(d6.udp.checksum, 0, "IPv6 requires a UDP checksum");
    }

    #[test]
    fn reads_big_endian_nanosecond_pcap_and_pcapng() {
        // Big-endian, nanosecond pcap with one raw-IP frame.
        let mut be = Vec::new();
        be.extend_from_slice(&MAGIC_NANOS.to_be_bytes());
        be.extend_from_slice(&[0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 101]);
        be.extend_from_slice(&[0, 0, 0, 3, 0, 0, 0, 7, 0, 0, 0, 2, 0, 0, 0, 2, 0x45, 0x00]);
        let f = read_frames(&be).unwrap();
        assert_eq!(
            (f[0].ts, f[0].link, f[0].data),
            (Duration::new(3, 7), LinkType::RAW, &[0x45, 0][..])
        );

        // Little-endian pcapng: SHB, IDB (Ethernet, nanosecond if_tsresol), one EPB.
        let mut ng = Vec::new();
        let block = |ng: &mut Vec<u8>, t: u32, body: &[u8]| {
            let len = u32::try_from(12 + body.len()).unwrap();
            ng.extend_from_slice(&t.to_le_bytes());
            ng.extend_from_slice(&len.to_le_bytes());
            ng.extend_from_slice(body);
            ng.extend_from_slice(&len.to_le_bytes());
        };
        let mut shb = PCAPNG_BOM.to_le_bytes().to_vec();
        shb.extend_from_slice(&[1, 0, 0, 0]);
        shb.extend_from_slice(&u64::MAX.to_le_bytes());
        block(&mut ng, PCAPNG_SHB, &shb);
        let mut idb = vec![1, 0, 0, 0, 0, 0, 4, 0];
        idb.extend_from_slice(&[9, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0]);
        block(&mut ng, 1, &idb);
        let mut epb = vec![0, 0, 0, 0];
        epb.extend_from_slice(&0u32.to_le_bytes());
        epb.extend_from_slice(&2_500_000_000u32.to_le_bytes());
        epb.extend_from_slice(&3u32.to_le_bytes());
        epb.extend_from_slice(&3u32.to_le_bytes());
        epb.extend_from_slice(&[0xaa, 0xbb, 0xcc, 0]);
        block(&mut ng, 6, &epb);
        let f = read_frames(&ng).unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].ts, Duration::new(2, 500_000_000));
        assert_eq!(f[0].data, &[0xaa, 0xbb, 0xcc]);
    }

    #[test]
    fn truncated_and_foreign_files_are_errors() {
        assert_eq!(read_frames(b"hello world"), Err(ReadError::NotPcap));
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_frame(Duration::ZERO, &[1, 2, 3]).unwrap();
        let bytes = w.into_inner().unwrap();
        assert!(matches!(read_frames(&bytes[..bytes.len() - 1]), Err(ReadError::Truncated(_))));
    }

    #[test]
    fn strips_vlan_tags_and_cooked_headers() {
        let ip = [0x45u8, 0];
        let mut eth = vec![0u8; 12];
        eth.extend_from_slice(&[0x81, 0x00, 0x00, 0x05, 0x08, 0x00]);
        eth.extend_from_slice(&ip);
        assert_eq!(ip_packet(LinkType::ETHERNET, &eth), Some(&ip[..]));
        let mut sll2 = vec![0x86, 0xdd];
        sll2.resize(20, 0);
        sll2.extend_from_slice(&ip);
        assert_eq!(ip_packet(LinkType::LINUX_SLL2, &sll2), Some(&ip[..]));
        let mut arp = vec![0u8; 12];
        arp.extend_from_slice(&[0x08, 0x06, 0, 0]);
        assert_eq!(ip_packet(LinkType::ETHERNET, &arp), None);
    }
}
