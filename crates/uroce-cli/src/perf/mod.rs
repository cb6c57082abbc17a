//! qperf-style tests: a server that waits for clients, a client that runs named tests against it
//! over a TCP control connection, and the statistics both report.
//!
//! Test names follow qperf's so its users feel at home; `uroce list` prints them.

mod backend;
pub(crate) use backend::Stack;
pub(crate) mod client;
pub(crate) mod compare;
mod control;
mod machine;
mod peers;
mod rdma;
mod report;
pub(crate) mod server;
mod sockets;

use core::fmt;
use core::time::Duration;
use std::time::Instant;

/// The control protocol's version; both sides must speak the same one.
pub(crate) const PROTOCOL_VERSION: u32 = 1;
/// Default TCP port of the control connection (qperf's).
pub(crate) const DEFAULT_PORT: u16 = 19765;

/// What a test does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pattern {
    /// Ping-pong of messages: latency is half the round trip.
    PingPong,
    /// A stream of messages one way: bandwidth and message rate.
    Stream,
    /// Streams both ways at once.
    BiStream,
    /// One-sided operations the client waits for, one at a time: latency is the round trip.
    RoundTrip,
}

/// The operation a test moves data with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Tcp,
    Udp,
    Send,
    /// RDMA WRITE with immediate data (the peer sees a completion).
    WriteImm,
    /// RDMA WRITE, the peer polling its memory for the last byte.
    WritePoll,
    /// RDMA WRITE, the peer doing nothing.
    Write,
    Read,
    CompareSwap,
    FetchAdd,
}

/// One test of the catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TestDef {
    pub(crate) name: &'static str,
    pub(crate) about: &'static str,
    pub(crate) transport: Option<uroce::QpType>,
    pub(crate) op: Op,
    pub(crate) pattern: Pattern,
}

impl TestDef {
    /// A stream of one-sided operations (WRITE, READ, atomics): the server's application has
    /// nothing to do, as on an RNIC, where the responder is the NIC's — perftest's
    /// `ib_write_bw`, `ib_read_bw` and `ib_atomic_bw` servers post nothing and poll nothing.
    /// Its test thread then waits for the end without polling its CQ (which would only spin a
    /// core: no completion comes), and its device's progress thread answers the requests.
    pub(crate) fn passive_target(&self) -> bool {
        self.pattern == Pattern::Stream
            && matches!(self.op, Op::Write | Op::Read | Op::CompareSwap | Op::FetchAdd)
    }
}

use uroce::QpType::{Rc, Uc, Ud};

const fn t(
    name: &'static str,
    about: &'static str,
    transport: Option<uroce::QpType>,
    op: Op,
    pattern: Pattern,
) -> TestDef {
    TestDef { name, about, transport, op, pattern }
}

/// Every test, in qperf's order and naming.
pub(crate) const TESTS: [TestDef; 20] = [
    t("tcp_lat", "TCP ping-pong latency", None, Op::Tcp, Pattern::PingPong),
    t("tcp_bw", "TCP streaming bandwidth", None, Op::Tcp, Pattern::Stream),
    t("udp_lat", "UDP ping-pong latency", None, Op::Udp, Pattern::PingPong),
    t("udp_bw", "UDP streaming bandwidth (what arrives)", None, Op::Udp, Pattern::Stream),
    t("rc_lat", "RC SEND ping-pong latency", Some(Rc), Op::Send, Pattern::PingPong),
    t("rc_bw", "RC SEND streaming bandwidth", Some(Rc), Op::Send, Pattern::Stream),
    t("rc_bi_bw", "RC SEND bandwidth, both ways at once", Some(Rc), Op::Send, Pattern::BiStream),
    t(
        "rc_rdma_write_lat",
        "RC RDMA WRITE ping-pong latency (with immediate)",
        Some(Rc),
        Op::WriteImm,
        Pattern::PingPong,
    ),
    t("rc_rdma_write_bw", "RC RDMA WRITE bandwidth", Some(Rc), Op::Write, Pattern::Stream),
    t(
        "rc_rdma_write_poll_lat",
        "RC RDMA WRITE ping-pong latency, polling memory",
        Some(Rc),
        Op::WritePoll,
        Pattern::PingPong,
    ),
    t("rc_rdma_read_lat", "RC RDMA READ latency", Some(Rc), Op::Read, Pattern::RoundTrip),
    t("rc_rdma_read_bw", "RC RDMA READ bandwidth", Some(Rc), Op::Read, Pattern::Stream),
    t(
        "rc_compare_swap_mr",
        "RC atomic compare-and-swap message rate",
        Some(Rc),
        Op::CompareSwap,
        Pattern::Stream,
    ),
    t(
        "rc_fetch_add_mr",
        "RC atomic fetch-and-add message rate",
        Some(Rc),
        Op::FetchAdd,
        Pattern::Stream,
    ),
    t("uc_lat", "UC SEND ping-pong latency", Some(Uc), Op::Send, Pattern::PingPong),
    t("uc_bw", "UC SEND streaming bandwidth (what arrives)", Some(Uc), Op::Send, Pattern::Stream),
    t(
        "uc_rdma_write_lat",
        "UC RDMA WRITE ping-pong latency (with immediate)",
        Some(Uc),
        Op::WriteImm,
        Pattern::PingPong,
    ),
    t("uc_rdma_write_bw", "UC RDMA WRITE bandwidth", Some(Uc), Op::Write, Pattern::Stream),
    t("ud_lat", "UD SEND ping-pong latency", Some(Ud), Op::Send, Pattern::PingPong),
    t("ud_bw", "UD SEND streaming bandwidth (what arrives)", Some(Ud), Op::Send, Pattern::Stream),
];

