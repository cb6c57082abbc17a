//! `uroce compare --with-peers`: the same loopback measurements by sockperf, qperf and iperf3
//! (whichever are installed), set beside uroce's in the report. Each tool runs with its server
//! on 127.0.0.1 and is stopped afterwards; a tool that is missing is skipped with a note.

use core::time::Duration;
use std::process::{Child, Command, Stdio};

use super::compare::Row;
use super::{Cpu, Latency, Outcome};

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
    label: &'static str,
    test: &'static str,
    size: usize,
    lat_us: Option<f64>,
    gbits: Option<f64>,
) -> Row {
    let seconds = 1.0;
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "bytes in a second"
    )]
    let bytes = gbits.map_or(size as u64, |g| (g * 1e9 / 8.0) as u64);
    let latency = lat_us.map(|l| Latency { min: l, p50: l, p99: l, p999: l, max: l, mean: l });
    Row {
        label: label.to_string(),
        peer: true,
        outcome: Outcome {
            test,
            size,
            iters: 1,
            seconds,
            bytes,
            latency,
            lost: 0,
            arrived: 1,
            client_cpu: Cpu::default(),
            client_seconds: seconds,
            server_cpu: Cpu::default(),
            server_seconds: seconds,
            system_cpu: None,
            applied: super::Applied::default(),
        },
    }
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
