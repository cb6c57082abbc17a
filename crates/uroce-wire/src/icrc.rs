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
//! which is why a sender must know the IP header the kernel will emit. uroce sends IPv4 with DF
//! (see [`crate::ip::IpRepr::for_addrs`]). From an unconnected socket Linux sets the
//! identification of a lone datagram to 0 and that of segment k of one GSO send to k; from a
//! connected one it takes the socket's counter (random from `connect`, one more per datagram,
//! the segments of a GSO send counting up from theirs), which the sender learns once and then
//! follows.
//!
//! # The identification a receiver cannot see
//!
//! A UDP socket never shows its reader the IP header, so a receiver does not know the
//! identification an ICRC was computed with. It does not need to: the CRC is affine, so the
//! ICRC for identification x differs from the one for 0 by a value that depends only on x and
//! the packet's length, and that difference can be undone (multiplied by x⁻⁸ⁿ modulo the CRC
//! polynomial, n the packet's length) and solved for x. [`IdRecovery`] finds the identification that makes a packet's ICRC right, if there is one,
//! and accepts it only if a sender of the kind allowed ([`Ipv4IdPolicy`]) could have used it.
//! A flow's identifications mostly count up by one, so a receiver that checks the one it
//! expects first ([`IdRecovery::verify_expecting`], [`RxFlow`]) hashes the packet once and
//! solves for nothing.
//!
//! The CRC itself is `crc32fast`, which uses carry-less multiplication (PCLMULQDQ on x86-64,
//! PMULL on aarch64) when the CPU has it.

use core::net::SocketAddr;

mod gf2;

use std::sync::LazyLock;

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
/// length fields changes the prefix CRC by the XOR of one precomputed value per byte of the
/// four length bytes (a table per IP version, shared by all headers); a packet then costs a
/// CRC over its own bytes only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PseudoHeader {
    /// CRC-32 of the prefix, with the length fields as captured, or zeroed if set per packet.
    prefix_crc: u32,
    /// Per-packet lengths: the layout whose [`LengthTable`] says how they move `prefix_crc`;
    /// `None` for headers as captured.
    lengths: Option<Layout>,
    /// IP header length (20..=60 for IPv4, 40 for IPv6).
    ip_len: usize,
    /// Built by [`PseudoHeader::for_endpoints`] for IPv4: the identification is 0 unless set
    /// with [`PseudoHeader::with_ipv4_id`], and a receiver may look for another
    /// ([`IdRecovery`]).
    ipv4_sender: bool,
    /// UDP destination port.
    dst_port: u16,
}

