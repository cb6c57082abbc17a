//! `uroce list`, `uroce server` and `uroce client` as a user runs them: a real server process,
//! every test once at a small size, and the bad inputs that must end in one line and status 2.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const ALL: [&str; 20] = [
    "tcp_lat",
    "tcp_bw",
    "udp_lat",
    "udp_bw",
    "rc_lat",
    "rc_bw",
    "rc_bi_bw",
    "rc_rdma_write_lat",
    "rc_rdma_write_bw",
    "rc_rdma_write_poll_lat",
    "rc_rdma_read_lat",
    "rc_rdma_read_bw",
    "rc_compare_swap_mr",
    "rc_fetch_add_mr",
    "uc_lat",
    "uc_bw",
    "uc_rdma_write_lat",
    "uc_rdma_write_bw",
    "ud_lat",
    "ud_bw",
];

/// Held by each test that spins a client and a server: on two cores, tests that measure in
/// parallel starve each other's threads (a UD stream lost every message so, and a ping-pong's
/// median is what the tick test judges).
fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static SPINNING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SPINNING.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn uroce(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uroce")).args(args).output().unwrap()
}

/// A server on `addr:port`, killed on drop.
struct Server(Child);

impl Server {
    fn start(addr: &str, port: u16) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_uroce"));
        cmd.args(["server", "--addr", addr, "--port", &port.to_string()]);
        Self::spawn(cmd)
    }

    /// Runs `cmd` (a `uroce server`, perhaps under `uroce exec`) until it says it listens.
    fn spawn(mut cmd: Command) -> Self {
        let child = cmd.stderr(Stdio::piped()).spawn().unwrap();
        let mut server = Self(child);
        // It says when it listens.
        let mut err = BufReader::new(server.0.stderr.take().unwrap());
        let mut line = String::new();
        err.read_line(&mut line).unwrap();
        assert!(line.contains("waiting for clients"), "{line}");
        std::thread::spawn(move || for _ in err.lines() {});
        server
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn list_names_every_test_once() {
    let out = uroce(&["list"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let names: Vec<&str> = text.lines().map(|l| l.split_whitespace().next().unwrap()).collect();
    assert_eq!(names, ALL);
}

/// Runs `tests` with `options` against the server of `every_test_runs_once_against_a_server`;
/// returns its JSON lines (it must succeed).
fn root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
    })
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

fn client_json(tests: &[&str], options: &[&str]) -> Vec<String> {
    let mut args = vec!["client", "127.0.0.23", "--port", "19801", "--local", "127.0.0.22"];
    args.extend(tests);
    args.extend(options);
    args.push("--json");
    let out = uroce(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect()
}

/// A stream of one-sided operations leaves the server's application with nothing to do, as
/// perftest's `ib_write_bw`/`ib_read_bw`/`ib_atomic_bw` servers have (its device's progress
/// thread answers): its test thread never polls its CQ, where it used to spin a core on it
/// for completions that never come. A SEND stream's server polls for its receives.
#[test]
fn a_one_sided_stream_leaves_the_servers_cq_unpolled() {
    let _one_at_a_time = exclusive();
    let _server = Server::start("127.0.0.23", 19801);
    let one_sided = ["rc_rdma_write_bw", "rc_rdma_read_bw", "rc_fetch_add_mr", "uc_rdma_write_bw"];
    let tests: Vec<&str> = one_sided.iter().copied().chain(["rc_bw"]).collect();
    let lines = client_json(&tests, &["-s", "4K", "-n", "2000", "--warmup", "10"]);
    assert_eq!(lines.len(), tests.len(), "{lines:?}");
    for (line, name) in lines.iter().zip(&tests) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["test"].as_str(), Some(*name), "{line}");
        assert!(v["bytes"].as_u64().unwrap() > 0, "{line}");
        let polls = v["applied"]["server_polls"].as_u64().unwrap();
        if one_sided.contains(name) {
            assert_eq!(polls, 0, "{line}");
        } else {
            assert!(polls > 0, "{line}");
        }
    }
}

