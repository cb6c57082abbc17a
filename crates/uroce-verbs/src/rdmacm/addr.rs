//! Addresses: `struct sockaddr` in and out, which device reaches a destination, and
//! `rdma_getaddrinfo`.

use core::ffi::{CStr, c_char, c_int};
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use core::ptr::null_mut;
use std::net::{ToSocketAddrs, UdpSocket};

use super::abi::*;
use super::{Errno, devices};

/// The socket address at `p` (IPv4 or IPv6), if any.
///
/// # Safety
///
/// `p` is NULL or points to a `sockaddr` of its family's size.
pub(crate) unsafe fn read(p: *const libc::sockaddr) -> Option<SocketAddr> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller's pointer to a sockaddr; the family says which structure it is.
    let family = c_int::from(unsafe { (*p).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET sockaddr is a sockaddr_in.
            let s = unsafe { &*p.cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(s.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
            let s = unsafe { &*p.cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(s.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(s.sin6_port),
                s.sin6_flowinfo,
                s.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// `a` as a `sockaddr_storage`.
pub(crate) fn storage(a: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain bytes; all zeroes is a valid (empty) value.
    let mut s: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
    let p = (&raw mut s).cast::<u8>();
    match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::sa_family_t::try_from(libc::AF_INET).unwrap_or(2),
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() },
                sin_zero: [0; 8],
            };
            // SAFETY: a sockaddr_in fits in a sockaddr_storage, which is aligned for it.
            unsafe { p.cast::<libc::sockaddr_in>().write(sin) };
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::sa_family_t::try_from(libc::AF_INET6).unwrap_or(10),
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: v6.ip().octets() },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above.
            unsafe { p.cast::<libc::sockaddr_in6>().write(sin6) };
        }
    }
    s
}

/// The length of `a`'s sockaddr.
pub(crate) const fn len_of(a: &SocketAddr) -> libc::socklen_t {
    const _: () =
        assert!(size_of::<libc::sockaddr_in>() == 16 && size_of::<libc::sockaddr_in6>() == 28);
    match a {
        // 16 and 28 bytes: both fit.
        SocketAddr::V4(_) => 16,
        SocketAddr::V6(_) => 28,
    }
}

/// The device that reaches `dst` (`rdma_resolve_addr` without a source): the device whose
/// address the kernel's routing table picks as the source towards `dst`; failing that (a
/// destination on loopback, where the kernel picks 127.0.0.1), the device at `dst` itself
/// when it is the only one of its family, or else the first device of `dst`'s family that
/// is not `dst`.
pub(crate) fn device_towards(dst: IpAddr) -> Option<usize> {
    let devs = devices();
    let bind: SocketAddr = if dst.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let routed = UdpSocket::bind(bind)
        .and_then(|s| s.connect((dst, uroce_wire::ROCE_V2_PORT)).map(|()| s))
        .and_then(|s| s.local_addr())
        .ok()
        .map(|a| a.ip());
    if let Some(i) = routed.and_then(|src| devs.iter().position(|d| d.addr == src)) {
        return Some(i);
    }
    let family: Vec<usize> =
        (0..devs.len()).filter(|&i| devs[i].addr.is_ipv4() == dst.is_ipv4()).collect();
    match family.as_slice() {
        [] => None,
        [only] => Some(*only),
        many => many.iter().copied().find(|&i| devs[i].addr != dst).or(Some(many[0])),
    }
}

/// Allocates what `rdma_getaddrinfo` returns for `node`/`service` (`RAI_PASSIVE`: a source
/// address to bind, else a destination to connect to).
///
/// # Safety
///
/// `node` and `service` are NULL or NUL-terminated strings; `hints` is NULL or valid.
pub(crate) unsafe fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const RdmaAddrinfo,
) -> Result<*mut RdmaAddrinfo, Errno> {
    let text = |p: *const c_char| {
        // SAFETY: the caller's NUL-terminated string.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let (node, service) = (text(node), text(service));
    // SAFETY: NULL or the caller's hints.
    let hints = unsafe { hints.as_ref() };
    if node.is_none() && service.is_none() {
        // SAFETY: as above.
        return unsafe { copy_of_hints(hints.ok_or(libc::EINVAL)?) };
    }
    let flags = hints.map_or(0, |h| h.ai_flags);
    let passive = flags & RAI_PASSIVE != 0;
    let family = hints.map_or(libc::AF_UNSPEC, |h| h.ai_family);
    let port: u16 = match service.as_deref() {
        None => 0,
        Some(s) => s.parse().map_err(|_| libc::EINVAL)?,
    };
    // rdma_getaddrinfo(3): without a node, the hints' addresses are the answer.
    // SAFETY: the hints' addresses, if any, are the caller's valid sockaddrs.
    let hint_dst = hints.and_then(|h| unsafe { read(h.ai_dst_addr) });
    // SAFETY: as above.
    let hint_src_only = hints.and_then(|h| unsafe { read(h.ai_src_addr) });
    let addrs: Vec<SocketAddr> = match node.as_deref() {
        None if hint_dst.is_some() && !passive => hint_dst.into_iter().collect(),
        None if passive && hint_src_only.is_some() => hint_src_only.into_iter().collect(),
        None if passive => {
            let any = if family == libc::AF_INET6 {
                IpAddr::V6(Ipv6Addr::UNSPECIFIED)
            } else {
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            };
            vec![SocketAddr::new(any, port)]
        }
        None => return Err(libc::EINVAL),
        Some(n) => {
            let literal = n.parse::<IpAddr>().ok().map(|ip| vec![SocketAddr::new(ip, port)]);
            match literal {
                Some(v) => v,
                None if flags & RAI_NUMERICHOST != 0 => return Err(libc::EINVAL),
                None => (n, port).to_socket_addrs().map_err(|_| libc::ENOENT)?.collect(),
            }
        }
    };
    let addrs: Vec<SocketAddr> = addrs
        .into_iter()
        .filter(|a| match family {
            libc::AF_INET => a.is_ipv4(),
            libc::AF_INET6 => a.is_ipv6(),
            _ => true,
        })
        .collect();
    let first = addrs.first().copied().ok_or(libc::ENOENT)?;
    let qp_type = hints.map_or(0, |h| h.ai_qp_type);
    let space = hints.map_or(0, |h| h.ai_port_space);
    let (qp_type, space) = match (qp_type, space) {
        (0, 0) => (crate::abi::consts::IBV_QPT_RC, ps::TCP),
        (t, 0) if t == crate::abi::consts::IBV_QPT_UD => (t, ps::UDP),
        (0, s) if s == ps::UDP => (crate::abi::consts::IBV_QPT_UD, s),
        (0, s) => (crate::abi::consts::IBV_QPT_RC, s),
        (t, s) => (t, s),
    };
    let boxed = Box::into_raw(Box::new(storage(first))).cast::<libc::sockaddr>();
    let len = len_of(&first);
    // An active lookup keeps the source the hints name (rdma_getaddrinfo(3): "ai_src_addr
    // ... if provided, used as the source").
    // SAFETY: the hints' source address, if any, is the caller's valid sockaddr.
    let hint_src = hints.and_then(|h| unsafe { read(h.ai_src_addr) });
    let (src, src_len, dst, dst_len) = if passive {
        (boxed, len, null_mut(), 0)
    } else if let Some(s) = hint_src {
        (Box::into_raw(Box::new(storage(s))).cast::<libc::sockaddr>(), len_of(&s), boxed, len)
    } else {
        (null_mut(), 0, boxed, len)
    };
    Ok(Box::into_raw(Box::new(RdmaAddrinfo {
        ai_flags: flags,
        ai_family: if first.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 },
        ai_qp_type: qp_type,
        ai_port_space: space,
        ai_src_len: src_len,
        ai_dst_len: dst_len,
        ai_src_addr: src,
        ai_dst_addr: dst,
        ai_src_canonname: null_mut(),
        ai_dst_canonname: null_mut(),
        ai_route_len: 0,
        ai_route: null_mut(),
        ai_connect_len: 0,
        ai_connect: null_mut(),
        ai_next: null_mut(),
    })))
}

