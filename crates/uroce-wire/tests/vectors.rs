//! Packets from other RoCE implementations: captured from real stacks (a ConnectX-4 Lx, scapy's
//! tests, Linux rxe; `icrc-ipv4.txt`) and computed by scapy over IPv6 and IPv4 with every masked
//! field set (`icrc-scapy.txt`). Every one must verify, re-encoding it from its parsed fields
//! must give back its exact bytes, and corrupting any covered bit must fail the ICRC.

#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use std::path::Path;

use uroce_wire::icrc::{self, PseudoHeader};
use uroce_wire::ip::{self, parse_udp_datagram};
use uroce_wire::{Error, PacketRepr};

/// The project's copy of the shared vector file.
const VECTORS: &str = include_str!("data/icrc-ipv4.txt");
/// Packets whose ICRC scapy computed (see `data/gen-scapy-vectors.py`).
const SCAPY: &str = include_str!("data/icrc-scapy.txt");

fn vectors() -> Vec<(String, Vec<u8>)> {
    VECTORS
        .lines()
        .chain(SCAPY.lines())
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (name, hex) = l.split_once(char::is_whitespace).unwrap();
            let bytes = (0..hex.trim().len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex.trim()[i..i + 2], 16).unwrap())
                .collect();
            (name.to_string(), bytes)
        })
        .collect()
}

#[test]
fn vector_file_matches_the_shared_copy_when_present() {
    let shared =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vectors/icrc-ipv4.txt");
    match std::fs::read_to_string(&shared) {
        Ok(text) => assert_eq!(text, VECTORS, "tests/data/icrc-ipv4.txt is out of date"),
        Err(_) => eprintln!("note: {} not present; using the project's copy", shared.display()),
    }
}

#[test]
fn every_vector_verifies_and_parses() {
    let v = vectors();
    assert_eq!(v.len(), 8);
    assert_eq!(v.iter().filter(|(_, b)| b[0] >> 4 == 6).count(), 3, "IPv6 vectors");
    for (name, bytes) in &v {
        let d = parse_udp_datagram(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(d.udp.dst_port, uroce_wire::ROCE_V2_PORT, "{name}");
        let pseudo = PseudoHeader::from_headers(d.headers).unwrap();
        let parsed =
            PacketRepr::parse(d.payload, &pseudo).unwrap_or_else(|e| panic!("{name}: {e}"));
        println!("{name}: {}", parsed.repr);
    }
}

#[test]
fn rebuilding_each_vector_from_its_fields_reproduces_its_bytes() {
    for (name, bytes) in vectors() {
        let d = parse_udp_datagram(&bytes).unwrap();
        let pseudo = PseudoHeader::from_headers(d.headers).unwrap();
        let parsed = PacketRepr::parse(d.payload, &pseudo).unwrap();
        let roce_len = parsed.repr.buffer_len().unwrap();
        let ip_len = d.ip.header_len();
        let mut out = vec![0u8; ip_len + ip::UDP_HEADER_LEN + roce_len];
        d.ip.emit(&mut out, ip::UDP_HEADER_LEN + roce_len).unwrap();
        d.udp.emit(&mut out[ip_len..], roce_len).unwrap();
        // The ICRC is recomputed from the rebuilt IP/UDP headers, not copied.
        let rebuilt = PseudoHeader::from_headers(&out[..ip_len + ip::UDP_HEADER_LEN]).unwrap();
        let n = parsed.repr.emit(&rebuilt, &mut out[ip_len + ip::UDP_HEADER_LEN..]).unwrap();
        assert_eq!(n, roce_len);
        assert_eq!(hex(&out), hex(&bytes), "{name}");
    }
}

/// What flipping a bit of the IP packet must do to the ICRC check.
#[derive(Debug, PartialEq)]
enum Expect {
    /// A field the ICRC masks (IPv4 TOS, TTL, header checksum; IPv6 traffic class, flow label,
    /// hop limit; the UDP checksum; BTH byte 4): the ICRC still verifies.
    Masked,
    /// The IP version, IPv4 header length, or protocol/next header: no UDP packet left to check.
    Unreadable,
    /// Anything else: the ICRC fails.
    Mismatch,
}

fn expect(ipv6: bool, offset: usize, bit: u8) -> Expect {
    let (ip_len, masked, unreadable): (usize, &[usize], &[usize]) =
        if ipv6 { (40, &[1, 2, 3, 7], &[6]) } else { (20, &[1, 8, 10, 11], &[0, 9]) };
    let udp_checksum = [ip_len + 6, ip_len + 7];
    let bth_byte_4 = ip_len + 8 + 4;
    if ipv6 && offset == 0 {
        // Version nibble, then the top four bits of the traffic class.
        return if bit >= 4 { Expect::Unreadable } else { Expect::Masked };
    }
    if masked.contains(&offset) || udp_checksum.contains(&offset) || offset == bth_byte_4 {
        Expect::Masked
    } else if unreadable.contains(&offset) {
        Expect::Unreadable
    } else {
        Expect::Mismatch
    }
}

#[test]
fn one_flipped_bit_anywhere_fails_the_icrc() {
    for (name, bytes) in vectors() {
        let ipv6 = bytes[0] >> 4 == 6;
        for offset in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[offset] ^= 1 << bit;
                // Read the headers as a tool would (lengths unchecked) and check the ICRC over
                // exactly these bytes.
                let result = ip::parse_udp_datagram_lenient(&b)
                    .and_then(|d| icrc::verify(&PseudoHeader::from_headers(d.headers)?, d.payload));
                let at = format!("{name}: byte {offset} bit {bit} gave {result:?}");
                match expect(ipv6, offset, bit) {
                    Expect::Masked => assert_eq!(result, Ok(()), "{at}"),
                    Expect::Unreadable => assert!(result.is_err(), "{at}"),
                    Expect::Mismatch => {
                        assert!(matches!(result, Err(Error::IcrcMismatch { .. })), "{at}");
                    }
                }
            }
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
