//! Memory regions: registration, re-registration, deregistration.

use super::*;

#[repr(C)]
pub(super) struct Mr {
    pub(super) ibv: IbvMr,
    pub(super) lkey: LKey,
    /// The access it was registered with (`ibv_rereg_mr` keeps it unless told otherwise).
    pub(super) access: Access,
    /// The device memory it lies in (`ibv_reg_dm_mr`), or NULL.
    pub(super) dm: *mut IbvDm,
}

/// Where an implicit on-demand region begins (page 0 is never mapped).
const IMPLICIT_ODP_START: usize = 4096;

/// Access flags as the engine takes them, or the errno and rule of a refusal: a combination
/// `ibv_reg_mr(3)` rejects is EINVAL, a capability uroce lacks EOPNOTSUPP (as a device without
/// it answers, and as rdma-core's tests take to mean "skip").
pub(super) fn mr_access(flags: c_int) -> Result<Access, (c_int, &'static str)> {
    // The optional range and HUGETLB are hints: a device may ignore them (ibv_reg_mr(3)).
    let flags = flags & !(IBV_ACCESS_OPTIONAL_RANGE | IBV_ACCESS_HUGETLB);
    if flags & IBV_ACCESS_ZERO_BASED != 0 {
        return Err((libc::EOPNOTSUPP, "IBV_ACCESS_ZERO_BASED: no zero-based regions"));
    }
    let known = IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC
        | IBV_ACCESS_MW_BIND
        | IBV_ACCESS_ON_DEMAND;
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
    // SAFETY: the caller's contract is that of reg_mr_at.
    unsafe { reg_mr_at(pd, addr, length, addr as u64, access, "ibv_reg_mr") }
}

/// Registers `length` bytes at `addr`, their keys naming `iova..` (the address itself for
/// `ibv_reg_mr`).
///
/// # Safety
///
/// `pd` is NULL or a live PD; ibv_reg_mr(3)'s contract: `length` bytes at `addr` stay valid
/// until ibv_dereg_mr.
unsafe fn reg_mr_at(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
    verb: &str,
) -> *mut IbvMr {
    // SAFETY: the caller passes a PD it allocated.
    let Some((ctx, pdh)) = (unsafe { pd_parts(pd) }) else { return fail(libc::EINVAL) };
    // SAFETY: the caller's contract.
    let (mr, access) = match unsafe { register(ctx, pdh, addr, length, iova, access, verb) } {
        Ok(r) => r,
        Err(errno) => return fail(errno),
    };
    // `mr->addr` is the address given, whatever the keys name (as libibverbs sets it).
    // SAFETY: the region just registered, in `pd`.
    unsafe { mr_object(ctx, pd, addr, length, &mr, access, null_mut()) }
}

/// The `struct ibv_mr` of a registered region, reported at `addr`.
///
/// # Safety
///
/// `pd` is a live PD of `ctx`; `dm` NULL or a live device memory of it.
pub(super) unsafe fn mr_object(
    ctx: &Context,
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    mr: &uroce_engine::MemoryRegion,
    access: Access,
    dm: *mut IbvDm,
) -> *mut IbvMr {
    let ibv = IbvMr {
        context: ctx_ptr(ctx),
        pd,
        addr,
        length,
        handle: mr.lkey.0,
        lkey: mr.lkey.0,
        rkey: mr.rkey.0,
    };
    Box::new(Mr { ibv, lkey: mr.lkey, access, dm }).into_c()
}

