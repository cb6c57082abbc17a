//! `uroce stat`, `uroce qp` and `uroce capture` looking at running programs from outside.
//!
//! Three processes on two devices (A with one process, B with two): RC between A and B, UD
//! from B to A, and one RC QP driven into Error on purpose (a WRITE with an R_Key that does not
//! exist). The processes are this test binary run again as workers (the `worker_role` test,
//! which does nothing unless `UROCE_TEST_ROLE` is set), driven line by line on stdin.
//!
//! Checked: `uroce qp` lists every QP with its process, type, state, error status and counters;
//! `uroce stat` deltas over an interval equal the sums of the processes' own counters;
//! `uroce capture -c 1000`, started in the middle of a run, over shared memory and over UDP,
//! gives packets whose every ICRC verifies and that tshark decodes without a malformed one;
//! another user is refused by all three.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::disallowed_methods, reason = "a multi-process test bounds its waits by the clock")]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

use uroce::{Access, Context, Endpoint, QKey, QpType, Qpn, RKey, RemoteMr, WcStatus};
use uroce_testkit::{describe, installed, tshark_finds_nothing_malformed};

const ROLE: &str = "UROCE_TEST_ROLE";
const QKEY: QKey = QKey(0x11);
const MSG: usize = 1024;
/// Receives each QP keeps posted (more than a test sends it).
const RECVS: usize = 8192;
const RECVS_U32: u32 = 8192;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

/// The worker: opens a device and obeys its commands, one per line, answering each with one
/// line.
#[test]
fn worker_role() {
    let Ok(addr) = std::env::var(ROLE) else { return };
    let ctx = Context::open(addr.parse().unwrap()).unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(65_536).unwrap();
    let buf = pd.register(RECVS * MSG, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let mut qps: BTreeMap<String, uroce::Qp> = BTreeMap::new();
    let mut remotes: BTreeMap<String, RemoteMr> = BTreeMap::new();
    let mut ahs = Vec::new();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let line = line.unwrap();
        let w: Vec<&str> = line.split(' ').collect();
        let answer = match w[..] {
            // A QP: prints its endpoint (RC, UD).
            ["rc" | "ud", name] => {
                let t = if w[0] == "rc" { QpType::Rc } else { QpType::Ud };
                let qp = pd.qp(t, &cq).depth(4096, RECVS_U32).qkey(QKEY).build().unwrap();
                for k in 0..RECVS / 2 {
                    let at = k * MSG;
                    qp.post_recv(
                        k as u64,
                        &buf,
                        at..at + MSG + if t == QpType::Ud { 40 } else { 0 },
                    )
                    .unwrap();
                }
                let ep = hex(&qp.endpoint().with_region(buf.remote()).to_bytes());
                qps.insert(name.to_owned(), qp);
                ep
            }
            ["connect", name, ep] => {
                let ep = Endpoint::from_bytes(&unhex(ep)).unwrap();
                qps[name].connect(&ep).unwrap();
                remotes.insert(name.to_owned(), ep.regions[0]);
                "ok".to_owned()
            }
            // COUNT RDMA WRITEs into the peer's region (they take no receive, so a run can be
            // as long as a test needs); waits for their completions.
            // RDMA WRITEs for MILLIS milliseconds.
            ["stream", name, millis] => {
                let until = Instant::now() + Duration::from_millis(millis.parse().unwrap());
                let qp = &qps[name];
                let mut k = 0usize;
                while Instant::now() < until {
                    for _ in 0..256 {
                        let at = (k % RECVS) * MSG;
                        qp.write(k as u64, &buf, 0..MSG, remotes[name].at(at as u64)).unwrap();
                        k += 1;
                    }
                    wait_for(&cq, qp.qpn(), uroce::WcOpcode::RdmaWrite, 256);
                }
                k.to_string()
            }
            ["write", name, count] => {
                let n: usize = count.parse().unwrap();
                let qp = &qps[name];
                for k in 0..n {
                    let at = (k % RECVS) * MSG;
                    qp.write(k as u64, &buf, 0..MSG, remotes[name].at(at as u64)).unwrap();
                    if k % 256 == 255 {
                        wait_for(&cq, qp.qpn(), uroce::WcOpcode::RdmaWrite, 256);
                    }
                }
                wait_for(&cq, qp.qpn(), uroce::WcOpcode::RdmaWrite, n % 256);
                "ok".to_owned()
            }
            // COUNT SENDs on an RC QP, or to a UD QP at ADDR; waits for their completions.
            ["send", name, count] | ["send", name, count, _, _] => {
                let n: usize = count.parse().unwrap();
                let ud = w.get(3).map(|a| {
                    let ah = pd.create_ah(a.parse::<IpAddr>().unwrap()).unwrap();
                    (ah, Qpn::new(w[4].parse().unwrap()).unwrap())
                });
                let qp = &qps[name];
                for k in 0..n {
                    match &ud {
                        Some((ah, qpn)) => {
                            qp.send_to(k as u64, &buf, 0..MSG, ah, *qpn, QKEY).unwrap()
                        }
                        None => qp.send(k as u64, &buf, 0..MSG).unwrap(),
                    }
                    // Never more than a few hundred in flight.
                    if k % 256 == 255 {
                        wait_for(&cq, qp.qpn(), uroce::WcOpcode::Send, 256);
                    }
                }
                wait_for(&cq, qp.qpn(), uroce::WcOpcode::Send, n % 256);
                if let Some((ah, _)) = ud {
                    ahs.push(ah);
                }
                "ok".to_owned()
            }
            // A WRITE with an R_Key nobody gave: the QP ends in Error.
            ["badwrite", name] => {
                let bogus = RemoteMr { addr: 0x1000, len: 64, rkey: RKey(0x00de_ad00) };
                let qp = &qps[name];
                qp.write(7, &buf, 0..64, bogus).unwrap();
                let wc = cq.wait_one(Some(Duration::from_secs(10))).unwrap();
                assert_eq!(wc.qp_num, qp.qpn());
                format!("{:?}", wc.status == WcStatus::REM_ACCESS_ERR)
            }
            ["qpn", name] => qps[name].qpn().get().to_string(),
            ["pid"] => std::process::id().to_string(),
            // The process's own counters, as `name=value` words.
            ["counters"] => {
                let (engine, net) = ctx.counters();
                let mut s: Vec<String> =
                    engine.fields().iter().map(|(n, v)| format!("{n}={v}")).collect();
                s.extend(net.fields().iter().map(|(n, v)| format!("{n}={v}")));
                s.join(" ")
            }
            ["quit"] => return,
            _ => panic!("unknown command {line:?}"),
        };
        writeln!(out, "{answer}").unwrap();
        out.flush().unwrap();
    }
}

