//! Protection domains.

use super::*;

#[repr(C)]
pub(super) struct Pd {
    pub(super) ibv: IbvPd,
    pub(super) handle: PdHandle,
}

/// The context and engine handle of a PD.
///
/// # Safety
///
/// `pd` is NULL or a live PD of this library.
pub(super) unsafe fn pd_parts<'a>(pd: *mut IbvPd) -> Option<(&'a Context, PdHandle)> {
    let pd = Pd::from_c(pd)?;
    // SAFETY: a live Pd (the caller's contract); reads a plain field.
    let c = unsafe { (*pd).ibv.context };
    // SAFETY: as above.
    let h = unsafe { (*pd).handle };
    // SAFETY: a PD's context outlives it.
    Some((unsafe { ctx_of(c) }?, h))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_alloc_pd(context: *mut IbvContext) -> *mut IbvPd {
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return fail(libc::EINVAL) };
    let handle = ctx.net.with(|s| s.engine().alloc_pd());
    let pd = Box::new(Pd { ibv: IbvPd { context, handle: 0 }, handle });
    pd.into_c()
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_dealloc_pd(pd: *mut IbvPd) -> c_int {
    // SAFETY: the caller passes a PD it allocated.
    let Some((ctx, handle)) = (unsafe { pd_parts(pd) }) else { return libc::EINVAL };
    // ibv_dealloc_pd(3) fails while the PD is in use: EBUSY while an MR, QP, SRQ or AH of it
    // lives, as the kernel answers for a PD whose use count is not zero.
    match ctx.net.with(|s| s.engine().dealloc_pd(handle)) {
        Ok(()) => {}
        Err(DestroyError::InUse) => {
            return refuse("ibv_dealloc_pd", "an MR, QP, SRQ or AH still uses the PD", libc::EBUSY);
        }
        Err(DestroyError::Unknown) => return libc::EINVAL,
    }
    // SAFETY: made by `ibv_alloc_pd`; deallocating is the caller's last use.
    drop(unsafe { Pd::take(pd) });
    0
}
