//! `uroce compare --with-peers`: the same loopback measurements by sockperf, qperf and iperf3
//! (whichever are installed), set beside uroce's in the report. Each tool runs with its server
//! on 127.0.0.1 and is stopped afterwards; a tool that is missing is skipped with a note.
//!
//! perftest does the same for the RDMA side: `ib_send_lat`, `ib_write_lat`, `ib_read_lat`,
//! `ib_send_bw` and `ib_write_bw` on the devices the matrix used — an honesty check on the
//! harness's own RDMA loops.

use core::time::Duration;
use std::process::{Child, Command, Stdio};

use super::Outcome;
use super::compare::Row;

fn installed(tool: &str) -> bool {
    Command::new(tool).arg("--help").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// A tool's server, killed on drop.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn daemon(cmd: &str, args: &[&str]) -> Option<Daemon> {
    let child =
        Command::new(cmd).args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().ok()?;
    // Give it a moment to listen.
    #[expect(clippy::disallowed_methods, reason = "waiting for another program to listen")]
    std::thread::sleep(Duration::from_millis(300));
    Some(Daemon(child))
}

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    Some(String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

/// The number after `key` on the first line that starts with it (or, for sockperf's
/// "---> percentile", contains it), with its unit word.
fn after(text: &str, key: &str) -> Option<(f64, String)> {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(key) || l.contains(&format!("> {key}")))?;
    let rest = line.split(key).nth(1)?;
    let mut words = rest.split_whitespace().filter(|w| *w != "=" && *w != ":");
    let v: f64 = words.next()?.trim_matches(',').parse().ok()?;
    Some((v, words.next().unwrap_or("").to_string()))
}

fn row(
    label: &str,
    test: &'static str,
    size: usize,
    lat_us: Option<f64>,
    gbits: Option<f64>,
) -> Row {
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "bytes in a second"
    )]
    let bytes = gbits.map_or(size as u64, |g| (g * 1e9 / 8.0) as u64);
    Row {
        label: label.to_string(),
        peer: true,
        spread: None,
        cache_line_rt_ns: None,
        outcome: Outcome::of_figure(test, size, lat_us, bytes),
    }
}

/// Where perftest runs: the command line before its name on each side, and its device options.
pub(crate) struct Perftest {
    /// Before the tool's name on the server's side (`uroce exec --addr SERVER --`, or nothing).
    pub(crate) server_prefix: Vec<String>,
    /// The same on the client's side.
    pub(crate) client_prefix: Vec<String>,
    /// The verbs device of each side (`-d`; `None`: perftest's default, the first listed) and
    /// the GID index (`-x`).
    pub(crate) device: Option<String>,
    pub(crate) gid_index: u32,
    /// Where the client finds the server's control socket.
    pub(crate) server_ip: String,
    /// The label of its rows: `peer: perftest …` and where it ran.
    pub(crate) label: String,
}

/// perftest's tools, the matrix test each sits beside and its series' name.
const PERFTEST: [(&str, &str, &str); 5] = [
    ("ib_send_lat", "rc_lat", "RC SEND"),
    // ib_write_lat spins on memory for the peer's WRITE; the matrix's series uses the
    // immediate's completion: the nearest it has.
    ("ib_write_lat", "rc_rdma_write_lat", "RC WRITE"),
    ("ib_read_lat", "rc_rdma_read_lat", "RC READ"),
    ("ib_send_bw", "rc_bw", "RC SEND"),
    ("ib_write_bw", "rc_rdma_write_bw", "RC WRITE"),
];

/// One perftest measurement: its server, then its client; the client's result line.
fn perftest_once(p: &Perftest, tool: &str, port: u16, extra: &[String]) -> Option<Vec<f64>> {
    let mut common = Vec::new();
    if let Some(d) = &p.device {
        common.extend(["-d".to_string(), d.clone()]);
    }
    common.extend(["-x".to_string(), p.gid_index.to_string(), "-p".into(), port.to_string()]);
    common.push("-F".into());
    common.extend_from_slice(extra);
    let (server_cmd, server_args) = split(&p.server_prefix, tool, &common);
    let _server = daemon_owned(&server_cmd, &server_args)?;
    let mut client_args = common.clone();
    client_args.push(p.server_ip.clone());
    let (client_cmd, client_args) = split(&p.client_prefix, tool, &client_args);
    let out = Command::new(&client_cmd).args(&client_args).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // The result line is the one that starts with the message size.
    let size = extra.iter().skip_while(|a| *a != "-s").nth(1)?;
    let line = text.lines().find(|l| l.split_whitespace().next() == Some(size.as_str()))?;
    line.split_whitespace().map(|w| w.parse::<f64>().ok()).collect()
}

/// `prefix` then `tool` then `args`, as a program and its arguments.
fn split(prefix: &[String], tool: &str, args: &[String]) -> (String, Vec<String>) {
    let mut all: Vec<String> = prefix.to_vec();
    all.push(tool.to_string());
    all.extend_from_slice(args);
    let program = all.remove(0);
    (program, all)
}

fn daemon_owned(cmd: &str, args: &[String]) -> Option<Daemon> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    daemon(cmd, &args)
}

