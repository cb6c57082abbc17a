//! The rest of rdma-core's exported symbols: the small helpers uroce implements, and the verbs
//! it does not support, each failing as its man page says a failure looks (NULL with `errno`,
//! an errno code, or nothing for `void` functions), never crashing.
//!
//! Three groups must exist for programs to start at all, because every program and library is
//! linked with immediate binding: the `IBVERBS_1.0` compatibility entry points (binaries from
//! before libibverbs 1.1), the provider interface (`IBVERBS_PRIVATE_34`: the real `libmlx5`,
//! `libefa` and `librdmacm` that perftest loads need `verbs_register_driver_34`, the `ibv_cmd_*`
//! kernel commands and friends) and the newer extensions (dmabuf, ECE).

use core::ffi::{CStr, c_char, c_int, c_uint, c_void};
use core::ptr::null_mut;
use std::sync::atomic::AtomicBool;

use crate::abi::consts::IBV_FORK_UNNEEDED;
use crate::strings;
use crate::verbs::set_errno;

// ---------------------------------------------------------------------------------------------
// Implemented helpers

#[unsafe(no_mangle)]
extern "C" fn uroce_verbs_wc_status_str(status: c_int) -> *const c_char {
    strings::wc_status_str(status)
}

#[unsafe(no_mangle)]
extern "C" fn uroce_verbs_event_type_str(event: c_int) -> *const c_char {
    strings::event_type_str(event)
}

#[unsafe(no_mangle)]
extern "C" fn uroce_verbs_node_type_str(node_type: c_int) -> *const c_char {
    strings::node_type_str(node_type)
}

#[unsafe(no_mangle)]
extern "C" fn uroce_verbs_port_state_str(state: c_int) -> *const c_char {
    strings::port_state_str(state)
}

#[unsafe(no_mangle)]
extern "C" fn uroce_verbs_rate_to_mult(rate: c_int) -> c_int {
    strings::rate_to_mult(rate)
}

#[unsafe(no_mangle)]
extern "C" fn uroce_verbs_rate_to_mbps(rate: c_int) -> c_int {
    strings::rate_to_mbps(rate)
}

#[unsafe(no_mangle)]
extern "C" fn uroce_verbs_mult_to_ibv_rate(mult: c_int) -> c_int {
    strings::mult_to_rate(mult)
}

#[unsafe(no_mangle)]
extern "C" fn uroce_verbs_mbps_to_ibv_rate(mbps: c_int) -> c_int {
    strings::mbps_to_rate(mbps)
}

/// `ibv_fork_init(3)`: nothing to do. uroce has no DMA: memory is reached by the process's own
/// threads, so a child's copy-on-write pages cannot corrupt a transfer.
#[unsafe(no_mangle)]
extern "C" fn uroce_verbs_fork_init() -> c_int {
    0
}

#[unsafe(no_mangle)]
extern "C" fn uroce_verbs_is_fork_initialized() -> c_int {
    IBV_FORK_UNNEEDED
}

#[unsafe(no_mangle)]
extern "C" fn uroce_verbs_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[unsafe(no_mangle)]
extern "C" fn uroce_verbs_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[unsafe(no_mangle)]
extern "C" fn uroce_verbs_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// `ibv_read_sysfs_file`: reads `dir/file` into `buf` (NUL-terminated, without the trailing
/// newline); the length read, or -1. uroce devices have no sysfs directory, so for them this
/// fails as for any missing file.
#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller passes NUL-terminated strings (checked non-NULL).
    let dir = unsafe { CStr::from_ptr(dir) }.to_string_lossy().into_owned();
    // SAFETY: as above.
    let file = unsafe { CStr::from_ptr(file) }.to_string_lossy().into_owned();
    let Ok(mut text) = std::fs::read(format!("{dir}/{file}")) else {
        set_errno(libc::ENOENT);
        return -1;
    };
    text.truncate(size - 1);
    if text.last() == Some(&b'\n') {
        text.pop();
    }
    // SAFETY: the caller's buffer holds `size` > text.len() bytes.
    unsafe { core::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len()) };
    // SAFETY: as above; the terminator fits.
    unsafe { buf.wrapping_add(text.len()).write(0) };
    c_int::try_from(text.len()).unwrap_or(c_int::MAX)
}

