//! The tap `uroce capture` opens on a running endpoint: while the endpoint's slot names a
//! capture session, every packet it sends, and every packet it receives from another device,
//! is copied into that session's ring ([`crate::inspect::ring`]), whichever path it took.
//! Packets from the endpoint's own device, and from the other devices the session captures
//! (the ring names them), are left out on receipt: the process that sent them has copied them
//! already, so each packet is captured once, and copied once.
//!
//! With nobody capturing it costs two loads from the endpoint's own slot per batch.

use core::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use uroce_engine::{Instant, RxInfo};
use uroce_wire::ROCE_V2_PORT;

use super::{Fabric, Outgoing, Sink};
use crate::device::NetCounters;
use crate::host::{CAPTURES, HostDir, SlotId};
use crate::inspect::ring::{Direction, RingWriter};
use crate::sys::memory::Registry;

/// A fabric whose packets a capture session may be copying.
pub(crate) struct Tap<F> {
    inner: F,
    dir: Arc<HostDir>,
    slot: SlotId,
    addr: IpAddr,
    /// Per capture session word: the session its ring belongs to (0: none), and the ring.
    sessions: [u32; CAPTURES],
    rings: [Option<RingWriter>; CAPTURES],
    /// Whether any ring is open.
    any: bool,
}

/// Every this many records lost to a full ring, the tap checks that its capturer still runs
/// (one killed without ending its session would otherwise be copied to for ever).
const CAPTURER_CHECK_EVERY: u64 = 1024;

impl<F: Fabric> Tap<F> {
    pub(crate) fn new(inner: F, dir: Arc<HostDir>, slot: SlotId, addr: IpAddr) -> Self {
        Self {
            inner,
            dir,
            slot,
            addr,
            sessions: [0; CAPTURES],
            rings: Default::default(),
            any: false,
        }
    }

    /// Follows the slot's capture words: whether there is a ring to copy to now.
    fn refresh(&mut self) -> bool {
        if !self.any && self.dir.uncaptured(self.slot.index) {
            return false;
        }
        let mut any = false;
        for k in 0..CAPTURES {
            let word = self.dir.capture(self.slot.index, k);
            let session = word.load(Ordering::Relaxed);
            if session != self.sessions[k] {
                self.sessions[k] = session;
                self.rings[k] = None;
                if session != 0 {
                    let path = self.dir.capture_path(self.slot, k, session);
                    // A ring that cannot be opened (or is not this session's) is not
                    // followed; the next session is tried afresh.
                    self.rings[k] = RingWriter::open(&path, session).ok().flatten();
                }
            }
            let dropped = self.rings[k].as_ref().map_or(0, RingWriter::dropped);
            if dropped > 0
                && dropped.is_multiple_of(CAPTURER_CHECK_EVERY)
                && let Some(r) = &self.rings[k]
                && !crate::sys::shm::process_exists(r.capturer())
            {
                let _ = word.compare_exchange(session, 0, Ordering::AcqRel, Ordering::Acquire);
                self.rings[k] = None;
            }
            any |= self.rings[k].is_some();
        }
        self.any = any;
        any
    }
}

/// Wall-clock time in nanoseconds, for a captured batch.
fn wall_ns() -> u64 {
    #[expect(clippy::disallowed_methods, reason = "a capture's timestamps are wall-clock time")]
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl<F: Fabric> Fabric for Tap<F> {
    /// Copies what left, once it has: a packet sent through the kernel's UDP path carries the
    /// ICRC sealed for the IPv4 identification its socket gave it, from which the capture's
    /// reader recovers that identification for the frame's header, as the wire shows it.
    fn transmit(&mut self, out: &mut Vec<Outgoing>, mem: &Registry, c: &mut NetCounters) {
        self.inner.transmit(out, mem, c);
        let addr = self.addr;
        if !out.is_empty() && self.refresh() {
            let ts = wall_ns();
            for o in out.iter() {
                let src = SocketAddr::new(addr, o.port);
                // An ICRC the engine left zero is computed by the capture's reader: the
                // capture shows what the wire would carry, at no CRC's cost here.
                for ring in self.rings.iter_mut().flatten() {
                    ring.push(Direction::Sent, o.icrc_deferred, ts, src, o.dst, o.parts(mem));
                }
            }
            for ring in self.rings.iter().flatten() {
                ring.publish();
            }
        }
    }

    fn receive(&mut self, now: Instant, c: &mut NetCounters, sink: &mut Sink<'_>) -> usize {
        let addr = self.addr;
        if !self.refresh() {
            return self.inner.receive(now, c, sink);
        }
        let Self { inner, rings, .. } = self;
        // Read once per batch, and only for a batch that brings packets.
        let mut ts = None;
        let n = inner.receive(now, c, &mut |rx: &RxInfo, bytes: &[u8], intact| {
            let src = rx.src.ip();
            // From this device, or one the session captures too: its sender copied it.
            if src != addr && rings.iter().flatten().any(|r| !r.skips(src)) {
                let dst = SocketAddr::new(rx.dst, ROCE_V2_PORT);
                let at = *ts.get_or_insert_with(wall_ns);
                // A packet that came through shared memory may carry a zero ICRC: the reader
                // computes it (on a path that could corrupt it, the ICRC is kept as it came).
                let fill =
                    intact && bytes.get(bytes.len().saturating_sub(4)..) == Some(&[0; 4][..]);
                for ring in rings.iter_mut().flatten().filter(|r| !r.skips(src)) {
                    ring.push(Direction::Received, fill, at, rx.src, dst, core::iter::once(bytes));
                }
            }
            sink(rx, bytes, intact);
        });
        if n > 0 {
            for ring in rings.iter().flatten() {
                ring.publish();
            }
        }
        n
    }

    super::delegate_to_inner!();
}
