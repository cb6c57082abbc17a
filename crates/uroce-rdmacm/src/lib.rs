//! A drop-in `librdmacm.so.1`: every symbol and version node of rdma-core 44's library, so
//! that unmodified rdma_cm programs (`rping`, `ucmatose`, perftest's `-R`, fio, libfabric)
//! load it.
//!
//! The RDMA CM needs the device: its QP1, its IB CM, and the verbs objects an
//! `rdma_cm_id` holds. Those live in uroce's `libibverbs.so.1` (crate `uroce-verbs`), as they
//! live in the kernel for Linux's librdmacm; each `rdma_X` here calls `uroce_rdmacm_X` there,
//! resolved when the program starts (every rdma_cm program also loads libibverbs.so.1). Put
//! both of uroce's libraries first in the library path:
//!
//! ```text
//! cargo build --release -p uroce-verbs -p uroce-rdmacm
//! ln -sf liburoce_verbs.so target/release/libibverbs.so.1
//! ln -sf liburoce_rdmacm.so target/release/librdmacm.so.1
//! UROCE_ADDR=127.0.0.3 LD_LIBRARY_PATH=target/release rping -s -a 127.0.0.3 -C 10
//! ```
//!
//! rsockets are not implemented: `rsocket` fails with `ENOSYS`, so no descriptor is an
//! rsocket, and the other `r*` calls act on ordinary descriptors as rsockets does, by passing
//! them to the C library (`rping` waits on its channel with `rpoll`).

use core::ffi::{c_int, c_void};

type P = *mut c_void;
type I = c_int;

unsafe extern "C" {
    fn uroce_rdmacm_create_event_channel() -> P;
    fn uroce_rdmacm_destroy_event_channel(channel: P);
    fn uroce_rdmacm_create_id(channel: P, id: P, context: P, ps: I) -> I;
    fn uroce_rdmacm_destroy_id(id: P) -> I;
    fn uroce_rdmacm_bind_addr(id: P, addr: P) -> I;
    fn uroce_rdmacm_resolve_addr(id: P, src: P, dst: P, timeout_ms: I) -> I;
    fn uroce_rdmacm_resolve_route(id: P, timeout_ms: I) -> I;
    fn uroce_rdmacm_create_qp(id: P, pd: P, attr: P) -> I;
    fn uroce_rdmacm_create_qp_ex(id: P, attr: P) -> I;
    fn uroce_rdmacm_destroy_qp(id: P);
    fn uroce_rdmacm_connect(id: P, param: P) -> I;
    fn uroce_rdmacm_listen(id: P, backlog: I) -> I;
    fn uroce_rdmacm_get_request(listen: P, id: P) -> I;
    fn uroce_rdmacm_accept(id: P, param: P) -> I;
    fn uroce_rdmacm_reject(id: P, private_data: P, len: u8) -> I;
    fn uroce_rdmacm_notify(id: P, event: I) -> I;
    fn uroce_rdmacm_disconnect(id: P) -> I;
    fn uroce_rdmacm_join_multicast(id: P, addr: P, context: P) -> I;
    fn uroce_rdmacm_leave_multicast(id: P, addr: P) -> I;
    fn uroce_rdmacm_get_cm_event(channel: P, event: P) -> I;
    fn uroce_rdmacm_ack_cm_event(event: P) -> I;
    fn uroce_rdmacm_get_src_port(id: P) -> u16;
    fn uroce_rdmacm_get_dst_port(id: P) -> u16;
    fn uroce_rdmacm_get_devices(num: P) -> P;
    fn uroce_rdmacm_free_devices(list: P);
    fn uroce_rdmacm_event_str(event: I) -> P;
    fn uroce_rdmacm_set_option(id: P, level: I, optname: I, optval: P, optlen: usize) -> I;
    fn uroce_rdmacm_migrate_id(id: P, channel: P) -> I;
    fn uroce_rdmacm_getaddrinfo(node: P, service: P, hints: P, res: P) -> I;
    fn uroce_rdmacm_freeaddrinfo(res: P);
    fn uroce_rdmacm_create_ep(id: P, res: P, pd: P, attr: P) -> I;
    fn uroce_rdmacm_destroy_ep(id: P);
    fn uroce_rdmacm_create_srq(id: P, pd: P, attr: P) -> I;
    fn uroce_rdmacm_destroy_srq(id: P);
    fn uroce_rdmacm_join_multicast_ex(id: P, attr: P, context: P) -> I;
    fn uroce_rdmacm_establish(id: P) -> I;
    fn uroce_rdmacm_init_qp_attr(id: P, attr: P, mask: P) -> I;
    fn uroce_rdmacm_ece_unsupported() -> I;
}