/// A 4 MiB ping-pong has fewer receive slots than its window (the receive buffers stop at
/// 256 MiB): it posts what its queue holds, not a window's worth (it failed with "work queue
/// full" before sending anything).
#[test]
fn ping_pongs_of_4_mib_post_the_receives_their_queue_holds() {
    let _one_at_a_time = exclusive();
    let _server = Server::start("127.0.0.23", 19801);
    let tests = ["rc_lat", "uc_lat", "rc_rdma_write_lat", "rc_rdma_write_poll_lat"];
    let lines = client_json(&tests, &["-s", "4M", "-n", "5", "--warmup", "1"]);
    assert_eq!(lines.len(), tests.len(), "{lines:?}");
    for (line, name) in lines.iter().zip(tests) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!((v["test"].as_str(), v["size"].as_u64()), (Some(name), Some(4 << 20)), "{line}");
        assert!(v["latency"]["p50_us"].as_f64().is_some(), "{line}");
    }
}

#[test]
fn every_test_runs_once_against_a_server() {
    let _one_at_a_time = exclusive();
    let _server = Server::start("127.0.0.23", 19801);
    let mut args = vec!["client", "127.0.0.23", "--port", "19801", "--local", "127.0.0.22"];
    args.extend(ALL);
    args.extend(["-s", "256", "-n", "300", "--warmup", "20", "--json"]);
    let out = uroce(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 20, "{text}");
    for (line, name) in lines.iter().zip(ALL) {
        assert!(line.starts_with(&format!("{{\"test\":\"{name}\"")), "{line}");
        let size = if name.contains("_mr") { 8 } else { 256 };
        assert!(line.contains(&format!("\"size\":{size},")), "{line}");
        assert!(line.contains("\"iterations\":300,"), "{line}");
        let latency = name.ends_with("_lat");
        assert_eq!(!line.contains("\"latency\":null"), latency, "{line}");
        assert!(!line.contains("\"bytes\":0,"), "{line}: nothing moved");
        // A share of the machine's CPUs, counted over the time each side ran the test: never
        // more cores than there are (a 300-message run once showed 224 on two).
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        for side in ["client_cpu", "server_cpu"] {
            let cores = v[side]["cores"].as_f64().unwrap();
            assert!(cores <= num_cpus() as f64 * 1.05, "{name}: {side} {cores} cores: {line}");
        }
        // Streams count what arrived: the messages per second and the loss add up to what
        // was sent (UDP's loss is the kernel's socket buffer), and an RDMA stream keeps
        // enough receives posted that loopback loses next to none.
        if name.ends_with("_bw") {
            let arrived = v["msg_per_s"].as_f64().unwrap() * v["seconds"].as_f64().unwrap();
            let lost = v["lost"].as_f64().unwrap();
            let (sent, ratio) = (300.0, (arrived + lost) / 300.0);
            assert!((0.99..=1.01).contains(&ratio), "{name}: {arrived} + {lost} of {sent}: {line}");
            if !name.starts_with("udp") {
                assert!(lost < 30.0, "{name}: {lost} of 300 lost on loopback: {line}");
            }
        }
    }
    // The system's share too, over a run long enough to count it: never more cores than there
    // are (steal time counted as busy once put a 2-core run at 304 %).
    for line in client_json(&["rc_bw", "udp_lat"], &["-D", "0.6"]) {
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let cores = v["system_cores"].as_f64().expect("a system share over 0.6 s");
        assert!(cores <= num_cpus() as f64 * 1.05, "system {cores} cores: {line}");
    }
    // Each option's effect, as the client measured it where the option acts ("applied"),
    // against the same tests without it: an option parsed and then ignored fails here.
    let applied = |tests: &[&str], options: &[&str]| -> Vec<serde_json::Value> {
        let lines = client_json(tests, options);
        assert_eq!(lines.len(), tests.len(), "{lines:?}");
        lines
            .iter()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["applied"].clone())
            .collect()
    };
    let sockets = ["tcp_lat", "udp_lat", "tcp_bw"];
    // Tuned sockets: busy-polling, 1 MiB buffers, the client's test thread pinned to CPU 0.
    let tuned = applied(&sockets, &["--busy-poll", "--sockbuf", "1M", "--pin", "0,0", "-n", "200"]);
    let plain = applied(&sockets, &["-n", "200"]);
    for (name, (t, p)) in sockets.iter().zip(tuned.iter().zip(&plain)) {
        // A ping-pong waits for every answer: busy-polling spins there (a stream spins only
        // when the send buffer fills, which 200 messages do not).
        if name.ends_with("_lat") {
            assert!(t["would_block"].as_u64().unwrap() > 0, "{name}: busy-polling spun: {t}");
        }
        assert_eq!(p["would_block"], 0, "{name}: blocking sockets never spin: {p}");
        // Linux reports twice the size asked for (its bookkeeping included); root may set any
        // size, others up to the system's maximum.
        assert_ne!(t["sockbuf"], p["sockbuf"], "{name}: the buffers changed");
        if root() {
            assert_eq!(t["sockbuf"], serde_json::json!([2 << 20, 2 << 20]), "{name}");
        }
        assert_eq!(t["cpus"], serde_json::json!([0]), "{name}: pinned");
        assert!(p["cpus"].as_array().unwrap().len() >= 2 || num_cpus() == 1, "{name}: {p}");
    }
    // Inline SENDs and post lists.
    let rdma = ["rc_lat", "ud_lat", "rc_bw", "uc_bw"];
    let tuned = applied(&rdma, &["-s", "64", "--inline", "64", "--post-list", "4", "-n", "200"]);
    let plain = applied(&rdma, &["-s", "64", "-n", "200"]);
    for (name, (t, p)) in rdma.iter().zip(tuned.iter().zip(&plain)) {
        assert!(t["inline_posts"].as_u64().unwrap() >= 200, "{name}: SENDs went inline: {t}");
        assert_eq!(p["inline_posts"], 0, "{name}: {p}");
        if name.ends_with("_bw") {
            assert_eq!(t["post_burst"], serde_json::json!([4, 4]), "{name}: lists of 4: {t}");
            assert_eq!(p["post_burst"], serde_json::json!([1, 1]), "{name}: one at a time: {p}");
        }
    }
    // A local device address that is not this host's: one line, status 2.
    fails_with(
        &["client", "127.0.0.23", "--port", "19801", "--local", "192.0.2.1", "rc_lat"],
        "192.0.2.1 is not an address of this host",
    );
    // Streams spread over three QPs.
    let streams = ["rc_bw", "ud_bw", "rc_rdma_write_bw", "rc_bi_bw"];
    let three = applied(&streams, &["-s", "1K", "--qps", "3", "-n", "300"]);
    let one = applied(&streams, &["-s", "1K", "-n", "300"]);
    for (name, (t, o)) in streams.iter().zip(three.iter().zip(&one)) {
        assert_eq!((t["qps"].as_u64(), o["qps"].as_u64()), (Some(3), Some(1)), "{name}");
    }
    // The table form has a header and a row per result.
    let out = uroce(&[
        "client",
        "127.0.0.23",
        "--port",
        "19801",
        "--local",
        "127.0.0.22",
        "rc_lat",
        "tcp_lat",
        "-n",
        "100",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.lines().next().unwrap().starts_with("test"));
    assert_eq!(text.lines().count(), 3, "{text}");
}

