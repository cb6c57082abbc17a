//! Asynchronous events (`ibv_get_async_event(3)`).

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
            let Some((element, kind)) = lock(&ctx.objects).report(&e) else { continue };
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

/// `ibv_ack_async_event(3)`: counts the event acknowledged for the object it names, whose
/// destroy waits for that (`ack`). Events about no object (none uroce reports) need nothing.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_ack_async_event(event: *mut IbvAsyncEvent) {
    if event.is_null() {
        return;
    }
    // SAFETY: an event `ibv_get_async_event` returned (the caller's contract).
    let IbvAsyncEvent { element, event_type } = unsafe { event.read() };
    let counter = match event_type {
        IBV_EVENT_CQ_ERR => offset_of!(IbvCq, async_events_completed),
        IBV_EVENT_QP_FATAL
        | IBV_EVENT_QP_ACCESS_ERR
        | IBV_EVENT_COMM_EST
        | IBV_EVENT_QP_LAST_WQE_REACHED => offset_of!(IbvQp, events_completed),
        IBV_EVENT_SRQ_LIMIT_REACHED => offset_of!(IbvSrq, events_completed),
        _ => return,
    };
    if element.is_null() {
        return;
    }
    // SAFETY: the event's object is live until this acknowledgement (its destroy waits for
    // it); the counter is only accessed atomically.
    unsafe { acknowledge(element.wrapping_byte_add(counter).cast::<u32>(), 1) };
}