/// Defines each forwarder and its `.symver` alias: `rdma_NAME@@RDMACM_VERSION`.
macro_rules! forward {
    ($($ver:literal $name:ident $shim:ident $target:ident ($($a:ident: $t:ty),*) $(-> $r:ty)?;)*) => {
        $(
            #[doc = concat!("`rdma_", stringify!($name), "`: forwarded to uroce's libibverbs.so.1.")]
            #[unsafe(no_mangle)]
            unsafe extern "C" fn $shim($($a: $t),*) $(-> $r)? {
                // SAFETY: the same contract as the function forwarded to, which checks
                // what it can of the application's pointers.
                unsafe { $target($($a),*) }
            }
        )*
        // Not in unit-test builds: a test executable has no version nodes.
        #[cfg(not(test))]
        core::arch::global_asm!($(
            concat!(".symver ", stringify!($shim), ", rdma_", stringify!($name), "@@RDMACM_", $ver),
        )*);
    };
}

forward! {
    "1.0" create_event_channel uroce_rdmacm_shim_create_event_channel uroce_rdmacm_create_event_channel() -> P;
    "1.0" destroy_event_channel uroce_rdmacm_shim_destroy_event_channel uroce_rdmacm_destroy_event_channel(channel: P);
    "1.0" create_id uroce_rdmacm_shim_create_id uroce_rdmacm_create_id(channel: P, id: P, context: P, ps: I) -> I;
    "1.0" destroy_id uroce_rdmacm_shim_destroy_id uroce_rdmacm_destroy_id(id: P) -> I;
    "1.0" bind_addr uroce_rdmacm_shim_bind_addr uroce_rdmacm_bind_addr(id: P, addr: P) -> I;
    "1.0" resolve_addr uroce_rdmacm_shim_resolve_addr uroce_rdmacm_resolve_addr(id: P, src: P, dst: P, timeout_ms: I) -> I;
    "1.0" resolve_route uroce_rdmacm_shim_resolve_route uroce_rdmacm_resolve_route(id: P, timeout_ms: I) -> I;
    "1.0" create_qp uroce_rdmacm_shim_create_qp uroce_rdmacm_create_qp(id: P, pd: P, attr: P) -> I;
    "1.0" create_qp_ex uroce_rdmacm_shim_create_qp_ex uroce_rdmacm_create_qp_ex(id: P, attr: P) -> I;
    "1.0" destroy_qp uroce_rdmacm_shim_destroy_qp uroce_rdmacm_destroy_qp(id: P);
    "1.0" connect uroce_rdmacm_shim_connect uroce_rdmacm_connect(id: P, param: P) -> I;
    "1.0" listen uroce_rdmacm_shim_listen uroce_rdmacm_listen(id: P, backlog: I) -> I;
    "1.0" get_request uroce_rdmacm_shim_get_request uroce_rdmacm_get_request(listen: P, id: P) -> I;
    "1.0" accept uroce_rdmacm_shim_accept uroce_rdmacm_accept(id: P, param: P) -> I;
    "1.0" reject uroce_rdmacm_shim_reject uroce_rdmacm_reject(id: P, private_data: P, len: u8) -> I;
    "1.0" notify uroce_rdmacm_shim_notify uroce_rdmacm_notify(id: P, event: I) -> I;
    "1.0" disconnect uroce_rdmacm_shim_disconnect uroce_rdmacm_disconnect(id: P) -> I;
    "1.0" join_multicast uroce_rdmacm_shim_join_multicast uroce_rdmacm_join_multicast(id: P, addr: P, context: P) -> I;
    "1.0" leave_multicast uroce_rdmacm_shim_leave_multicast uroce_rdmacm_leave_multicast(id: P, addr: P) -> I;
    "1.0" get_cm_event uroce_rdmacm_shim_get_cm_event uroce_rdmacm_get_cm_event(channel: P, event: P) -> I;
    "1.0" ack_cm_event uroce_rdmacm_shim_ack_cm_event uroce_rdmacm_ack_cm_event(event: P) -> I;
    "1.0" get_src_port uroce_rdmacm_shim_get_src_port uroce_rdmacm_get_src_port(id: P) -> u16;
    "1.0" get_dst_port uroce_rdmacm_shim_get_dst_port uroce_rdmacm_get_dst_port(id: P) -> u16;
    "1.0" get_devices uroce_rdmacm_shim_get_devices uroce_rdmacm_get_devices(num: P) -> P;
    "1.0" free_devices uroce_rdmacm_shim_free_devices uroce_rdmacm_free_devices(list: P);
    "1.0" event_str uroce_rdmacm_shim_event_str uroce_rdmacm_event_str(event: I) -> P;
    "1.0" set_option uroce_rdmacm_shim_set_option uroce_rdmacm_set_option(id: P, level: I, optname: I, optval: P, optlen: usize) -> I;
    "1.0" migrate_id uroce_rdmacm_shim_migrate_id uroce_rdmacm_migrate_id(id: P, channel: P) -> I;
    "1.0" getaddrinfo uroce_rdmacm_shim_getaddrinfo uroce_rdmacm_getaddrinfo(node: P, service: P, hints: P, res: P) -> I;
    "1.0" freeaddrinfo uroce_rdmacm_shim_freeaddrinfo uroce_rdmacm_freeaddrinfo(res: P);
    "1.0" create_ep uroce_rdmacm_shim_create_ep uroce_rdmacm_create_ep(id: P, res: P, pd: P, attr: P) -> I;
    "1.0" destroy_ep uroce_rdmacm_shim_destroy_ep uroce_rdmacm_destroy_ep(id: P);
    "1.0" create_srq uroce_rdmacm_shim_create_srq uroce_rdmacm_create_srq(id: P, pd: P, attr: P) -> I;
    "1.0" destroy_srq uroce_rdmacm_shim_destroy_srq uroce_rdmacm_destroy_srq(id: P);
    "1.1" join_multicast_ex uroce_rdmacm_shim_join_multicast_ex uroce_rdmacm_join_multicast_ex(id: P, attr: P, context: P) -> I;
    "1.2" establish uroce_rdmacm_shim_establish uroce_rdmacm_establish(id: P) -> I;
    "1.2" init_qp_attr uroce_rdmacm_shim_init_qp_attr uroce_rdmacm_init_qp_attr(id: P, attr: P, mask: P) -> I;
}

