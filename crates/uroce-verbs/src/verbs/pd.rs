//! Protection domains, thread domains and parent domains (`ibv_alloc_pd(3)`,
//! `ibv_alloc_td(3)`, `ibv_alloc_parent_domain(3)`).
//!
//! A parent domain is a PD for every purpose — objects created through it belong to its
//! protection domain — that also carries a thread domain and the application's allocators.
//! The allocators (and `pd_context`) are checked and never called: a provider calls them for the queue
//! buffers it maps into the application, and uroce keeps its queues in the device, so there is
//! no such memory to allocate (`IBV_ALLOCATOR_USE_DEFAULT` would say the same). A thread
//! domain promises that one thread uses the objects; uroce's locks are uncontended then, and
//! kept, so the promise changes nothing but is honoured as a lifetime: a thread domain in use
//! by a parent domain cannot be deallocated (EBUSY).

use super::*;

#[repr(C)]
pub(super) struct Pd {
    pub(super) ibv: IbvPd,
    pub(super) handle: PdHandle,
    /// A parent domain's protection domain, thread domain and allocators.
    pub(super) parent: Option<Parent>,
    /// Objects holding this domain: parent domains made over a PD; QPs, SRQs and CQs made
    /// through a parent domain. `ibv_dealloc_pd` is EBUSY while any remains.
    pub(super) users: AtomicU32,
}

/// What a parent domain adds to its PD.
pub(super) struct Parent {
    /// The protection domain (`ibv_parent_domain_init_attr.pd`).
    pub(super) pd: *mut IbvPd,
    /// The thread domain, or NULL.
    pub(super) td: *mut IbvTd,
}

/// A thread domain.
#[repr(C)]
pub(super) struct Td {
    pub(super) ibv: IbvTd,
    /// Parent domains using it.
    pub(super) users: AtomicU32,
}

/// The context and engine handle of a PD (a parent domain's are its protection domain's).
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

