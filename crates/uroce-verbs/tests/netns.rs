//! rdma-core's pingpong examples, unmodified, between two network namespaces joined by a veth
//! pair, with nftables dropping 1 % of the RoCEv2 packets at random on each side
//! (`numgen random mod 100 < 1 drop`: netem is not available here):
//! - RC completes: lost packets are retransmitted;
//! - UC and UD do not: a lost message is gone (IBA 9.8.2, 9.8.3: no acknowledgement, no
//!   retransmission), and a pingpong that waits for it stalls. Without loss both complete, so
//!   the stall is the loss.
//!
//! Needs root, `ip`, `nft` and `ibverbs-utils`; without them it says why it skips, and under
//! `CI=true` fails.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Side, have, pair, serial};

const CLIENT: &str = "10.198.0.1";
const SERVER: &str = "10.198.0.2";
const PORT: u16 = 18515;

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn root() -> bool {
    let uid = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if !uid {
        assert!(!common::ci(), "the namespace test must run as root under CI");
        eprintln!("SKIPPED: the namespace test needs root (network namespaces, nftables)");
    }
    uid
}

/// Two namespaces and their veth pair; deleted on drop.
struct Namespaces {
    client: String,
    server: String,
}

impl Namespaces {
    fn new() -> Self {
        let id = std::process::id();
        let (c, s) = (format!("uroce-vc-{id}"), format!("uroce-vs-{id}"));
        let (vc, vs) = (format!("uvc{}", id % 100_000), format!("uvs{}", id % 100_000));
        run("ip", &["netns", "add", &c]);
        let ns = Self { client: c, server: s };
        run("ip", &["netns", "add", &ns.server]);
        run(
            "ip",
            &[
                "link", "add", &vc, "netns", &ns.client, "type", "veth", "peer", "name", &vs,
                "netns", &ns.server,
            ],
        );
        for (n, v, addr) in [(&ns.client, &vc, CLIENT), (&ns.server, &vs, SERVER)] {
            run("ip", &["-n", n, "addr", "add", &format!("{addr}/24"), "dev", v]);
            run("ip", &["-n", n, "link", "set", v, "up"]);
            run("ip", &["-n", n, "link", "set", "lo", "up"]);
        }
        ns
    }

    fn prefix(ns: &str) -> [&str; 4] {
        ["ip", "netns", "exec", ns]
    }

    /// Drops `percent` % of the RoCEv2 packets arriving in each namespace (0: none).
    fn set_loss(&self, percent: u32) {
        for n in [&self.client, &self.server] {
            let _ = Command::new("ip")
                .args(["netns", "exec", n, "nft", "delete", "table", "inet", "uroce"])
                .output();
            if percent == 0 {
                continue;
            }
            let p = percent.to_string();
            let nft = |args: &[&str]| {
                let mut all = vec!["netns", "exec", n, "nft"];
                all.extend_from_slice(args);
                run("ip", &all);
            };
            nft(&["add", "table", "inet", "uroce"]);
            nft(&[
                "add",
                "chain",
                "inet",
                "uroce",
                "input",
                "{ type filter hook input priority 0; }",
            ]);
            nft(&[
                "add", "rule", "inet", "uroce", "input", "udp", "dport", "4791", "numgen",
                "random", "mod", "100", "<", &p, "counter", "drop",
            ]);
        }
    }

    /// Packets nftables dropped, both sides.
    fn dropped(&self) -> u64 {
        [&self.client, &self.server]
            .iter()
            .map(|n| {
                let out = Command::new("ip")
                    .args(["netns", "exec", n, "nft", "list", "table", "inet", "uroce"])
                    .output()
                    .unwrap();
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                text.split("packets ")
                    .nth(1)
                    .and_then(|t| t.split(' ').next())
                    .and_then(|p| p.parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .sum()
    }

    fn pingpong(
        &self,
        prog: &str,
        args: &[&str],
        limit: Duration,
    ) -> (common::Outcome, common::Outcome) {
        let sp = Self::prefix(&self.server);
        let cp = Self::prefix(&self.client);
        pair(
            prog,
            args,
            &Side { prefix: &sp, addr: SERVER, env: &[] },
            &Side { prefix: &cp, addr: CLIENT, env: &[] },
            PORT,
            limit,
        )
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in [&self.client, &self.server] {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

#[test]
fn pingpongs_across_namespaces_with_one_percent_loss() {
    if !root()
        || !have("ip", "iproute2")
        || !have("nft", "nftables")
        || !have("ibv_rc_pingpong", "ibverbs-utils")
    {
        return;
    }
    let _turn = serial();
    let ns = Namespaces::new();

    // Without loss every transport completes (the path MTU 1024 fits the 1500-byte veth).
    for prog in ["ibv_rc_pingpong", "ibv_uc_pingpong", "ibv_ud_pingpong"] {
        let args = ["-g", "0", "-n", "500", "-s", "1024"];
        let (s, c) = ns.pingpong(prog, &args, Duration::from_secs(60));
        assert!(s.ok() && c.ok(), "{prog} without loss:\n{s}\n{c}");
    }

    ns.set_loss(1);
    // RC: every message arrives; the losses are recovered by retransmission.
    for args in [&["-g", "0", "-n", "2000"][..], &["-g", "0", "-s", "65536", "-n", "200"][..]] {
        let before = ns.dropped();
        let (s, c) = ns.pingpong("ibv_rc_pingpong", args, Duration::from_secs(120));
        assert!(s.ok() && c.ok(), "ibv_rc_pingpong {args:?} with 1 % loss:\n{s}\n{c}");
        let dropped = ns.dropped() - before;
        assert!(dropped > 0, "nothing was dropped: the loss rule did not apply");
        println!(
            "ibv_rc_pingpong {} with 1 % loss, {dropped} packets dropped:\n{}",
            args.join(" "),
            c.stdout
        );
    }

    // UC and UD: a dropped message is not resent, so the pingpong waiting for it stalls. (All
    // 20,000 messages surviving 1 % loss has probability 0.99^20000.)
    for prog in ["ibv_uc_pingpong", "ibv_ud_pingpong"] {
        let before = ns.dropped();
        let args = ["-g", "0", "-n", "10000", "-s", "1024"];
        let (s, c) = ns.pingpong(prog, &args, Duration::from_secs(10));
        assert!(c.status.is_none() && s.status.is_none(), "{prog} with loss finished:\n{s}\n{c}");
        assert!(ns.dropped() > before, "{prog}: nothing was dropped");
        println!("{prog} with 1 % loss stalled as expected after {} drops", ns.dropped() - before);
    }
}
