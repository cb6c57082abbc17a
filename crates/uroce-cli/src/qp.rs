//! `uroce qp`: every QP of the host's devices, as `ss -ti` lists sockets; `--watch` prints
//! what changes as it happens.

use core::net::IpAddr;
use core::time::Duration;
use std::collections::BTreeMap;
use std::io::Write;

use serde::Serialize;
use uroce_net::inspect::{EndpointRef, Host, QpSnapshot};

use crate::host_view;
use crate::stat::ANSWER_TIMEOUT;

/// One QP with its owner.
#[derive(Debug, Clone, Serialize)]
struct QpRow {
    device: IpAddr,
    device_name: Option<String>,
    pid: u32,
    process: String,
    qpn: u32,
    #[serde(rename = "type")]
    qp_type: String,
    state: String,
    path: String,
    mtu: u32,
    remote: Option<IpAddr>,
    remote_qpn: Option<u32>,
    send_psn: u32,
    unacked_psn: u32,
    expected_psn: u32,
    send_outstanding: u64,
    recv_posted: u64,
    window: u32,
    error_status: Option<String>,
    counters: BTreeMap<String, u64>,
}

fn row(ep: &EndpointRef, process: &str, q: QpSnapshot) -> QpRow {
    let connected = q.qp_type != "UD" && q.dest.is_some();
    QpRow {
        device: ep.addr,
        device_name: host_view::device_name(ep.addr),
        pid: ep.pid,
        process: process.to_owned(),
        qpn: q.qpn,
        qp_type: q.qp_type,
        state: q.state,
        path: q.path,
        mtu: q.mtu,
        remote: q.dest.filter(|_| connected),
        remote_qpn: connected.then_some(q.dest_qpn),
        send_psn: q.send_psn,
        unacked_psn: q.unacked_psn,
        expected_psn: q.expected_psn,
        send_outstanding: q.send_outstanding,
        recv_posted: q.recv_posted,
        window: q.window,
        error_status: q.error_status,
        counters: q.counters.into_iter().collect(),
    }
}

/// Every QP of `eps`, and the processes that did not answer.
fn gather(host: &Host, eps: &[EndpointRef]) -> (Vec<QpRow>, Vec<(u32, String)>) {
    let mut rows = Vec::new();
    let mut silent = Vec::new();
    for (ep, snap) in eps.iter().zip(host.snapshots(eps, ANSWER_TIMEOUT)) {
        let name = host_view::process_name(ep.pid);
        match snap {
            Ok(s) => rows.extend(s.qps.into_iter().map(|q| row(ep, &name, q))),
            Err(e) => silent.push((ep.pid, format!("{name}: {e}"))),
        }
    }
    (rows, silent)
}

/// Options of `uroce qp`.
pub(crate) struct QpArgs {
    pub(crate) devices: Vec<IpAddr>,
    pub(crate) json: bool,
    pub(crate) watch: bool,
    /// `--watch`: how often to look.
    pub(crate) interval: Duration,
    /// `--watch`: stop after this long.
    pub(crate) duration: Option<Duration>,
}

/// Runs `uroce qp`; returns the exit status.
pub(crate) fn run(args: &QpArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let (host, eps) = match host_view::select("qp", &args.devices, err) {
        Ok(x) => x,
        Err(status) => return status,
    };
    let (rows, silent) = gather(&host, &eps);
    for (pid, why) in &silent {
        let _ = writeln!(err, "uroce qp: process {pid} not shown: {why}");
    }
    if !args.watch {
        if args.json {
            let _ = writeln!(out, "{}", serde_json::json!({ "version": 1, "qps": rows }));
        } else {
            table(&rows, out);
        }
        return 0;
    }
    watch(&host, args, rows, out)
}

fn key(r: &QpRow) -> (IpAddr, u32) {
    (r.device, r.qpn)
}

