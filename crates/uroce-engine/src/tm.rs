//! Tag matching: the TM-SRQ of rdma-core's hardware tag-matching offload
//! (`Documentation/tag_matching.md`, `ibv_create_srq_ex(3)` with `IBV_SRQT_TM`,
//! `ibv_post_srq_ops(3)`), as a ConnectX does it.
//!
//! Tag-matching messages are ordinary RC SENDs whose payload starts with a tag-matching
//! header (TMH: opcode, 3 reserved bytes, 32-bit application context, 64-bit tag), and for a
//! rendezvous request a rendezvous header (RVH: address, key and length of the sender's
//! buffer). At a TM-SRQ each new message is classified once, at its first packet:
//! - a tagged message (EAGER or RNDV) that matches a posted tag, while the device and the
//!   consumer agree on the count of unexpected messages, is *expected*: an eager payload goes
//!   straight to the tag's buffer without its TMH; a rendezvous request makes the device READ
//!   the sender's buffer into the tag's buffer over the same QP and then SEND a FIN back;
//! - any other tagged message is *unexpected*: delivered whole (headers included) to an
//!   ordinary SRQ buffer, counted, and matching stays off until the consumer reports the new
//!   count (`IBV_OPS_TM_SYNC`), since it must match that message in software before any
//!   later one is matched here (MPI's ordering rule);
//! - NO_TAG messages go whole to an ordinary buffer (`IBV_WC_TM_NO_TAG`) and are not counted;
//!   anything else (a FIN, an unknown opcode, a message shorter than a TMH) is an ordinary
//!   receive.
//!
//! Tag operations (add, delete, sync) are executed when posted; a signaled one completes on
//! the SRQ's CQ at once, flagged `IBV_WC_TM_SYNC_REQ` while the counts disagree.

use std::collections::VecDeque;
use std::fmt;

use uroce_wire::{Qpn, RKey};

use crate::ctx::Ctx;
use crate::device::Device;
use crate::errors::{CreateError, within};
use crate::memory::MemoryAccess;
use crate::qp::{InMessage, Qp, RecvWqe, SendWqe};
use crate::sg::{ScatterError, scatter};
use crate::types::{
    CqHandle, PdHandle, RemoteAddr, SendFlags, SendWr, SgList, Sge, SrqHandle, TmFlags, TmInfo,
    WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

/// Tags one TM-SRQ can hold (`tm_caps.max_num_tags`).
pub const MAX_NUM_TAGS: u32 = 1024;
/// Outstanding tag operations a TM-SRQ allows (`tm_caps.max_ops`); operations are carried out
/// when posted, so none is ever outstanding.
pub const MAX_OPS: u32 = 1024;
/// Scatter/gather elements of a tagged buffer (`tm_caps.max_sge`).
pub const MAX_TAG_SGE: u32 = 1;
/// The longest rendezvous request the device handles itself: TMH, RVH and up to 32 bytes of
/// the sender's own (`tm_caps.max_rndv_hdr_size`).
pub const MAX_RNDV_HDR_SIZE: u32 = 64;
/// Bytes of the TMH (`struct ibv_tmh`).
pub const TMH_LEN: usize = 16;
/// Bytes of the RVH (`struct ibv_rvh`).
pub const RVH_LEN: usize = 16;

/// TMH opcodes (`enum ibv_tmh_op`, `infiniband/tm_types.h`).
pub mod tmh_op {
    /// A message without a tag: never matched.
    pub const NO_TAG: u8 = 0;
    /// A rendezvous request: TMH, RVH, optional data.
    pub const RNDV: u8 = 1;
    /// The end of a rendezvous: the request's TMH and RVH, this opcode in front.
    pub const FIN: u8 = 2;
    /// An eager message: TMH, payload.
    pub const EAGER: u8 = 3;
}

/// A tag operation (`struct ibv_ops_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagOp {
    /// Returned in the operation's completion.
    pub wr_id: u64,
    /// What to do.
    pub kind: TagOpKind,
    /// `IBV_OPS_SIGNALED`: complete on the SRQ's CQ.
    pub signaled: bool,
    /// `IBV_OPS_TM_SYNC`: `unexpected_cnt` is the consumer's count of unexpected messages.
    pub sync: bool,
    /// Unexpected messages the consumer has handled (read when `sync`).
    pub unexpected_cnt: u32,
}

