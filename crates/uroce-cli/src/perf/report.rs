//! The report of `uroce compare`: `results.json`, `report.md` and a self-contained
//! `index.html` whose plots are inline SVG, and the terminal summary.

use core::fmt::Write as _;
use std::collections::BTreeMap;
use std::path::Path;

use super::compare::{Crossover, Row, Setup};
use super::machine::Machine;
use super::{figure, human_size};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Writes the three files into `dir`.
pub(crate) fn write(
    dir: &Path,
    machine: &Machine,
    rows: &[Row],
    setup: &Setup,
    cross: &[Crossover],
    notes: &[String],
) -> Result<(), String> {
    let put = |name: &str, text: String| {
        std::fs::write(dir.join(name), text)
            .map_err(|e| format!("cannot write {}: {e}", dir.join(name).display()))
    };
    put("results.json", json(machine, rows, setup, cross))?;
    put("report.md", markdown(machine, rows, setup, cross, notes))?;
    put("index.html", html(machine, rows, setup, cross, notes))
}

/// `results.json` (schema version 1, in the README), written with serde_json: strings escaped
/// as JSON, figures that are not finite as `null`.
#[derive(serde::Serialize)]
struct ResultsJson<'a> {
    version: u32,
    machine: &'a Machine,
    results: Vec<ResultJson<'a>>,
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

/// A row of `results.json`: the outcome (the median of the point's repeats) and its spread.
#[derive(serde::Serialize)]
struct ResultJson<'a> {
    #[serde(flatten)]
    outcome: super::OutcomeJson<'a>,
    spread: Option<SpreadJson>,
    /// The fastest and slowest cache-line round trip between CPUs 0 and 1 probed just before
    /// the point's repeats, in ns.
    cache_line_rt_ns: Option<[serde_json::Value; 2]>,
}

/// How a point's figure varied over its repeats.
#[derive(serde::Serialize)]
struct SpreadJson {
    runs: usize,
    /// `p50_us` or `gbit_s`: the figure the repeats are ordered by.
    of: &'static str,
    min: serde_json::Value,
    max: serde_json::Value,
}

#[derive(serde::Serialize)]
struct CrossoverJson<'a> {
    tcp: &'a str,
    size: usize,
    tcp_p50_us: serde_json::Value,
    rdma_p50_us: serde_json::Value,
    messages: Option<u64>,
}

