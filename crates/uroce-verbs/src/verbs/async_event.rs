//! Asynchronous events.

use super::*;

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_get_async_event(
    context: *mut IbvContext,
    event: *mut IbvAsyncEvent,
) -> c_int {
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    loop {
        while let Some(e) = ctx.net.with(|s| s.poll_async_event_for(ctx.events.id)) {
            // An object destroyed since its event was queued: the event goes with it.
            let Some((element, kind)) = lock(&ctx.objects).event(&e) else { continue };
            let out = IbvAsyncEvent { element: element as *mut c_void, event_type: kind };
            // SAFETY: the caller passes room for a struct ibv_async_event (checked).
            unsafe { event.write(out) };
            return 0;
        }
        if nonblocking(ctx.async_fd.as_raw_fd()) {
            set_errno(libc::EAGAIN);
            return -1;
        }
        ctx.net.end_busy_poll();
        if let Err(e) = ctx.async_fd.wait(-1) {
            set_errno(e.raw_os_error().unwrap_or(libc::EIO));
            return -1;
        }
    }
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_ack_async_event(_event: *mut IbvAsyncEvent) {}
