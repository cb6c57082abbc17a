//! Tag matching (rdma-core `Documentation/tag_matching.md`): TM-SRQs
//! (`ibv_create_srq_ex(3)` with `IBV_SRQT_TM`), their tag operations (`ibv_post_srq_ops(3)`)
//! and the device's capabilities (`tm_caps` of `ibv_query_device_ex(3)`). The matching itself
//! is the engine's (`uroce_engine::tm`); completions carry their tags through
//! `ibv_wc_read_tm_info` (cq_ex.rs).

use uroce_engine::tm::{self as engine_tm, TagOp, TagOpError, TagOpKind};

use super::*;

// A completion's status goes to C as the engine's number: the tag-matching ones must be
// `enum ibv_wc_status`'s (checked against the header in abi.rs).
const _: () = assert!(
    uroce_engine::WcStatus::TM_ERR.0 == IBV_WC_TM_ERR.cast_unsigned()
        && uroce_engine::WcStatus::TM_RNDV_INCOMPLETE.0
            == IBV_WC_TM_RNDV_INCOMPLETE.cast_unsigned()
);

/// `tm_caps` of `ibv_query_device_ex(3)`: RC tag matching, the engine's limits.
pub(super) fn tm_caps() -> IbvTmCaps {
    IbvTmCaps {
        max_rndv_hdr_size: engine_tm::MAX_RNDV_HDR_SIZE,
        max_num_tags: engine_tm::MAX_NUM_TAGS,
        flags: IBV_TM_CAP_RC,
        max_ops: engine_tm::MAX_OPS,
        max_sge: engine_tm::MAX_TAG_SGE,
    }
}

/// A TM-SRQ (`ibv_create_srq_ex` with `IBV_SRQT_TM`) in `pd`: it needs the CQ its receives
/// and tag operations complete on, and `tm_cap` within `tm_caps`.
///
/// # Safety
///
/// `pd` is the live PD `pdh` of `ctx`; `a` the caller's attributes.
pub(super) unsafe fn create_tm_srq(
    ctx: &Context,
    pd: *mut IbvPd,
    pdh: PdHandle,
    a: &mut IbvSrqInitAttrEx,
) -> *mut IbvSrq {
    const VERB: &str = "ibv_create_srq_ex";
    let need = IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
    if a.comp_mask & need != need {
        return fail(refuse(VERB, "a TM-SRQ needs a CQ and tm_cap", libc::EINVAL));
    }
    // SAFETY: NULL or the caller's CQ.
    let Some((cctx, cq)) = (unsafe { cq_parts(a.cq) }) else { return fail(libc::EINVAL) };
    if !ptr::eq(cctx, ctx) {
        return fail(refuse(VERB, "the CQ is another context's", libc::EINVAL));
    }
    let IbvTmCap { max_num_tags, max_ops } = a.tm_cap;
    create_sized_srq(ctx, pd, a, |max_wr, max_sge| {
        ctx.net.with(|s| s.engine().create_tm_srq(pdh, cq, max_wr, max_sge, max_num_tags, max_ops))
    })
}

/// `verbs_context.post_srq_ops` (`ibv_post_srq_ops(3)`): tag operations on a TM-SRQ, in
/// order, stopping at the first refused (named in `bad_op`). An ADD's handle is written to
/// its `tm.handle`.
pub(super) unsafe extern "C" fn post_srq_ops(
    srq: *mut IbvSrq,
    op: *mut IbvOpsWr,
    bad_op: *mut *mut IbvOpsWr,
) -> c_int {
    const VERB: &str = "ibv_post_srq_ops";
    let refused = |cur: *mut IbvOpsWr, errno: c_int| {
        if !bad_op.is_null() {
            // SAFETY: the caller passes room for the failed operation's pointer.
            unsafe { bad_op.write(cur) };
        }
        errno
    };
    // SAFETY: the caller passes an SRQ it created.
    let Some((ctx, s)) = (unsafe { srq_parts(srq) }) else { return refused(op, libc::EINVAL) };
    let mut cur = op;
    while !cur.is_null() {
        // SAFETY: the caller passes a valid list.
        let wr = unsafe { &mut *cur };
        // SAFETY: `sg_list` holds `num_sge` entries (the caller's contract for an ADD).
        let Some(op) = (unsafe { read_op(wr) }) else {
            return refused(cur, refuse(VERB, format_args!("opcode {}", wr.opcode), libc::EINVAL));
        };
        match ctx.net.with(|st| st.engine().post_srq_op(s.handle, &op)) {
            Ok(Some(handle)) => wr.tm.handle = handle,
            Ok(None) => {}
            Err(e) => {
                let errno = match e {
                    TagOpError::ListFull => libc::ENOMEM,
                    TagOpError::UnknownSrq
                    | TagOpError::NotTagMatching
                    | TagOpError::TooManySge
                    | TagOpError::UnknownHandle(_) => libc::EINVAL,
                };
                return refused(cur, refuse(VERB, e, errno));
            }
        }
        cur = wr.next;
    }
    0
}

/// The engine's form of a C tag operation; `None` for an unknown opcode or a bad list.
///
/// # Safety
///
/// For an ADD, `wr.tm.add.sg_list` holds `num_sge` entries.
unsafe fn read_op(wr: &IbvOpsWr) -> Option<TagOp> {
    let kind = match wr.opcode {
        IBV_WR_TAG_ADD => {
            let add = &wr.tm.add;
            // SAFETY: the caller's contract.
            let sg_list = unsafe { read_sges::<Vec<Sge>>(add.sg_list, add.num_sge) }?;
            // An empty element describes no buffer (a message may be empty).
            let sg_list = sg_list.into_iter().filter(|s| s.length > 0).collect();
            TagOpKind::Add { recv_wr_id: add.recv_wr_id, sg_list, tag: add.tag, mask: add.mask }
        }
        IBV_WR_TAG_DEL => TagOpKind::Del { handle: wr.tm.handle },
        IBV_WR_TAG_SYNC => TagOpKind::Sync,
        _ => return None,
    };
    Some(TagOp {
        wr_id: wr.wr_id,
        kind,
        signaled: wr.flags & IBV_OPS_SIGNALED != 0,
        sync: wr.flags & IBV_OPS_TM_SYNC != 0,
        unexpected_cnt: wr.tm.unexpected_cnt,
    })
}