/// Runs `f` in a thread pinned to `cpu`, or in this thread when there is none.
pub(crate) fn on_cpu<R: Send>(
    cpu: Option<usize>,
    f: impl FnOnce() -> Result<R, String> + Send,
) -> Result<R, String> {
    let Some(cpu) = cpu else { return f() };
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                uroce_net::pin_current_thread(cpu)
                    .map_err(|e| format!("cannot pin to CPU {cpu}: {e}"))?;
                f()
            })
            .join()
            .map_err(|_| "the test thread panicked".to_string())?
    })
}

/// The median of `v` (the upper one of an even count); NaN for none.
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The clock a benchmark reads.
pub(crate) fn now() -> Instant {
    #[expect(clippy::disallowed_methods, reason = "a benchmark reads the clock")]
    Instant::now()
}

/// The test called `name`.
pub(crate) fn find(name: &str) -> Option<&'static TestDef> {
    TESTS.iter().find(|t| t.name == name)
}

/// The test called `name`, or an error that names the closest test (a typo is at most two
/// edits away) and where the list is.
pub(crate) fn find_or_suggest(name: &str) -> Result<&'static TestDef, String> {
    find(name).ok_or_else(|| {
        let closest = TESTS.iter().map(|t| (edits(name, t.name), t.name)).min();
        match closest {
            Some((d, near)) if d <= 2 => {
                format!("unknown test '{name}': did you mean '{near}'? ('uroce list' shows them)")
            }
            _ => format!("unknown test '{name}' ('uroce list' shows them)"),
        }
    })
}

/// Levenshtein distance: the insertions, deletions and substitutions that turn `a` into `b`.
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

/// How a test runs: what the client asks and the server follows.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Params {
    /// Message size in bytes.
    pub(crate) size: usize,
    /// Measured iterations (messages or round trips), when not running for a duration.
    pub(crate) iters: u64,
    /// Run for this long instead of `iters`.
    pub(crate) duration: Option<Duration>,
    /// Unmeasured iterations first.
    pub(crate) warmup: u64,
    /// RDMA: path MTU; `None`: each side's port's active MTU, the smaller of the two once
    /// connected (as perftest chooses it), so that a 1500-byte link gets 1024.
    pub(crate) mtu: Option<uroce::Mtu>,
    /// Messages in flight for streaming tests (send or receive queue depth); by default 128,
    /// perftest's send queue depth for its bandwidth tests (`-t`). With small messages a
    /// window is acknowledged as a whole (one coalesced ACK per received batch), so a small
    /// one leaves the link idle for a round trip per window.
    pub(crate) depth: u32,
    /// RDMA: sleep on completion events instead of busy polling.
    pub(crate) events: bool,
    /// TCP: disable Nagle's algorithm.
    pub(crate) nodelay: bool,
    /// TCP/UDP: spin on non-blocking sockets instead of sleeping in the kernel.
    pub(crate) busy_poll: bool,
    /// TCP/UDP: send and receive buffer size in bytes (0: the system's default).
    pub(crate) sockbuf: usize,
    /// Pin the client's and the server's test thread to these CPUs.
    pub(crate) pin: Option<(usize, usize)>,
    /// RDMA: SENDs of at most this many bytes go inline (copied at post time).
    pub(crate) inline: u32,
    /// RDMA streams: work requests posted back to back before the next completion is taken.
    pub(crate) post_list: u32,
    /// RDMA streams: QPs the work is spread over, round robin.
    pub(crate) qps: u32,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            size: 64,
            iters: 10_000,
            duration: None,
            warmup: 100,
            mtu: None,
            depth: 128,
            events: false,
            nodelay: true,
            busy_poll: false,
            sockbuf: 0,
            pin: None,
            inline: 0,
            post_list: 1,
            qps: 1,
        }
    }
}

