//! `uroce compare`: its own server on loopback, the RDMA-versus-TCP matrix, setup costs, the
//! crossover points, and the report.

use core::time::Duration;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use uroce::{Access, Context, Options};

use super::client::{self, Plan};
use super::machine::Machine;
use super::report;
use super::{Outcome, Params, find, median, now};

/// What `uroce compare` was asked for.
pub(crate) struct CompareArgs {
    pub(crate) quick: bool,
    pub(crate) sizes: Option<Vec<usize>>,
    pub(crate) duration: Option<Duration>,
    pub(crate) out: PathBuf,
    /// Also run sockperf, qperf and iperf3 (when installed) and put them in the report.
    pub(crate) with_peers: bool,
    /// The client's device and the server's (default 127.0.0.2 and 127.0.0.3).
    pub(crate) local: IpAddr,
    pub(crate) server: IpAddr,
    /// Also run every RDMA series on a device of the system's libibverbs (both sides on it).
    pub(crate) verbs: Option<super::Stack>,
    /// Each point is measured this many times, in rounds over the whole matrix (so that a
    /// slow spell of the machine falls on every series alike); the report gives the median
    /// and the spread.
    pub(crate) repeat: usize,
}

/// One series of the matrix: a test under a label, with its TCP setting.
pub(crate) struct Series {
    pub(crate) label: &'static str,
    pub(crate) test: &'static str,
    pub(crate) nodelay: bool,
}

/// TCP as a latency-minded user sets it up: the label says what is on.
const TUNED: &str = "TCP tuned (no Nagle, 4 MiB buffers, busy-poll, pinned)";

const SERIES: [Series; 14] = [
    Series { label: "TCP default (Nagle on)", test: "tcp_lat", nodelay: false },
    Series { label: TUNED, test: "tcp_lat", nodelay: true },
    Series { label: "TCP default (Nagle on)", test: "tcp_bw", nodelay: false },
    Series { label: TUNED, test: "tcp_bw", nodelay: true },
    Series { label: "RDMA RC SEND", test: "rc_lat", nodelay: true },
    Series { label: "RDMA RC SEND", test: "rc_bw", nodelay: true },
    Series { label: "RDMA RC WRITE", test: "rc_rdma_write_lat", nodelay: true },
    Series { label: "RDMA RC WRITE", test: "rc_rdma_write_bw", nodelay: true },
    Series { label: "RDMA RC READ", test: "rc_rdma_read_lat", nodelay: true },
    Series { label: "RDMA RC READ", test: "rc_rdma_read_bw", nodelay: true },
    Series { label: "RDMA UC SEND", test: "uc_lat", nodelay: true },
    Series { label: "RDMA UC SEND", test: "uc_bw", nodelay: true },
    Series { label: "RDMA UD SEND", test: "ud_lat", nodelay: true },
    Series { label: "RDMA UD SEND", test: "ud_bw", nodelay: true },
];

/// The atomics run at their one size.
const ATOMIC: Series = Series { label: "RDMA RC atomic", test: "rc_fetch_add_mr", nodelay: true };

/// A measured result with the label of its series.
pub(crate) struct Row {
    /// The series' label; rows of a `--verbs` device end with ` · verbs NAME`.
    pub(crate) label: String,
    /// Measured by another tool (latency or bandwidth only, no CPU figures).
    pub(crate) peer: bool,
    /// The median of the point's repeats (by its figure: p50 for latency, bandwidth for
    /// streams).
    pub(crate) outcome: Outcome,
    /// How that figure varied over the repeats; `None` for one run.
    pub(crate) spread: Option<Spread>,
    /// The fastest and slowest cache-line round trip between CPUs 0 and 1 probed just before
    /// its repeats, in ns ([`super::machine::cache_line_round_trip`]).
    pub(crate) cache_line_rt_ns: Option<[f64; 2]>,
}

/// How a point's figure varied over its repeats.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Spread {
    pub(crate) runs: usize,
    pub(crate) min: f64,
    pub(crate) max: f64,
    /// The figure is the p50 latency in µs (otherwise the bandwidth in Gbit/s).
    pub(crate) latency: bool,
}

