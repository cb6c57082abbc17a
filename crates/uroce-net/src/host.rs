//! The host directory: which processes serve which device on this host, and where their
//! shared-memory rings are.
//!
//! One directory per user and network namespace, `/dev/shm/uroce-<uid>-<netns inode>/`, mode
//! 0700: only its owner (and root) can enter it, so another user can neither read nor write
//! the segments, nor wake anyone. It holds:
//!
//! - `slots-2`: [`SLOTS`] endpoint slots of [`SLOT_SIZE`] bytes. An endpoint is one process's
//!   instance of one device (one `NetDevice`). Slot `s` owns the QPNs `s << 16 ..= s << 16 |
//!   0xFFFF` on its device, so QPNs are unique per device (and host) without any coordination
//!   after the claim, and the destination QPN of a packet names the process that owns it.
//!   Slot 0 is kept for the port's own QPs (QP1, the GSI); slot 255 holds the multicast QPN
//!   0xFFFFFF.
//! - `ring-S-G-T-H`: the ring on which slot S (generation G) sends to slot T (generation H).
//! - `wake-T-H`: the FIFO that wakes slot T (generation H) when it sleeps.
//! - `ports`: the RDMA CM ports bound and listened on ([`crate::ports`]).
//! - `snap-S-G`: slot S's latest snapshot (counters and QPs), written when `uroce stat` or
//!   `uroce qp` asks for one ([`crate::inspect`]).
//! - `cap-S-G-K-N`: the ring into which slot S copies its packets for capture session N, named
//!   in its capture word K (up to four `uroce capture` at once).
//! - `conns-S-G`: slot S's last will, the CM connections it holds established, for a survivor
//!   to release should its process die ([`crate::last_will`]).
//!
//! A slot's word is `generation << 32 | pid`: free when the pid is 0, being set up while the
//! generation is odd, live otherwise. Claiming takes a free slot, or the slot of a process that
//! no longer exists, with one compare-and-swap; releasing stores pid 0 under a new generation.
//! Every ring and FIFO name carries both generations, so nothing of a dead process's
//! incarnation is ever mistaken for its successor's.

use core::net::{IpAddr, Ipv6Addr};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::sys::shm::{self, Mapping};

/// Endpoint slots per host directory.
pub(crate) const SLOTS: usize = 256;
/// The first and last slot a process may claim (0 is the port's, 255 the multicast QPN's).
pub(crate) const FIRST_SLOT: u8 = 1;
pub(crate) const LAST_SLOT: u8 = 254;
/// Bytes per slot (three cache lines).
pub(crate) const SLOT_SIZE: usize = 192;
/// The slots file's name (its version: the layout below).
const SLOTS_FILE: &str = "slots-2";

// Slot layout. The first cache line is read by every sender on every packet (is the slot
// live, at which address?) and written only on claim and release; what changes while the
// slot lives (the sleep flag above all) is on the second, so a receiver going to sleep does
// not take that line away from its senders. The third is the tools' (`uroce stat`, `qp`,
// `capture`): the owner reads it on every round of progress, and only a tool writes it, so
// nobody looking costs the owner a load from its own cache.
const WORD: usize = 0; // u64: generation << 32 | pid
const START_TIME: usize = 8; // u64: the owner's start time (clock ticks after boot)
const ADDR: usize = 16; // 16 bytes: the device address, IPv4-mapped for IPv4
const INBOUND: usize = 64; // 4 × u64: bit s set when slot s has a ring to this slot
const WAITING: usize = 96; // u32: 1 while the owner sleeps and wants a FIFO wake-up (2: see BUSY_AT)
const RINGS_EPOCH: usize = 100; // u32: bumped whenever a ring to this slot is created
const WAITER_CPU: usize = 104; // u32: 1 + the CPU the owner's application last polled on (0: none)
// u64: when the owner's application thread last busy-polled (CLOCK_MONOTONIC nanoseconds, to
// 20 microseconds; 0: it never has). While one does, the owner's progress thread sleeps
// with WAITING 2: a sender wakes it only once this stamp has gone stale.
const BUSY_AT: usize = 112;
const WILL: usize = 120; // u32: connections in the owner's last will (`conns-S-G`; 0: none)
// u32: 1 + the owner's socket's index in the `SO_REUSEPORT` group of its device's port, as its
// last probe found it (0: not known); see `fabric::steer`.
const STEER_INDEX: usize = 108;
// Slot 0 is never claimed (it names the port's own QPs); its space holds the directory's words.
const STEER_EPOCH: usize = 64; // u32 in slot 0: bumped whenever an endpoint's steer index changes
const STEER_ASK: usize = 68; // u32 in slot 0: bumped by an endpoint that wants every one to probe
const TOOLS_LINE: usize = 128; // the tools' cache line: the words below
const SNAPSHOT_ASKED: usize = TOOLS_LINE; // u32: bumped by a tool that wants a snapshot
const SNAPSHOT_DONE: usize = 132; // u32: the request the owner's latest snapshot answers
const CAPTURE: usize = 136; // CAPTURES × u32: the capture sessions copying this slot's packets
/// Capture sessions an endpoint serves at once (as several tcpdumps can run on one interface).
pub(crate) const CAPTURES: usize = 4;

