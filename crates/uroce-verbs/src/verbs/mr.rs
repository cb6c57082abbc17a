//! Memory regions: registration, re-registration, deregistration.

use super::*;

#[repr(C)]
pub(super) struct Mr {
    pub(super) ibv: IbvMr,
    pub(super) lkey: LKey,
    /// The access it was registered with (`ibv_rereg_mr` keeps it unless told otherwise).
    pub(super) access: Access,
}

/// Access flags as the engine takes them, or the errno and rule of a refusal: a combination
/// `ibv_reg_mr(3)` rejects is EINVAL, a capability uroce lacks EOPNOTSUPP (as a device without
/// it answers, and as rdma-core's tests take to mean "skip").
pub(super) fn mr_access(flags: c_int) -> Result<Access, (c_int, &'static str)> {
    // The optional range and HUGETLB are hints: a device may ignore them (ibv_reg_mr(3)).
    let flags = flags & !(IBV_ACCESS_OPTIONAL_RANGE | IBV_ACCESS_HUGETLB);
    if flags & IBV_ACCESS_ON_DEMAND != 0 {
        return Err((libc::EOPNOTSUPP, "IBV_ACCESS_ON_DEMAND: no on-demand paging yet"));
    }
    if flags & IBV_ACCESS_ZERO_BASED != 0 {
        return Err((libc::EOPNOTSUPP, "IBV_ACCESS_ZERO_BASED: no zero-based regions"));
    }
    let known = IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC
        | IBV_ACCESS_MW_BIND;
    if flags & !known != 0 {
        return Err((libc::EINVAL, "access has bits no enum ibv_access_flags defines"));
    }
    // ibv_reg_mr(3): remote write or atomic access requires local write.
    if flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
        && flags & IBV_ACCESS_LOCAL_WRITE == 0
    {
        return Err((libc::EINVAL, "remote write or atomic access needs local write"));
    }
    Ok(Access::from_bits(flags.cast_unsigned()))
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_reg_mr(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut IbvMr {
    // SAFETY: the caller passes a PD it allocated.
    let Some((ctx, pdh)) = (unsafe { pd_parts(pd) }) else { return fail(libc::EINVAL) };
    // SAFETY: ibv_reg_mr(3)'s contract: `length` bytes at `addr` stay valid until
    // ibv_dereg_mr.
    let (mr, access) = match unsafe { register(ctx, pdh, addr, length, access, "ibv_reg_mr") } {
        Ok(r) => r,
        Err(errno) => return fail(errno),
    };
    let boxed = Box::new(Mr {
        ibv: IbvMr {
            context: ctx_ptr(ctx),
            pd,
            addr,
            length,
            handle: mr.lkey.0,
            lkey: mr.lkey.0,
            rkey: mr.rkey.0,
        },
        lkey: mr.lkey,
        access,
    });
    boxed.into_c()
}

/// Checks and registers `length` bytes at `addr` with `access` in PD `pdh`, as `verb` (for its
/// messages); the region and its access, or the errno.
///
/// # Safety
///
/// The memory stays valid until the region is deregistered (ibv_reg_mr(3)).
pub(super) unsafe fn register(
    ctx: &Context,
    pdh: PdHandle,
    addr: *mut c_void,
    length: usize,
    access: c_int,
    verb: &str,
) -> Result<(uroce_engine::MemoryRegion, Access), c_int> {
    // SAFETY: the caller's contract.
    let (region, access) = unsafe { prepare(addr, length, access, verb) }?;
    match ctx.net.with(|s| s.register(pdh, Arc::new(region), access)) {
        Ok(mr) => Ok((mr, access)),
        Err(e) => Err(refuse(verb, e, libc::ENOMEM)),
    }
}

/// The checks a registration of `length` bytes at `addr` with `access` passes, and the
/// region the engine will reach; the errno of the first that fails, as `verb` reports it.
///
/// # Safety
///
/// The memory stays valid until the region is deregistered (ibv_reg_mr(3)).
pub(super) unsafe fn prepare(
    addr: *mut c_void,
    length: usize,
    access: c_int,
    verb: &str,
) -> Result<(RawRegion, Access), c_int> {
    let access = match mr_access(access) {
        Ok(a) => a,
        Err((errno, rule)) => {
            return Err(refuse(verb, format_args!("access {access:#x}: {rule}"), errno));
        }
    };
    if length == 0 {
        return Err(refuse(verb, "length 0", libc::EINVAL));
    }
    // A device pins the pages: a range that wraps is EINVAL, one not mapped (or not writable
    // when the registration writes to it) EFAULT, as Linux's ib_umem_get answers.
    let write = access.contains(Access::LOCAL_WRITE);
    if let Err(e) = uroce_net::mappings::check_range(addr as u64, length as u64, write) {
        let errno = match e {
            uroce_net::mappings::RangeError::Wraps => libc::EINVAL,
            _ => libc::EFAULT,
        };
        return Err(refuse(verb, format_args!("{length} bytes at {addr:p}: {e}"), errno));
    }
    // SAFETY: the caller's contract: the memory stays valid until deregistration, which
    // removes the region from the engine before returning; the engine reaches it only for
    // work requests the application posted on it.
    match unsafe { RawRegion::borrowed(addr.cast(), length) } {
        Ok(region) => Ok((region, access)),
        Err(_) => Err(libc::EINVAL),
    }
}

/// `ibv_rereg_mr(3)`: a new translation (`addr`, `length`), PD or access for `mr`, each alone
/// or together, in the same `struct ibv_mr` and under the same keys (as rxe and mlx5 keep
/// them), which from now on reach the new range with the new rights only. An input error
/// leaves the region as it was (`IBV_REREG_MR_ERR_INPUT`, errno set).
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_rereg_mr(
    mr: *mut IbvMr,
    flags: c_int,
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    const INPUT: c_int = -1; // IBV_REREG_MR_ERR_INPUT
    let input = |errno| {
        set_errno(errno);
        INPUT
    };
    let supported =
        IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
    let Some(m) = Mr::from_c(mr) else { return input(libc::EINVAL) };
    if flags == 0 || flags & !supported != 0 {
        return input(libc::EINVAL);
    }
    // SAFETY: a live MR of this library (the caller's contract).
    let old = unsafe { &mut *m };
    let new_pd = if flags & IBV_REREG_MR_CHANGE_PD != 0 { pd } else { old.ibv.pd };
    let (addr, length) = if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
        if addr.is_null() || length == 0 {
            return input(libc::EINVAL);
        }
        (addr, length)
    } else {
        (old.ibv.addr, old.ibv.length)
    };
    let access = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
        access
    } else {
        old.access.bits().cast_signed()
    };
    // SAFETY: the new PD is the caller's (or the MR's own).
    let Some((ctx, pdh)) = (unsafe { pd_parts(new_pd) }) else { return input(libc::EINVAL) };
    if !ptr::eq(ctx_ptr(ctx), old.ibv.context) {
        return input(libc::EINVAL);
    }
    // SAFETY: ibv_rereg_mr(3): the new range, like the old, stays valid until deregistration.
    let (region, access) = match unsafe { prepare(addr, length, access, "ibv_rereg_mr") } {
        Ok(r) => r,
        Err(errno) => return input(errno),
    };
    let translate = flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0;
    let region = translate.then(|| Arc::new(region));
    let lkey = old.lkey;
    match ctx.net.with(|s| s.reregister(lkey, pdh, region, access)) {
        Some(Ok(_)) => {}
        Some(Err(e)) => return input(refuse("ibv_rereg_mr", e, libc::EINVAL)),
        None => return input(libc::EINVAL),
    }
    // The keys stay: only what they reach changes.
    old.ibv.pd = new_pd;
    old.ibv.addr = addr;
    old.ibv.length = length;
    old.access = access;
    0
}

/// `ibv_reg_mr_iova(3)`: uroce's virtual addresses are the process's own, so only an IOVA
/// equal to the address can be honoured.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_reg_mr_iova(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut IbvMr {
    if iova != addr as u64 {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller's contract is that of ibv_reg_mr.
    unsafe { uroce_verbs_reg_mr(pd, addr, length, access) }
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_reg_mr_iova2(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut IbvMr {
    // SAFETY: the caller's contract is that of ibv_reg_mr.
    unsafe { uroce_verbs_reg_mr_iova(pd, addr, length, iova, access.cast_signed()) }
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_dereg_mr(mr: *mut IbvMr) -> c_int {
    // SAFETY: made by `ibv_reg_mr`; deregistering is the caller's last use.
    let Some(boxed) = (unsafe { Mr::take(mr) }) else { return libc::EINVAL };
    // SAFETY: an MR's context outlives it.
    if let Some(ctx) = unsafe { ctx_of(boxed.ibv.context) } {
        ctx.net.with(|s| s.deregister_now(boxed.lkey));
    }
    0
}
