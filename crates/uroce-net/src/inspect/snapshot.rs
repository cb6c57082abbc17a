//! A snapshot of one endpoint (one process's instance of a device): its counters and its QPs,
//! as the owner writes it for `uroce stat` and `uroce qp`.
//!
//! The file is text, one record per line, so a person can read it too:
//!
//! ```text
//! uroce-snapshot 1
//! pid 4242
//! addr 127.0.0.1
//! port_mtu 4096
//! counter sent_pkts 12
//! qp 65537 type=RC state=RTS path=shm dest=127.0.0.2 dest_qpn=131073 … sent_pkts=6 …
//! end
//! ```
//!
//! It comes from another process, so [`Snapshot::parse`] checks everything and never panics.

use core::fmt::Write as _;
use core::net::IpAddr;

/// The format's version, on its first line.
const VERSION: &str = "uroce-snapshot 1";

/// One endpoint's counters and QPs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The owning process.
    pub pid: u32,
    /// The device's address.
    pub addr: Option<IpAddr>,
    /// The port's MTU in bytes.
    pub port_mtu: u32,
    /// Every counter of the engine and the runtime, by name.
    pub counters: Vec<(String, u64)>,
    /// Every QP.
    pub qps: Vec<QpSnapshot>,
}

/// One QP, as `uroce qp` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QpSnapshot {
    /// The QP's number.
    pub qpn: u32,
    /// `RC`, `UC` or `UD`.
    pub qp_type: String,
    /// `RESET`, `INIT`, `RTR`, `RTS`, `SQD`, `SQE` or `ERR` (rdma-core's spellings).
    pub state: String,
    /// How its packets travel: `shm`, `udp`, or `-` (UD: per datagram).
    pub path: String,
    /// The path MTU in bytes.
    pub mtu: u32,
    /// The peer's address (RC, UC).
    pub dest: Option<IpAddr>,
    /// The peer's QPN (RC, UC).
    pub dest_qpn: u32,
    /// The next PSN the requester sends.
    pub send_psn: u32,
    /// The oldest PSN not acknowledged.
    pub unacked_psn: u32,
    /// The PSN the responder expects.
    pub expected_psn: u32,
    /// Send work requests outstanding.
    pub send_outstanding: u64,
    /// Receive work requests posted.
    pub recv_posted: u64,
    /// The loss-driven window in packets (0: none).
    pub window: u32,
    /// The completion status that moved it to Error (`ibv_wc_status_str` names, as
    /// `IBV_WC_RETRY_EXC_ERR`).
    pub error_status: Option<String>,
    /// Its counters, by name.
    pub counters: Vec<(String, u64)>,
}

/// Why a snapshot could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotError {
    /// The first line is not this format's.
    Version,
    /// Line `n` (from 1) is not what the format allows.
    Line(usize),
    /// The file ends before its `end` line.
    Incomplete,
}

impl core::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Version => write!(f, "not a snapshot of this version ({VERSION})"),
            Self::Line(n) => write!(f, "snapshot line {n} is malformed"),
            Self::Incomplete => write!(f, "the snapshot is incomplete"),
        }
    }
}

impl std::error::Error for SnapshotError {}

impl Snapshot {
    /// The snapshot as text.
    pub fn encode(&self) -> String {
        let mut s = String::with_capacity(256 + 400 * self.qps.len());
        let _ = writeln!(s, "{VERSION}");
        let _ = writeln!(s, "pid {}", self.pid);
        if let Some(a) = self.addr {
            let _ = writeln!(s, "addr {a}");
        }
        let _ = writeln!(s, "port_mtu {}", self.port_mtu);
        for (name, v) in &self.counters {
            let _ = writeln!(s, "counter {name} {v}");
        }
        for q in &self.qps {
            let _ = write!(
                s,
                "qp {} type={} state={} path={} mtu={} dest={} dest_qpn={} send_psn={} \
                 unacked_psn={} expected_psn={} send_outstanding={} recv_posted={} window={} \
                 error={}",
                q.qpn,
                q.qp_type,
                q.state,
                q.path,
                q.mtu,
                q.dest.map_or_else(|| "-".to_owned(), |a| a.to_string()),
                q.dest_qpn,
                q.send_psn,
                q.unacked_psn,
                q.expected_psn,
                q.send_outstanding,
                q.recv_posted,
                q.window,
                q.error_status.as_deref().unwrap_or("-"),
            );
            for (name, v) in &q.counters {
                let _ = write!(s, " {name}={v}");
            }
            s.push('\n');
        }
        s.push_str("end\n");
        s
    }

