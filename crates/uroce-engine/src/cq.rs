//! Completion queues and their notification.

use std::collections::VecDeque;

use crate::types::{WcStatus, WorkCompletion};

/// What an armed completion queue waits for (`ibv_req_notify_cq`'s `solicited_only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arm {
    /// The next completion of any kind.
    Any,
    /// The next receive completion of a message with the solicited-event bit, or the next
    /// unsuccessful completion (IBA 11.4.2.2).
    Solicited,
}

/// What pushing a completion did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pushed {
    /// The completion was stored (the queue was not full).
    pub(crate) stored: bool,
    /// The queue overflowed for the first time.
    pub(crate) first_overflow: bool,
    /// The queue was armed and this completion fired its one notification.
    pub(crate) notify: bool,
}

/// A completion queue of fixed capacity. A completion that finds it full is lost and the queue
/// is marked overflowed: on hardware a CQ overrun is a CQ error, reported as an asynchronous
/// event (IBA 11.4).
#[derive(Debug)]
pub(crate) struct Cq {
    entries: VecDeque<WorkCompletion>,
    capacity: usize,
    overflowed: bool,
    armed: Option<Arm>,
}

impl Cq {
    /// Whether a notification is armed and has not fired yet.
    pub(crate) const fn armed(&self) -> bool {
        self.armed.is_some()
    }

    pub(crate) fn new(capacity: usize) -> Self {
        let entries = VecDeque::with_capacity(capacity.min(4096));
        Self { entries, capacity, overflowed: false, armed: None }
    }

    /// Adds a completion. `solicited`: it completes a received message whose last packet had
    /// the solicited-event bit.
    pub(crate) fn push(&mut self, wc: WorkCompletion, solicited: bool) -> Pushed {
        if self.entries.len() >= self.capacity {
            let first_overflow = !self.overflowed;
            self.overflowed = true;
            return Pushed { stored: false, first_overflow, notify: false };
        }
        self.entries.push_back(wc);
        // One notification per arming (ibv_req_notify_cq(3)).
        let notify = match self.armed {
            Some(Arm::Any) => true,
            Some(Arm::Solicited) => solicited || wc.status != WcStatus::SUCCESS,
            None => false,
        };
        if notify {
            self.armed = None;
        }
        Pushed { stored: true, first_overflow: false, notify }
    }

    /// Arms the queue for its next (solicited) completion.
    pub(crate) fn arm(&mut self, arm: Arm) {
        // Any-completion arming is the wider of the two and is not narrowed by a later call.
        self.armed = match (self.armed, arm) {
            (Some(Arm::Any), _) => Some(Arm::Any),
            (_, a) => Some(a),
        };
    }

    pub(crate) fn pop(&mut self) -> Option<WorkCompletion> {
        self.entries.pop_front()
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Drops the completions of QP `qpn` not yet polled.
    pub(crate) fn forget_qp(&mut self, qpn: crate::Qpn) {
        self.entries.retain(|wc| wc.qp_num != qpn);
    }

    /// Sets the capacity; refused (false) below the completions already queued, which a
    /// smaller queue could not hold (`ibv_resize_cq(3)`).
    pub(crate) fn resize(&mut self, capacity: usize) -> bool {
        if capacity < self.entries.len() {
            return false;
        }
        self.capacity = capacity;
        true
    }
}