/// The host directory of this user and network namespace, mapped.
#[derive(Debug)]
pub(crate) struct HostDir {
    path: PathBuf,
    slots: Mapping,
    /// The RDMA CM ports bound on the user's devices.
    pub(crate) ports: crate::ports::PortTable,
}

/// A slot's identity: its index and generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotId {
    pub(crate) index: u8,
    pub(crate) generation: u32,
}

impl HostDir {
    /// Opens (creating if needed) this user's directory for the current network namespace.
    pub(crate) fn open() -> io::Result<Self> {
        let uid = shm::effective_uid();
        Self::open_at(&base().join(dir_name(uid, netns())), uid)
    }

    /// Opens the directory at `path` for user `uid`.
    pub(crate) fn open_at(path: &Path, uid: u32) -> io::Result<Self> {
        match fs::DirBuilder::new().mode(0o700).create(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        Self::map(path, uid, true)
    }

    /// Opens an existing directory for looking at (never creating anything in it: as root,
    /// a file created in another user's directory would be root's, and lock its owner out).
    /// It must belong to `uid` with mode 0700.
    pub(crate) fn open_existing(path: &Path, uid: u32) -> io::Result<Self> {
        Self::map(path, uid, false)
    }

    /// Maps the slots and ports of the directory at `path`, creating them if `create`.
    fn map(path: &Path, uid: u32, create: bool) -> io::Result<Self> {
        // Someone else's directory, or one others may enter, could be a trap: refuse it.
        check_private(path, uid)?;
        let slots_path = path.join(SLOTS_FILE);
        let file = if create {
            open_shared(&slots_path, SLOTS * SLOT_SIZE)?
        } else {
            open_existing_shared(&slots_path, SLOTS * SLOT_SIZE)?
        };
        let slots = Mapping::new(&file, SLOTS * SLOT_SIZE)?;
        let ports = if create {
            crate::ports::PortTable::open(path)?
        } else {
            crate::ports::PortTable::open_existing(path)?
        };
        Ok(Self { path: path.to_path_buf(), slots, ports })
    }

    fn at(&self, index: u8, field: usize) -> usize {
        usize::from(index) * SLOT_SIZE + field
    }

    /// For tests: slot `index`, generation `generation`, now held by `pid` (one that has
    /// exited, say).
    #[cfg(test)]
    pub(crate) fn set_holder(&self, index: u8, generation: u32, pid: u32) {
        self.word(index).store(join(generation, pid), Ordering::Release);
    }

    fn word(&self, index: u8) -> &AtomicU64 {
        self.slots.u64_at(self.at(index, WORD))
    }

    /// Claims a slot for this process's endpoint of the device at `addr`.
    pub(crate) fn claim(&self, addr: IpAddr) -> io::Result<SlotId> {
        let me = std::process::id();
        let my_start = start_time(me).unwrap_or(0);
        // A dead process's slot that holds a last will with connections not yet released is
        // taken only when no other is left: its successor's claim would clear the will.
        let slots = FIRST_SLOT..=LAST_SLOT;
        for (index, wills_too) in slots.clone().map(|i| (i, false)).chain(slots.map(|i| (i, true)))
        {
            let word = self.word(index);
            let w = word.load(Ordering::Acquire);
            let (generation, pid) = split(w);
            if generation % 2 == 1 {
                continue; // being set up by someone
            }
            if pid != 0 {
                let start = self.slots.u64_at(self.at(index, START_TIME)).load(Ordering::Acquire);
                if owner_alive(pid, start) {
                    continue;
                }
                if !wills_too && self.will(index).load(Ordering::Acquire) != 0 {
                    continue;
                }
            }
            let setting_up = join(generation.wrapping_add(1), me);
            if word.compare_exchange(w, setting_up, Ordering::AcqRel, Ordering::Acquire).is_err() {
                continue;
            }
            self.slots.u64_at(self.at(index, START_TIME)).store(my_start, Ordering::Release);
            self.slots.write(self.at(index, ADDR), &mapped(addr));
            self.slots.u32_at(self.at(index, WAITING)).store(0, Ordering::Release);
            self.slots.u32_at(self.at(index, WAITER_CPU)).store(0, Ordering::Release);
            self.busy_at(index).store(0, Ordering::Release);
            self.will(index).store(0, Ordering::Release);
            self.steer_index(index).store(0, Ordering::Release);
            for at in (TOOLS_LINE..SLOT_SIZE).step_by(8) {
                self.slots.u64_at(self.at(index, at)).store(0, Ordering::Release);
            }
            for k in 0..4 {
                self.slots.u64_at(self.at(index, INBOUND + 8 * k)).store(0, Ordering::Release);
            }
            let live = generation.wrapping_add(2);
            word.store(join(live, me), Ordering::Release);
            let id = SlotId { index, generation: live };
            self.remove_stale(index, live);
            return Ok(id);
        }
        Err(io::Error::new(
            io::ErrorKind::OutOfMemory,
            format!("all {} endpoint slots of {} are taken", LAST_SLOT, self.path.display()),
        ))
    }

    /// Removes the rings and FIFOs of earlier incarnations of slot `index`.
    fn remove_stale(&self, index: u8, live: u32) {
        let Ok(entries) = fs::read_dir(&self.path) else { return };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            let mut parts = name.split('-');
            let kind = parts.next();
            let nums: Vec<u32> = parts.filter_map(|p| p.parse().ok()).collect();
            let stale = match (kind, nums.as_slice()) {
                (Some("ring"), &[s, g, t, h]) => {
                    (s == u32::from(index) && g != live) || (t == u32::from(index) && h != live)
                }
                (Some("wake" | "snap" | "conns"), &[t, h]) | (Some("cap"), &[t, h, _, _]) => {
                    t == u32::from(index) && h != live
                }
                _ => false,
            };
            if stale {
                let _ = fs::remove_file(e.path());
            }
        }
    }