/// `ibv_query_qp_data_in_order(3)`: 0, no in-order guarantee is promised beyond the verbs
/// semantics.
#[unsafe(no_mangle)]
extern "C" fn uroce_verbs_query_qp_data_in_order(
    _qp: *mut c_void,
    _op: c_int,
    _flags: u32,
) -> c_int {
    0
}

#[unsafe(no_mangle)]
static uroce_verbs_verbs_allow_disassociate_destroy: AtomicBool = AtomicBool::new(false);

/// `__ioctl_final_num_attrs`: the provider command builder's attribute count, unchanged.
#[unsafe(no_mangle)]
extern "C" fn uroce_verbs___ioctl_final_num_attrs(num_attrs: c_uint, _link: *mut c_void) -> c_uint {
    num_attrs
}

/// `ibv_read_ibdev_sysfs_file`: uroce devices have no sysfs directory.
#[unsafe(no_mangle)]
extern "C" fn uroce_verbs_read_ibdev_sysfs_file() -> c_int {
    set_errno(libc::ENOENT);
    -1
}

// ---------------------------------------------------------------------------------------------
// Not supported

/// Functions returning an `int` errno code: `EOPNOTSUPP`.
macro_rules! errno_code {
    ($($name:ident),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        extern "C" fn $name() -> c_int {
            libc::EOPNOTSUPP
        }
    )*};
}

/// Functions returning `int` -1 with `errno` set.
macro_rules! minus_one {
    ($($name:ident),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        extern "C" fn $name() -> c_int {
            set_errno(libc::EOPNOTSUPP);
            -1
        }
    )*};
}

/// Functions returning a pointer: NULL with `errno` set.
macro_rules! null {
    ($($name:ident),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        extern "C" fn $name() -> *mut c_void {
            set_errno(libc::EOPNOTSUPP);
            null_mut()
        }
    )*};
}

/// `void` functions: nothing to do.
macro_rules! nothing {
    ($($name:ident),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        extern "C" fn $name() {}
    )*};
}

// Extensions uroce does not have.
errno_code!(uroce_verbs_query_ece, uroce_verbs_set_ece, uroce_verbs_resolve_eth_l2_from_gid,);
null!(uroce_verbs_reg_dmabuf_mr);
nothing!(
    // Conversions of kernel structures (librdmacm's kernel path); uroce has no kernel side.
    uroce_verbs_copy_ah_attr_from_kern,
    uroce_verbs_copy_qp_attr_from_kern,
    uroce_verbs_copy_path_rec_from_kern,
    uroce_verbs_copy_path_rec_to_kern,
);

