//! Shared receive queues: one pool of receive WQEs that many QPs take from (IBA 10.2.9).

use std::collections::VecDeque;

use crate::qp::RecvWqe;
use crate::tm::TagMatching;
use crate::types::{CqHandle, PdHandle, XrcdHandle};

/// A shared receive queue.
#[derive(Debug)]
pub(crate) struct Srq {
    pub(crate) pd: PdHandle,
    pub(crate) wqes: VecDeque<RecvWqe>,
    pub(crate) max_wr: u32,
    pub(crate) max_sge: u32,
    /// The armed limit (low watermark), 0 when disarmed: when fewer WQEs than this remain, one
    /// SRQ_LIMIT_REACHED event is raised and the limit disarms (`ibv_modify_srq(3)`).
    pub(crate) limit: u32,
    /// An XRC SRQ (`IBV_SRQT_XRC`): its domain, and the CQ its receives complete on.
    pub(crate) xrc: Option<(XrcdHandle, CqHandle)>,
    /// A TM-SRQ (`IBV_SRQT_TM`): its tags, counts and CQ.
    pub(crate) tm: Option<TagMatching>,
}

impl Srq {
    pub(crate) fn new(pd: PdHandle, max_wr: u32, max_sge: u32) -> Self {
        Self { pd, wqes: VecDeque::new(), max_wr, max_sge, limit: 0, xrc: None, tm: None }
    }

    /// The CQ its receives complete on when it names one (XRC and TM-SRQs), rather than
    /// the receiving QP's.
    pub(crate) fn cq(&self) -> Option<CqHandle> {
        self.xrc.map(|(_, cq)| cq).or(self.tm.as_ref().map(|t| t.cq))
    }

    /// Takes the oldest WQE; `true` in the second place if that crossed the armed limit.
    pub(crate) fn pop(&mut self) -> (Option<RecvWqe>, bool) {
        let wqe = self.wqes.pop_front();
        let crossed = wqe.is_some() && self.limit > 0 && self.wqes.len() < self.limit as usize;
        if crossed {
            self.limit = 0;
        }
        (wqe, crossed)
    }
}