/// One line on stderr naming the problem, status 2, nothing left running.
fn fails_with(args: &[&str], needle: &str) {
    let out = uroce(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.lines().next().unwrap().contains(needle), "{args:?}: {err}");
    assert!(out.stdout.is_empty() || String::from_utf8_lossy(&out.stdout).lines().count() <= 1);
}

/// `uroce` under `uroce exec` on device `addr`: the drop-in libibverbs is what `--verbs`
/// loads.
fn under_exec(addr: &str) -> Command {
    // `cargo test` builds the drop-in beside the test executables.
    let libs = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let mut c = Command::new(env!("CARGO_BIN_EXE_uroce"));
    c.env("UROCE_LIB_DIR", libs).args(["exec", "--addr", addr, "--", env!("CARGO_BIN_EXE_uroce")]);
    c
}

/// The verbs backend (`--verbs`, libibverbs loaded at run time) through uroce's drop-in: every
/// RDMA test `uroce list` names, polled, and the ping-pongs and a stream with completion
/// events; then the ways opening a verbs device fails.
#[test]
fn the_verbs_backend_runs_every_rdma_test_through_the_drop_in() {
    let _one_at_a_time = exclusive();
    let mut server = under_exec("127.0.0.53");
    server.args(["server", "--addr", "127.0.0.53", "--port", "19805", "--verbs", "--device"]);
    server.arg("uroce0");
    let _server = Server::spawn(server);
    let client = |tests: &[&str], options: &[&str]| -> Vec<serde_json::Value> {
        let mut c = under_exec("127.0.0.52");
        c.args(["client", "127.0.0.53", "--port", "19805", "--verbs", "--device", "uroce0"]);
        let out = c.args(tests).args(options).arg("--json").output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let text = String::from_utf8(out.stdout).unwrap();
        let v: Vec<serde_json::Value> =
            text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(v.len(), tests.len(), "{text}");
        v
    };
    let rdma: Vec<&str> =
        ALL.iter().copied().filter(|t| !t.starts_with("tcp") && !t.starts_with("udp")).collect();
    let results = client(&rdma, &["-s", "256", "-n", "300", "--warmup", "20"]);
    for (v, name) in results.iter().zip(&rdma) {
        assert_eq!(v["test"], *name);
        assert_eq!(v["iterations"], 300, "{name}: {v}");
        assert!(v["bytes"].as_u64().unwrap() > 0, "{name}: nothing moved: {v}");
        assert_eq!(v["latency"].is_null(), !name.ends_with("_lat"), "{name}: {v}");
        if name.ends_with("_bw") && !name.starts_with("rc") {
            assert!(v["lost"].as_u64().unwrap() < 30, "{name}: loopback lost: {v}");
        }
    }
    // Inline SENDs, post lists and three QPs take effect through the library too.
    let tuned = client(
        &["rc_bw", "ud_bw"],
        &["-s", "64", "--inline", "64", "--post-list", "4", "--qps", "3", "-n", "300"],
    );
    for v in &tuned {
        assert!(v["applied"]["inline_posts"].as_u64().unwrap() >= 300, "{v}");
        assert_eq!(v["applied"]["post_burst"], serde_json::json!([4, 4]), "{v}");
        assert_eq!(v["applied"]["qps"], 3, "{v}");
    }
    // Completion events: the channel's descriptor, `ibv_get_cq_event`, re-arming.
    for v in client(&["rc_lat", "ud_lat", "rc_rdma_write_bw"], &["-n", "200", "--events"]) {
        assert_eq!(v["iterations"], 200, "{v}");
    }
    // Opening a verbs device that is not there: one line, status 2.
    let fails = |c: &mut Command, needle: &str| {
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.lines().next().unwrap().contains(needle), "{err}");
    };
    let mut c = under_exec("127.0.0.52");
    c.args(["client", "127.0.0.53", "--port", "19805", "--verbs", "--device", "mlx5_0"]);
    fails(c.arg("rc_lat"), "no RDMA device 'mlx5_0' (listed: uroce0)");
    let mut c = under_exec("127.0.0.52");
    c.args(["client", "127.0.0.53", "--port", "19805", "--verbs", "--gid", "5", "rc_lat"]);
    fails(&mut c, "uroce0: GID index 5 of port 1 is empty");
    let mut c = Command::new(env!("CARGO_BIN_EXE_uroce"));
    c.env("UROCE_LIBIBVERBS", "/nonexistent/libibverbs.so.1");
    c.args(["client", "127.0.0.53", "--port", "19805", "--verbs", "rc_lat"]);
    fails(&mut c, "cannot load /nonexistent/libibverbs.so.1");
    fails_with(&["server", "--device", "uroce0"], "add --verbs");
}