impl PseudoHeader {
    /// Headers of no flow, for a slot that holds none yet (its CRCs are of nothing).
    const NONE: Self =
        Self { prefix_crc: 0, lengths: None, ip_len: 0, ipv4_sender: false, dst_port: 0 };

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
        let layout = if ipv6 { Layout::V6 } else { Layout::V4 };
        let lengths = layout.lengths();
        if lengths.ip_len != ip_len {
            return Err(Error::BadIpHeader);
        }
        for o in lengths.offsets {
            buf[o] = 0;
        }
        let header_len = ip_len + UDP_HEADER_LEN;
        let (masked, _) = mask(&buf[..header_len])?;
        let prefix_crc = prefix_crc_of(&masked[..header_len]);
        Ok(Self {
            prefix_crc,
            lengths: Some(layout),
            ip_len,
            dst_port: dst.port(),
            ipv4_sender: !ipv6,
        })
    }

    /// The same headers with IPv4 identification `id` (segment `id` of a GSO send). IPv6 has no
    /// identification, and a captured header keeps the one it has: both are returned as they are.
    #[must_use]
    pub fn with_ipv4_id(mut self, id: u16) -> Self {
        if self.ipv4_sender {
            self.prefix_crc ^= ID_BASIS.delta(id);
        }
        self
    }

    /// `icrc`, an ICRC computed with these headers and IPv4 identification `from` over a packet
    /// whose `hashed` bytes (BTH through pad) follow them, made right for identification `to`
    /// without hashing the packet again: CRC-32 is linear, and the identification moves the
    /// register by an amount that the packet's bytes then carry along unchanged in kind (see
    /// [`IdRecovery`]). The packet is not read, so a change to it since the ICRC was computed
    /// (a corruption injected on purpose) still shows. For IPv6 `icrc` is returned as it is.
    pub fn ipv4_id_moved(&self, icrc: u32, hashed: usize, from: u16, to: u16) -> u32 {
        if !self.ipv4_sender || from == to {
            return icrc;
        }
        icrc ^ gf2::mul(ID_BASIS.delta(from ^ to), gf2::shift_factor(hashed))
    }

    /// The headers as captured: `headers` is the IP header (with any IPv4 options) followed by
    /// the UDP header, nothing else.
    pub fn from_headers(headers: &[u8]) -> Result<Self> {
        let (masked, ip_len) = mask(headers)?;
        let dst_port = u16::from_be_bytes([masked[ip_len + 2], masked[ip_len + 3]]);
        let prefix_crc = prefix_crc_of(&masked[..headers.len()]);
        Ok(Self { prefix_crc, lengths: None, ip_len, dst_port, ipv4_sender: false })
    }

    /// The pseudo-header of a captured datagram (IP header onwards), and its UDP payload.
    pub fn from_datagram(ip_packet: &[u8]) -> Result<(Self, &[u8])> {
        let d = parse_udp_datagram(ip_packet)?;
        Ok((Self::from_headers(d.headers)?, d.payload))
    }

    /// The CRC of the prefix for a RoCE packet of `roce_len` bytes (BTH through ICRC).
    fn crc_for(&self, roce_len: usize) -> u32 {
        let Some(layout) = self.lengths else {
            return self.prefix_crc;
        };
        let udp_len = UDP_HEADER_LEN + roce_len;
        // IPv4 counts its own header in the total length; IPv6's payload length does not.
        let ip_field =
            if self.ip_len == crate::ip::IPV6_HEADER_LEN { udp_len } else { self.ip_len + udp_len };
        let [ip_hi, ip_lo] = u16::try_from(ip_field).unwrap_or(u16::MAX).to_be_bytes();
        let [udp_hi, udp_lo] = u16::try_from(udp_len).unwrap_or(u16::MAX).to_be_bytes();
        let t = &layout.lengths().bytes;
        self.prefix_crc
            ^ t[0][usize::from(ip_hi)]
            ^ t[1][usize::from(ip_lo)]
            ^ t[2][usize::from(udp_hi)]
            ^ t[3][usize::from(udp_lo)]
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

/// How the length fields of uroce's headers of one IP version (no IPv4 options) move the
/// prefix CRC: the CRC is affine, so the prefix CRC for given lengths is the one for zero
/// lengths XOR one entry per length byte (a table lookup each, not a loop over their bits).
struct LengthTable {
    /// IP header length.
    ip_len: usize,
    /// Offsets in the headers of the IP length field (IPv4 total length, IPv6 payload length)
    /// and of the UDP length field, most significant byte first.
    offsets: [usize; 4],
    /// `bytes[k][v]`: the change when length byte `k` holds `v`.
    bytes: [[u32; 256]; 4],
}

impl LengthTable {
    fn new(ipv6: bool) -> Self {
        let ip_len = if ipv6 { crate::ip::IPV6_HEADER_LEN } else { crate::ip::IPV4_HEADER_LEN };
        let ip_len_field = if ipv6 { 4 } else { 2 };
        let offsets = [ip_len_field, ip_len_field + 1, ip_len + 4, ip_len + 5];
        let header_len = ip_len + UDP_HEADER_LEN;
        let bytes = offsets.map(|o| byte_moves(header_len, o));
        Self { ip_len, offsets, bytes }
    }
}

/// How each value of the byte at `offset` of `header_len` bytes of headers moves their prefix
/// CRC from the one with that byte 0. f(bit) = crc(e_bit) ^ crc(0…0) is the linear part of the
/// CRC for one bit set, and a value moves it by the XOR of its set bits' parts.
fn byte_moves(header_len: usize, offset: usize) -> [u32; 256] {
    let zero = prefix_crc_of(&[0u8; MAX_PSEUDO_LEN][..header_len]);
    let bit: [u32; 8] = core::array::from_fn(|b| {
        let mut e = [0u8; MAX_PSEUDO_LEN];
        e[offset] = 1 << b;
        prefix_crc_of(&e[..header_len]) ^ zero
    });
    core::array::from_fn(|v| (0..8).filter(|b| v >> b & 1 != 0).fold(0, |acc, b| acc ^ bit[b]))
}

static LENGTHS_V4: LazyLock<LengthTable> = LazyLock::new(|| LengthTable::new(false));
static LENGTHS_V6: LazyLock<LengthTable> = LazyLock::new(|| LengthTable::new(true));

/// The layout of uroce's own headers: IPv4 without options, or IPv6, then UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    V4,
    V6,
}

