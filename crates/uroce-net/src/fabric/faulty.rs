//! Fault injection (`UROCE_FAULTS`): loss, duplication, reordering and corruption of what the
//! wrapped fabric sends and delivers, drawn as the simulator draws its links' faults
//! ([`uroce_engine::faults`]). Holding back here means sending after the next datagram.

use core::net::{IpAddr, SocketAddr};

use uroce_engine::faults::{Faults, flip_bit};
use uroce_engine::seeded::Rng;
use uroce_engine::{Instant, RxInfo};

use super::{Fabric, Outgoing, Sink, with_icrc};
use crate::device::NetCounters;
use crate::sys::memory::Registry;

/// A fabric with faults.
pub(crate) struct Faulty<F> {
    inner: F,
    /// The device's address, the source of what it sends.
    local: IpAddr,
    faults: Faults,
    rng: Rng,
    /// A packet held back to be sent after the next one (reordering).
    held: Option<Outgoing>,
    staged: Vec<Outgoing>,
}

impl<F: Fabric> Faulty<F> {
    pub(crate) fn new(inner: F, local: IpAddr, faults: Faults, seed: u64) -> Self {
        let (rng, held, staged) = (Rng::new(seed), None, Vec::new());
        Self { inner, local, faults, rng, held, staged }
    }
}

impl<F: Fabric> Fabric for Faulty<F> {
    fn transmit(&mut self, out: &mut Vec<Outgoing>, mem: &Registry, c: &mut NetCounters) {
        for mut o in out.drain(..) {
            // A corrupted packet must fail its ICRC at the receiver: compute it first.
            o.fill_icrc(mem, SocketAddr::new(self.local, o.port));
            o.materialize(mem);
            let fate = self.faults.fate(&mut self.rng, o.bytes.len());
            if fate.drop {
                c.fault_drops += 1;
                continue;
            }
            if let Some(bit) = fate.flip {
                flip_bit(&mut o.bytes, bit);
                c.fault_corruptions += 1;
            }
            if fate.duplicate {
                c.fault_dups += 1;
                let copy = Outgoing { bytes: o.bytes.clone(), pieces: Vec::new(), ..o };
                self.staged.push(copy);
            }
            if fate.hold && self.held.is_none() {
                c.fault_reorders += 1;
                self.held = Some(o);
                continue;
            }
            self.staged.push(o);
            if let Some(held) = self.held.take() {
                self.staged.push(held);
            }
        }
        // A held packet goes with this batch's end at the latest: reordered, never stranded.
        if let Some(held) = self.held.take() {
            self.staged.push(held);
        }
        self.inner.transmit(&mut self.staged, mem, c);
        out.append(&mut self.staged);
    }

    fn receive(&mut self, now: Instant, c: &mut NetCounters, sink: &mut Sink<'_>) -> usize {
        let (faults, rng) = (&self.faults, &mut self.rng);
        let mut side = NetCounters::default();
        let n = self.inner.receive(now, c, &mut |rx: &RxInfo, bytes: &[u8], intact| {
            let fate = faults.fate(rng, bytes.len());
            if fate.drop {
                side.fault_drops += 1;
                return;
            }
            let corrupted;
            let (bytes, intact) = match fate.flip {
                Some(bit) => {
                    // With a valid ICRC, so the receiver's check catches the flip.
                    let mut copy = if intact { with_icrc(rx, bytes) } else { bytes.to_vec() };
                    flip_bit(&mut copy, bit);
                    side.fault_corruptions += 1;
                    corrupted = copy;
                    (&corrupted[..], false)
                }
                None => (bytes, intact),
            };
            sink(rx, bytes, intact);
            if fate.duplicate {
                side.fault_dups += 1;
                sink(rx, bytes, intact);
            }
        });
        *c += side;
        n
    }

    super::delegate_to_inner!();
}
