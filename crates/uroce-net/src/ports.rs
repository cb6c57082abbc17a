//! The host's RDMA CM ports: which endpoint has bound which port of which port space on which
//! address, and which of those listen. A table in the host directory (file `ports`) that every
//! endpoint of the user's devices maps, so that ports are unique across processes as TCP ports
//! are, and so that a connection request (a REQ or SIDR_REQ on QP1, which names its service —
//! port space and port — but no QPN) reaches the process listening on it.
//!
//! An entry is 64 bytes: an owner word (the endpoint's slot generation, slot index and the
//! entry's state), the service ID, and the address (IPv4-mapped; `::` for a wildcard bind). An
//! entry whose endpoint is no longer live in the same generation is free. Binding takes the
//! table's lock word (a pid; a dead holder's lock is taken over); lookups read without it, and
//! an owner marks its entry listening or frees it without it.

use core::net::IpAddr;
use std::io;
use std::path::Path;
use std::sync::atomic::Ordering;

use crate::host::{SlotId, mapped, open_shared, unmapped};
use crate::sys::shm::{self, Mapping};

/// Entries in the table: bound ports of every process of the user, on every device.
pub(crate) const ENTRIES: usize = 4096;
const ENTRY: usize = 64;
const HEADER: usize = 64;
const LEN: usize = HEADER + ENTRIES * ENTRY;
const LOCK: usize = 0;

const OWNER: usize = 0; // u64: generation << 32 | index << 8 | state
const SERVICE: usize = 8; // u64
const ADDR: usize = 16; // 16 bytes

/// How often a lookup reads an entry that changed under it before it gives up on it.
const READ_ATTEMPTS: usize = 8;

const BOUND: u64 = 1;
const LISTENING: u64 = 2;

/// The first port handed out for port 0 (Linux's default `ip_local_port_range` starts here).
const EPHEMERAL_FIRST: u16 = 32768;
const EPHEMERAL_LAST: u16 = 60999;

/// Why a bind was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindError {
    /// The port is bound on this address (or a wildcard covering it) already (`EADDRINUSE`).
    InUse,
    /// No free port (port 0), or the table is full (`EADDRNOTAVAIL`).
    Exhausted,
}

impl core::fmt::Display for BindError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::InUse => f.write_str("the port is bound already in this port space"),
            Self::Exhausted => f.write_str("no port left to bind"),
        }
    }
}

impl std::error::Error for BindError {}

/// The mapped table.
#[derive(Debug)]
pub(crate) struct PortTable {
    map: Mapping,
}

/// Whether a bind on `a` conflicts with one on `b` (the same address, or either a wildcard of
/// the same family or of none).
fn overlaps(a: IpAddr, b: IpAddr) -> bool {
    a == b || a.is_unspecified() || b.is_unspecified()
}

const fn owner_word(slot: SlotId, state: u64) -> u64 {
    ((slot.generation as u64) << 32) | ((slot.index as u64) << 8) | state
}

#[expect(clippy::cast_possible_truncation, reason = "fields of the owner word")]
const fn owner_of(w: u64) -> (SlotId, u64) {
    (SlotId { index: (w >> 8) as u8, generation: (w >> 32) as u32 }, w & 0xFF)
}

/// Whether owner word `w` leaves its entry unused: no bind holds it (state 0), or its owner's
/// slot is no longer live in the generation `live` says.
fn vacant(w: u64, live: &dyn Fn(u8) -> Option<u32>) -> bool {
    let (owner, state) = owner_of(w);
    state == 0 || live(owner.index) != Some(owner.generation)
}

/// One entry as read.
struct Entry {
    owner: SlotId,
    state: u64,
    service: u64,
    addr: IpAddr,
}

impl PortTable {
    pub(crate) fn open(dir: &Path) -> io::Result<Self> {
        let file = open_shared(&dir.join("ports"), LEN)?;
        Ok(Self { map: Mapping::new(&file, LEN)? })
    }

    /// Maps an existing table (for looking, never creating it).
    pub(crate) fn open_existing(dir: &Path) -> io::Result<Self> {
        let file = crate::host::open_existing_shared(&dir.join("ports"), LEN)?;
        Ok(Self { map: Mapping::new(&file, LEN)? })
    }

    fn at(i: usize, field: usize) -> usize {
        HEADER + i * ENTRY + field
    }

