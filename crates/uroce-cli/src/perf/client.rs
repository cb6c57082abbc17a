//! `uroce client`: runs tests against a `uroce server` and reports each result as it finishes.

use core::time::Duration;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpStream};

use super::backend::{Device, Stack};
use super::control::{Control, endpoints_from_hex, endpoints_hex};
use super::rdma::{self, Measured, Side};
use super::{
    Cpu, Latency, Op, Outcome, PROTOCOL_VERSION, Params, Pattern, TABLE_HEADER, TestDef, sockets,
    system_busy,
};

/// What the client was asked to do.
pub(crate) struct Plan {
    pub(crate) server: IpAddr,
    pub(crate) port: u16,
    /// This side's RDMA device.
    pub(crate) local: IpAddr,
    pub(crate) tests: Vec<&'static TestDef>,
    /// Sizes to run each test at (atomics always move 8 bytes).
    pub(crate) sizes: Vec<usize>,
    pub(crate) params: Params,
    pub(crate) json: bool,
    /// The stack the RDMA tests run on.
    pub(crate) stack: Stack,
}

impl Plan {
    /// Every (test, size) pair, each checked before anything runs.
    pub(crate) fn runs(&self) -> Result<Vec<(&'static TestDef, Params)>, String> {
        let mut out = Vec::new();
        for &test in &self.tests {
            let atomic = matches!(test.op, Op::CompareSwap | Op::FetchAdd);
            let sizes: &[usize] = if atomic { &[8] } else { &self.sizes };
            for &size in sizes {
                let p = Params { size, ..self.params.clone() };
                p.check(test)?;
                out.push((test, p));
            }
        }
        Ok(out)
    }
}

/// Runs the plan, printing each result (a table row, or a JSON object per line).
pub(crate) fn run(plan: &Plan, out: &mut dyn Write) -> Result<Vec<Outcome>, String> {
    let runs = plan.runs()?;
    // The device first: a missing library or device fails before any connection is made.
    let needs_rdma = runs.iter().any(|(t, _)| t.transport.is_some());
    let device = if needs_rdma { Some(plan.stack.open(plan.local)?) } else { None };
    let to = SocketAddr::new(plan.server, plan.port);
    let stream = TcpStream::connect_timeout(&to, Duration::from_secs(5))
        .map_err(|e| format!("cannot reach a uroce server at {to}: {e}"))?;
    let mut ctl = Control::new(stream).map_err(|e| e.to_string())?;
    ctl.send(&format!("uroce-perf {PROTOCOL_VERSION}")).map_err(|e| e.to_string())?;
    let hello = ctl.recv().map_err(|e| format!("{to}: {e}"))?;
    if let Some(why) = hello.strip_prefix("error ") {
        return Err(format!("the server at {to} refused: {why}"));
    }
    if hello != format!("uroce-perf {PROTOCOL_VERSION}") {
        return Err(format!("{to} is not a uroce server speaking protocol {PROTOCOL_VERSION}"));
    }
    if !plan.json {
        let _ = writeln!(out, "{TABLE_HEADER}");
    }
    let mut results = Vec::new();
    // A progress line on a terminal, for runs of more than one test or size.
    let progress = runs.len() > 1 && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let total = runs.len();
    let mut warned = false;
    for (k, (test, p)) in runs.into_iter().enumerate() {
        if progress {
            eprint!("\r[{:>3}/{total}] {} {}        ", k + 1, test.name, super::human_size(p.size));
        }
        let outcome = one(&mut ctl, device.as_deref(), plan.server, test, &p).map_err(|e| {
            let context = device.as_ref().and_then(|d| d.failure_context());
            let context = context.map(|c| format!("\n  {c}")).unwrap_or_default();
            format!("{} at {} bytes: {e}{context}", test.name, p.size)
        })?;
        if progress {
            eprint!("\r{:<60}\r", "");
        }
        let line = if plan.json { outcome.to_json() } else { outcome.to_string() };
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
        // Once a run: every test of it goes the same ways.
        if !warned && let Some(why) = outcome.applied.path_mismatch() {
            warned = true;
            eprintln!("uroce client: warning: {} at {} bytes: {why}", test.name, p.size);
        }
        results.push(outcome);
    }
    Ok(results)
}

fn reply(ctl: &mut Control, want: &str) -> Result<String, String> {
    let line = ctl.recv().map_err(|e| e.to_string())?;
    if let Some(why) = line.strip_prefix("error ") {
        return Err(format!("the server says: {why}"));
    }
    let rest = line.strip_prefix(want).ok_or_else(|| format!("expected `{want}`, got `{line}`"))?;
    Ok(rest.trim_start().to_string())
}

