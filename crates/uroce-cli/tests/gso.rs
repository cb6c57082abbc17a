//! The UDP path's segmentation offload seen from the wire: a run of a QP's packets leaves in one
//! segmented send (UDP GSO), and Linux numbers the segments' IPv4 identification 0, 1, …, n−1.
//! The ICRC covers that field, so segment k must be sealed for identification k. Here the
//! interface segments in software (`gso_max_segs 1`), so a capture on it holds every segment
//! with the identification it really carried, and `uroce decode` checks each ICRC against the
//! captured header: a sender that sealed every segment for 0 (or for the wrong k) fails. The
//! receiver, which does not see the header, must find the identification itself; every test
//! also completes only if it does.
//!
//! Loopback as it is by default shows each segmented send whole; `uroce decode` cuts it into
//! its segments and verifies each.
//!
//! Loopback (IPv4 and IPv6) in one namespace, and a veth pair between two (1500-byte MTU, RDMA
//! MTU 1024 as the client chooses it from the ports by default: 60 segments per send). Needs
//! root, `ip` and `dumpcap`/`tshark`; without them it says why it skips, and under `CI=true`
//! fails.

#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::disallowed_methods, reason = "the capture must see the last packets land")]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use uroce_testkit::{Namespaces, describe, installed, netns_tools_present, run};

const UROCE: &str = env!("CARGO_BIN_EXE_uroce");

/// A network namespace of the test's own, deleted on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Self {
        let name = format!("uroce-gso-{tag}-{}", std::process::id());
        run("ip", &["netns", "add", &name]);
        run("ip", &["-n", &name, "link", "set", "lo", "up"]);
        Self(name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// Spawns `cmd` with its standard error piped and reads that until a line `ready` accepts, then
/// keeps draining it so the program never blocks on a full pipe. Returns the child and the
/// lines that came before the ready one.
fn spawn_until(cmd: &mut Command, ready: impl Fn(&str) -> bool) -> (Child, Vec<String>) {
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut before = Vec::new();
    loop {
        let mut line = String::new();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "{cmd:?} ended before it was ready: {before:?}"
        );
        if ready(&line) {
            break;
        }
        before.push(line);
    }
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    (child, before)
}

/// dumpcap on `interface` in namespace `ns`, writing pcap to `file`; returns once it captures.
fn start_capture(ns: &str, interface: &str, file: &Path) -> Child {
    let mut dumpcap = Command::new("ip");
    dumpcap
        .args(["netns", "exec", ns, "dumpcap", "-i", interface, "-f", "udp port 4791", "-P"])
        .arg("-w")
        .arg(file);
    spawn_until(&mut dumpcap, |l| l.starts_with("Capturing on")).0
}

fn stop(child: &mut Child) {
    let _ = Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    let _ = child.wait();
}

/// `uroce server` in `server_ns` and `uroce client` in `client_ns`, both on the UDP path,
/// running WRITE and SEND streams of 64 KiB and a WRITE ping-pong with `--mtu mtu` (without:
/// the ports' MTU); returns the client's output.
fn run_tests(
    server_ns: &str,
    client_ns: &str,
    server: &str,
    client: &str,
    mtu: Option<&str>,
) -> String {
    run_tests_checking(server_ns, client_ns, server, client, mtu, "any")
}

/// [`run_tests`] with both devices' receivers accepting the IPv4 identifications `ip_id`
/// names (`UROCE_ICRC_IP_ID`), which also decides how they send: from connected sockets
/// (`any`, the default) or unconnected (`linux`).
fn run_tests_checking(
    server_ns: &str,
    client_ns: &str,
    server: &str,
    client: &str,
    mtu: Option<&str>,
    ip_id: &str,
) -> String {
    let mut server_cmd = Command::new("ip");
    server_cmd
        .args(["netns", "exec", server_ns, UROCE, "server", "--addr", server, "--port", "19901"])
        .env("UROCE_FABRIC", "udp")
        .env("UROCE_ICRC_IP_ID", ip_id);
    let (mut srv, before) = spawn_until(&mut server_cmd, |l| l.contains("waiting for clients"));
    assert!(before.is_empty(), "server: {before:?}");
    let args = [server, "rc_rdma_write_bw", "rc_bw", "uc_bw", "rc_rdma_write_lat", "-s", "64K"];
    let cli = Command::new("ip")
        .args(["netns", "exec", client_ns, UROCE, "client"])
        .args(args)
        .args(["-n", "300", "--local", client, "--port", "19901"])
        .args(mtu.map(|m| ["--mtu", m]).into_iter().flatten())
        .env("UROCE_FABRIC", "udp")
        .env("UROCE_ICRC_IP_ID", ip_id)
        .output()
        .unwrap();
    let _ = srv.kill();
    let _ = srv.wait();
    assert!(cli.status.success(), "client: {}", describe(&cli));
    String::from_utf8_lossy(&cli.stdout).into_owned()
}

/// `uroce decode` verifies every captured packet (status 0); returns the IPv4 identifications
/// the capture holds (tshark reads them).
fn verify_capture(file: &Path) -> Vec<u32> {
    let out = Command::new(UROCE).arg("decode").arg(file).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let bad: Vec<&str> = text.lines().filter(|l| !l.contains("icrc=ok")).take(5).collect();
    assert!(out.status.success(), "uroce decode: {bad:?} {}", describe(&out));
    let packets = text.lines().count();
    assert!(packets > 1000, "the capture holds {packets} packets");
    let ids = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(["-T", "fields", "-e", "ip.id"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&ids.stdout)
        .lines()
        .filter_map(|l| u32::from_str_radix(l.trim().trim_start_matches("0x"), 16).ok())
        .collect()
}

/// A directory for one test's captures (hundreds of MB each), removed when the test passes and
/// kept, with its path printed, when it fails.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("uroce-gso-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("the captures are kept in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn tools() -> bool {
    netns_tools_present() && installed(&["dumpcap", "tshark"], "tshark")
}

