//! rdma_cm programs between two network namespaces joined by a veth pair, with nftables
//! dropping 1 % of the UDP datagrams to port 4791 at random on each side — CM MADs
//! included, so handshakes and releases are retried as IBA 12.9.6 says; and libfabric's
//! verbs provider over connected endpoints (it finds RDMA interfaces by their addresses,
//! which a veth has and loopback does not).
//!
//! Needs root, `ip`, `nft`, `rdmacm-utils` and `libfabric-bin`; without them each test says
//! why it skips, and under `CI=true` fails.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(
    clippy::disallowed_methods,
    reason = "tests run real programs: they wait by the wall clock"
)]

#[path = "common/mod.rs"]
mod common;

use std::time::Duration;

use common::{Side, cm_pair, have, serial};
use uroce_testkit::{Namespaces, netns_tools_present};

const CLIENT: &str = "10.196.0.1";
const SERVER: &str = "10.196.0.2";

fn sides<'a>(
    ns: &'a Namespaces,
    sp: &'a [&'a str; 4],
    cp: &'a [&'a str; 4],
) -> (Side<'a>, Side<'a>) {
    let _ = ns;
    (Side { prefix: sp, addr: SERVER, env: &[] }, Side { prefix: cp, addr: CLIENT, env: &[] })
}

#[test]
fn rping_and_ucmatose_complete_across_namespaces_with_one_percent_loss() {
    if !netns_tools_present() || !have("rping", "rdmacm-utils") {
        return;
    }
    let _turn = serial();
    let (c, s) = (format!("{CLIENT}/24"), format!("{SERVER}/24"));
    let ns = Namespaces::new('m', &[&c], &[&s]);
    let sp = ["ip", "netns", "exec", ns.b.as_str()];
    let cp = ["ip", "netns", "exec", ns.a.as_str()];
    let (server, client) = sides(&ns, &sp, &cp);
    ns.set_loss(1);
    let limit = Duration::from_secs(120);
    let before = ns.dropped();
    let (s, c) = cm_pair(
        "rping",
        &["-s", "-a", SERVER, "-C", "200", "-S", "1024", "-v", "-V"],
        &["-c", "-a", SERVER, "-C", "200", "-S", "1024", "-v", "-V"],
        &server,
        &client,
        limit,
    );
    assert!(s.ok() && c.ok(), "rping with 1 % loss:\n{s}\n{c}");
    assert!(c.stdout.contains("rdma-ping-199: "), "{c}");
    // Line-buffered, so that a run killed at the deadline shows how far each side came.
    let (s, c) = cm_pair(
        "stdbuf",
        &["-oL", "ucmatose", "-b", SERVER, "-c", "10", "-C", "100"],
        &["-oL", "ucmatose", "-s", SERVER, "-b", CLIENT, "-c", "10", "-C", "100"],
        &server,
        &client,
        limit,
    );
    assert!(s.ok() && c.ok(), "ucmatose -c 10 with 1 % loss:\n{s}\n{c}");
    let dropped = ns.dropped() - before;
    assert!(dropped > 0, "nothing was dropped: the loss rule did not apply");
    println!("rping (200 × 1 KiB) and ucmatose (10 connections) with {dropped} datagrams dropped");
}

#[test]
fn libfabric_verbs_connected_endpoints_ping_pong() {
    if !netns_tools_present() || !have("fi_pingpong", "libfabric-bin") {
        return;
    }
    let _turn = serial();
    let (c, s) = (format!("{CLIENT}/24"), format!("{SERVER}/24"));
    let ns = Namespaces::new('f', &[&c], &[&s]);
    let sp = ["ip", "netns", "exec", ns.b.as_str()];
    let cp = ["ip", "netns", "exec", ns.a.as_str()];
    let (server, client) = sides(&ns, &sp, &cp);
    for (prov, ep) in [("verbs", "msg"), ("verbs;ofi_rxm", "rdm")] {
        let args = ["-p", prov, "-e", ep, "-I", "200", "-S", "4096"];
        let mut cargs = args.to_vec();
        cargs.push(SERVER);
        let (s, c) =
            cm_pair("fi_pingpong", &args, &cargs, &server, &client, Duration::from_secs(60));
        assert!(s.ok() && c.ok(), "fi_pingpong -p {prov} -e {ep}:\n{s}\n{c}");
        assert!(c.stdout.contains("4k"), "fi_pingpong -p {prov} -e {ep}: no result\n{c}");
        println!("fi_pingpong -p \"{prov}\" -e {ep}:\n{}", c.stdout);
    }
}
