//! What the device must come back to, kept per QP as it changes: the QPs whose requester has a
//! timer running (ACK timeout, IBA 9.7.6.1.1; RNR wait, 9.7.5.2.8; the tail-loss probe), by
//! the instant it is due, and how many QPs have a work request outstanding.
//!
//! Without it, finding the next timer and asking whether any work is pending meant visiting
//! every QP on every round of progress: with 65,535 idle QPs one SEND took 1.38 ms instead of
//! 9 µs. Now both cost O(log n) in the QPs that have something to do, and nothing in the idle
//! ones. The device calls [`QpWatch::update`] after every input that reached a QP.

use std::collections::BTreeSet;

use crate::qp::Qp;
use crate::time::Instant;

/// A QP's entries in the watch, as last recorded (the watch finds them again by these).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Watched {
    /// The instant its earliest timer is due.
    due: Option<Instant>,
    /// It has a send or receive work request not yet completed.
    busy: bool,
}

/// The device's timers and outstanding work, by QP.
#[derive(Debug, Default)]
pub(crate) struct QpWatch {
    due: BTreeSet<(Instant, u32)>,
    busy: usize,
}

impl QpWatch {
    /// Records what `qp` now has running and outstanding. A timer that moved later, or
    /// stopped, keeps its earlier entry: when that instant comes the device finds nothing due
    /// (`completer::on_timer` checks every deadline against the time) and records the real
    /// one ([`QpWatch::refresh`]). An RC QP moves its ACK deadline and tail-loss probe with
    /// every message, each time a removal and an insertion in the ordered set; lazily, once
    /// per probe interval (200 µs at least) instead. An entry is never later than the QP's
    /// earliest timer, so none fires late.
    pub(crate) fn update(&mut self, qp: &mut Qp) {
        let due = match (qp.watched.due, qp.req.next_timer()) {
            (Some(recorded), Some(t)) if recorded <= t => Some(recorded),
            (Some(recorded), None) => Some(recorded),
            (_, due) => due,
        };
        self.record(qp, Watched { due, busy: qp.has_outstanding_work() });
    }

    /// [`QpWatch::update`] with the QP's timers recorded exactly: after the device handled
    /// what was due at its entry's instant.
    pub(crate) fn refresh(&mut self, qp: &mut Qp) {
        self.record(qp, Watched { due: qp.req.next_timer(), busy: qp.has_outstanding_work() });
    }

    fn record(&mut self, qp: &mut Qp, now: Watched) {
        if now == qp.watched {
            return;
        }
        self.forget(qp);
        if let Some(t) = now.due {
            self.due.insert((t, qp.qpn.get()));
        }
        self.busy += usize::from(now.busy);
        qp.watched = now;
    }

    /// Takes `qp` out of the watch (it is being destroyed).
    pub(crate) fn forget(&mut self, qp: &mut Qp) {
        let old = core::mem::take(&mut qp.watched);
        if let Some(t) = old.due {
            self.due.remove(&(t, qp.qpn.get()));
        }
        self.busy -= usize::from(old.busy);
    }

    /// The earliest instant a QP's timer may be due (a QP's entry may be earlier than its timer,
    /// [`QpWatch::update`]).
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.due.first().map(|&(t, _)| t)
    }

    /// The QPs with a timer due at `now`, in QPN order.
    pub(crate) fn due_at(&self, now: Instant) -> Vec<u32> {
        let mut qpns: Vec<u32> =
            self.due.iter().take_while(|&&(t, _)| t <= now).map(|&(_, q)| q).collect();
        qpns.sort_unstable();
        qpns
    }

    /// Whether any QP has a work request not yet completed.
    pub(crate) fn any_busy(&self) -> bool {
        self.busy > 0
    }
}