/// Takes `n` successful `opcode` completions of `qpn` (receive completions are dropped).
fn wait_for(cq: &uroce::Cq, qpn: Qpn, opcode: uroce::WcOpcode, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = 0;
    while got < n {
        assert!(Instant::now() < deadline, "sends did not complete");
        for wc in cq.wait(Some(Duration::from_millis(100))).unwrap() {
            if wc.qp_num == qpn && wc.opcode == opcode {
                assert_eq!(wc.status, WcStatus::SUCCESS);
                got += 1;
            }
        }
    }
}

/// A worker process.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pid: u32,
}

impl Worker {
    fn start(addr: &str, udp: bool) -> Self {
        Self::start_with(addr, udp, None)
    }

    /// A worker run as uid and gid `user` (needs root).
    fn start_with(addr: &str, udp: bool, user: Option<u32>) -> Self {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = match user {
            None => Command::new(exe),
            Some(u) => {
                let mut c = Command::new("setpriv");
                c.args([format!("--reuid={u}"), format!("--regid={u}"), "--clear-groups".into()])
                    .arg(exe);
                c
            }
        };
        cmd.args(["--exact", "worker_role", "--nocapture", "--test-threads=1", "-q"])
            .env(ROLE, addr)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if udp {
            cmd.env("UROCE_FABRIC", "udp");
        }
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut w = Self { child, stdin, stdout, pid: 0 };
        w.pid = w.ask("pid").parse().unwrap();
        w
    }

    fn tell(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn answer(&mut self) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(self.stdout.read_line(&mut line).unwrap() > 0, "worker {} exited", self.pid);
            // The test harness's own lines ("running 1 test", …) are not answers.
            let l = line.trim_end();
            if !l.starts_with("running ") && !l.is_empty() && !l.starts_with("test ") {
                return l.to_owned();
            }
        }
    }

    fn ask(&mut self, cmd: &str) -> String {
        self.tell(cmd);
        self.answer()
    }

    fn counters(&mut self) -> BTreeMap<String, u64> {
        self.ask("counters")
            .split(' ')
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap();
                (k.to_owned(), v.parse().unwrap())
            })
            .collect()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn uroce(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uroce")).args(args).output().unwrap()
}

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", describe(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(o)))
}

