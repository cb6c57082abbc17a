//! Send work requests with everything `ibv_post_send(3)` offers: any operation, several
//! gather/scatter elements, immediate data, inline data, fences, solicited events and
//! selective signaling, and lists of requests posted at once.
//!
//! A [`SendRequest`] names local memory through [`Mr`]s (each element checked against its
//! region when added) and remote memory through one type, [`RemoteAddr`] (a [`RemoteMr`]
//! converts to the address of its first byte).

use core::ops::Range;

use uroce_engine::{
    Access, MwBind, QKey, Qpn, RKey, RemoteAddr, SendFlags, SendWr, UdDest, WrOpcode,
};

use crate::{Ah, Error, Mr, Mw, RemoteMr, Result};

impl From<RemoteMr> for RemoteAddr {
    /// The region's first byte.
    fn from(r: RemoteMr) -> Self {
        r.at(0)
    }
}

/// One send work request (`struct ibv_send_wr`), built from its operation. Signaled unless
/// [`SendRequest::unsignaled`] says otherwise; an unsignaled request completes only on error,
/// and only on a QP built with [`crate::QpBuilder::selective_signaling`] (otherwise every
/// request completes: `sq_sig_all`, `ibv_create_qp(3)`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a request does nothing until it is posted"]
pub struct SendRequest {
    pub(crate) wr: SendWr,
}

impl SendRequest {
    fn of(wr_id: u64, opcode: WrOpcode) -> Self {
        Self { wr: SendWr::new(wr_id, opcode, Vec::new()) }
    }

    fn at(mut self, remote: impl Into<RemoteAddr>) -> Self {
        self.wr.remote = Some(remote.into());
        self
    }

    /// Binds `mw` to `range` of `mr` with the remote rights `access` (`IBV_WR_BIND_MW`;
    /// IBA 10.6.7.2), in send-queue order. Returns the request and the key the window has once
    /// the bind completes: give the peer that key (with [`RemoteAddr`]s inside the range)
    /// after the completion. A bind that breaks a rule completes with `MW_BIND_ERR` and the QP
    /// in Error: `mr` without [`Access::MW_BIND`], write or atomic rights over a region
    /// without local write, a type 2 window still bound. An empty `range` unbinds a type 1
    /// window.
    pub fn bind_mw(
        wr_id: u64,
        mw: &Mw,
        mr: &Mr,
        range: Range<usize>,
        access: Access,
    ) -> Result<(Self, RKey)> {
        if range.start > range.end || range.end > mr.len() {
            return Err(Error::OutOfRange { range, len: mr.len() });
        }
        let old = mw.rkey();
        let rkey = RKey((old.0 & !0xff) | (old.0.wrapping_add(1) & 0xff));
        let bind = MwBind {
            mw: mw.handle,
            rkey,
            mr: mr.lkey(),
            addr: mr.addr() + range.start as u64,
            length: (range.end - range.start) as u64,
            access,
        };
        let mut r = Self::of(wr_id, WrOpcode::BindMw);
        r.wr.bind = Some(Box::new(bind));
        Ok((r, rkey))
    }

    /// Invalidates the type 2 window `rkey` names, here, in send-queue order
    /// (`IBV_WR_LOCAL_INV`; IBA 10.6.7.2.6): from then on it reaches nothing.
    pub fn local_invalidate(wr_id: u64, rkey: RKey) -> Self {
        let mut r = Self::of(wr_id, WrOpcode::LocalInv);
        r.wr.invalidate_rkey = Some(rkey);
        r
    }

    /// A SEND that invalidates the peer's type 2 window `rkey` before its receive completes
    /// (`IBV_WR_SEND_WITH_INV`; RC only): the receive's completion names the key in
    /// [`crate::WorkCompletion::invalidated_rkey`].
    pub fn send_with_invalidate(wr_id: u64, rkey: RKey) -> Self {
        let mut r = Self::of(wr_id, WrOpcode::SendWithInv);
        r.wr.invalidate_rkey = Some(rkey);
        r
    }

    /// A SEND (`IBV_WR_SEND`): the peer's next receive takes it.
    pub fn send(wr_id: u64) -> Self {
        Self::of(wr_id, WrOpcode::Send)
    }

    /// A SEND with immediate data (`IBV_WR_SEND_WITH_IMM`), which the receiver's completion
    /// carries.
    pub fn send_with_imm(wr_id: u64, imm: u32) -> Self {
        let mut r = Self::of(wr_id, WrOpcode::SendWithImm);
        r.wr.imm = Some(imm.to_be_bytes());
        r
    }