/// The operation of a [`TagOp`] (`enum ibv_ops_wr_opcode`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagOpKind {
    /// `IBV_WR_TAG_ADD`: a tagged buffer that takes the first message whose tag equals `tag`
    /// in the bits of `mask`; its receive completions carry `recv_wr_id`.
    Add {
        /// `tm.add.recv_wr_id`.
        recv_wr_id: u64,
        /// The buffer (at most [`MAX_TAG_SGE`] elements; none for an empty message).
        sg_list: Vec<Sge>,
        /// The tag.
        tag: u64,
        /// The bits of the tag that must match.
        mask: u64,
    },
    /// `IBV_WR_TAG_DEL`: removes the tag `handle` (fails with `IBV_WC_TM_ERR` if a message
    /// took it meanwhile).
    Del {
        /// The handle its ADD returned.
        handle: u32,
    },
    /// `IBV_WR_TAG_SYNC`: only reports the count.
    Sync,
}

/// A tag operation refused at post time (`ibv_post_srq_ops` returns its errno).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagOpError {
    /// No such SRQ.
    UnknownSrq,
    /// The SRQ is not a TM-SRQ.
    NotTagMatching,
    /// The SRQ already holds `max_num_tags` tags.
    ListFull,
    /// A tagged buffer of more than [`MAX_TAG_SGE`] elements.
    TooManySge,
    /// DEL of a handle no ADD returned, or already deleted.
    UnknownHandle(u32),
}

impl fmt::Display for TagOpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownSrq => f.write_str("no such shared receive queue"),
            Self::NotTagMatching => f.write_str("the SRQ is not a tag-matching SRQ"),
            Self::ListFull => f.write_str("the tag list is full (max_num_tags)"),
            Self::TooManySge => f.write_str("a tagged buffer has at most one element"),
            Self::UnknownHandle(h) => write!(f, "no tag with handle {h}"),
        }
    }
}

impl std::error::Error for TagOpError {}

/// A posted tag.
#[derive(Debug)]
struct TagEntry {
    tag: u64,
    mask: u64,
    recv_wr_id: u64,
    sg_list: Vec<Sge>,
    /// A message took it; the handle stays taken until that message's last completion.
    consumed: bool,
}

/// The tag-matching state of a TM-SRQ.
#[derive(Debug)]
pub(crate) struct TagMatching {
    /// The CQ every receive and operation of the SRQ completes on.
    pub(crate) cq: CqHandle,
    max_num_tags: u32,
    /// Tags by handle.
    entries: Vec<Option<TagEntry>>,
    /// Handles of the tags that can still match, in the order they were added.
    order: VecDeque<u32>,
    /// Messages the device deemed unexpected (wrapping).
    unexpected: u32,
    /// The consumer's count, as last reported with `IBV_OPS_TM_SYNC`.
    reported: u32,
}

/// How the message a QP is receiving was classified at its first packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// An ordinary receive (`IBV_WC_RECV`), into a WQE of the SRQ.
    Plain,
    /// A NO_TAG message, whole, into a WQE of the SRQ.
    NoTag,
    /// A tagged message no posted tag took, whole, into a WQE of the SRQ.
    Unexpected,
    /// An eager message into the buffer of tag `handle`, without its TMH.
    Expected { handle: u32, info: Tag },
}

/// What a matched message's completions report of its TMH (`struct ibv_wc_tm_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tag {
    pub(crate) tag: u64,
    pub(crate) app_ctx: u32,
}

