//! Looking at a host's devices from outside the processes that run them: what `uroce stat`,
//! `uroce qp` and `uroce capture` read.
//!
//! Everything goes through the host directory (`/dev/shm/uroce-UID-NETNS`), so a user sees exactly the
//! endpoints they could open themselves (root sees every user's).
//!
//! - **Snapshots.** A tool bumps a slot's `snapshot_asked` word and pokes the owner's wake-up
//!   FIFO; the owner, at its next round of progress (at once if it sleeps, within a
//!   millisecond if an application thread busy-polls), writes `snap-S-G` ([`Snapshot`]) and
//!   sets `snapshot_done`. A process that makes no progress (one with no progress thread that
//!   is not calling its device) does not answer, and is reported as such.
//! - **Captures.** A tool creates a ring per endpoint ([`ring`]) and stores its session number
//!   in one of the slot's four `capture` words; the endpoint's tap copies packets into the
//!   ring from its next batch on, until the word is cleared.

pub mod ring;
pub mod snapshot;

use core::net::IpAddr;
use core::time::Duration;
use std::fs;
use std::io::{self, Write as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

pub use ring::{Direction, Record, RingReader};
pub use snapshot::{QpSnapshot, Snapshot, SnapshotError};

use crate::host::{self, CAPTURES, FIRST_SLOT, HostDir, LAST_SLOT, SlotId};
use crate::sys::shm;

/// Why looking at an endpoint failed.
#[derive(Debug)]
pub enum InspectError {
    /// The endpoint did not answer within the time given (it is stopped, or makes progress
    /// only when its application calls it).
    NoAnswer {
        /// Its process.
        pid: u32,
    },
    /// Its snapshot could not be read.
    Snapshot(SnapshotError),
    /// As many capture sessions as an endpoint serves are running on it.
    CaptureBusy {
        /// Their tools.
        pids: Vec<u32>,
    },
    /// The system refused something.
    Io(io::Error),
}

impl core::fmt::Display for InspectError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::NoAnswer { pid } => write!(
                f,
                "process {pid} did not answer (stopped, or its device makes progress only \
                 when the application calls it)"
            ),
            Self::Snapshot(e) => write!(f, "{e}"),
            Self::CaptureBusy { pids } => write!(
                f,
                "{} captures (pids {pids:?}) are running on this endpoint already, as many as it \
                 serves",
                pids.len()
            ),
            Self::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for InspectError {}

impl From<io::Error> for InspectError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// One process's endpoint of a device, as found in a host directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointRef {
    dir: usize,
    /// The user whose directory holds it.
    pub uid: u32,
    /// Its slot (the top byte of its QPNs).
    pub slot: u8,
    /// The slot's generation.
    pub generation: u32,
    /// The owning process.
    pub pid: u32,
    /// The device's address.
    pub addr: IpAddr,
}

impl EndpointRef {
    fn id(&self) -> SlotId {
        SlotId { index: self.slot, generation: self.generation }
    }
}

/// The host directories of this network namespace that this user may look into.
#[derive(Debug)]
pub struct Host {
    dirs: Vec<(u32, HostDir)>,
    others: Vec<(u32, PathBuf)>,
}

