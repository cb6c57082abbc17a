//! Many RC QP pairs at once between two devices of one process, over the UDP path (where a
//! QP could cost a descriptor): traffic on every pair, every byte checked, and the process's
//! descriptors counted before and after. The same body runs 10,000 pairs under the default
//! descriptor limit and, in a child process, 1,000 pairs under `ulimit -n 256`.
//!
//! Run with `--nocapture` for the figures: creation time of the first and last pairs, each
//! round's time, and one pair's ping-pong among all the others idle.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::cast_possible_truncation, reason = "test counts are small")]
#![allow(clippy::disallowed_methods, reason = "the figures printed are timings")]

use std::process::Command;
use std::time::{Duration, Instant};

use uroce::{Access, Context, Cq, Mr, Mtu, Options, Pd, Qp, QpType, WcOpcode, WcStatus};
use uroce_testkit::pattern;

/// Bytes per message.
const SIZE: usize = 64;

/// Sockets this process holds (not every descriptor: the other test of this file opens
/// pipes to its child meanwhile).
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

struct Side {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    qps: Vec<Qp>,
    mr: Mr,
}

impl Side {
    fn open(addr: &str, pairs: usize) -> Self {
        let options = Options { udp_only: true, ..Options::default() };
        let ctx = Context::open_with(addr.parse().unwrap(), options).unwrap();
        let cq = ctx.create_cq(2 * pairs + 16).unwrap();
        let pd = ctx.alloc_pd();
        let mr = pd.register(2 * pairs * SIZE, Access::LOCAL_WRITE).unwrap();
        Self { ctx, pd, cq, qps: Vec::with_capacity(pairs), mr }
    }
}

/// Waits for `n` successful completions on `cq`; returns their opcodes and work-request ids.
fn collect(cq: &Cq, n: usize) -> Vec<(WcOpcode, u64)> {
    let mut done = Vec::with_capacity(n);
    let mut wcs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while done.len() < n {
        wcs.clear();
        if cq.poll(&mut wcs) == 0 {
            assert!(Instant::now() < deadline, "{} of {n} completions in 120 s", done.len());
            std::thread::yield_now();
        }
        for wc in &wcs {
            assert_eq!(wc.status, WcStatus::SUCCESS, "{wc:?}");
            done.push((wc.opcode, wc.wr_id));
        }
    }
    done
}

/// This process's resident memory.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// The message pair `pair` sends in direction `dir` in round `round`.
fn message(pair: usize, dir: usize, round: usize) -> Vec<u8> {
    pattern(((pair as u64) << 8 | (dir as u64) << 4 | round as u64) + 1, SIZE)
}

