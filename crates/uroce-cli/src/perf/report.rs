//! The report of `uroce compare`: `results.json`, `report.md` and a self-contained
//! `index.html` whose plots are inline SVG, and the terminal summary.

use core::fmt::Write as _;
use std::collections::BTreeMap;
use std::path::Path;

use super::compare::{Crossover, Row, Setup};
use super::{figure, human_size};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Writes the three files into `dir`.
pub(crate) fn write(
    dir: &Path,
    rows: &[Row],
    setup: &Setup,
    cross: &[Crossover],
    notes: &[String],
) -> Result<(), String> {
    let put = |name: &str, text: String| {
        std::fs::write(dir.join(name), text)
            .map_err(|e| format!("cannot write {}: {e}", dir.join(name).display()))
    };
    put("results.json", json(rows, setup, cross))?;
    put("report.md", markdown(rows, setup, cross, notes))?;
    put("index.html", html(rows, setup, cross, notes))
}

/// `results.json` (schema version 1, in the README), written with serde_json: strings escaped
/// as JSON, figures that are not finite as `null`.
#[derive(serde::Serialize)]
struct ResultsJson<'a> {
    version: u32,
    results: Vec<super::OutcomeJson<'a>>,
    setup: SetupJson,
    crossover: Vec<CrossoverJson<'a>>,
}

#[derive(serde::Serialize)]
struct SetupJson {
    tcp_connect_us: serde_json::Value,
    qp_create_connect_us: serde_json::Value,
    rdma_cm_connect_us: serde_json::Value,
    registration: Vec<RegistrationJson>,
}

#[derive(serde::Serialize)]
struct RegistrationJson {
    bytes: usize,
    register_us: serde_json::Value,
    register_locked_us: serde_json::Value,
}

#[derive(serde::Serialize)]
struct CrossoverJson<'a> {
    tcp: &'a str,
    size: usize,
    tcp_p50_us: serde_json::Value,
    rdma_p50_us: serde_json::Value,
    messages: Option<u64>,
}

fn json(rows: &[Row], setup: &Setup, cross: &[Crossover]) -> String {
    let doc = ResultsJson {
        version: 1,
        results: rows.iter().map(|r| r.outcome.view(Some((r.label, r.peer)))).collect(),
        setup: SetupJson {
            tcp_connect_us: figure(setup.tcp_connect_us, 2),
            qp_create_connect_us: figure(setup.qp_connect_us, 2),
            rdma_cm_connect_us: figure(setup.cm_connect_us, 2),
            registration: setup
                .registration
                .iter()
                .map(|&(bytes, us, locked)| RegistrationJson {
                    bytes,
                    register_us: figure(us, 2),
                    register_locked_us: figure(locked, 2),
                })
                .collect(),
        },
        crossover: cross
            .iter()
            .map(|c| CrossoverJson {
                tcp: c.tcp,
                size: c.size,
                tcp_p50_us: figure(c.tcp_us, 3),
                rdma_p50_us: figure(c.rdma_us, 3),
                messages: c.messages,
            })
            .collect(),
    };
    serde_json::to_string(&doc).map(|s| s + "\n").unwrap_or_default()
}

fn markdown(rows: &[Row], setup: &Setup, cross: &[Crossover], notes: &[String]) -> String {
    let mut s = String::from("# uroce compare: RDMA versus TCP on this machine\n\n## Results\n\n");
    s.push_str("| series | test | size | p50 µs | p99 µs | Gbit/s | msg/s | CPU s/GB |\n|---|---|---:|---:|---:|---:|---:|---:|\n");
    for r in rows {
        let o = &r.outcome;
        let (p50, p99) = o.latency.map_or(("-".into(), "-".into()), |l| {
            (format!("{:.1}", l.p50), format!("{:.1}", l.p99))
        });
        // Peers report latency or bandwidth only.
        let (rate, cpu) = if r.peer {
            ("-".to_string(), "-".to_string())
        } else {
            (format!("{:.0}", o.msg_rate()), format!("{:.2}", o.cpu_per_gb()))
        };
        let gbits = if r.peer && o.latency.is_some() {
            "-".to_string()
        } else {
            format!("{:.2}", o.gbits())
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {p50} | {p99} | {gbits} | {rate} | {cpu} |",
            r.label,
            o.test,
            human_size(o.size),
        );
    }
    let _ = write!(
        s,
        "\n## Setup cost\n\nTCP connect (connect + accept): {:.1} µs. An RC QP created and connected through the \
         RDMA connection manager (REQ, REP, RTU on QP1, as `rdma_connect` to ESTABLISHED, the listener in \
         another thread): {:.1} µs. An RC QP created and moved through Init, RTR and RTS with the peer's \
         endpoint already known (exchanged out of band, not counted): {:.1} µs.\n\n\
         | region | register + deregister µs | locked (mlock) µs |\n|---:|---:|---:|\n",
        setup.tcp_connect_us, setup.cm_connect_us, setup.qp_connect_us
    );
    for (len, us, locked) in &setup.registration {
        let _ = writeln!(s, "| {} | {us:.1} | {locked:.1} |", human_size(*len));
    }
    s.push_str("\n## Crossover\n\nMessages of each size after which RDMA's total time (an RDMA CM connection, a registration of the message size, then half round trips) drops below TCP's (connect, then half round trips), from the p50 latencies above.\n\n| against | size | TCP p50 µs | RDMA RC p50 µs | messages |\n|---|---:|---:|---:|---:|\n");
    for c in cross {
        let n = c.messages.map_or_else(|| "never".to_string(), |n| n.to_string());
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {:.1} | {n} |",
            c.tcp,
            human_size(c.size),
            c.tcp_us,
            c.rdma_us
        );
    }
    if !notes.is_empty() {
        s.push_str("\n## Peers\n\nRows labelled `peer:` were measured by these tools in the same run (latency or bandwidth only; their CPU is not in the tables):\n\n");
        for n in notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}