/// `measured`, with the CPUs the calling (test) thread may run on.
fn with_cpus(measured: Result<Measured, String>) -> Result<Measured, String> {
    let mut m = measured?;
    m.applied.cpus = uroce_net::current_thread_cpus().map_err(|e| e.to_string())?;
    Ok(m)
}

/// One test at one size.
fn one(
    ctl: &mut Control,
    device: Option<&dyn Device>,
    server: IpAddr,
    test: &'static TestDef,
    p: &Params,
) -> Result<Outcome, String> {
    let e = |e: std::io::Error| e.to_string();
    ctl.send(&format!("run {} {}", test.name, p.to_words())).map_err(e)?;
    let ready = reply(ctl, "ready")?;
    // This side's CPU and the system's are counted from `go`, as the server counts its own:
    // setting up is not the test.
    let mut started = None;
    let mut go = |ctl: &mut Control| {
        reply(ctl, "go")?;
        started = Some((system_busy(), Cpu::now(), super::now()));
        Ok::<(), String>(())
    };
    let measured: Measured = match (test.transport, device) {
        (None, _) => {
            let port: u16 = ready.parse().map_err(|_| format!("bad port `{ready}`"))?;
            ctl.send("peer -").map_err(e)?;
            go(ctl)?;
            let to = SocketAddr::new(server, port);
            super::on_cpu(p.pin.map(|c| c.0), || with_cpus(sockets::client(to, test, p)))?
        }
        (Some(_), Some(device)) => {
            let peers = endpoints_from_hex(&ready)?;
            let (mut side, mine) = Side::new(device, test, p)?;
            side.connect(&peers)?;
            ctl.send(&format!("peer {}", endpoints_hex(&mine))).map_err(e)?;
            go(ctl)?;
            let sent_before = device.sent();
            let mut m =
                super::on_cpu(p.pin.map(|c| c.0), || with_cpus(rdma::client(&mut side, test, p)))?;
            m.applied.sent = super::sent_since(sent_before, device.sent());
            m.applied.qps = Some(side.qps_used());
            m.applied.inline_posts = side.inline_posts();
            m
        }
        (Some(_), None) => return Err("no RDMA device".into()),
    };
    let (sys0, cpu0, t0) = started.ok_or("the test never started")?;
    let client_cpu = Cpu::now().since(cpu0);
    let client_seconds = t0.elapsed().as_secs_f64();
    // Datagrams still in flight arrive before the server counts them.
    let lossy = test.pattern == Pattern::Stream
        && (test.op == Op::Udp
            || (test.op == Op::Send && test.transport != Some(uroce::QpType::Rc)));
    if lossy {
        #[expect(clippy::disallowed_methods, reason = "the client, not protocol code, waits")]
        std::thread::sleep(Duration::from_millis(50));
    }
    ctl.send("stop").map_err(e)?;
    let done = reply(ctl, "done")?;
    let long_enough = measured.seconds >= 0.5;
    // The busy share over the span it was counted in, applied to the measured window.
    let span = t0.elapsed().as_secs_f64();
    let system_cpu = sys0
        .zip(system_busy())
        .map(|(a, b)| (b - a) / span * measured.seconds)
        .filter(|_| long_enough);
    let field = |k: &str| -> Result<f64, String> {
        done.split(' ')
            .find_map(|w| w.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("the server's report lacks {k}"))
    };
    let server_cpu = Cpu { user: field("user")?, sys: field("sys")? };
    let server_seconds = field("secs")?;
    let mut m = measured;
    // A server of an older version, or on a verbs device, does not say.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "packet counts, written as integers"
    )]
    let count = |k: &str| field(k).ok().map(|v| v as u64);
    m.applied.server_sent = count("udp").zip(count("shm"));
    m.applied.server_polls = count("polls");
    let mut arrived = m.msgs;
    if lossy && m.total_posted > 0 {
        // What arrived, scaled to the measured share of what was sent (the server counted the
        // warm-up too); what did not is lost.
        #[expect(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a share of a count"
        )]
        let share = |total: f64| (total * m.msgs as f64 / m.total_posted as f64).round() as u64;
        m.bytes = share(field("bytes")?).min(m.bytes);
        arrived = share(field("msgs")?).min(m.msgs);
        m.lost = m.msgs - arrived;
    }
    Ok(Outcome {
        test: test.name,
        size: p.size,
        iters: m.msgs,
        seconds: m.seconds.max(1e-9),
        bytes: m.bytes,
        latency: Latency::of(&mut m.samples),
        lost: m.lost,
        arrived,
        client_cpu,
        client_seconds,
        server_cpu,
        server_seconds,
        system_cpu,
        applied: m.applied,
    })
}
