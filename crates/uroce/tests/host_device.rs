//! The host-wide device: eight processes, four on each of two shared devices, every process of
//! one device with an RC QP to every process of the other (16 connections at once) and one UD
//! QP each. SEND, WRITE, READ back and atomics from 1 B to 16 MiB, and UD datagrams, all data
//! verified; all of it between processes of one host, so over the shared-memory path.
//!
//! A second run kills one process with SIGKILL in the middle: the other connections complete
//! intact, the killed process's four peers end with RETRY_EXC_ERR, and a new process then opens
//! the device and runs.
//!
//! A third puts each device in a network namespace of its own, two processes per namespace on
//! its one address, joined by a veth pair on which nftables drops 1 % of the RoCEv2 packets:
//! RC recovers every byte over UDP, UD datagrams arrive whole or not at all.
//!
//! The test process coordinates over a Unix socket (reachable from any namespace); it re-runs
//! its own executable as the workers (the `worker_role` test, which does nothing unless
//! `UROCE_TEST_ROLE` is set).
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::cast_possible_truncation, reason = "test sizes are small")]
#![allow(clippy::disallowed_methods, reason = "a multi-process test bounds its waits by the clock")]
#![allow(clippy::needless_range_loop, reason = "indices name peers and sizes on both sides")]

use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use uroce::{Access, Context, Endpoint, Mtu, QKey, QpType, WcOpcode, WcStatus, WorkCompletion};
use uroce_testkit::{Namespaces, netns_tools_present, pattern};

const ROLE: &str = "UROCE_TEST_ROLE";
/// 1 B, 4 B, … 16 MiB.
const SIZES: [usize; 13] = [
    1,
    4,
    16,
    64,
    256,
    1 << 10,
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
];
const BIG: usize = 16 << 20;
const ATOMICS: usize = 32;
const UD_N: usize = 16;
const QKEY: QKey = QKey(0x4242);

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

fn key(from: usize, to: usize, what: usize) -> u64 {
    (from as u64) << 48 | (to as u64) << 40 | what as u64
}

/// Where SEND `k` lands in a peer's inbox.
fn inbox_at(sizes: &[usize], k: usize) -> usize {
    sizes[..k].iter().sum()
}

/// A run's shape, passed to the workers in the environment.
#[derive(Clone, Copy)]
struct Config {
    per_side: usize,
    mtu: Mtu,
    /// The largest message.
    max: usize,
    /// Packets may be lost (nftables on a veth): UD datagrams need not all arrive.
    lossy: bool,
}

impl Config {
    const LOCAL: Self = Self { per_side: 4, mtu: Mtu::Mtu4096, max: BIG, lossy: false };

    fn from_env() -> Self {
        let get = |k: &str| std::env::var(k).unwrap().parse::<usize>().unwrap();
        Self {
            per_side: get("UROCE_TEST_PER_SIDE"),
            mtu: if get("UROCE_TEST_MTU") == 1024 { Mtu::Mtu1024 } else { Mtu::Mtu4096 },
            max: get("UROCE_TEST_MAX"),
            lossy: get("UROCE_TEST_LOSSY") == 1,
        }
    }

    fn env(&self, c: &mut Command) {
        c.env("UROCE_TEST_PER_SIDE", self.per_side.to_string())
            .env("UROCE_TEST_MTU", self.mtu.bytes().to_string())
            .env("UROCE_TEST_MAX", self.max.to_string())
            .env("UROCE_TEST_LOSSY", u8::from(self.lossy).to_string());
    }

    fn sizes(&self) -> Vec<usize> {
        SIZES.iter().copied().filter(|&s| s <= self.max).collect()
    }

    /// Datagram `i`'s length: all different, each within the path MTU.
    fn ud_len(&self, i: usize) -> usize {
        if self.mtu.bytes() >= 4096 { 1000 + 100 * i } else { 100 + 50 * i }
    }
}

struct Line {
    r: BufReader<UnixStream>,
    w: UnixStream,
}

impl Line {
    fn new(s: UnixStream) -> Self {
        s.set_read_timeout(Some(Duration::from_secs(180))).unwrap();
        Self { r: BufReader::new(s.try_clone().unwrap()), w: s }
    }
    fn send(&mut self, l: &str) {
        self.w.write_all(l.as_bytes()).unwrap();
        self.w.write_all(b"\n").unwrap();
    }
    fn recv(&mut self) -> String {
        let mut s = String::new();
        self.r.read_line(&mut s).unwrap();
        s.trim_end().to_string()
    }
}

