//! What the integration tests of several uroce crates share:
//! - two hosts as two network namespaces joined by a veth pair, with nftables dropping a share
//!   of the RoCEv2 packets at random on each side (`numgen random mod 100 < N drop`: netem is
//!   not built into every kernel). Root, `ip` (iproute2) and `nft` (nftables) are needed;
//!   [`netns_tools_present`] says so, and under `CI=true` a missing one is a failure;
//! - tshark as the judge of a capture ([`tshark_finds_nothing_malformed`]);
//! - the payload bytes the tests send and check ([`pattern`]);
//! - unmodified programs: whether they are installed ([`installed`]) and what they printed
//!   ([`describe`]);
//! - one test of the running test binary re-run as a role inside a namespace
//!   ([`spawn_role_in`]), talking to its parent a line at a time ([`read_line`]).
#![allow(clippy::unwrap_used, reason = "test support: a panic is a test failure")]

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

/// Whether this is a CI run (then a missing tool fails a test instead of skipping it).
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Whether every one of `tools` is on the path; if not, says which Debian packages
/// (`packages`) bring them and that the test skips, or panics under CI.
pub fn installed(tools: &[&str], packages: &str) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    let msg = format!("{missing:?} not installed (apt-get install {packages})");
    assert!(!ci(), "{msg}");
    eprintln!("skipped: {msg}");
    false
}

/// A finished program's status and output, for a failed assertion's message.
pub fn describe(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `len` bytes of a seeded xorshift sequence: test payloads whose corruption, truncation or
/// misplacement shows.
#[expect(clippy::cast_possible_truncation, reason = "the low byte of each step is wanted")]
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Whether tshark runs; if not, says why the check skips, or panics under CI.
pub fn tshark_available() -> bool {
    let found = Command::new("tshark").arg("--version").output().is_ok_and(|o| o.status.success());
    if !found {
        assert!(!ci(), "tshark is required under CI (apt-get install -y tshark)");
        eprintln!("SKIPPED the tshark check: tshark not found (apt-get install -y tshark)");
    }
    found
}

/// The protocols Wireshark's heuristics try on InfiniBand payloads (`tshark -G
/// heuristic-decodes`, table `infiniband.payload`; `ethertype` excepted, Ethernet needs it).
const PAYLOAD_PROTOCOLS: [&str; 9] = [
    "smc",
    "smb_direct",
    "rpcordma",
    "nvme-rdma",
    "lnet",
    "iser",
    "infiniband.eoib",
    "infiniband_sdp",
    "fcoib",
];

/// tshark reads the capture `file` and finds no malformed packet, no error, and no packet it
/// does not decode as InfiniBand. Skips (or fails under CI) without tshark.
pub fn tshark_finds_nothing_malformed(file: &Path) {
    if !tshark_available() {
        return;
    }
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        // The payloads are random test bytes: keep the protocols Wireshark tries on InfiniBand
        // payloads (FCoIB, SDP, iSER, …) from claiming them; the RoCE headers are judged.
        .args(PAYLOAD_PROTOCOLS.iter().flat_map(|h| ["--disable-protocol", h]))
        .args(["-Y", "_ws.malformed || _ws.expert.severity >= \"error\" || !infiniband"])
        .output()
        .unwrap();
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let first: Vec<&str> = text.lines().take(20).collect();
    assert!(
        text.trim().is_empty(),
        "tshark found malformed or undecoded packets:\n{}",
        first.join("\n")
    );
}

/// Runs a command, panicking with its stderr if it fails.
pub fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Whether the namespace tests can run (root, `ip`, `nft`); if not, says why on stderr, or
/// panics under CI.
pub fn netns_tools_present() -> bool {
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let tool = |t: &str| Command::new(t).arg("-V").output().is_ok_and(|o| o.status.success());
    let missing: Vec<&str> = [("root", root), ("ip", tool("ip")), ("nft", tool("nft"))]
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(what, _)| what)
        .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        !ci(),
        "the namespace test needs {missing:?} under CI (apt-get install -y iproute2 nftables)"
    );
    eprintln!(
        "SKIPPED: the namespace test needs {missing:?} (root; apt-get install -y iproute2 nftables)"
    );
    false
}

/// Two namespaces, `a` and `b`, joined by a veth pair; deleted on drop.
#[derive(Debug)]
pub struct Namespaces {
    /// The first host's namespace (`ip netns exec` name).
    pub a: String,
    /// The second host's.
    pub b: String,
    /// The first host's end of the veth pair.
    pub link_a: String,
    /// The second host's end.
    pub link_b: String,
}

