//! The errors of creating, resizing and destroying a device's objects, each with `Display`.

use core::net::IpAddr;
use std::fmt;

use uroce_wire::Qpn;

use crate::attr::DEVICE_ATTR;

/// Why destroying an object failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestroyError {
    /// No such object.
    Unknown,
    /// Another object still uses it (a QP its CQ or SRQ; an MR, QP, SRQ or AH its PD; an
    /// XRC SRQ its CQ; an XRC SRQ or target QP its XRC domain).
    InUse,
}

impl fmt::Display for DestroyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unknown => "no such object",
            Self::InUse => "another object still uses it",
        })
    }
}

impl std::error::Error for DestroyError {}

/// Why `resize_cq` refused; the queue is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResizeCqError {
    /// No such CQ.
    UnknownCq,
    /// The capacity is 0 or above `max_cqe`.
    OutOfRange,
    /// Fewer entries than the completions queued now.
    BelowQueued {
        /// Completions in the queue.
        queued: usize,
    },
}

impl fmt::Display for ResizeCqError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownCq => f.write_str("no such CQ"),
            Self::OutOfRange => write!(f, "cqe outside 1..={}", DEVICE_ATTR.max_cqe),
            Self::BelowQueued { queued } => write!(f, "{queued} completions are queued"),
        }
    }
}

impl std::error::Error for ResizeCqError {}

/// Why creating an object failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateError {
    /// No protection domain with this handle.
    UnknownPd,
    /// No completion queue with this handle.
    UnknownCq,
    /// No shared receive queue with this handle.
    UnknownSrq,
    /// The SRQ belongs to another protection domain than the QP.
    SrqOfAnotherPd,
    /// No XRC domain with this handle (or an XRC target without one).
    UnknownXrcd,
    /// An SRQ given to an XRC QP (which takes none), or a shared receive queue named for a
    /// QP that is not an XRC SRQ where one is needed.
    XrcMisuse,
    /// A TM-SRQ named for a QP that is not RC: tag matching is an RC offload
    /// (`IBV_TM_CAP_RC`).
    TmSrqNeedsRc,
    /// An address handle whose destination is of the other IP family than the device.
    AhAddressFamily,
    /// A requested size is beyond the device's limit (`ibv_query_device`).
    ExceedsLimit {
        /// The attribute, as `ibv_device_attr` names it.
        limit: &'static str,
        /// What was asked for.
        requested: u64,
        /// What the device supports.
        max: u64,
    },
}

impl core::fmt::Display for CreateError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::UnknownPd => f.write_str("no such protection domain"),
            Self::UnknownCq => f.write_str("no such completion queue"),
            Self::UnknownSrq => f.write_str("no such shared receive queue"),
            Self::SrqOfAnotherPd => f.write_str("the SRQ belongs to another protection domain"),
            Self::AhAddressFamily => {
                f.write_str("the destination is of another IP family than the device")
            }
            Self::UnknownXrcd => f.write_str("no such XRC domain"),
            Self::XrcMisuse => f.write_str("XRC QPs take no SRQ; their receives go to XRC SRQs"),
            Self::TmSrqNeedsRc => f.write_str("a tag-matching SRQ serves RC QPs only"),
            Self::ExceedsLimit { limit, requested, max } => {
                write!(f, "{requested} exceeds the device's {limit} of {max}")
            }
        }
    }
}

impl std::error::Error for CreateError {}

pub(crate) fn within(limit: &'static str, requested: u64, max: u64) -> Result<(), CreateError> {
    if requested > max { Err(CreateError::ExceedsLimit { limit, requested, max }) } else { Ok(()) }
}

/// Why attaching a QP to a multicast group, or detaching it, failed (`ibv_attach_mcast(3)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McastError {
    /// No such QP.
    UnknownQp(Qpn),
    /// Only UD QPs take multicast (IBA 10.5.2).
    NotUd(Qpn),
    /// The address is not an IPv4 or IPv6 multicast address of the device's family.
    NotMulticast(IpAddr),
    /// Detaching a QP that is not attached to the group.
    NotAttached,
    /// Beyond `max_mcast_grp`, `max_mcast_qp_attach` or `max_total_mcast_qp_attach`.
    ExceedsLimit(&'static str),
}

impl core::fmt::Display for McastError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::UnknownQp(q) => write!(f, "no QP {q}"),
            Self::NotUd(q) => write!(f, "QP {q} is not UD; only UD QPs join multicast groups"),
            Self::NotMulticast(a) => write!(f, "{a} is not a multicast address of this family"),
            Self::NotAttached => f.write_str("the QP is not attached to the group"),
            Self::ExceedsLimit(l) => write!(f, "the device's {l} is reached"),
        }
    }
}

impl std::error::Error for McastError {}