/// The three workers, connected: A runs `rc` (to B1's `rc`), `victim` (to B2's `bad`) and
/// `ud`; B1 runs `rc`; B2 runs `ud` and `bad`.
struct Setup {
    a: Worker,
    b1: Worker,
    b2: Worker,
}

fn connect(x: &mut Worker, xn: &str, y: &mut Worker, yn: &str) {
    let ex = x.ask(&format!("rc {xn}"));
    let ey = y.ask(&format!("rc {yn}"));
    assert_eq!(x.ask(&format!("connect {xn} {ey}")), "ok");
    assert_eq!(y.ask(&format!("connect {yn} {ex}")), "ok");
}

fn setup(a: &str, b: &str, udp: bool) -> Setup {
    let (mut wa, mut b1, mut b2) =
        (Worker::start(a, udp), Worker::start(b, udp), Worker::start(b, udp));
    connect(&mut wa, "rc", &mut b1, "rc");
    connect(&mut wa, "victim", &mut b2, "bad");
    wa.ask("ud ud");
    b2.ask("ud ud");
    Setup { a: wa, b1, b2 }
}

fn qps_by_qpn(v: &serde_json::Value) -> BTreeMap<u64, serde_json::Value> {
    v["qps"].as_array().unwrap().iter().map(|q| (q["qpn"].as_u64().unwrap(), q.clone())).collect()
}

/// The sum of the workers' counter `name`.
fn sum(ws: &mut [&mut Worker], name: &str) -> u64 {
    ws.iter_mut().map(|w| w.counters()[name]).sum()
}

/// Counters that move only with traffic (the progress thread's own, and the polls a snapshot
/// request causes, move by themselves).
const TRAFFIC: [&str; 8] = [
    "sent_pkts",
    "rcvd_pkts",
    "sent_bytes",
    "rcvd_bytes",
    "shm_tx_packets",
    "shm_rx_packets",
    "rnr_naks_sent",
    "retransmitted_pkts",
];

fn device<'a>(v: &'a serde_json::Value, addr: &str) -> &'a serde_json::Value {
    v["devices"].as_array().unwrap().iter().find(|d| d["addr"] == addr).unwrap()
}