fn json(machine: &Machine, rows: &[Row], setup: &Setup, cross: &[Crossover]) -> String {
    let doc = ResultsJson {
        version: 1,
        machine,
        results: rows
            .iter()
            .map(|r| ResultJson {
                outcome: r.outcome.view(Some((&r.label, r.peer))),
                spread: r.spread.map(|sp| SpreadJson {
                    runs: sp.runs,
                    of: if sp.latency { "p50_us" } else { "gbit_s" },
                    min: figure(sp.min, 4),
                    max: figure(sp.max, 4),
                }),
                cache_line_rt_ns: r.cache_line_rt_ns.map(|[a, b]| [figure(a, 1), figure(b, 1)]),
            })
            .collect(),
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

fn markdown(
    machine: &Machine,
    rows: &[Row],
    setup: &Setup,
    cross: &[Crossover],
    notes: &[String],
) -> String {
    let mut s = String::from("# uroce compare: RDMA versus TCP on this machine\n\n");
    let _ = writeln!(s, "Measured on {}.\n\n## Summary\n", machine.describe());
    for line in summary_lines(rows, setup, cross) {
        let _ = writeln!(s, "- {line}");
    }
    s.push_str(
        "\n| size | metric | RDMA (best path) | TCP (best) | winner |\n|---:|---|---|---|---|\n",
    );
    for v in verdicts(rows) {
        let _ = writeln!(
            s,
            "| {} | {} | {} {} | {} {} | {} |",
            human_size(v.size),
            v.metric.name(),
            v.rdma.0,
            v.metric.show(v.rdma.1),
            v.tcp.0,
            v.metric.show(v.tcp.1),
            v.winner()
        );
    }
    s.push_str(
        "\n### Reference: each path at 64 B and 64 KiB, and a published hardware comparison\n\n",
    );
    let _ = writeln!(s, "| {} |", REFERENCE_HEADER.join(" | "));
    let _ = writeln!(s, "|---|---:|---:|---:|---|");
    for cells in reference_rows(rows) {
        let _ = writeln!(s, "| {} |", cells.join(" | "));
    }
    s.push_str("\n## Results\n\n");
    s.push_str("| series | test | size | p50 µs | p99 µs | Gbit/s | msg/s | CPU s/GB | spread (runs) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in rows {
        let _ = writeln!(s, "| {} |", result_cells(r).join(" | "));
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
        // Notes are what failed, what the machine lacked, and how each peer tool ran.
        s.push_str("\n## Notes\n\n");
        if rows.iter().any(|r| r.peer) {
            s.push_str("Rows labelled `peer:` were measured by the tools below in the same run (latency or bandwidth only; their CPU is not in the tables).\n\n");
        }
        for n in notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}

/// The decimal exponent of `v` (floor or ceiling of its log10), for axis arithmetic.
#[expect(clippy::cast_possible_truncation, reason = "exponents of plotted figures are small")]
fn exponent(v: f64, up: bool) -> i32 {
    let e = v.log10();
    (if up { e.ceil() } else { e.floor() }) as i32
}

/// Tick values for an axis from `lo` to `hi`: 1, 2 and 5 times powers of ten on a log axis
/// (fewer when the span is wide), or about five round steps from zero on a linear one.
fn ticks(lo: f64, hi: f64, log: bool) -> Vec<f64> {
    if log {
        let (a, b) = (exponent(lo, false), exponent(hi, true));
        let mantissas: &[f64] = if b - a > 4 { &[1.0] } else { &[1.0, 2.0, 5.0] };
        (a..=b)
            .flat_map(|e| mantissas.iter().map(move |m| m * 10f64.powi(e)))
            .filter(|v| (lo..=hi).contains(v))
            .collect()
    } else {
        let raw = hi / 5.0;
        let mag = 10f64.powi(exponent(raw, false));
        let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(mag);
        (0..=5).map(|k| step * f64::from(k)).filter(|v| *v <= hi).collect()
    }
}

/// A tick label a person reads at a glance: 0.05, 2, 150, 12k, 3M.
fn tick_label(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e4 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

/// `v` with at most three significant figures, no trailing zeros.
fn trim(v: f64) -> String {
    let digits = if v.abs() >= 100.0 || v == 0.0 {
        0
    } else {
        usize::try_from((2 - exponent(v.abs(), false)).clamp(0, 6)).unwrap_or(0)
    };
    let s = format!("{v:.digits$}");
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
}

/// One line plot: x on a log scale (sizes); y on a log scale when the values span more than
/// two decades (microseconds beside milliseconds), else linear from zero. The legend lies
/// below the plot, each label whole.
#[expect(clippy::cast_precision_loss, reason = "plot coordinates")]
fn svg(title: &str, y_label: &str, series: &BTreeMap<String, Vec<(f64, f64)>>) -> String {
    const W: f64 = 760.0;
    const PLOT_H: f64 = 320.0;
    const L: f64 = 70.0;
    const R: f64 = 20.0;
    const T: f64 = 30.0;
    const B: f64 = 40.0;
    const LEGEND_ROW: f64 = 16.0;
    let points: Vec<(f64, f64)> = series.values().flatten().copied().collect();
    let xmin = points.iter().map(|p| p.0).fold(f64::INFINITY, f64::min).max(1.0);
    let xmax = points.iter().map(|p| p.0).fold(0.0, f64::max).max(xmin * 2.0);
    let positive = || points.iter().map(|p| p.1).filter(|v| *v > 0.0 && v.is_finite());
    let ymin_pos = positive().fold(f64::INFINITY, f64::min);
    let ymax = positive().fold(0.0, f64::max).max(1e-9);
    let log = ymin_pos.is_finite() && ymax / ymin_pos > 100.0;
    let (ylo, yhi) = if log {
        (10f64.powf(ymin_pos.log10().floor()), 10f64.powf(ymax.log10().ceil()))
    } else {
        let t = ticks(0.0, ymax * 1.1, false);
        (0.0, t.last().copied().filter(|top| *top >= ymax).unwrap_or(ymax * 1.1))
    };
    let columns = 2;
    let legend_rows = series.len().div_ceil(columns);
    let h = PLOT_H + LEGEND_ROW * legend_rows as f64 + 10.0;
    let x =
        |v: f64| L + (v.max(xmin).log2() - xmin.log2()) / (xmax.log2() - xmin.log2()) * (W - L - R);
    let y = |v: f64| {
        let f = if log {
            (v.max(ylo).log10() - ylo.log10()) / (yhi.log10() - ylo.log10())
        } else {
            v / yhi
        };
        PLOT_H - B - f * (PLOT_H - T - B)
    };
    let scale = if log { ", log scale" } else { "" };
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{h}\" viewBox=\"0 0 {W} {h}\">\
         <text x=\"{L}\" y=\"18\" font-size=\"14\" font-weight=\"bold\">{}</text>\
         <line x1=\"{L}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\
         <line x1=\"{L}\" y1=\"{T}\" x2=\"{L}\" y2=\"{}\" stroke=\"black\"/>\
         <text x=\"12\" y=\"{}\" font-size=\"11\" transform=\"rotate(-90 12 {})\" text-anchor=\"middle\">{}{scale}</text>",
        esc(title),
        PLOT_H - B,
        W - R,
        PLOT_H - B,
        PLOT_H - B,
        PLOT_H / 2.0,
        PLOT_H / 2.0,
        esc(y_label)
    );
    for v in ticks(ylo.max(if log { 1e-12 } else { 0.0 }), yhi, log) {
        let _ = write!(
            s,
            "<line x1=\"{L}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#eee\"/>\
             <text x=\"{}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\">{}</text>",
            W - R,
            L - 4.0,
            y(v) + 3.0,
            tick_label(v),
            y = y(v),
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
            PLOT_H - B + 14.0
        );
    }
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">message size (bytes)</text>",
        (L + W - R) / 2.0,
        PLOT_H - B + 30.0
    );
    const COLORS: [&str; 10] = [
        "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
        "#7f7f7f", "#bcbd22",
    ];
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
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"><title>{}: {} at {}</title></circle>",
                x(a),
                y(b),
                esc(name),
                tick_label(b),
                {
                    #[expect(
                        clippy::cast_possible_truncation,
                        clippy::cast_sign_loss,
                        reason = "a size"
                    )]
                    let size = a as usize;
                    human_size(size)
                }
            );
        }
        let (col, row) = (i % columns, i / columns);
        let lx = L + (W - L - R) / columns as f64 * col as f64;
        let ly = PLOT_H + LEGEND_ROW * row as f64;
        let _ = write!(
            s,
            "<rect x=\"{lx:.1}\" y=\"{ly:.1}\" width=\"10\" height=\"10\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">{}</text>",
            lx + 14.0,
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

/// A result's cells in the Results table: series, test, size, p50 µs, p99 µs, Gbit/s, msg/s
/// and CPU s/GB. Peers report latency or bandwidth only, and no CPU.
fn result_cells(r: &Row) -> Vec<String> {
    let o = &r.outcome;
    let (p50, p99) = o
        .latency
        .map_or(("-".into(), "-".into()), |l| (format!("{:.1}", l.p50), format!("{:.1}", l.p99)));
    let (rate, cpu) = if r.peer {
        ("-".to_string(), "-".to_string())
    } else {
        (format!("{:.0}", o.msg_rate()), format!("{:.2}", o.cpu_per_gb()))
    };
    let gbits =
        if r.peer && o.latency.is_some() { "-".into() } else { format!("{:.2}", o.gbits()) };
    // The point's figure (p50 or Gbit/s) from its lowest to its highest repeat.
    let spread = r.spread.map_or_else(
        || "-".to_string(),
        |sp| {
            // An infinite latency is a repeat in which no round was answered.
            let show =
                |v: f64| if v.is_finite() { format!("{v:.1}") } else { "none answered".into() };
            let (lo, hi) = if sp.latency {
                (show(sp.min), show(sp.max))
            } else {
                (format!("{:.2}", sp.min), format!("{:.2}", sp.max))
            };
            format!("{lo}–{hi} ({})", sp.runs)
        },
    );
    vec![r.label.clone(), o.test.into(), human_size(o.size), p50, p99, gbits, rate, cpu, spread]
}

/// A table of `head` and `rows`, each cell escaped; numbers align right.
fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = String::from("<table><tr>");
    for h in head {
        let _ = write!(s, "<th>{}</th>", esc(h));
    }
    s.push_str("</tr>");
    for r in rows {
        s.push_str("<tr>");
        for c in r {
            let numeric = c.chars().next().is_some_and(|ch| ch.is_ascii_digit() || ch == '-');
            let class = if numeric { "" } else { " class=\"t\"" };
            let _ = write!(s, "<td{class}>{}</td>", esc(c));
        }
        s.push_str("</tr>");
    }
    s.push_str("</table>");
    s
}

