//! Extended reliable connections (IBA Annex A14): XRC domains, XRC SRQs, and the target
//! side's choice of receive queue per request.
//!
//! An XRC initiator is RC's requester without a receive queue; each request carries an
//! XRCETH naming an XRC SRQ at the target. An XRC target QP, in an XRC domain, is RC's
//! responder without queues, PD or CQs of its own: the named SRQ, which must be in the
//! target's domain, supplies the receive WQE, the CQ the receive completes on, and the PD
//! its memory accesses (SEND, WRITE, READ, atomics) are checked against. One domain's SRQs
//! and target QPs thus serve every initiator that connects to any of its targets.

use uroce_wire::PacketRepr;
use uroce_wire::opcode::OpFlags;

use crate::ctx::Ctx;
use crate::device::Device;
use crate::errors::{CreateError, DestroyError, within};
use crate::memory::MemoryAccess;
use crate::qp::Qp;
use crate::srq::Srq;
use crate::types::{CqHandle, PdHandle, QpType, SrqHandle, XrcdHandle};

/// SRQ numbers are 24 bits on the wire (the XRCETH).
const MAX_SRQN: u32 = 0x00FF_FFFF;

impl<M: MemoryAccess> Device<M> {
    /// Allocates an XRC domain (`ibv_open_xrcd`).
    pub fn alloc_xrcd(&mut self) -> XrcdHandle {
        let x = XrcdHandle(self.next_xrcd);
        self.next_xrcd += 1;
        self.xrcds.insert(x.0);
        x
    }

    /// Deallocates an XRC domain (`ibv_close_xrcd`); refused while an XRC SRQ or target QP is
    /// in it (`EBUSY`).
    pub fn dealloc_xrcd(&mut self, xrcd: XrcdHandle) -> Result<(), DestroyError> {
        if !self.xrcds.contains(&xrcd.0) {
            return Err(DestroyError::Unknown);
        }
        let used = self.ctx.srqs.values().any(|s| s.xrc.is_some_and(|(x, _)| x == xrcd))
            || self.qps.values().any(|qp| qp.init.xrcd == Some(xrcd));
        if used {
            return Err(DestroyError::InUse);
        }
        self.xrcds.remove(&xrcd.0);
        Ok(())
    }

    /// Whether `xrcd` is allocated.
    pub(crate) fn has_xrcd(&self, xrcd: XrcdHandle) -> bool {
        self.xrcds.contains(&xrcd.0)
    }

    /// Creates an XRC SRQ (`ibv_create_srq_ex` with `IBV_SRQT_XRC`) in `xrcd`: its receives
    /// complete on `cq`, and the requests it takes are checked against `pd`. Its number,
    /// which initiators name in the XRCETH, is [`SrqHandle::get`].
    pub fn create_xrc_srq(
        &mut self,
        pd: PdHandle,
        xrcd: XrcdHandle,
        cq: CqHandle,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<SrqHandle, CreateError> {
        if !self.has_xrcd(xrcd) {
            return Err(CreateError::UnknownXrcd);
        }
        if !self.ctx.cqs.contains_key(&cq.0) {
            return Err(CreateError::UnknownCq);
        }
        within("max_srq", u64::from(self.next_srq), u64::from(MAX_SRQN))?;
        let h = self.create_srq(pd, max_wr, max_sge)?;
        if let Some(s) = self.ctx.srqs.get_mut(&h.0) {
            s.xrc = Some((xrcd, cq));
        }
        Ok(h)
    }

    /// The XRC domain of an XRC target QP, `None` for another QP.
    pub fn qp_xrcd(&self, qpn: uroce_wire::Qpn) -> Option<XrcdHandle> {
        self.qps.get(&qpn.get()).and_then(|q| q.init.xrcd)
    }

    /// The XRC domain an XRC SRQ is in, `None` for another SRQ.
    pub fn srq_xrcd(&self, srq: SrqHandle) -> Option<XrcdHandle> {
        self.ctx.srqs.get(&srq.0).and_then(|s| s.xrc.map(|(x, _)| x))
    }
}

/// Why an XRC request was refused: the XRCETH names no XRC SRQ of the target's domain, or
/// a packet inside a message names another SRQ than its first did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InvalidXrcSrq;

/// The XRC SRQ a request to XRC target `qp` names, with its PD and CQ, if it is in the
/// target's domain (IBA Annex A14). `None` for a QP that is not an XRC target.
pub(crate) fn target_of<M>(
    qp: &Qp,
    ctx: &Ctx<M>,
    packet: &PacketRepr<'_>,
) -> Result<Option<(SrqHandle, PdHandle, CqHandle)>, InvalidXrcSrq> {
    if qp.init.qp_type != QpType::XrcTgt {
        return Ok(None);
    }
    let srqn = packet.ext.xrceth.ok_or(InvalidXrcSrq)?.srqn;
    let srq: &Srq = ctx.srqs.get(&srqn).ok_or(InvalidXrcSrq)?;
    match srq.xrc {
        Some((xrcd, cq)) if Some(xrcd) == qp.init.xrcd => Ok(Some((SrqHandle(srqn), srq.pd, cq))),
        _ => Err(InvalidXrcSrq),
    }
}

/// Points XRC target `qp` at the XRC SRQ a request names: its PD, CQ and receive queue
/// serve the request. A packet that continues a message must name the SRQ the message began
/// with. Any other QP is left as it is.
pub(crate) fn bind_target<M>(
    qp: &mut Qp,
    ctx: &Ctx<M>,
    packet: &PacketRepr<'_>,
) -> Result<(), InvalidXrcSrq> {
    let Some((srq, pd, cq)) = target_of(qp, ctx, packet)? else { return Ok(()) };
    let continues = packet.bth.opcode.info().is_some_and(|i| {
        i.has(OpFlags::MIDDLE) || (i.has(OpFlags::LAST) && !i.has(OpFlags::FIRST))
    });
    if continues {
        return if qp.init.srq == Some(srq) { Ok(()) } else { Err(InvalidXrcSrq) };
    }
    qp.init.srq = Some(srq);
    qp.init.pd = pd;
    qp.init.recv_cq = cq;
    Ok(())
}
