//! Soak: 64 RC QP pairs between two hosts (network namespaces joined by a veth pair, nftables
//! dropping 5 % of the RoCEv2 packets arriving on each side) carry SENDs on every pair for 60
//! seconds (`UROCE_SOAK_SECS`). Every message must arrive intact and in order on its QP, every
//! send complete successfully, and each process's resident memory must stay flat: measured
//! after the first tenth of the run and at its end, it may grow by at most 4 MiB.
//!
//! Needs root, `ip` and `nft`; without them it prints why it skips, and under `CI=true` fails.
//! The test re-runs its own executable inside each namespace for the two roles.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::cast_possible_truncation, reason = "test sizes are small")]
#![allow(clippy::disallowed_methods, reason = "the soak runs for a wall-clock time")]

use std::io::{BufReader, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use uroce::{Access, Context, Endpoint, Mtu, Qp, QpType, WcOpcode, WcStatus};
use uroce_testkit::{Namespaces, netns_tools_present, pattern, read_line};

const ROLE: &str = "UROCE_SOAK_ROLE";
const SERVER: &str = "10.207.0.2";
const CLIENT: &str = "10.207.0.1";
const QPS: usize = 64;
/// Receives posted, and sends outstanding, per QP.
const DEPTH: usize = 8;
const SLOT: usize = 4096;
/// Resident memory a process may gain between the first tenth of the run and its end.
const GROWTH_LIMIT_KIB: u64 = 4096;

fn seconds() -> u64 {
    std::env::var("UROCE_SOAK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60)
}

/// Message `k` of QP `q`: its length and bytes.
fn message(q: usize, k: u32) -> Vec<u8> {
    let seed = (q as u64) << 32 | u64::from(k);
    let len = 1 + (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52) as usize % SLOT;
    pattern(seed, len)
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// `QPS` RC QPs on one CQ, connected to the peer's through `tcp`.
fn connect(ctx: &Context, tcp: &mut TcpStream) -> (uroce::Pd, uroce::Cq, Vec<Qp>) {
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(4 * QPS * DEPTH).unwrap();
    let qps: Vec<Qp> = (0..QPS)
        .map(|_| {
            let b = pd.qp(QpType::Rc, &cq).mtu(Mtu::Mtu1024).retries(12, 7, 7);
            b.depth(DEPTH as u32 * 2, DEPTH as u32 * 2).build().unwrap()
        })
        .collect();
    for qp in &qps {
        let peer: Endpoint = uroce::exchange(tcp, &qp.endpoint()).unwrap();
        qp.connect(&peer).unwrap();
    }
    (pd, cq, qps)
}

#[test]
fn soak_server_role() {
    if std::env::var(ROLE).as_deref() != Ok("server") {
        return;
    }
    let server: IpAddr = SERVER.parse().unwrap();
    let listener = TcpListener::bind((server, 0)).unwrap();
    println!("port {}", listener.local_addr().unwrap().port());
    std::io::stdout().flush().unwrap();
    let (mut tcp, _) = listener.accept().unwrap();
    let ctx = Context::open(server).unwrap();
    let (pd, cq, qps) = connect(&ctx, &mut tcp);
    let ring = pd.register(QPS * DEPTH * SLOT, Access::LOCAL_WRITE).unwrap();
    let slot = |q: usize, d: usize| (q * DEPTH + d) * SLOT..(q * DEPTH + d + 1) * SLOT;
    for (q, qp) in qps.iter().enumerate() {
        for d in 0..DEPTH {
            qp.post_recv((q * DEPTH + d) as u64, &ring, slot(q, d)).unwrap();
        }
    }
    writeln!(tcp, "ready").unwrap();
    // The client says how many messages it sent once all completed.
    let expected = Arc::new(AtomicU64::new(u64::MAX));
    let mut rd = BufReader::new(tcp.try_clone().unwrap());
    let e = Arc::clone(&expected);
    let reader = std::thread::spawn(move || {
        let l = read_line(&mut rd);
        e.store(l.strip_prefix("sent ").unwrap().parse().unwrap(), Ordering::Release);
        rd
    });
    let started = Instant::now();
    let (mut next, mut received, mut bad) = (vec![0u32; QPS], 0u64, Vec::new());
    let mut rss_early = None;
    while received < expected.load(Ordering::Acquire) {
        if rss_early.is_none() && started.elapsed() >= Duration::from_secs(seconds() / 10) {
            rss_early = Some(rss_kib());
        }
        assert!(started.elapsed() < Duration::from_secs(seconds() + 120), "the soak hung");
        for wc in cq.wait(Some(Duration::from_millis(100))).unwrap() {
            let (q, d) = (wc.wr_id as usize / DEPTH, wc.wr_id as usize % DEPTH);
            let k = wc.imm.map_or(u32::MAX, u32::from_be_bytes);
            let want = message(q, k);
            let ok = wc.status == WcStatus::SUCCESS
                && wc.opcode == WcOpcode::Recv
                && k == next[q]
                && wc.byte_len as usize == want.len()
                && ring.to_vec(slot(q, d).start..slot(q, d).start + want.len()).unwrap() == want;
            if !ok && bad.len() < 10 {
                bad.push(format!("QP {q}: message {k} (expected {}): {wc:?}", next[q]));
            }
            next[q] = k.wrapping_add(1);
            received += 1;
            qps[q].post_recv(wc.wr_id, &ring, slot(q, d)).unwrap();
        }
    }
    let rss_end = rss_kib();
    let mut tcp = tcp;
    let (c, n) = ctx.counters();
    eprintln!("server: {c:?}\nserver: {n:?}");
    writeln!(
        tcp,
        "received {received} bad {} rss_early {} rss_end {rss_end}",
        bad.len(),
        rss_early.unwrap_or(rss_end)
    )
    .unwrap();
    for b in &bad {
        writeln!(tcp, "{b}").unwrap();
    }
    let mut rd = reader.join().unwrap();
    let _ = read_line(&mut rd);
}

#[test]
fn soak_client_role() {
    if std::env::var(ROLE).as_deref() != Ok("client") {
        return;
    }
    let port: u16 = std::env::var("UROCE_SOAK_PORT").unwrap().parse().unwrap();
    let (server, client): (IpAddr, IpAddr) = (SERVER.parse().unwrap(), CLIENT.parse().unwrap());
    let mut tcp = TcpStream::connect((server, port)).unwrap();
    let mut rd = BufReader::new(tcp.try_clone().unwrap());
    let ctx = Context::open(client).unwrap();
    let (pd, cq, qps) = connect(&ctx, &mut tcp);
    assert_eq!(read_line(&mut rd), "ready");
    let src = pd.register(QPS * DEPTH * SLOT, Access::LOCAL_WRITE).unwrap();
    let (mut next, mut inflight) = (vec![0u32; QPS], vec![0usize; QPS]);
    let post = |q: usize, k: u32| {
        let m = message(q, k);
        let at = (q * DEPTH + k as usize % DEPTH) * SLOT;
        src.write(at, &m).unwrap();
        qps[q].send_with_imm(u64::from(k) << 8 | q as u64, &src, at..at + m.len(), k).unwrap();
    };
    let started = Instant::now();
    let mut rss_early = None;
    let (mut sent, mut failed) = (0u64, Vec::new());
    let mut sending = true;
    while sending || inflight.iter().any(|&n| n > 0) {
        let elapsed = started.elapsed();
        sending = elapsed < Duration::from_secs(seconds());
        if rss_early.is_none() && elapsed >= Duration::from_secs(seconds() / 10) {
            rss_early = Some(rss_kib());
        }
        assert!(elapsed < Duration::from_secs(seconds() + 120), "the soak hung");
        if sending {
            for q in 0..QPS {
                while inflight[q] < DEPTH {
                    post(q, next[q]);
                    next[q] += 1;
                    inflight[q] += 1;
                }
            }
        }
        for wc in cq.wait(Some(Duration::from_millis(100))).unwrap() {
            let q = (wc.wr_id & 0xFF) as usize;
            if wc.status != WcStatus::SUCCESS && failed.len() < 10 {
                failed.push(format!("{wc:?}"));
            }
            inflight[q] -= 1;
            sent += 1;
        }
    }
    let rss_end = rss_kib();
    writeln!(tcp, "sent {sent}").unwrap();
    let report = read_line(&mut rd);
    let details: Vec<String> = if report.contains(" bad 0 ") {
        Vec::new()
    } else {
        (0..10).map(|_| read_line(&mut rd)).collect()
    };
    writeln!(tcp, "bye").unwrap();
    let (c, n) = ctx.counters();
    println!(
        "result sent {sent} {report} client_rss_early {} client_rss_end {rss_end} retransmitted {} \
         timeouts {} seq_naks {} rnr_naks {}",
        rss_early.unwrap_or(rss_end),
        c.retransmitted_pkts,
        c.ack_timeouts,
        c.seq_naks_rcvd,
        c.rnr_naks_rcvd
    );
    eprintln!("client: {n:?}");
    assert!(failed.is_empty(), "sends failed: {failed:?}");
    assert!(report.contains(" bad 0 "), "server: {report}\n{}", details.join("\n"));
    assert!(report.starts_with(&format!("received {sent} ")), "server: {report}");
}

/// Runs the `soak_<role>_role` test in namespace `ns`.
fn spawn_role(ns: &str, role: &str, env: &[(&str, String)]) -> std::process::Child {
    let test = format!("soak_{role}_role");
    uroce_testkit::spawn_role_in(ns, &test, (ROLE, role), env, false)
}

/// The number after `key ` in `text`.
fn field(text: &str, key: &str) -> u64 {
    let at = text.find(&format!("{key} ")).unwrap_or_else(|| panic!("no {key} in {text}"));
    text[at + key.len() + 1..].split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn sixty_four_rc_pairs_for_a_minute_at_five_percent_loss_every_message_intact_memory_flat() {
    if std::env::var_os(ROLE).is_some() || !netns_tools_present() {
        return;
    }
    let ns = Namespaces::new('s', &[&format!("{CLIENT}/24")], &[&format!("{SERVER}/24")]);
    ns.set_loss(5);
    let mut server = spawn_role(&ns.b, "server", &[]);
    let mut out = BufReader::new(server.stdout.take().unwrap());
    let port = loop {
        let l = read_line(&mut out);
        // libtest's "test soak_server_role ... " precedes it on the same line.
        if let Some(p) = l.split("port ").nth(1) {
            break p.trim().to_string();
        }
        assert!(!l.is_empty() || server.try_wait().unwrap().is_none(), "server ended early");
    };
    let started = Instant::now();
    let client = spawn_role(&ns.a, "client", &[("UROCE_SOAK_PORT", port)]);
    let result = client.wait_with_output().unwrap();
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&result.stdout).to_string();
    if !result.status.success() {
        let _ = server.kill();
        let _ = server.wait();
        panic!("client failed:\n{text}");
    }
    assert!(server.wait().unwrap().success(), "server failed");
    let summary = text.lines().find_map(|l| l.find("result ").map(|i| &l[i..])).unwrap();
    eprintln!(
        "soak, {QPS} RC pairs, 5 % loss, {took:.1?}, {} packets dropped: {summary}",
        ns.dropped()
    );
    assert!(ns.dropped() > 0, "nftables dropped nothing");
    for (early, end) in [("rss_early", "rss_end"), ("client_rss_early", "client_rss_end")] {
        let (a, b) = (field(summary, early), field(summary, end));
        assert!(b <= a + GROWTH_LIMIT_KIB, "{end}: {a} KiB → {b} KiB");
    }
}
