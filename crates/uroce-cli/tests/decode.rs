//! `uroce decode` as a user runs it: the real binary on real files.

#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use std::path::PathBuf;
use std::process::{Command, Output};

const VECTORS: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../uroce-wire/tests/data/icrc-ipv4.txt");
const SCAPY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../uroce-wire/tests/data/icrc-scapy.txt");
const SAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../samples/rc-conversation.pcap");

fn uroce(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uroce")).args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uroce-decode-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn vectors() -> Vec<(String, Vec<u8>)> {
    std::fs::read_to_string(VECTORS)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (name, h) = l.split_once(' ').unwrap();
            let b = (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap());
            (name.to_string(), b.collect())
        })
        .collect()
}

#[test]
fn every_vector_is_icrc_ok_and_exit_is_zero() {
    let o = uroce(&["decode", VECTORS]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert_eq!(out.lines().count(), 4);
    assert!(out.lines().all(|l| l.ends_with(" icrc=ok")), "{out}");
    assert!(out.contains(
        "rxe_rc_ack 10.1.16.61:50208 > 10.1.16.62:4791 RC_ACKNOWLEDGE dqp=0x000021 psn=5890007 \
         aeth(ACK credits=unlimited msn=1) len=0 icrc=ok"
    ));
    assert!(out.contains("cx4lx_cnp 10.0.17.1:0 > 10.0.18.1:4791 CNP dqp=0x000118 psn=0 becn"));

    // Packets whose ICRC an independent implementation (scapy) computed, over IPv6 too.
    let o = uroce(&["decode", SCAPY]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert_eq!(out.lines().filter(|l| l.ends_with(" icrc=ok")).count(), 4, "{out}");
    assert!(out.contains("v6_rc_ack [fd00::2]:49153 > [fd00::3]:4791 RC_ACKNOWLEDGE"), "{out}");
}

/// Byte offsets of the fields the ICRC masks (TOS, TTL, IP checksum, UDP checksum, BTH byte 4),
/// and those that, flipped, leave no UDP packet to check (version/IHL, protocol).
fn exempt(offset: usize) -> bool {
    matches!(offset, 0 | 1 | 8 | 9 | 10 | 11 | 26 | 27 | 32)
}

#[test]
fn one_flipped_bit_anywhere_is_reported_icrc_bad() {
    let dir = temp_dir("flip");
    let mut text = String::new();
    let mut expected = 0;
    for (name, bytes) in vectors() {
        for offset in (0..bytes.len()).filter(|&o| !exempt(o)) {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[offset] ^= 1 << bit;
                text.push_str(&format!("{name}/{offset}.{bit} {}\n", hex(&b)));
                expected += 1;
            }
        }
    }
    let file = dir.join("flipped.txt");
    std::fs::write(&file, text).unwrap();
    let o = uroce(&["decode", file.to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(out.lines().count(), expected);
    for line in out.lines() {
        assert!(line.ends_with(" icrc=BAD"), "not reported bad: {line}");
    }
    assert!(stderr(&o).contains(&format!("{expected} of {expected} packet(s) failed")));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_sample_capture_decodes_clean() {
    let o = uroce(&["decode", SAMPLE]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(out.lines().count(), 23);
    assert!(out.lines().all(|l| l.ends_with(" icrc=ok")));
    assert!(out.contains("#13 127.0.0.3:49154 > 127.0.0.2:4791 RC_ACKNOWLEDGE dqp=0x000011 psn=107 aeth(RNR_NAK timer=14 (1280 us) msn=4) len=0 icrc=ok"));
    assert!(out.contains("#22 [fd00::2]:49155 > [fd00::3]:4791 UD_SEND_ONLY_WITH_IMMEDIATE"));
}

#[test]
fn a_corrupted_frame_in_a_capture_is_bad_and_the_rest_ok() {
    let dir = temp_dir("pcap");
    let mut bytes = std::fs::read(SAMPLE).unwrap();
    // The last byte of the file is the last ICRC byte of the last frame (the CNP).
    let n = bytes.len();
    bytes[n - 1] ^= 0x80;
    let file = dir.join("corrupt.pcap");
    std::fs::write(&file, &bytes).unwrap();
    let o = uroce(&["decode", file.to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1));
    let bad: Vec<&str> = out.lines().filter(|l| l.ends_with("icrc=BAD")).collect();
    assert_eq!(bad.len(), 1, "{out}");
    assert!(bad[0].starts_with("#23 ") && bad[0].contains(" CNP "), "{}", bad[0]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn malformed_packets_show_what_was_readable() {
    let dir = temp_dir("malformed");
    let (_, mut ack) = vectors().into_iter().find(|(n, _)| n == "rxe_rc_ack").unwrap();
    ack[28] = 0x15; // an opcode the table does not know
    let file = dir.join("unknown.txt");
    std::fs::write(&file, format!("# one packet\nodd {}\n", hex(&ack))).unwrap();
    let o = uroce(&["decode", file.to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        out.starts_with("odd 10.1.16.61:50208 > 10.1.16.62:4791 UNKNOWN(0x15) dqp=0x000021"),
        "{out}"
    );
    assert!(out.contains("error=\"unknown opcode UNKNOWN(0x15)\" icrc=BAD"), "{out}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn unusable_input_is_exit_two_with_a_one_line_error_naming_the_file() {
    let dir = temp_dir("unusable");
    let missing = dir.join("missing.pcap");
    let o = uroce(&["decode", missing.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("missing.pcap") && err.contains("No such file"), "{err}");

    let text = dir.join("notes.txt");
    std::fs::write(&text, "these are not packets\n").unwrap();
    let o = uroce(&["decode", text.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("notes.txt: line 1:") && err.contains("not pcap, pcapng or hex"), "{err}");
    assert!(stdout(&o).is_empty());

    let binary = dir.join("blob.bin");
    std::fs::write(&binary, [0xffu8, 0xfe, 0x00, 0x81, 0x92]).unwrap();
    let o = uroce(&["decode", binary.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("blob.bin: not pcap, pcapng or hex text"));

    let mut truncated = std::fs::read(SAMPLE).unwrap();
    truncated.truncate(truncated.len() - 3);
    let file = dir.join("cut.pcap");
    std::fs::write(&file, truncated).unwrap();
    let o = uroce(&["decode", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cut.pcap: capture truncated at byte"), "{}", stderr(&o));
    // As tshark does, every complete packet before the cut is printed first.
    assert_eq!(stdout(&o).lines().count(), 22, "{}", stdout(&o));
    assert!(stderr(&o).contains("after 22 complete frame(s)"), "{}", stderr(&o));

    // An empty file says so; a capture with no packet decodes to nothing, and says so.
    let empty = dir.join("empty.pcap");
    std::fs::write(&empty, b"").unwrap();
    let o = uroce(&["decode", empty.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("empty.pcap: empty file"), "{}", stderr(&o));
    let header = dir.join("header.pcap");
    std::fs::write(&header, &std::fs::read(SAMPLE).unwrap()[..24]).unwrap();
    let o = uroce(&["decode", header.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("header.pcap: no packets"), "{}", stderr(&o));

    let o = uroce(&["decode"]);
    assert_eq!(o.status.code(), Some(2));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn several_files_are_prefixed_with_their_names() {
    let o = uroce(&["decode", VECTORS, SAMPLE]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 27);
    assert!(out.lines().next().unwrap().starts_with(&format!("{VECTORS}: cx4lx_cnp ")));
    assert!(out.lines().last().unwrap().starts_with(&format!("{SAMPLE}: #23 ")));
}

/// A capture converted to pcapng by tshark itself decodes the same way.
#[test]
fn pcapng_written_by_tshark_decodes_like_the_pcap() {
    if !uroce_testkit::tshark_available() {
        return;
    }
    let dir = temp_dir("pcapng");
    let ng = dir.join("sample.pcapng");
    let conv = Command::new("tshark")
        .args(["-r", SAMPLE, "-F", "pcapng", "-w", ng.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(conv.status.success(), "{}", String::from_utf8_lossy(&conv.stderr));
    let a = uroce(&["decode", SAMPLE]);
    let b = uroce(&["decode", ng.to_str().unwrap()]);
    assert_eq!(b.status.code(), Some(0), "{}", stderr(&b));
    assert_eq!(stdout(&a), stdout(&b));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn cm_mads_are_decoded_field_by_field() {
    use uroce_wire::icrc::PseudoHeader;
    use uroce_wire::pcap::PcapWriter;
    let dir = temp_dir("cm");
    let path = dir.join("cm.pcap");
    let mut w = PcapWriter::new(std::fs::File::create(&path).unwrap()).unwrap();
    let (a, b) = ("127.0.0.2:49152".parse().unwrap(), "127.0.0.3:4791".parse().unwrap());
    for (i, m) in uroce_wire::examples::sample_cm_messages().iter().enumerate() {
        let repr = uroce_wire::mad::gmp(m, uroce_wire::Psn::from_masked(0));
        let mut buf = vec![0u8; repr.buffer_len().unwrap()];
        repr.emit(&PseudoHeader::for_endpoints(a, b).unwrap(), &mut buf).unwrap();
        w.write_roce(std::time::Duration::from_millis(i as u64), a, b, &buf).unwrap();
    }
    w.into_inner().unwrap();
    let o = uroce(&["decode", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 9, "{text}");
    let req = lines[0];
    for field in [
        "cm REQ tid=0x1",
        "lcid=0x01000001",
        "sid=0x0000000001061c06",
        "qpn=0x010011",
        "psn=11259375",
        "mtu=4096",
        "retry=7 rnr_retry=7 max_cm_retries=15",
        "cma(src=127.0.0.2:40000 dst=127.0.0.3) ps=Tcp port=7174",
        "private=70696e67",
        "icrc=ok",
    ] {
        assert!(req.contains(field), "REQ line lacks {field:?}: {req}");
    }
    assert!(lines[2].contains("cm REP") && lines[2].contains("rcid=0x01000001"), "{text}");
    assert!(lines[2].contains("qpn=0x020022 psn=1193046") && lines[2].contains("private=706f6e67"));
    assert!(lines[6].contains("cm REJ") && lines[6].contains("reason=8"), "{text}");
    assert!(lines[8].contains("cm SIDR_REP") && lines[8].contains("qpn=0x020023"), "{text}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// `decode -f` prints the packets of a capture as they are appended to it, each once, and
/// none before it is complete.
#[test]
#[expect(clippy::disallowed_methods, reason = "the file must grow while decode follows it")]
fn follow_decodes_a_capture_as_it_grows() {
    let dir = temp_dir("follow");
    let file = dir.join("live.pcap");
    let sample = std::fs::read(SAMPLE).unwrap();
    // The header and about half the packets, cut in the middle of one.
    let half = sample.len() / 2;
    std::fs::write(&file, &sample[..half]).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_uroce"))
        .args(["decode", "-f", file.to_str().unwrap(), "-D", "1"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut f = std::fs::OpenOptions::new().append(true).open(&file).unwrap();
    std::io::Write::write_all(&mut f, &sample[half..]).unwrap();
    drop(f);
    let o = child.wait_with_output().unwrap();
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let whole = stdout(&uroce(&["decode", SAMPLE]));
    assert_eq!(out, whole);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A capture on `lo` of two uroce processes sharing a device holds their steering probes: each
/// is named for what it is, and is no bad packet.
#[test]
fn a_steering_probe_is_named_and_no_error() {
    use uroce_wire::pcap::PcapWriter;
    use uroce_wire::steer_probe::Probe;
    let dir = temp_dir("probe");
    let file = dir.join("probe.pcap");
    let mut w = PcapWriter::new(std::fs::File::create(&file).unwrap()).unwrap();
    let (src, dst) = ("127.0.0.2:40000".parse().unwrap(), "127.0.0.2:4791".parse().unwrap());
    let probe = Probe { index: 1, nonce: 7 }.emit();
    w.write_roce(std::time::Duration::ZERO, src, dst, &probe).unwrap();
    w.into_inner().unwrap();
    let o = uroce(&["decode", file.to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(out.contains("uroce steering probe (not RoCE) index=1"), "{out}");
    let _ = std::fs::remove_dir_all(dir);
}