impl Layout {
    fn lengths(self) -> &'static LengthTable {
        match self {
            Self::V4 => &LENGTHS_V4,
            Self::V6 => &LENGTHS_V6,
        }
    }
}

/// The ICRC of a packet given as consecutive parts that together run from the first byte of the
/// BTH to the last pad byte (the ICRC itself excluded). The first part must hold the whole BTH.
pub fn compute_parts(pseudo: &PseudoHeader, parts: &[&[u8]]) -> Result<u32> {
    compute_iter(pseudo, parts.iter().copied())
}

/// [`compute_parts`] over parts an iterator yields (it is walked twice: once for the length
/// the pseudo-header covers, once for the CRC), for a caller that would otherwise collect
/// them into a vector per packet.
pub fn compute_iter<'a, I>(pseudo: &PseudoHeader, parts: I) -> Result<u32>
where
    I: Iterator<Item = &'a [u8]> + Clone,
{
    let mut rest = parts.clone();
    let Some(first) = rest.next() else {
        return Err(Error::Truncated);
    };
    if first.len() < bth::HEADER_LEN {
        return Err(Error::Truncated);
    }
    let roce_len: usize = parts.map(<[u8]>::len).sum::<usize>() + ICRC_LEN;
    // The CRC is fastest over few, long calls: the masked BTH and what follows it in the first
    // part are gathered in one stack buffer.
    let mut buf = [0u8; CONTIGUOUS];
    let take = first.len().min(CONTIGUOUS);
    buf[..take].copy_from_slice(&first[..take]);
    buf[bth::field::ECN] = 0xFF; // BTH byte 4: FECN, BECN, resv6a
    let mut h = crc32fast::Hasher::new_with_initial(pseudo.crc_for(roce_len));
    h.update(&buf[..take]);
    for p in core::iter::once(&first[take..]).chain(rest) {
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

/// What a receiver keeps of one flow (a peer's address and port to its own): the pseudo-header
/// of its packets and the IPv4 identification its next packet is expected to carry, checked
/// first ([`IdRecovery::verify_expecting`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxFlow {
    /// The headers of the flow's packets.
    pub pseudo: PseudoHeader,
    next_id: u16,
}

impl RxFlow {
    /// A flow whose packets come with the headers `pseudo` gives.
    pub const fn new(pseudo: PseudoHeader) -> Self {
        Self { pseudo, next_id: 0 }
    }

    /// Checks the ICRC of `roce`, the flow's next packet ([`IdRecovery::verify`]); returns the
    /// identification it was computed with, and expects the one after it next.
    pub fn verify(&mut self, icrc: &mut IdRecovery, roce: &[u8]) -> Result<u16> {
        let id = icrc.verify_expecting(&self.pseudo, roce, self.next_id)?;
        self.next_id = id.wrapping_add(1);
        Ok(id)
    }
}

/// The pseudo-headers of many flows, each computed once ([`PseudoHeader::for_endpoints`] hashes
/// a few dozen short buffers), with what a receiver expects of each ([`RxFlow`]). Bounded: past
/// `bound` flows the cache starts over, so a flood of sources costs recomputation, not memory.
#[derive(Debug, Clone)]
pub struct PseudoCache {
    flows: std::collections::HashMap<(SocketAddr, SocketAddr), RxFlow>,
    /// The flow asked for last: consecutive packets are mostly of one flow, and comparing two
    /// addresses costs less than hashing them.
    last: Option<(SocketAddr, SocketAddr)>,
    /// That flow, kept here while it is the last (its entry in `flows` is brought up to date
    /// when another flow is asked for); no flow's while `last` is `None`.
    last_flow: RxFlow,
    bound: usize,
}

impl PseudoCache {
    /// An empty cache of at most `bound` flows.
    pub fn new(bound: usize) -> Self {
        let none = RxFlow::new(PseudoHeader::NONE);
        Self { flows: std::collections::HashMap::new(), last: None, last_flow: none, bound }
    }

    /// The pseudo-header of packets from `src` to `dst` ([`PseudoHeader::for_endpoints`]).
    pub fn get(&mut self, src: SocketAddr, dst: SocketAddr) -> Result<PseudoHeader> {
        Ok(self.flow(src, dst)?.pseudo)
    }

    /// The flow from `src` to `dst`.
    pub fn flow(&mut self, src: SocketAddr, dst: SocketAddr) -> Result<&mut RxFlow> {
        let key = (src, dst);
        if self.last != Some(key) {
            let flow = match self.flows.get(&key) {
                Some(&flow) => flow,
                None => {
                    let flow = RxFlow::new(PseudoHeader::for_endpoints(src, dst)?);
                    if self.flows.len() >= self.bound {
                        self.flows.clear();
                    }
                    self.flows.insert(key, flow);
                    flow
                }
            };
            if let Some(left) = self.last.replace(key)
                && let Some(kept) = self.flows.get_mut(&left)
            {
                *kept = self.last_flow;
            }
            self.last_flow = flow;
        }
        Ok(&mut self.last_flow)
    }
}

/// Offset of the IPv4 identification in the masked headers (IP header, then UDP).
const IPV4_ID_OFFSET: usize = 4;

/// How the identification of a 20-byte IPv4 header moves the prefix CRC, and how to go back
/// from such a move to the identification.
struct IdBasis {
    /// The change in the prefix CRC for each value of the identification's high byte
    /// (`bytes[0]`) and low byte (`bytes[1]`): the change for an identification is the XOR of
    /// its two bytes' (the CRC is linear).
    bytes: [[u32; 256]; 2],
    /// The same vectors fully reduced: each row's pivot bit (`pivot`) is clear in every other
    /// row, and `ids` says which identification bits the row combines.
    rows: [(u32, u32, u16); 16],
}

impl IdBasis {
    fn new() -> Self {
        let header_len = crate::ip::IPV4_HEADER_LEN + UDP_HEADER_LEN;
        // Big-endian: bits 8..16 live in the first byte.
        let bytes = [IPV4_ID_OFFSET, IPV4_ID_OFFSET + 1].map(|o| byte_moves(header_len, o));
        // Each bit's move, least significant first: its byte's entry for that bit alone.
        let bits: [u32; 16] = core::array::from_fn(|b| bytes[usize::from(b < 8)][1 << (b % 8)]);
        // Gauss–Jordan elimination over GF(2). CRC-32 tells apart any two bursts of 32 bits
        // or less, so the 16 vectors are independent and every row finds a pivot.
        let mut rows: [(u32, u32, u16); 16] = core::array::from_fn(|i| (bits[i], 0, 1 << i));
        for i in 0..rows.len() {
            let pivot = 1u32 << (31 - rows[i].0.leading_zeros().min(31));
            rows[i].1 = pivot;
            let (vector, ids) = (rows[i].0, rows[i].2);
            for (j, row) in rows.iter_mut().enumerate() {
                if j != i && row.0 & pivot != 0 {
                    row.0 ^= vector;
                    row.2 ^= ids;
                }
            }
        }
        Self { bytes, rows }
    }

    /// The change in the prefix CRC for identification `id` instead of 0.
    fn delta(&self, id: u16) -> u32 {
        let [hi, lo] = id.to_be_bytes();
        self.bytes[0][usize::from(hi)] ^ self.bytes[1][usize::from(lo)]
    }

    /// The identification whose [`IdBasis::delta`] is `delta`, if one is.
    fn solve(&self, mut delta: u32) -> Option<u16> {
        let mut id = 0;
        for &(vector, pivot, ids) in &self.rows {
            if delta & pivot != 0 {
                delta ^= vector;
                id ^= ids;
            }
        }
        (delta == 0).then_some(id)
    }
}

static ID_BASIS: LazyLock<IdBasis> = LazyLock::new(IdBasis::new);

/// Which IPv4 identifications a receiver accepts an ICRC for, not seeing the IP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ipv4IdPolicy {
    /// 0 only: senders that never use GSO.
    Zero,
    /// What Linux puts on datagrams from an unconnected socket with DF set: 0 for a datagram
    /// sent alone, k for segment k of one GSO send (k < 128, `UDP_MAX_SEGMENTS` since Linux
    /// 6.x; 64 before). A corrupted packet then passes the ICRC with probability 2⁻²⁵ instead
    /// of 2⁻³² (the UDP checksum is a second check). uroce sends so when its receivers are
    /// set to this (all peers must be).
    LinuxGso,
    /// Any: what uroce sends by default (IPv4 from connected sockets, whose route the kernel
    /// keeps instead of looking it up for every datagram, numbered from a per-socket
    /// counter), Linux rxe (the kernel's IP ID generator) and RNICs. A corrupted packet passes
    /// the ICRC with probability 2⁻¹⁶; the UDP checksum, which Linux senders fill in and
    /// receiving kernels verify, is a second, independent check.
    #[default]
    Any,
}

