//! Importing a context and its objects (`ibv_import_device(3)`, `ibv_import_pd(3)`,
//! `ibv_import_mr(3)`, `ibv_import_dm(3)`): a duplicate of a context's `cmd_fd` opens another
//! context on the same device and objects, in which a PD, a memory region or device memory is
//! found again by its handle. An imported object is the same object: destroying it through
//! either handle destroys it; `ibv_unimport_*` frees only the handle.
//!
//! uroce's devices live in the process, so the command file is found among this process's
//! contexts: a descriptor passed to another process (SCM_RIGHTS) imports nothing there
//! (EOPNOTSUPP, as for a device that cannot share its objects).

use std::os::fd::FromRawFd;

use super::*;

/// `ibv_import_device(3)`: the new context owns `cmd_fd` (closed by `ibv_close_device`).
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_import_device(cmd_fd: c_int) -> *mut IbvContext {
    const VERB: &str = "ibv_import_device";
    if file_id(cmd_fd).is_err() {
        return fail(libc::EBADF);
    }
    let Some(original) = context_of_file(cmd_fd) else {
        let why = "not the command file of a context of this process";
        return fail(refuse(VERB, why, libc::EOPNOTSUPP));
    };
    // SAFETY: a live context of this library (it is in the command-file list until closed).
    let Some(ctx) = (unsafe { ctx_of(original) }) else { return fail(libc::EINVAL) };
    let shared = Shared {
        net: Arc::clone(&ctx.net),
        async_fd: Arc::clone(&ctx.async_fd),
        objects: Arc::clone(&ctx.objects),
        events: Arc::clone(&ctx.events),
    };
    // SAFETY: ibv_import_device(3) hands the descriptor to the new context.
    let cmd = unsafe { std::fs::File::from_raw_fd(cmd_fd) };
    // SAFETY: a context's device is a device of this library's list.
    unsafe { new_context(ctx.vctx.context.device, ctx.dev, shared, cmd) }
}

/// `ibv_import_pd(3)`: the PD whose `handle` is `pd_handle`, in `context`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_import_pd(
    context: *mut IbvContext,
    pd_handle: u32,
) -> *mut IbvPd {
    // SAFETY: the caller passes a context it opened or imported.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return fail(libc::EINVAL) };
    let Some(handle) = ctx.net.with(|s| s.engine().pd_of_number(pd_handle)) else {
        return fail(refuse("ibv_import_pd", format_args!("no PD {pd_handle}"), libc::EINVAL));
    };
    let ibv = IbvPd { context, handle: pd_handle };
    Box::new(Pd { ibv, handle, parent: None, users: AtomicU32::new(0) }).into_c()
}

/// `ibv_unimport_pd(3)`: frees the handle; the PD stays.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_unimport_pd(pd: *mut IbvPd) {
    // SAFETY: the caller passes a PD it imported; this is its last use.
    drop(unsafe { Pd::take(pd) });
}

/// `ibv_import_mr(3)`: the region whose `handle` is `mr_handle`, which must be in `pd`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_import_mr(
    pd: *mut IbvPd,
    mr_handle: u32,
) -> *mut IbvMr {
    // SAFETY: the caller passes a PD it allocated or imported.
    let Some((ctx, pdh)) = (unsafe { pd_parts(pd) }) else { return fail(libc::EINVAL) };
    let found = ctx.net.with(|s| s.engine().mr(LKey(mr_handle)));
    let Some(mr) = found.filter(|m| m.pd == pdh) else {
        let why = format_args!("no region {mr_handle:#x} in the PD");
        return fail(refuse("ibv_import_mr", why, libc::EINVAL));
    };
    let (addr, length) = (mr.host as *mut c_void, usize::try_from(mr.length).unwrap_or(usize::MAX));
    // SAFETY: a live PD of `ctx`; no device memory is named.
    unsafe { mr_object(ctx, pd, addr, length, &mr, mr.access, null_mut()) }
}

/// `ibv_unimport_mr(3)`: frees the handle; the region stays registered.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_unimport_mr(mr: *mut IbvMr) {
    // SAFETY: the caller passes a region it imported; this is its last use.
    drop(unsafe { Mr::take(mr) });
}

/// `ibv_import_dm(3)`: the device memory whose `handle` is `dm_handle`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_import_dm(
    context: *mut IbvContext,
    dm_handle: u32,
) -> *mut IbvDm {
    // SAFETY: the caller passes a context it opened or imported.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return fail(libc::EINVAL) };
    let Some(&raw) = lock(&ctx.objects).dms.get(&dm_handle) else {
        return fail(refuse(
            "ibv_import_dm",
            format_args!("no device memory {dm_handle}"),
            libc::EINVAL,
        ));
    };
    // SAFETY: a live device memory of this context's family (it leaves the map when freed).
    let original = unsafe { &*(raw as *const Dm) };
    imported_dm(context, original)
}

/// `ibv_unimport_dm(3)`: frees the handle; the memory stays allocated.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_unimport_dm(dm: *mut IbvDm) {
    // SAFETY: the caller passes device memory it imported; this is its last use.
    drop(unsafe { Dm::take(dm) });
}