/// The figure a point is judged by: p50 latency in µs for a latency test (infinite for a
/// repeat in which no round was answered: the worst), bandwidth in Gbit/s for the others.
fn figure_of(o: &Outcome) -> (f64, bool) {
    if o.test.ends_with("_lat") {
        (o.latency.map_or(f64::INFINITY, |l| l.p50), true)
    } else {
        (o.gbits(), false)
    }
}

/// The lowest and highest of `v`, if any.
fn range(v: &[f64]) -> Option<[f64; 2]> {
    let lo = v.iter().copied().min_by(f64::total_cmp)?;
    let hi = v.iter().copied().max_by(f64::total_cmp)?;
    Some([lo, hi])
}

/// A point's row from its repeats: the median outcome by its figure, and the spread.
fn median_row(label: String, mut runs: Vec<Outcome>) -> Option<Row> {
    runs.sort_by(|a, b| figure_of(a).0.total_cmp(&figure_of(b).0));
    let n = runs.len();
    let (min, latency) = figure_of(runs.first()?);
    let (max, _) = figure_of(runs.last()?);
    let spread = (n > 1).then_some(Spread { runs: n, min, max, latency });
    let outcome = runs.swap_remove(n / 2);
    Some(Row { label, peer: false, outcome, spread, cache_line_rt_ns: None })
}

/// Setup costs, medians in microseconds.
pub(crate) struct Setup {
    pub(crate) tcp_connect_us: f64,
    pub(crate) qp_connect_us: f64,
    /// An RC QP created and connected through the CM to a listener of another device (REQ,
    /// REP, RTU on QP1; `rdma_connect` to ESTABLISHED), measured on the active side.
    pub(crate) cm_connect_us: f64,
    /// (region bytes, register + deregister µs, locked register + deregister µs).
    pub(crate) registration: Vec<(usize, f64, f64)>,
}

/// After how many messages of a size RDMA's total time (setup + messages) drops below TCP's.
pub(crate) struct Crossover {
    /// The TCP series compared with.
    pub(crate) tcp: &'static str,
    pub(crate) size: usize,
    pub(crate) tcp_us: f64,
    pub(crate) rdma_us: f64,
    /// `None`: never (TCP is as fast per message).
    pub(crate) messages: Option<u64>,
}

/// Threads that spin at once while a point is measured: the client's test thread and the
/// server's.
const SPINNING: usize = 2;

/// The path of the matrix's uroce rows between two processes of this host.
pub(crate) const SHM: &str = "uroce shm";

/// One way RDMA can go that the matrix measures: the stack both sides run and how their
/// server is started.
struct Path {
    /// What its rows' labels end with: `uroce shm`, `uroce UDP`, `verbs NAME (GID …)`.
    name: String,
    stack: super::Stack,
    server_args: Vec<String>,
    server_env: Vec<(&'static str, &'static str)>,
}

/// Every RDMA path this run measures: uroce over shared memory, uroce over the kernel's UDP
/// path, and the `--verbs` device (opened here first, so that a missing library or device
/// fails before any test).
fn paths(args: &CompareArgs) -> Result<Vec<Path>, String> {
    let mut out = vec![
        Path {
            name: SHM.into(),
            stack: super::Stack::Uroce { udp_only: false },
            server_args: Vec::new(),
            server_env: Vec::new(),
        },
        Path {
            name: "uroce UDP".into(),
            stack: super::Stack::Uroce { udp_only: true },
            server_args: Vec::new(),
            server_env: vec![("UROCE_FABRIC", "udp")],
        },
    ];
    if let Some(stack @ super::Stack::Verbs { device, gid_index }) = &args.verbs {
        let mut server_args = vec!["--verbs".to_string(), "--gid".into(), gid_index.to_string()];
        if let Some(d) = device {
            server_args.extend(["--device".to_string(), d.clone()]);
        }
        let name = stack.open(args.local)?.describe();
        out.push(Path { name, stack: stack.clone(), server_args, server_env: Vec::new() });
    }
    Ok(out)
}