/// Checks and registers `length` bytes at `addr` with `access` in PD `pdh`, their keys naming
/// `iova..`, as `verb` (for its messages); the region and its access, or the errno.
///
/// # Safety
///
/// The memory stays valid until the region is deregistered (ibv_reg_mr(3)).
pub(super) unsafe fn register(
    ctx: &Context,
    pdh: PdHandle,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
    verb: &str,
) -> Result<(uroce_engine::MemoryRegion, Access), c_int> {
    // SAFETY: the caller's contract.
    let (region, access) = unsafe { prepare(addr, length, access, verb) }?;
    // An implicit region names every address: its keys are its own.
    let iova = if iova == addr as u64 { region.addr() } else { iova };
    match ctx.net.with(|s| s.register_at(pdh, Arc::new(region), iova, access)) {
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
    let on_demand = access.bits() & IBV_ACCESS_ON_DEMAND.cast_unsigned() != 0;
    // Implicit on-demand paging (ibv_reg_mr(3): addr NULL, length SIZE_MAX): one region over
    // the whole address space. Its first page is never mapped (an access there is a
    // protection error), so the region starts after it.
    if on_demand && addr.is_null() && length == usize::MAX {
        let page = IMPLICIT_ODP_START as *mut u8;
        // SAFETY: the region names every address; each access the device makes through it
        // is one the application posted or granted, and goes through the guarded copies,
        // which fail on memory that is not mapped.
        return match unsafe { RawRegion::borrowed(page, usize::MAX - IMPLICIT_ODP_START) } {
            Ok(region) => Ok((region, access)),
            Err(_) => Err(libc::EINVAL),
        };
    }
    // A device pins the pages: a range that wraps is EINVAL, one not mapped (or not writable
    // when the registration writes to it) EFAULT, as Linux's ib_umem_get answers. With
    // on-demand paging nothing is pinned or even looked at: the pages need only be there
    // when an access comes, and one that is not is a protection error, not a crash.
    let write = access.contains(Access::LOCAL_WRITE);
    // A range whose page-aligned end wraps is EINVAL (ib_umem_get), ODP or not.
    let end =
        (addr as u64).checked_add(length as u64).and_then(|e| e.checked_next_multiple_of(4096));
    let checked = match end {
        None => Err(uroce_net::mappings::RangeError::Wraps),
        Some(_) if on_demand => Ok(()),
        Some(_) => uroce_net::mappings::check_range(addr as u64, length as u64, write),
    };
    if let Err(e) = checked {
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

/// `ibv_reg_mr_iova(3)`: `length` bytes at `addr` whose keys name `iova..iova + length`: work
/// requests and peers address the region by IOVA, and the device translates (0 makes a
/// zero-based region).
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_reg_mr_iova(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut IbvMr {
    if iova.checked_add(length as u64).is_none() {
        return fail(refuse("ibv_reg_mr_iova", "the IOVA range wraps", libc::EINVAL));
    }
    // SAFETY: the caller's contract is that of ibv_reg_mr.
    unsafe { reg_mr_at(pd, addr, length, iova, access, "ibv_reg_mr_iova") }
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
    // SAFETY: a device memory outlives its regions (ibv_free_dm is EBUSY meanwhile).
    unsafe { dm_region_gone(boxed.dm) };
    0
}

/// `verbs_context.advise_mr` (`ibv_advise_mr(3)`): prefetches on-demand regions. PREFETCH and
/// PREFETCH_WRITE fault the pages of each element in (readable, or writable), so the first
/// access finds them present; PREFETCH_NO_FAULT maps only what is present, which for the CPU's
/// page tables is already so. Synchronous, so `IBV_ADVISE_MR_FLAG_FLUSH` is always honoured.
/// EINVAL for an element that is not inside an on-demand region of `pd` (or PREFETCH_WRITE
/// without local write), EFAULT for memory not mapped, EOPNOTSUPP for an unknown advice.
pub(super) unsafe extern "C" fn advise_mr(
    pd: *mut IbvPd,
    advice: c_int,
    flags: u32,
    sg_list: *mut IbvSge,
    num_sge: u32,
) -> c_int {
    const VERB: &str = "ibv_advise_mr";
    // SAFETY: the caller passes a PD it allocated.
    let Some((ctx, pdh)) = (unsafe { pd_parts(pd) }) else { return libc::EINVAL };
    let write = match advice {
        IBV_ADVISE_MR_ADVICE_PREFETCH | IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT => false,
        IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE => true,
        a => return refuse(VERB, format_args!("advice {a}"), libc::EOPNOTSUPP),
    };
    if flags & !IBV_ADVISE_MR_FLAG_FLUSH != 0 {
        return refuse(VERB, format_args!("flags {flags:#x}"), libc::EINVAL);
    }
    let Ok(n) = c_int::try_from(num_sge) else { return libc::EINVAL };
    // SAFETY: the caller's list holds `num_sge` entries.
    let Some(sges) = (unsafe { read_sges::<Vec<Sge>>(sg_list, n) }).filter(|s| !s.is_empty())
    else {
        return refuse(VERB, "no scatter/gather list", libc::EINVAL);
    };
    for s in &sges {
        let Some(mr) = ctx.net.with(|st| st.engine().mr(s.lkey)) else {
            return refuse(VERB, format_args!("lkey {:#x}: no region", s.lkey.0), libc::EINVAL);
        };
        let on_demand = mr.access.bits() & IBV_ACCESS_ON_DEMAND.cast_unsigned() != 0;
        let inside = mr.pd == pdh && mr.contains(s.addr, u64::from(s.length));
        if !on_demand || !inside || (write && !mr.access.contains(Access::LOCAL_WRITE)) {
            let why = "an element outside an on-demand region of the PD (with local write, \
                       for PREFETCH_WRITE)";
            return refuse(VERB, why, libc::EINVAL);
        }
        if advice == IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT || s.length == 0 {
            continue;
        }
        if let Err(e) = uroce_net::mappings::prefetch(s.addr, u64::from(s.length), write) {
            let why = format_args!("{} bytes at {:#x}: {e}", s.length, s.addr);
            return refuse(VERB, why, libc::EFAULT);
        }
    }
    0
}