    /// Reads a snapshot another process wrote.
    pub fn parse(text: &str) -> Result<Self, SnapshotError> {
        let mut lines = text.lines().enumerate();
        if lines.next().map(|(_, l)| l) != Some(VERSION) {
            return Err(SnapshotError::Version);
        }
        let mut snap = Self::default();
        for (i, line) in lines {
            let bad = || SnapshotError::Line(i + 1);
            let mut words = line.split(' ');
            match words.next() {
                Some("end") => return Ok(snap),
                Some("pid") => snap.pid = number(words.next()).ok_or_else(bad)?,
                Some("addr") => {
                    snap.addr = Some(words.next().and_then(|a| a.parse().ok()).ok_or_else(bad)?);
                }
                Some("port_mtu") => snap.port_mtu = number(words.next()).ok_or_else(bad)?,
                Some("counter") => {
                    let name = words.next().filter(|n| valid_name(n)).ok_or_else(bad)?;
                    let v = number(words.next()).ok_or_else(bad)?;
                    snap.counters.push((name.to_owned(), v));
                }
                Some("qp") => {
                    let qpn = number(words.next()).ok_or_else(bad)?;
                    snap.qps.push(parse_qp(qpn, words).ok_or_else(bad)?);
                }
                // Lines of a later minor version: skipped.
                Some(_) | None => {}
            }
        }
        Err(SnapshotError::Incomplete)
    }

    /// Counter `name`, 0 if absent.
    pub fn counter(&self, name: &str) -> u64 {
        self.counters.iter().find(|(n, _)| n == name).map_or(0, |&(_, v)| v)
    }
}

impl QpSnapshot {
    /// Counter `name` of this QP, 0 if absent.
    pub fn counter(&self, name: &str) -> u64 {
        self.counters.iter().find(|(n, _)| n == name).map_or(0, |&(_, v)| v)
    }
}

fn number<T: core::str::FromStr>(w: Option<&str>) -> Option<T> {
    w?.parse().ok()
}

fn valid_name(n: &str) -> bool {
    !n.is_empty() && n.len() <= 64 && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn parse_qp<'a>(qpn: u32, words: impl Iterator<Item = &'a str>) -> Option<QpSnapshot> {
    let mut q = QpSnapshot { qpn, ..QpSnapshot::default() };
    let word = |v: &str| (valid_name(v) || v == "-").then(|| v.to_owned());
    for w in words {
        let (k, v) = w.split_once('=')?;
        match k {
            "type" => q.qp_type = word(v)?,
            "state" => q.state = word(v)?,
            "path" => q.path = word(v)?,
            "mtu" => q.mtu = v.parse().ok()?,
            "dest" => q.dest = if v == "-" { None } else { Some(v.parse().ok()?) },
            "dest_qpn" => q.dest_qpn = v.parse().ok()?,
            "send_psn" => q.send_psn = v.parse().ok()?,
            "unacked_psn" => q.unacked_psn = v.parse().ok()?,
            "expected_psn" => q.expected_psn = v.parse().ok()?,
            "send_outstanding" => q.send_outstanding = v.parse().ok()?,
            "recv_posted" => q.recv_posted = v.parse().ok()?,
            "window" => q.window = v.parse().ok()?,
            "error" => q.error_status = if v == "-" { None } else { Some(word(v)?) },
            name if valid_name(name) => q.counters.push((name.to_owned(), v.parse().ok()?)),
            _ => return None,
        }
    }
    Some(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Snapshot {
        Snapshot {
            pid: 42,
            addr: Some("::1".parse().expect("addr")),
            port_mtu: 4096,
            counters: vec![("sent_pkts".into(), 7), ("drop_rnr".into(), 0)],
            qps: vec![QpSnapshot {
                qpn: 0x1_0001,
                qp_type: "RC".into(),
                state: "ERR".into(),
                path: "shm".into(),
                mtu: 1024,
                dest: Some("127.0.0.2".parse().expect("addr")),
                dest_qpn: 0x2_0001,
                send_psn: 5,
                unacked_psn: 4,
                expected_psn: 9,
                send_outstanding: 1,
                recv_posted: 16,
                window: 0,
                error_status: Some("IBV_WC_RETRY_EXC_ERR".into()),
                counters: vec![("retransmitted_pkts".into(), 3)],
            }],
        }
    }

    #[test]
    fn a_snapshot_reads_back_as_written() {
        let s = sample();
        assert_eq!(Snapshot::parse(&s.encode()), Ok(s));
    }

    #[test]
    fn truncated_or_forged_snapshots_are_refused_not_panicked_on() {
        let text = sample().encode();
        // Every cut before the `end` line is whole (its final newline may go).
        for cut in 0..text.len() - 1 {
            if let Some(prefix) = text.get(..cut) {
                assert!(Snapshot::parse(prefix).is_err(), "cut at {cut}");
            }
        }
        assert_eq!(Snapshot::parse("nope\nend\n"), Err(SnapshotError::Version));
        let forged = format!("{VERSION}\nqp 1 type=RC bad-name=3\nend\n");
        assert_eq!(Snapshot::parse(&forged), Err(SnapshotError::Line(2)));
        let forged = format!("{VERSION}\ncounter x 99999999999999999999999\nend\n");
        assert_eq!(Snapshot::parse(&forged), Err(SnapshotError::Line(2)));
    }
}
