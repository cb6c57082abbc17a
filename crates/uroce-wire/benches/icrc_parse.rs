//! ICRC verification plus parsing of a whole packet, beside a plain `crc32fast::hash` of the
//! same bytes: how close the receive checks come to the cost of the CRC alone. And a receiver's
//! check of a packet sealed for an IPv4 identification it does not see (what a connected socket
//! sends), solved for, or expected (the one after the flow's last).
//!
//! `cargo bench -p uroce-wire --bench icrc_parse`

#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use uroce_wire::icrc::{IdRecovery, Ipv4IdPolicy, PseudoHeader};
use uroce_wire::types::{Psn, Qpn};
use uroce_wire::{Opcode, PacketRepr, examples};

fn packet(payload_len: usize) -> (PseudoHeader, Vec<u8>) {
    let pseudo = PseudoHeader::for_endpoints(
        "127.0.0.2:49152".parse().unwrap(),
        "127.0.0.3:4791".parse().unwrap(),
    )
    .unwrap();
    let payload: Vec<u8> = (0..=255u8).cycle().take(payload_len).collect();
    let repr =
        examples::packet_for(Opcode::RC_SEND_ONLY, Qpn::from_masked(0x11), Psn::ZERO, &payload)
            .unwrap();
    let mut buf = vec![0u8; repr.buffer_len().unwrap()];
    repr.emit(&pseudo, &mut buf).unwrap();
    (pseudo, buf)
}

fn bench(c: &mut Criterion) {
    for payload_len in [64usize, 4096] {
        let (pseudo, buf) = packet(payload_len);
        let mut group = c.benchmark_group(format!("payload_{payload_len}B_packet_{}B", buf.len()));
        group.throughput(Throughput::Bytes(buf.len() as u64));
        group.bench_function("icrc_verify+parse", |b| {
            b.iter(|| {
                PacketRepr::parse(black_box(&buf), black_box(&pseudo)).unwrap().repr.payload.len()
            })
        });
        group.bench_function("parse_ignoring_icrc", |b| {
            b.iter(|| PacketRepr::parse_ignoring_icrc(black_box(&buf)).unwrap().repr.payload.len())
        });
        group.bench_function("icrc_verify", |b| {
            b.iter(|| uroce_wire::icrc::verify(black_box(&pseudo), black_box(&buf)).is_ok())
        });
        group.bench_function("crc32fast::hash", |b| b.iter(|| crc32fast::hash(black_box(&buf))));
        let id = 0x69c5;
        let mut sealed = buf.clone();
        let end = sealed.len() - uroce_wire::icrc::ICRC_LEN;
        let icrc = uroce_wire::icrc::compute(&pseudo.with_ipv4_id(id), &sealed[..end]).unwrap();
        sealed[end..].copy_from_slice(&uroce_wire::icrc::to_wire(icrc));
        let mut any = IdRecovery::new(Ipv4IdPolicy::Any);
        group.bench_function("icrc_verify_id_solved", |b| {
            b.iter(|| any.verify(black_box(&pseudo), black_box(&sealed)).unwrap())
        });
        group.bench_function("icrc_verify_id_expected", |b| {
            b.iter(|| any.verify_expecting(black_box(&pseudo), black_box(&sealed), id).unwrap())
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
