//! `uroce capture`: tcpdump for uroce. Taps every packet of the chosen devices, across all
//! their processes and on every path (shared memory and UDP), from the moment it starts;
//! writes a pcap file or prints `uroce decode`'s lines with every ICRC verified.

use core::net::IpAddr;
use core::time::Duration;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use uroce_net::inspect::{Capture, Direction, EndpointRef, Host, Record};
use uroce_wire::pcap::PcapWriter;

use crate::host_view::{self, REFUSED};

/// Options of `uroce capture`.
pub(crate) struct CaptureArgs {
    pub(crate) devices: Vec<IpAddr>,
    pub(crate) write: Option<PathBuf>,
    pub(crate) count: Option<u64>,
    pub(crate) qp: Option<u32>,
    /// Stop after this long (for scripts; Ctrl-C otherwise).
    pub(crate) duration: Option<Duration>,
}

/// How often the capture looks for processes that opened a captured device since.
const RESCAN: Duration = Duration::from_millis(20);

/// One captured endpoint.
struct Tapped {
    ep: EndpointRef,
    cap: Capture,
    /// The QPs of this endpoint's peers that `--qp` follows: (address, QPN).
    peers: Vec<(IpAddr, u32)>,
}

/// Runs `uroce capture`; returns the exit status.
pub(crate) fn run(args: &CaptureArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let stop = Arc::new(AtomicBool::new(false));
    if let Err(e) = stop_on_signals(&stop) {
        let _ = writeln!(err, "uroce capture: cannot handle signals: {e}");
        return REFUSED;
    }
    let (host, eps) = match host_view::select("capture", &args.devices, err) {
        Ok(x) => x,
        Err(status) => return status,
    };
    let mut pcap = match &args.write {
        Some(path) => match File::create(path).and_then(|f| PcapWriter::new(BufWriter::new(f))) {
            Ok(w) => Some(w),
            Err(e) => {
                let _ = writeln!(err, "uroce capture: {}: {e}", path.display());
                return REFUSED;
            }
        },
        None => None,
    };
    // A session number of this run: non-zero, and not the last run's.
    let session = session_number();
    let mut tapped: BTreeMap<Key, Tapped> = BTreeMap::new();
    let status = if attach(&host, args, session, &mut tapped, eps, err) { 0 } else { REFUSED };
    if tapped.is_empty() {
        return status;
    }
    // The devices captured (for the duplicate rule below): those asked for, or all.
    let mut devices = host_view::devices_of(tapped.values().map(|t| &t.ep));
    let _ = writeln!(
        err,
        "uroce capture: capturing {} on {} process(es){}",
        devices.iter().map(|a| host_view::device_label(*a)).collect::<Vec<_>>().join(", "),
        tapped.len(),
        if pcap.is_some() { "" } else { "; Ctrl-C to stop" }
    );
    #[expect(clippy::disallowed_methods, reason = "a tool's own timing")]
    let start = std::time::Instant::now();
    let mut last_scan = start;
    let mut captured = 0u64;
    let mut batch: Vec<Record> = Vec::new();
    let mut first_ts: Option<u64> = None;
    // How long after the capture began its first packet came (for the summary).
    let mut first_after: Option<Duration> = None;
    'outer: loop {
        batch.clear();
        for t in tapped.values_mut() {
            let peers = &t.peers;
            t.cap.ring.drain(&mut |r| {
                // Received from a captured device: its sender's copy is in the capture already.
                if r.direction == Direction::Received && devices.contains(&r.src.ip()) {
                    return;
                }
                if let Some(qp) = args.qp
                    && !matches_qp(&r, qp, peers)
                {
                    return;
                }
                batch.push(r);
            });
        }
        batch.sort_by_key(|r| r.ts_ns);
        let idle = batch.is_empty();
        if !idle && first_after.is_none() {
            first_after = Some(start.elapsed());
        }
        for r in batch.drain(..) {
            captured += 1;
            let ts = Duration::from_nanos(r.ts_ns);
            match pcap.as_mut() {
                Some(w) => {
                    let _ = w.write_roce(ts, r.src, r.dst, &r.bytes);
                }
                None => {
                    let t0 = *first_ts.get_or_insert(r.ts_ns);
                    let rel = Duration::from_nanos(r.ts_ns.saturating_sub(t0)).as_secs_f64();
                    let text = crate::decode::describe_packet(r.src, r.dst, &r.bytes);
                    let _ = writeln!(out, "#{captured} {rel:.6} {text}");
                }
            }
            if args.count.is_some_and(|c| captured >= c) {
                break 'outer;
            }
        }
        if let Some(w) = pcap.as_mut() {
            let _ = w.flush();
        } else {
            let _ = out.flush();
        }
        if stop.load(Ordering::Acquire) || args.duration.is_some_and(|d| start.elapsed() >= d) {
            break;
        }
        if last_scan.elapsed() >= RESCAN {
            #[expect(clippy::disallowed_methods, reason = "a tool's own timing")]
            let now = std::time::Instant::now();
            last_scan = now;
            let live = host_view::endpoints_of(&host, &args.devices);
            // Processes that left: their rings go.
            tapped.retain(|k, t| {
                let keep = live.iter().any(|e| key(e) == *k);
                if !keep {
                    host.stop_capture(&t.ep, &t.cap);
                }
                keep
            });
            let _ = attach(&host, args, session, &mut tapped, live, err);
            devices = host_view::devices_of(tapped.values().map(|t| &t.ep));
        }
        if idle {
            #[expect(
                clippy::disallowed_methods,
                reason = "polling the rings while they are empty"
            )]
            std::thread::sleep(Duration::from_micros(500));
        }
    }
    let dropped: u64 = tapped.values().map(|t| t.cap.ring.dropped()).sum();
    let malformed: u64 = tapped.values().map(|t| t.cap.ring.malformed).sum();
    for t in tapped.values() {
        host.stop_capture(&t.ep, &t.cap);
    }
    if let Some(w) = pcap.take() {
        let _ = w.into_inner();
    }
    let garbage = if malformed > 0 {
        format!(", {malformed} ring(s) with garbage skipped")
    } else {
        String::new()
    };
    let first = first_after.map_or_else(String::new, |d| {
        format!("; the first came {:.1} ms after the start", d.as_secs_f64() * 1e3)
    });
    let _ = writeln!(
        err,
        "uroce capture: {captured} packet(s) captured, {dropped} dropped (a process found its \
         capture ring full){garbage}{first}"
    );
    status
}