#[test]
fn segments_on_loopback_carry_their_identification_and_verify() {
    if !tools() {
        return;
    }
    let ns = Netns::new("lo");
    let scratch = Scratch::new("lo");
    // Software segmentation before the capture point: the capture sees every segment.
    run("ip", &["-n", &ns.0, "link", "set", "lo", "gso_max_segs", "1"]);
    for a in ["fd16::2/128", "fd16::3/128"] {
        run("ip", &["-n", &ns.0, "addr", "add", a, "dev", "lo", "nodad"]);
    }
    // IPv4 from connected sockets (each datagram numbered from its socket's counter, which
    // the sender learns), from unconnected ones (0, or k for segment k), and IPv6.
    for (family, server, client, ip_id) in [
        ("v4", "127.0.0.3", "127.0.0.2", "any"),
        ("v4", "127.0.0.3", "127.0.0.2", "linux"),
        ("v6", "fd16::3", "fd16::2", "any"),
    ] {
        let file = scratch.file(&format!("lo-{family}-{ip_id}.pcap"));
        let mut cap = start_capture(&ns.0, "lo", &file);
        let report = run_tests_checking(&ns.0, &ns.0, server, client, Some("4096"), ip_id);
        std::thread::sleep(Duration::from_millis(300));
        stop(&mut cap);
        eprintln!("{family}, {ip_id}:\n{report}");
        let ids = verify_capture(&file);
        let most = ids.iter().copied().max().unwrap_or(0);
        if ip_id == "linux" {
            assert!(most >= 10, "segments numbered up to {most}: no segmented sends?");
            assert!(ids.iter().all(|&id| id < 64), "an identification beyond one send's segments");
        } else if family == "v4" {
            let distinct: std::collections::BTreeSet<u32> = ids.iter().copied().collect();
            assert!(distinct.len() > 64, "{} identifications: none from a counter", distinct.len());
        }
    }
    // Loopback as it is by default never cuts a segmented send: the capture holds each whole,
    // and `uroce decode` cuts it where the kernel would have, each segment verified with the
    // identification it would have carried.
    run("ip", &["-n", &ns.0, "link", "set", "lo", "gso_max_segs", "65535"]);
    let file = scratch.file("lo-whole.pcap");
    let mut cap = start_capture(&ns.0, "lo", &file);
    run_tests(&ns.0, &ns.0, "127.0.0.3", "127.0.0.2", Some("4096"));
    std::thread::sleep(Duration::from_millis(300));
    stop(&mut cap);
    verify_capture(&file);
    let out = Command::new(UROCE).arg("decode").arg(&file).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(GSO segment 14/14)"), "no whole segmented send in the capture");
}

#[test]
fn segments_across_a_veth_pair_carry_their_identification_and_verify() {
    if !tools() {
        return;
    }
    let hosts = Namespaces::new('g', &["10.196.7.1/24"], &["10.196.7.2/24"]);
    for (ns, link) in [(&hosts.a, &hosts.link_a), (&hosts.b, &hosts.link_b)] {
        run("ip", &["-n", ns, "link", "set", link, "gso_max_segs", "1"]);
    }
    let scratch = Scratch::new("veth");
    let file = scratch.file("veth.pcap");
    let mut cap = start_capture(&hosts.a, &hosts.link_a, &file);
    // No --mtu: the client takes the ports' MTU, 1024 on this 1500-byte link (4096 would put
    // datagrams on it that the kernel refuses, and every test would fail).
    let report = run_tests(&hosts.b, &hosts.a, "10.196.7.2", "10.196.7.1", None);
    std::thread::sleep(Duration::from_millis(300));
    stop(&mut cap);
    eprintln!("{report}");
    let ids = verify_capture(&file);
    let most = ids.iter().copied().max().unwrap_or(0);
    // 64 KiB in 1,040-byte packets: up to 60 segments in one send.
    assert!(most >= 40, "segments numbered up to {most}: no segmented sends?");
}

/// A path MTU larger than the link carries: the kernel refuses every full-sized datagram. The
/// test fails, as it must, but the client says why: the refusal, the size and the MTU to use,
/// where it used to end in a bare retry exhaustion.
#[test]
fn a_path_mtu_beyond_the_link_is_named_as_the_cause() {
    if !tools() {
        return;
    }
    let hosts = Namespaces::new('m', &["10.196.8.1/24"], &["10.196.8.2/24"]);
    let mut server_cmd = Command::new("ip");
    server_cmd
        .args(["netns", "exec", &hosts.b, UROCE, "server", "--addr", "10.196.8.2"])
        .args(["--port", "19902"])
        .env("UROCE_FABRIC", "udp");
    let (mut srv, _) = spawn_until(&mut server_cmd, |l| l.contains("waiting for clients"));
    let cli = Command::new("ip")
        .args(["netns", "exec", &hosts.a, UROCE, "client", "10.196.8.2", "rc_rdma_write_bw"])
        .args(["-s", "8K", "-n", "20", "--mtu", "4096", "--local", "10.196.8.1"])
        .args(["--port", "19902"])
        .env("UROCE_FABRIC", "udp")
        .output()
        .unwrap();
    let _ = srv.kill();
    let _ = srv.wait();
    let err = String::from_utf8_lossy(&cli.stderr);
    assert!(
        !cli.status.success(),
        "4096-byte packets crossed a 1500-byte link: {}",
        describe(&cli)
    );
    assert!(
        err.contains("EMSGSIZE") && err.contains("path MTU of at most 1024 bytes"),
        "the cause is not named: {}",
        describe(&cli)
    );
}