/// Largest message: 2^31 bytes, as RDMA allows (IBA 9.7).
pub(crate) const MAX_SIZE: usize = 1 << 31;

impl Params {
    /// Checks the parameters against the test; the error names the problem.
    pub(crate) fn check(&self, test: &TestDef) -> Result<(), String> {
        if self.size == 0 || self.size > MAX_SIZE {
            return Err(format!(
                "size {}: a message is 1 byte to 2 GiB (2^31 bytes, IBA's limit)",
                self.size
            ));
        }
        let datagram = matches!(test.transport, Some(Ud)) || test.op == Op::Udp;
        // A UD datagram is one packet: at most the path MTU (with the port's, the largest any
        // port has; a larger port MTU than the link's is refused when it is posted).
        let mtu = self.mtu.unwrap_or(uroce::Mtu::Mtu4096);
        let limit = if test.op == Op::Udp { 65_507 } else { mtu.bytes() as usize };
        if datagram && self.size > limit {
            return Err(format!(
                "{}: size {} exceeds one datagram ({limit} bytes)",
                test.name, self.size
            ));
        }
        if matches!(test.op, Op::CompareSwap | Op::FetchAdd) && self.size != 8 {
            return Err(format!("{}: atomics move 8 bytes; drop -s", test.name));
        }
        if self.events && test.transport.is_none() {
            return Err(format!("{}: --events applies to RDMA tests only", test.name));
        }
        if !self.nodelay && test.op != Op::Tcp {
            return Err(format!("{}: --no-nodelay applies to TCP tests only", test.name));
        }
        if (self.inline != 0 || self.post_list != 1) && test.transport.is_none() {
            return Err(format!(
                "{}: --inline and --post-list apply to RDMA tests only",
                test.name
            ));
        }
        if self.inline > 1024 {
            return Err(format!("--inline {} exceeds the device's 1024 bytes", self.inline));
        }
        if self.inline != 0 && test.op != Op::Send {
            return Err(format!("{}: --inline applies to SEND tests only", test.name));
        }
        if self.post_list == 0 || self.post_list > self.depth {
            return Err(format!(
                "--post-list {} must be between 1 and --depth ({})",
                self.post_list, self.depth
            ));
        }
        if self.qps == 0 || self.qps > 64 {
            return Err(format!("--qps {} must be between 1 and 64", self.qps));
        }
        let stream = matches!(test.pattern, Pattern::Stream | Pattern::BiStream);
        if self.qps > 1 && !(stream && test.transport.is_some()) {
            return Err(format!("{}: --qps applies to RDMA streaming tests only", test.name));
        }
        if (self.busy_poll || self.sockbuf != 0) && test.transport.is_some() {
            return Err(format!(
                "{}: --busy-poll and --sockbuf apply to TCP and UDP tests only",
                test.name
            ));
        }
        if self.depth == 0 || self.depth > 4096 {
            return Err(format!("--depth {} must be between 1 and 4096", self.depth));
        }
        Ok(())
    }

    /// The control protocol's form: `key=value` words.
    pub(crate) fn to_words(&self) -> String {
        format!(
            "size={} iters={} secs={} warmup={} mtu={} depth={} events={} nodelay={} busypoll={} sockbuf={} pin={} inline={} postlist={} qps={}",
            self.size,
            self.iters,
            self.duration.map_or(0.0, |d| d.as_secs_f64()),
            self.warmup,
            self.mtu.map_or(0, uroce::Mtu::bytes),
            self.depth,
            u8::from(self.events),
            u8::from(self.nodelay),
            u8::from(self.busy_poll),
            self.sockbuf,
            self.pin.map_or_else(|| "-".to_string(), |(c, s)| format!("{c}:{s}")),
            self.inline,
            self.post_list,
            self.qps,
        )
    }

