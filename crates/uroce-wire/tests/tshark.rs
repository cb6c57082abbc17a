//! Wireshark is the judge of our encoding: one packet of every opcode of every transport,
//! over IPv4 and IPv6, written to a pcap that tshark must decode to exactly the opcode,
//! destination QP, PSN and extension header fields we encoded, with nothing malformed.
//!
//! Needs `tshark` (Debian package `tshark`). Skipped with a message where it is missing, except
//! under CI (`CI=true`), where a missing tool is a failure.

#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use std::process::Command;
use std::time::Duration;

use uroce_testkit::tshark_available;
use uroce_wire::icrc::PseudoHeader;
use uroce_wire::pcap::PcapWriter;
use uroce_wire::types::{Psn, Qpn};
use uroce_wire::{ExtHeaders, Opcode, examples};

/// One expected row: what we encoded, as tshark should print it.
#[derive(Debug, PartialEq, Eq)]
struct Row {
    opcode: u32,
    dest_qp: u32,
    psn: u32,
    extra: Vec<String>,
}

/// Extra fields asked of tshark, beside opcode, destination QP and PSN: every extension
/// header's fields. Integers are compared as numbers, byte fields as hex.
const EXTRA_FIELDS: [&str; 13] = [
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.msn",
    "infiniband.atomiceth.swapdt",
    "infiniband.atomiceth.cmpdt",
    "infiniband.atomicacketh.origremdt",
    "infiniband.immdt",
    "infiniband.ieth",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.invariant.crc",
];

/// Byte fields (printed by tshark as hex strings rather than numbers).
const BYTE_FIELDS: [&str; 2] = ["infiniband.immdt", "infiniband.ieth"];

fn expected_extra(e: &ExtHeaders, icrc: Option<u32>) -> Vec<String> {
    let n = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
    let hex = |v: Option<[u8; 4]>| {
        v.map(|b| b.iter().map(|x| format!("{x:02x}")).collect()).unwrap_or_default()
    };
    vec![
        // Wireshark files the AtomicETH's address and key under the RETH's field names.
        n(e.reth.map(|r| r.va).or(e.atomic_eth.map(|a| a.va))),
        n(e.reth.map(|r| r.rkey).or(e.atomic_eth.map(|a| a.rkey)).map(|k| u64::from(k.0))),
        n(e.reth.map(|r| u64::from(r.dma_len))),
        n(e.aeth.map(|a| u64::from(a.syndrome.to_byte()))),
        n(e.aeth.map(|a| u64::from(a.msn.get()))),
        n(e.atomic_eth.map(|a| a.swap_add)),
        n(e.atomic_eth.map(|a| a.compare)),
        n(e.atomic_ack_eth.map(|a| a.orig)),
        hex(e.immdt.map(|i| i.imm)),
        hex(e.ieth.map(|i| i.rkey.0.to_be_bytes())),
        n(e.deth.map(|d| u64::from(d.qkey.0))),
        n(e.deth.map(|d| u64::from(d.src_qp.get()))),
        // Wireshark reads the ICRC as a big-endian integer; we carry it least significant byte
        // first, so it shows byte-swapped.
        n(icrc.map(|c| u64::from(c.swap_bytes()))),
    ]
}

fn write_capture(path: &std::path::Path) -> Vec<Row> {
    let mut w = PcapWriter::new(std::fs::File::create(path).unwrap()).unwrap();
    let mut rows = Vec::new();
    let payload: Vec<u8> = (0u8..=255).cycle().take(300).collect();
    let pairs = [("127.0.0.2:49153", "127.0.0.3:4791"), ("[fd00::2]:49153", "[fd00::3]:4791")];
    for (i, op) in Opcode::all_known().chain(Opcode::all_known()).enumerate() {
        let (src, dst) = pairs[i / Opcode::all_known().count()];
        let (src, dst) = (src.parse().unwrap(), dst.parse().unwrap());
        let dqp = Qpn::from_masked(0x10_0000 + u32::try_from(i).unwrap() * 0x111);
        let psn = Psn::from_masked(0xFF_FFF0 + u32::try_from(i).unwrap() * 7919);
        let repr = examples::packet_for(op, dqp, psn, &payload[..(i * 13) % 300]).unwrap();
        let pseudo = PseudoHeader::for_endpoints(src, dst).unwrap();
        let mut buf = vec![0u8; repr.buffer_len().unwrap()];
        repr.emit(&pseudo, &mut buf).unwrap();
        w.write_roce(Duration::from_millis(i as u64), src, dst, &buf).unwrap();
        // Wireshark does not know the CNP opcode: it shows the BTH and then the reserved
        // block and ICRC as "vendor specific data", so there is no ICRC field to compare.
        let icrc = (op != Opcode::CNP).then(|| uroce_wire::icrc::carried(&buf).unwrap());
        // Wireshark 4.0 names the XRC opcodes but dissects nothing after their BTH (it has no
        // XRCETH), and does not know IBA 1.5's atomic write: it shows the rest as vendor
        // data, so only the BTH is compared; their layouts are checked against the RC ones
        // they extend (opcode.rs).
        let bth_only =
            op.transport() == uroce_wire::Transport::Xrc || op == Opcode::RC_ATOMIC_WRITE;
        let extra = if bth_only {
            vec![String::new(); EXTRA_FIELDS.len()]
        } else {
            expected_extra(&repr.ext, icrc)
        };
        rows.push(Row { opcode: u32::from(op.0), dest_qp: dqp.get(), psn: psn.get(), extra });
    }
    w.into_inner().unwrap();
    rows
}

