//! Address handles.

use super::*;

#[repr(C)]
pub(super) struct Ah {
    pub(super) ibv: IbvAh,
    pub(super) handle: AhHandle,
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_create_ah(
    pd: *mut IbvPd,
    attr: *mut IbvAhAttr,
) -> *mut IbvAh {
    // SAFETY: the caller passes a PD it allocated.
    let Some((ctx, pdh)) = (unsafe { pd_parts(pd) }) else { return fail(libc::EINVAL) };
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller passes a valid struct ibv_ah_attr (checked non-NULL).
    let a = unsafe { attr.read() };
    // RoCE: the destination is the GID; without a GRH there is none.
    if a.is_global == 0 {
        let why = "RoCE needs is_global = 1 and the destination's GID in grh.dgid";
        return fail(refuse("ibv_create_ah", why, libc::EINVAL));
    }
    // The source GID must be one the port holds (Linux resolves it before the driver sees
    // the address handle, and fails an empty or absent entry).
    if a.grh.sgid_index != 0 {
        let why = "grh.sgid_index: only entry 0 of the GID table holds a GID";
        return fail(refuse("ibv_create_ah", why, libc::EINVAL));
    }
    let ah_attr = AhAttr { dest: addr_of_gid(&a.grh.dgid), flow_label: a.grh.flow_label };
    let handle = match ctx.net.with(|s| s.engine().create_ah(pdh, ah_attr)) {
        Ok(h) => h,
        Err(e) => return fail(refuse("ibv_create_ah", e, libc::EINVAL)),
    };
    let boxed =
        Box::new(Ah { ibv: IbvAh { context: ctx_ptr(ctx), pd, handle: handle.get() }, handle });
    boxed.into_c()
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_destroy_ah(ah: *mut IbvAh) -> c_int {
    if ah.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: made by `ibv_create_ah`; destroying it is the caller's last use.
    let boxed = unsafe { Box::from_raw(ah.cast::<Ah>()) };
    // SAFETY: an AH's context outlives it.
    if let Some(ctx) = unsafe { ctx_of(boxed.ibv.context) } {
        ctx.net.with(|s| s.engine().destroy_ah(boxed.handle));
    }
    0
}

/// `ibv_init_ah_from_wc(3)`: the address handle attributes that answer a received UD message,
/// from the network header at the start of its buffer. RoCEv2 over IPv4 puts the IPv4 header
/// in the last 20 of those 40 bytes.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_init_ah_from_wc(
    context: *mut IbvContext,
    port: u8,
    wc: *mut IbvWc,
    grh: *mut IbvGrh,
    attr: *mut IbvAhAttr,
) -> c_int {
    // SAFETY: the caller passes a context it opened.
    let Some(ctx) = (unsafe { ctx_of(context) }) else { return libc::EINVAL };
    if wc.is_null() || grh.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a valid work completion (checked non-NULL).
    let flags = unsafe { (*wc).wc_flags };
    if flags & IBV_WC_GRH == 0 {
        return libc::EINVAL;
    }
    // SAFETY: the 40 bytes of the receive buffer's network header (checked non-NULL).
    let raw: [u8; 40] = unsafe { grh.cast::<[u8; 40]>().read() };
    let (src, tclass, hop, flow) = if ctx.dev.addr.is_ipv4() {
        let ip = &raw[20..];
        let src = IpAddr::from([ip[12], ip[13], ip[14], ip[15]]);
        (src, ip[1], ip[8], 0)
    } else {
        let mut s = [0u8; 16];
        s.copy_from_slice(&raw[8..24]);
        let vtf = u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]);
        let tclass = ((vtf >> 20) & 0xFF) as u8;
        (IpAddr::from(s), tclass, raw[7], vtf & 0x000F_FFFF)
    };
    let out = IbvAhAttr {
        grh: IbvGlobalRoute {
            dgid: gid_of(src),
            flow_label: flow,
            sgid_index: 0,
            hop_limit: hop,
            traffic_class: tclass,
        },
        dlid: 0,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: port,
    };
    // SAFETY: the caller passes room for a struct ibv_ah_attr (checked non-NULL).
    unsafe { attr.write(out) };
    0
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_create_ah_from_wc(
    pd: *mut IbvPd,
    wc: *mut IbvWc,
    grh: *mut IbvGrh,
    port: u8,
) -> *mut IbvAh {
    // SAFETY: the caller passes a PD it allocated.
    let Some((ctx, _)) = (unsafe { pd_parts(pd) }) else { return fail(libc::EINVAL) };
    // SAFETY: all zeroes is a valid IbvAhAttr.
    let mut attr: IbvAhAttr = unsafe { core::mem::zeroed() };
    // SAFETY: the caller's contract for wc and grh; `attr` is a live local.
    let r = unsafe { uroce_verbs_init_ah_from_wc(ctx_ptr(ctx), port, wc, grh, &raw mut attr) };
    if r != 0 {
        return fail(r);
    }
    // SAFETY: as above.
    unsafe { uroce_verbs_create_ah(pd, &raw mut attr) }
}