/// What a worker waits for: completions per peer, the peer it expects to die.
struct Waiter<'a> {
    cq: &'a uroce::Cq,
    qpns: Vec<uroce::Qpn>,
    victim: Option<usize>,
    failed: Option<WcStatus>,
    recvs: Vec<WorkCompletion>,
}

impl Waiter<'_> {
    fn peer_of(&self, wc: &WorkCompletion) -> usize {
        self.qpns.iter().position(|&q| q == wc.qp_num).unwrap_or(usize::MAX)
    }

    /// Waits for `n[p]` send-side completions from each peer `p` (receive completions are
    /// kept for later). The victim's QP may fail instead: its first error is recorded.
    fn wait(&mut self, mut n: Vec<usize>) -> Vec<WorkCompletion> {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        while n.iter().enumerate().any(|(p, &k)| k > 0 && !self.gone(p)) {
            assert!(Instant::now() < deadline, "completions still missing: {n:?}");
            for wc in self.cq.wait(Some(Duration::from_millis(100))).unwrap() {
                let p = self.peer_of(&wc);
                if p == usize::MAX {
                    // The UD QP's receives: kept for later.
                    self.recvs.push(wc);
                    continue;
                }
                if wc.status != WcStatus::SUCCESS {
                    assert_eq!(Some(p), self.victim, "only the killed peer's QP fails: {wc:?}");
                    self.failed.get_or_insert(wc.status);
                    continue;
                }
                if wc.opcode == WcOpcode::Recv {
                    self.recvs.push(wc);
                    continue;
                }
                n[p] = n[p].saturating_sub(1);
                got.push(wc);
            }
        }
        got
    }

    fn gone(&self, p: usize) -> bool {
        self.victim == Some(p) && self.failed.is_some()
    }
}