/// More threads spinning than there are cores (the client's and the server's test threads,
/// plus one spinner per core): a ping-pong whose thread waits for the scheduler's next tick
/// while another spins shows milliseconds at its median (the figures of issue 17 swung from
/// 7 µs to 2,435 µs between runs; a poll loop that yields fails here at 1.5 ms). No p50 may
/// land on a tick: the bound, half a millisecond, is below the shortest tick (1 ms at HZ=1000)
/// and a hundred times what these tests take.
///
/// The two test threads are pinned to different CPUs (`--pin`, as `uroce compare` does). Left
/// to the scheduler they sometimes share one CPU while the spinners take the other, and two
/// threads that both spin on one CPU take turns a time slice at a time, whatever the stack
/// does: with both pinned to CPU 0 every test's p50 is 4 ms (HZ=250), the failures CI saw
/// once each for `ud_lat` (1,982 µs) and `rc_rdma_write_poll_lat` (2,751 µs). What is left is
/// the stack's own behaviour: a thread that polls must not yield its CPU, and one waiting for a
/// WRITE in memory must get it although its progress thread competes with a spinner.
#[test]
fn no_median_lands_on_a_scheduler_tick_when_more_threads_spin_than_there_are_cores() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let _one_at_a_time = exclusive();
    let _server = Server::start("127.0.0.83", 19806);
    let stop = Arc::new(AtomicBool::new(false));
    let spinners: Vec<_> = (0..num_cpus())
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                // Bounded: the client's run takes a second or two; a spinner stops after a
                // minute whatever happens.
                #[expect(clippy::disallowed_methods, reason = "a test bounds its own spinning")]
                let start = std::time::Instant::now();
                while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(60) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let tests =
        ["rc_lat", "ud_lat", "rc_rdma_write_lat", "rc_rdma_read_lat", "rc_rdma_write_poll_lat"];
    let mut args = vec!["client", "127.0.0.83", "--port", "19806", "--local", "127.0.0.82"];
    args.extend(tests);
    args.extend(["-n", "2000", "--json"]);
    let cpus = uroce_net::current_thread_cpus().unwrap();
    let pin = format!("{},{}", cpus[0], cpus[cpus.len() - 1]);
    if cpus.len() >= 2 {
        args.extend(["--pin", &pin]);
    }
    let out = uroce(&args);
    stop.store(true, Ordering::Relaxed);
    for s in spinners {
        s.join().unwrap();
    }
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), tests.len(), "{text}");
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let p50 = v["latency"]["p50_us"].as_f64().unwrap();
        assert!(p50 < 500.0, "{}: p50 {p50} µs with {} spinners: {line}", v["test"], num_cpus());
    }
}

