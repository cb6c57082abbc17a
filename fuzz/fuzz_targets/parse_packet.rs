//! The packet parser (and the steering probe's) on arbitrary bytes: it must never panic, its
//! display must never panic, and whatever it accepts must re-encode to bytes that parse back
//! to the same values.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uroce_wire::icrc::PseudoHeader;
use uroce_wire::{PacketRepr, ip};

fuzz_target!(|data: &[u8]| {
    // As a UDP payload.
    if let Ok(p) = PacketRepr::parse_ignoring_icrc(data) {
        let _ = p.repr.to_string();
        let pseudo = PseudoHeader::for_endpoints(
            "127.0.0.2:49152".parse().unwrap(),
            "127.0.0.3:4791".parse().unwrap(),
        )
        .unwrap();
        let mut buf = vec![0u8; p.repr.buffer_len().unwrap()];
        let n = p.repr.emit(&pseudo, &mut buf).unwrap();
        let again = PacketRepr::parse(&buf[..n], &pseudo).unwrap();
        assert_eq!(again.repr, p.repr);
    }
    // As an IP packet, the way `uroce decode` reads a hex line.
    if let Ok(d) = ip::parse_udp_datagram_lenient(data) {
        if let Ok(pseudo) = PseudoHeader::from_headers(d.headers) {
            let _ = uroce_wire::icrc::verify(&pseudo, d.payload);
        }
    }
    let _ = ip::parse_udp_datagram(data);
    // As a steering probe (what `uroce decode` tries first): whatever it accepts re-encodes
    // to the same bytes.
    if let Some(p) = uroce_wire::steer_probe::Probe::parse(data) {
        let _ = p.to_string();
        assert_eq!(&p.emit()[..], data);
    }
});
