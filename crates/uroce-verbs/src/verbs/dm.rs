//! Device memory (`ibv_alloc_dm(3)`): memory the device owns — here a page-aligned slab the
//! device allocates, outside the application's buffers — reached by the application only
//! through `ibv_memcpy_to_dm`/`ibv_memcpy_from_dm`, and by work requests and peers through a
//! zero-based region (`ibv_reg_dm_mr`: addresses are offsets into the registration).
//!
//! The limit, `max_dm_size`, holds per open device in this process (a ConnectX's is its
//! on-chip memory, shared by the host); copies need 4-byte aligned offsets and lengths, as a
//! ConnectX's do.

use super::*;

/// Device memory each open device offers this process (`max_dm_size`).
pub(super) const MAX_DM_SIZE: u64 = 256 << 10;

/// Copies to and from device memory go in 4-byte units.
const DM_ALIGN: u64 = 4;

#[repr(C)]
pub(super) struct Dm {
    pub(super) ibv: IbvDm,
    pub(super) region: Arc<RawRegion>,
    /// Regions registered in it: `ibv_free_dm` is EBUSY while any remains.
    pub(super) regions: AtomicU32,
}

/// Device memory in use, per context (the context's device): bytes.
fn in_use(ctx: &Context) -> &AtomicU64 {
    &ctx.dm_in_use
}

/// `verbs_context.alloc_dm`: `attr.length` bytes, zeroed; ENOMEM past `max_dm_size`, EINVAL for
/// a `comp_mask` (none is defined) or an alignment beyond a page.
pub(super) unsafe extern "C" fn alloc_dm(
    context: *mut IbvContext,
    attr: *mut IbvAllocDmAttr,
) -> *mut IbvDm {
    const VERB: &str = "ibv_alloc_dm";
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return fail(libc::EINVAL) };
    // SAFETY: NULL or the caller's attributes.
    let Some(a) = (unsafe { attr.as_ref() }) else { return fail(libc::EINVAL) };
    if a.comp_mask != 0 || a.log_align_req > 12 {
        let why = format_args!("comp_mask {:#x}, log_align_req {}", a.comp_mask, a.log_align_req);
        return fail(refuse(VERB, why, libc::EINVAL));
    }
    let len = a.length as u64;
    if len == 0 {
        return fail(refuse(VERB, "length 0", libc::EINVAL));
    }
    let used = in_use(ctx);
    let taken = used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
        u.checked_add(len).filter(|&t| t <= MAX_DM_SIZE)
    });
    if taken.is_err() {
        let why =
            format_args!("{len} bytes: {} of {MAX_DM_SIZE} in use", used.load(Ordering::Acquire));
        return fail(refuse(VERB, why, libc::ENOMEM));
    }
    let region = match RawRegion::new(a.length, false) {
        Ok(r) => Arc::new(r),
        Err(_) => {
            used.fetch_sub(len, Ordering::AcqRel);
            return fail(libc::ENOMEM);
        }
    };
    let mut objects = lock(&ctx.objects);
    objects.next_dm += 1;
    let handle = objects.next_dm;
    let raw = new_dm(context, handle, region);
    objects.dms.insert(handle, raw as usize);
    raw
}

fn new_dm(context: *mut IbvContext, handle: u32, region: Arc<RawRegion>) -> *mut IbvDm {
    let ibv = IbvDm {
        context,
        memcpy_to_dm: Some(memcpy_to_dm),
        memcpy_from_dm: Some(memcpy_from_dm),
        comp_mask: 0,
        handle,
    };
    Box::new(Dm { ibv, region, regions: AtomicU32::new(0) }).into_c()
}

/// Another handle, in `context`, to the memory of `original` (`ibv_import_dm(3)`).
pub(super) fn imported_dm(context: *mut IbvContext, original: &Dm) -> *mut IbvDm {
    new_dm(context, original.ibv.handle, Arc::clone(&original.region))
}

/// `verbs_context.free_dm`: EBUSY while a region is registered in it.
pub(super) unsafe extern "C" fn free_dm(dm: *mut IbvDm) -> c_int {
    // SAFETY: the caller passes device memory it allocated.
    let Some(d) = Dm::from_c(dm).map(|d| unsafe { &*d }) else { return libc::EINVAL };
    if d.regions.load(Ordering::Acquire) != 0 {
        return refuse("ibv_free_dm", "a region is registered in it", libc::EBUSY);
    }
    // SAFETY: a device memory's context outlives it.
    if let Some(ctx) = unsafe { ctx_of(d.ibv.context) } {
        // Counted where it was allocated: freed through an imported handle, the context
        // that holds that handle never counted it.
        let len = d.region.len() as u64;
        let _ = in_use(ctx)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| Some(u.saturating_sub(len)));
        lock(&ctx.objects).dms.remove(&d.ibv.handle);
    }
    // SAFETY: made by `ibv_alloc_dm`; freeing is the caller's last use.
    drop(unsafe { Dm::take(dm) });
    0
}