    /// Parses [`Params::to_words`].
    pub(crate) fn from_words<'a>(words: impl Iterator<Item = &'a str>) -> Result<Self, String> {
        let mut p = Self::default();
        for w in words {
            let (k, v) = w.split_once('=').ok_or_else(|| format!("bad parameter `{w}`"))?;
            let num = |v: &str| v.parse::<u64>().map_err(|_| format!("bad number in `{w}`"));
            match k {
                "size" => p.size = usize::try_from(num(v)?).map_err(|e| e.to_string())?,
                "iters" => p.iters = num(v)?,
                "secs" => {
                    let s: f64 = v.parse().map_err(|_| format!("bad number in `{w}`"))?;
                    p.duration = (s > 0.0).then(|| Duration::from_secs_f64(s));
                }
                "warmup" => p.warmup = num(v)?,
                "mtu" if v == "0" => p.mtu = None,
                "mtu" => {
                    let m = num(v)?;
                    let mtu = u32::try_from(m).ok().and_then(uroce::Mtu::from_bytes);
                    p.mtu =
                        Some(mtu.ok_or_else(|| {
                            format!("MTU {m} is not 256, 512, 1024, 2048 or 4096")
                        })?);
                }
                "depth" => p.depth = u32::try_from(num(v)?).map_err(|e| e.to_string())?,
                "events" => p.events = num(v)? != 0,
                "nodelay" => p.nodelay = num(v)? != 0,
                "busypoll" => p.busy_poll = num(v)? != 0,
                "inline" => p.inline = u32::try_from(num(v)?).map_err(|e| e.to_string())?,
                "postlist" => p.post_list = u32::try_from(num(v)?).map_err(|e| e.to_string())?,
                "qps" => p.qps = u32::try_from(num(v)?).map_err(|e| e.to_string())?,
                "sockbuf" => p.sockbuf = usize::try_from(num(v)?).map_err(|e| e.to_string())?,
                "pin" if v == "-" => p.pin = None,
                "pin" => {
                    let (c, s) = v.split_once(':').ok_or_else(|| format!("bad `{w}`"))?;
                    let cpu = |x: &str| x.parse::<usize>().map_err(|_| format!("bad CPU in `{w}`"));
                    p.pin = Some((cpu(c)?, cpu(s)?));
                }
                _ => return Err(format!("unknown parameter `{k}`")),
            }
        }
        Ok(p)
    }
}

/// Latency statistics over samples in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Latency {
    pub(crate) min: f64,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
    pub(crate) max: f64,
    pub(crate) mean: f64,
}

impl Latency {
    /// From samples in nanoseconds (sorted here); `None` without samples.
    pub(crate) fn of(samples: &mut [u64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        // Nearest rank: the smallest sample with at least q of them at or below it.
        let rank = |q: f64| {
            #[expect(clippy::cast_precision_loss, reason = "a rank among at most 2^53 samples")]
            let n = samples.len() as f64;
            #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "in 1..=n")]
            let r = ((q * n).ceil() as usize).clamp(1, samples.len());
            ns_to_us(samples[r - 1])
        };
        #[expect(clippy::cast_precision_loss, reason = "a mean to a tenth of a microsecond")]
        let mean = samples.iter().map(|&s| s as f64).sum::<f64>() / samples.len() as f64 / 1e3;
        Some(Self {
            min: ns_to_us(samples[0]),
            p50: rank(0.50),
            p99: rank(0.99),
            p999: rank(0.999),
            max: ns_to_us(samples[samples.len() - 1]),
            mean,
        })
    }
}

#[expect(clippy::cast_precision_loss, reason = "microseconds to a tenth")]
fn ns_to_us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// CPU time used: user and system, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Cpu {
    pub(crate) user: f64,
    pub(crate) sys: f64,
}

impl Cpu {
    pub(crate) fn now() -> Self {
        let (u, s) = uroce::process_cpu_time();
        Self { user: u.as_secs_f64(), sys: s.as_secs_f64() }
    }

    pub(crate) fn since(self, start: Self) -> Self {
        Self { user: self.user - start.user, sys: self.sys - start.sys }
    }