impl Ipv4IdPolicy {
    /// Whether a packet's ICRC computed for `id` is accepted.
    pub const fn accepts(self, id: u16) -> bool {
        match self {
            Self::Zero => id == 0,
            Self::LinuxGso => id < 128,
            Self::Any => true,
        }
    }
}

/// Verifies ICRCs of packets received without their IP header, finding the IPv4 identification
/// each was computed with (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct IdRecovery {
    policy: Ipv4IdPolicy,
    /// The last few packet lengths seen and the factor that undoes their hashing.
    factors: [(usize, u32); 4],
    next: usize,
}

impl IdRecovery {
    /// A verifier accepting the identifications `policy` allows.
    pub fn new(policy: Ipv4IdPolicy) -> Self {
        Self { policy, factors: [(usize::MAX, 0); 4], next: 0 }
    }

    /// The policy it verifies with.
    pub fn policy(&self) -> Ipv4IdPolicy {
        self.policy
    }

    /// Checks the ICRC of `roce` (BTH through ICRC) received with the headers `pseudo` gives,
    /// the IPv4 identification unknown. Returns the identification the ICRC was computed with
    /// (0 for IPv6 and for headers as captured). [`Error::IcrcUnexpectedIpId`] if only one the
    /// policy refuses makes it right, [`Error::IcrcMismatch`] if none does.
    pub fn verify(&mut self, pseudo: &PseudoHeader, roce: &[u8]) -> Result<u16> {
        self.verify_expecting(pseudo, roce, 0)
    }