/// The checks of a copy of `len` bytes at `offset` of `dm` to or from a host buffer: the
/// context, the device memory and the offset in it, or `Ok(None)` for 0 bytes (nothing to
/// do), or EINVAL for a range outside the device memory or not 4-byte aligned, or a NULL
/// host buffer.
///
/// # Safety
///
/// `dm` is NULL or a live device memory of this library.
unsafe fn copy_range<'a>(
    dm: *mut IbvDm,
    offset: u64,
    len: usize,
    host_null: bool,
) -> Result<Option<(&'a Context, &'a Dm, usize)>, c_int> {
    // SAFETY: the caller's contract.
    let d = Dm::from_c(dm).map(|d| unsafe { &*d }).ok_or(libc::EINVAL)?;
    // SAFETY: as above.
    let ctx = unsafe { ctx_of(d.ibv.context) }.ok_or(libc::EINVAL)?;
    let inside = offset.checked_add(len as u64).is_some_and(|end| end <= d.region.len() as u64);
    let aligned = offset.is_multiple_of(DM_ALIGN) && (len as u64).is_multiple_of(DM_ALIGN);
    if !inside || !aligned {
        let why = format_args!("{len} bytes at {offset}: in range and {DM_ALIGN}-byte aligned");
        return Err(refuse("ibv_memcpy_to/from_dm", why, libc::EINVAL));
    }
    if len == 0 {
        return Ok(None);
    }
    if host_null {
        return Err(libc::EINVAL);
    }
    Ok(Some((ctx, d, usize::try_from(offset).unwrap_or(usize::MAX))))
}

/// `ibv_dm.memcpy_to_dm`: under the device's lock, so no work request sees half a copy.
unsafe extern "C" fn memcpy_to_dm(
    dm: *mut IbvDm,
    offset: u64,
    host: *const c_void,
    len: usize,
) -> c_int {
    // SAFETY: the caller passes device memory it allocated.
    let (ctx, d, at) = match unsafe { copy_range(dm, offset, len, host.is_null()) } {
        Ok(Some(r)) => r,
        Ok(None) => return 0,
        Err(e) => return e,
    };
    // SAFETY: the caller's buffer of `len` bytes (ibv_alloc_dm(3)), checked non-NULL.
    let src = unsafe { core::slice::from_raw_parts(host.cast::<u8>(), len) };
    if ctx.net.with(|s| s.write_region(&d.region, at, src)) { 0 } else { libc::EINVAL }
}

/// `ibv_dm.memcpy_from_dm`.
unsafe extern "C" fn memcpy_from_dm(
    host: *mut c_void,
    dm: *mut IbvDm,
    offset: u64,
    len: usize,
) -> c_int {
    // SAFETY: the caller passes device memory it allocated.
    let (ctx, d, at) = match unsafe { copy_range(dm, offset, len, host.is_null()) } {
        Ok(Some(r)) => r,
        Ok(None) => return 0,
        Err(e) => return e,
    };
    // SAFETY: the caller's buffer of `len` writable bytes (ibv_alloc_dm(3)), checked non-NULL.
    let dst = unsafe { core::slice::from_raw_parts_mut(host.cast::<u8>(), len) };
    if ctx.net.with(|s| s.read_region(&d.region, at, dst)) { 0 } else { libc::EINVAL }
}

/// `verbs_context.reg_dm_mr` (`ibv_reg_dm_mr`): `length` bytes of `dm` from `dm_offset` as a
/// zero-based region (`IBV_ACCESS_ZERO_BASED` required, ibv_alloc_dm(3)): keys name offsets
/// 0..length. EINVAL past the device memory's end or without ZERO_BASED.
pub(super) unsafe extern "C" fn reg_dm_mr(
    pd: *mut IbvPd,
    dm: *mut IbvDm,
    dm_offset: u64,
    length: usize,
    access: c_uint,
) -> *mut IbvMr {
    const VERB: &str = "ibv_reg_dm_mr";
    // SAFETY: the caller passes a PD it allocated.
    let Some((ctx, pdh)) = (unsafe { pd_parts(pd) }) else { return fail(libc::EINVAL) };
    // SAFETY: NULL or device memory the caller allocated.
    let Some(d) = Dm::from_c(dm).map(|d| unsafe { &*d }) else { return fail(libc::EINVAL) };
    let access = access.cast_signed();
    if access & IBV_ACCESS_ZERO_BASED == 0 {
        return fail(refuse(
            VERB,
            "device memory regions are zero-based: IBV_ACCESS_ZERO_BASED",
            libc::EINVAL,
        ));
    }
    let rights = match mr_access(access & !IBV_ACCESS_ZERO_BASED) {
        Ok(a) => a,
        Err((errno, why)) => return fail(refuse(VERB, why, errno)),
    };
    let inside =
        dm_offset.checked_add(length as u64).is_some_and(|end| end <= d.region.len() as u64);
    if !inside || d.ibv.context != ctx_ptr(ctx) {
        let why = format_args!("{length} bytes at {dm_offset} of {} bytes", d.region.len());
        return fail(refuse(VERB, why, libc::EINVAL));
    }
    let base = d.region.addr().wrapping_add(dm_offset) as *mut u8;
    // SAFETY: inside the device memory's allocation, which outlives the region (ibv_free_dm
    // is EBUSY while it is registered); reached only under the device lock.
    let Ok(sub) = (unsafe { RawRegion::borrowed(base, length) }) else { return fail(libc::EINVAL) };
    let mr = match ctx.net.with(|s| s.register_at(pdh, Arc::new(sub), 0, rights)) {
        Ok(mr) => mr,
        Err(e) => return fail(refuse(VERB, e, libc::ENOMEM)),
    };
    d.regions.fetch_add(1, Ordering::AcqRel);
    // SAFETY: the region just registered, in `pd`, in `dm`.
    unsafe { mr_object(ctx, pd, null_mut(), length, &mr, rights, dm) }
}

/// A region registered in `dm` is gone.
///
/// # Safety
///
/// `dm` is NULL or a live device memory of this library.
pub(super) unsafe fn dm_region_gone(dm: *mut IbvDm) {
    // SAFETY: the caller's contract.
    if let Some(d) = Dm::from_c(dm).map(|d| unsafe { &*d }) {
        d.regions.fetch_sub(1, Ordering::AcqRel);
    }
}