/// A server process of this binary, killed on drop (nothing is left running).
struct OwnServer(Child);

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `uroce server` on `addr` (with `extra` options and `env`: the RDMA stack) and its control
/// port.
fn start_server(
    addr: IpAddr,
    extra: &[String],
    env: &[(&str, &str)],
) -> Result<(OwnServer, u16), String> {
    // A free control port on the server's address.
    let port = TcpListener::bind((addr, 0))
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("cannot bind {addr}: {e}"))?
        .port();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(["server", "--addr", &addr.to_string(), "--port", &port.to_string()])
        .args(extra)
        .envs(env.iter().copied())
        // Ends with this process, however it ends (Ctrl-C included).
        .env("UROCE_DIE_WITH_PARENT", std::process::id().to_string())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start a server: {e}"))?;
    let stderr = child.stderr.take().ok_or("no server stderr")?;
    let server = OwnServer(child);
    let mut lines = BufReader::new(stderr);
    let mut first = String::new();
    lines.read_line(&mut first).map_err(|e| e.to_string())?;
    if !first.contains("waiting for clients") {
        return Err(format!("the server did not start: {}", first.trim()));
    }
    // Keep draining its stderr so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines.lines() {});
    Ok((server, port))
}

/// Runs the comparison and writes the report; returns the report directory.
pub(crate) fn run(args: &CompareArgs) -> Result<PathBuf, String> {
    let (server_addr, local) = (args.server, args.local);
    // The report's directory is checked before anything runs, not after a minute of tests.
    writable_dir(&args.out)?;
    let sizes = args.sizes.clone().unwrap_or_else(|| {
        if args.quick {
            vec![64, 4096, 65_536]
        } else {
            vec![64, 1024, 16_384, 65_536, 262_144, 4 << 20]
        }
    });
    let secs = args.duration.unwrap_or(Duration::from_secs_f64(if args.quick { 0.1 } else { 0.3 }));
    let repeat = args.repeat.max(1);
    // A client and a server test thread spin at once; fewer cores than that and one waits for
    // the scheduler while the other spins.
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let cores_note = (cores < SPINNING).then(|| {
        format!(
            "this machine has {cores} core(s) and the run spins {SPINNING} threads (the client's \
             and the server's test threads): latencies will include the scheduler's time slices"
        )
    });
    if let Some(note) = &cores_note {
        eprintln!("uroce compare: warning: {note}");
    }
    let mut machine = Machine::now(format!(
        "{} matrix, {} run(s) of {:.2} s per point in rounds, sizes {}, devices {} and {}{}",
        if args.quick { "quick" } else { "full" },
        repeat,
        secs.as_secs_f64(),
        sizes.iter().map(|&n| super::human_size(n)).collect::<Vec<_>>().join(" "),
        local,
        server_addr,
        if args.with_peers { ", with peers" } else { "" }
    ));
    let paths = paths(args)?;
    let mut rows = Vec::new();
    let series: Vec<&Series> = SERIES
        .iter()
        .filter(|s| !args.quick || !s.test.starts_with("uc_"))
        .chain(core::iter::once(&ATOMIC))
        .collect();
    // Every (path, series, size) this matrix runs: each size a test can take (UD: one
    // datagram; atomics: 8 bytes); TCP once, RDMA on every path.
    let mut runs = Vec::new();
    for (k, path) in paths.iter().enumerate() {
        for &s in &series {
            let test = find(s.test).ok_or("unknown test in the matrix")?;
            if test.transport.is_none() && k > 0 {
                continue;
            }
            let mut params = Params {
                duration: Some(secs),
                warmup: 50,
                nodelay: s.nodelay,
                depth: 16,
                ..Params::default()
            };
            if s.label == TUNED {
                // Client on CPU 0, server on CPU 1 (the machine has at least two for this
                // matrix).
                params.busy_poll = true;
                params.sockbuf = 4 << 20;
                params.pin = (std::thread::available_parallelism().map_or(1, usize::from) >= 2)
                    .then_some((0, 1));
            }
            let ok: Vec<usize> = if s.test.ends_with("_mr") {
                vec![8]
            } else {
                sizes
                    .iter()
                    .copied()
                    .filter(|&n| Params { size: n, ..params.clone() }.check(test).is_ok())
                    .collect()
            };
            runs.extend(ok.into_iter().map(|size| (path, s, test, params.clone(), size)));
        }
    }
    let rounds: Vec<usize> = (0..repeat).flat_map(|_| 0..runs.len()).collect();
    let mut matrix = Matrix {
        measured: runs.iter().map(|_| None).collect(),
        points: runs,
        server_addr,
        local,
        failed: Vec::new(),
        server: None,
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        step: 0,
        total: rounds.len(),
    };
    machine.slow_spells.calibrate();
    for k in rounds {
        matrix.measure(k, &mut machine)?;
    }
    // A point whose repeats disagree is measured again, twice, in rounds over every such
    // point, and given the median of all: with three repeats, one slow and one fast leave the
    // median to the third.
    let unsettled = if repeat >= 3 { matrix.unsettled_points() } else { Vec::new() };
    let rounds: Vec<usize> = (0..EXTRA_ROUNDS).flat_map(|_| unsettled.iter().copied()).collect();
    matrix.total += rounds.len();
    for k in rounds {
        matrix.measure(k, &mut machine)?;
    }
    machine.remeasured = unsettled.len();
    let Matrix { measured, failed, server, progress, total, .. } = matrix;
    let measured: Vec<_> = measured.into_iter().flatten().collect();
    drop(server);
    let all_probes: Vec<f64> = measured.iter().flat_map(|m| m.probes.iter().copied()).collect();
    machine.cache_line_rt_ns = range(&all_probes);
    rows.extend(measured.into_iter().filter_map(|runs| {
        let mut row = median_row(runs.label, runs.repeats)?;
        row.cache_line_rt_ns = range(&runs.probes);
        Some(row)
    }));
    if progress {
        eprint!("\r{:<80}\r", "");
    }
    eprintln!("measuring setup costs…");
    let setup = setup_costs(server_addr, local, args.quick)?;
    let crossovers = crossovers(&rows, &setup);
    let failures = failed.len();
    let mut notes = failed;
    notes.extend(cores_note);
    if let Some(spells) = machine.slow_spells.describe() {
        eprintln!("{spells}");
        notes.push(format!("Machine: {spells}."));
    }
    if machine.remeasured > 0 {
        let line = format!(
            "{} point(s) whose {repeat} repeats spanned more than {:.0} % of their median were \
             measured {EXTRA_ROUNDS} more times; their rows are the median of all",
            machine.remeasured,
            UNSETTLED_SPREAD * 100.0
        );
        eprintln!("{line}");
        notes.push(format!("Repeats: {line}."));
    }
    if args.with_peers {
        eprintln!("running sockperf, qperf and iperf3 where installed…");
        let (peer_rows, peer_notes) = super::peers::run(&sizes, secs.as_secs_f64());
        rows.extend(peer_rows);
        notes.extend(peer_notes);
        eprintln!("running perftest where installed…");
        let (peer_rows, peer_notes) =
            super::peers::run_perftest(&perftest_on(args)?, &sizes, secs.as_secs_f64());
        rows.extend(peer_rows);
        notes.extend(peer_notes);
    }
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    report::write(&args.out, &machine, &rows, &setup, &crossovers, &notes)?;
    print!("{}", report::summary(&rows, &setup, &crossovers));
    if failures > 0 {
        eprintln!(
            "uroce compare: {failures} of {total} measurements failed; the report has the \
             others and names these"
        );
    }
    Ok(args.out.clone())
}