/// A matched rendezvous request the device carries out: it READs the sender's buffer into
/// the tag's, completes the tag, and SENDs a FIN back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rendezvous {
    pub(crate) srq: SrqHandle,
    pub(crate) handle: u32,
    pub(crate) recv_wr_id: u64,
    pub(crate) info: Tag,
    /// The request's TMH and RVH, which the FIN repeats with its own opcode.
    pub(crate) headers: [u8; TMH_LEN + RVH_LEN],
    /// The sender's buffer (the RVH).
    pub(crate) va: u64,
    pub(crate) rkey: u32,
    pub(crate) len: u32,
}

/// A send WQE the device queued on a QP for itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeviceOp {
    /// The READ of a rendezvous.
    RendezvousRead(Rendezvous),
    /// The FIN that ends one.
    RendezvousFin,
}

/// The parsed start of a tag-matching message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Header {
    /// Too short for a TMH, or an opcode that is not matched (FIN, unknown).
    Other,
    NoTag,
    /// A tagged message the device does not match (a rendezvous request that is not whole
    /// in one packet or is longer than `max_rndv_hdr_size`): unexpected, for software.
    ForSoftware,
    Eager(Tag),
    Rndv {
        info: Tag,
        va: u64,
        rkey: u32,
        len: u32,
        headers: [u8; TMH_LEN + RVH_LEN],
    },
}

impl Header {
    /// Reads the TMH (and RVH) at the start of a message's first packet; `whole` is whether
    /// that packet is the whole message.
    pub(crate) fn parse(payload: &[u8], whole: bool) -> Self {
        let Some(tmh) = payload.get(..TMH_LEN) else { return Self::Other };
        let word = |r: std::ops::Range<usize>| tmh.get(r).unwrap_or(&[]);
        let info = Tag {
            tag: u64::from_be_bytes(word(8..16).try_into().unwrap_or([0; 8])),
            app_ctx: u32::from_be_bytes(word(4..8).try_into().unwrap_or([0; 4])),
        };
        match tmh[0] {
            tmh_op::NO_TAG => Self::NoTag,
            tmh_op::EAGER => Self::Eager(info),
            // The device handles a rendezvous request only whole and within
            // max_rndv_hdr_size; a longer one is left to software as unexpected.
            tmh_op::RNDV if whole && payload.len() <= MAX_RNDV_HDR_SIZE as usize => {
                let Some(rvh) = payload.get(TMH_LEN..TMH_LEN + RVH_LEN) else {
                    return Self::ForSoftware;
                };
                let mut headers = [0; TMH_LEN + RVH_LEN];
                headers.copy_from_slice(&payload[..TMH_LEN + RVH_LEN]);
                Self::Rndv {
                    info,
                    va: u64::from_be_bytes(rvh[0..8].try_into().unwrap_or([0; 8])),
                    rkey: u32::from_be_bytes(rvh[8..12].try_into().unwrap_or([0; 4])),
                    len: u32::from_be_bytes(rvh[12..16].try_into().unwrap_or([0; 4])),
                    headers,
                }
            }
            // A rendezvous request the device does not take is still a tagged message:
            // software must see it as unexpected.
            tmh_op::RNDV => Self::ForSoftware,
            _ => Self::Other,
        }
    }
}

impl TagMatching {
    pub(crate) fn new(cq: CqHandle, max_num_tags: u32) -> Self {
        Self {
            cq,
            max_num_tags,
            entries: Vec::new(),
            order: VecDeque::new(),
            unexpected: 0,
            reported: 0,
        }
    }

    /// Matching is on only while the consumer has accounted for every unexpected message.
    fn in_sync(&self) -> bool {
        self.unexpected == self.reported
    }

    /// The posted tag that takes a tagged message, if matching is on: the first in the order
    /// of posting whose masked bits equal the message's (rdma-core `tag_matching.md`:
    /// receives are matched in the order they were posted). The tag is taken.
    pub(crate) fn take_match(&mut self, tag: u64) -> Option<(u32, u64, Vec<Sge>)> {
        if !self.in_sync() {
            return None;
        }
        let at = self.order.iter().position(|&h| {
            self.entries
                .get(h as usize)
                .and_then(Option::as_ref)
                .is_some_and(|e| tag & e.mask == e.tag & e.mask)
        })?;
        let handle = self.order.remove(at)?;
        let e = self.entries.get_mut(handle as usize).and_then(Option::as_mut)?;
        e.consumed = true;
        Some((handle, e.recv_wr_id, e.sg_list.clone()))
    }