impl Namespaces {
    /// Namespaces and interfaces named by `tag` (one letter) and the process id, so tests
    /// running at once do not collide; `a_addrs` and `b_addrs` are `address/prefix` for each
    /// side's end of the pair (IPv6 ones without duplicate address detection).
    pub fn new(tag: char, a_addrs: &[&str], b_addrs: &[&str]) -> Self {
        let id = std::process::id();
        let (a, b) = (format!("uroce-{tag}a-{id}"), format!("uroce-{tag}b-{id}"));
        let (va, vb) = (format!("u{tag}a{}", id % 100_000), format!("u{tag}b{}", id % 100_000));
        run("ip", &["netns", "add", &a]);
        let ns = Self { a, b, link_a: va.clone(), link_b: vb.clone() };
        run("ip", &["netns", "add", &ns.b]);
        let link = ["link", "add", &va, "netns", &ns.a, "type", "veth", "peer", "name", &vb];
        let mut args = link.to_vec();
        args.extend_from_slice(&["netns", &ns.b]);
        run("ip", &args);
        for (n, v, addrs) in [(&ns.a, &va, a_addrs), (&ns.b, &vb, b_addrs)] {
            for addr in addrs {
                let mut args = vec!["-n", n, "addr", "add", addr, "dev", v];
                if addr.contains(':') {
                    args.push("nodad");
                }
                run("ip", &args);
            }
            run("ip", &["-n", n, "link", "set", v, "up"]);
            run("ip", &["-n", n, "link", "set", "lo", "up"]);
        }
        ns
    }

    /// Drops `percent` % of the RoCEv2 packets arriving in each namespace (0: none, but the
    /// rule and its counter exist).
    pub fn set_loss(&self, percent: u32) {
        for n in [&self.a, &self.b] {
            let _ = Command::new("ip")
                .args(["netns", "exec", n, "nft", "delete", "table", "inet", "uroce"])
                .output();
            let nft = |args: &[&str]| {
                let mut all = vec!["netns", "exec", n, "nft"];
                all.extend_from_slice(args);
                run("ip", &all);
            };
            nft(&["add", "table", "inet", "uroce"]);
            let hook = "{ type filter hook input priority 0; }";
            nft(&["add", "chain", "inet", "uroce", "input", hook]);
            // Every RoCEv2 packet is counted first ([`Namespaces::seen`]), then some dropped.
            nft(&["add", "rule", "inet", "uroce", "input", "udp", "dport", "4791", "counter"]);
            let p = percent.to_string();
            let rule = ["udp", "dport", "4791", "numgen", "random", "mod", "100", "<", &p];
            let mut args = vec!["add", "rule", "inet", "uroce", "input"];
            args.extend_from_slice(&rule);
            args.extend_from_slice(&["counter", "drop"]);
            nft(&args);
        }
    }

    /// Packets nftables dropped, both sides, since the last [`Namespaces::set_loss`].
    pub fn dropped(&self) -> u64 {
        self.counter(2)
    }

    /// RoCEv2 packets that reached either side's input hook (dropped ones included) since the
    /// last [`Namespaces::set_loss`]: whether a test's traffic was enough for the loss to show.
    pub fn seen(&self) -> u64 {
        self.counter(1)
    }

    /// The `nth` counter of the loss table (1: all RoCEv2 packets, 2: those dropped), summed
    /// over both sides.
    fn counter(&self, nth: usize) -> u64 {
        [&self.a, &self.b]
            .iter()
            .map(|n| {
                let out = Command::new("ip")
                    .args(["netns", "exec", n, "nft", "list", "table", "inet", "uroce"])
                    .output()
                    .unwrap();
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                text.split("packets ")
                    .nth(nth)
                    .and_then(|t| t.split(' ').next())
                    .and_then(|p| p.parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .sum()
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

/// Runs the test named `test` of the current test binary inside namespace `ns`, alone and
/// exactly, with `role_var` set to `role` and the settings of `env`; its stdout is piped to
/// the caller, and its stderr too when `capture_stderr` (else it goes to the caller's).
pub fn spawn_role_in(
    ns: &str,
    test: &str,
    (role_var, role): (&str, &str),
    env: &[(&str, String)],
    capture_stderr: bool,
) -> Child {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(role_var, role)
        .stdout(Stdio::piped())
        .stderr(if capture_stderr { Stdio::piped() } else { Stdio::inherit() });
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// The next line of `s`, without its line end (empty at the end of the stream).
pub fn read_line(s: &mut impl BufRead) -> String {
    let mut l = String::new();
    s.read_line(&mut l).unwrap();
    l.trim_end().to_string()
}