impl Host {
    /// Opens this user's host directory (as root, every user's) in the current network
    /// namespace; directories of other users are listed in [`Host::others`].
    pub fn open() -> io::Result<Self> {
        let netns = host::netns();
        let me = shm::effective_uid();
        let mut host = Self { dirs: Vec::new(), others: Vec::new() };
        let mut entries: Vec<(u32, PathBuf)> = fs::read_dir(host::base())?
            .flatten()
            .filter_map(|e| {
                let (uid, ns) = host::parse_dir_name(e.file_name().to_str()?)?;
                (ns == netns).then_some((uid, e.path()))
            })
            .collect();
        entries.sort();
        for (uid, path) in entries {
            if uid != me && me != 0 {
                host.others.push((uid, path));
                continue;
            }
            match HostDir::open_existing(&path, uid) {
                Ok(d) => host.dirs.push((uid, d)),
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                    host.others.push((uid, path));
                }
                // A directory being set up, or left half-made: nothing to see in it.
                Err(_) => {}
            }
        }
        Ok(host)
    }

    /// Host directories of other users, which this user cannot look into: their uid and path.
    pub fn others(&self) -> &[(u32, PathBuf)] {
        &self.others
    }

    /// Every live endpoint whose process still runs.
    pub fn endpoints(&self) -> Vec<EndpointRef> {
        let mut v = Vec::new();
        for (i, (uid, dir)) in self.dirs.iter().enumerate() {
            for slot in FIRST_SLOT..=LAST_SLOT {
                let Some((generation, addr)) = dir.live(slot) else { continue };
                if !dir.alive(slot) {
                    continue;
                }
                let pid = dir.pid(slot);
                v.push(EndpointRef { dir: i, uid: *uid, slot, generation, pid, addr });
            }
        }
        v
    }

    fn dir(&self, ep: &EndpointRef) -> io::Result<&HostDir> {
        self.dirs.get(ep.dir).map(|(_, d)| d).ok_or_else(|| io::Error::other("no such endpoint"))
    }

    /// Wakes the owner of `ep` (if it sleeps on its FIFO) so that it looks at its slot.
    fn poke(&self, ep: &EndpointRef) {
        let Ok(dir) = self.dir(ep) else { return };
        if let Ok(fd) = shm::open_fifo(&dir.wake_path(ep.id()), false) {
            use std::os::fd::AsRawFd;
            shm::poke(fd.as_raw_fd());
        }
    }

    /// Snapshots of `eps`, asked of all at once, each waited for up to `timeout`.
    pub fn snapshots(
        &self,
        eps: &[EndpointRef],
        timeout: Duration,
    ) -> Vec<Result<Snapshot, InspectError>> {
        let asked: Vec<Option<u32>> = eps
            .iter()
            .map(|ep| {
                let dir = self.dir(ep).ok()?;
                let n = dir.snapshot_asked(ep.slot).fetch_add(1, Ordering::AcqRel);
                self.poke(ep);
                Some(n.wrapping_add(1))
            })
            .collect();
        let mut out: Vec<Option<Result<Snapshot, InspectError>>> =
            eps.iter().map(|_| None).collect();
        #[expect(clippy::disallowed_methods, reason = "a tool waiting for other processes")]
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let mut waiting = false;
            for (k, ep) in eps.iter().enumerate() {
                let (None, Some(want), Ok(dir)) = (&out[k], asked[k], self.dir(ep)) else {
                    continue;
                };
                let done = dir.snapshot_done(ep.slot).load(Ordering::Acquire);
                // Answered this request, or a later one (another tool's): sequence numbers
                // compared as TCP compares them.
                if done.wrapping_sub(want) < 0x8000_0000 {
                    out[k] = Some(read_snapshot(&dir.snapshot_path(ep.id())));
                } else if dir.alive(ep.slot) {
                    waiting = true;
                } else {
                    out[k] = Some(Err(InspectError::NoAnswer { pid: ep.pid }));
                }
            }
            #[expect(clippy::disallowed_methods, reason = "a tool waiting for other processes")]
            let late = std::time::Instant::now() >= deadline;
            if !waiting || late {
                break;
            }
            #[expect(clippy::disallowed_methods, reason = "a tool waiting for other processes")]
            std::thread::sleep(Duration::from_micros(200));
        }
        eps.iter()
            .zip(out)
            .map(|(ep, r)| r.unwrap_or(Err(InspectError::NoAnswer { pid: ep.pid })))
            .collect()
    }

    /// Starts capturing `ep` in session `session` (non-zero): takes one of the endpoint's
    /// capture words (a free one, or one whose tool is gone), creates its ring and names the
    /// session in it. The endpoint copies packets from its next batch on. `devices`: the
    /// devices the session captures; packets from them are copied by their senders, so the
    /// endpoint does not copy them again when it receives them.
    pub fn start_capture(
        &self,
        ep: &EndpointRef,
        session: u32,
        devices: &[IpAddr],
    ) -> Result<Capture, InspectError> {
        let dir = self.dir(ep)?;
        let mut holders = Vec::new();
        for k in 0..CAPTURES {
            let word = dir.capture(ep.slot, k);
            let current = word.load(Ordering::Acquire);
            if current != 0 {
                // A session whose tool is gone (killed) is taken over; a live one is not.
                let held = dir.capture_path(ep.id(), k, current);
                if let Some(pid) = ring::capturer_of(&held).filter(|&p| shm::process_exists(p)) {
                    holders.push(pid);
                    continue;
                }
            }
            // The ring first, then the word that names it: the endpoint opens the ring as
            // soon as it sees the word.
            let path = dir.capture_path(ep.id(), k, session);
            let reader = RingReader::create(&path, session, ep.uid, devices)?;
            if word.compare_exchange(current, session, Ordering::AcqRel, Ordering::Acquire).is_ok()
            {
                if current != 0 {
                    let _ = fs::remove_file(dir.capture_path(ep.id(), k, current));
                }
                self.poke(ep);
                return Ok(Capture { ring: reader, word: k, session });
            }
            // Another tool took this word meanwhile.
            let _ = fs::remove_file(&path);
        }
        Err(InspectError::CaptureBusy { pids: holders })
    }

    /// Ends capture `c` of `ep` (if the endpoint still has it) and removes its ring.
    pub fn stop_capture(&self, ep: &EndpointRef, c: &Capture) {
        let Ok(dir) = self.dir(ep) else { return };
        let word = dir.capture(ep.slot, c.word);
        let _ = word.compare_exchange(c.session, 0, Ordering::AcqRel, Ordering::Acquire);
        let _ = fs::remove_file(dir.capture_path(ep.id(), c.word, c.session));
    }
}