/// `pairs` connected RC pairs between `a` and `b`, two rounds of a SEND each way on
/// every pair at once, then one pair's ping-pong with the rest idle.
fn soak(pairs: usize, [a, b]: [&str; 2]) {
    let fds_at_start = open_fds();
    let mut sides = [Side::open(a, pairs), Side::open(b, pairs)];
    let fds_with_devices = open_fds();
    let (mut first, mut last) = (Duration::ZERO, Duration::ZERO);
    let rss_before = rss_bytes();
    let started = Instant::now();
    for i in 0..pairs {
        let t = Instant::now();
        for s in &mut sides {
            // Every pair's first message leaves at once: 20,000 datagrams, more than the
            // sockets hold while both cores are busy, so some are lost and resent together.
            // An ACK timeout of 0.5 s (not 67 ms) lets a receiver the scheduler keeps off its
            // core catch up before the retries run out; what is tested is that every pair
            // carries its traffic, whatever it costs in retransmissions (printed below).
            let qp = s.pd.qp(QpType::Rc, &s.cq).depth(2, 2).mtu(Mtu::Mtu1024).retries(17, 7, 7);
            let qp = qp.build().unwrap();
            s.qps.push(qp);
        }
        let [x, y] = &sides;
        x.qps[i].connect(&y.qps[i].endpoint()).unwrap();
        y.qps[i].connect(&x.qps[i].endpoint()).unwrap();
        if i < 1000 {
            first += t.elapsed();
        }
        if i + 1000 >= pairs {
            last += t.elapsed();
        }
    }
    let per_pair = rss_bytes().saturating_sub(rss_before) / pairs as u64;
    println!("resident memory per connected pair (a QP on each device): {per_pair} bytes");
    // What the engine's QP, the runtime's and the API's handles cost, with queues of two;
    // the crate documentation states it.
    assert!(per_pair <= 8192, "a connected pair costs {per_pair} bytes");
    let window = pairs.min(1000) as u32;
    println!(
        "{pairs} pairs created in {:.2} s; per pair: first {window} {:.1} µs, last {window} {:.1} µs",
        started.elapsed().as_secs_f64(),
        (first / window).as_secs_f64() * 1e6,
        (last / window).as_secs_f64() * 1e6,
    );
    for round in 0..2 {
        let t = Instant::now();
        // Pair i receives into slot i of its side's region and sends from slot pairs + i.
        for (dir, s) in sides.iter().enumerate() {
            for (i, qp) in s.qps.iter().enumerate() {
                qp.post_recv(i as u64, &s.mr, i * SIZE..(i + 1) * SIZE).unwrap();
                s.mr.write((pairs + i) * SIZE, &message(i, dir, round)).unwrap();
            }
        }
        for s in &sides {
            for (i, qp) in s.qps.iter().enumerate() {
                qp.send(i as u64, &s.mr, (pairs + i) * SIZE..(pairs + i + 1) * SIZE).unwrap();
            }
        }
        for (dir, s) in sides.iter().enumerate() {
            let done = collect(&s.cq, 2 * pairs);
            for opcode in [WcOpcode::Send, WcOpcode::Recv] {
                let mut ids: Vec<u64> =
                    done.iter().filter(|d| d.0 == opcode).map(|d| d.1).collect();
                ids.sort_unstable();
                assert!(ids.iter().copied().eq(0..pairs as u64), "{opcode:?} once per pair");
            }
            for i in 0..pairs {
                let got = s.mr.to_vec(i * SIZE..(i + 1) * SIZE).unwrap();
                assert_eq!(got, message(i, 1 - dir, round), "pair {i}, round {round}");
            }
        }
        println!(
            "round {round}: {} messages intact in {:.1} ms",
            2 * pairs,
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    // One pair's round trips, every other QP idle: a QP's cost must not grow with the others.
    let [x, y] = &sides;
    let (qx, qy) = (&x.qps[pairs / 2], &y.qps[pairs / 2]);
    let rounds = 2000;
    let t = Instant::now();
    for k in 0..rounds {
        qy.post_recv(k, &y.mr, 0..SIZE).unwrap();
        qx.post_recv(k, &x.mr, 0..SIZE).unwrap();
        qx.send(k, &x.mr, SIZE..2 * SIZE).unwrap();
        collect(&y.cq, 1);
        qy.send(k, &y.mr, SIZE..2 * SIZE).unwrap();
        let got = collect(&x.cq, 2);
        assert!(got.iter().all(|d| d.1 == k));
        collect(&y.cq, 1);
    }
    println!(
        "one pair's ping-pong among {pairs}: {:.1} µs per round trip",
        t.elapsed().as_secs_f64() * 1e6 / rounds as f64
    );
    let fds_after = open_fds();
    let (engine, net) = x.ctx.counters();
    println!(
        "sockets: {fds_at_start} at start, {fds_with_devices} with both devices open, \
         {fds_after} after the traffic; {} packets sent, {} resent, {} ACK timeouts",
        engine.sent_pkts, engine.retransmitted_pkts, engine.ack_timeouts
    );
    // The UDP path sends every QP's flow from a fixed pool of sockets, and from at most 32
    // siblings per device connected to the peers it sends to (the README's resource bounds).
    let connected = fds_after.saturating_sub(fds_with_devices);
    assert!(connected <= 2 * 32, "QPs cost sockets: {connected} more after the traffic");
    assert_eq!(net.tx_errors, 0, "every packet left");
}

/// How many pairs the child process of `a_thousand_pairs_…` asks for (it runs beside its
/// parent, so on addresses of its own).
const PAIRS_VAR: &str = "UROCE_MANY_QPS_PAIRS";

#[test]
fn ten_thousand_rc_pairs_carry_traffic_under_the_default_descriptor_limit() {
    match std::env::var(PAIRS_VAR) {
        Ok(pairs) => soak(pairs.parse().unwrap(), ["127.0.27.4", "127.0.27.5"]),
        Err(_) => soak(10_000, ["127.0.27.2", "127.0.27.3"]),
    }
}

/// The same, in a child process (this test binary, running the test above) whose descriptor
/// limit is 256: far fewer than the QPs.
#[test]
fn a_thousand_rc_pairs_carry_traffic_under_ulimit_n_256() {
    let me = std::env::current_exe().unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 256 && exec \"$0\" --exact --nocapture --test-threads 1 \"$1\"")
        .arg(&me)
        .arg("ten_thousand_rc_pairs_carry_traffic_under_the_default_descriptor_limit")
        .env(PAIRS_VAR, "1000")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the child failed");
    assert!(stdout.contains("1000 pairs created") && stdout.contains("1 passed"), "{stdout}");
}
