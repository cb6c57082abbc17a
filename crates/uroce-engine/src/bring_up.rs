//! A QP's way from Reset to RTS (IBA 10.3), in the steps every user of the engine takes:
//! [`Device::init_qp`] (Reset → Init, with the access rights or the Q_Key),
//! [`Device::connect_qp`] (Init → RTR → RTS towards a peer, for RC and UC) and
//! [`Device::ready_datagram_qp`] (Init → RTR → RTS, for UD). Each step passes the attributes
//! `ibv_modify_qp(3)` requires at that transition and nothing else; the transitions and their
//! checks are [`Device::modify_qp`]'s. The safe API, the simulator's tests, the adversary and
//! the benches all bring QPs up through these.

use core::net::IpAddr;

use crate::device::Device;
use crate::memory::MemoryAccess;
use crate::qp::{MAX_RD_ATOMIC, ModifyError, QpAttr};
use crate::types::{Access, AddressVector, Mtu, QpState, QpType};
use crate::{Psn, QKey, Qpn, RnrTimer};

/// The connection a RC or UC QP makes: the peer and the two first PSNs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathAttr {
    /// The peer device's address.
    pub dest: IpAddr,
    /// The peer QP.
    pub dest_qpn: Qpn,
    /// The path MTU (the smaller of the two ends').
    pub mtu: Mtu,
    /// The PSN this QP sends first.
    pub sq_psn: Psn,
    /// The PSN the peer sends first: this QP's responder expects it.
    pub rq_psn: Psn,
}

/// The RC transport's parameters (UC has none of these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reliability {
    /// The local ACK timeout (4.096 µs × 2^timeout; 0: infinite).
    pub timeout: u8,
    /// Retries after an ACK timeout or a sequence NAK (3 bits).
    pub retry_cnt: u8,
    /// Retries after an RNR NAK (3 bits; 7: for ever).
    pub rnr_retry: u8,
    /// The RNR NAK timer this QP's responder asks the peer to wait.
    pub min_rnr_timer: RnrTimer,
    /// READs and atomics this QP has outstanding at once.
    pub max_rd_atomic: u8,
    /// READs and atomics of the peer this QP's responder keeps for duplicates.
    pub max_dest_rd_atomic: u8,
}

impl Default for Reliability {
    /// What rdma-core's examples and perftest use: timeout 14 (67 ms), seven retries of each
    /// kind, the RNR timer code 12 (0.64 ms), and the device's 16 READs and atomics each way.
    fn default() -> Self {
        Self {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: RnrTimer::from_masked(12),
            max_rd_atomic: MAX_RD_ATOMIC,
            max_dest_rd_atomic: MAX_RD_ATOMIC,
        }
    }
}

fn to(state: QpState) -> QpAttr {
    QpAttr { state: Some(state), ..QpAttr::default() }
}

impl<M: MemoryAccess> Device<M> {
    /// Reset → Init on port 1, P_Key index 0: an RC or UC QP with the remote `access` it
    /// allows its peer, a UD QP with its `qkey` (the other is ignored).
    pub fn init_qp(&mut self, qpn: Qpn, access: Access, qkey: QKey) -> Result<(), ModifyError> {
        let ud = self.qp_type(qpn) == Some(QpType::Ud);
        let init = QpAttr {
            pkey_index: Some(0),
            port_num: Some(1),
            access_flags: (!ud).then_some(access),
            qkey: ud.then_some(qkey),
            ..to(QpState::Init)
        };
        self.modify_qp(qpn, &init)
    }

    /// Init → RTR → RTS towards `path`; `reliability` applies to RC and XRC only.
    pub fn connect_qp(
        &mut self,
        qpn: Qpn,
        path: &PathAttr,
        reliability: &Reliability,
    ) -> Result<(), ModifyError> {
        let rc = self.qp_type(qpn).is_some_and(QpType::is_reliable);
        let r = reliability;
        let rtr = QpAttr {
            av: Some(AddressVector { dest: path.dest }),
            path_mtu: Some(path.mtu),
            dest_qp_num: Some(path.dest_qpn),
            rq_psn: Some(path.rq_psn),
            max_dest_rd_atomic: rc.then_some(r.max_dest_rd_atomic),
            min_rnr_timer: rc.then_some(r.min_rnr_timer),
            ..to(QpState::Rtr)
        };
        self.modify_qp(qpn, &rtr)?;
        let rts = QpAttr {
            sq_psn: Some(path.sq_psn),
            timeout: rc.then_some(r.timeout),
            retry_cnt: rc.then_some(r.retry_cnt),
            rnr_retry: rc.then_some(r.rnr_retry),
            max_rd_atomic: rc.then_some(r.max_rd_atomic),
            ..to(QpState::Rts)
        };
        self.modify_qp(qpn, &rts)
    }

    /// Init → RTR → RTS for a UD QP, sending from `sq_psn`.
    pub fn ready_datagram_qp(&mut self, qpn: Qpn, sq_psn: Psn) -> Result<(), ModifyError> {
        self.modify_qp(qpn, &to(QpState::Rtr))?;
        self.modify_qp(qpn, &QpAttr { sq_psn: Some(sq_psn), ..to(QpState::Rts) })
    }
}