#[test]
fn worker_role() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let env = |k: &str| std::env::var(k).unwrap();
    let sock = PathBuf::from(env("UROCE_TEST_SOCK"));
    let addrs: Vec<IpAddr> =
        env("UROCE_TEST_ADDRS").split(',').map(|a| a.parse().unwrap()).collect();
    if role == "fresh" {
        return fresh(&sock, &addrs);
    }
    let cfg = Config::from_env();
    let (per_side, mtu, sizes, lossy) = (cfg.per_side, cfg.mtu, cfg.sizes(), cfg.lossy);
    let ud_len = |i: usize| cfg.ud_len(i);
    let me: usize = env("UROCE_TEST_ME").parse().unwrap();
    let victim: Option<usize> = std::env::var("UROCE_TEST_VICTIM").ok().map(|v| v.parse().unwrap());
    let side = me / per_side;
    let peers: Vec<usize> = (0..per_side).map(|i| (1 - side) * per_side + i).collect();
    let mut line = Line::new(UnixStream::connect(&sock).unwrap());
    let ctx = Context::open(addrs[side]).unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16_384).unwrap();
    let all =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let inbox_len: usize = sizes.iter().sum();
    let (mut rcs, mut targets, mut locals, mut inboxes) = (vec![], vec![], vec![], vec![]);
    for _ in &peers {
        rcs.push(pd.qp(QpType::Rc, &cq).mtu(mtu).retries(16, 7, 7).build().unwrap());
        targets.push(pd.register(BIG + 4096, all).unwrap());
        locals.push(pd.register(2 * BIG + 4096, Access::LOCAL_WRITE).unwrap());
        inboxes.push(pd.register(inbox_len, Access::LOCAL_WRITE).unwrap());
    }
    let ud = pd.qp(QpType::Ud, &cq).qkey(QKEY).build().unwrap();
    let ud_bufs = pd.register(per_side * UD_N * 8192, Access::LOCAL_WRITE).unwrap();
    let mut eps: Vec<String> = (0..per_side)
        .map(|p| hex(&rcs[p].endpoint().with_region(targets[p].remote()).to_bytes()))
        .collect();
    eps.push(hex(&ud.endpoint().to_bytes()));
    line.send(&format!("ep {me} {}", eps.join(" ")));
    // For each peer: its RC endpoint for us, then its UD endpoint.
    let theirs: Vec<Endpoint> =
        line.recv().split(' ').map(|h| Endpoint::from_bytes(&unhex(h)).unwrap()).collect();
    for p in 0..per_side {
        rcs[p].connect(&theirs[2 * p]).unwrap();
        for k in 0..sizes.len() {
            let at = inbox_at(&sizes, k);
            rcs[p].post_recv(k as u64, &inboxes[p], at..at + sizes[k]).unwrap();
        }
    }
    for k in 0..per_side * UD_N {
        ud.post_recv(k as u64, &ud_bufs, k * 8192..k * 8192 + 40 + 4096).unwrap();
    }
    line.send("ready");
    assert_eq!(line.recv(), "go");
    let victim_peer = victim.and_then(|v| peers.iter().position(|&p| p == v));
    let mut w = Waiter {
        cq: &cq,
        qpns: rcs.iter().map(uroce::Qp::qpn).collect(),
        victim: victim_peer,
        failed: None,
        recvs: Vec::new(),
    };
    for (k, &s) in sizes.iter().enumerate() {
        for p in (0..per_side).filter(|&p| !w.gone(p)) {
            locals[p].write(0, &pattern(key(me, peers[p], k), s)).unwrap();
            rcs[p].send(1, &locals[p], 0..s).unwrap();
            rcs[p].write(2, &locals[p], 0..s, targets_of(&theirs, p)).unwrap();
        }
        w.wait(vec![2; per_side]);
        for p in (0..per_side).filter(|&p| !w.gone(p)) {
            rcs[p].read(3, &locals[p], BIG..BIG + s, targets_of(&theirs, p).at(0)).unwrap();
        }
        w.wait(vec![1; per_side]);
        for p in (0..per_side).filter(|&p| !w.gone(p)) {
            let back = locals[p].to_vec(BIG..BIG + s).unwrap();
            assert!(
                back == pattern(key(me, peers[p], k), s),
                "READ back of {s} B from {}",
                peers[p]
            );
        }
    }
    // Atomics on a word of the peer's target only we touch: fetch-and-add returns 0, 1, …;
    // a compare-and-swap chain returns each value it expected.
    let word = |p: usize, i: u64| targets_of(&theirs, p).at(BIG as u64 + 8 * i);
    for i in 0..ATOMICS {
        for p in (0..per_side).filter(|&p| !w.gone(p)) {
            rcs[p].fetch_add(4, &locals[p], 2 * BIG + 8 * i, word(p, 0), 1).unwrap();
            rcs[p]
                .compare_swap(
                    5,
                    &locals[p],
                    2 * BIG + 2048 + 8 * i,
                    word(p, 1),
                    i as u64,
                    i as u64 + 1,
                )
                .unwrap();
        }
        w.wait(vec![2; per_side]);
    }
    for p in (0..per_side).filter(|&p| !w.gone(p)) {
        for i in 0..ATOMICS {
            let mut v = [0u8; 8];
            locals[p].read(2 * BIG + 8 * i, &mut v).unwrap();
            assert_eq!(u64::from_le_bytes(v), i as u64, "fetch-and-add {i} on {}", peers[p]);
            locals[p].read(2 * BIG + 2048 + 8 * i, &mut v).unwrap();
            assert_eq!(u64::from_le_bytes(v), i as u64, "compare-and-swap {i} on {}", peers[p]);
        }
    }
    // The killed peer's QP: keep writing until the transport gives up on it.
    if let Some(v) = victim_peer {
        let deadline = Instant::now() + Duration::from_secs(60);
        while w.failed.is_none() {
            assert!(Instant::now() < deadline, "the killed peer's QP never failed");
            rcs[v].write(6, &locals[v], 0..65_536, targets_of(&theirs, v)).unwrap();
            let mut n = vec![0; per_side];
            n[v] = 1;
            w.wait(n);
        }
        assert_eq!(w.failed, Some(WcStatus::RETRY_EXC_ERR), "the killed peer's QP");
    }
    // UD: 16 datagrams to each peer, 1,000 to 2,500 bytes.
    let ahs: Vec<uroce::Ah> =
        (0..per_side).map(|p| pd.create_ah(theirs[2 * p + 1].gid).unwrap()).collect();
    let ud_src = pd.register(UD_N * 4096, Access::LOCAL_WRITE).unwrap();
    let live: Vec<usize> = (0..per_side).filter(|&p| !w.gone(p)).collect();
    for p in live {
        for i in 0..UD_N {
            let len = ud_len(i);
            ud_src.write(i * 4096, &pattern(key(me, peers[p], 100 + i), len)).unwrap();
        }
        for i in 0..UD_N {
            ud.send_to(
                7,
                &ud_src,
                i * 4096..i * 4096 + ud_len(i),
                &ahs[p],
                theirs[2 * p + 1].qpn,
                QKEY,
            )
            .unwrap();
        }
        // UD send completions carry the UD QP's number: count them by hand.
        let mut left = UD_N;
        while left > 0 {
            for wc in cq.wait(Some(Duration::from_secs(10))).unwrap() {
                if wc.qp_num == ud.qpn() {
                    if wc.opcode == WcOpcode::Recv {
                        w.recvs.push(wc);
                    } else {
                        assert_eq!(wc.status, WcStatus::SUCCESS);
                        left -= 1;
                    }
                } else {
                    assert!(
                        wc.status != WcStatus::SUCCESS || wc.opcode == WcOpcode::Recv,
                        "{wc:?}"
                    );
                    if wc.opcode == WcOpcode::Recv && wc.status == WcStatus::SUCCESS {
                        w.recvs.push(wc);
                    }
                }
            }
        }
    }
    // Every worker has sent everything once all say so.
    line.send("sent");
    assert_eq!(line.recv(), "all sent");
    // Every SEND and datagram from a live peer must arrive; the killed one's may not.
    let live_peers = per_side - usize::from(victim_peer.is_some());
    let want = live_peers * (sizes.len() + if lossy { 0 } else { UD_N });
    let deadline = Instant::now() + Duration::from_secs(60);
    let arrived = |w: &Waiter<'_>| {
        w.recvs
            .iter()
            .filter(|r| r.status == WcStatus::SUCCESS && !(lossy && r.qp_num == ud.qpn()))
            .filter(|r| {
                let from = if r.qp_num == ud.qpn() {
                    theirs.iter().skip(1).step_by(2).position(|e| e.qpn == r.src_qp)
                } else {
                    Some(w.peer_of(r))
                };
                from != victim_peer
            })
            .count()
    };
    while arrived(&w) < want {
        assert!(Instant::now() < deadline, "{} of {want} messages arrived", arrived(&w));
        for wc in cq.wait(Some(Duration::from_millis(100))).unwrap() {
            if wc.opcode == WcOpcode::Recv && wc.status == WcStatus::SUCCESS {
                w.recvs.push(wc);
            }
        }
    }
    if lossy {
        // Datagrams still on their way: wait until 500 ms pass without one.
        while let Ok(wcs) = cq.wait(Some(Duration::from_millis(500))) {
            if wcs.is_empty() {
                break;
            }
            let ok =
                |c: &WorkCompletion| c.opcode == WcOpcode::Recv && c.status == WcStatus::SUCCESS;
            w.recvs.extend(wcs.into_iter().filter(ok));
        }
    }
    let datagrams = w.recvs.iter().filter(|r| r.qp_num == ud.qpn()).count();
    assert!(
        datagrams * 2 >= live_peers * UD_N,
        "{datagrams} of {} datagrams; counters {:?}",
        live_peers * UD_N,
        ctx.counters()
    );
    for r in &w.recvs {
        if r.qp_num == ud.qpn() {
            let p = theirs.iter().skip(1).step_by(2).position(|e| e.qpn == r.src_qp).unwrap();
            let len = r.byte_len as usize - 40;
            let i = (0..UD_N).position(|i| ud_len(i) == len).unwrap();
            let at = r.wr_id as usize * 8192 + 40;
            assert!(
                ud_bufs.to_vec(at..at + len).unwrap() == pattern(key(peers[p], me, 100 + i), len),
                "UD {i} from {}",
                peers[p]
            );
        } else {
            let p = w.peer_of(r);
            let k = r.wr_id as usize;
            assert_eq!(r.byte_len as usize, sizes[k]);
            let at = inbox_at(&sizes, k);
            assert!(
                inboxes[p].to_vec(at..at + sizes[k]).unwrap()
                    == pattern(key(peers[p], me, k), sizes[k]),
                "SEND of {} B from {}",
                sizes[k],
                peers[p]
            );
        }
    }
    // Done, and idle: the progress thread sleeps. (Packets still queued for a killed peer's
    // full ring are let go once its process is found gone, instead of being retried for ever.)
    let before = ctx.counters().1.progress_wakeups;
    std::thread::sleep(Duration::from_millis(300));
    let wakeups = ctx.counters().1.progress_wakeups - before;
    assert!(wakeups < 100, "{wakeups} progress wake-ups in 300 ms of idleness");
    let (_, net) = ctx.counters();
    if lossy {
        assert!(net.tx_datagrams > 0, "another host is reached over UDP: {net:?}");
    } else {
        // Both devices are on this host: everything goes through shared memory.
        assert!(net.shm_tx_packets > 0 && net.shm_rx_packets > 0, "{net:?}");
        assert_eq!(net.tx_datagrams, 0, "nothing through the kernel: {net:?}");
    }
    line.send(&format!(
        "done {me} shm_tx={} udp_tx={} udp_forwarded={} datagrams={datagrams} failed={:?}",
        net.shm_tx_packets, net.tx_datagrams, net.udp_rx_forwarded, w.failed
    ));
    // Stay until every worker is done: our QPs are others' peers.
    assert_eq!(line.recv(), "bye");
}