#[test]
fn qp_and_stat_see_three_processes_on_two_devices() {
    let (a, b) = ("127.0.28.1", "127.0.28.2");
    let mut s = setup(a, b, false);
    let (rc_a, victim, ud_a) = (s.a.ask("qpn rc"), s.a.ask("qpn victim"), s.a.ask("qpn ud"));
    let (rc_b1, bad, ud_b2) = (s.b1.ask("qpn rc"), s.b2.ask("qpn bad"), s.b2.ask("qpn ud"));
    assert_eq!(s.b1.ask("send rc 100"), "ok");
    assert_eq!(s.b2.ask(&format!("send ud 50 {a} {ud_a}")), "ok");
    assert_eq!(s.b2.ask("badwrite bad"), "true");
    // The UD datagrams' receiver may still be taking them: wait until A has them all.
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.a.counters()["rcvd_pkts"] < 150 {
        assert!(Instant::now() < deadline, "A did not receive everything");
        std::thread::sleep(Duration::from_millis(20));
    }

    let v = json(&uroce(&["qp", a, b, "--json"]));
    let qps = qps_by_qpn(&v);
    let get =
        |n: &str| qps.get(&n.parse::<u64>().unwrap()).unwrap_or_else(|| panic!("qp {n}: {v}"));
    assert_eq!(qps.len(), 6, "{v:#}");
    for (n, pid, t, state, dev) in [
        (&rc_a, s.a.pid, "RC", "RTS", a),
        (&victim, s.a.pid, "RC", "ERR", a),
        (&ud_a, s.a.pid, "UD", "RTS", a),
        (&rc_b1, s.b1.pid, "RC", "RTS", b),
        (&bad, s.b2.pid, "RC", "ERR", b),
        (&ud_b2, s.b2.pid, "UD", "RTS", b),
    ] {
        let q = get(n);
        assert_eq!((q["pid"].as_u64(), q["type"].as_str()), (Some(u64::from(pid)), Some(t)), "{q}");
        assert_eq!((q["state"].as_str(), q["device"].as_str()), (Some(state), Some(dev)), "{q}");
        assert_eq!(q["process"].as_str().map(str::is_empty), Some(false), "{q}");
    }
    // Connected QPs name their peer and their path (two devices of one host: shared memory).
    assert_eq!(get(&rc_b1)["remote"], a);
    assert_eq!(get(&rc_b1)["remote_qpn"].as_u64(), rc_a.parse().ok());
    assert_eq!(get(&rc_b1)["path"], "shm");
    // 100 SENDs, and what the tail-loss probe sent again if an ACK came late (both cores busy):
    // the receiver counts a probe it takes as a duplicate too.
    let probes = get(&rc_b1)["counters"]["tail_probes"].as_u64().unwrap();
    assert_eq!(get(&rc_b1)["counters"]["sent_pkts"].as_u64(), Some(100 + probes));
    assert_eq!(get(&rc_a)["counters"]["rcvd_pkts"].as_u64(), Some(100 + probes));
    assert_eq!(get(&ud_b2)["counters"]["sent_pkts"].as_u64(), Some(50));
    assert_eq!(get(&ud_a)["counters"]["rcvd_pkts"].as_u64(), Some(50));
    // The status that ended each side of the bad connection.
    assert_eq!(get(&bad)["error_status"], "IBV_WC_REM_ACCESS_ERR", "{}", get(&bad));
    assert_eq!(get(&victim)["error_status"], "IBV_WC_REM_ACCESS_ERR", "{}", get(&victim));
    let table = uroce(&["qp"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success() && text.contains("ERR"), "{}", describe(&table));

    // Deltas over an interval: the same as the processes' own.
    let before_stat = json(&uroce(&["stat", "--json"]));
    let before: Vec<BTreeMap<String, u64>> =
        [&mut s.a, &mut s.b1, &mut s.b2].into_iter().map(Worker::counters).collect();
    assert_eq!(s.b1.ask("send rc 300"), "ok");
    assert_eq!(s.b2.ask(&format!("send ud 40 {a} {ud_a}")), "ok");
    while s.a.counters()["rcvd_pkts"] < 150 + 340 {
        assert!(Instant::now() < deadline + Duration::from_secs(10), "A lags");
        std::thread::sleep(Duration::from_millis(20));
    }
    let after: Vec<BTreeMap<String, u64>> =
        [&mut s.a, &mut s.b1, &mut s.b2].into_iter().map(Worker::counters).collect();
    let after_stat = json(&uroce(&["stat", "--json"]));
    // The workers' counters did not move while the tool looked: the comparison is exact.
    assert_eq!(
        sum(&mut [&mut s.a, &mut s.b1, &mut s.b2], "sent_pkts"),
        after.iter().map(|c| c["sent_pkts"]).sum::<u64>()
    );
    for (dev, members) in [(a, &[0usize][..]), (b, &[1, 2][..])] {
        let (d0, d1) = (device(&before_stat, dev), device(&after_stat, dev));
        assert_eq!(d1["processes"].as_array().unwrap().len(), members.len(), "{d1}");
        for name in TRAFFIC {
            let tool = d1["uroce"][name].as_u64().unwrap() - d0["uroce"][name].as_u64().unwrap();
            let own: u64 = members.iter().map(|&m| after[m][name] - before[m][name]).sum();
            assert_eq!(tool, own, "{dev} {name}");
        }
        // rxe's names are made of the same counters.
        let sent = d1["counters"]["sent_pkts"].as_u64().unwrap();
        assert_eq!(sent, members.iter().map(|&m| after[m]["sent_pkts"]).sum::<u64>());
    }
    let moved = |name: &str| {
        device(&after_stat, b)["uroce"][name].as_u64().unwrap()
            - device(&before_stat, b)["uroce"][name].as_u64().unwrap()
    };
    assert_eq!(
        moved("sent_pkts"),
        340 + moved("tail_probes"),
        "B sent 300 RC SENDs and 40 UD datagrams (and what a tail-loss probe sent again)"
    );
    // With an interval, rates; nothing moves while the workers are idle.
    let rates = json(&uroce(&["stat", b, "-i", "0.2", "-c", "1", "--json"]));
    assert_eq!(device(&rates, b)["counters_per_sec"]["sent_pkts"].as_f64(), Some(0.0), "{rates}");
}

/// Captures 1000 packets from the middle of a run and checks them with `uroce decode` (every
/// ICRC) and tshark (nothing malformed).
fn capture_mid_run(a: &str, b: &str, udp: bool, tag: &str) {
    let mut s = setup(a, b, udp);
    let pcap =
        std::env::temp_dir().join(format!("uroce-capture-{tag}-{}.pcap", std::process::id()));
    // A run long enough that the capture starts in its middle.
    s.b1.tell("stream rc 4000");
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    let cap = uroce(&["capture", a, b, "-c", "1000", "-w", pcap.to_str().unwrap(), "-D", "30"]);
    let took = started.elapsed();
    let writes: u64 = s.b1.answer().parse().unwrap();
    assert!(cap.status.success(), "{}", describe(&cap));
    eprintln!("{tag}: {writes} WRITEs in 4 s");
    let err = String::from_utf8_lossy(&cap.stderr);
    assert!(err.contains("1000 packet(s) captured"), "{err}");
    eprintln!("{tag}: capture of 1000 packets took {took:?}");
    let dec = uroce(&["decode", pcap.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&dec.stdout);
    assert!(dec.status.success(), "{}", describe(&dec));
    assert_eq!(text.lines().count(), 1000);
    assert!(text.lines().all(|l| l.ends_with("icrc=ok")), "{text}");
    // Both directions: WRITEs from B, ACKs from A; and none twice.
    assert!(text.contains("RC_RDMA_WRITE_ONLY") && text.contains("RC_ACKNOWLEDGE"), "{text}");
    let mut psns: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("RC_RDMA_WRITE_ONLY"))
        .filter_map(|l| l.split(' ').find(|w| w.starts_with("psn=")))
        .collect();
    let n = psns.len();
    psns.sort_unstable();
    psns.dedup();
    // On this path nothing is lost, so nothing repeats but what a tail-loss probe sent again
    // (an ACK late because every core was busy: one packet per probe).
    let probes = s.b1.counters()["tail_probes"];
    let repeated = u64::try_from(n - psns.len()).unwrap();
    assert!(repeated <= probes, "{repeated} WRITEs captured twice, {probes} probes");
    if udp {
        // B's IPv4 packets leave from connected sockets, numbered by each socket's counter:
        // the capture shows the identification each left with (it once showed 0 for all,
        // copied before the socket was chosen).
        let bytes = std::fs::read(&pcap).unwrap();
        let ip_b: std::net::Ipv4Addr = b.parse().unwrap();
        let ids: std::collections::BTreeSet<u16> = uroce_wire::pcap::read_frames(&bytes)
            .unwrap()
            .iter()
            .filter_map(|f| f.ip_packet())
            .filter(|ip| ip.get(12..16) == Some(&ip_b.octets()[..]))
            .map(|ip| u16::from_be_bytes([ip[4], ip[5]]))
            .collect();
        assert!(ids.len() > 10, "B's frames carry {} identifications", ids.len());
    }
    tshark_finds_nothing_malformed(&pcap);
    let _ = std::fs::remove_file(&pcap);
}

#[test]
fn capture_in_the_middle_of_a_shared_memory_run() {
    capture_mid_run("127.0.28.5", "127.0.28.6", false, "shm");
}

#[test]
fn capture_in_the_middle_of_a_udp_run() {
    capture_mid_run("127.0.28.9", "127.0.28.10", true, "udp");
}

#[test]
fn a_live_capture_prints_decoded_packets_and_follows_one_qp() {
    let (a, b) = ("127.0.28.13", "127.0.28.14");
    let mut s = setup(a, b, false);
    let rc_a = s.a.ask("qpn rc");
    s.b1.tell("stream rc 4000");
    std::thread::sleep(Duration::from_millis(50));
    // Only the victim's QP: idle, so nothing but what goes to or from it.
    let victim = s.a.ask("qpn victim");
    let quiet = uroce(&["capture", a, b, "--qp", &victim, "-D", "0.5"]);
    assert!(quiet.status.success(), "{}", describe(&quiet));
    assert!(quiet.stdout.is_empty(), "{}", describe(&quiet));
    let live = uroce(&["capture", a, b, "--qp", &rc_a, "-c", "50", "-D", "30"]);
    s.b1.answer();
    let text = String::from_utf8_lossy(&live.stdout);
    assert!(live.status.success(), "{}", describe(&live));
    assert_eq!(text.lines().count(), 50, "{text}");
    for l in text.lines() {
        assert!(l.ends_with("icrc=ok"), "{l}");
        // To A's QP (the WRITEs), or to its peer (the ACKs).
        assert!(l.contains("RC_RDMA_WRITE_ONLY") || l.contains("RC_ACKNOWLEDGE"), "{l}");
    }
}

/// Whether this test can run programs as another user (root and `setpriv`); says why not.
fn can_become_another_user() -> bool {
    if !installed(&["setpriv"], "util-linux") {
        return false;
    }
    if !Command::new("id").arg("-u").output().unwrap().stdout.starts_with(b"0\n") {
        eprintln!("skipped: needs root to become another user");
        return false;
    }
    true
}

#[test]
fn another_user_is_refused_by_all_three() {
    if !can_become_another_user() {
        return;
    }
    let a = "127.0.28.17";
    let _w = Worker::start(a, false);
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", env!("CARGO_BIN_EXE_uroce")])
            .args(args)
            .output()
            .unwrap()
    };
    for args in [&["stat", a][..], &["qp"][..], &["capture", a, "-c", "1", "-D", "1"][..]] {
        let o = as_nobody(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", describe(&o));
        assert!(err.contains("permission denied") && err.contains("uid 0"), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?}: {}", describe(&o));
    }
    // Root sees it.
    let v = json(&uroce(&["stat", a, "--json"]));
    assert_eq!(v["devices"].as_array().map(Vec::len), Some(1));
}

/// Root sees and captures another user's processes (its rings, created in that user's
/// directory, are given to that user, so the captured process can open them).
#[test]
fn root_sees_and_captures_another_users_device() {
    if !can_become_another_user() {
        return;
    }
    let (a, b) = ("127.0.28.35", "127.0.28.36");
    let mut x = Worker::start_with(a, false, Some(65534));
    let mut y = Worker::start_with(b, false, Some(65534));
    connect(&mut x, "rc", &mut y, "rc");
    let v = json(&uroce(&["qp", a, b, "--json"]));
    let pids: Vec<u64> =
        v["qps"].as_array().unwrap().iter().filter_map(|q| q["pid"].as_u64()).collect();
    assert_eq!(pids.len(), 2, "{v}");
    assert!(pids.contains(&u64::from(x.pid)) && pids.contains(&u64::from(y.pid)), "{v}");
    y.tell("stream rc 2000");
    std::thread::sleep(Duration::from_millis(100));
    let cap = uroce(&["capture", a, b, "-c", "100", "-D", "20"]);
    y.answer();
    assert!(cap.status.success(), "{}", describe(&cap));
    let text = String::from_utf8_lossy(&cap.stdout);
    assert_eq!(text.lines().count(), 100, "{}", describe(&cap));
    assert!(text.lines().all(|l| l.ends_with("icrc=ok")), "{text}");
}

#[test]
fn watch_prints_a_qp_going_to_error_with_its_status() {
    let (a, b) = ("127.0.28.21", "127.0.28.22");
    let mut s = setup(a, b, false);
    let bad = s.b2.ask("qpn bad");
    let watch = Command::new(env!("CARGO_BIN_EXE_uroce"))
        .args(["qp", a, b, "--watch", "-i", "0.05", "-D", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(s.b2.ask("badwrite bad"), "true");
    let o = watch.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", describe(&o));
    // First every QP as it is, then the change.
    assert_eq!(text.lines().filter(|l| l.starts_with("qp ")).count(), 6, "{text}");
    let bad_hex = format!("qp {:#x} RC", bad.parse::<u32>().unwrap());
    let change = text
        .lines()
        .find(|l| l.starts_with("state") && l.contains(&bad_hex))
        .unwrap_or_else(|| panic!("no state change of {bad_hex}:\n{text}"));
    assert!(change.contains("RTS -> ERR (IBV_WC_REM_ACCESS_ERR)"), "{change}");
    assert!(change.contains(&format!("pid {}", s.b2.pid)), "{change}");
}

/// Two captures at once (as two tcpdumps on one interface): both get every packet.
#[test]
fn two_captures_at_once_each_see_the_traffic() {
    let (a, b) = ("127.0.28.25", "127.0.28.26");
    let mut s = setup(a, b, false);
    s.b1.tell("stream rc 3000");
    std::thread::sleep(Duration::from_millis(100));
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_uroce"))
            .args(["capture", a, b, "-c", "300", "-D", "20"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (one, two) = (run(), run());
    let (one, two) = (one.wait_with_output().unwrap(), two.wait_with_output().unwrap());
    s.b1.answer();
    for o in [one, two] {
        assert!(o.status.success(), "{}", describe(&o));
        let text = String::from_utf8_lossy(&o.stdout);
        assert_eq!(text.lines().count(), 300, "{}", describe(&o));
        assert!(text.lines().all(|l| l.ends_with("icrc=ok")), "{text}");
    }
}