    pub(crate) fn total(self) -> f64 {
        self.user + self.sys
    }
}

/// System-wide busy CPU time from `/proc/stat` (all cores, in seconds), for the share of the
/// machine a test took including kernel work done on no process's behalf (softirq).
pub(crate) fn system_busy() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().next()?;
    let fields: Vec<u64> = line.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal guest guest_nice (proc(5)): busy is user,
    // nice, system, irq and softirq. Steal is time the hypervisor gave another guest (counting
    // it put a 2-core run at 304 %), and guest time is already inside user and nice.
    let busy: u64 = [0, 1, 2, 5, 6].iter().filter_map(|&i| fields.get(i)).sum();
    #[expect(clippy::cast_precision_loss, reason = "clock ticks to seconds")]
    Some(busy as f64 / 100.0)
}

/// What the client side of a run saw of its options taking effect, measured where each acts
/// rather than echoed from the command line: a test asserts on these.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Applied {
    /// RDMA: QPs that work requests were posted on.
    pub(crate) qps: Option<usize>,
    /// RDMA: SENDs posted inline.
    pub(crate) inline_posts: u64,
    /// RDMA streams: the fewest and most work requests posted back to back once the window
    /// was full (a post list of N posts N at a time).
    pub(crate) post_burst: Option<(u64, u64)>,
    /// TCP/UDP: calls on a non-blocking socket that found nothing to do (busy-polling spins).
    pub(crate) would_block: u64,
    /// TCP/UDP: the send and receive buffer sizes the kernel gave the socket.
    pub(crate) sockbuf: Option<(usize, usize)>,
    /// The CPUs the test thread could run on.
    pub(crate) cpus: Vec<usize>,
    /// uroce: the packets this side's device sent during the test, (through the kernel's UDP
    /// path, over shared memory): which path the test took.
    pub(crate) sent: Option<(u64, u64)>,
    /// uroce: the same, of the server's device, as its report gives them.
    pub(crate) server_sent: Option<(u64, u64)>,
    /// RDMA: the times the server's test thread polled its CQ (none for a passive target,
    /// [`TestDef::passive_target`]), as its report gives them.
    pub(crate) server_polls: Option<u64>,
}

impl Applied {
    /// When the two directions of a test took different paths — this side's packets all
    /// through the kernel's UDP path and the server's all over shared memory, or the other way
    /// round — what to tell the user: the figures then measure neither path. (It happens when
    /// `UROCE_FABRIC=udp` is set on one side only: a device sends to a local peer over shared
    /// memory unless told otherwise.)
    pub(crate) fn path_mismatch(&self) -> Option<String> {
        let mine = only_path(self.sent?)?;
        let server = only_path(self.server_sent?)?;
        (mine != server).then(|| {
            format!(
                "this side sent through {mine} and the server through {server}: the two \
                 directions took different paths, so the figures are neither's (set \
                 UROCE_FABRIC alike for both)"
            )
        })
    }

    fn view(&self) -> AppliedJson<'_> {
        AppliedJson {
            qps: self.qps,
            inline_posts: self.inline_posts,
            post_burst: self.post_burst.map(|(a, b)| [a, b]),
            would_block: self.would_block,
            sockbuf: self.sockbuf.map(|(snd, rcv)| [snd, rcv]),
            cpus: &self.cpus,
            udp_datagrams: self.sent.map(|s| s.0),
            shm_packets: self.sent.map(|s| s.1),
            server_udp_datagrams: self.server_sent.map(|s| s.0),
            server_shm_packets: self.server_sent.map(|s| s.1),
            server_polls: self.server_polls,
        }
    }
}

/// The one path a side's packets took, given its (UDP, shared memory) counts; `None` when it
/// sent nothing or used both.
fn only_path((udp, shm): (u64, u64)) -> Option<&'static str> {
    match (udp > 0, shm > 0) {
        (true, false) => Some("the kernel's UDP path"),
        (false, true) => Some("shared memory"),
        _ => None,
    }
}

/// Packets a device sent between two readings of its counters, (through UDP, over shared
/// memory); `None` where the backend cannot tell.
pub(crate) fn sent_since(
    before: Option<(u64, u64)>,
    after: Option<(u64, u64)>,
) -> Option<(u64, u64)> {
    before.zip(after).map(|(a, b)| (b.0.saturating_sub(a.0), b.1.saturating_sub(a.1)))
}