fn targets_of(theirs: &[Endpoint], p: usize) -> uroce::RemoteMr {
    theirs[2 * p].regions[0]
}

/// A process that opens both devices after the others (and one killed) and runs an RC WRITE
/// and READ back between them.
fn fresh(sock: &Path, addrs: &[IpAddr]) {
    let mut line = Line::new(UnixStream::connect(sock).unwrap());
    let (a, b) = (Context::open(addrs[0]).unwrap(), Context::open(addrs[1]).unwrap());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let qa = pa.qp(QpType::Rc, &ca).mtu(Mtu::Mtu4096).build().unwrap();
    let qb = pb.qp(QpType::Rc, &cb).mtu(Mtu::Mtu4096).build().unwrap();
    let ma = pa.register(2 << 20, Access::LOCAL_WRITE).unwrap();
    let mb = pb
        .register(1 << 20, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ)
        .unwrap();
    qa.connect(&qb.endpoint()).unwrap();
    qb.connect(&qa.endpoint()).unwrap();
    ma.write(0, &pattern(9, 1 << 20)).unwrap();
    qa.write(1, &ma, 0..1 << 20, mb.remote()).unwrap();
    assert_eq!(ca.wait_one(Some(Duration::from_secs(30))).unwrap().status, WcStatus::SUCCESS);
    qa.read(2, &ma, 1 << 20..2 << 20, mb.remote().at(0)).unwrap();
    assert_eq!(ca.wait_one(Some(Duration::from_secs(30))).unwrap().status, WcStatus::SUCCESS);
    assert!(ma.to_vec(1 << 20..2 << 20).unwrap() == pattern(9, 1 << 20));
    line.send(&format!("fresh ok slot={}", a.endpoint_slot().0));
}