fn number(s: &str) -> u32 {
    match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).unwrap(),
        None => s.parse().unwrap_or_else(|_| panic!("not a number: {s:?}")),
    }
}

fn normalise(field: &str, value: &str) -> String {
    if value.is_empty() {
        return String::new();
    }
    if BYTE_FIELDS.contains(&field) {
        // The ImmDt header and its one field share an abbreviation, so tshark prints the
        // value twice ("cafef00d,cafef00d"); every occurrence must agree.
        let mut values = value.split(',').map(|v| v.replace(':', "").to_lowercase());
        let first = values.next().unwrap_or_default();
        assert!(values.all(|v| v == first), "{field}: differing values {value:?}");
        return first;
    }
    // tshark prints integers in the field's declared base (BASE_DEC_HEX as "n (0x..)").
    let value = value.split_whitespace().next().unwrap_or(value);
    let n: u64 = match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).unwrap(),
        None => value.parse().unwrap_or_else(|_| panic!("{field}: not a number: {value:?}")),
    };
    n.to_string()
}

#[test]
fn tshark_decodes_every_opcode_as_encoded() {
    if !tshark_available() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("uroce-tshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("every-opcode.pcap");
    let expected = write_capture(&path);

    let mut args = vec!["-r", path.to_str().unwrap(), "-T", "fields", "-E", "separator=/t"];
    for f in ["infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn"]
        .iter()
        .chain(EXTRA_FIELDS.iter())
    {
        args.extend(["-e", f]);
    }
    let out = Command::new("tshark").args(&args).output().unwrap();
    assert!(out.status.success(), "tshark failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let seen: Vec<Row> = text
        .lines()
        .map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            assert_eq!(cols.len(), 3 + EXTRA_FIELDS.len(), "row {l:?}");
            Row {
                opcode: number(cols[0]),
                dest_qp: number(cols[1]),
                psn: number(cols[2]),
                extra: EXTRA_FIELDS.iter().zip(&cols[3..]).map(|(f, v)| normalise(f, v)).collect(),
            }
        })
        .collect();
    assert_eq!(seen.len(), expected.len(), "tshark saw a different number of RoCE packets");
    for (s, e) in seen.iter().zip(&expected) {
        assert_eq!(s, e, "opcode {:#04x}", e.opcode);
    }

    let malformed = Command::new("tshark")
        .args([
            "-r",
            path.to_str().unwrap(),
            "-Y",
            "_ws.malformed || _ws.expert.severity >= \"error\"",
        ])
        .output()
        .unwrap();
    assert!(malformed.status.success());
    let text = String::from_utf8_lossy(&malformed.stdout);
    assert!(text.trim().is_empty(), "tshark found malformed packets:\n{text}");
    if std::env::var_os("UROCE_KEEP").is_none() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn tshark_finds_nothing_malformed_in_the_sample_capture() {
    if !tshark_available() {
        return;
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../samples/rc-conversation.pcap");
    let out = Command::new("tshark")
        .args(["-r", path, "-T", "fields", "-e", "infiniband.bth.opcode", "-e", "_ws.malformed"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let expected = examples::sample_conversation();
    assert_eq!(text.lines().count(), expected.len());
    for (line, p) in text.lines().zip(&expected) {
        assert_eq!(line, format!("{}\t", p.bytes[0]), "{}", p.note);
    }
}