/// `rdma_reject_ece`: a reject (uroce negotiates no enhanced connection establishment).
#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_shim_reject_ece(id: P, private_data: P, len: u8) -> I {
    // SAFETY: as `rdma_reject`.
    unsafe { uroce_rdmacm_reject(id, private_data, len) }
}

/// `rdma_set_local_ece`, `rdma_get_remote_ece`: `EOPNOTSUPP` (no ECE on uroce devices).
#[unsafe(no_mangle)]
extern "C" fn uroce_rdmacm_shim_ece(_id: P, _ece: P) -> I {
    // SAFETY: takes no arguments.
    unsafe { uroce_rdmacm_ece_unsupported() }
}

/// Sets `errno` to `ENOSYS` and returns -1 (as `int`, `ssize_t` or `off_t`: the value is
/// -1 in every width).
fn unsupported() -> isize {
    // SAFETY: the calling thread's errno location, always valid.
    let errno = unsafe { libc::__errno_location() };
    // SAFETY: as above.
    unsafe { *errno = libc::ENOSYS };
    -1
}

/// `rdma_create_srq_ex`: extended SRQs (XRC) are not supported.
#[unsafe(no_mangle)]
extern "C" fn uroce_rdmacm_shim_create_srq_ex(_id: P, _attr: P) -> isize {
    unsupported()
}

/// Defines the rsocket entry points for descriptors that are not rsockets: as rsockets
/// itself does for those, each passes the call through to the C library.
macro_rules! passthrough {
    ($($name:ident $shim:ident $libc:ident ($($a:ident: $t:ty),*) -> $r:ty;)*) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: `", stringify!($libc), "(2)` (no descriptor is an rsocket).")]
            #[unsafe(no_mangle)]
            unsafe extern "C" fn $shim($($a: $t),*) -> $r {
                // SAFETY: the application's arguments, as it would pass them to the C library.
                unsafe { libc::$libc($($a),*) }
            }
        )*
        #[cfg(not(test))]
        core::arch::global_asm!($(
            concat!(".symver ", stringify!($shim), ", ", stringify!($name), "@@RDMACM_1.0"),
        )*);
    };
}

type Sa = *mut libc::sockaddr;
type Len = libc::socklen_t;