    /// An RDMA WRITE to `remote` (`IBV_WR_RDMA_WRITE`).
    pub fn write(wr_id: u64, remote: impl Into<RemoteAddr>) -> Self {
        Self::of(wr_id, WrOpcode::RdmaWrite).at(remote)
    }

    /// An RDMA WRITE with immediate data (`IBV_WR_RDMA_WRITE_WITH_IMM`): it consumes a receive
    /// at the peer, whose completion carries `imm`.
    pub fn write_with_imm(wr_id: u64, remote: impl Into<RemoteAddr>, imm: u32) -> Self {
        let mut r = Self::of(wr_id, WrOpcode::RdmaWriteWithImm).at(remote);
        r.wr.imm = Some(imm.to_be_bytes());
        r
    }

    /// An RDMA READ from `remote` into the request's elements (`IBV_WR_RDMA_READ`).
    pub fn read(wr_id: u64, remote: impl Into<RemoteAddr>) -> Self {
        Self::of(wr_id, WrOpcode::RdmaRead).at(remote)
    }

    /// Atomic fetch-and-add of `add` on the 8 bytes at `remote`; the old value lands in the
    /// request's one 8-byte element (`IBV_WR_ATOMIC_FETCH_AND_ADD`).
    pub fn fetch_add(wr_id: u64, remote: impl Into<RemoteAddr>, add: u64) -> Self {
        let mut r = Self::of(wr_id, WrOpcode::AtomicFetchAndAdd).at(remote);
        r.wr.compare_add = add;
        r
    }

    /// Atomic compare-and-swap on the 8 bytes at `remote`: `swap` is written if they equal
    /// `compare`; the old value lands in the request's one 8-byte element
    /// (`IBV_WR_ATOMIC_CMP_AND_SWP`).
    pub fn compare_swap(
        wr_id: u64,
        remote: impl Into<RemoteAddr>,
        compare: u64,
        swap: u64,
    ) -> Self {
        let mut r = Self::of(wr_id, WrOpcode::AtomicCmpAndSwp).at(remote);
        (r.wr.compare_add, r.wr.swap) = (compare, swap);
        r
    }

    /// Adds `range` of `mr` as the next gather (SEND, WRITE) or scatter (READ, atomics)
    /// element; fails if the range is outside the region.
    pub fn sge(mut self, mr: &Mr, range: Range<usize>) -> Result<Self> {
        self.wr.sg_list.push(mr.sge(range)?);
        Ok(self)
    }

    /// Sends `data` inline (`IBV_SEND_INLINE`): copied when posted, so the buffer may be
    /// reused at once; the elements are then ignored. At most the QP's `max_inline` bytes.
    pub fn inline(mut self, data: &[u8]) -> Self {
        self.wr.inline_data = Some(data.to_vec());
        self
    }

    /// UD: the datagram goes to QP `qpn` (or [`Qpn::MULTICAST`]) behind `ah`, with `qkey`.
    pub fn to(mut self, ah: &Ah, qpn: Qpn, qkey: QKey) -> Self {
        self.wr.ud = Some(UdDest { ah: ah.handle, remote_qpn: qpn, remote_qkey: qkey });
        self
    }

    /// XRC initiator: the XRC SRQ at the target that takes the request
    /// ([`crate::XrcSrq::number`]; `wr.qp_type.xrc.remote_srqn`).
    pub fn xrc_srq(mut self, number: u32) -> Self {
        self.wr.xrc_remote_srqn = number;
        self
    }

    /// No completion on success (`IBV_SEND_SIGNALED` cleared), on a QP built with
    /// selective signaling.
    pub fn unsignaled(mut self) -> Self {
        self.wr.flags = self.wr.flags.without(SendFlags::SIGNALED);
        self
    }

    /// Waits for every earlier READ and atomic of the QP to complete before starting
    /// (`IBV_SEND_FENCE`).
    pub fn fence(mut self) -> Self {
        self.wr.flags = self.wr.flags | SendFlags::FENCE;
        self
    }

    /// Sets the solicited-event bit (`IBV_SEND_SOLICITED`): a peer waiting for solicited
    /// completions only (`ibv_req_notify_cq(cq, 1)`) wakes for this message.
    pub fn solicited(mut self) -> Self {
        self.wr.flags = self.wr.flags | SendFlags::SOLICITED;
        self
    }

    /// The `wr_id` its completion returns.
    pub fn wr_id(&self) -> u64 {
        self.wr.wr_id
    }
}