#[test]
fn every_subcommand_has_help() {
    for cmd in ["server", "client", "compare", "decode", "stat", "qp", "capture", "list", "exec"] {
        let o = Command::new(env!("CARGO_BIN_EXE_uroce")).args([cmd, "--help"]).output().unwrap();
        // `exec` prints its own usage on standard error (its standard output is the command's).
        let text = String::from_utf8_lossy(if cmd == "exec" { &o.stderr } else { &o.stdout });
        let usage = if cmd == "exec" { "uroce exec [--addr" } else { "Usage:" };
        assert!(o.status.success() && text.contains(usage), "uroce {cmd} --help:\n{text}");
    }
}

#[test]
fn bad_input_is_one_line_and_status_2() {
    fails_with(&["client", "127.0.0.33", "rc_lat", "nosuch_test"], "unknown test 'nosuch_test'");
    fails_with(&["client", "127.0.0.33", "rc_lta"], "did you mean 'rc_lat'?");
    // Before any test runs (the first line is the refusal, not the matrix's progress).
    fails_with(
        &["compare", "--quick", "--out", "/proc/uroce-nowhere"],
        "--out /proc/uroce-nowhere",
    );
    fails_with(
        &["client", "127.0.0.33", "--port", "1", "rc_lat", "-n", "10"],
        "cannot reach a uroce server at 127.0.0.33:1",
    );
    fails_with(&["client", "127.0.0.33", "rc_lat", "-s", "0"], "size 0");
    fails_with(&["client", "127.0.0.33", "rc_lat", "-s", "4G"], "2^31");
    fails_with(
        &["client", "127.0.0.33", "tcp_lat", "--events"],
        "--events applies to RDMA tests only",
    );
    fails_with(&["client", "127.0.0.33", "ud_lat", "-s", "8K"], "exceeds one datagram");
    fails_with(
        &["client", "127.0.0.33", "rc_fetch_add_mr", "rc_lat", "--no-nodelay"],
        "--no-nodelay applies to TCP tests only",
    );
    fails_with(&["client", "not-an-address", "rc_lat"], "not an IP address");
    fails_with(
        &["client", "127.0.0.33", "rc_lat", "--busy-poll"],
        "apply to TCP and UDP tests only",
    );
    fails_with(
        &["client", "127.0.0.33", "tcp_lat", "--pin", "0"],
        "--pin takes CLIENT_CPU,SERVER_CPU",
    );
    fails_with(&["client"], "SERVER");
    fails_with(&["server", "--addr", "192.0.2.1", "--port", "19802"], "192.0.2.1");
}