/// A point whose repeats' figures span more than this fraction of their median is measured
/// [`EXTRA_ROUNDS`] more times.
const UNSETTLED_SPREAD: f64 = 0.25;

/// The extra repeats of a point that did not settle.
const EXTRA_ROUNDS: usize = 2;

/// One point of the matrix: a series on a path at a size.
type Point<'a> = (&'a Path, &'a Series, &'static super::TestDef, Params, usize);

/// A point's row label, its repeats, and the cache-line probes taken just before them.
struct PointRuns {
    label: String,
    repeats: Vec<Outcome>,
    probes: Vec<f64>,
}

/// The matrix as it is measured: its points, each one's repeats so far, and the server of the
/// path being measured.
struct Matrix<'a> {
    points: Vec<Point<'a>>,
    /// The server's device and control address, and the client's device.
    server_addr: IpAddr,
    local: IpAddr,
    /// Per point, what its repeats measured (`None` until one succeeds).
    measured: Vec<Option<PointRuns>>,
    failed: Vec<String>,
    /// Each path's server runs while its rows do (two uroce servers on one address would
    /// share its device).
    server: Option<(&'a Path, OwnServer, u16)>,
    /// A progress line rewritten in place, only where a person watches (a log would fill
    /// with carriage returns).
    progress: bool,
    step: usize,
    total: usize,
}

