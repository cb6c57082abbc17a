//! What a device shows about its QPs to someone looking from outside (`uroce qp`): one
//! [`QpInfo`] per QP, as `ss -ti` shows a socket's state and counters.

use core::net::IpAddr;

use crate::Qpn;
use crate::counters::QpCounters;
use crate::device::Device;
use crate::types::{Mtu, QpState, QpType, WcStatus};

/// One QP's state, positions and counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    /// The QP's number.
    pub qpn: Qpn,
    /// Its transport.
    pub qp_type: QpType,
    /// Its state (IBA 10.3).
    pub state: QpState,
    /// The path MTU.
    pub mtu: Mtu,
    /// RC and UC: the peer's address, once set at RTR.
    pub dest: Option<IpAddr>,
    /// RC and UC: the peer's QPN.
    pub dest_qpn: u32,
    /// The PSN of the next packet the requester sends.
    pub send_psn: u32,
    /// The oldest PSN not yet acknowledged.
    pub unacked_psn: u32,
    /// The PSN the responder expects next.
    pub expected_psn: u32,
    /// Send work requests posted and not yet completed.
    pub send_outstanding: usize,
    /// Receive work requests posted and not yet consumed.
    pub recv_posted: usize,
    /// The loss-driven window in packets (0: none yet, only the device's limit applies).
    pub window: u32,
    /// The completion status that moved the QP to Error, if one did.
    pub error_status: Option<WcStatus>,
    /// The QP's counters.
    pub counters: QpCounters,
}

impl<M> Device<M> {
    /// Every QP of the device (QP1 excepted), in QPN order.
    pub fn qp_infos(&self) -> Vec<QpInfo> {
        // The table is ordered by QPN.
        self.qps
            .values()
            .map(|q| QpInfo {
                qpn: q.qpn,
                qp_type: q.init.qp_type,
                state: q.state,
                mtu: q.mtu,
                dest: q.av.map(|a| a.dest),
                dest_qpn: q.dest_qpn.get(),
                send_psn: q.req.next_psn.get(),
                unacked_psn: q.req.una.get(),
                expected_psn: q.resp.epsn.get(),
                send_outstanding: q.req.sq.len(),
                recv_posted: q.rq.len(),
                window: q.req.cwnd,
                error_status: q.error_status,
                counters: q.counters,
            })
            .collect()
    }
}
