//! XRC (IBA Annex A14): one process's receive resources shared by every connection to it.
//!
//! An [`XrcDomain`] holds XRC SRQs and target QPs. A peer's initiator QP
//! ([`QpType::XrcIni`](crate::QpType::XrcIni), built from a [`Pd`] like any QP) connects to one
//! target, and names in each request the SRQ that takes it
//! ([`SendRequest::xrc_srq`](crate::SendRequest::xrc_srq)): that SRQ's receive, completion
//! queue and PD serve the request, whichever target of the domain it came through. So N peers
//! need one SRQ and one target each, not a receive queue per connection.
//!
//! Ownership: the domain lives as long as anything in it. An [`XrcSrq`] and a target [`Qp`]
//! each hold the domain; dropping the [`XrcDomain`] handle first is fine. A target borrows the
//! SRQ a request names only for that request: dropping an SRQ a peer still names makes its
//! next request an invalid request (`REM_INV_REQ_ERR` at the peer), as on a device.

use core::ops::Range;
use std::sync::Arc;

use uroce_engine::{Access, QKey, QpInitAttr, QpType, RecvWr, SrqHandle, XrcdHandle};

use crate::{Context, Cq, Mr, Pd, Qp, Result};

/// The engine's domain, freed when its last holder goes.
#[derive(Debug)]
pub(crate) struct DomainInner {
    ctx: Context,
    handle: XrcdHandle,
}

impl Drop for DomainInner {
    fn drop(&mut self) {
        // Every SRQ and target holds this, so nothing is in the domain any more.
        let h = self.handle;
        let _ = self.ctx.dev.with(|s| s.engine().dealloc_xrcd(h));
    }
}

/// An XRC domain (`ibv_open_xrcd(3)`).
#[derive(Debug, Clone)]
pub struct XrcDomain {
    inner: Arc<DomainInner>,
}

/// An XRC SRQ (`ibv_create_srq_ex(3)` with `IBV_SRQT_XRC`): receives for requests that name
/// its [`XrcSrq::number`], completed on its CQ, checked against its PD.
#[derive(Debug)]
pub struct XrcSrq {
    domain: Arc<DomainInner>,
    handle: SrqHandle,
    _pd: Arc<crate::PdLife>,
}

impl Context {
    /// A new XRC domain on this device.
    pub fn xrc_domain(&self) -> XrcDomain {
        let handle = self.dev.with(|s| s.engine().alloc_xrcd());
        XrcDomain { inner: Arc::new(DomainInner { ctx: self.clone(), handle }) }
    }
}

impl XrcDomain {
    /// An XRC SRQ of up to `max_wr` receives in this domain: requests that name it are
    /// checked against `pd` (its regions are theirs) and complete on `cq`.
    pub fn create_srq(&self, pd: &Pd, cq: &Cq, max_wr: u32) -> Result<XrcSrq> {
        let (x, pdh, cq) = (self.inner.handle, pd.handle, cq.handle);
        let handle =
            self.inner.ctx.dev.with(|s| s.engine().create_xrc_srq(pdh, x, cq, max_wr, 4))?;
        Ok(XrcSrq { domain: Arc::clone(&self.inner), handle, _pd: Arc::clone(&pd.life) })
    }

    /// A target QP of this domain (`IBV_QPT_XRC_RECV`), in Init, serving `access` to the
    /// SRQs' regions; connect it to one peer initiator with [`Qp::connect`]. It has no queues
    /// of its own: posting to it fails.
    pub fn target(&self, access: Access) -> Result<Qp> {
        let ctx = &self.inner.ctx;
        let (qpn, psn, mtu) = ctx.dev.with(|s| -> Result<_> {
            let e = s.engine();
            let qpn = e.create_qp(QpInitAttr::xrc_target(self.inner.handle))?;
            let psn = e.random_psn();
            e.init_qp(qpn, access, QKey(0))?;
            Ok((qpn, psn, e.port_mtu()))
        })?;
        let mut qp = Qp::unconnected(ctx.clone(), qpn, QpType::XrcTgt, psn, mtu);
        qp.domain = Some(Arc::clone(&self.inner));
        Ok(qp)
    }
}

impl XrcSrq {
    /// The number initiators name ([`SendRequest::xrc_srq`](crate::SendRequest::xrc_srq);
    /// `ibv_get_srq_num(3)`).
    pub fn number(&self) -> u32 {
        self.handle.get()
    }

    /// Posts a receive of `range` of `mr`.
    pub fn post_recv(&self, wr_id: u64, mr: &Mr, range: Range<usize>) -> Result<()> {
        let wr = RecvWr { wr_id, sg_list: [mr.sge(range)?].into() };
        self.domain.ctx.dev.post_recv_with(|s| s.engine().post_srq_recv(self.handle, wr))?;
        Ok(())
    }
}

impl Drop for XrcSrq {
    fn drop(&mut self) {
        let h = self.handle;
        let _ = self.domain.ctx.dev.with(|s| s.engine().destroy_srq(h));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

    use uroce_engine::{Access, DestroyError, QpType};

    use crate::{Context, Options};

    /// Handles may go in any order: the engine's PD, SRQ and domain go with their last holder.
    #[test]
    fn objects_outlive_their_handles_and_go_with_their_last_holder() {
        let options = Options { no_progress_thread: true, ..Options::default() };
        let ctx = Context::open_with("127.0.34.2".parse().unwrap(), options).unwrap();
        let cq = ctx.create_cq(8).unwrap();
        let pd = ctx.alloc_pd();
        let number = pd.handle.get();
        let srq = pd.create_srq(4).unwrap();
        let srqn = srq.handle;
        let mr = pd.register(4096, Access::LOCAL_WRITE).unwrap();
        let qp = pd.qp(QpType::Rc, &cq).srq(&srq).build().unwrap();
        let domain = ctx.xrc_domain();
        let xrcd = domain.inner.handle;
        let xsrq = domain.create_srq(&pd, &cq, 4).unwrap();
        let target = domain.target(Access::REMOTE_WRITE).unwrap();
        let live = |ctx: &Context| {
            ctx.dev.with(|s| {
                let e = s.engine();
                (e.pd_of_number(number).is_some(), e.srq_limit(srqn).is_some())
            })
        };
        drop((pd, srq, domain));
        assert_eq!(live(&ctx), (true, true), "the QP, region and XRC SRQ hold them");
        let domain_probe = |ctx: &Context| ctx.dev.with(|s| s.engine().dealloc_xrcd(xrcd));
        assert_eq!(domain_probe(&ctx), Err(DestroyError::InUse), "its SRQ and target hold it");
        drop(qp);
        assert_eq!(live(&ctx), (true, false), "the SRQ went with the QP");
        drop((mr, xsrq, target));
        assert_eq!(live(&ctx), (false, false), "the PD went with the last holder");
        assert_eq!(domain_probe(&ctx), Err(DestroyError::Unknown), "and the domain with its");
    }
}