    /// Entry `i` if it is in use by an endpoint that `live` says holds its slot now.
    ///
    /// Read without the lock, so it may race a change of the entry: its owner marking it
    /// listening or not, or unbinding it, which take no lock. A read that saw only the state
    /// change keeps the entry, and one that saw the owner change reads again. (Once such a
    /// read made a listening entry look free, a concurrent bind overwrote it, and every
    /// connection request for the listener was rejected: nobody listened.)
    fn read(&self, i: usize, live: &dyn Fn(u8) -> Option<u32>) -> Option<Entry> {
        let word = self.map.u64_at(Self::at(i, OWNER));
        for _ in 0..READ_ATTEMPTS {
            let w = word.load(Ordering::Acquire);
            if vacant(w, live) {
                return None;
            }
            let (owner, _) = owner_of(w);
            let service = self.map.u64_at(Self::at(i, SERVICE)).load(Ordering::Acquire);
            let mut a = [0u8; 16];
            self.map.read(Self::at(i, ADDR), &mut a);
            // The fields are this owner's while it holds the entry (they are written only
            // while a bind has it at state 0); only its state may have changed meanwhile.
            let (now, state) = owner_of(word.load(Ordering::Acquire));
            if now == owner && state != 0 {
                return Some(Entry { owner, state, service, addr: unmapped(a) });
            }
        }
        None
    }

    /// Whether entry `i` may be taken by a bind (under the lock): unused, or its endpoint's
    /// process is gone. Judged on the owner word alone, never on a read of the fields that a
    /// change of state could make fail.
    fn free(&self, i: usize, live: &dyn Fn(u8) -> Option<u32>) -> Option<u64> {
        let w = self.map.u64_at(Self::at(i, OWNER)).load(Ordering::Acquire);
        vacant(w, live).then_some(w)
    }