#[derive(serde::Serialize)]
struct AppliedJson<'a> {
    qps: Option<usize>,
    inline_posts: u64,
    post_burst: Option<[u64; 2]>,
    would_block: u64,
    sockbuf: Option<[usize; 2]>,
    cpus: &'a [usize],
    udp_datagrams: Option<u64>,
    shm_packets: Option<u64>,
    server_udp_datagrams: Option<u64>,
    server_shm_packets: Option<u64>,
    server_polls: Option<u64>,
}

/// One result in `results.json` and `--json`, in this order (`series` and `peer` in
/// `results.json` only).
#[derive(serde::Serialize)]
pub(crate) struct OutcomeJson<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    series: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    peer: Option<bool>,
    test: &'static str,
    size: usize,
    iterations: u64,
    seconds: serde_json::Value,
    bytes: u64,
    latency: Option<LatencyJson>,
    lost: u64,
    gbit_s: serde_json::Value,
    mib_s: serde_json::Value,
    msg_per_s: serde_json::Value,
    client_cpu: CpuJson,
    server_cpu: CpuJson,
    system_cores: Option<serde_json::Value>,
    cpu_s_per_gb: serde_json::Value,
    cpu_us_per_msg: serde_json::Value,
    applied: AppliedJson<'a>,
}

#[derive(serde::Serialize)]
struct LatencyJson {
    min_us: serde_json::Value,
    p50_us: serde_json::Value,
    p99_us: serde_json::Value,
    p999_us: serde_json::Value,
    max_us: serde_json::Value,
    mean_us: serde_json::Value,
}

#[derive(serde::Serialize)]
struct CpuJson {
    user_s: serde_json::Value,
    sys_s: serde_json::Value,
    cores: serde_json::Value,
}

/// A figure for JSON, rounded to `digits` decimals; `null` where it is not finite (JSON has
/// no infinity or NaN: a run that moved no bytes has no CPU per GB).
pub(crate) fn figure(v: f64, digits: i32) -> serde_json::Value {
    let scale = 10f64.powi(digits);
    if v.is_finite() {
        serde_json::json!((v * scale).round() / scale)
    } else {
        serde_json::Value::Null
    }
}

/// One measured result: a test at one size.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Outcome {
    pub(crate) test: &'static str,
    pub(crate) size: usize,
    /// Measured iterations (messages, or round trips for latency tests).
    pub(crate) iters: u64,
    pub(crate) seconds: f64,
    /// Payload bytes moved (that arrived, for UDP/UC/UD streams).
    pub(crate) bytes: u64,
    pub(crate) latency: Option<Latency>,
    /// UC/UD ping-pong rounds lost (not in `iters` nor in the latency), or the messages of a
    /// UC/UD/UDP stream that did not arrive.
    pub(crate) lost: u64,
    /// Messages that arrived: `iters` but for the lost ones of an unreliable stream.
    pub(crate) arrived: u64,
    /// The client's CPU and the time it ran the test (from its start, warm-up included).
    pub(crate) client_cpu: Cpu,
    pub(crate) client_seconds: f64,
    /// The server's CPU, and the time it served the test (from its start to `stop`).
    pub(crate) server_cpu: Cpu,
    pub(crate) server_seconds: f64,
    /// System-wide busy CPU over the measured window, in core-seconds (the busy share over the
    /// whole test, from `go` to the server's report, times the window), if `/proc/stat` was
    /// readable and the run long enough for its 10 ms ticks to mean something (half a second).
    pub(crate) system_cpu: Option<f64>,
    /// The client's options as they took effect.
    pub(crate) applied: Applied,
}

impl Outcome {
    /// A result known only by one figure over one second — a latency in µs (every percentile
    /// that figure), or the bytes moved — with no CPU figures: what a peer tool reports.
    pub(crate) fn of_figure(
        test: &'static str,
        size: usize,
        latency_us: Option<f64>,
        bytes: u64,
    ) -> Self {
        let latency =
            latency_us.map(|l| Latency { min: l, p50: l, p99: l, p999: l, max: l, mean: l });
        Self {
            test,
            size,
            iters: 1,
            seconds: 1.0,
            bytes,
            latency,
            lost: 0,
            arrived: 1,
            client_cpu: Cpu::default(),
            client_seconds: 1.0,
            server_cpu: Cpu::default(),
            server_seconds: 1.0,
            system_cpu: None,
            applied: Applied::default(),
        }
    }