/// Counts one more (`up`) or one fewer user of `pd` if it is a parent domain: a QP, SRQ or CQ
/// made through it.
///
/// # Safety
///
/// `pd` is NULL or a live PD of this library.
pub(super) unsafe fn parent_domain_use(pd: *mut IbvPd, up: bool) {
    let Some(p) = Pd::from_c(pd) else { return };
    // SAFETY: a live Pd (the caller's contract); its private fields are never written after
    // creation but through atomics.
    let p = unsafe { &*p };
    if p.parent.is_some() {
        if up {
            p.users.fetch_add(1, Ordering::AcqRel);
        } else {
            p.users.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Whether `pd` is a parent domain.
///
/// # Safety
///
/// `pd` is NULL or a live PD of this library.
pub(super) unsafe fn is_parent_domain(pd: *mut IbvPd) -> bool {
    // SAFETY: the caller's contract.
    Pd::from_c(pd).is_some_and(|p| unsafe { (*p).parent.is_some() })
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_alloc_pd(context: *mut IbvContext) -> *mut IbvPd {
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return fail(libc::EINVAL) };
    let handle = ctx.net.with(|s| s.engine().alloc_pd());
    // The number `ibv_import_pd(3)` finds it by.
    let ibv = IbvPd { context, handle: handle.get() };
    Box::new(Pd { ibv, handle, parent: None, users: AtomicU32::new(0) }).into_c()
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_dealloc_pd(pd: *mut IbvPd) -> c_int {
    // SAFETY: the caller passes a PD it allocated.
    let Some((ctx, handle)) = (unsafe { pd_parts(pd) }) else { return libc::EINVAL };
    let Some(object) = Pd::from_c(pd) else { return libc::EINVAL };
    // SAFETY: a live Pd; its private part is read through a shared reference, as above.
    let this = unsafe { &*object };
    if this.users.load(Ordering::Acquire) != 0 {
        let why = "a parent domain, or a QP, SRQ or CQ made through this parent domain, uses it";
        return refuse("ibv_dealloc_pd", why, libc::EBUSY);
    }
    match &this.parent {
        Some(parent) => {
            // A parent domain goes alone; its protection domain and thread domain stay.
            // SAFETY: a parent domain's PD and TD outlive it (their deallocation is EBUSY).
            unsafe {
                parent_release(parent);
            }
        }
        None => {
            // ibv_dealloc_pd(3) fails while the PD is in use: EBUSY while an MR, MW, QP, SRQ
            // or AH of it lives, as the kernel answers for a PD whose use count is not zero.
            match ctx.net.with(|s| s.engine().dealloc_pd(handle)) {
                Ok(()) => {}
                Err(DestroyError::InUse) => {
                    let why = "an MR, MW, QP, SRQ or AH still uses the PD";
                    return refuse("ibv_dealloc_pd", why, libc::EBUSY);
                }
                Err(DestroyError::Unknown) => return libc::EINVAL,
            }
        }
    }
    // SAFETY: made by `ibv_alloc_pd` or `ibv_alloc_parent_domain`; the caller's last use.
    drop(unsafe { Pd::take(pd) });
    0
}

/// Releases what a parent domain holds of its PD and TD.
///
/// # Safety
///
/// The parent domain's PD and TD are live.
unsafe fn parent_release(parent: &Parent) {
    // SAFETY: the caller's contract.
    if let Some(pd) = Pd::from_c(parent.pd).map(|p| unsafe { &*p }) {
        pd.users.fetch_sub(1, Ordering::AcqRel);
    }
    // SAFETY: as above.
    if let Some(td) = Td::from_c(parent.td).map(|t| unsafe { &*t }) {
        td.users.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `verbs_context.alloc_td` (`ibv_alloc_td(3)`): EINVAL for a `comp_mask` (none is defined).
pub(super) unsafe extern "C" fn alloc_td(
    context: *mut IbvContext,
    attr: *mut IbvTdInitAttr,
) -> *mut IbvTd {
    // SAFETY: the caller passes a context it opened.
    if unsafe { ctx_of(context) }.is_none() {
        return fail(libc::EINVAL);
    }
    // SAFETY: NULL or the caller's attributes.
    if unsafe { attr.as_ref() }.is_none_or(|a| a.comp_mask != 0) {
        return fail(refuse("ibv_alloc_td", "comp_mask must be 0", libc::EINVAL));
    }
    Box::new(Td { ibv: IbvTd { context }, users: AtomicU32::new(0) }).into_c()
}

/// `verbs_context.dealloc_td`: EBUSY while a parent domain uses it.
pub(super) unsafe extern "C" fn dealloc_td(td: *mut IbvTd) -> c_int {
    // SAFETY: the caller passes a TD it allocated.
    let Some(t) = Td::from_c(td).map(|t| unsafe { &*t }) else { return libc::EINVAL };
    if t.users.load(Ordering::Acquire) != 0 {
        return refuse("ibv_dealloc_td", "a parent domain uses it", libc::EBUSY);
    }
    // SAFETY: made by `ibv_alloc_td`; the caller's last use.
    drop(unsafe { Td::take(td) });
    0
}

/// `verbs_context.alloc_parent_domain` (`ibv_alloc_parent_domain(3)`): a parent domain over
/// `attr.pd` (a PD, not another parent domain) with an optional thread domain of this
/// context and, with `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`, allocators (both or neither).
pub(super) unsafe extern "C" fn alloc_parent_domain(
    context: *mut IbvContext,
    attr: *mut IbvParentDomainInitAttr,
) -> *mut IbvPd {
    const VERB: &str = "ibv_alloc_parent_domain";
    // SAFETY: the caller passes a context it opened.
    if unsafe { ctx_of(context) }.is_none() {
        return fail(libc::EINVAL);
    }
    // SAFETY: NULL or the caller's attributes.
    let Some(a) = (unsafe { attr.as_ref() }).copied() else { return fail(libc::EINVAL) };
    let known = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    if a.comp_mask & !known != 0 {
        return fail(refuse(VERB, format_args!("comp_mask {:#x}", a.comp_mask), libc::EINVAL));
    }
    // SAFETY: NULL or a live PD of this library (the caller's contract).
    let Some(p) = Pd::from_c(a.pd).map(|p| unsafe { &*p }) else {
        return fail(refuse(VERB, "a parent domain needs a PD", libc::EINVAL));
    };
    if p.parent.is_some() || p.ibv.context != context {
        return fail(refuse(VERB, "the PD is a parent domain or another context's", libc::EINVAL));
    }
    // SAFETY: NULL or a live TD of this library (the caller's contract).
    let td = Td::from_c(a.td).map(|t| unsafe { &*t });
    if td.is_some_and(|t| t.ibv.context != context) {
        return fail(refuse(VERB, "the thread domain is another context's", libc::EINVAL));
    }
    let allocators = a.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS != 0;
    if allocators && (a.alloc.is_none() || a.free.is_none()) {
        return fail(refuse(VERB, "allocators come in pairs", libc::EINVAL));
    }
    p.users.fetch_add(1, Ordering::AcqRel);
    if let Some(t) = td {
        t.users.fetch_add(1, Ordering::AcqRel);
    }
    let parent = Parent { pd: a.pd, td: a.td };
    let ibv = IbvPd { context, handle: p.ibv.handle };
    let pd = Pd { ibv, handle: p.handle, parent: Some(parent), users: AtomicU32::new(0) };
    Box::new(pd).into_c()
}
