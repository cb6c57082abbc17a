//! Which attributes each QP state transition requires and which it allows (IBA 11.2.5.2,
//! Modify QP, with the state diagram of IBA 10.3.1). The table is the one Linux applies to every
//! RDMA device before its driver sees a modify (`ib_modify_qp_is_ok`); `ibv_modify_qp(3)`
//! prints its required column. An attribute that is neither required nor optional for the
//! transition is an error, as on a device: a DEST_QPN at RESET→INIT, a PATH_MTU at RTS→RTS.
//!
//! The alternate path and path migration attributes (`IBV_QP_ALT_PATH`,
//! `IBV_QP_PATH_MIG_STATE`) and the SQD drained event (`IBV_QP_EN_SQD_ASYNC_NOTIFY`) are left
//! out: uroce has no automatic path migration and raises no SQD drained event, and the C ABI
//! refuses them by name before a modify gets here.

use crate::qp::QpAttr;
use crate::types::{QpState, QpType};

/// A set of `modify_qp` attributes, one bit per attribute the engine models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attrs(u32);

impl Attrs {
    /// No attribute.
    pub const NONE: Self = Self(0);
    /// `IBV_QP_CUR_STATE`.
    pub const CUR_STATE: Self = Self(1);
    /// `IBV_QP_ACCESS_FLAGS`.
    pub const ACCESS_FLAGS: Self = Self(1 << 2);
    /// `IBV_QP_PKEY_INDEX`.
    pub const PKEY_INDEX: Self = Self(1 << 3);
    /// `IBV_QP_PORT`.
    pub const PORT: Self = Self(1 << 4);
    /// `IBV_QP_QKEY`.
    pub const QKEY: Self = Self(1 << 5);
    /// `IBV_QP_AV`.
    pub const AV: Self = Self(1 << 6);
    /// `IBV_QP_PATH_MTU`.
    pub const PATH_MTU: Self = Self(1 << 7);
    /// `IBV_QP_TIMEOUT`.
    pub const TIMEOUT: Self = Self(1 << 8);
    /// `IBV_QP_RETRY_CNT`.
    pub const RETRY_CNT: Self = Self(1 << 9);
    /// `IBV_QP_RNR_RETRY`.
    pub const RNR_RETRY: Self = Self(1 << 10);
    /// `IBV_QP_RQ_PSN`.
    pub const RQ_PSN: Self = Self(1 << 11);
    /// `IBV_QP_MAX_QP_RD_ATOMIC`.
    pub const MAX_QP_RD_ATOMIC: Self = Self(1 << 12);
    /// `IBV_QP_MIN_RNR_TIMER`.
    pub const MIN_RNR_TIMER: Self = Self(1 << 13);
    /// `IBV_QP_SQ_PSN`.
    pub const SQ_PSN: Self = Self(1 << 14);
    /// `IBV_QP_MAX_DEST_RD_ATOMIC`.
    pub const MAX_DEST_RD_ATOMIC: Self = Self(1 << 15);
    /// `IBV_QP_DEST_QPN`.
    pub const DEST_QPN: Self = Self(1 << 16);