/// One line plot: x on a log scale (sizes), y linear from zero.
fn svg(title: &str, y_label: &str, series: &BTreeMap<String, Vec<(f64, f64)>>) -> String {
    const W: f64 = 640.0;
    const H: f64 = 360.0;
    const L: f64 = 70.0;
    const R: f64 = 190.0;
    const T: f64 = 30.0;
    const B: f64 = 40.0;
    let points: Vec<(f64, f64)> = series.values().flatten().copied().collect();
    let xmin = points.iter().map(|p| p.0).fold(f64::INFINITY, f64::min).max(1.0);
    let xmax = points.iter().map(|p| p.0).fold(0.0, f64::max).max(xmin * 2.0);
    let ymax = points.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-9) * 1.1;
    let x =
        |v: f64| L + (v.max(xmin).log2() - xmin.log2()) / (xmax.log2() - xmin.log2()) * (W - L - R);
    let y = |v: f64| H - B - v / ymax * (H - T - B);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\">\
         <text x=\"{L}\" y=\"18\" font-size=\"14\" font-weight=\"bold\">{}</text>\
         <line x1=\"{L}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\
         <line x1=\"{L}\" y1=\"{T}\" x2=\"{L}\" y2=\"{}\" stroke=\"black\"/>\
         <text x=\"12\" y=\"{}\" font-size=\"11\" transform=\"rotate(-90 12 {})\">{}</text>",
        esc(title),
        H - B,
        W - R,
        H - B,
        H - B,
        H / 2.0,
        H / 2.0,
        esc(y_label)
    );
    for k in 0..=4 {
        let v = ymax / 4.0 * f64::from(k);
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\">{v:.3}</text>",
            L - 4.0,
            y(v) + 3.0
        );
    }
    let mut xs: Vec<f64> = points.iter().map(|p| p.0).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    for v in xs {
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a size label")]
        let label = human_size(v as usize);
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" font-size=\"10\" text-anchor=\"middle\">{label}</text>",
            x(v),
            H - B + 14.0
        );
    }
    const COLORS: [&str; 8] =
        ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> =
            pts.iter().map(|&(a, b)| format!("{:.1},{:.1}", x(a), y(b))).collect();
        let _ = write!(
            s,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
            path.join(" ")
        );
        for &(a, b) in pts {
            let _ = write!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"/>",
                x(a),
                y(b)
            );
        }
        #[expect(clippy::cast_precision_loss, reason = "a legend row")]
        let ly = T + 14.0 * i as f64;
        let _ = write!(
            s,
            "<rect x=\"{}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{color}\"/><text x=\"{}\" y=\"{:.1}\" font-size=\"10\">{}</text>",
            W - R + 10.0,
            ly,
            W - R + 24.0,
            ly + 9.0,
            esc(name)
        );
    }
    s.push_str("</svg>");
    s
}

/// Series of (size, value) by label, for tests whose name ends with `suffix`.
#[expect(clippy::cast_precision_loss, reason = "sizes as plot coordinates")]
fn by_label(
    rows: &[Row],
    suffix: &str,
    value: impl Fn(&Row) -> Option<f64>,
) -> BTreeMap<String, Vec<(f64, f64)>> {
    let mut m: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.outcome.test.ends_with(suffix)) {
        if let Some(v) = value(r) {
            m.entry(r.label.to_string()).or_default().push((r.outcome.size as f64, v));
        }
    }
    m
}

