//! `uroce stat`: a device's counters, summed over every process that has it open, under the
//! names Linux rxe gives them (`rdma statistic show`), then uroce's own.

use core::net::IpAddr;
use core::time::Duration;
use std::collections::BTreeMap;
use std::io::Write;

use serde::Serialize;
use uroce_net::inspect::{EndpointRef, Host, Snapshot};

use crate::host_view;

/// How long a process may take to answer.
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_millis(1500);

/// The rxe counters (`rxe_hw_counters.c`) uroce has, and how each is made of uroce's own.
/// rxe's `ack_deferred` (completer reschedules), `link_downed`, `rdma_sends` and `rdma_recvs`
/// have no counterpart: uroce's completer never defers, its port has no link to lose.
pub(crate) fn rxe_counters(c: &BTreeMap<String, u64>) -> Vec<(&'static str, u64)> {
    let g = |n: &str| c.get(n).copied().unwrap_or(0);
    vec![
        ("sent_pkts", g("sent_pkts")),
        ("rcvd_pkts", g("rcvd_pkts")),
        ("duplicate_request", g("dup_req")),
        ("out_of_seq_request", g("rcv_seq_err")),
        ("rcvd_rnr_err", g("rnr_naks_rcvd")),
        ("send_rnr_err", g("rnr_naks_sent")),
        ("rcvd_seq_err", g("seq_naks_rcvd")),
        ("retry_exceeded_err", g("retry_exceeded")),
        ("retry_rnr_exceeded_err", g("rnr_retry_exceeded")),
        // rxe counts each time its completer starts over: a timeout, a sequence NAK, an
        // implied NAK.
        ("completer_retry_err", g("ack_timeouts") + g("seq_naks_rcvd") + g("implied_naks")),
        // Packets that could not be handed to a path.
        (
            "send_err",
            g("tx_errors")
                + g("shm_tx_ring_full")
                + g("shm_tx_no_endpoint")
                + g("shm_tx_payload_gone"),
        ),
    ]
}

/// One device's sums.
#[derive(Debug, Serialize)]
struct DeviceStat {
    addr: IpAddr,
    name: Option<String>,
    port: u8,
    processes: Vec<Process>,
    /// Processes that did not answer.
    silent: Vec<Process>,
    counters: BTreeMap<String, u64>,
    uroce: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Serialize)]
struct Process {
    pid: u32,
    name: String,
}

/// The counters of `eps`, per device.
fn gather(host: &Host, eps: &[EndpointRef]) -> Vec<DeviceStat> {
    let snaps = host.snapshots(eps, ANSWER_TIMEOUT);
    // Per device: who answered, who did not, and the sums.
    type Sums = (Vec<Process>, Vec<Process>, BTreeMap<String, u64>);
    let mut by_dev: BTreeMap<IpAddr, Sums> = BTreeMap::new();
    for (ep, snap) in eps.iter().zip(snaps) {
        let entry = by_dev.entry(ep.addr).or_default();
        let p = Process { pid: ep.pid, name: host_view::process_name(ep.pid) };
        match snap {
            Ok(s) => {
                add(&mut entry.2, &s);
                entry.0.push(p);
            }
            Err(_) => entry.1.push(p),
        }
    }
    by_dev
        .into_iter()
        .map(|(addr, (processes, silent, uroce))| DeviceStat {
            addr,
            name: host_view::device_name(addr),
            port: 1,
            processes,
            silent,
            counters: rxe_counters(&uroce).into_iter().map(|(n, v)| (n.to_owned(), v)).collect(),
            uroce,
        })
        .collect()
}

fn add(sum: &mut BTreeMap<String, u64>, s: &Snapshot) {
    for (n, v) in &s.counters {
        *sum.entry(n.clone()).or_default() += v;
    }
}

/// Options of `uroce stat`.
pub(crate) struct StatArgs {
    pub(crate) devices: Vec<IpAddr>,
    pub(crate) interval: Option<Duration>,
    pub(crate) count: Option<u64>,
    pub(crate) json: bool,
}

/// Runs `uroce stat`; returns the exit status.
pub(crate) fn run(args: &StatArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let (host, eps) = match host_view::select("stat", &args.devices, err) {
        Ok(x) => x,
        Err(status) => return status,
    };
    let Some(interval) = args.interval else {
        let stats = gather(&host, &eps);
        print(&stats, None, args.json, out);
        return 0;
    };
    let mut before = gather(&host, &eps);
    let mut round = 0u64;
    while args.count.is_none_or(|c| round < c) {
        #[expect(clippy::disallowed_methods, reason = "the interval the user asked for")]
        std::thread::sleep(interval);
        // Processes that joined meanwhile count from now on.
        let eps = host_view::endpoints_of(&host, &args.devices);
        let now = gather(&host, &eps);
        print(&now, Some((&before, interval)), args.json, out);
        before = now;
        round += 1;
    }
    0
}

fn print(
    stats: &[DeviceStat],
    delta: Option<(&[DeviceStat], Duration)>,
    json: bool,
    out: &mut dyn Write,
) {
    // With an interval: what each counter did in it, per second.
    let rate = |d: &DeviceStat, name: &str, v: u64, own: bool| -> Option<f64> {
        let (prev, secs) = delta?;
        let p = prev.iter().find(|p| p.addr == d.addr)?;
        let pv = if own { p.uroce.get(name) } else { p.counters.get(name) };
        Some(v.saturating_sub(pv.copied().unwrap_or(0)) as f64 / secs.as_secs_f64())
    };
    if json {
        let v: Vec<serde_json::Value> = stats
            .iter()
            .map(|d| {
                let mut j = serde_json::to_value(d).unwrap_or_default();
                if delta.is_some() {
                    let per_sec = |own: bool, m: &BTreeMap<String, u64>| -> serde_json::Value {
                        m.iter()
                            .map(|(n, &v)| (n.clone(), rate(d, n, v, own).unwrap_or(0.0).into()))
                            .collect::<serde_json::Map<_, _>>()
                            .into()
                    };
                    j["counters_per_sec"] = per_sec(false, &d.counters);
                    j["uroce_per_sec"] = per_sec(true, &d.uroce);
                }
                j
            })
            .collect();
        let _ = writeln!(out, "{}", serde_json::json!({ "version": 1, "devices": v }));
        return;
    }
    for d in stats {
        let procs: Vec<String> =
            d.processes.iter().map(|p| format!("{} {}", p.pid, p.name)).collect();
        let _ = writeln!(
            out,
            "device {} port {}: {} process(es): {}",
            host_view::device_label(d.addr),
            d.port,
            d.processes.len(),
            procs.join(", ")
        );
        for p in &d.silent {
            let _ = writeln!(out, "  (process {} {} did not answer: not counted)", p.pid, p.name);
        }
        let row = |out: &mut dyn Write, name: &str, v: u64, own: bool| match rate(d, name, v, own) {
            Some(r) => {
                let _ = writeln!(out, "  {name:<28} {r:>14.1}/s");
            }
            None => {
                let _ = writeln!(out, "  {name:<28} {v:>14}");
            }
        };
        // In rxe's order, as `rdma statistic` prints them.
        for (n, _) in rxe_counters(&BTreeMap::new()) {
            row(out, n, d.counters.get(n).copied().unwrap_or(0), false);
        }
        let _ = writeln!(out, "  uroce:");
        for (n, &v) in &d.uroce {
            // Counters that never moved are noise in a rate view.
            if delta.is_some() && rate(d, n, v, true).is_some_and(|r| r == 0.0) {
                continue;
            }
            row(out, n, v, true);
        }
    }
}