    pub(crate) fn gbits(&self) -> f64 {
        #[expect(clippy::cast_precision_loss, reason = "a rate")]
        let b = self.bytes as f64;
        b * 8.0 / self.seconds / 1e9
    }

    pub(crate) fn mib_s(&self) -> f64 {
        #[expect(clippy::cast_precision_loss, reason = "a rate")]
        let b = self.bytes as f64;
        b / self.seconds / f64::from(1 << 20)
    }

    /// Messages per second that arrived (as the bandwidth counts bytes that arrived).
    pub(crate) fn msg_rate(&self) -> f64 {
        #[expect(clippy::cast_precision_loss, reason = "a rate")]
        let n = self.arrived as f64;
        n / self.seconds
    }

    /// The client's busy cores over the time it ran the test.
    pub(crate) fn client_cores(&self) -> f64 {
        self.client_cpu.total() / self.client_seconds
    }

    /// The server's busy cores over the time it served.
    pub(crate) fn server_cores(&self) -> f64 {
        self.server_cpu.total() / self.server_seconds
    }

    /// Both sides' CPU per GB moved, in seconds.
    pub(crate) fn cpu_per_gb(&self) -> f64 {
        #[expect(clippy::cast_precision_loss, reason = "a rate")]
        let gb = self.bytes as f64 / 1e9;
        (self.client_cpu.total() + self.server_cpu.total()) / gb
    }

    /// Both sides' CPU per message, in microseconds.
    pub(crate) fn cpu_per_msg_us(&self) -> f64 {
        #[expect(clippy::cast_precision_loss, reason = "a rate")]
        let n = self.iters as f64;
        (self.client_cpu.total() + self.server_cpu.total()) / n * 1e6
    }

    /// The result as JSON (schema in the README); `series`: the report's series it belongs
    /// to and whether it is a peer's.
    pub(crate) fn view<'a>(&'a self, series: Option<(&'a str, bool)>) -> OutcomeJson<'a> {
        let cpu = |c: &Cpu, cores: f64| CpuJson {
            user_s: figure(c.user, 4),
            sys_s: figure(c.sys, 4),
            cores: figure(cores, 4),
        };
        OutcomeJson {
            series: series.map(|s| s.0),
            peer: series.map(|s| s.1),
            test: self.test,
            size: self.size,
            iterations: self.iters,
            seconds: figure(self.seconds, 6),
            bytes: self.bytes,
            latency: self.latency.map(|l| LatencyJson {
                min_us: figure(l.min, 3),
                p50_us: figure(l.p50, 3),
                p99_us: figure(l.p99, 3),
                p999_us: figure(l.p999, 3),
                max_us: figure(l.max, 3),
                mean_us: figure(l.mean, 3),
            }),
            lost: self.lost,
            gbit_s: figure(self.gbits(), 4),
            mib_s: figure(self.mib_s(), 2),
            msg_per_s: figure(self.msg_rate(), 1),
            client_cpu: cpu(&self.client_cpu, self.client_cores()),
            server_cpu: cpu(&self.server_cpu, self.server_cores()),
            system_cores: self.system_cpu.map(|s| figure(s / self.seconds, 4)),
            cpu_s_per_gb: figure(self.cpu_per_gb(), 4),
            cpu_us_per_msg: figure(self.cpu_per_msg_us(), 3),
            applied: self.applied.view(),
        }
    }

    /// The result as one line of JSON.
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(&self.view(None)).unwrap_or_default()
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lat = self.latency.map_or_else(
            || "-".to_string(),
            |l| format!("{:.1}/{:.1}/{:.1}", l.p50, l.p99, l.p999),
        );
        let sys = self
            .system_cpu
            .map_or_else(|| "-".to_string(), |s| format!("{:.0}%", s / self.seconds * 100.0));
        write!(
            f,
            "{:<24}{:>9}{:>9}{:>22}{:>10.2}{:>11.0}{:>12.0}{:>7.0}%{:>7.0}%{:>7}{:>9.2}",
            self.test,
            human_size(self.size),
            self.iters,
            lat,
            self.gbits(),
            self.mib_s(),
            self.msg_rate(),
            self.client_cores() * 100.0,
            self.server_cores() * 100.0,
            sys,
            self.cpu_per_gb(),
        )?;
        if self.lost > 0 {
            write!(f, "  lost {}", self.lost)?;
        }
        Ok(())
    }
}