impl Matrix<'_> {
    /// Measures point `k` once more.
    fn measure(&mut self, k: usize, machine: &mut Machine) -> Result<(), String> {
        let (path, s, test, ref params, size) = self.points[k];
        let (server_addr, local) = (self.server_addr, self.local);
        if self.server.as_ref().is_none_or(|(p, _, _)| !core::ptr::eq(*p, path)) {
            drop(self.server.take());
            let (child, port) = start_server(server_addr, &path.server_args, &path.server_env)?;
            self.server = Some((path, child, port));
        }
        let port = self.server.as_ref().map_or(0, |s| s.2);
        let label = if test.transport.is_some() {
            format!("{} · {}", s.label, path.name)
        } else {
            s.label.to_string()
        };
        self.step += 1;
        if self.progress {
            eprint!(
                "\r[{:>3}/{}] {:<24}{:<44}{:>8}   ",
                self.step,
                self.total,
                s.test,
                label,
                super::human_size(size)
            );
            let _ = std::io::stderr().flush();
        }
        let plan = Plan {
            server: server_addr,
            port,
            local,
            tests: vec![test],
            sizes: vec![size],
            params: params.clone(),
            json: true,
            stack: path.stack.clone(),
        };
        // The machine's state right before, a slow spell of the host waited out: where a
        // latency moves with it, the host moved.
        let probe = machine.slow_spells.probe();
        // One measurement that fails is reported and the matrix goes on: the report holds the
        // rest, and names what is missing.
        match client::run(&plan, &mut std::io::sink()) {
            Ok(mut out) => {
                if let Some(outcome) = out.pop() {
                    match &mut self.measured[k] {
                        Some(runs) => {
                            runs.repeats.push(outcome);
                            runs.probes.extend(probe);
                        }
                        slot @ None => {
                            let probes = probe.into_iter().collect();
                            *slot = Some(PointRuns { label, repeats: vec![outcome], probes });
                        }
                    }
                }
            }
            Err(e) => {
                let what = format!("{} ({label}) at {}: {e}", s.test, super::human_size(size));
                if self.progress {
                    eprintln!();
                }
                eprintln!("uroce compare: failed: {what}");
                self.failed.push(format!("Not measured: {what}"));
            }
        }
        Ok(())
    }

    /// The points whose repeats so far span more than [`UNSETTLED_SPREAD`] of their median.
    fn unsettled_points(&self) -> Vec<usize> {
        (0..self.points.len())
            .filter(|&k| {
                self.measured[k].as_ref().is_some_and(|runs| {
                    let figures: Vec<f64> = runs.repeats.iter().map(|o| figure_of(o).0).collect();
                    unsettled(&figures)
                })
            })
            .collect()
    }
}

/// Whether figures `v` (two or more) span more than [`UNSETTLED_SPREAD`] of their median. A
/// repeat in which no round was answered (an infinite latency) is unsettled too.
fn unsettled(v: &[f64]) -> bool {
    let Some([lo, hi]) = range(v) else { return false };
    v.len() >= 2 && (hi - lo) > UNSETTLED_SPREAD * median(v.to_vec())
}

