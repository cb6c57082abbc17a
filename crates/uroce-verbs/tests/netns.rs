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

use std::time::Duration;

use common::{Side, have, pair, serial};
use uroce_testkit::{Namespaces, netns_tools_present};

const CLIENT: &str = "10.198.0.1";
const SERVER: &str = "10.198.0.2";
const PORT: u16 = 18515;

/// Runs an rdma-core example with its server in `b` and its client in `a`.
fn pingpong(
    ns: &Namespaces,
    prog: &str,
    args: &[&str],
    limit: Duration,
) -> (common::Outcome, common::Outcome) {
    let sp = ["ip", "netns", "exec", &ns.b];
    let cp = ["ip", "netns", "exec", &ns.a];
    let server = Side { prefix: &sp, addr: SERVER, env: &[] };
    let client = Side { prefix: &cp, addr: CLIENT, env: &[] };
    pair(prog, args, &server, &client, PORT, limit)
}

#[test]
fn pingpongs_across_namespaces_with_one_percent_loss() {
    if !netns_tools_present() || !have("ibv_rc_pingpong", "ibverbs-utils") {
        return;
    }
    let _turn = serial();
    let (c, s) = (format!("{CLIENT}/24"), format!("{SERVER}/24"));
    let ns = Namespaces::new('v', &[&c], &[&s]);

    // Without loss every transport completes (the path MTU 1024 fits the 1500-byte veth).
    for prog in ["ibv_rc_pingpong", "ibv_uc_pingpong", "ibv_ud_pingpong"] {
        let args = ["-g", "0", "-n", "500", "-s", "1024"];
        let (s, c) = pingpong(&ns, prog, &args, Duration::from_secs(60));
        assert!(s.ok() && c.ok(), "{prog} without loss:\n{s}\n{c}");
    }

    ns.set_loss(1);
    // RC: every message arrives; the losses are recovered by retransmission.
    for args in [&["-g", "0", "-n", "2000"][..], &["-g", "0", "-s", "65536", "-n", "200"][..]] {
        let before = ns.dropped();
        let (s, c) = pingpong(&ns, "ibv_rc_pingpong", args, Duration::from_secs(120));
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
        let (s, c) = pingpong(&ns, prog, &args, Duration::from_secs(10));
        assert!(c.status.is_none() && s.status.is_none(), "{prog} with loss finished:\n{s}\n{c}");
        assert!(ns.dropped() > before, "{prog}: nothing was dropped");
        println!("{prog} with 1 % loss stalled as expected after {} drops", ns.dropped() - before);
    }
}