    /// Lets go of a slot (an endpoint closing): pid 0 under a new generation.
    pub(crate) fn release(&self, id: SlotId) {
        let word = self.word(id.index);
        let w = word.load(Ordering::Acquire);
        if split(w) == (id.generation, std::process::id()) {
            let _ = word.compare_exchange(
                w,
                join(id.generation.wrapping_add(2), 0),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    /// The live generation of slot `index` and its device address, or `None` if it is free,
    /// being set up, or out of range.
    pub(crate) fn live(&self, index: u8) -> Option<(u32, IpAddr)> {
        if !(FIRST_SLOT..=LAST_SLOT).contains(&index) {
            return None;
        }
        let word = self.word(index);
        let w = word.load(Ordering::Acquire);
        let (generation, pid) = split(w);
        if pid == 0 || generation % 2 == 1 {
            return None;
        }
        let mut a = [0u8; 16];
        self.slots.read(self.at(index, ADDR), &mut a);
        // Read again: the address belongs to this generation only if the word is unchanged.
        if word.load(Ordering::Acquire) != w {
            return None;
        }
        Some((generation, unmapped(a)))
    }

    /// Whether slot `index` is live in `generation` (one load: for the data path).
    pub(crate) fn holds(&self, index: u8, generation: u32) -> bool {
        let (g, pid) = split(self.word(index).load(Ordering::Acquire));
        pid != 0 && g == generation
    }

    /// Whether the process that holds slot `index` still runs (a system call and a read of
    /// `/proc`: for occasional checks, not the data path).
    pub(crate) fn alive(&self, index: u8) -> bool {
        let (generation, pid) = split(self.word(index).load(Ordering::Acquire));
        if pid == 0 || generation % 2 == 1 {
            return false;
        }
        let start = self.slots.u64_at(self.at(index, START_TIME)).load(Ordering::Acquire);
        owner_alive(pid, start)
    }

    /// The generation of slot `index` if it is live and its process still runs ([`HostDir::live`]
    /// and [`HostDir::alive`]): what holds a port or a listener, which a process killed
    /// without unbinding must not keep.
    pub(crate) fn running_generation(&self, index: u8) -> Option<u32> {
        self.live(index).filter(|_| self.alive(index)).map(|(g, _)| g)
    }

    /// Slot `index`'s sleep flag.
    pub(crate) fn waiting(&self, index: u8) -> &AtomicU32 {
        self.slots.u32_at(self.at(index, WAITING))
    }

    /// Slot `index`'s busy-poll stamp: when its owner's application thread last busy-polled
    /// (`CLOCK_MONOTONIC` nanoseconds, 0: it never has), written by the owner at most every 20
    /// microseconds (the line is the senders').
    pub(crate) fn busy_at(&self, index: u8) -> &AtomicU64 {
        self.slots.u64_at(self.at(index, BUSY_AT))
    }

    /// Slot `index`'s waiter CPU: 1 + the CPU on which its owner's application thread last
    /// polled or waited for a completion (0: it has not), written by the owner only when it
    /// changes (the line is the senders').
    pub(crate) fn waiter_cpu(&self, index: u8) -> &AtomicU32 {
        self.slots.u32_at(self.at(index, WAITER_CPU))
    }

    /// Slot `index`'s ring epoch, bumped when a ring to it appears.
    pub(crate) fn rings_epoch(&self, index: u8) -> &AtomicU32 {
        self.slots.u32_at(self.at(index, RINGS_EPOCH))
    }

    /// Word `k` (0..4) of slot `index`'s inbound bitmap.
    pub(crate) fn inbound(&self, index: u8, k: usize) -> &AtomicU64 {
        self.slots.u64_at(self.at(index, INBOUND + 8 * (k % 4)))
    }

    /// The process that holds slot `index` (0: none).
    pub(crate) fn pid(&self, index: u8) -> u32 {
        split(self.word(index).load(Ordering::Acquire)).1
    }

    /// Slot `index`'s snapshot request counter (bumped by tools).
    pub(crate) fn snapshot_asked(&self, index: u8) -> &AtomicU32 {
        self.slots.u32_at(self.at(index, SNAPSHOT_ASKED))
    }

    /// The request slot `index`'s latest snapshot answers.
    pub(crate) fn snapshot_done(&self, index: u8) -> &AtomicU32 {
        self.slots.u32_at(self.at(index, SNAPSHOT_DONE))
    }

    /// Whether no capture session names slot `index` (two loads: the data path's check).
    pub(crate) fn uncaptured(&self, index: u8) -> bool {
        let a = self.slots.u64_at(self.at(index, CAPTURE)).load(Ordering::Relaxed);
        let b = self.slots.u64_at(self.at(index, CAPTURE + 8)).load(Ordering::Relaxed);
        a | b == 0
    }

    /// Capture session `k` (0..[`CAPTURES`]) of slot `index` (0: none).
    pub(crate) fn capture(&self, index: u8, k: usize) -> &AtomicU32 {
        self.slots.u32_at(self.at(index, CAPTURE + 4 * (k % CAPTURES)))
    }

    /// The path of slot `s`'s snapshot.
    pub(crate) fn snapshot_path(&self, s: SlotId) -> PathBuf {
        self.path.join(format!("snap-{}-{}", s.index, s.generation))
    }

    /// The path of slot `s`'s ring for session `session` in its capture word `k`: named by
    /// the session too, so two tools that start at once never replace each other's ring.
    pub(crate) fn capture_path(&self, s: SlotId, k: usize, session: u32) -> PathBuf {
        self.path.join(format!("cap-{}-{}-{k}-{session}", s.index, s.generation))
    }

    /// The path of the ring from `from` to `to`.
    pub(crate) fn ring_path(&self, from: SlotId, to: SlotId) -> PathBuf {
        self.path
            .join(format!("ring-{}-{}-{}-{}", from.index, from.generation, to.index, to.generation))
    }

    /// The path of slot `of`'s last will ([`crate::last_will`]).
    pub(crate) fn will_path(&self, of: SlotId) -> PathBuf {
        self.path.join(format!("conns-{}-{}", of.index, of.generation))
    }

    /// Slot `index`'s will count: how many connections its owner's last will holds (0: none).
    pub(crate) fn will(&self, index: u8) -> &AtomicU32 {
        self.slots.u32_at(self.at(index, WILL))
    }

    /// Slot `index`'s steer index: 1 + its socket's place in its port's `SO_REUSEPORT` group
    /// (0: not known), written by its owner only.
    pub(crate) fn steer_index(&self, index: u8) -> &AtomicU32 {
        self.slots.u32_at(self.at(index, STEER_INDEX))
    }

    /// The directory's steering epoch: bumped by every change of a steer index, so that each
    /// endpoint knows when to give its port a new program.
    pub(crate) fn steer_epoch(&self) -> &AtomicU32 {
        self.slots.u32_at(self.at(0, STEER_EPOCH))
    }

    /// The directory's probe requests: bumped by an endpoint that found an index stale.
    pub(crate) fn steer_ask(&self) -> &AtomicU32 {
        self.slots.u32_at(self.at(0, STEER_ASK))
    }

    /// The live endpoints of the device at `addr` (whether or not their processes still run).
    pub(crate) fn endpoints_at(&self, addr: IpAddr) -> impl Iterator<Item = SlotId> + '_ {
        (FIRST_SLOT..=LAST_SLOT).filter_map(move |index| {
            let (generation, a) = self.live(index)?;
            (a == addr).then_some(SlotId { index, generation })
        })
    }

    /// The endpoints whose process died with connections in its last will, and their
    /// addresses: a load or two per slot, a system call only for those with a will.
    pub(crate) fn dead_with_will(&self) -> Vec<(SlotId, IpAddr)> {
        (FIRST_SLOT..=LAST_SLOT)
            .filter(|&i| self.will(i).load(Ordering::Acquire) != 0)
            .filter_map(|i| {
                let (generation, addr) = self.live(i)?;
                (!self.alive(i)).then_some((SlotId { index: i, generation }, addr))
            })
            .collect()
    }

    /// The path of slot `to`'s wake-up FIFO.
    pub(crate) fn wake_path(&self, to: SlotId) -> PathBuf {
        self.path.join(format!("wake-{}-{}", to.index, to.generation))
    }
}

/// Opens (creating, mode 0600) a shared file of at least `len` bytes. Creation races are
/// harmless: every creator sizes it the same, and a new file reads as zeroes.
pub(crate) fn open_shared(path: &Path, len: usize) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let want = len as u64;
    if file.metadata()?.len() < want {
        file.set_len(want)?;
    }
    Ok(file)
}

/// Where the host directories are: `UROCE_SHM_DIR`, or `/dev/shm`.
pub(crate) fn base() -> PathBuf {
    std::env::var_os("UROCE_SHM_DIR").map_or_else(|| "/dev/shm".into(), PathBuf::from)
}

/// The current network namespace (its inode number; 0 if it cannot be read).
pub(crate) fn netns() -> u64 {
    fs::metadata("/proc/self/ns/net").map(|m| m.ino()).unwrap_or(0)
}

/// The host directory's name for user `uid` in network namespace `netns`.
fn dir_name(uid: u32, netns: u64) -> String {
    format!("uroce-{uid}-{netns}")
}

/// The user and network namespace of a host directory's name.
pub(crate) fn parse_dir_name(name: &str) -> Option<(u32, u64)> {
    let (uid, ns) = name.strip_prefix("uroce-")?.split_once('-')?;
    Some((uid.parse().ok()?, ns.parse().ok()?))
}

/// Whether `path` is a directory of `uid` that nobody else may enter.
fn check_private(path: &Path, uid: u32) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is not a directory of uid {uid} with mode 0700", path.display()),
        ));
    }
    Ok(())
}