fn html(
    machine: &Machine,
    rows: &[Row],
    setup: &Setup,
    cross: &[Crossover],
    notes: &[String],
) -> String {
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
    let mut s = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/><title>uroce compare</title>\
         <style>body{font-family:sans-serif;max-width:1000px;margin:auto;padding:0 1em}\
         table{border-collapse:collapse;margin:0.5em 0}\
         td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}th{background:#f4f4f4}\
         td.t{text-align:left}.meta{color:#555}</style></head><body>\
         <h1>uroce compare: RDMA versus TCP on this machine</h1>",
    );
    let _ = write!(
        s,
        "<p class=\"meta\">Measured on {}.</p><h2>Summary</h2><ul>",
        esc(&machine.describe())
    );
    for line in summary_lines(rows, setup, cross) {
        let _ = write!(s, "<li>{}</li>", esc(&line));
    }
    s.push_str("</ul>");
    let verdict_rows: Vec<Vec<String>> = verdicts(rows)
        .iter()
        .map(|v| {
            vec![
                human_size(v.size),
                v.metric.name().into(),
                format!("{} {}", v.rdma.0, v.metric.show(v.rdma.1)),
                format!("{} {}", v.tcp.0, v.metric.show(v.tcp.1)),
                v.winner(),
            ]
        })
        .collect();
    s.push_str(&table(
        &["size", "metric", "RDMA (best path)", "TCP (best)", "winner"],
        &verdict_rows,
    ));
    s.push_str(
        "<h3>Reference: each path at 64 B and 64 KiB, and a published hardware comparison</h3>",
    );
    s.push_str(&table(&REFERENCE_HEADER, &reference_rows(rows)));
    s.push_str("<h2>Crossover</h2><p>Messages of each size after which RDMA's total time (an RDMA CM connection, a registration of the message size, then half round trips) drops below TCP's (connect, then half round trips), from the p50 latencies.</p>");
    let cross_rows: Vec<Vec<String>> = cross
        .iter()
        .map(|c| {
            vec![
                c.tcp.to_string(),
                human_size(c.size),
                format!("{:.1}", c.tcp_us),
                format!("{:.1}", c.rdma_us),
                c.messages.map_or_else(|| "never".to_string(), |n| n.to_string()),
            ]
        })
        .collect();
    s.push_str(&table(
        &["against", "size", "TCP p50 µs", "RDMA RC p50 µs", "messages"],
        &cross_rows,
    ));
    for (title, unit, data) in [
        ("Latency p50 versus message size", "µs (half round trip; READ: round trip)", &p50),
        ("Latency p99 versus message size", "µs", &p99),
        ("Bandwidth versus message size", "Gbit/s", &bw),
        ("CPU per GB moved versus message size (both sides)", "CPU seconds per GB", &cpu),
        ("Memory registration versus region size", "µs", &reg),
    ] {
        let _ = write!(s, "<h2>{}</h2>{}", esc(title), svg(title, unit, data));
    }
    s.push_str("<h2>Results</h2>");
    let result_rows: Vec<Vec<String>> = rows.iter().map(result_cells).collect();
    s.push_str(&table(
        &[
            "series",
            "test",
            "size",
            "p50 µs",
            "p99 µs",
            "Gbit/s",
            "msg/s",
            "CPU s/GB",
            "spread (runs)",
        ],
        &result_rows,
    ));
    let _ = write!(
        s,
        "<h2>Setup cost</h2><p>TCP connect (connect + accept): {:.1} µs. An RC QP created and connected \
         through the RDMA connection manager (REQ, REP, RTU): {:.1} µs. An RC QP created and moved \
         through Init, RTR and RTS with the peer's endpoint known (exchanged out of band, not counted): \
         {:.1} µs.</p>",
        setup.tcp_connect_us, setup.cm_connect_us, setup.qp_connect_us
    );
    let reg_rows: Vec<Vec<String>> = setup
        .registration
        .iter()
        .map(|(len, us, locked)| vec![human_size(*len), format!("{us:.1}"), format!("{locked:.1}")])
        .collect();
    s.push_str(&table(&["region", "register + deregister µs", "locked (mlock) µs"], &reg_rows));
    if !notes.is_empty() {
        s.push_str("<h2>Notes</h2><ul>");
        for n in notes {
            let _ = write!(s, "<li>{}</li>", esc(n));
        }
        s.push_str("</ul>");
    }
    s.push_str("</body></html>\n");
    s
}