/// Prints the QPs' changes until the duration passes: QPs that appear and go, state changes
/// (with the completion status that moved a QP to Error), new retransmissions, timeouts and
/// RNR NAKs.
fn watch(host: &Host, args: &QpArgs, first: Vec<QpRow>, out: &mut dyn Write) -> u8 {
    #[expect(clippy::disallowed_methods, reason = "a tool's own timing")]
    let start = std::time::Instant::now();
    let mut known: BTreeMap<(IpAddr, u32), QpRow> =
        first.into_iter().map(|r| (key(&r), r)).collect();
    for r in known.values() {
        event(out, args.json, "qp", r, None);
    }
    let _ = out.flush();
    while args.duration.is_none_or(|d| start.elapsed() < d) {
        #[expect(clippy::disallowed_methods, reason = "the interval the user asked for")]
        std::thread::sleep(args.interval);
        let eps = host_view::endpoints_of(host, &args.devices);
        let (rows, _) = gather(host, &eps);
        let mut now: BTreeMap<(IpAddr, u32), QpRow> =
            rows.into_iter().map(|r| (key(&r), r)).collect();
        for (k, r) in &now {
            match known.get(k) {
                None => event(out, args.json, "new", r, None),
                Some(old) => {
                    if old.state != r.state {
                        let detail = format!("{} -> {}", old.state, r.state);
                        event(out, args.json, "state", r, Some(detail));
                    }
                    for c in
                        ["retransmitted_pkts", "ack_timeouts", "rnr_naks_rcvd", "seq_naks_rcvd"]
                    {
                        let (a, b) = (old.counters.get(c), r.counters.get(c));
                        if let (Some(&a), Some(&b)) = (a, b)
                            && b > a
                        {
                            event(out, args.json, c, r, Some(format!("+{}", b - a)));
                        }
                    }
                }
            }
        }
        for (k, r) in &known {
            if !now.contains_key(k) {
                event(out, args.json, "gone", r, None);
            }
        }
        let _ = out.flush();
        core::mem::swap(&mut known, &mut now);
    }
    0
}

fn event(out: &mut dyn Write, json: bool, what: &str, r: &QpRow, detail: Option<String>) {
    if json {
        let _ =
            writeln!(out, "{}", serde_json::json!({ "event": what, "detail": detail, "qp": r }));
        return;
    }
    let why = match (&r.error_status, r.state.as_str()) {
        (Some(s), "ERR") => format!(" ({s})"),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "{what:<8} {} pid {} {} qp {:#x} {} {}{}{}",
        r.device,
        r.pid,
        r.process,
        r.qpn,
        r.qp_type,
        detail.unwrap_or_else(|| r.state.clone()),
        why,
        peer(r).map_or_else(String::new, |p| format!(" peer {p}")),
    );
}

fn peer(r: &QpRow) -> Option<String> {
    Some(format!("{}/{:#x}", r.remote?, r.remote_qpn?))
}

/// The table: one line per QP, and a second with its positions and counters.
fn table(rows: &[QpRow], out: &mut dyn Write) {
    let _ = writeln!(
        out,
        "{:<16} {:<18} {:>9} {:<4} {:<6} {:<4} {:>5}  PEER",
        "DEVICE", "PROCESS", "QPN", "TYPE", "STATE", "PATH", "MTU"
    );
    for r in rows {
        let dev = r.device_name.clone().unwrap_or_else(|| r.device.to_string());
        let proc_ = format!("{}/{}", r.pid, r.process);
        let _ = writeln!(
            out,
            "{:<16} {:<18} {:>#9x} {:<4} {:<6} {:<4} {:>5}  {}",
            dev,
            proc_,
            r.qpn,
            r.qp_type,
            r.state,
            r.path,
            r.mtu,
            peer(r).unwrap_or_else(|| "-".to_owned())
        );
        let c = |n: &str| r.counters.get(n).copied().unwrap_or(0);
        let mut detail = format!(
            "    psn send {} unacked {} expected {}, wr send {} recv {}, window {}, pkts {}/{} \
             bytes {}/{} (out/in), retrans {}, timeouts {}, rnr_nak {}/{} (in/out)",
            r.send_psn,
            r.unacked_psn,
            r.expected_psn,
            r.send_outstanding,
            r.recv_posted,
            if r.window == 0 { "-".to_owned() } else { r.window.to_string() },
            c("sent_pkts"),
            c("rcvd_pkts"),
            c("sent_bytes"),
            c("rcvd_bytes"),
            c("retransmitted_pkts"),
            c("ack_timeouts"),
            c("rnr_naks_rcvd"),
            c("rnr_naks_sent"),
        );
        if let Some(s) = &r.error_status {
            detail.push_str(&format!(", error {s}"));
        }
        let _ = writeln!(out, "{detail}");
    }
}