/// An endpoint's identity across rescans: its user, slot and the slot's generation.
type Key = (u32, u8, u32);

fn key(ep: &EndpointRef) -> Key {
    (ep.uid, ep.slot, ep.generation)
}

/// Starts capturing every endpoint of `eps` not yet in `tapped`; says on `err` which could
/// not be. Returns whether every one could.
fn attach(
    host: &Host,
    args: &CaptureArgs,
    session: u32,
    tapped: &mut BTreeMap<Key, Tapped>,
    eps: Vec<EndpointRef>,
    err: &mut dyn Write,
) -> bool {
    let mut all = true;
    // The devices this session captures, as far as known now.
    let devices = host_view::devices_of(tapped.values().map(|t| &t.ep).chain(&eps));
    for ep in eps {
        if tapped.contains_key(&key(&ep)) {
            continue;
        }
        match host.start_capture(&ep, session, &devices) {
            Ok(cap) => {
                let peers = args.qp.map_or_else(Vec::new, |n| peers_of(host, &ep, n));
                tapped.insert(key(&ep), Tapped { ep, cap, peers });
            }
            Err(e) => {
                let _ = writeln!(err, "uroce capture: process {} on {}: {e}", ep.pid, ep.addr);
                all = false;
            }
        }
    }
    all
}

/// The QPs packets of QP `qpn` go to, from its owner's snapshot (RC and UC: the peer).
fn peers_of(host: &Host, ep: &EndpointRef, qpn: u32) -> Vec<(IpAddr, u32)> {
    let Some(Ok(snap)) = host.snapshots(&[*ep], crate::stat::ANSWER_TIMEOUT).pop() else {
        return Vec::new();
    };
    snap.qps.iter().filter(|q| q.qpn == qpn).filter_map(|q| Some((q.dest?, q.dest_qpn))).collect()
}

/// Whether a packet belongs to QP `qpn`: sent to it, sent by it to its peer, or (UD) sent by
/// it as the DETH's source QP says.
fn matches_qp(r: &Record, qpn: u32, peers: &[(IpAddr, u32)]) -> bool {
    let Some(b) = r.bytes.get(..12) else { return false };
    let dest = u32::from_be_bytes([0, b[5], b[6], b[7]]);
    if dest == qpn || peers.contains(&(r.dst.ip(), dest)) {
        return true;
    }
    // UD opcodes (IBA 9.2: transport 0b011) carry a DETH after the BTH: Q_Key, then the
    // source QP in its last three bytes.
    b[0] >> 5 == 0b011
        && r.bytes.get(17..20).is_some_and(|s| u32::from_be_bytes([0, s[0], s[1], s[2]]) == qpn)
}

fn session_number() -> u32 {
    #[expect(clippy::disallowed_methods, reason = "only to tell sessions apart")]
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (std::process::id().rotate_left(16) ^ t) | 1
}

/// Ends the capture cleanly on SIGINT, SIGTERM and SIGHUP: they are blocked and taken by a
/// thread that sets `stop` (the rings are then released, so no process keeps copying).
fn stop_on_signals(stop: &Arc<AtomicBool>) -> nix::Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    set.thread_block()?;
    let stop = Arc::clone(stop);
    std::thread::Builder::new()
        .name("uroce-capture-signals".into())
        .spawn(move || {
            if set.wait().is_ok() {
                stop.store(true, Ordering::Release);
            }
        })
        .map_err(|_| nix::Error::EAGAIN)?;
    Ok(())
}