    /// A tagged message was delivered unexpected: matching stays off until the consumer
    /// reports this count.
    pub(crate) fn count_unexpected(&mut self) {
        self.unexpected = self.unexpected.wrapping_add(1);
    }

    /// The message that took tag `handle` completed: the handle is free again.
    pub(crate) fn release(&mut self, handle: u32) {
        if let Some(slot) = self.entries.get_mut(handle as usize) {
            *slot = None;
        }
    }

    /// Whether a posted tag (matched or not, until its last completion) names `lkey`.
    pub(crate) fn names_lkey(&self, lkey: crate::types::LKey) -> bool {
        self.entries.iter().flatten().any(|e| e.sg_list.iter().any(|s| s.lkey == lkey))
    }

    /// Whether any tag is posted: a message may still complete into it.
    pub(crate) fn has_tags(&self) -> bool {
        self.entries.iter().any(Option::is_some)
    }

    fn sync_flags(&self) -> TmFlags {
        if self.in_sync() { TmFlags::NONE } else { TmFlags::SYNC_REQ }
    }

    /// Room for a new tag: the lowest free handle.
    fn free_handle(&self) -> Option<u32> {
        let free = self.entries.iter().position(Option::is_none).unwrap_or(self.entries.len());
        u32::try_from(free).ok().filter(|&h| h < self.max_num_tags)
    }
}

/// The completion of a receive at a TM-SRQ: a receive completion of `qp` carrying `tm`.
pub(crate) fn tm_recv_wc(
    qp: &Qp,
    wr_id: u64,
    status: WcStatus,
    byte_len: u32,
    tm: Option<TmInfo>,
) -> WorkCompletion {
    let wc = crate::responder::recv_wc(qp, wr_id, status, WcOpcode::TmRecv, byte_len, None);
    WorkCompletion { tm, ..wc }
}

/// The completion of a tag operation: it belongs to no QP, and carries the SRQ's sync flags.
fn tag_op_wc(wr_id: u64, status: WcStatus, opcode: WcOpcode, tm: TmInfo) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status,
        opcode,
        byte_len: 0,
        imm: None,
        qp_num: Qpn::QP0,
        src_qp: Qpn::QP0,
        grh: false,
        ipv4: false,
        invalidated_rkey: None,
        timestamp: crate::Instant::ZERO,
        tm: Some(tm),
    }
}

/// The tag matching of SRQ `srq`, if it is a TM-SRQ.
pub(crate) fn tag_matching<M>(ctx: &mut Ctx<M>, srq: SrqHandle) -> Option<&mut TagMatching> {
    ctx.srqs.get_mut(&srq.0)?.tm.as_mut()
}

/// A message delivered to (or failed in) a tag's buffer has had its last completion: the
/// tag's handle is free again.
pub(crate) fn delivery_ended<M>(ctx: &mut Ctx<M>, qp: &Qp, delivery: Delivery) {
    if let (Delivery::Expected { handle, .. }, Some(srq)) = (delivery, qp.init.srq)
        && let Some(tm) = tag_matching(ctx, srq)
    {
        tm.release(handle);
    }
}

/// A QP entered Error in the middle of a message: the tag it was filling is free.
pub(crate) fn abandon_message<M>(ctx: &mut Ctx<M>, qp: &Qp, message: &InMessage) {
    if let InMessage::Send { delivery, .. } = message {
        delivery_ended(ctx, qp, *delivery);
    }
}