/// A UD ping-pong counts a round its peer does not answer as lost and goes on; a server that
/// dies answers none again, and the client must end (with an error naming why) instead of
/// spinning for ever on a count of answered rounds it will never reach.
#[test]
fn a_ud_ping_pong_whose_server_dies_ends_with_an_error() {
    let _one_at_a_time = exclusive();
    let server = Server::start("127.0.0.45", 19805);
    let mut client = Command::new(env!("CARGO_BIN_EXE_uroce"))
        .args(["client", "127.0.0.45", "--port", "19805", "--local", "127.0.0.46"])
        .args(["ud_lat", "-s", "64", "-n", "1000000000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    #[expect(clippy::disallowed_methods, reason = "the client runs a while before the kill")]
    std::thread::sleep(Duration::from_secs(1));
    drop(server); // SIGKILL
    let status = (0..600).find_map(|_| {
        #[expect(clippy::disallowed_methods, reason = "a bounded wait for the client to end")]
        std::thread::sleep(Duration::from_millis(100));
        client.try_wait().unwrap()
    });
    if status.is_none() {
        let _ = client.kill();
    }
    let mut err = String::new();
    std::io::Read::read_to_string(&mut client.stderr.take().unwrap(), &mut err).unwrap();
    let status = status.expect("the client still ran 60 s after its server died");
    assert!(!status.success(), "{err}");
    assert!(err.contains("the peer stopped answering"), "{err}");
}

#[test]
fn a_version_mismatch_is_refused_on_both_sides() {
    // A client speaking another version: the server says why.
    let _server = Server::start("127.0.0.43", 19803);
    let mut s = TcpStream::connect(("127.0.0.43", 19803)).unwrap();
    s.write_all(b"uroce-perf 99\n").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    assert!(line.contains("version mismatch: server speaks 1, client 99"), "{line}");
    // A server speaking another version: the client says so and exits 2.
    let fake = TcpListener::bind(("127.0.0.44", 0)).unwrap();
    let port = fake.local_addr().unwrap().port().to_string();
    let t = std::thread::spawn(move || {
        let (mut s, _) = fake.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut hello = String::new();
        BufReader::new(s.try_clone().unwrap()).read_line(&mut hello).unwrap();
        s.write_all(b"error version mismatch: server speaks 99, client 1\n").unwrap();
    });
    fails_with(&["client", "127.0.0.44", "--port", &port, "rc_lat"], "server speaks 99, client 1");
    t.join().unwrap();
}

/// `UROCE_FABRIC=udp` on the client only: its packets go through the kernel, the server's
/// back over shared memory (a device sends to a local peer that way unless told otherwise),
/// and the figures measure neither path. The client says so, and its JSON gives both sides'
/// counts; with the variable on both sides it says nothing.
#[test]
fn a_client_warns_when_the_server_answers_through_another_path() {
    let _one_at_a_time = exclusive();
    let run = |server_env: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_uroce"));
        cmd.args(["server", "--addr", "127.0.0.92", "--port", "19812"]);
        match server_env {
            Some(fabric) => cmd.env("UROCE_FABRIC", fabric),
            None => cmd.env_remove("UROCE_FABRIC"),
        };
        let _server = Server::spawn(cmd);
        let out = Command::new(env!("CARGO_BIN_EXE_uroce"))
            .args(["client", "127.0.0.92", "--port", "19812", "--local", "127.0.0.93"])
            .args(["rc_lat", "ud_lat", "-s", "64", "-n", "200", "--json"])
            .env("UROCE_FABRIC", "udp")
            .output()
            .unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(out.status.success(), "{err}");
        let rows: Vec<serde_json::Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), 2, "{rows:?}");
        (rows, err)
    };
    let (rows, err) = run(None);
    for r in &rows {
        let a = &r["applied"];
        assert!(a["udp_datagrams"].as_u64().unwrap() > 0 && a["shm_packets"] == 0, "{r}");
        assert!(a["server_shm_packets"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(a["server_udp_datagrams"], 0, "{r}");
    }
    assert_eq!(err.matches("warning").count(), 1, "once a run: {err}");
    assert!(err.contains("the two directions took different paths"), "{err}");
    assert!(err.contains("UROCE_FABRIC"), "{err}");

    let (rows, err) = run(Some("udp"));
    for r in &rows {
        let a = &r["applied"];
        assert!(a["server_udp_datagrams"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(a["server_shm_packets"], 0, "{r}");
    }
    assert!(!err.contains("warning"), "{err}");
}