passthrough! {
    rbind uroce_rdmacm_shim_rbind bind(fd: I, addr: *const libc::sockaddr, len: Len) -> I;
    rlisten uroce_rdmacm_shim_rlisten listen(fd: I, backlog: I) -> I;
    raccept uroce_rdmacm_shim_raccept accept(fd: I, addr: Sa, len: *mut Len) -> I;
    rconnect uroce_rdmacm_shim_rconnect connect(fd: I, addr: *const libc::sockaddr, len: Len) -> I;
    rshutdown uroce_rdmacm_shim_rshutdown shutdown(fd: I, how: I) -> I;
    rclose uroce_rdmacm_shim_rclose close(fd: I) -> I;
    rrecv uroce_rdmacm_shim_rrecv recv(fd: I, buf: P, len: usize, flags: I) -> isize;
    rrecvfrom uroce_rdmacm_shim_rrecvfrom recvfrom(fd: I, buf: P, len: usize, flags: I, addr: Sa, alen: *mut Len) -> isize;
    rrecvmsg uroce_rdmacm_shim_rrecvmsg recvmsg(fd: I, msg: *mut libc::msghdr, flags: I) -> isize;
    rsend uroce_rdmacm_shim_rsend send(fd: I, buf: *const c_void, len: usize, flags: I) -> isize;
    rsendto uroce_rdmacm_shim_rsendto sendto(fd: I, buf: *const c_void, len: usize, flags: I, addr: *const libc::sockaddr, alen: Len) -> isize;
    rsendmsg uroce_rdmacm_shim_rsendmsg sendmsg(fd: I, msg: *const libc::msghdr, flags: I) -> isize;
    rread uroce_rdmacm_shim_rread read(fd: I, buf: P, count: usize) -> isize;
    rreadv uroce_rdmacm_shim_rreadv readv(fd: I, iov: *const libc::iovec, n: I) -> isize;
    rwrite uroce_rdmacm_shim_rwrite write(fd: I, buf: *const c_void, count: usize) -> isize;
    rwritev uroce_rdmacm_shim_rwritev writev(fd: I, iov: *const libc::iovec, n: I) -> isize;
    rpoll uroce_rdmacm_shim_rpoll poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: I) -> I;
    rselect uroce_rdmacm_shim_rselect select(n: I, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, t: *mut libc::timeval) -> I;
    rgetpeername uroce_rdmacm_shim_rgetpeername getpeername(fd: I, addr: Sa, len: *mut Len) -> I;
    rgetsockname uroce_rdmacm_shim_rgetsockname getsockname(fd: I, addr: Sa, len: *mut Len) -> I;
    rsetsockopt uroce_rdmacm_shim_rsetsockopt setsockopt(fd: I, level: I, name: I, val: *const c_void, len: Len) -> I;
    rgetsockopt uroce_rdmacm_shim_rgetsockopt getsockopt(fd: I, level: I, name: I, val: P, len: *mut Len) -> I;
}

/// `rfcntl`: `fcntl(2)`, its optional argument passed as a `long` (what every command takes).
#[unsafe(no_mangle)]
unsafe extern "C" fn uroce_rdmacm_shim_rfcntl(fd: I, cmd: I, arg: libc::c_long) -> I {
    // SAFETY: the application's arguments.
    unsafe { libc::fcntl(fd, cmd, arg) }
}

/// `rsocket`, `riomap`, `riounmap`, `riowrite`: rsockets do not exist on uroce yet; creating
/// one fails with `ENOSYS`, and no descriptor is one to map.
#[unsafe(no_mangle)]
extern "C" fn uroce_rdmacm_shim_no_rsockets() -> isize {
    unsupported()
}

#[cfg(not(test))]
core::arch::global_asm!(
    ".symver uroce_rdmacm_shim_reject_ece, rdma_reject_ece@@RDMACM_1.3",
    ".symver uroce_rdmacm_shim_ece, rdma_set_local_ece@@RDMACM_1.3",
    ".symver uroce_rdmacm_shim_ece, rdma_get_remote_ece@@RDMACM_1.3",
    ".symver uroce_rdmacm_shim_create_srq_ex, rdma_create_srq_ex@@RDMACM_1.0",
    ".symver uroce_rdmacm_shim_rfcntl, rfcntl@@RDMACM_1.0",
    ".symver uroce_rdmacm_shim_no_rsockets, rsocket@@RDMACM_1.0",
    ".symver uroce_rdmacm_shim_no_rsockets, riomap@@RDMACM_1.0",
    ".symver uroce_rdmacm_shim_no_rsockets, riounmap@@RDMACM_1.0",
    ".symver uroce_rdmacm_shim_no_rsockets, riowrite@@RDMACM_1.0",
);