struct Run<'a> {
    sock: &'a Path,
    addrs: &'a str,
    cfg: Config,
    victim: Option<usize>,
    /// Per side, the command prefix that puts a worker on its host (`ip netns exec NS`).
    prefix: [&'a [&'a str]; 2],
}

fn spawn(r: &Run<'_>, role: &str, me: usize) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut c = match r.prefix[me / r.cfg.per_side].split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    c.args(["--exact", "worker_role", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env("UROCE_TEST_SOCK", r.sock)
        .env("UROCE_TEST_ADDRS", r.addrs)
        .env("UROCE_TEST_ME", me.to_string())
        .stdout(Stdio::null());
    r.cfg.env(&mut c);
    if let Some(v) = r.victim {
        c.env("UROCE_TEST_VICTIM", v.to_string());
    }
    c.spawn().unwrap()
}

/// Runs the workers; with `victim`, kills it with SIGKILL shortly after traffic starts.
fn run(r: &Run<'_>) {
    let _ = std::fs::remove_file(r.sock);
    let listener = UnixListener::bind(r.sock).unwrap();
    let (per_side, victim) = (r.cfg.per_side, r.victim);
    let n = 2 * per_side;
    let mut children: Vec<Child> = (0..n).map(|me| spawn(r, "worker", me)).collect();
    let mut lines: Vec<Option<Line>> = (0..n).map(|_| None).collect();
    let mut eps: Vec<Vec<String>> = vec![Vec::new(); n];
    for _ in 0..n {
        let mut l = Line::new(listener.accept().unwrap().0);
        let got = l.recv();
        let mut words = got.split(' ');
        assert_eq!(words.next(), Some("ep"), "{got}");
        let me: usize = words.next().unwrap().parse().unwrap();
        eps[me] = words.map(str::to_string).collect();
        lines[me] = Some(l);
    }
    let mut lines: Vec<Line> = lines.into_iter().map(Option::unwrap).collect();
    for me in 0..n {
        let side = me / per_side;
        let mine = me % per_side;
        let theirs: Vec<String> = (0..per_side)
            .flat_map(|i| {
                let peer = (1 - side) * per_side + i;
                [eps[peer][mine].clone(), eps[peer][per_side].clone()]
            })
            .collect();
        lines[me].send(&theirs.join(" "));
    }
    for l in &mut lines {
        assert_eq!(l.recv(), "ready");
    }
    for l in &mut lines {
        l.send("go");
    }
    if let Some(v) = victim {
        std::thread::sleep(Duration::from_millis(150));
        children[v].kill().unwrap();
        children[v].wait().unwrap();
    }
    for l in lines.iter_mut().enumerate().filter(|(me, _)| Some(*me) != victim).map(|x| x.1) {
        assert_eq!(l.recv(), "sent");
    }
    for l in lines.iter_mut().enumerate().filter(|(me, _)| Some(*me) != victim).map(|x| x.1) {
        l.send("all sent");
    }
    for (me, l) in lines.iter_mut().enumerate().filter(|(me, _)| Some(*me) != victim) {
        let done = l.recv();
        eprintln!("{done}");
        assert!(done.starts_with(&format!("done {me} ")), "worker {me}: {done:?}");
        let killed_peer = victim.is_some_and(|v| v / per_side != me / per_side);
        let failed = format!("failed={:?}", killed_peer.then_some(WcStatus::RETRY_EXC_ERR));
        assert!(done.ends_with(&failed), "worker {me}: {done}");
    }
    if victim.is_some() {
        let mut fresh = spawn(r, "fresh", 0);
        let mut l = Line::new(listener.accept().unwrap().0);
        let got = l.recv();
        eprintln!("{got}");
        assert!(got.starts_with("fresh ok"), "{got:?}");
        assert!(fresh.wait().unwrap().success());
    }
    for (me, l) in lines.iter_mut().enumerate().filter(|(me, _)| Some(*me) != victim) {
        l.send("bye");
        let status = children[me].wait().unwrap();
        assert!(status.success(), "worker {me}: {status}");
    }
}