/// Starts a matched rendezvous request at `qp`: reports the match and queues the READ of
/// the sender's buffer into the tag's (`wqe`). A buffer too small for the data takes the
/// request itself instead and completes `IBV_WC_TM_RNDV_INCOMPLETE`, for software to finish.
pub(crate) fn start_rendezvous<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    request: Rendezvous,
    wqe: RecvWqe,
    payload: &[u8],
) {
    let cq = ctx.recv_cq(qp);
    let info = request.info;
    let matched = Some(TmInfo { tag: info.tag, app_ctx: info.app_ctx, flags: TmFlags::MATCH });
    let room: u64 = wqe.wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
    if u64::from(request.len) > room {
        let status = match scatter(ctx, qp.init.pd, &wqe.wr.sg_list, 0, payload) {
            Ok(()) => WcStatus::TM_RNDV_INCOMPLETE,
            Err(ScatterError::Length) => WcStatus::LOC_LEN_ERR,
            Err(ScatterError::Protection) => WcStatus::LOC_PROT_ERR,
        };
        let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        ctx.complete(cq, tm_recv_wc(qp, request.recv_wr_id, status, len, matched));
        if let Some(tm) = tag_matching(ctx, request.srq) {
            tm.release(request.handle);
        }
        return;
    }
    ctx.complete(cq, tm_recv_wc(qp, request.recv_wr_id, WcStatus::SUCCESS, 0, matched));
    let sg_list = first_bytes(&wqe.wr.sg_list, request.len);
    let wr = SendWr {
        flags: SendFlags::NONE,
        remote: Some(RemoteAddr { addr: request.va, rkey: RKey(request.rkey) }),
        ..SendWr::new(request.recv_wr_id, WrOpcode::RdmaRead, sg_list)
    };
    let len = request.len;
    queue_device_op(qp, ctx, wr, len, DeviceOp::RendezvousRead(request));
}

/// The elements of `sges` that hold its first `len` bytes, the last one cut to fit.
fn first_bytes(sges: &[Sge], len: u32) -> SgList {
    let mut left = len;
    let mut out = SgList::new();
    for sge in sges {
        if left == 0 {
            break;
        }
        let take = sge.length.min(left);
        out.push(Sge { length: take, ..*sge });
        left -= take;
    }
    out
}

/// Queues a send WQE of the device's own at the back of `qp`'s send queue. It is no
/// consumer's: it takes no room of `max_send_wr` and completes to [`device_op_ended`].
fn queue_device_op<M>(qp: &mut Qp, ctx: &mut Ctx<M>, wr: SendWr, len: u32, op: DeviceOp) {
    if qp.state == crate::types::QpState::Error {
        device_op_ended(qp, ctx, op, WcStatus::WR_FLUSH_ERR);
        return;
    }
    let wqe = SendWqe::new(wr, len, qp.mtu.bytes(), false, Some(Box::new(op)));
    qp.req.sq.push_back(wqe);
    if qp.can_send() {
        ctx.schedule(qp);
    }
}

/// A WQE the device queued has completed with `status`. A rendezvous READ that succeeded
/// completes its tag with the data (`IBV_WC_TM_DATA_VALID`) and sends the FIN: the request's
/// TMH and RVH with the FIN opcode (tag_matching.md); one that failed completes its tag with
/// the error. A FIN completes nothing.
pub(crate) fn device_op_ended<M>(qp: &mut Qp, ctx: &mut Ctx<M>, op: DeviceOp, status: WcStatus) {
    let DeviceOp::RendezvousRead(request) = op else { return };
    if let Some(tm) = tag_matching(ctx, request.srq) {
        tm.release(request.handle);
    }
    let cq = ctx.recv_cq(qp);
    let (flags, len) = if status == WcStatus::SUCCESS {
        (TmFlags::DATA_VALID, request.len)
    } else {
        (TmFlags::NONE, 0)
    };
    // The tag was reported with the match; this completion names its buffer by wr_id only
    // (a ConnectX's second completion carries no TMH: rdma-core's test_tm_rndv expects tag 0).
    let tm = Some(TmInfo { tag: 0, app_ctx: 0, flags });
    ctx.complete(cq, tm_recv_wc(qp, request.recv_wr_id, status, len, tm));
    if status != WcStatus::SUCCESS {
        return;
    }
    let mut fin = request.headers.to_vec();
    fin[0] = tmh_op::FIN;
    let wr = SendWr {
        flags: SendFlags::NONE,
        inline_data: Some(fin),
        ..SendWr::new(request.recv_wr_id, WrOpcode::Send, SgList::new())
    };
    let len = u32::try_from(TMH_LEN + RVH_LEN).unwrap_or(0);
    queue_device_op(qp, ctx, wr, len, DeviceOp::RendezvousFin);
}