    /// [`IdRecovery::verify`], checking identification `expected` first: the packets of one
    /// flow mostly carry the last one's plus one (a connected socket's counter, the segments
    /// of one GSO send), and a right guess costs one CRC of the packet and no solving (59
    /// against 90 ns for a 64-byte SEND in the `icrc_parse` bench here). A wrong guess costs
    /// what no guess does: the CRC is linear, so the difference from the ICRC for `expected`
    /// solves for the identification's difference from `expected`. Ignored for IPv6 and for
    /// headers as captured (their identification is known).
    pub fn verify_expecting(
        &mut self,
        pseudo: &PseudoHeader,
        roce: &[u8],
        expected: u16,
    ) -> Result<u16> {
        if !pseudo.ipv4_sender {
            return verify(pseudo, roce).map(|()| 0);
        }
        let found = carried(roce)?;
        let hashed = roce.len() - ICRC_LEN;
        let computed = compute(&pseudo.with_ipv4_id(expected), &roce[..hashed])?;
        let id = if found == computed {
            expected
        } else {
            let delta = gf2::mul(found ^ computed, self.factor(hashed));
            let Some(moved) = ID_BASIS.solve(delta) else {
                // The ICRC the packet would carry were its identification 0.
                let computed = pseudo.ipv4_id_moved(computed, hashed, expected, 0);
                return Err(Error::IcrcMismatch { found, computed });
            };
            expected ^ moved
        };
        if self.policy.accepts(id) { Ok(id) } else { Err(Error::IcrcUnexpectedIpId(id)) }
    }

    /// x^(−8·`hashed`), from the cache when a packet of this length came recently.
    fn factor(&mut self, hashed: usize) -> u32 {
        if let Some(&(_, f)) = self.factors.iter().find(|(n, _)| *n == hashed) {
            return f;
        }
        let f = gf2::unshift_factor(hashed);
        self.factors[self.next] = (hashed, f);
        self.next = (self.next + 1) % self.factors.len();
        f
    }
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