/// The table's header, matching [`Outcome`]'s `Display`.
pub(crate) const TABLE_HEADER: &str = "test                         size    iters   lat p50/p99/p99.9 us    Gbit/s      MiB/s       msg/s   cli%   srv%   sys%  cpu s/GB";

/// 64, 4K, 1M… for sizes that are multiples of a power of 1024.
pub(crate) fn human_size(n: usize) -> String {
    for (unit, shift) in [("G", 30), ("M", 20), ("K", 10)] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

/// Parses 64, 4K, 4k, 1M, 2G (powers of 1024).
pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    let (num, shift) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: u64 = num.parse().map_err(|_| format!("bad size `{s}`"))?;
    let bytes = n
        .checked_shl(shift)
        .filter(|b| b >> shift == n)
        .ok_or(format!("size `{s}` is too large"))?;
    if bytes == 0 || bytes > MAX_SIZE as u64 {
        return Err(format!("size {s}: a message is 1 byte to 2 GiB (2^31 bytes, IBA's limit)"));
    }
    usize::try_from(bytes).map_err(|_| format!("size `{s}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_that_moved_nothing_is_still_valid_json() {
        let o = Outcome {
            test: "udp_lat",
            size: 64,
            iters: 0,
            seconds: 1.0,
            bytes: 0,
            latency: None,
            lost: 5,
            arrived: 0,
            client_cpu: Cpu { user: 0.1, sys: 0.0 },
            client_seconds: 1.0,
            server_cpu: Cpu::default(),
            server_seconds: 1.0,
            system_cpu: Some(0.5),
            applied: Applied { cpus: vec![0, 1], ..Applied::default() },
        };
        let v: serde_json::Value = serde_json::from_str(&o.to_json()).expect("valid JSON");
        assert_eq!(v["cpu_s_per_gb"], serde_json::Value::Null, "no bytes: no CPU per GB");
        assert_eq!(v["applied"]["cpus"], serde_json::json!([0, 1]));
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut s: Vec<u64> = (1..=1000).map(|i| i * 1000).collect();
        let l = Latency::of(&mut s).unwrap();
        assert_eq!((l.min, l.p50, l.p99, l.p999, l.max), (1.0, 500.0, 990.0, 999.0, 1000.0));
        assert!((l.mean - 500.5).abs() < 1e-9);
        assert!(Latency::of(&mut []).is_none());
    }

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("64").unwrap(), 64);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("1m").unwrap(), 1 << 20);
        assert_eq!(parse_size("2G").unwrap(), 1 << 31);
        assert!(parse_size("0").is_err());
        assert!(parse_size("3G").is_err());
        assert!(parse_size("x").is_err());
        assert_eq!(human_size(4096), "4K");
        assert_eq!(human_size(100), "100");
    }

    #[test]
    fn params_round_trip_and_check_what_applies() {
        let p = Params {
            size: 4096,
            iters: 7,
            depth: 3,
            events: true,
            pin: Some((0, 1)),
            ..Params::default()
        };
        assert_eq!(Params::from_words(p.to_words().split(' ')).unwrap(), p);
        let p = Params { busy_poll: true, sockbuf: 1 << 22, ..Params::default() };
        assert_eq!(Params::from_words(p.to_words().split(' ')).unwrap(), p);
        let ud = find("ud_bw").unwrap();
        assert!(
            Params { size: 8192, ..Params::default() }.check(ud).unwrap_err().contains("datagram")
        );
        let tcp = find("tcp_lat").unwrap();
        assert!(
            Params { events: true, ..Params::default() }.check(tcp).unwrap_err().contains("RDMA")
        );
        assert!(
            Params { size: 16, ..Params::default() }
                .check(find("rc_fetch_add_mr").unwrap())
                .is_err()
        );
        assert_eq!(TESTS.iter().filter(|t| find(t.name) == Some(t)).count(), 20, "names unique");
        let typo = find_or_suggest("rc_lta").unwrap_err();
        assert!(typo.contains("did you mean 'rc_lat'?"), "{typo}");
        assert!(!find_or_suggest("bandwidth").unwrap_err().contains("did you mean"));
        assert_eq!(edits("kitten", "sitting"), 3);
    }
}