    fn lock(&self) -> LockGuard<'_> {
        let me = u64::from(std::process::id());
        let word = self.map.u64_at(LOCK);
        loop {
            let held = word.load(Ordering::Acquire);
            let holder_gone = held != 0 && !shm::process_exists(u32::try_from(held).unwrap_or(0));
            if (held == 0 || holder_gone)
                && word.compare_exchange(held, me, Ordering::AcqRel, Ordering::Acquire).is_ok()
            {
                return LockGuard { table: self };
            }
            std::thread::yield_now();
        }
    }

    /// Binds `service` (port space and port; port 0: the first free ephemeral port) on `addr`
    /// for endpoint `owner`. Returns the service bound and the entry's index.
    pub(crate) fn bind(
        &self,
        owner: SlotId,
        space: u16,
        port: u16,
        addr: IpAddr,
        live: &dyn Fn(u8) -> Option<u32>,
    ) -> Result<(u64, usize), BindError> {
        let _guard = self.lock();
        let entries: Vec<(usize, Option<Entry>)> =
            (0..ENTRIES).map(|i| (i, self.read(i, live))).collect();
        let taken = |service: u64| {
            entries.iter().any(|(_, e)| {
                e.as_ref().is_some_and(|e| e.service == service && overlaps(e.addr, addr))
            })
        };
        let service_of = |p: u16| (u64::from(space) << 16) | u64::from(p);
        let service = if port == 0 {
            // Start somewhere that depends on the process, as Linux randomises.
            let span = u32::from(EPHEMERAL_LAST - EPHEMERAL_FIRST) + 1;
            let start = std::process::id() % span;
            (0..span)
                .map(|k| {
                    let p = EPHEMERAL_FIRST + u16::try_from((start + k) % span).unwrap_or(0);
                    service_of(p)
                })
                .find(|&s| !taken(s))
                .ok_or(BindError::Exhausted)?
        } else {
            let s = service_of(port);
            if taken(s) {
                return Err(BindError::InUse);
            }
            s
        };
        // Claimed with state 0 first, filled, then published: readers skip state 0. The claim
        // is a compare-and-swap: the lock keeps other binds out, not an owner's unbind.
        let (i, word) = loop {
            let (i, w) = (0..ENTRIES)
                .find_map(|i| self.free(i, live).map(|w| (i, w)))
                .ok_or(BindError::Exhausted)?;
            let word = self.map.u64_at(Self::at(i, OWNER));
            if word
                .compare_exchange(w, owner_word(owner, 0), Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                break (i, word);
            }
        };
        self.map.u64_at(Self::at(i, SERVICE)).store(service, Ordering::Release);
        self.map.write(Self::at(i, ADDR), &mapped(addr));
        word.store(owner_word(owner, BOUND), Ordering::Release);
        Ok((service, i))
    }

    /// Marks entry `i` (held by `owner`) listening or not.
    pub(crate) fn set_listening(&self, i: usize, owner: SlotId, listening: bool) {
        if i >= ENTRIES {
            return;
        }
        let word = self.map.u64_at(Self::at(i, OWNER));
        let w = word.load(Ordering::Acquire);
        let (o, state) = owner_of(w);
        if o == owner && state != 0 {
            let next = owner_word(owner, if listening { LISTENING } else { BOUND });
            let _ = word.compare_exchange(w, next, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// Frees entry `i` if `owner` holds it.
    pub(crate) fn unbind(&self, i: usize, owner: SlotId) {
        if i >= ENTRIES {
            return;
        }
        let word = self.map.u64_at(Self::at(i, OWNER));
        let w = word.load(Ordering::Acquire);
        if owner_of(w).0 == owner {
            let _ = word.compare_exchange(w, 0, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// The endpoint listening on `service` at `addr` (bound to it or to the wildcard of its
    /// family), if any. A specific bind wins over a wildcard, as for TCP.
    pub(crate) fn listener(
        &self,
        addr: IpAddr,
        service: u64,
        live: &dyn Fn(u8) -> Option<u32>,
    ) -> Option<SlotId> {
        let mut wildcard = None;
        for i in 0..ENTRIES {
            let Some(e) = self.read(i, live) else { continue };
            if e.state != LISTENING || e.service != service {
                continue;
            }
            if e.addr == addr {
                return Some(e.owner);
            }
            // `::` takes IPv4 too (rdma_cm's default, as a dual-stack socket).
            if e.addr.is_unspecified() && (e.addr.is_ipv6() || addr.is_ipv4()) {
                wildcard = wildcard.or(Some(e.owner));
            }
        }
        wildcard
    }
}

struct LockGuard<'a> {
    table: &'a PortTable,
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        self.table.map.u64_at(LOCK).store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn table() -> (PortTable, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "uroce-ports-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        (PortTable::open(&dir).unwrap(), dir)
    }

    #[test]
    fn binds_conflict_as_tcp_ports_and_dead_owners_free_theirs() {
        let (t, dir) = table();
        let a = SlotId { index: 3, generation: 2 };
        let b = SlotId { index: 4, generation: 6 };
        let mut gens = [None; 256];
        gens[3] = Some(2);
        gens[4] = Some(6);
        let live = |i: u8| gens[usize::from(i)];
        let ip: IpAddr = "127.0.0.2".parse().unwrap();
        let other: IpAddr = "127.0.0.3".parse().unwrap();
        let any: IpAddr = "0.0.0.0".parse().unwrap();
        let (s, ia) = t.bind(a, 0x0106, 7000, ip, &live).unwrap();
        assert_eq!(s, 0x0106_1B58);
        assert_eq!(t.bind(b, 0x0106, 7000, ip, &live), Err(BindError::InUse));
        assert_eq!(t.bind(b, 0x0106, 7000, any, &live), Err(BindError::InUse));
        // Another address, another port space: free.
        let (_, ib) = t.bind(b, 0x0106, 7000, other, &live).unwrap();
        t.bind(b, 0x0111, 7000, ip, &live).unwrap();
        assert_eq!(t.listener(ip, s, &live), None);
        t.set_listening(ia, a, true);
        t.set_listening(ib, b, true);
        assert_eq!(t.listener(ip, s, &live), Some(a));
        assert_eq!(t.listener(other, s, &live), Some(b));
        // Port 0: an ephemeral port, never one in use.
        let (e, _) = t.bind(a, 0x0106, 0, ip, &live).unwrap();
        assert!((32768..=60999).contains(&(e & 0xFFFF)));
        // A's slot dies (another generation holds it): its ports are free again.
        let mut gens2 = gens;
        gens2[3] = Some(4);
        let live2 = |i: u8| gens2[usize::from(i)];
        assert_eq!(t.listener(ip, s, &live2), None);
        t.bind(b, 0x0106, 7000, ip, &live2).unwrap();
        t.unbind(ib, b);
        assert_eq!(t.listener(other, s, &live2), None);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A listener's owner marks its entry listening and not (without the lock) while another
    /// endpoint binds: the entry is never taken for free, nor its port for unbound. (A bind
    /// that read the entry as its state changed once overwrote it: rdma-core's
    /// `test_rdmacm_sync_traffic` connected one run in thirty to a port nobody listened on.)
    #[test]
    fn an_entry_changing_state_is_never_taken_for_free() {
        let (t, dir) = table();
        let a = SlotId { index: 3, generation: 2 };
        let b = SlotId { index: 4, generation: 6 };
        let live = |i: u8| match i {
            3 => Some(2),
            4 => Some(6),
            _ => None,
        };
        let ip: IpAddr = "127.0.0.2".parse().unwrap();
        let (s, ia) = t.bind(a, 0x0106, 7000, ip, &live).unwrap();
        let (s2, ia2) = t.bind(a, 0x0106, 7001, ip, &live).unwrap();
        t.set_listening(ia2, a, true);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::Acquire) {
                    t.set_listening(ia, a, true);
                    t.set_listening(ia, a, false);
                }
            });
            // Checked after the flipping thread stops: a failed assertion here would leave it
            // flipping, and the scope waiting for it.
            let broken = (0..20_000).find_map(|_| {
                if t.bind(b, 0x0106, 7000, ip, &live) != Err(BindError::InUse) {
                    return Some("port 7000 taken for free".to_string());
                }
                let (_, ib) = t.bind(b, 0x0106, 0, ip, &live).unwrap();
                t.unbind(ib, b);
                (ib == ia || ib == ia2).then(|| format!("entry {ib} taken from its owner"))
            });
            stop.store(true, Ordering::Release);
            assert_eq!(broken, None);
        });
        assert_eq!(t.listener(ip, s2, &live), Some(a));
        assert!(t.read(ia, &live).is_some_and(|e| e.service == s));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