/// One endpoint's side of a capture session: the ring to read.
#[derive(Debug)]
pub struct Capture {
    /// The packets.
    pub ring: RingReader,
    word: usize,
    session: u32,
}

fn read_snapshot(path: &std::path::Path) -> Result<Snapshot, InspectError> {
    use std::io::Read as _;
    let file = fs::File::open(path)?;
    let mut text = String::new();
    // Bounded: another process wrote it.
    file.take(64 << 20).read_to_string(&mut text).map_err(InspectError::Io)?;
    Snapshot::parse(&text).map_err(InspectError::Snapshot)
}

/// The owner's side: answers the snapshot requests of its slot.
#[derive(Debug)]
pub(crate) struct Answering {
    dir: Arc<HostDir>,
    slot: SlotId,
    answered: u32,
}

impl Answering {
    pub(crate) fn new(dir: Arc<HostDir>, slot: SlotId) -> Self {
        Self { dir, slot, answered: 0 }
    }

    /// The request to answer, if a tool has asked since the last answer (one load).
    pub(crate) fn asked(&self) -> Option<u32> {
        let asked = self.dir.snapshot_asked(self.slot.index).load(Ordering::Relaxed);
        (asked != self.answered).then_some(asked)
    }

    /// Publishes `snap` as the answer to request `asked`: written whole to a temporary file,
    /// then renamed over the last one, so a reader never sees half of it.
    pub(crate) fn answer(&mut self, asked: u32, snap: &Snapshot) {
        let path = self.dir.snapshot_path(self.slot);
        // `snap-S-G-tmp`: a successor in the slot removes it if this process dies mid-write.
        let mut tmp = path.clone().into_os_string();
        tmp.push("-tmp");
        let tmp = PathBuf::from(tmp);
        let written = host::open_shared(&tmp, 0)
            .and_then(|mut f| {
                f.set_len(0)?;
                f.write_all(snap.encode().as_bytes())
            })
            .and_then(|()| fs::rename(&tmp, &path));
        self.answered = asked;
        if written.is_ok() {
            self.dir.snapshot_done(self.slot.index).store(asked, Ordering::Release);
        }
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        let _ = fs::remove_file(self.dir.snapshot_path(self.slot));
    }
}