/// The reference table's columns.
const REFERENCE_HEADER: [&str; 5] = [
    "path",
    "latency p50 at 64 B",
    "bandwidth at 64 KiB",
    "CPU at that bandwidth (both sides)",
    "source",
];

/// The published comparison the report is modelled on, quoted for scale: two servers, a
/// 100 Gbit/s link, ConnectX-5; never measured here.
const QUOTED: [[&str; 4]; 2] = [
    ["TCP tuned (sockperf; iperf3)", "23 µs", "94 Gbit/s", "about 80 %"],
    ["RDMA RC (ConnectX-5)", "1.2 µs", "98 Gbit/s", "under 5 %"],
];

/// The path a row belongs to: its TCP setting, or what follows ` · ` in an RDMA row's label.
fn path_of(r: &Row) -> &str {
    r.label.split_once(" · ").map_or(r.label.as_str(), |(_, path)| path)
}

/// For TCP default, TCP tuned and each RDMA path: its best p50 latency at 64 B (ping-pongs;
/// READ's round trip is not comparable), its best bandwidth at 64 KiB and the CPU of both sides
/// in that run (100 % is one core busy); then the quoted hardware figures, marked as such.
fn reference_rows(rows: &[Row]) -> Vec<Vec<String>> {
    let mut paths: Vec<&str> = Vec::new();
    for r in rows.iter().filter(|r| !r.peer && !r.outcome.test.starts_with("udp")) {
        if !paths.contains(&path_of(r)) {
            paths.push(path_of(r));
        }
    }
    let mut out = Vec::new();
    for path in paths {
        let mine = || rows.iter().filter(move |r| !r.peer && path_of(r) == path);
        let lat = mine()
            .filter(|r| r.outcome.size == 64 && r.outcome.test.ends_with("_lat"))
            .filter(|r| !r.outcome.test.contains("read"))
            .filter_map(|r| r.outcome.latency.map(|l| (l.p50, r.outcome.test)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let bw = mine()
            .filter(|r| r.outcome.size == 65_536 && r.outcome.test.ends_with("_bw"))
            .max_by(|a, b| a.outcome.gbits().total_cmp(&b.outcome.gbits()));
        out.push(vec![
            path.to_string(),
            lat.map_or_else(|| "-".into(), |(v, test)| format!("{v:.1} µs ({test})")),
            bw.map_or_else(
                || "-".into(),
                |r| format!("{:.2} Gbit/s ({})", r.outcome.gbits(), r.outcome.test),
            ),
            bw.map_or_else(
                || "-".into(),
                |r| {
                    format!(
                        "{:.0} %",
                        (r.outcome.client_cores() + r.outcome.server_cores()) * 100.0
                    )
                },
            ),
            "measured here".into(),
        ]);
    }
    for q in QUOTED {
        let mut cells: Vec<String> = q.iter().map(|c| (*c).to_string()).collect();
        cells.push(
            "quoted, not measured: a published comparison on two servers with a 100 Gbit/s \
             link and ConnectX-5 NICs"
                .into(),
        );
        out.push(cells);
    }
    out
}

/// What a verdict compares.
#[derive(Clone, Copy)]
enum Metric {
    /// p50 latency, µs: lower wins.
    Latency,
    /// Bandwidth, Gbit/s: higher wins.
    Bandwidth,
}

impl Metric {
    fn name(self) -> &'static str {
        match self {
            Self::Latency => "latency p50",
            Self::Bandwidth => "bandwidth",
        }
    }

    fn show(self, v: f64) -> String {
        match self {
            Self::Latency => format!("{v:.1} µs"),
            Self::Bandwidth => format!("{v:.2} Gbit/s"),
        }
    }
}

/// The best RDMA path against the best TCP setting, at one size, on one metric.
struct Verdict {
    size: usize,
    metric: Metric,
    rdma: (String, f64),
    tcp: (String, f64),
}

impl Verdict {
    /// Who wins and by how much, the ratio always at least 1: "RDMA RC SEND, 3.57× lower".
    fn winner(&self) -> String {
        let (r, t) = (self.rdma.1, self.tcp.1);
        let (rdma_wins, ratio) = match self.metric {
            Metric::Latency => (r <= t, if r <= t { t / r } else { r / t }),
            Metric::Bandwidth => (r >= t, if r >= t { r / t } else { t / r }),
        };
        let who = if rdma_wins { &self.rdma.0 } else { &self.tcp.0 };
        let way = match self.metric {
            Metric::Latency => "lower",
            Metric::Bandwidth => "higher",
        };
        format!("{who}, {ratio:.2}× {way}")
    }
}

/// At each size TCP latency was measured: the best RDMA path against the best TCP setting for
/// latency (ping-pongs; READ's round trip is not comparable) and for bandwidth (streams that
/// moved something).
fn verdicts(rows: &[Row]) -> Vec<Verdict> {
    // The row of the given side whose figure `key` is best (lowest when `lower`).
    let best =
        |suffix: &str, size: usize, rdma: bool, lower: bool, key: &dyn Fn(&Row) -> Option<f64>| {
            rows.iter()
                .filter(|r| {
                    r.outcome.test.ends_with(suffix)
                        && r.outcome.size == size
                        && r.outcome.test.starts_with("tcp") != rdma
                        && !r.outcome.test.starts_with("udp")
                        && !r.outcome.test.contains("read_lat")
                })
                .filter_map(|r| {
                    key(r).filter(|v| v.is_finite() && *v > 0.0).map(|v| (r.label.clone(), v))
                })
                .min_by(|a, b| if lower { a.1.total_cmp(&b.1) } else { b.1.total_cmp(&a.1) })
        };
    let mut sizes: Vec<usize> =
        rows.iter().filter(|r| r.outcome.test == "tcp_lat").map(|r| r.outcome.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut out = Vec::new();
    for size in sizes {
        let lat = |r: &Row| r.outcome.latency.map(|l| l.p50);
        if let (Some(rdma), Some(tcp)) =
            (best("_lat", size, true, true, &lat), best("_lat", size, false, true, &lat))
        {
            out.push(Verdict { size, metric: Metric::Latency, rdma, tcp });
        }
        let gb = |r: &Row| Some(r.outcome.gbits());
        if let (Some(rdma), Some(tcp)) =
            (best("_bw", size, true, false, &gb), best("_bw", size, false, false, &gb))
        {
            out.push(Verdict { size, metric: Metric::Bandwidth, rdma, tcp });
        }
    }
    out
}

/// The lines that matter, in words: who wins where and by how much, what setting up costs,
/// and when RDMA's set-up pays for itself.
fn summary_lines(rows: &[Row], setup: &Setup, cross: &[Crossover]) -> Vec<String> {
    let mut lines: Vec<String> = verdicts(rows)
        .iter()
        .map(|v| {
            format!(
                "{:>6} {}: {} ({} {} against {} {})",
                human_size(v.size),
                v.metric.name(),
                v.winner(),
                v.rdma.0,
                v.metric.show(v.rdma.1),
                v.tcp.0,
                v.metric.show(v.tcp.1)
            )
        })
        .collect();
    // How far the repeats of a point lie apart: the widest range, relative to its median.
    let widest = rows
        .iter()
        .filter_map(|r| {
            let sp = r.spread?;
            let mid = if sp.latency { r.outcome.latency?.p50 } else { r.outcome.gbits() };
            let width = (sp.max - sp.min) / mid;
            width.is_finite().then_some((width, r, sp))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((width, r, sp)) = widest {
        let unit = if sp.latency { "µs p50" } else { "Gbit/s" };
        lines.push(format!(
            "repeats: the widest spread is {} {} at {}: {:.2} to {:.2} {unit} over {} runs \
             ({:.0} % of its median)",
            r.label,
            r.outcome.test,
            human_size(r.outcome.size),
            sp.min,
            sp.max,
            sp.runs,
            width * 100.0
        ));
    }
    lines.extend(machine_line(rows));
    lines.push(format!(
        "setup: TCP connect {:.1} µs; an RC QP through the RDMA CM (REQ/REP/RTU) {:.1} µs; an RC \
         QP created and connected with the peer's endpoint known {:.1} µs",
        setup.tcp_connect_us, setup.cm_connect_us, setup.qp_connect_us
    ));
    for c in cross {
        lines.push(match c.messages {
            Some(n) => format!(
                "{:>6} against {}: RDMA RC's total time drops below TCP's after {n} messages",
                human_size(c.size),
                c.tcp
            ),
            None => format!(
                "{:>6} against {}: RDMA RC is not faster per message; TCP stays cheaper",
                human_size(c.size),
                c.tcp
            ),
        });
    }
    lines
}

/// What the host did meanwhile, when it mattered: the cache-line round trip between the two
/// CPUs probed before each point, when its slowest was half again its fastest.
fn machine_line(rows: &[Row]) -> Option<String> {
    let probes: Vec<f64> = rows.iter().filter_map(|r| r.cache_line_rt_ns).flatten().collect();
    let lo = probes.iter().copied().min_by(f64::total_cmp)?;
    let hi = probes.iter().copied().max_by(f64::total_cmp)?;
    (hi > lo * 1.5).then(|| {
        format!(
            "machine: a cache line between CPUs 0 and 1 took {lo:.0} to {hi:.0} ns over the run \
             (probed before every point; on a VM the host may move the vCPUs between cores that \
             share a cache and cores that do not): a latency that moves with it follows the \
             machine, not the stack (each row's cache_line_rt_ns in results.json)"
        )
    })
}

/// The lines that matter, for the terminal.
pub(crate) fn summary(rows: &[Row], setup: &Setup, cross: &[Crossover]) -> String {
    summary_lines(rows, setup, cross).iter().map(|l| format!("{l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_read_at_a_glance() {
        let decades = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0];
        assert_eq!(ticks(1.0, 1000.0, true), decades);
        assert_eq!(ticks(0.0, 8798.893, false), [0.0, 2000.0, 4000.0, 6000.0, 8000.0]);
        assert_eq!(tick_label(8798.893), "8799");
        assert_eq!(tick_label(12_000.0), "12k");
        assert_eq!(tick_label(0.05), "0.05");
        assert_eq!(tick_label(2_500_000.0), "2.5M");
    }

    #[test]
    fn a_verdict_says_who_wins_and_which_way() {
        let lat = Verdict {
            size: 64,
            metric: Metric::Latency,
            rdma: ("RDMA".into(), 2.0),
            tcp: ("TCP".into(), 8.0),
        };
        assert_eq!(lat.winner(), "RDMA, 4.00× lower");
        let bw = Verdict {
            size: 64,
            metric: Metric::Bandwidth,
            rdma: ("RDMA".into(), 1.0),
            tcp: ("TCP".into(), 3.0),
        };
        assert_eq!(bw.winner(), "TCP, 3.00× higher");
    }

    /// A row of a run: `label`, `test` at `size`, a p50 (latency tests), or `bytes` moved in
    /// one second with each side busy `cores`.
    fn row(label: &str, test: &'static str, size: usize, p50: f64, bytes: u64, cores: f64) -> Row {
        let latency = test.ends_with("_lat").then_some(p50);
        let mut outcome = crate::perf::Outcome::of_figure(test, size, latency, bytes);
        outcome.client_cpu = crate::perf::Cpu { user: cores, sys: 0.0 };
        outcome.server_cpu = outcome.client_cpu;
        Row { label: label.into(), peer: false, outcome, spread: None, cache_line_rt_ns: None }
    }

    #[test]
    fn the_reference_table_has_each_path_at_64_bytes_and_64_kib_and_the_quoted_figures() {
        let rows = [
            row("TCP tuned", "tcp_lat", 64, 5.0, 64, 1.0),
            row("TCP tuned", "tcp_bw", 65_536, 0.0, 4_000_000_000, 0.5),
            row("RDMA RC SEND · uroce shm", "rc_lat", 64, 2.0, 64, 1.0),
            row("RDMA UD SEND · uroce shm", "ud_lat", 64, 1.5, 64, 1.0),
            // READ's round trip is not a half round trip: never the path's latency.
            row("RDMA RC READ · uroce shm", "rc_rdma_read_lat", 64, 1.0, 64, 1.0),
            row("RDMA RC WRITE · uroce shm", "rc_rdma_write_bw", 65_536, 0.0, 5_000_000_000, 0.25),
            row("RDMA RC SEND · uroce shm", "rc_bw", 65_536, 0.0, 3_000_000_000, 1.0),
            // Another size is not the reference's.
            row("RDMA RC SEND · uroce UDP", "rc_lat", 4096, 9.0, 64, 1.0),
            row("RDMA RC SEND · uroce UDP", "rc_lat", 64, 10.0, 64, 1.0),
        ];
        let table = reference_rows(&rows);
        let cells = |i: usize| table[i].iter().map(String::as_str).collect::<Vec<_>>();
        assert_eq!(
            cells(0),
            ["TCP tuned", "5.0 µs (tcp_lat)", "32.00 Gbit/s (tcp_bw)", "100 %", "measured here"]
        );
        assert_eq!(
            cells(1),
            [
                "uroce shm",
                "1.5 µs (ud_lat)",
                "40.00 Gbit/s (rc_rdma_write_bw)",
                "50 %",
                "measured here"
            ]
        );
        assert_eq!(cells(2), ["uroce UDP", "10.0 µs (rc_lat)", "-", "-", "measured here"]);
        assert_eq!(table.len(), 5);
        assert!(table[3][4].starts_with("quoted, not measured") && table[4][1] == "1.2 µs");
    }
}