    /// Moving an ICRC from one identification to another gives what hashing the packet again
    /// with the other would, for any length; IPv6 has no identification.
    #[test]
    fn an_icrc_moved_to_another_identification_is_the_one_computed_for_it() {
        let src: SocketAddr = "10.1.16.61:50208".parse().unwrap();
        let dst: SocketAddr = "10.1.16.62:4791".parse().unwrap();
        let base = PseudoHeader::for_endpoints(src, dst).unwrap();
        for len in [12usize, 28, 100, 1040, 4112] {
            let body: Vec<u8> = (0..len).map(|i| u8::try_from(i % 251).unwrap() ^ 0x5A).collect();
            for (from, to) in [(0u16, 1u16), (0, 0xBEEF), (17, 4), (0xFFFF, 0)] {
                let at = |id| compute(&base.with_ipv4_id(id), &body).unwrap();
                assert_eq!(
                    base.ipv4_id_moved(at(from), len, from, to),
                    at(to),
                    "{len} {from} {to}"
                );
            }
        }
        let v6 = PseudoHeader::for_endpoints(
            "[fd00::1]:1".parse().unwrap(),
            "[fd00::2]:4791".parse().unwrap(),
        )
        .unwrap();
        assert_eq!(v6.ipv4_id_moved(0x1234, 40, 0, 9), 0x1234);
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

    /// A packet from 10.1.16.61:50208 to 10.1.16.62:4791 with its ICRC computed for IPv4
    /// identification `id` by way of a header as Linux would put on the wire, and the
    /// pseudo-header a receiver that sees no IP header builds.
    fn sent_with_id(id: u16, payload_len: usize) -> (PseudoHeader, Vec<u8>) {
        use crate::ip::{IpRepr, Ipv4Repr};
        let src: SocketAddr = "10.1.16.61:50208".parse().unwrap();
        let dst: SocketAddr = "10.1.16.62:4791".parse().unwrap();
        let mut roce = vec![0x04, 0, 0xFF, 0xFF, 0, 0, 0, 0x21, 0, 0x12, 0x34, 0x56];
        roce.extend((0..payload_len).map(|i| u8::try_from((i * 7 + 3) % 256).unwrap()));
        roce.extend([0; ICRC_LEN]);
        let IpRepr::V4(v4) = IpRepr::for_addrs(src.ip(), dst.ip()).unwrap() else { panic!() };
        let ip = IpRepr::V4(Ipv4Repr { ident: id, ..v4 });
        let mut headers = [0u8; 28];
        ip.emit(&mut headers, UDP_HEADER_LEN + roce.len()).unwrap();
        UdpRepr { src_port: src.port(), dst_port: dst.port(), checksum: 0 }
            .emit(&mut headers[20..], roce.len())
            .unwrap();
        let on_wire = PseudoHeader::from_headers(&headers).unwrap();
        let end = roce.len() - ICRC_LEN;
        let crc = compute(&on_wire, &roce[..end]).unwrap();
        roce[end..].copy_from_slice(&to_wire(crc));
        (PseudoHeader::for_endpoints(src, dst).unwrap(), roce)
    }

    #[test]
    fn a_sender_setting_the_id_computes_what_the_wire_header_gives() {
        for id in [0u16, 1, 2, 14, 127, 0x69c5, u16::MAX] {
            let (pseudo, roce) = sent_with_id(id, 100);
            let end = roce.len() - ICRC_LEN;
            let crc = compute(&pseudo.with_ipv4_id(id), &roce[..end]).unwrap();
            assert_eq!(to_wire(crc), roce[end..], "id {id}");
            if id != 0 {
                assert!(verify(&pseudo, &roce).is_err(), "id {id} is covered");
            }
        }
    }

    #[test]
    fn a_receiver_recovers_the_id_and_applies_its_policy() {
        let mut linux = IdRecovery::new(Ipv4IdPolicy::LinuxGso);
        let mut any = IdRecovery::new(Ipv4IdPolicy::Any);
        let mut zero = IdRecovery::new(Ipv4IdPolicy::Zero);
        for len in [0usize, 4, 1024, 4096, 9000] {
            for id in [0u16, 1, 5, 63, 127] {
                let (pseudo, roce) = sent_with_id(id, len);
                assert_eq!(linux.verify(&pseudo, &roce), Ok(id), "len {len} id {id}");
                assert_eq!(any.verify(&pseudo, &roce), Ok(id));
                assert_eq!(zero.verify(&pseudo, &roce).is_ok(), id == 0);
            }
            for id in [128u16, 200, 0x69c5, u16::MAX] {
                let (pseudo, roce) = sent_with_id(id, len);
                assert_eq!(linux.verify(&pseudo, &roce), Err(Error::IcrcUnexpectedIpId(id)));
                assert_eq!(any.verify(&pseudo, &roce), Ok(id));
            }
        }
    }

    #[test]
    fn rxe_packets_with_their_own_ids_verify_under_the_any_policy() {
        let pkt = hex(
            "4500003069c5400040119c7b0a01103d0a01103ec42012b7001c00001100ffff000000210059dfd71f000001e61d8892",
        );
        let (_, roce) = PseudoHeader::from_datagram(&pkt).unwrap();
        let src: SocketAddr = "10.1.16.61:50208".parse().unwrap();
        let dst: SocketAddr = "10.1.16.62:4791".parse().unwrap();
        let blind = PseudoHeader::for_endpoints(src, dst).unwrap();
        assert_eq!(IdRecovery::new(Ipv4IdPolicy::Any).verify(&blind, roce), Ok(0x69c5));
        assert_eq!(
            IdRecovery::new(Ipv4IdPolicy::LinuxGso).verify(&blind, roce),
            Err(Error::IcrcUnexpectedIpId(0x69c5))
        );
    }

    #[test]
    fn corruption_is_not_mistaken_for_an_id() {
        let mut any = IdRecovery::new(Ipv4IdPolicy::Any);
        let (pseudo, roce) = sent_with_id(3, 4096);
        let mut refused = 0;
        for at in (0..roce.len()).step_by(97) {
            for flip in [1u8, 0x80, 0x11] {
                let mut bad = roce.clone();
                bad[at] ^= flip;
                refused += usize::from(matches!(
                    any.verify(&pseudo, &bad),
                    Err(Error::IcrcMismatch { .. })
                ));
            }
        }
        // Under "any ID", 2⁻¹⁶ of random corruptions still pass; none of these do.
        assert_eq!(refused, 3 * roce.len().div_ceil(97));
    }

    /// The headers as the kernel would emit them for a UDP payload of `roce_len` bytes from
    /// `src` to `dst` with IPv4 identification `id`, read back as captured.
    fn captured(src: SocketAddr, dst: SocketAddr, id: u16, roce_len: usize) -> PseudoHeader {
        use crate::ip::{IpRepr, Ipv4Repr};
        let ip = match IpRepr::for_addrs(src.ip(), dst.ip()).unwrap() {
            IpRepr::V4(v4) => IpRepr::V4(Ipv4Repr { ident: id, ..v4 }),
            v6 => v6,
        };
        let mut headers = [0u8; MAX_PSEUDO_LEN];
        let ip_len = ip.header_len();
        ip.emit(&mut headers, UDP_HEADER_LEN + roce_len).unwrap();
        UdpRepr { src_port: src.port(), dst_port: dst.port(), checksum: 0 }
            .emit(&mut headers[ip_len..], roce_len)
            .unwrap();
        PseudoHeader::from_headers(&headers[..ip_len + UDP_HEADER_LEN]).unwrap()
    }

    /// The prefix CRC a pseudo-header computes for a packet's lengths (looked up per length
    /// byte) is the CRC of the headers that carry those lengths, for IPv4 and IPv6, at lengths
    /// that set every bit of the length fields.
    #[test]
    fn every_length_gives_the_prefix_crc_of_its_headers() {
        let v4 = ("10.1.16.61:50208".parse().unwrap(), "10.1.16.62:4791".parse().unwrap());
        let v6 = ("[fd00::1]:50208".parse().unwrap(), "[fd00::2]:4791".parse().unwrap());
        for (src, dst) in [v4, v6] {
            let pseudo = PseudoHeader::for_endpoints(src, dst).unwrap();
            let lens = (0..=16).map(|b| (1usize << b) - 1).chain([256, 4112, 4136, 9000, 65_000]);
            for roce_len in lens.filter(|&l| l <= 65_000) {
                let want = captured(src, dst, 0, roce_len).crc_for(roce_len);
                assert_eq!(pseudo.crc_for(roce_len), want, "{src} -> {dst}, {roce_len} bytes");
            }
        }
    }

    /// Every IPv4 identification moves the prefix CRC as the header that carries it does.
    #[test]
    fn every_identification_gives_the_prefix_crc_of_its_header() {
        let src: SocketAddr = "10.1.16.61:50208".parse().unwrap();
        let dst: SocketAddr = "10.1.16.62:4791".parse().unwrap();
        let pseudo = PseudoHeader::for_endpoints(src, dst).unwrap();
        for id in 0..=u16::MAX {
            let want = captured(src, dst, id, 100).crc_for(100);
            assert_eq!(pseudo.with_ipv4_id(id).crc_for(100), want, "id {id}");
        }
    }

    /// Whatever identification is expected, the one a packet was sealed for is found, the
    /// policy applied to it, and a corruption refused with the ICRC for identification 0
    /// named (as without a guess).
    #[test]
    fn an_expected_identification_changes_no_answer() {
        let mut linux = IdRecovery::new(Ipv4IdPolicy::LinuxGso);
        let mut any = IdRecovery::new(Ipv4IdPolicy::Any);
        for id in [0u16, 1, 127, 128, 0x69c5, u16::MAX] {
            let (pseudo, roce) = sent_with_id(id, 64);
            for expected in [id, id.wrapping_add(1), id.wrapping_sub(1), 0, 0x8000, !id] {
                let want = any.verify(&pseudo, &roce);
                assert_eq!(want, Ok(id));
                assert_eq!(any.verify_expecting(&pseudo, &roce, expected), want, "{id} {expected}");
                assert_eq!(
                    linux.verify_expecting(&pseudo, &roce, expected),
                    linux.verify(&pseudo, &roce)
                );
                let mut bad = roce.clone();
                bad[20] ^= 0x40;
                let refused = any.verify(&pseudo, &bad);
                assert!(matches!(refused, Err(Error::IcrcMismatch { .. })));
                assert_eq!(any.verify_expecting(&pseudo, &bad, expected), refused);
            }
        }
    }

    /// A flow expects the identification after its last packet's; a jump (datagrams lost, a
    /// restarted sender) is found all the same, and the flow follows it.
    #[test]
    fn a_flow_expects_the_next_identification() {
        let mut any = IdRecovery::new(Ipv4IdPolicy::Any);
        let (pseudo, _) = sent_with_id(0, 64);
        let mut flow = RxFlow::new(pseudo);
        for id in [0xfffeu16, 0xffff, 0, 1, 900, 901, 5] {
            let (_, roce) = sent_with_id(id, 64);
            assert_eq!(flow.verify(&mut any, &roce), Ok(id));
            assert_eq!(flow.next_id, id.wrapping_add(1));
        }
    }

    /// Flows asked for in turn keep what each expects: the last one's expectation goes back
    /// to the table when another flow is asked for.
    #[test]
    fn the_cache_keeps_each_flows_expected_identification() {
        let a: SocketAddr = "10.1.16.61:50208".parse().unwrap();
        let b: SocketAddr = "10.1.16.62:4791".parse().unwrap();
        let c: SocketAddr = "10.1.16.63:50208".parse().unwrap();
        let mut cache = PseudoCache::new(8);
        let mut any = IdRecovery::new(Ipv4IdPolicy::Any);
        let (_, roce) = sent_with_id(40, 64);
        assert_eq!(cache.flow(a, b).unwrap().verify(&mut any, &roce), Ok(40));
        assert_eq!(cache.flow(c, b).unwrap().next_id, 0);
        assert_eq!(cache.flow(a, b).unwrap().next_id, 41);
        assert_eq!(cache.get(a, b).unwrap(), PseudoHeader::for_endpoints(a, b).unwrap());
    }

    /// Flows asked for in turn, each again right after another: every answer is the flow's
    /// own pseudo-header (the last one asked for is kept aside, and must not answer for
    /// another flow).
    #[test]
    fn the_cache_answers_every_flow_with_its_own_pseudo_header() {
        let a: SocketAddr = "10.0.0.1:49152".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:4791".parse().unwrap();
        let c: SocketAddr = "[fd00::1]:4791".parse().unwrap();
        let d: SocketAddr = "[fd00::2]:50000".parse().unwrap();
        let mut cache = PseudoCache::new(2);
        for (src, dst) in [(a, b), (a, b), (b, a), (a, b), (d, c), (c, d), (d, c), (b, a)] {
            let want = PseudoHeader::for_endpoints(src, dst).unwrap();
            assert_eq!(cache.get(src, dst).unwrap(), want, "{src} -> {dst}");
        }
    }

    #[test]
    fn ipv6_and_captured_headers_are_not_searched() {
        let (pseudo, roce) = sent_with_id(0, 64);
        let src: SocketAddr = "[::1]:50208".parse().unwrap();
        let dst: SocketAddr = "[::1]:4791".parse().unwrap();
        let v6 = PseudoHeader::for_endpoints(src, dst).unwrap();
        assert_eq!(v6.with_ipv4_id(9), v6);
        let mut any = IdRecovery::new(Ipv4IdPolicy::Any);
        assert!(matches!(any.verify(&v6, &roce), Err(Error::IcrcMismatch { .. })));
        assert_eq!(any.verify(&pseudo, &roce), Ok(0));
    }
}