/// Opens an existing shared file of at least `len` bytes, read-write, without creating it.
pub(crate) fn open_existing_shared(path: &Path, len: usize) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    if file.metadata()?.len() < len as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is shorter than {len} bytes", path.display()),
        ));
    }
    Ok(file)
}

fn split(w: u64) -> (u32, u32) {
    // Halves of a u64: both fit.
    #[expect(clippy::cast_possible_truncation, reason = "the halves of a u64")]
    ((w >> 32) as u32, w as u32)
}

fn join(generation: u32, pid: u32) -> u64 {
    u64::from(generation) << 32 | u64::from(pid)
}

/// An address as the 16 bytes shared memory stores it (IPv4 mapped into IPv6).
pub(crate) fn mapped(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The address [`mapped`] stored.
pub(crate) fn unmapped(b: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(b);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

/// Whether the process that claimed a slot still runs: its pid exists and (where it could be
/// read) started when the claim says, so a recycled pid is not taken for it.
fn owner_alive(pid: u32, start: u64) -> bool {
    if !shm::process_exists(pid) {
        return false;
    }
    match start_time(pid) {
        Some(now) => start == 0 || now == start,
        None => true,
    }
}

/// A process's start time, in clock ticks after boot (`/proc/PID/stat`, field 22).
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// For tests: the pid of a child that has exited and been reaped (no process has it now).
#[cfg(test)]
pub(crate) fn exited_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().expect("spawn");
    let pid = child.id();
    child.wait().expect("wait");
    pid
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("uroce-host-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn claims_distinct_slots_and_reuses_released_ones_under_a_new_generation() {
        let p = temp_dir("claim");
        let dir = HostDir::open_at(&p, shm::effective_uid()).expect("open");
        let a: IpAddr = "127.0.0.2".parse().expect("addr");
        let s1 = dir.claim(a).expect("claim");
        let s2 = dir.claim(a).expect("claim");
        assert_ne!(s1.index, s2.index);
        assert_eq!(dir.live(s1.index), Some((s1.generation, a)));
        dir.release(s1);
        assert_eq!(dir.live(s1.index), None);
        let s3 = dir.claim("::1".parse().expect("addr")).expect("claim");
        assert_eq!(s3.index, s1.index);
        assert_ne!(s3.generation, s1.generation);
        assert_eq!(dir.live(s3.index).map(|l| l.1), Some("::1".parse().expect("addr")));
        let _ = fs::remove_dir_all(&p);
    }

    #[test]
    fn a_dead_owners_slot_is_taken_over() {
        let p = temp_dir("dead");
        let dir = HostDir::open_at(&p, shm::effective_uid()).expect("open");
        dir.set_holder(FIRST_SLOT, 2, exited_pid());
        let s = dir.claim("127.0.0.2".parse().expect("addr")).expect("claim");
        assert_eq!((s.index, s.generation), (FIRST_SLOT, 4));
        let _ = fs::remove_dir_all(&p);
    }

    #[test]
    fn refuses_a_directory_others_can_enter() {
        let p = temp_dir("mode");
        fs::DirBuilder::new().mode(0o755).create(&p).expect("mkdir");
        // DirBuilder's mode is masked by the umask; make sure group/other have access.
        std::os::unix::fs::PermissionsExt::set_mode(
            &mut fs::metadata(&p).expect("m").permissions(),
            0o755,
        );
        fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let e = HostDir::open_at(&p, shm::effective_uid()).expect_err("must refuse");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        let _ = fs::remove_dir_all(&p);
    }
}