/// `rdma_getaddrinfo(NULL, NULL, hints)`: no name to look up, so the answer is the hints
/// themselves (their flags, family, QP type and port space as given, and copies of the
/// addresses they carry), as librdmacm answers it.
///
/// # Safety
///
/// The hints' address pointers are NULL or the caller's valid sockaddrs.
unsafe fn copy_of_hints(h: &RdmaAddrinfo) -> Result<*mut RdmaAddrinfo, Errno> {
    let copy = |p: *mut libc::sockaddr| {
        // SAFETY: NULL or the caller's valid sockaddr.
        let a = unsafe { read(p) }?;
        Some((Box::into_raw(Box::new(storage(a))).cast::<libc::sockaddr>(), len_of(&a)))
    };
    let (src, src_len) = copy(h.ai_src_addr).unwrap_or((null_mut(), 0));
    let (dst, dst_len) = copy(h.ai_dst_addr).unwrap_or((null_mut(), 0));
    Ok(Box::into_raw(Box::new(RdmaAddrinfo {
        ai_flags: h.ai_flags,
        ai_family: h.ai_family,
        ai_qp_type: h.ai_qp_type,
        ai_port_space: h.ai_port_space,
        ai_src_len: src_len,
        ai_dst_len: dst_len,
        ai_src_addr: src,
        ai_dst_addr: dst,
        ai_src_canonname: null_mut(),
        ai_dst_canonname: null_mut(),
        ai_route_len: 0,
        ai_route: null_mut(),
        ai_connect_len: 0,
        ai_connect: null_mut(),
        ai_next: null_mut(),
    })))
}

/// Frees what [`getaddrinfo`] allocated.
///
/// # Safety
///
/// `res` is NULL or a list [`getaddrinfo`] returned, not freed before.
pub(crate) unsafe fn freeaddrinfo(mut res: *mut RdmaAddrinfo) {
    while !res.is_null() {
        // SAFETY: a box this module leaked.
        let ai = unsafe { Box::from_raw(res) };
        for p in [ai.ai_src_addr, ai.ai_dst_addr] {
            if !p.is_null() {
                // SAFETY: boxed sockaddr_storage leaked above.
                drop(unsafe { Box::from_raw(p.cast::<libc::sockaddr_storage>()) });
            }
        }
        res = ai.ai_next;
    }
}