/// Where perftest runs for `--with-peers`: on the `--verbs` device when there is one (both
/// sides, as the matrix's verbs rows), otherwise on uroce's devices through `uroce exec` (the
/// drop-in library), the client's device and the server's as in the matrix.
fn perftest_on(args: &CompareArgs) -> Result<super::peers::Perftest, String> {
    let server_ip = args.server.to_string();
    if let Some(super::Stack::Verbs { device, gid_index }) = &args.verbs {
        return Ok(super::peers::Perftest {
            server_prefix: Vec::new(),
            client_prefix: Vec::new(),
            device: device.clone(),
            gid_index: *gid_index,
            server_ip,
            label: format!("peer: perftest on {}", device.as_deref().unwrap_or("the first device")),
        });
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?.display().to_string();
    let under = |addr: IpAddr| {
        vec![exe.clone(), "exec".into(), "--addr".into(), addr.to_string(), "--".into()]
    };
    Ok(super::peers::Perftest {
        server_prefix: under(args.server),
        client_prefix: under(args.local),
        device: Some("uroce0".into()),
        gid_index: 0,
        server_ip,
        label: "peer: perftest (uroce drop-in)".into(),
    })
}

/// Creates `dir` if need be and checks that a file can be written in it.
fn writable_dir(dir: &std::path::Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("--out {}: {e}", dir.display()))?;
    let probe = dir.join(format!(".uroce-write-test-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| format!("--out {}: {e}", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// TCP connect and accept; QP creation and connection; registration by region size.
fn setup_costs(server: IpAddr, local: IpAddr, quick: bool) -> Result<Setup, String> {
    let e = |e: std::io::Error| e.to_string();
    let listener = TcpListener::bind((server, 0)).map_err(e)?;
    let addr = listener.local_addr().map_err(e)?;
    let mut tcp = Vec::new();
    for _ in 0..50 {
        let t0 = now();
        let c = TcpStream::connect(addr).map_err(e)?;
        let (s, _) = listener.accept().map_err(e)?;
        tcp.push(t0.elapsed().as_secs_f64() * 1e6);
        drop((c, s));
    }
    // Two QPs of one device connected to each other: create both, move both to RTS.
    let ctx = Context::open_with(local, Options::default()).map_err(|e| e.to_string())?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64).map_err(|e| e.to_string())?;
    let mut qp = Vec::new();
    for _ in 0..50 {
        let t0 = now();
        let a = pd.qp(uroce::QpType::Rc, &cq).build().map_err(|e| e.to_string())?;
        let b = pd.qp(uroce::QpType::Rc, &cq).build().map_err(|e| e.to_string())?;
        a.connect(&b.endpoint()).map_err(|e| e.to_string())?;
        b.connect(&a.endpoint()).map_err(|e| e.to_string())?;
        qp.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
    }
    let cm = cm_connect(server, &pd, &cq, if quick { 20 } else { 50 })?;
    let top = if quick { 64 << 20 } else { 1 << 30 };
    let mut registration = Vec::new();
    let mut len = 4096;
    while len <= top {
        let mut plain = Vec::new();
        let mut locked = Vec::new();
        for _ in 0..3 {
            let t0 = now();
            drop(
                pd.register(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                    .map_err(|e| e.to_string())?,
            );
            plain.push(t0.elapsed().as_secs_f64() * 1e6);
            let t0 = now();
            drop(
                pd.register_locked(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                    .map_err(|e| e.to_string())?,
            );
            locked.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        registration.push((len, median(plain), median(locked)));
        len *= 8;
    }
    Ok(Setup {
        tcp_connect_us: median(tcp),
        qp_connect_us: median(qp),
        cm_connect_us: median(cm),
        registration,
    })
}

/// `n` connections through the CM from `pd`'s device to a listener on the device of `server` (in a
/// thread of its own, as TCP's accept is in the kernel): QP creation and the handshake, each
/// then released outside the timing. Microseconds per connection.
fn cm_connect(
    server: IpAddr,
    pd: &uroce::Pd,
    cq: &uroce::Cq,
    n: usize,
) -> Result<Vec<f64>, String> {
    let e = |e: uroce::Error| e.to_string();
    let wait = Some(Duration::from_secs(10));
    let passive = Context::open_with(server, Options::default()).map_err(e)?;
    let listener = passive.listen(0, 8).map_err(e)?;
    let dest = listener.local_addr();
    let accepter = std::thread::spawn(move || -> Result<(), uroce::Error> {
        let (pd, cq) = (passive.alloc_pd(), passive.create_cq(64)?);
        for _ in 0..n {
            let qp = pd.qp(uroce::QpType::Rc, &cq).build()?;
            listener.accept(&qp, b"", wait)?.wait_disconnect(wait)?;
        }
        Ok(())
    });
    let mut us = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = now();
        let qp = pd.qp(uroce::QpType::Rc, cq).build().map_err(e)?;
        let conn = qp.connect_to(dest, b"", wait).map_err(e)?;
        us.push(t0.elapsed().as_secs_f64() * 1e6);
        conn.disconnect(wait).map_err(e)?;
    }
    accepter.join().map_err(|_| "the CM listener's thread panicked".to_string())?.map_err(e)?;
    Ok(us)
}

/// For each size both `tcp_lat` (tuned) and `rc_lat` ran at: the number of messages after which
/// RDMA (a connection through the CM + a registration of the message size + n half round
/// trips) costs less time than TCP (connect + n half round trips).
fn crossovers(rows: &[Row], setup: &Setup) -> Vec<Crossover> {
    let p50 = |test: &str, label_has: &str, size: usize| {
        rows.iter()
            .find(|r| {
                r.outcome.test == test && r.label.contains(label_has) && r.outcome.size == size
            })
            .and_then(|r| r.outcome.latency.map(|l| l.p50))
    };
    let reg = |size: usize| {
        setup.registration.iter().find(|(len, _, _)| *len >= size).map_or(0.0, |(_, us, _)| *us)
    };
    let mut out = Vec::new();
    for (tcp_label, r) in ["TCP default (Nagle on)", TUNED]
        .into_iter()
        // uroce's own rows between processes of the host (the setup costs are uroce's).
        .flat_map(|t| {
            rows.iter()
                .filter(|r| r.outcome.test == "rc_lat" && r.label.ends_with(SHM))
                .map(move |r| (t, r))
        })
    {
        let size = r.outcome.size;
        let (Some(tcp), Some(rdma)) =
            (p50("tcp_lat", tcp_label, size), r.outcome.latency.map(|l| l.p50))
        else {
            continue;
        };
        let fixed = setup.cm_connect_us + reg(size) - setup.tcp_connect_us;
        let messages = if rdma < tcp {
            #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a count")]
            let n = (fixed / (tcp - rdma)).ceil().max(1.0) as u64;
            Some(n)
        } else {
            None
        };
        out.push(Crossover { tcp: tcp_label, size, tcp_us: tcp, rdma_us: rdma, messages });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lat(p50: f64) -> Outcome {
        Outcome::of_figure("rc_lat", 64, Some(p50), 64)
    }

    #[test]
    fn a_point_is_the_median_of_its_repeats_with_their_spread() {
        let row = median_row("x".into(), vec![lat(9.0), lat(2.0), lat(3.0)]).unwrap();
        assert_eq!(row.outcome.latency.unwrap().p50, 3.0);
        assert_eq!(row.spread, Some(Spread { runs: 3, min: 2.0, max: 9.0, latency: true }));
        // A repeat in which every round was lost (UC, UD) is the worst latency, not a
        // bandwidth of 0.
        let mut lost = lat(1.0);
        lost.latency = None;
        let row = median_row("x".into(), vec![lost, lat(2.0), lat(3.0)]).unwrap();
        assert_eq!(row.outcome.latency.unwrap().p50, 3.0);
        assert_eq!(row.spread.map(|s| (s.min, s.max.is_infinite())), Some((2.0, true)));
        let one = median_row("x".into(), vec![lat(4.0)]).unwrap();
        assert_eq!((one.outcome.latency.unwrap().p50, one.spread), (4.0, None));
        assert!(median_row("x".into(), Vec::new()).is_none());
    }

    #[test]
    fn repeats_that_span_more_than_a_quarter_of_their_median_are_measured_again() {
        // 4 MiB READ latency over shared memory in one run of stop 40's checks: the median of
        // three was left to whichever the third repeat was.
        assert!(unsettled(&[497.8, 676.5, 701.9]));
        assert!(!unsettled(&[430.6, 451.8, 483.5]));
        assert!(!unsettled(&[100.0, 112.0, 124.0]));
        // A repeat with no round answered.
        assert!(unsettled(&[2.0, 3.0, f64::INFINITY]));
        // Bandwidth: a stream that stalled once.
        assert!(unsettled(&[0.1, 9.0, 9.5]));
        assert!(!unsettled(&[5.0]));
        assert!(!unsettled(&[]));
    }
}