impl<M: MemoryAccess> Device<M> {
    /// Creates a TM-SRQ (`ibv_create_srq_ex` with `IBV_SRQT_TM`): an SRQ of `pd` whose
    /// receives and tag operations complete on `cq`, holding up to `max_num_tags` tags.
    pub fn create_tm_srq(
        &mut self,
        pd: PdHandle,
        cq: CqHandle,
        max_wr: u32,
        max_sge: u32,
        max_num_tags: u32,
        max_ops: u32,
    ) -> Result<SrqHandle, CreateError> {
        if !self.ctx.cqs.contains_key(&cq.0) {
            return Err(CreateError::UnknownCq);
        }
        within("max_num_tags", u64::from(max_num_tags), u64::from(MAX_NUM_TAGS))?;
        within("max_ops", u64::from(max_ops), u64::from(MAX_OPS))?;
        let h = self.create_srq(pd, max_wr, max_sge)?;
        if let Some(s) = self.ctx.srqs.get_mut(&h.0) {
            s.tm = Some(TagMatching::new(cq, max_num_tags));
        }
        Ok(h)
    }

    /// Posts a tag operation to a TM-SRQ (`ibv_post_srq_ops(3)`); an ADD returns its handle
    /// (`wr->tm.handle`). The operation is carried out at once, so none is ever outstanding
    /// and `max_ops` never binds; a signaled one (or one that fails) completes on the SRQ's CQ.
    pub fn post_srq_op(&mut self, srq: SrqHandle, op: &TagOp) -> Result<Option<u32>, TagOpError> {
        let s = self.ctx.srqs.get_mut(&srq.0).ok_or(TagOpError::UnknownSrq)?;
        let tm = s.tm.as_mut().ok_or(TagOpError::NotTagMatching)?;
        let (opcode, status, handle) = match &op.kind {
            TagOpKind::Add { recv_wr_id, sg_list, tag, mask } => {
                if sg_list.len() > MAX_TAG_SGE as usize {
                    return Err(TagOpError::TooManySge);
                }
                let h = tm.free_handle().ok_or(TagOpError::ListFull)?;
                let entry = TagEntry {
                    tag: *tag,
                    mask: *mask,
                    recv_wr_id: *recv_wr_id,
                    sg_list: sg_list.clone(),
                    consumed: false,
                };
                match tm.entries.get_mut(h as usize) {
                    Some(slot) => *slot = Some(entry),
                    None => tm.entries.push(Some(entry)),
                }
                tm.order.push_back(h);
                (WcOpcode::TmAdd, WcStatus::SUCCESS, Some(h))
            }
            TagOpKind::Del { handle } => {
                let h = *handle;
                let entry = tm.entries.get(h as usize).and_then(Option::as_ref);
                match entry.map(|e| e.consumed) {
                    None => return Err(TagOpError::UnknownHandle(h)),
                    // A tag a message already took cannot be removed: IBV_WC_TM_ERR
                    // (tag_matching.md); its receive completes as usual.
                    Some(true) => (WcOpcode::TmDel, WcStatus::TM_ERR, None),
                    Some(false) => {
                        tm.order.retain(|&o| o != h);
                        tm.release(h);
                        (WcOpcode::TmDel, WcStatus::SUCCESS, None)
                    }
                }
            }
            TagOpKind::Sync => (WcOpcode::TmSync, WcStatus::SUCCESS, None),
        };
        if op.sync {
            tm.reported = op.unexpected_cnt;
        }
        if op.signaled || status != WcStatus::SUCCESS {
            let info = TmInfo { tag: 0, app_ctx: 0, flags: tm.sync_flags() };
            let cq = tm.cq;
            let wc = tag_op_wc(op.wr_id, status, opcode, info);
            self.ctx.complete(cq, wc);
        }
        Ok(handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(tm: &mut TagMatching, tag: u64, mask: u64) -> u32 {
        let h = tm.free_handle().expect("room");
        let entry = TagEntry { tag, mask, recv_wr_id: tag, sg_list: Vec::new(), consumed: false };
        match tm.entries.get_mut(h as usize) {
            Some(slot) => *slot = Some(entry),
            None => tm.entries.push(Some(entry)),
        }
        tm.order.push_back(h);
        h
    }

    #[test]
    fn the_first_posted_tag_whose_masked_bits_agree_takes_the_message() {
        let mut tm = TagMatching::new(CqHandle(1), 8);
        let a = add(&mut tm, 0x10, 0xF0);
        let b = add(&mut tm, 0x15, 0xFF);
        // 0x15 matches both; the earlier-posted wins.
        assert_eq!(tm.take_match(0x15).map(|m| m.0), Some(a));
        assert_eq!(tm.take_match(0x15).map(|m| m.0), Some(b));
        assert_eq!(tm.take_match(0x15), None);
    }

    #[test]
    fn an_unexpected_message_turns_matching_off_until_the_count_is_reported() {
        let mut tm = TagMatching::new(CqHandle(1), 8);
        add(&mut tm, 7, u64::MAX);
        assert_eq!(tm.take_match(8), None);
        tm.count_unexpected();
        // Out of sync: even a matching tag is not taken.
        assert_eq!(tm.take_match(7), None);
        assert_eq!(tm.sync_flags(), TmFlags::SYNC_REQ);
        tm.reported = 1;
        assert_eq!(tm.sync_flags(), TmFlags::NONE);
        assert!(tm.take_match(7).is_some());
    }

    #[test]
    fn handles_are_bounded_and_reused_once_released() {
        let mut tm = TagMatching::new(CqHandle(1), 2);
        let a = add(&mut tm, 1, u64::MAX);
        add(&mut tm, 2, u64::MAX);
        assert_eq!(tm.free_handle(), None);
        assert!(tm.take_match(1).is_some());
        // Taken but not yet completed: the handle is still in use.
        assert_eq!(tm.free_handle(), None);
        tm.release(a);
        assert_eq!(tm.free_handle(), Some(a));
    }

    #[test]
    fn headers_parse_as_tag_matching_md_lays_them_out() {
        let mut p = vec![tmh_op::EAGER, 0, 0, 0, 0, 0, 0, 9];
        p.extend_from_slice(&0x1234u64.to_be_bytes());
        assert_eq!(Header::parse(&p, true), Header::Eager(Tag { tag: 0x1234, app_ctx: 9 }));
        assert_eq!(Header::parse(&p[..15], true), Header::Other);
        p[0] = tmh_op::FIN;
        assert_eq!(Header::parse(&p, true), Header::Other);
        p[0] = tmh_op::NO_TAG;
        assert_eq!(Header::parse(&p, true), Header::NoTag);
        p[0] = tmh_op::RNDV;
        p.extend_from_slice(&0xAAu64.to_be_bytes());
        p.extend_from_slice(&0xBBu32.to_be_bytes());
        p.extend_from_slice(&100u32.to_be_bytes());
        assert!(matches!(
            Header::parse(&p, true),
            Header::Rndv { va: 0xAA, rkey: 0xBB, len: 100, info: Tag { tag: 0x1234, .. }, .. }
        ));
        // Not whole, too long or too short: left to software, as an unexpected message.
        assert_eq!(Header::parse(&p, false), Header::ForSoftware);
        assert_eq!(Header::parse(&p[..20], true), Header::ForSoftware);
        p.resize(MAX_RNDV_HDR_SIZE as usize + 1, 0);
        assert_eq!(Header::parse(&p, true), Header::ForSoftware);
    }
}