/// perftest's five tools at `sizes` (latency up to 64 KiB) on `p`'s devices.
pub(crate) fn run_perftest(p: &Perftest, sizes: &[usize], secs: f64) -> (Vec<Row>, Vec<String>) {
    let mut rows = Vec::new();
    if !installed("ib_send_lat") {
        return (rows, vec!["perftest: not installed (apt-get install -y perftest)".into()]);
    }
    let t = format!("{}", secs.ceil().max(1.0));
    let mut port = 18_700;
    for (tool, test, what) in PERFTEST {
        let latency = tool.ends_with("_lat");
        for &size in sizes.iter().filter(|&&s| !latency || s <= 65_536) {
            port += 1;
            let mut extra = vec!["-s".to_string(), size.to_string()];
            if latency {
                extra.extend(["-n".to_string(), "5000".into()]);
            } else {
                extra.extend(["-D".to_string(), t.clone(), "--report_gbits".into()]);
            }
            let Some(v) = perftest_once(p, tool, port, &extra) else { continue };
            // Latency: #bytes #iterations t_min t_max t_typical (the median) …; bandwidth:
            // #bytes #iterations BW_peak BW_average (Gbit/s) MsgRate.
            let label = format!("{} {what}", p.label);
            let figure = if latency { v.get(4) } else { v.get(3) }.copied();
            let (lat, bw) = if latency { (figure, None) } else { (None, figure) };
            if figure.is_some() {
                rows.push(row(&label, test, size, lat, bw));
            }
        }
    }
    let note = format!(
        "perftest ({}): `ib_send_lat`, `ib_write_lat`, `ib_read_lat` with `-s SIZE -n 5000` \
         (t_typical, the median), `ib_send_bw`, `ib_write_bw` with `-s SIZE -D {t} \
         --report_gbits` (BW average), each `-d {} -x {}`{}",
        p.label,
        p.device.as_deref().unwrap_or("(first)"),
        p.gid_index,
        if p.server_prefix.is_empty() { String::new() } else { " under `uroce exec`".into() }
    );
    (rows, vec![note])
}

/// Runs the peers at `sizes` (TCP latency up to 64 KiB, bandwidth at every size); returns their
/// rows and a note per tool.
pub(crate) fn run(sizes: &[usize], secs: f64) -> (Vec<Row>, Vec<String>) {
    let (mut rows, mut notes) = (Vec::new(), Vec::new());
    let t = format!("{}", secs.ceil().max(1.0));
    if installed("sockperf") {
        let _d = daemon("sockperf", &["server", "--tcp", "-i", "127.0.0.1", "-p", "11119"]);
        for &size in sizes.iter().filter(|&&s| s <= 65_536) {
            let m = size.to_string();
            let args = ["ping-pong", "--tcp", "-i", "127.0.0.1", "-p", "11119", "-m", &m, "-t", &t];
            // "percentile 50.000 =   26.123" (microseconds, one way).
            if let Some((p50, _)) =
                output("sockperf", &args).and_then(|o| after(&o, "percentile 50.000"))
            {
                rows.push(row("peer: sockperf TCP", "tcp_lat", size, Some(p50), None));
            }
        }
        notes.push(format!("sockperf: `sockperf ping-pong --tcp -m SIZE -t {t}`, p50 one way"));
    } else {
        notes.push("sockperf: not installed (apt-get install -y sockperf)".into());
    }
    if installed("qperf") {
        let _d = daemon("qperf", &["-lp", "19766"]);
        for &size in sizes {
            let m = size.to_string();
            let args = ["-lp", "19766", "-t", &t, "-m", &m, "127.0.0.1", "tcp_lat", "tcp_bw"];
            let Some(out) = output("qperf", &args) else { continue };
            let lat = after(&out, "latency").map(|(v, unit)| match unit.as_str() {
                "ms" => v * 1e3,
                "sec" => v * 1e6,
                "ns" => v / 1e3,
                _ => v,
            });
            let bw = after(&out, "bw").map(|(v, unit)| match unit.as_str() {
                "GB/sec" => v * 8.0,
                "MB/sec" => v * 8.0 / 1e3,
                "KB/sec" => v * 8.0 / 1e6,
                _ => v * 8.0 / 1e9,
            });
            if size <= 65_536 {
                rows.push(row("peer: qperf TCP", "tcp_lat", size, lat, None));
            }
            rows.push(row("peer: qperf TCP", "tcp_bw", size, None, bw));
        }
        notes.push(format!(
            "qperf: `qperf -t {t} -m SIZE 127.0.0.1 tcp_lat tcp_bw` (latency is its mean)"
        ));
    } else {
        notes.push("qperf: not installed (apt-get install -y qperf)".into());
    }
    if installed("iperf3") {
        let _d = daemon("iperf3", &["-s", "-p", "5299"]);
        for &size in sizes.iter().filter(|&&s| s >= 1024) {
            let l = size.to_string();
            let args = ["-c", "127.0.0.1", "-p", "5299", "-t", &t, "-l", &l, "-f", "g"];
            // "... 12.3 Gbits/sec ... receiver"
            let gbits = output("iperf3", &args).and_then(|o| {
                let line = o.lines().find(|l| l.contains("receiver"))?.to_string();
                let w: Vec<&str> = line.split_whitespace().collect();
                let i = w.iter().position(|x| x.starts_with("Gbits/sec"))?;
                w.get(i.checked_sub(1)?)?.parse::<f64>().ok()
            });
            if gbits.is_some() {
                rows.push(row("peer: iperf3 TCP", "tcp_bw", size, None, gbits));
            }
        }
        notes.push(format!("iperf3: `iperf3 -c 127.0.0.1 -t {t} -l SIZE`, receiver side"));
    } else {
        notes.push("iperf3: not installed (apt-get install -y iperf3)".into());
    }
    (rows, notes)
}