    /// Each attribute with the name rdma-core gives its mask bit.
    const NAMES: [(Self, &'static str); 16] = [
        (Self::CUR_STATE, "IBV_QP_CUR_STATE"),
        (Self::ACCESS_FLAGS, "IBV_QP_ACCESS_FLAGS"),
        (Self::PKEY_INDEX, "IBV_QP_PKEY_INDEX"),
        (Self::PORT, "IBV_QP_PORT"),
        (Self::QKEY, "IBV_QP_QKEY"),
        (Self::AV, "IBV_QP_AV"),
        (Self::PATH_MTU, "IBV_QP_PATH_MTU"),
        (Self::TIMEOUT, "IBV_QP_TIMEOUT"),
        (Self::RETRY_CNT, "IBV_QP_RETRY_CNT"),
        (Self::RNR_RETRY, "IBV_QP_RNR_RETRY"),
        (Self::RQ_PSN, "IBV_QP_RQ_PSN"),
        (Self::MAX_QP_RD_ATOMIC, "IBV_QP_MAX_QP_RD_ATOMIC"),
        (Self::MIN_RNR_TIMER, "IBV_QP_MIN_RNR_TIMER"),
        (Self::SQ_PSN, "IBV_QP_SQ_PSN"),
        (Self::MAX_DEST_RD_ATOMIC, "IBV_QP_MAX_DEST_RD_ATOMIC"),
        (Self::DEST_QPN, "IBV_QP_DEST_QPN"),
    ];

    /// The attributes `attr` gives (every `Some` field but the state).
    pub fn of(attr: &QpAttr) -> Self {
        let given = [
            (Self::CUR_STATE, attr.cur_state.is_some()),
            (Self::ACCESS_FLAGS, attr.access_flags.is_some()),
            (Self::PKEY_INDEX, attr.pkey_index.is_some()),
            (Self::PORT, attr.port_num.is_some()),
            (Self::QKEY, attr.qkey.is_some()),
            (Self::AV, attr.av.is_some()),
            (Self::PATH_MTU, attr.path_mtu.is_some()),
            (Self::TIMEOUT, attr.timeout.is_some()),
            (Self::RETRY_CNT, attr.retry_cnt.is_some()),
            (Self::RNR_RETRY, attr.rnr_retry.is_some()),
            (Self::RQ_PSN, attr.rq_psn.is_some()),
            (Self::MAX_QP_RD_ATOMIC, attr.max_rd_atomic.is_some()),
            (Self::MIN_RNR_TIMER, attr.min_rnr_timer.is_some()),
            (Self::SQ_PSN, attr.sq_psn.is_some()),
            (Self::MAX_DEST_RD_ATOMIC, attr.max_dest_rd_atomic.is_some()),
            (Self::DEST_QPN, attr.dest_qp_num.is_some()),
        ];
        given.iter().filter(|(_, g)| *g).fold(Self::NONE, |all, (a, _)| all | *a)
    }

    /// Whether every attribute of `other` is in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// The attributes of `self` that are not in `other`.
    pub const fn without(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }

    /// The rdma-core name of the first attribute in `self`, if any.
    pub fn first_name(self) -> Option<&'static str> {
        Self::NAMES.iter().find(|(a, _)| self.contains(*a) && *a != Self::NONE).map(|(_, n)| *n)
    }
}

impl core::ops::BitOr for Attrs {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// What a transition takes: the attributes it requires and those it also allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// Attributes that must be given.
    pub required: Attrs,
    /// Attributes that may be given as well.
    pub optional: Attrs,
}

/// The attributes of `from` → `to` for a QP of type `t`; `None` when the state diagram has no
/// such transition (IBA 10.3.1: any state → Reset or Error; Reset → Init; Init → Init or RTR;
/// RTR → RTS; RTS → RTS or SQD; SQD → SQD or RTS; SQE → RTS).
pub fn transition(t: QpType, from: QpState, to: QpState) -> Option<Transition> {
    match t {
        QpType::XrcIni | QpType::XrcTgt => xrc_transition(t, from, to),
        _ => connected_or_datagram(t, from, to),
    }
}

/// XRC's halves take RC's transitions, but each requires only what its half uses (as the
/// kernel's `qp_state_table`): the initiator sends only, so its RTR needs no responder
/// resources or RNR timer; the target receives only, so its RTS needs no retry counts or
/// READ depth. What RC would require beyond that stays allowed.
fn xrc_transition(t: QpType, from: QpState, to: QpState) -> Option<Transition> {
    use Attrs as A;
    let rc = connected_or_datagram(QpType::Rc, from, to)?;
    let required = match (from, to, t) {
        (QpState::Init, QpState::Rtr, QpType::XrcIni) => {
            A::AV | A::PATH_MTU | A::DEST_QPN | A::RQ_PSN
        }
        (QpState::Rtr, QpState::Rts, QpType::XrcTgt) => A::SQ_PSN | A::TIMEOUT,
        _ => rc.required,
    };
    Some(Transition { required, optional: (rc.required | rc.optional).without(required) })
}