// The provider interface: uroce loads no providers, so a provider that registers itself
// (libmlx5's and libefa's constructors do) is ignored, and its kernel commands fail.
nothing!(
    uroce_verbs_verbs_register_driver_34,
    uroce_verbs_register_driver_1_1,
    uroce_verbs_verbs_set_ops,
    uroce_verbs_verbs_uninit_context,
    uroce_verbs_verbs_init_cq,
    uroce_verbs___verbs_log,
);
null!(uroce_verbs__verbs_init_and_alloc_context, uroce_verbs_verbs_open_device);
errno_code!(
    uroce_verbs_execute_ioctl,
    uroce_verbs_cmd_advise_mr,
    uroce_verbs_cmd_alloc_dm,
    uroce_verbs_cmd_alloc_mw,
    uroce_verbs_cmd_alloc_pd,
    uroce_verbs_cmd_attach_mcast,
    uroce_verbs_cmd_close_xrcd,
    uroce_verbs_cmd_create_ah,
    uroce_verbs_cmd_create_counters,
    uroce_verbs_cmd_create_cq,
    uroce_verbs_cmd_create_cq_ex,
    uroce_verbs_cmd_create_flow,
    uroce_verbs_cmd_create_flow_action_esp,
    uroce_verbs_cmd_create_qp,
    uroce_verbs_cmd_create_qp_ex,
    uroce_verbs_cmd_create_qp_ex2,
    uroce_verbs_cmd_create_rwq_ind_table,
    uroce_verbs_cmd_create_srq,
    uroce_verbs_cmd_create_srq_ex,
    uroce_verbs_cmd_create_wq,
    uroce_verbs_cmd_dealloc_mw,
    uroce_verbs_cmd_dealloc_pd,
    uroce_verbs_cmd_dereg_mr,
    uroce_verbs_cmd_destroy_ah,
    uroce_verbs_cmd_destroy_counters,
    uroce_verbs_cmd_destroy_cq,
    uroce_verbs_cmd_destroy_flow,
    uroce_verbs_cmd_destroy_flow_action,
    uroce_verbs_cmd_destroy_qp,
    uroce_verbs_cmd_destroy_rwq_ind_table,
    uroce_verbs_cmd_destroy_srq,
    uroce_verbs_cmd_destroy_wq,
    uroce_verbs_cmd_detach_mcast,
    uroce_verbs_cmd_free_dm,
    uroce_verbs_cmd_get_context,
    uroce_verbs_cmd_modify_cq,
    uroce_verbs_cmd_modify_flow_action_esp,
    uroce_verbs_cmd_modify_qp,
    uroce_verbs_cmd_modify_qp_ex,
    uroce_verbs_cmd_modify_srq,
    uroce_verbs_cmd_modify_wq,
    uroce_verbs_cmd_open_qp,
    uroce_verbs_cmd_open_xrcd,
    uroce_verbs_cmd_poll_cq,
    uroce_verbs_cmd_post_recv,
    uroce_verbs_cmd_post_send,
    uroce_verbs_cmd_post_srq_recv,
    uroce_verbs_cmd_query_context,
    uroce_verbs_cmd_query_device_any,
    uroce_verbs_cmd_query_mr,
    uroce_verbs_cmd_query_port,
    uroce_verbs_cmd_query_qp,
    uroce_verbs_cmd_query_srq,
    uroce_verbs_cmd_read_counters,
    uroce_verbs_cmd_reg_dm_mr,
    uroce_verbs_cmd_reg_dmabuf_mr,
    uroce_verbs_cmd_reg_mr,
    uroce_verbs_cmd_req_notify_cq,
    uroce_verbs_cmd_rereg_mr,
    uroce_verbs_cmd_resize_cq,
);

// The IBVERBS_1.0 entry points take the pre-1.1 structure layouts, which uroce does not
// implement; binaries built since 2007 use the 1.1 versions.
null!(
    uroce_verbs_alloc_pd_1_0,
    uroce_verbs_create_ah_1_0,
    uroce_verbs_create_cq_1_0,
    uroce_verbs_create_qp_1_0,
    uroce_verbs_create_srq_1_0,
    uroce_verbs_open_device_1_0,
    uroce_verbs_reg_mr_1_0,
    uroce_verbs_get_device_name_1_0,
);
errno_code!(
    uroce_verbs_attach_mcast_1_0,
    uroce_verbs_detach_mcast_1_0,
    uroce_verbs_close_device_1_0,
    uroce_verbs_dealloc_pd_1_0,
    uroce_verbs_dereg_mr_1_0,
    uroce_verbs_destroy_ah_1_0,
    uroce_verbs_destroy_cq_1_0,
    uroce_verbs_destroy_qp_1_0,
    uroce_verbs_destroy_srq_1_0,
    uroce_verbs_modify_qp_1_0,
    uroce_verbs_modify_srq_1_0,
    uroce_verbs_query_device_1_0,
    uroce_verbs_query_port_1_0,
    uroce_verbs_query_qp_1_0,
    uroce_verbs_query_srq_1_0,
    uroce_verbs_resize_cq_1_0,
);
minus_one!(
    uroce_verbs_get_async_event_1_0,
    uroce_verbs_get_cq_event_1_0,
    uroce_verbs_query_gid_1_0,
    uroce_verbs_query_pkey_1_0,
);
nothing!(
    uroce_verbs_ack_async_event_1_0,
    uroce_verbs_ack_cq_events_1_0,
    uroce_verbs_free_device_list_1_0,
);

#[unsafe(no_mangle)]
extern "C" fn uroce_verbs_get_device_guid_1_0() -> u64 {
    0
}

/// `ibv_get_device_list@IBVERBS_1.0`: no devices through the old interface (it must still set
/// the count).
#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_verbs_get_device_list_1_0(num_devices: *mut c_int) -> *mut c_void {
    if !num_devices.is_null() {
        // SAFETY: the caller passes a valid int or NULL (checked).
        unsafe { num_devices.write(0) };
    }
    set_errno(libc::EOPNOTSUPP);
    null_mut()
}
