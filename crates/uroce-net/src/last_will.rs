//! An endpoint's last will: the RDMA CM connections it holds established, published in the
//! host directory (`conns-S-G`), so that if its process dies without releasing them (killed,
//! crashed) an endpoint that survives it on the host releases them in its stead.
//!
//! On a real RNIC the CM is the kernel's: when a process dies, its rdma_cm file closes and
//! the kernel destroys its ids, so a live connection sends its DREQ (`cm_destroy_id`, IBA
//! 12.9.7) and the peer hears `RDMA_CM_EVENT_DISCONNECTED`. Here every process runs its own
//! CM, which dies with it; without a will the peer would wait for that event for ever.
//!
//! While an endpoint holds connections, it looks once a second ([`LOOK_EVERY`]) for endpoints
//! whose process is gone with a will (a load per slot, a system call only for slots with a
//! will). Of each dead connection it takes (one compare-and-swap per entry: each is released
//! once) what it can release:
//! - the ones whose peer it is: its CM takes the DREQ as received ([`Cm::peer_gone`]);
//! - the ones of the dead endpoint's own address (the same device): its CM sends the DREQ
//!   under the dead connection's comm ID, as the dead one's kernel would have
//!   ([`Cm::release_gone`]).
//!
//! What it leaves: a dead endpoint whose peers are elsewhere and whose address has no survivor
//! on the host that holds connections (nobody looks, or nobody can send from its address);
//! connections past [`ENTRIES`]; handshakes under way (a kernel would REJ them); a will whose
//! slot a new process claimed anyway (only when every other slot was taken: the claim
//! removes it).

use core::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use uroce_cm::{Cm, Established};
use uroce_engine::{Duration, Instant};
use uroce_wire::Qpn;

use crate::host::{HostDir, SlotId, mapped, open_existing_shared, open_shared, unmapped};
use crate::sys::shm::Mapping;

/// Connections a will holds.
pub(crate) const ENTRIES: usize = 1024;
const ENTRY: usize = 32;
const LEN: usize = ENTRIES * ENTRY;
// Entry layout.
const STATE: usize = 0; // u32: EMPTY, WILLED or RELEASED
const ID: usize = 4; // u32: the connection's comm ID
const REMOTE_ID: usize = 8; // u32: the peer's comm ID
const REMOTE_QPN: usize = 12; // u32: the peer's QPN
const REMOTE: usize = 16; // 16 bytes: the peer's address, IPv4-mapped

const EMPTY: u32 = 0;
const WILLED: u32 = 1;
const RELEASED: u32 = 2;

/// How often an endpoint that holds connections looks for dead endpoints' wills.
pub(crate) const LOOK_EVERY: Duration = Duration::from_secs(1);

/// One endpoint's will, and its look at the others'.
pub(crate) struct LastWill {
    dir: Arc<HostDir>,
    me: SlotId,
    addr: IpAddr,
    /// This endpoint's will, mapped once it first holds a connection.
    table: Option<Mapping>,
    /// Entries written the last time (the ones after are empty).
    written: usize,
    /// The CM's [`Cm::changes`] when the will was last written.
    published: Option<u64>,
    next_look: Instant,
    /// Dead endpoints whose wills hold nothing more for this one.
    looked: Vec<SlotId>,
}

impl LastWill {
    pub(crate) fn new(dir: Arc<HostDir>, me: SlotId, addr: IpAddr) -> Self {
        let (table, written, published, looked) = (None, 0, None, Vec::new());
        Self { dir, me, addr, table, written, published, next_look: Instant::ZERO, looked }
    }

