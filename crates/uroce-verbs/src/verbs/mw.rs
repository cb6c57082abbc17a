//! Memory windows (`ibv_alloc_mw(3)`, `ibv_bind_mw(3)`, `ibv_dealloc_mw`; IBA 10.6.7): type 1,
//! bound by `ibv_bind_mw` for every QP of the PD, and type 2B, bound by an `IBV_WR_BIND_MW`
//! work request to the QP that posts it and freed by `IBV_WR_LOCAL_INV` or a peer's SEND with
//! invalidate. The rules themselves are the engine's memory table's.

use super::*;

#[repr(C)]
pub(super) struct Mw {
    pub(super) ibv: IbvMw,
    pub(super) handle: MwHandle,
}

/// `ibv_context.ops.alloc_mw`: a window of `pd`, unbound. EINVAL for a type that is neither 1
/// nor 2 (rdma-core's test expects a device to refuse type 3 so).
pub(super) unsafe extern "C" fn alloc_mw(pd: *mut IbvPd, mw_type: c_int) -> *mut IbvMw {
    // SAFETY: the caller passes a PD it allocated.
    let Some((ctx, pdh)) = (unsafe { pd_parts(pd) }) else { return fail(libc::EINVAL) };
    let kind = match mw_type {
        IBV_MW_TYPE_1 => MwType::Type1,
        IBV_MW_TYPE_2 => MwType::Type2,
        t => return fail(refuse("ibv_alloc_mw", format_args!("type {t}: 1 or 2"), libc::EINVAL)),
    };
    let (handle, rkey) = match ctx.net.with(|s| s.engine().alloc_mw(pdh, kind)) {
        Ok(w) => w,
        Err(e) => return fail(refuse("ibv_alloc_mw", e, libc::EINVAL)),
    };
    let ibv = IbvMw { context: ctx_ptr(ctx), pd, rkey: rkey.0, handle: handle.0, mw_type };
    Box::new(Mw { ibv, handle }).into_c()
}

/// `ibv_context.ops.dealloc_mw`: the window's key stops working at once, bound or not.
pub(super) unsafe extern "C" fn dealloc_mw(mw: *mut IbvMw) -> c_int {
    // SAFETY: made by `ibv_alloc_mw`; deallocating is the caller's last use.
    let Some(boxed) = (unsafe { Mw::take(mw) }) else { return libc::EINVAL };
    // SAFETY: a window's context outlives it.
    if let Some(ctx) = unsafe { ctx_of(boxed.ibv.context) } {
        let _ = ctx.net.with(|s| s.engine().dealloc_mw(boxed.handle));
    }
    0
}

/// The engine's binding of window `mw` to `info` under key `rkey`: (errno, why) for what the
/// verbs refuse at post time. The window grants `info`'s remote rights; local write means
/// nothing for a window and is ignored (as providers do); a zero-based window is refused.
///
/// # Safety
///
/// `mw` is NULL or a live window of this library; `info.mr` NULL or a live region of it.
pub(super) unsafe fn binding(
    mw: *mut IbvMw,
    rkey: u32,
    info: &IbvMwBindInfo,
) -> Result<MwBind, (c_int, &'static str)> {
    // SAFETY: the caller's contract.
    let w = Mw::from_c(mw).map(|w| unsafe { (*w).handle }).ok_or((libc::EINVAL, "no window"))?;
    let flags = info.mw_access_flags.cast_signed();
    if flags & IBV_ACCESS_ZERO_BASED != 0 {
        return Err((libc::EINVAL, "zero-based windows are not supported"));
    }
    let remote = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    if flags & !(remote | IBV_ACCESS_LOCAL_WRITE) != 0 {
        return Err((libc::EINVAL, "a window grants remote read, write and atomic only"));
    }
    // SAFETY: the caller's contract: NULL or a live region (its lkey is a plain field).
    let mr = Mr::from_c(info.mr).map_or(LKey(0), |m| unsafe { (*m).lkey });
    Ok(MwBind {
        mw: w,
        rkey: RKey(rkey),
        mr,
        addr: info.addr,
        length: info.length,
        access: Access::from_bits((flags & remote).cast_unsigned()),
    })
}

/// `ibv_context.ops.bind_mw` (`ibv_bind_mw(3)`, type 1; the header's wrapper has checked the
/// type and the PD): posts the bind on `qp`'s send queue under the window's next key
/// (`ibv_inc_rkey`), which it stores in `mw->rkey` at once, as providers do; the bind takes
/// effect in queue order and reports failure as an `IBV_WC_MW_BIND_ERR` completion.
pub(super) unsafe extern "C" fn bind_mw(
    qp: *mut IbvQp,
    mw: *mut IbvMw,
    mw_bind: *mut IbvMwBind,
) -> c_int {
    // SAFETY: the caller passes a QP it created.
    let Some((ctx, q)) = (unsafe { qp_parts(qp) }) else { return libc::EINVAL };
    if mw.is_null() || mw_bind.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live window (the caller's contract; checked non-NULL); a plain field.
    let old = unsafe { (*mw).rkey };
    // SAFETY: the caller's bind request (checked non-NULL).
    let b = unsafe { mw_bind.read() };
    let next = (old & !0xff) | (old.wrapping_add(1) & 0xff);
    // SAFETY: as above; a live window and, if not NULL, a live region.
    let bind = match unsafe { binding(mw, next, &b.bind_info) } {
        Ok(bind) => bind,
        Err((errno, why)) => return refuse("ibv_bind_mw", why, errno),
    };
    let mut wr = SendWr::new(b.wr_id, WrOpcode::BindMw, SgList::new());
    wr.flags = send_flags(b.send_flags);
    wr.bind = Some(Box::new(bind));
    match ctx.net.post_with(q.qpn, |s| s.engine().post_send(q.qpn, wr)) {
        Ok(()) => {
            // SAFETY: a live window; the consumer reads its key after the call.
            unsafe { (*mw).rkey = next };
            0
        }
        Err(e) => refuse("ibv_bind_mw", format_args!("QP {:#x}: {e}", q.qpn.get()), post_errno(e)),
    }
}
