//! Completion queues.

use std::collections::VecDeque;

use crate::types::WorkCompletion;

/// A completion queue of fixed capacity. A completion that finds it full is lost and the queue
/// is marked overflowed: on hardware a CQ overrun is a CQ error, reported as an asynchronous
/// event, and the QPs that use the queue move to Error (IBA 11.4).
#[derive(Debug)]
pub(crate) struct Cq {
    entries: VecDeque<WorkCompletion>,
    capacity: usize,
    overflowed: bool,
}

impl Cq {
    pub(crate) fn new(capacity: usize) -> Self {
        Self { entries: VecDeque::with_capacity(capacity.min(4096)), capacity, overflowed: false }
    }

    /// Adds a completion; `false` if the queue was full.
    pub(crate) fn push(&mut self, wc: WorkCompletion) -> bool {
        if self.entries.len() >= self.capacity {
            self.overflowed = true;
            return false;
        }
        self.entries.push_back(wc);
        true
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
}