    /// Writes the CM's established connections into the will, if they may have changed since.
    pub(crate) fn publish(&mut self, cm: &Cm) {
        if self.published == Some(cm.changes()) {
            return;
        }
        self.published = Some(cm.changes());
        let conns: Vec<Established> = cm.established().take(ENTRIES).collect();
        if conns.is_empty() && self.table.is_none() {
            return;
        }
        if self.table.is_none() {
            let path = self.dir.will_path(self.me);
            self.table = open_shared(&path, LEN).and_then(|f| Mapping::new(&f, LEN)).ok();
        }
        let Some(t) = &self.table else { return };
        let count = self.dir.will(self.me.index);
        // A survivor reads only once this process is gone, so nothing races the writes but
        // this process's own death: the count says "nothing" while they are under way.
        count.store(0, Ordering::Release);
        for (i, c) in conns.iter().enumerate() {
            let at = i * ENTRY;
            t.u32_at(at + ID).store(c.id, Ordering::Relaxed);
            t.u32_at(at + REMOTE_ID).store(c.remote_id, Ordering::Relaxed);
            t.u32_at(at + REMOTE_QPN).store(c.remote_qpn.get(), Ordering::Relaxed);
            t.write(at + REMOTE, &mapped(c.remote));
            t.u32_at(at + STATE).store(WILLED, Ordering::Release);
        }
        for i in conns.len()..self.written {
            t.u32_at(i * ENTRY + STATE).store(EMPTY, Ordering::Release);
        }
        self.written = conns.len();
        count.store(u32::try_from(conns.len()).unwrap_or(u32::MAX), Ordering::Release);
    }

    /// When to look at the others' wills next: while this endpoint holds connections (the
    /// ones that may be a dead process's peers, or share its address), once a second.
    pub(crate) fn next_look(&self, cm: &Cm) -> Option<Instant> {
        (cm.connections() > 0).then_some(self.next_look)
    }

    /// Releases what this endpoint can of the dead endpoints' wills. Returns how many
    /// connections it released.
    pub(crate) fn look(&mut self, now: Instant, cm: &mut Cm) -> usize {
        self.next_look = now + LOOK_EVERY;
        let mut released = 0;
        let dead = self.dir.dead_with_will();
        self.looked.retain(|s| dead.iter().any(|(d, _)| d == s));
        for (slot, addr) in dead {
            if slot == self.me || self.looked.contains(&slot) {
                continue;
            }
            let path = self.dir.will_path(slot);
            let Ok(t) = open_existing_shared(&path, LEN).and_then(|f| Mapping::new(&f, LEN)) else {
                continue;
            };
            let mut left = 0;
            for i in 0..ENTRIES {
                let at = i * ENTRY;
                let state = t.u32_at(at + STATE);
                match state.load(Ordering::Acquire) {
                    EMPTY => break,
                    WILLED => {}
                    _ => continue,
                }
                let mut remote = [0u8; 16];
                t.read(at + REMOTE, &mut remote);
                let gone = Established {
                    id: t.u32_at(at + ID).load(Ordering::Relaxed),
                    remote: unmapped(remote),
                    remote_id: t.u32_at(at + REMOTE_ID).load(Ordering::Relaxed),
                    remote_qpn: Qpn::from_masked(t.u32_at(at + REMOTE_QPN).load(Ordering::Relaxed)),
                };
                // The CM's comm IDs carry its endpoint's slot as their prefix.
                let peer = gone.remote == self.addr
                    && uroce_cm::id_prefix_of(gone.remote_id) == self.me.index;
                if !peer && addr != self.addr {
                    left += 1;
                    continue;
                }
                if state
                    .compare_exchange(WILLED, RELEASED, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    continue;
                }
                let done =
                    if peer { cm.peer_gone(now, addr, &gone) } else { cm.release_gone(now, &gone) };
                released += usize::from(done);
            }
            if left == 0 {
                // Nothing left to release: the slot may go to a new process again.
                let count = self.dir.will(slot.index);
                let n = count.load(Ordering::Acquire);
                if self.dir.holds(slot.index, slot.generation) {
                    let _ = count.compare_exchange(n, 0, Ordering::AcqRel, Ordering::Acquire);
                }
            }
            self.looked.push(slot);
        }
        released
    }
}

impl Drop for LastWill {
    fn drop(&mut self) {
        if self.table.is_some() {
            // Unless the slot went to another process already (its claim cleared the count).
            if self.dir.holds(self.me.index, self.me.generation) {
                self.dir.will(self.me.index).store(0, Ordering::Release);
            }
            let _ = std::fs::remove_file(self.dir.will_path(self.me));
        }
    }
}
