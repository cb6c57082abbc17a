//! Wireshark judges the CM MADs: every message of a sample exchange, sent to QP1 in a RoCEv2
//! UD packet, must decode with the fields we encoded and nothing malformed.
//!
//! Needs `tshark`; skipped with a message where it is missing, except under `CI=true`.

#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use std::process::Command;
use std::time::Duration;

use uroce_testkit::tshark_available;
use uroce_wire::icrc::PseudoHeader;
use uroce_wire::pcap::PcapWriter;
use uroce_wire::types::Psn;
use uroce_wire::{examples, mad};

const FIELDS: [&str; 14] = [
    "infiniband.mad.attributeid",
    "infiniband.mad.transactionid",
    "infiniband.cm.req.serviceid.dport",
    "infiniband.cm.req.localqpn",
    "infiniband.cm.req.startpsn",
    "infiniband.cm.req.ip_cm.sport",
    "infiniband.cm.req.ip_cm.sip4",
    "infiniband.cm.req.ip_cm.dip4",
    "infiniband.cm.rep.remotecommid",
    "infiniband.cm.rep.localqpn",
    "infiniband.cm.rep.startpsn",
    "infiniband.cm.rtu.remotecommid",
    "infiniband.cm.rej.reason",
    "infiniband.cm.dreq.remotecommid",
];

#[test]
fn tshark_decodes_cm_mads_as_encoded() {
    if !tshark_available() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("uroce-tshark-cm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cm.pcap");
    let mut w = PcapWriter::new(std::fs::File::create(&path).unwrap()).unwrap();
    let (a, b) = ("127.0.0.2:49152".parse().unwrap(), "127.0.0.3:4791".parse().unwrap());
    let messages = examples::sample_cm_messages();
    assert_eq!(messages.len(), 9);
    for (i, m) in messages.iter().enumerate() {
        let repr = mad::gmp(m, Psn::from_masked(u32::try_from(i).unwrap()));
        let mut buf = vec![0u8; repr.buffer_len().unwrap()];
        repr.emit(&PseudoHeader::for_endpoints(a, b).unwrap(), &mut buf).unwrap();
        w.write_roce(Duration::from_millis(i as u64), a, b, &buf).unwrap();
    }
    w.into_inner().unwrap();

    let mut args = vec!["-r", path.to_str().unwrap(), "-T", "fields", "-E", "separator=/t"];
    for f in FIELDS {
        args.extend(["-e", f]);
    }
    let out = Command::new("tshark").args(&args).output().unwrap();
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<Vec<String>> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect();
    let attrs: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        attrs,
        ["0x0010", "0x0011", "0x0013", "0x0014", "0x0015", "0x0016", "0x0012", "0x0017", "0x0018"]
    );
    let req = &rows[0];
    assert_eq!(&req[2..8], ["0x1c06", "0x010011", "0xabcdef", "0x9c40", "127.0.0.2", "127.0.0.3"]);
    assert_eq!(&rows[2][8..11], ["0x01000001", "0x020022", "0x123456"]);
    assert_eq!(rows[3][11], "0x02000002");
    assert_eq!(rows[4][13], "0x02000002");
    assert_eq!(rows[6][12], "0x0008");

    uroce_testkit::tshark_finds_nothing_malformed(&path);
    std::fs::remove_dir_all(&dir).unwrap();
}
