//! Property tests: `parse(emit(x)) == x` for random valid packets of every opcode, and no panic
//! on arbitrary or mutated input (the property-based half of the fuzzing; `fuzz/` has the
//! coverage-guided half).

#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use proptest::prelude::*;
use uroce_wire::aeth::{self, Syndrome};
use uroce_wire::icrc::PseudoHeader;
use uroce_wire::opcode::{ExtHeader, OpFlags};
use uroce_wire::types::{Msn, PKey, Psn, QKey, Qpn, RKey};
use uroce_wire::{
    ExtHeaders, Opcode, PacketRepr, atomic_ack_eth, atomic_eth, bth, deth, ieth, immdt, ip, pcap,
    reth, xrceth,
};

fn known_opcode() -> impl Strategy<Value = Opcode> {
    let all: Vec<Opcode> = Opcode::all_known().collect();
    proptest::sample::select(all)
}

fn endpoints() -> impl Strategy<Value = (SocketAddr, SocketAddr)> {
    prop_oneof![
        (any::<u32>(), any::<u32>(), any::<u16>()).prop_map(|(a, b, p)| {
            let a = SocketAddr::new(IpAddr::V4(Ipv4Addr::from(a)), p);
            let b = SocketAddr::new(IpAddr::V4(Ipv4Addr::from(b)), 4791);
            (a, b)
        }),
        (any::<u128>(), any::<u128>(), any::<u16>()).prop_map(|(a, b, p)| {
            let a = SocketAddr::new(IpAddr::V6(Ipv6Addr::from(a)), p);
            let b = SocketAddr::new(IpAddr::V6(Ipv6Addr::from(b)), 4791);
            (a, b)
        }),
    ]
}

#[derive(Debug, Clone)]
struct Fields {
    bth_bits: (bool, bool, bool, bool, bool, u16, u32, u32),
    va: u64,
    rkey: u32,
    len: u32,
    syndrome: u8,
    msn: u32,
    swap: u64,
    compare: u64,
    orig: u64,
    imm: [u8; 4],
    qkey: u32,
    sqp: u32,
}

fn fields() -> impl Strategy<Value = Fields> {
    (
        any::<(bool, bool, bool, bool, bool, u16, u32, u32)>(),
        any::<(u64, u32, u32, u8, u32)>(),
        any::<(u64, u64, u64, [u8; 4], u32, u32)>(),
    )
        .prop_map(
            |(bth_bits, (va, rkey, len, syndrome, msn), (swap, compare, orig, imm, qkey, sqp))| {
                Fields {
                    bth_bits,
                    va,
                    rkey,
                    len,
                    syndrome,
                    msn,
                    swap,
                    compare,
                    orig,
                    imm,
                    qkey,
                    sqp,
                }
            },
        )
}

fn build<'a>(op: Opcode, f: &Fields, payload: &'a [u8]) -> PacketRepr<'a> {
    let info = op.info().unwrap();
    let (se, mig, fecn, becn, ackreq, pkey, dqp, psn) = f.bth_bits;
    let mut b = bth::Repr::new(op, Qpn::from_masked(dqp), Psn::from_masked(psn));
    (b.solicited, b.mig_req, b.fecn, b.becn, b.ack_req, b.pkey) =
        (se, mig, fecn, becn, ackreq, PKey(pkey));
    let mut ext = ExtHeaders::default();
    for &h in info.headers {
        match h {
            ExtHeader::Reth => {
                ext.reth = Some(reth::Repr { va: f.va, rkey: RKey(f.rkey), dma_len: f.len })
            }
            ExtHeader::Aeth => {
                ext.aeth = Some(aeth::Repr {
                    syndrome: Syndrome::from_byte(f.syndrome),
                    msn: Msn::from_masked(f.msn),
                });
            }
            ExtHeader::AtomicEth => {
                ext.atomic_eth = Some(atomic_eth::Repr {
                    va: f.va,
                    rkey: RKey(f.rkey),
                    swap_add: f.swap,
                    compare: f.compare,
                });
            }
            ExtHeader::AtomicAckEth => {
                ext.atomic_ack_eth = Some(atomic_ack_eth::Repr { orig: f.orig })
            }
            ExtHeader::ImmDt => ext.immdt = Some(immdt::Repr { imm: f.imm }),
            ExtHeader::Ieth => ext.ieth = Some(ieth::Repr { rkey: RKey(f.rkey) }),
            ExtHeader::Deth => {
                ext.deth = Some(deth::Repr { qkey: QKey(f.qkey), src_qp: Qpn::from_masked(f.sqp) })
            }
            // The SRQ number is 24 bits; the property compares what parses back.
            ExtHeader::Xrceth => ext.xrceth = Some(xrceth::Repr { srqn: f.sqp & 0xFF_FFFF }),
            ExtHeader::CnpReserved => {}
        }
    }
    let payload = if info.has(OpFlags::PAYLOAD) { payload } else { &[] };
    PacketRepr::new(b, ext, payload)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn parse_of_emit_is_identity(
        op in known_opcode(),
        f in fields(),
        payload in proptest::collection::vec(any::<u8>(), 0..600),
        (src, dst) in endpoints(),
    ) {
        let repr = build(op, &f, &payload);
        let pseudo = PseudoHeader::for_endpoints(src, dst).unwrap();
        let mut buf = vec![0u8; repr.buffer_len().unwrap()];
        let n = repr.emit(&pseudo, &mut buf).unwrap();
        prop_assert_eq!(n, buf.len());
        prop_assert_eq!(n % 4, 0);
        let parsed = PacketRepr::parse(&buf, &pseudo).unwrap();
        prop_assert_eq!(parsed.repr, repr);

        // The same packet framed into a capture reads back and verifies against the captured
        // IP header: the sender's ICRC covers exactly what goes on the wire.
        let mut frame = Vec::new();
        pcap::ethernet_frame(src, dst, &buf, &mut frame).unwrap();
        let d = ip::parse_udp_datagram(&frame[14..]).unwrap();
        let captured = PseudoHeader::from_headers(d.headers).unwrap();
        prop_assert_eq!(PacketRepr::parse(d.payload, &captured).unwrap().repr, repr);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = PacketRepr::parse_ignoring_icrc(&bytes).map(|p| p.repr.to_string());
        let _ = ip::parse_udp_datagram(&bytes);
        let _ = ip::parse_udp_datagram_lenient(&bytes);
        let _ = PseudoHeader::from_headers(&bytes);
        let _ = pcap::read_frames(&bytes);
    }

    #[test]
    fn mutated_packets_never_panic_and_reparse_stably(
        op in known_opcode(),
        f in fields(),
        payload in proptest::collection::vec(any::<u8>(), 0..64),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let repr = build(op, &f, &payload);
        let pseudo = PseudoHeader::for_endpoints(
            "127.0.0.2:1".parse().unwrap(), "127.0.0.3:4791".parse().unwrap()).unwrap();
        let mut buf = vec![0u8; repr.buffer_len().unwrap()];
        repr.emit(&pseudo, &mut buf).unwrap();
        for (i, v) in edits {
            let i = i.index(buf.len());
            buf[i] = v;
        }
        let buf = &buf[..buf.len() - cut.index(buf.len() / 4)];
        if let Ok(p) = PacketRepr::parse_ignoring_icrc(buf) {
            // Whatever parsed re-encodes to something that parses to the same values.
            let mut again = vec![0u8; p.repr.buffer_len().unwrap()];
            p.repr.emit(&pseudo, &mut again).unwrap();
            prop_assert_eq!(PacketRepr::parse(&again, &pseudo).unwrap().repr, p.repr);
        }
    }
}