fn connected_or_datagram(t: QpType, from: QpState, to: QpState) -> Option<Transition> {
    use Attrs as A;
    use QpState::{Error, Init, Reset, Rtr, Rts, Sqd, Sqe};
    let (ud, uc) = (t == QpType::Ud, t == QpType::Uc);
    let take = |required: Attrs, optional: Attrs| Some(Transition { required, optional });
    // The attributes that may change a connected QP's path and access once it sends (RC also
    // its RNR timer): RTR→RTS, RTS→RTS, SQD→RTS.
    let sending = || {
        if ud {
            A::CUR_STATE | A::QKEY
        } else if uc {
            A::CUR_STATE | A::ACCESS_FLAGS
        } else {
            A::CUR_STATE | A::ACCESS_FLAGS | A::MIN_RNR_TIMER
        }
    };
    match (from, to) {
        (_, Reset | Error) => take(A::NONE, A::NONE),
        (Reset, Init) | (Init, Init) => {
            let attrs = if ud {
                A::PKEY_INDEX | A::PORT | A::QKEY
            } else {
                A::PKEY_INDEX | A::PORT | A::ACCESS_FLAGS
            };
            // Reset→Init requires them all; Init→Init may change any of them.
            if from == Reset { take(attrs, A::NONE) } else { take(A::NONE, attrs) }
        }
        (Init, Rtr) if ud => take(A::NONE, A::PKEY_INDEX | A::QKEY),
        (Init, Rtr) => {
            let path = A::AV | A::PATH_MTU | A::DEST_QPN | A::RQ_PSN;
            let required = if uc { path } else { path | A::MAX_DEST_RD_ATOMIC | A::MIN_RNR_TIMER };
            take(required, A::ACCESS_FLAGS | A::PKEY_INDEX)
        }
        (Rtr, Rts) if ud || uc => take(A::SQ_PSN, sending()),
        (Rtr, Rts) => take(
            A::SQ_PSN | A::TIMEOUT | A::RETRY_CNT | A::RNR_RETRY | A::MAX_QP_RD_ATOMIC,
            sending(),
        ),
        (Rts, Rts) | (Sqd, Rts) => take(A::NONE, sending()),
        (Rts, Sqd) => take(A::NONE, A::NONE),
        (Sqd, Sqd) if ud => take(A::NONE, A::PKEY_INDEX | A::QKEY),
        (Sqd, Sqd) if uc => take(A::NONE, A::AV | A::ACCESS_FLAGS | A::PKEY_INDEX),
        (Sqd, Sqd) => take(
            A::NONE,
            A::PORT
                | A::AV
                | A::TIMEOUT
                | A::RETRY_CNT
                | A::RNR_RETRY
                | A::MAX_QP_RD_ATOMIC
                | A::MAX_DEST_RD_ATOMIC
                | A::ACCESS_FLAGS
                | A::PKEY_INDEX
                | A::MIN_RNR_TIMER,
        ),
        // SQE is a UD and UC state (IBA 10.3.1); an RC QP never enters it.
        (Sqe, Rts) if ud => take(A::NONE, A::CUR_STATE | A::QKEY),
        (Sqe, Rts) if uc => take(A::NONE, A::CUR_STATE | A::ACCESS_FLAGS),
        (Sqe, Rts) => take(A::NONE, A::NONE),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpState::{Error, Init, Reset, Rtr, Rts, Sqd, Sqe};

    const STATES: [QpState; 7] = [Reset, Init, Rtr, Rts, Sqd, Sqe, Error];

    #[test]
    fn the_state_diagram_has_exactly_the_iba_transitions() {
        let legal = [
            (Reset, Init),
            (Init, Init),
            (Init, Rtr),
            (Rtr, Rts),
            (Rts, Rts),
            (Rts, Sqd),
            (Sqd, Sqd),
            (Sqd, Rts),
            (Sqe, Rts),
        ];
        for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
            for from in STATES {
                for to in STATES {
                    let expect = matches!(to, Reset | Error) || legal.contains(&(from, to));
                    assert_eq!(transition(t, from, to).is_some(), expect, "{t:?} {from:?}->{to:?}");
                }
            }
        }
    }

    #[test]
    fn required_and_optional_never_overlap_and_reset_or_error_take_nothing() {
        for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
            for from in STATES {
                for to in STATES {
                    let Some(x) = transition(t, from, to) else { continue };
                    assert_eq!(
                        x.required.without(x.optional),
                        x.required,
                        "{t:?} {from:?}->{to:?}"
                    );
                    if matches!(to, Reset | Error) {
                        assert_eq!((x.required, x.optional), (Attrs::NONE, Attrs::NONE));
                    }
                }
            }
        }
    }

    #[test]
    fn rc_ready_to_receive_requires_the_path_and_the_responder_resources() {
        let x = transition(QpType::Rc, Init, Rtr).unwrap();
        for a in [
            Attrs::AV,
            Attrs::PATH_MTU,
            Attrs::DEST_QPN,
            Attrs::RQ_PSN,
            Attrs::MAX_DEST_RD_ATOMIC,
            Attrs::MIN_RNR_TIMER,
        ] {
            assert!(x.required.contains(a));
        }
        // UC has no READ or atomic responder resources and no RNR NAK.
        let uc = transition(QpType::Uc, Init, Rtr).unwrap();
        assert!(!uc.required.contains(Attrs::MAX_DEST_RD_ATOMIC));
        assert!(
            !uc.required.contains(Attrs::MIN_RNR_TIMER)
                && !uc.optional.contains(Attrs::MIN_RNR_TIMER)
        );
        // A path MTU is fixed at RTR: RTS→RTS may not change it.
        assert!(!transition(QpType::Rc, Rts, Rts).unwrap().optional.contains(Attrs::PATH_MTU));
        assert_eq!(Attrs::DEST_QPN.first_name(), Some("IBV_QP_DEST_QPN"));
    }
}