fn sock(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("uroce-host-{name}-{}.sock", std::process::id()))
}

const HERE: &[&str] = &[];

#[test]
fn eight_processes_on_two_shared_devices_rc_and_ud() {
    let s = sock("eight");
    let addrs = "127.0.8.2,127.0.8.3";
    run(&Run { sock: &s, addrs, cfg: Config::LOCAL, victim: None, prefix: [HERE, HERE] });
    let _ = std::fs::remove_file(s);
}

#[test]
fn a_killed_process_harms_only_its_own_connections() {
    let s = sock("kill");
    let addrs = "127.0.9.2,127.0.9.3";
    run(&Run { sock: &s, addrs, cfg: Config::LOCAL, victim: Some(0), prefix: [HERE, HERE] });
    let _ = std::fs::remove_file(s);
}

/// Two hosts (namespaces) on a veth pair, one address each, two processes per host sharing
/// it; nftables drops 1 % of the RoCEv2 packets arriving on either side.
#[test]
fn two_processes_per_namespace_across_a_lossy_veth() {
    if !netns_tools_present() {
        return;
    }
    let ns = Namespaces::new('h', &["10.197.0.1/24"], &["10.197.0.2/24"]);
    ns.set_loss(1);
    let s = sock("netns");
    let (pa, pb) = (["ip", "netns", "exec", &ns.a], ["ip", "netns", "exec", &ns.b]);
    let cfg = Config { per_side: 2, mtu: Mtu::Mtu1024, max: 1 << 20, lossy: true };
    let addrs = "10.197.0.1,10.197.0.2";
    run(&Run { sock: &s, addrs, cfg, victim: None, prefix: [&pa, &pb] });
    let dropped = ns.dropped();
    eprintln!("nftables dropped {dropped} packets");
    assert!(dropped > 0, "the loss rule dropped nothing");
    let _ = std::fs::remove_file(s);
}