fn html(rows: &[Row], setup: &Setup, cross: &[Crossover], notes: &[String]) -> String {
    let p50 = by_label(rows, "_lat", |r| r.outcome.latency.map(|l| l.p50));
    // Peers report one latency figure: they are in the p50 plot only.
    let p99 = by_label(rows, "_lat", |r| r.outcome.latency.filter(|_| !r.peer).map(|l| l.p99));
    let bw = by_label(rows, "_bw", |r| Some(r.outcome.gbits()));
    let cpu = by_label(rows, "_bw", |r| (!r.peer).then(|| r.outcome.cpu_per_gb()));
    let mut reg: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for &(len, us, locked) in &setup.registration {
        #[expect(clippy::cast_precision_loss, reason = "sizes as plot coordinates")]
        let l = len as f64;
        reg.entry("register".into()).or_default().push((l, us));
        reg.entry("register, mlock".into()).or_default().push((l, locked));
    }
    let md = markdown(rows, setup, cross, notes);
    let mut s = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/><title>uroce compare</title>\
         <style>body{font-family:sans-serif;max-width:1000px;margin:auto}table{border-collapse:collapse}\
         td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}</style></head><body>\
         <h1>uroce compare: RDMA versus TCP on this machine</h1>",
    );
    for (title, unit, data) in [
        (
            "Latency p50 versus message size",
            "microseconds (half round trip; READ: round trip)",
            &p50,
        ),
        ("Latency p99 versus message size", "microseconds", &p99),
        ("Bandwidth versus message size", "Gbit/s", &bw),
        ("CPU per GB moved versus message size (both sides)", "CPU seconds per GB", &cpu),
        ("Memory registration versus region size", "microseconds", &reg),
    ] {
        let _ = write!(s, "<h2>{}</h2>{}", esc(title), svg(title, unit, data));
    }
    s.push_str("<h2>Tables</h2><pre>");
    s.push_str(&esc(&md));
    s.push_str("</pre></body></html>\n");
    s
}

/// The lines that matter, for the terminal.
pub(crate) fn summary(rows: &[Row], setup: &Setup, cross: &[Crossover]) -> String {
    let mut s = String::new();
    // Ping-pong latencies (half round trips) compare with each other; READ's is a round trip.
    let best = |suffix: &str, size: usize, rdma: bool, key: &dyn Fn(&Row) -> f64| {
        rows.iter()
            .filter(|r| {
                r.outcome.test.ends_with(suffix)
                    && r.outcome.size == size
                    && r.outcome.test.starts_with("tcp") != rdma
                    && !r.outcome.test.contains("read_lat")
            })
            .max_by(|a, b| key(a).total_cmp(&key(b)))
    };
    let sizes: Vec<usize> = {
        let mut v: Vec<usize> =
            rows.iter().filter(|r| r.outcome.test == "tcp_lat").map(|r| r.outcome.size).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    for &size in &sizes {
        let lat = |r: &Row| -r.outcome.latency.map_or(f64::INFINITY, |l| l.p50);
        if let (Some(t), Some(r)) =
            (best("_lat", size, false, &lat), best("_lat", size, true, &lat))
        {
            let (tp, rp) = (-lat(t), -lat(r));
            let _ = writeln!(
                s,
                "{:>6}: latency p50 {} {:.1} µs vs {} {:.1} µs ({:.2}x)",
                human_size(size),
                r.label,
                rp,
                t.label,
                tp,
                tp / rp
            );
        }
        let gb = |r: &Row| r.outcome.gbits();
        if let (Some(t), Some(r)) = (best("_bw", size, false, &gb), best("_bw", size, true, &gb)) {
            let _ = writeln!(
                s,
                "{:>6}: bandwidth {} {:.2} Gbit/s vs {} {:.2} Gbit/s ({:.2}x)",
                human_size(size),
                r.label,
                gb(r),
                t.label,
                gb(t),
                gb(r) / gb(t)
            );
        }
    }
    let _ = writeln!(
        s,
        "setup: TCP connect {:.1} µs, RDMA CM connect (RC QP, REQ/REP/RTU) {:.1} µs, RC QP create + \
         connect out of band {:.1} µs",
        setup.tcp_connect_us, setup.cm_connect_us, setup.qp_connect_us
    );
    for c in cross {
        match c.messages {
            Some(n) => {
                let _ = writeln!(
                    s,
                    "{:>6}: vs {}: RDMA RC's total time drops below TCP's after {n} messages",
                    human_size(c.size),
                    c.tcp
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    "{:>6}: vs {}: RDMA RC is not faster per message; TCP stays cheaper",
                    human_size(c.size),
                    c.tcp
                );
            }
        }
    }
    s
}
