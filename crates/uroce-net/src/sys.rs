//! Every system call the runtime makes that `std` does not wrap: socket options, batched
//! `sendmmsg`/`recvmmsg` with their control messages, `eventfd`, `poll`, and page-aligned
//! allocations, and the registry through which the engine reaches registered memory. All of
//! the crate's `unsafe` is here, one block per operation.

#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss,
    reason = "C ABI conversions: struct sizes, batch counts and return values are small"
)]

pub(crate) mod guard;
pub(crate) mod memory;
pub(crate) mod shm;

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::io;
use std::net::UdpSocket;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Largest datagram the receive path takes (a 4096-byte MTU packet is 4,140 bytes).
pub(crate) const MAX_DATAGRAM: usize = 9216;

/// Largest datagram a socket with `UDP_GRO` may return: the kernel coalesces segments up to the
/// largest UDP payload.
pub(crate) const MAX_GRO_DATAGRAM: usize = 65_535;

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    setsockopt_value(fd, level, name, &value)
}

/// setsockopt(2) with `value`, a C struct (or int) of the type option `name` takes. A pointer
/// inside it (a BPF program's instructions) is read by the kernel, which fails the call with
/// `EFAULT` rather than touch memory that is not there.
fn setsockopt_value<T>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    let len = size_of::<T>() as libc::socklen_t;
    // SAFETY: `value` is a live `T` and `len` is its size, as setsockopt(2) requires; the
    // kernel copies it before it returns.
    let ret = unsafe { libc::setsockopt(fd, level, name, core::ptr::from_ref(value).cast(), len) };
    check(ret).map(drop)
}

/// A UDP socket bound to `addr`, non-blocking, with what the RoCEv2 path needs:
/// `IP_PMTUDISC_DO` (DF set and, on an unconnected socket, IPv4 identification 0 — which the
/// ICRC covers, so the receiver can compute it), and the control messages that give each
/// received datagram its TOS and TTL (the GRH's traffic class and hop limit) — and its
/// destination address only where `addr` does not say it (unspecified): a socket bound to one
/// address, unicast or a multicast group, receives only what is sent to that address, and the
/// message cost 0.18 µs of a 4.1 µs one-way loopback ping-pong.
///
/// `reuse` sets `SO_REUSEADDR` (multicast group sockets: every member gets a copy); `share`
/// sets `SO_REUSEPORT`, by which the processes of one host-wide device (one user: the kernel
/// admits only sockets of the same effective uid to a group) bind the device's port together.
pub(crate) fn udp_socket(addr: SocketAddr, reuse: bool, share: bool) -> io::Result<UdpSocket> {
    let family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: socket(2) with constant arguments; the result is checked before use.
    let fd = check(unsafe {
        libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0)
    })?;
    // SAFETY: `fd` was just returned by socket(2) and is owned by nothing else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    if reuse {
        setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    }
    if share {
        setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    }
    // A deep receive buffer: a window of MTU-sized packets arrives in a burst, and what the
    // buffer cannot hold is lost and retransmitted. The kernel caps the request at
    // net.core.rmem_max; with CAP_NET_ADMIN the FORCE variant goes beyond (best effort).
    let deep = 8 << 20;
    if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, deep).is_err() {
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, deep);
    }
    match addr {
        SocketAddr::V4(_) => {
            setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)?;
            if addr.ip().is_unspecified() {
                setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_PKTINFO, 1)?;
            }
            setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)?;
            setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVTTL, 1)?;
        }
        SocketAddr::V6(_) => {
            setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
            setsockopt_int(
                fd,
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DO,
            )?;
            if addr.ip().is_unspecified() {
                setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1)?;
            }
            setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1)?;
            setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, 1)?;
        }
    }
    let (storage, len) = sockaddr_of(addr);
    // SAFETY: `storage` holds a sockaddr of `len` bytes for the socket's family.
    check(unsafe { libc::bind(fd, (&raw const storage).cast(), len) })?;
    Ok(UdpSocket::from(owned))
}

/// Gives `sock`'s `SO_REUSEPORT` group (every socket bound to its address and port) a classic
/// BPF program that picks the socket for each datagram: run on the UDP payload, it returns an
/// index into the group, and an index past its end leaves the pick to the kernel's hash of the
/// flow (`SO_ATTACH_REUSEPORT_CBPF`, socket(7), Linux 4.5; unprivileged). The program replaces
/// any the group had.
pub(crate) fn attach_reuseport_program(
    sock: &UdpSocket,
    program: &[libc::sock_filter],
) -> io::Result<()> {
    let len = u16::try_from(program.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "program too long"))?;
    // `len` instructions at `filter`, which outlive the call (the kernel copies them).
    let fprog = libc::sock_fprog { len, filter: program.as_ptr().cast_mut() };
    setsockopt_value(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_ATTACH_REUSEPORT_CBPF, &fprog)
}

/// Asks the kernel to hand this socket runs of datagrams of one flow coalesced into one buffer
/// with their segment size (`UDP_GRO`, udp(7), Linux 5.0): one receive for up to 64 KiB.
pub(crate) fn enable_gro(sock: &UdpSocket) -> io::Result<()> {
    setsockopt_int(sock.as_raw_fd(), libc::SOL_UDP, libc::UDP_GRO, 1)
}

/// Whether the kernel segments UDP sends (`UDP_SEGMENT`, udp(7), Linux 4.18): setting the
/// option to 0 (off) is refused with `ENOPROTOOPT` by kernels that do not.
pub(crate) fn gso_supported(sock: &UdpSocket) -> bool {
    setsockopt_int(sock.as_raw_fd(), libc::SOL_UDP, libc::UDP_SEGMENT, 0).is_ok()
}

/// The IPv4 identification the next datagram from `sock`, a connected IPv4 UDP socket, will
/// carry. Linux numbers a connected socket's datagrams from a per-socket counter that starts
/// at a random value on `connect` and grows by one per datagram sent (`ip_select_ident_segs`;
/// a segmented send takes one, its segments counting up from it), whatever the destination.
/// The counter cannot be read, so this sends an empty datagram to `probe_to` (a socket of our
/// own that discards it) with transmit timestamps on, and reads the identification from the
/// copy of the packet the kernel loops back to the error queue (`SO_TIMESTAMPING`,
/// Documentation/networking/timestamping.rst; an unprivileged process gets the packet unless
/// `net.core.tstamp_allow_data` is 0, when this fails).
pub(crate) fn next_ipv4_id(sock: &UdpSocket, probe_to: SocketAddrV4) -> io::Result<u16> {
    let fd = sock.as_raw_fd();
    let local = match sock.local_addr()? {
        SocketAddr::V4(a) => *a.ip(),
        SocketAddr::V6(_) => return Err(io::Error::from(io::ErrorKind::InvalidInput)),
    };
    let flags = libc::SOF_TIMESTAMPING_TX_SOFTWARE | libc::SOF_TIMESTAMPING_SOFTWARE;
    setsockopt_int(fd, libc::SOL_SOCKET, SO_TIMESTAMPING, flags as libc::c_int)?;
    let learned = (|| {
        let (name, name_len) = sockaddr_of(SocketAddr::V4(probe_to));
        // SAFETY: no payload (a null pointer with length 0 is valid for sendto); the name is a
        // live sockaddr of its stated length.
        check(unsafe {
            libc::sendto(fd, core::ptr::null(), 0, 0, (&raw const name).cast(), name_len) as i32
        })?;
        // The copy comes back within the send on loopback (where a local address's route goes):
        // the timestamp is taken as the device transmits.
        let mut packet = [0u8; 128];
        let mut control = [0u64; 64];
        let mut iov = libc::iovec { iov_base: packet.as_mut_ptr().cast(), iov_len: packet.len() };
        // SAFETY: msghdr is plain old data; all zeroes is a valid value.
        let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = size_of_val(&control);
        // SAFETY: the header points at a live iovec over `packet` and a live control buffer,
        // each of its stated length.
        let len =
            unsafe { libc::recvmsg(fd, &raw mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
        let len = usize::try_from(check(len as i32)?).unwrap_or(0);
        looped_ipv4_id(&packet[..len.min(packet.len())], local, *probe_to.ip())
            .ok_or_else(|| io::Error::other("no IPv4 header in the looped-back probe"))
    })();
    setsockopt_int(fd, libc::SOL_SOCKET, SO_TIMESTAMPING, 0)?;
    learned.map(|id| id.wrapping_add(1))
}

/// `SO_TIMESTAMPING` (asm-generic/socket.h; `SO_TIMESTAMPING_OLD`, the same on 64-bit
/// targets).
const SO_TIMESTAMPING: libc::c_int = 37;

/// The identification of the IPv4 datagram from `src` to `dst` that `packet` (a looped-back
/// copy: IP header first, or behind loopback's 14-byte Ethernet header) holds.
fn looped_ipv4_id(packet: &[u8], src: Ipv4Addr, dst: Ipv4Addr) -> Option<u16> {
    let behind_ethernet = packet.len() >= 34 && packet[12..14] == [0x08, 0x00];
    let ip = if behind_ethernet { &packet[14..] } else { packet };
    let is = |at: usize, a: Ipv4Addr| ip.get(at..at + 4) == Some(&a.octets()[..]);
    let udp_v4 = ip.first().is_some_and(|b| b >> 4 == 4) && ip.get(9) == Some(&17);
    (udp_v4 && is(12, src) && is(16, dst)).then(|| u16::from_be_bytes([ip[4], ip[5]]))
}

/// Joins multicast `group` on the interface that has `local` (IPv4), or on every interface
/// (IPv6, index 0), and loops the group's traffic back to this host.
pub(crate) fn join_multicast(sock: &UdpSocket, group: IpAddr, local: IpAddr) -> io::Result<()> {
    match (group, local) {
        (IpAddr::V4(g), IpAddr::V4(l)) => {
            sock.join_multicast_v4(&g, &l)?;
            sock.set_multicast_loop_v4(true)
        }
        (IpAddr::V6(g), _) => {
            sock.join_multicast_v6(&g, 0)?;
            sock.set_multicast_loop_v6(true)
        }
        _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "group and address differ in family")),
    }
}

/// Sends multicast from the interface that has `local` (IPv4).
pub(crate) fn set_multicast_if(sock: &UdpSocket, local: IpAddr) -> io::Result<()> {
    if let IpAddr::V4(l) = local {
        // ip(7) IP_MULTICAST_IF takes an in_addr.
        let m = libc::in_addr { s_addr: u32::from(l).to_be() };
        setsockopt_value(sock.as_raw_fd(), libc::IPPROTO_IP, libc::IP_MULTICAST_IF, &m)?;
        sock.set_multicast_loop_v4(true)?;
    }
    Ok(())
}

fn sockaddr_of(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all zeroes is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from(*a.ip()).to_be() },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and suitably aligned for it.
            unsafe { core::ptr::write((&raw mut storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in6 and suitably aligned for it.
            unsafe { core::ptr::write((&raw mut storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

fn socketaddr_from(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match libc::c_int::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin: libc::sockaddr_in = unsafe { core::ptr::read((&raw const *storage).cast()) };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let s: libc::sockaddr_in6 = unsafe { core::ptr::read((&raw const *storage).cast()) };
            let ip = Ipv6Addr::from(s.sin6_addr.s6_addr);
            let port = u16::from_be(s.sin6_port);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                port,
                u32::from_be(s.sin6_flowinfo),
                s.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// One received datagram's metadata.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecvMeta {
    pub(crate) src: SocketAddr,
    /// Destination address (`IP_PKTINFO`); `None` if the kernel gave none.
    pub(crate) dst: Option<IpAddr>,
    pub(crate) tclass: u8,
    pub(crate) hop_limit: u8,
    pub(crate) len: usize,
    /// The size of the segments the kernel coalesced into this datagram (`UDP_GRO`), the last
    /// of which may be shorter; 0 for a datagram as it was sent.
    pub(crate) segment: u16,
}

/// Room for the control messages asked for: pktinfo, TOS, TTL (or their IPv6 twins) and the
/// GRO segment size.
const CMSG_SPACE: usize = 160;

/// Receive buffers for one `recvmmsg` call of up to `n` datagrams, with the headers that point
/// at them kept from call to call (no allocation per call).
pub(crate) struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    names: Vec<libc::sockaddr_storage>,
    controls: Vec<[u64; CMSG_SPACE / 8]>,
    iovs: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
    pub(crate) meta: Vec<RecvMeta>,
    /// The last call found nothing: the next asks for one datagram (`recvmsg`), which returns
    /// as soon as it has it, where `recvmmsg` goes on to look for a second and finds the queue
    /// empty first (a trickle's every datagram, on its way to the application).
    found_none: bool,
}

// SAFETY: the raw pointers in `iovs` and `msgs` point only into this batch's own heap buffers
// (which never move or shrink), and are only used by `recv`, which takes `&mut self`.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    /// Room for `n` datagrams of up to `len` bytes each.
    pub(crate) fn new(n: usize, len: usize) -> Self {
        // SAFETY: sockaddr_storage is plain old data; all zeroes is a valid value.
        let zero: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
        let mut b = Self {
            bufs: (0..n).map(|_| vec![0; len]).collect(),
            names: vec![zero; n],
            controls: vec![[0; CMSG_SPACE / 8]; n],
            iovs: Vec::with_capacity(n),
            // SAFETY: mmsghdr is plain old data; all zeroes is a valid value.
            msgs: (0..n).map(|_| unsafe { core::mem::zeroed() }).collect(),
            meta: Vec::with_capacity(n),
            found_none: false,
        };
        // The headers are built once: the buffers they point into never move.
        b.iovs.extend(
            b.bufs
                .iter_mut()
                .map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() }),
        );
        for (i, m) in b.msgs.iter_mut().enumerate() {
            m.msg_hdr.msg_name = (&raw mut b.names[i]).cast();
            m.msg_hdr.msg_iov = &raw mut b.iovs[i];
            m.msg_hdr.msg_iovlen = 1;
            m.msg_hdr.msg_control = b.controls[i].as_mut_ptr().cast();
        }
        b.reset(n);
        b
    }

    /// Restores the lengths and flags of the first `n` headers, which the kernel rewrote.
    fn reset(&mut self, n: usize) {
        for m in &mut self.msgs[..n] {
            m.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            m.msg_hdr.msg_controllen = CMSG_SPACE;
            m.msg_hdr.msg_flags = 0;
            m.msg_len = 0;
        }
    }

    /// The payload of datagram `i` of the last receive.
    pub(crate) fn payload(&self, i: usize) -> &[u8] {
        &self.bufs[i][..self.meta[i].len]
    }

    /// Receives up to the batch's size of datagrams without blocking (one, after a call that
    /// found none); returns how many.
    pub(crate) fn recv(&mut self, sock: &UdpSocket) -> io::Result<usize> {
        let used = self.meta.len();
        self.reset(used);
        self.meta.clear();
        let n = self.bufs.len();
        let msgs = &mut self.msgs;
        let flags = libc::MSG_DONTWAIT;
        let ret = if self.found_none && n > 0 {
            let first = &mut msgs[0];
            // SAFETY: the header points at a live name, iovec (into a live buffer of its stated
            // length) and control buffer of its stated length.
            let len = unsafe { libc::recvmsg(sock.as_raw_fd(), &raw mut first.msg_hdr, flags) };
            // A datagram of no bytes is one too (it goes on, to be counted).
            if len >= 0 {
                first.msg_len = u32::try_from(len).unwrap_or(u32::MAX);
                1
            } else {
                -1
            }
        } else {
            // SAFETY: every mmsghdr points at a live name, iovec (into a live buffer of its
            // stated length) and control buffer of its stated length; `n` is the number of
            // headers.
            unsafe {
                libc::recvmmsg(
                    sock.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    n as libc::c_uint,
                    flags,
                    core::ptr::null_mut(),
                )
            }
        };
        if ret < 0 {
            let e = io::Error::last_os_error();
            self.found_none = true;
            return if e.kind() == io::ErrorKind::WouldBlock { Ok(0) } else { Err(e) };
        }
        let got = ret as usize;
        self.found_none = got == 0;
        for (i, m) in msgs.iter().enumerate().take(got) {
            // One entry per buffer, so indices stay aligned. A datagram with no usable source
            // or cut short (too long for RoCE) is handed on empty: the engine counts it as
            // malformed.
            let src = socketaddr_from(&self.names[i]);
            let whole = m.msg_hdr.msg_flags & libc::MSG_TRUNC == 0 && src.is_some();
            let len = if whole { m.msg_len as usize } else { 0 };
            let src = src.unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
            let mut meta = RecvMeta { src, dst: None, tclass: 0, hop_limit: 64, len, segment: 0 };
            parse_cmsgs(&m.msg_hdr, &mut meta);
            self.meta.push(meta);
        }
        Ok(self.meta.len())
    }
}

fn parse_cmsgs(hdr: &libc::msghdr, meta: &mut RecvMeta) {
    // SAFETY: `hdr` was filled in by recvmmsg; CMSG_FIRSTHDR/NXTHDR walk its control buffer
    // within msg_controllen and return null at its end.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(hdr) };
    while !c.is_null() {
        // SAFETY: `c` is a non-null cmsghdr inside the control buffer.
        let header: libc::cmsghdr = unsafe { core::ptr::read_unaligned(c) };
        let (level, kind) = (header.cmsg_level, header.cmsg_type);
        // SAFETY: CMSG_DATA of a valid cmsghdr points at its payload.
        let data = unsafe { libc::CMSG_DATA(c) };
        match (level, kind) {
            (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                // SAFETY: an IP_PKTINFO cmsg carries an in_pktinfo (possibly unaligned).
                let info: libc::in_pktinfo = unsafe { core::ptr::read_unaligned(data.cast()) };
                meta.dst = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(info.ipi_addr.s_addr))));
            }
            (libc::IPPROTO_IP, libc::IP_TOS) => {
                // SAFETY: an IP_TOS cmsg carries one byte.
                meta.tclass = unsafe { *data };
            }
            (libc::IPPROTO_IP, libc::IP_TTL) => {
                // SAFETY: an IP_TTL cmsg carries a c_int (possibly unaligned).
                let ttl: libc::c_int = unsafe { core::ptr::read_unaligned(data.cast()) };
                meta.hop_limit = u8::try_from(ttl).unwrap_or(u8::MAX);
            }
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                // SAFETY: an IPV6_PKTINFO cmsg carries an in6_pktinfo (possibly unaligned).
                let info: libc::in6_pktinfo = unsafe { core::ptr::read_unaligned(data.cast()) };
                meta.dst = Some(IpAddr::V6(Ipv6Addr::from(info.ipi6_addr.s6_addr)));
            }
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                // SAFETY: an IPV6_TCLASS cmsg carries a c_int (possibly unaligned).
                let t: libc::c_int = unsafe { core::ptr::read_unaligned(data.cast()) };
                meta.tclass = u8::try_from(t & 0xFF).unwrap_or(0);
            }
            (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => {
                // SAFETY: an IPV6_HOPLIMIT cmsg carries a c_int (possibly unaligned).
                let h: libc::c_int = unsafe { core::ptr::read_unaligned(data.cast()) };
                meta.hop_limit = u8::try_from(h).unwrap_or(u8::MAX);
            }
            (libc::SOL_UDP, libc::UDP_GRO) => {
                // SAFETY: a UDP_GRO cmsg carries the segment size as a c_int (udp_cmsg_recv).
                let size: libc::c_int = unsafe { core::ptr::read_unaligned(data.cast()) };
                meta.segment = u16::try_from(size).unwrap_or(0);
            }
            _ => {}
        }
        // SAFETY: as above: walking the same control buffer.
        c = unsafe { libc::CMSG_NXTHDR(hdr, c) };
    }
}

/// Room for the `UDP_SEGMENT` control message (a u16), padded as CMSG_SPACE pads it.
const GSO_CMSG_SPACE: usize = 24;

/// Why a batch stopped short.
#[derive(Debug)]
pub(crate) enum SendStop {
    /// The socket buffer is full (`EAGAIN`): what is left is lost, as on a full link.
    Full,
    /// The kernel refused the datagram at the stopping point: `EIO`/`EINVAL` for a segmented one
    /// means this path cannot segment (no checksum offload, an old kernel).
    Refused(io::Error),
}

impl SendStop {
    /// Why the send that just failed stopped (`errno`).
    fn last() -> Self {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock { Self::Full } else { Self::Refused(e) }
    }

    /// A refusal that reports an ICMP error (port or host unreachable) a connected socket
    /// received for an earlier datagram: the kernel returns it before building the packet.
    pub(crate) fn is_icmp_report(&self) -> bool {
        matches!(self, Self::Refused(e) if matches!(
            e.raw_os_error(),
            Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH)
        ))
    }
}

/// One datagram to send: its destination and the parts the kernel gathers into it (headers,
/// payload straight from registered memory, trailer: no copy in user space). With `segment`
/// set, the kernel cuts it into datagrams of that many bytes, the last possibly shorter
/// (`UDP_SEGMENT`, udp(7)).
pub(crate) struct Datagram<'a, P: Iterator<Item = &'a [u8]>> {
    /// Where it goes; `None` from a connected socket (which has one destination).
    pub(crate) dst: Option<SocketAddr>,
    pub(crate) parts: P,
    pub(crate) segment: Option<u16>,
}

/// Up to `sendmmsg`'s batch of headers, addresses, iovecs and control messages, reused from
/// one send to the next (a send allocates nothing once they have grown). Between calls of
/// [`SendBatch::send`] they hold no pointer anyone relies on.
#[derive(Default)]
pub(crate) struct SendBatch {
    names: Vec<(libc::sockaddr_storage, libc::socklen_t)>,
    /// Every datagram's iovecs, one after another; `spans` says whose are whose.
    iovs: Vec<libc::iovec>,
    spans: Vec<(usize, usize, Option<u16>)>,
    controls: Vec<[u64; GSO_CMSG_SPACE / 8]>,
    msgs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers in `iovs` and `msgs` are written and read only inside `send`, which
// takes `&mut self`, and point only at memory that call borrows.
unsafe impl Send for SendBatch {}

impl SendBatch {
    /// Sends `datagrams` from `sock` with as few `sendmmsg` calls as possible (a lone small
    /// one by `sendto`). Returns how many the kernel took and, if that is not all, why it
    /// stopped.
    pub(crate) fn send<'a, P: Iterator<Item = &'a [u8]>>(
        &mut self,
        sock: &UdpSocket,
        datagrams: impl Iterator<Item = Datagram<'a, P>>,
    ) -> (usize, Option<SendStop>) {
        self.names.clear();
        self.iovs.clear();
        self.spans.clear();
        // A lone unsegmented datagram of at most SMALL_DATAGRAM bytes is gathered here and
        // goes by `sendto`: for a 64-byte message's 88-byte datagram the kernel then takes
        // about 0.2 µs less than for `sendmmsg` of one header and three iovecs (no header or
        // iovec array to import). A longer one keeps what was gathered as its first iovec.
        let mut small = [0u8; SMALL_DATAGRAM];
        let mut datagrams = datagrams.peekable();
        if let Some(Datagram { dst, mut parts, segment: None }) =
            datagrams.next_if(|d| d.segment.is_none())
        {
            let (mut len, mut over) = (0, None);
            if datagrams.peek().is_none() {
                for p in parts.by_ref() {
                    let Some(to) = small.get_mut(len..len + p.len()) else {
                        over = Some(p);
                        break;
                    };
                    to.copy_from_slice(p);
                    len += p.len();
                }
                if over.is_none() {
                    return send_small(sock, dst, &small[..len]);
                }
            }
            let gathered = (len > 0).then(|| iovec(&small[..len]));
            self.push(
                dst,
                None,
                gathered.into_iter().chain(over.into_iter().chain(parts).map(iovec)),
            );
        }
        for d in datagrams {
            self.push(d.dst, d.segment, d.parts.map(iovec));
        }
        let n = self.spans.len();
        self.controls.resize(n, [0; GSO_CMSG_SPACE / 8]);
        // SAFETY: mmsghdr is plain old data; all zeroes is a valid value.
        self.msgs.resize_with(n, || unsafe { core::mem::zeroed() });
        // Every vector is complete: the pointers taken below stay valid until the send ends.
        for (i, m) in self.msgs.iter_mut().enumerate() {
            let (first, count, segment) = self.spans[i];
            m.msg_len = 0;
            m.msg_hdr.msg_name = if self.names[i].1 == 0 {
                core::ptr::null_mut()
            } else {
                (&raw mut self.names[i].0).cast()
            };
            m.msg_hdr.msg_namelen = self.names[i].1;
            m.msg_hdr.msg_iov = self.iovs[first..].as_mut_ptr();
            m.msg_hdr.msg_iovlen = count;
            m.msg_hdr.msg_flags = 0;
            match segment {
                None => {
                    m.msg_hdr.msg_control = core::ptr::null_mut();
                    m.msg_hdr.msg_controllen = 0;
                }
                Some(size) => write_segment_cmsg(m, &mut self.controls[i], size),
            }
        }
        let mut sent = 0;
        while sent < n {
            let chunk = &mut self.msgs[sent..n.min(sent + 64)];
            let ret = if let [one] = chunk {
                // One datagram (a segmented run, say: a reply and the ACK behind it): `sendmsg`
                // takes about 0.1 µs less than `sendmmsg` of one.
                // SAFETY: as below, for the one header.
                let len = unsafe {
                    libc::sendmsg(sock.as_raw_fd(), &raw const one.msg_hdr, libc::MSG_DONTWAIT)
                };
                if len < 0 { -1 } else { 1 }
            } else {
                // SAFETY: every header points at a live sockaddr of its stated length, at its
                // iovecs, each into a buffer the caller lends for this call and the kernel only
                // reads, and at a control buffer of its stated length (or none).
                unsafe {
                    libc::sendmmsg(
                        sock.as_raw_fd(),
                        chunk.as_mut_ptr(),
                        chunk.len() as libc::c_uint,
                        libc::MSG_DONTWAIT,
                    )
                }
            };
            if ret < 0 {
                self.iovs.clear();
                return (sent, Some(SendStop::last()));
            }
            // Short of the chunk: the kernel stopped at the next one; sending it again says why.
            sent += ret as usize;
        }
        self.iovs.clear();
        (sent, None)
    }

    /// Adds a datagram to the batch: its destination, segment size and iovecs.
    fn push(
        &mut self,
        dst: Option<SocketAddr>,
        segment: Option<u16>,
        iovs: impl Iterator<Item = libc::iovec>,
    ) {
        // SAFETY: sockaddr_storage is plain old data; all zeroes is a valid value.
        let none = || (unsafe { core::mem::zeroed() }, 0);
        self.names.push(dst.map_or_else(none, sockaddr_of));
        let first = self.iovs.len();
        self.iovs.extend(iovs);
        self.spans.push((first, self.iovs.len() - first, segment));
    }
}

/// The iovec of `b` (the kernel only reads through it).
fn iovec(b: &[u8]) -> libc::iovec {
    libc::iovec { iov_base: b.as_ptr().cast_mut().cast(), iov_len: b.len() }
}

/// Longest datagram [`SendBatch::send`] gathers into one buffer when it sends it alone.
const SMALL_DATAGRAM: usize = 512;

/// Sends `bytes` as one datagram to `dst` (`None`: a connected socket's peer) by `sendto`.
fn send_small(
    sock: &UdpSocket,
    dst: Option<SocketAddr>,
    bytes: &[u8],
) -> (usize, Option<SendStop>) {
    let name = dst.map(sockaddr_of);
    let (name_ptr, name_len) = match &name {
        Some((storage, len)) => ((&raw const *storage).cast::<libc::sockaddr>(), *len),
        None => (core::ptr::null(), 0),
    };
    // SAFETY: `bytes` and the name (if any, a live sockaddr of its stated length) stay
    // borrowed across the call, and the kernel only reads them.
    let ret = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_DONTWAIT,
            name_ptr,
            name_len,
        )
    };
    if ret >= 0 { (1, None) } else { (0, Some(SendStop::last())) }
}

/// Points `m` at `control`, holding one `UDP_SEGMENT` message of `size` (udp(7)).
fn write_segment_cmsg(m: &mut libc::mmsghdr, control: &mut [u64; GSO_CMSG_SPACE / 8], size: u16) {
    m.msg_hdr.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a length.
    m.msg_hdr.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as usize;
    // SAFETY: the control buffer is GSO_CMSG_SPACE bytes, at least CMSG_SPACE(2), so the first
    // header fits; CMSG_FIRSTHDR returns a pointer into it.
    let c = unsafe { libc::CMSG_FIRSTHDR(&raw const m.msg_hdr) };
    let header = libc::cmsghdr {
        // SAFETY: CMSG_LEN only computes a length.
        cmsg_len: unsafe { libc::CMSG_LEN(2) } as usize,
        cmsg_level: libc::SOL_UDP,
        cmsg_type: libc::UDP_SEGMENT,
    };
    // SAFETY: `c` points at the start of the (8-byte aligned) control buffer.
    unsafe { core::ptr::write(c, header) };
    // SAFETY: `c` is the header just written inside the control buffer.
    let data = unsafe { libc::CMSG_DATA(c) };
    // SAFETY: CMSG_DATA of that header points inside the buffer, with room for a u16
    // (CMSG_LEN(2) bytes were counted); it may be unaligned for a u16.
    unsafe { core::ptr::write_unaligned(data.cast::<u16>(), size) };
}

/// A Linux eventfd: a counter that wakes `poll` when non-zero (completion channels and the
/// progress thread's wake-up).
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
    /// Made with [`EventFd::new_blocking`]: reads look first, so none blocks.
    blocking: bool,
}

impl EventFd {
    /// A non-blocking eventfd at zero.
    pub fn new() -> io::Result<Self> {
        Self::with_flags(libc::EFD_CLOEXEC | libc::EFD_NONBLOCK, false)
    }

    /// A blocking eventfd at zero, for a descriptor handed to an application that chooses its
    /// mode itself (`ibv_comp_channel.fd`: `ibv_get_cq_event` blocks unless the application
    /// sets `O_NONBLOCK`). [`EventFd::take`] polls before it reads, so it never blocks.
    pub fn new_blocking() -> io::Result<Self> {
        Self::with_flags(libc::EFD_CLOEXEC, true)
    }

    fn with_flags(flags: libc::c_int, blocking: bool) -> io::Result<Self> {
        // SAFETY: eventfd(2) with plain integer arguments; the result is checked.
        let fd = check(unsafe { libc::eventfd(0, flags) })?;
        // SAFETY: `fd` was just returned by eventfd(2) and is owned by nothing else.
        Ok(Self { fd: unsafe { OwnedFd::from_raw_fd(fd) }, blocking })
    }

    /// Adds one.
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one`, as eventfd(2) requires. A full counter
        // (EAGAIN) already wakes every waiter, so the result is ignored.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// Reads and clears the counter; 0 if it was zero.
    pub fn take(&self) -> u64 {
        if self.blocking && !readable_now(self.fd.as_raw_fd()) {
            return 0;
        }
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into `v`, as eventfd(2) requires.
        let ret = unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut v).cast(), 8) };
        if ret == 8 { v } else { 0 }
    }

    /// Clears a counter known to be non-zero (its owner signaled it and nobody else reads
    /// it): one `read`, which cannot block.
    pub fn take_signaled(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into `v`, as eventfd(2) requires.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut v).cast(), 8) };
    }

    /// Blocks until the counter is non-zero or `timeout_ms` passes (-1: forever); then
    /// takes it. Returns the value taken.
    pub fn wait(&self, timeout_ms: i32) -> io::Result<u64> {
        poll_readable(&[self.fd.as_raw_fd()], timeout_ms)?;
        Ok(self.take())
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A Linux timerfd on `CLOCK_MONOTONIC`, non-blocking: readable once it expires. A verb that
/// brings a deadline forward arms it instead of waking the progress thread (a context switch
/// on each `ibv_post_send` that starts a retransmission timer); the thread sleeps in `poll`
/// on it with its sockets.
#[derive(Debug)]
pub(crate) struct TimerFd {
    fd: OwnedFd,
}

impl TimerFd {
    /// A disarmed timer.
    pub(crate) fn new() -> io::Result<Self> {
        let flags = libc::TFD_CLOEXEC | libc::TFD_NONBLOCK;
        // SAFETY: timerfd_create(2) with plain integer arguments; the result is checked.
        let fd = check(unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, flags) })?;
        // SAFETY: `fd` was just returned by timerfd_create(2) and is owned by nothing else.
        Ok(Self { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Expires once, `after_ns` from now (at least 1 ns: zero would disarm it).
    pub(crate) fn arm_in(&self, after_ns: u64) {
        let ns = after_ns.max(1);
        let value = libc::timespec {
            tv_sec: libc::time_t::try_from(ns / 1_000_000_000).unwrap_or(libc::time_t::MAX),
            // Below 10^9: fits every c_long.
            tv_nsec: libc::c_long::try_from(ns % 1_000_000_000).unwrap_or(0),
        };
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        let spec = libc::itimerspec { it_interval: zero, it_value: value };
        // SAFETY: timerfd_settime(2) reads the live `spec`; the old value is not asked for.
        // It fails only for a bad descriptor or value, neither possible here.
        let _ = unsafe {
            libc::timerfd_settime(self.fd.as_raw_fd(), 0, &raw const spec, core::ptr::null_mut())
        };
    }

    /// Clears an expiry (readable no more until armed and expired again).
    pub(crate) fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into `v`, as timerfd(2) requires; EAGAIN when not expired.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut v).cast(), 8) };
    }
}

impl AsRawFd for TimerFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// The MTU of the network interface that holds `addr`, if one does: `getifaddrs(3)` finds the
/// interface, `SIOCGIFMTU` on `sock` reads its MTU (both see the caller's network namespace).
pub(crate) fn interface_mtu(sock: &impl AsRawFd, addr: IpAddr) -> Option<u32> {
    let (name, _, _) = interfaces().into_iter().find(|(_, a, _)| *a == addr)?;
    let mut ifr_name = [0 as libc::c_char; libc::IFNAMSIZ];
    for (d, s) in ifr_name.iter_mut().zip(name.bytes().take(libc::IFNAMSIZ - 1)) {
        *d = s as libc::c_char;
    }
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut ifr: libc::ifreq = unsafe { core::mem::zeroed() };
    ifr.ifr_name = ifr_name;
    // SAFETY: SIOCGIFMTU reads the named interface's MTU into the live `ifr`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFMTU, &raw mut ifr) } != 0 {
        return None;
    }
    // SAFETY: SIOCGIFMTU sets the `ifru_mtu` member of the union.
    u32::try_from(unsafe { ifr.ifr_ifru.ifru_mtu }).ok()
}

/// The network interface that holds `addr`: the one with that address, else the one whose
/// subnet contains it (`127.0.0.2` is on `lo` by its `127.0.0.1/8`). RoCE names it as the
/// GID's netdev (`gid_attrs/ndevs`).
pub fn interface_of(addr: IpAddr) -> Option<String> {
    let all = interfaces();
    let exact = all.iter().find(|(_, a, _)| *a == addr);
    let within = || {
        all.iter().find(|(_, a, mask)| match (a, mask, addr) {
            (IpAddr::V4(a), Some(IpAddr::V4(m)), IpAddr::V4(x)) => {
                u32::from(*a) & u32::from(*m) == u32::from(x) & u32::from(*m)
            }
            (IpAddr::V6(a), Some(IpAddr::V6(m)), IpAddr::V6(x)) => {
                u128::from(*a) & u128::from(*m) == u128::from(x) & u128::from(*m)
            }
            _ => false,
        })
    };
    exact.or_else(within).map(|(name, _, _)| name.clone())
}

/// Every interface address: (interface name, address, netmask).
fn interfaces() -> Vec<(String, IpAddr, Option<IpAddr>)> {
    let mut out = Vec::new();
    let mut list: *mut libc::ifaddrs = core::ptr::null_mut();
    // SAFETY: getifaddrs(3) fills `list` with a list this function frees below.
    if unsafe { libc::getifaddrs(&raw mut list) } != 0 {
        return out;
    }
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        // SAFETY: a non-NULL ifa_addr points to a sockaddr of the family it names.
        let ip = (!ifa.ifa_addr.is_null()).then(|| unsafe { sockaddr_ip(ifa.ifa_addr) }).flatten();
        // SAFETY: as above, for the netmask.
        let mask = (!ifa.ifa_netmask.is_null()).then(|| unsafe { sockaddr_ip(ifa.ifa_netmask) });
        if let Some(ip) = ip {
            // SAFETY: ifa_name is a NUL-terminated interface name.
            let name = unsafe { core::ffi::CStr::from_ptr(ifa.ifa_name) };
            out.push((name.to_string_lossy().into_owned(), ip, mask.flatten()));
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: frees the list getifaddrs returned; no node is used after this.
    unsafe { libc::freeifaddrs(list) };
    out
}

/// The IP address of a sockaddr, for the IPv4 and IPv6 families.
///
/// # Safety
///
/// `sa` points to a sockaddr whose size matches its family.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    // SAFETY: the caller's contract; every sockaddr starts with its family.
    let family = libc::c_int::from(unsafe { (*sa).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET sockaddr is a sockaddr_in.
            let sin = unsafe { &*sa.cast::<libc::sockaddr_in>() };
            Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
            let sin6 = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
            Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
        }
        _ => None,
    }
}

/// As [`poll_readable`], with a timeout in nanoseconds (`None`: forever): `ppoll(2)`, so a
/// timer due in 30 µs is not rounded up to a millisecond.
pub(crate) fn poll_readable_ns(fds: &[RawFd], timeout_ns: Option<u64>) -> io::Result<()> {
    let mut pfds: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let ts = timeout_ns.map(|ns| libc::timespec {
        tv_sec: libc::time_t::try_from(ns / 1_000_000_000).unwrap_or(libc::time_t::MAX),
        // Below 10^9: fits every c_long.
        tv_nsec: libc::c_long::try_from(ns % 1_000_000_000).unwrap_or(0),
    });
    let ts_ptr = ts.as_ref().map_or(core::ptr::null(), core::ptr::from_ref);
    let n = pfds.len() as libc::nfds_t;
    // SAFETY: `pfds` holds `n` live pollfd structures; `ts_ptr` is NULL or a live timespec;
    // no signal mask is passed.
    let ret = unsafe { libc::ppoll(pfds.as_mut_ptr(), n, ts_ptr, core::ptr::null()) };
    if ret < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// Blocks until `fd` is readable or `timeout_ms` passes (-1: forever), for a thread of the
/// application: a signal interrupts the wait with `EINTR`, as the `read(2)` the verbs wait
/// in on Linux is (qperf ends its tests with `SIGALRM` and expects `ibv_get_cq_event` to
/// return).
pub(crate) fn wait_readable(fd: RawFd, timeout_ms: i32) -> io::Result<()> {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: poll(2) on one live pollfd.
    let ret = unsafe { libc::poll(&raw mut pfd, 1, timeout_ms) };
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Puts the calling thread under `SCHED_FIFO` at `priority`.
pub(crate) fn set_realtime(priority: libc::c_int) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: priority };
    // SAFETY: pid 0 is the calling thread; `param` is a live sched_param.
    check(unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &raw const param) }).map(|_| ())
}

/// Sets the calling thread's timer slack (how late the kernel may wake a timed wait, 50 µs by
/// default) to `ns`.
pub(crate) fn set_timer_slack_ns(ns: u64) {
    let ns = libc::c_ulong::try_from(ns).unwrap_or(libc::c_ulong::MAX);
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns) };
}

/// Whether `fd` is readable now (a `poll` with no wait).
pub(crate) fn readable_now(fd: RawFd) -> bool {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one live pollfd.
    let ret = unsafe { libc::poll(&raw mut pfd, 1, 0) };
    ret == 1 && pfd.revents & libc::POLLIN != 0
}

/// Blocks until one of `fds` is readable or `timeout_ms` passes (-1: forever). `EINTR`
/// counts as a timeout.
pub(crate) fn poll_readable(fds: &[RawFd], timeout_ms: i32) -> io::Result<()> {
    let ns = u64::try_from(timeout_ms).ok().map(|ms| ms.saturating_mul(1_000_000));
    poll_readable_ns(fds, ns)
}

/// A zeroed, page-aligned allocation that never moves: registered memory. Its bytes are only
/// ever touched through raw pointers (by the engine under the device lock, and by the
/// accessors of the safe API under the same lock), never through a Rust reference that could
/// alias a concurrent write.
#[derive(Debug)]
pub struct RawRegion {
    ptr: core::ptr::NonNull<u8>,
    len: usize,
    locked: bool,
    /// Whether the region allocated its bytes (and frees them on drop), or borrows memory the
    /// application owns ([`RawRegion::borrowed`]).
    owned: bool,
}

// SAFETY: the region is a plain heap allocation; every access to its bytes is serialized by
// the owning device's lock, so moving or sharing the handle across threads is sound.
unsafe impl Send for RawRegion {}
// SAFETY: as above: `&RawRegion` gives no unsynchronized access to the bytes.
unsafe impl Sync for RawRegion {}

const PAGE: usize = 4096;

impl RawRegion {
    /// `len` zeroed bytes, page-aligned; with `lock`, pinned in RAM by `mlock` (best effort:
    /// `locked()` says whether it worked).
    pub fn new(len: usize, lock: bool) -> io::Result<Self> {
        let size = len.max(1).next_multiple_of(PAGE);
        let layout = std::alloc::Layout::from_size_align(size, PAGE)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = core::ptr::NonNull::new(raw)
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        // SAFETY: `ptr` is a live allocation of `size` bytes.
        let locked = lock && unsafe { libc::mlock(ptr.as_ptr().cast(), size) } == 0;
        Ok(Self { ptr, len, locked, owned: true })
    }

    /// A region over `len` bytes at `addr` that the application owns: what `ibv_reg_mr` does
    /// with arbitrary memory. Dropping it leaves the memory alone.
    ///
    /// # Safety
    ///
    /// The bytes must stay allocated, and be reached by nothing but this region's accessors
    /// and the device engine while the region is registered (the verbs contract: memory stays
    /// valid until `ibv_dereg_mr`, and the application does not touch memory a posted work
    /// request targets until it completes).
    pub unsafe fn borrowed(addr: *mut u8, len: usize) -> io::Result<Self> {
        let ptr = core::ptr::NonNull::new(addr)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "null address"))?;
        Ok(Self { ptr, len, locked: false, owned: false })
    }

    /// Its address: the virtual address the region is registered at.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `mlock` pinned it.
    pub fn locked(&self) -> bool {
        self.locked
    }

    /// Copies bytes `offset..offset + dst.len()` out; a [`guard::Fault`] if the application
    /// has unmapped them since it registered them. Panics if out of range.
    ///
    /// # Safety
    ///
    /// No write to those bytes may run concurrently (the caller holds the device lock).
    pub(crate) unsafe fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), guard::Fault> {
        assert!(
            offset.checked_add(dst.len()).is_some_and(|end| end <= self.len),
            "region read out of range"
        );
        let from = self.ptr.as_ptr().wrapping_add(offset);
        // SAFETY: in range of the registration, which the application may have unmapped (the
        // guarded copy's fault); no concurrent write (the caller's contract); `dst` is ours.
        unsafe { guard::read_from(from, dst) }
    }

    /// Copies `src` in at `offset`; a [`guard::Fault`] if the application has unmapped (or
    /// write-protected) those bytes since it registered them. Panics if out of range.
    ///
    /// # Safety
    ///
    /// No other access to those bytes may run concurrently (the caller holds the device lock).
    pub(crate) unsafe fn write(&self, offset: usize, src: &[u8]) -> Result<(), guard::Fault> {
        assert!(
            offset.checked_add(src.len()).is_some_and(|end| end <= self.len),
            "region write out of range"
        );
        let to = self.ptr.as_ptr().wrapping_add(offset);
        // SAFETY: in range of the registration, which may be unmapped (the guarded copy's
        // fault); exclusive (the caller's contract); `src` is separate.
        unsafe { guard::write_to(to, src) }
    }

    /// Whether bytes `offset..offset + len` are still mapped. Panics if out of range.
    pub(crate) fn readable(&self, offset: usize, len: usize) -> Result<(), guard::Fault> {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "region probe out of range"
        );
        // SAFETY: in range of the registration; a probe reads one byte per page into a
        // buffer of its own and writes nothing the region holds.
        unsafe { guard::readable(self.ptr.as_ptr().wrapping_add(offset), len) }
    }

    /// Bytes `offset..offset + len` in place. Panics if out of range.
    ///
    /// # Safety
    ///
    /// Nothing may write those bytes while the slice lives.
    pub(crate) unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "region slice out of range"
        );
        // SAFETY: in range (checked above), so the offset pointer stays in the allocation.
        let at = unsafe { self.ptr.as_ptr().add(offset) };
        // SAFETY: `len` bytes from `at` are inside a live allocation; no writer (the caller's
        // contract).
        unsafe { core::slice::from_raw_parts(at, len) }
    }

    /// A shared slice over the whole region.
    ///
    /// # Safety
    ///
    /// While the slice lives nothing may write the region: no posted receive, RDMA WRITE or
    /// atomic targeting it, no READ landing in it, no write through the API.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: a live allocation of at least `len` bytes; no writer (the caller's contract).
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for RawRegion {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let size = self.len.max(1).next_multiple_of(PAGE);
        if self.locked {
            // SAFETY: unlocks what `new` locked.
            unsafe { libc::munlock(self.ptr.as_ptr().cast(), size) };
        }
        // `new` built this layout successfully, so it is valid.
        let Ok(layout) = std::alloc::Layout::from_size_align(size, PAGE) else { return };
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// How many times the calling thread has been preempted: involuntary context switches
/// (getrusage(2) `RUSAGE_THREAD`, `ru_nivcsw`). A spinning thread that sees it grow is
/// spinning on a CPU another thread wanted.
pub(crate) fn thread_preemptions() -> u64 {
    // SAFETY: rusage is plain old data; all zeroes is a valid value.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: getrusage(2) fills the live `ru`.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &raw mut ru) };
    u64::try_from(ru.ru_nivcsw).unwrap_or(0)
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process of the host (through the
/// vDSO, no system call), for stamps other processes read.
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime(2) fills the live `ts`; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// The CPU the calling thread runs on now (sched_getcpu(3): glibc reads it from the thread's
/// rseq area or the vDSO, no system call), or `None` where the kernel cannot tell.
pub(crate) fn current_cpu() -> Option<u32> {
    // SAFETY: sched_getcpu(3) takes no arguments and touches no memory of ours.
    let cpu = unsafe { libc::sched_getcpu() };
    u32::try_from(cpu).ok()
}

/// CPU time this process has used: (user, system).
pub fn process_cpu_time() -> (core::time::Duration, core::time::Duration) {
    // SAFETY: rusage is plain old data; all zeroes is a valid value.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: getrusage(2) fills the live `ru`.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &raw mut ru) };
    let tv =
        |t: libc::timeval| core::time::Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// Sets a socket's send and receive buffers to `bytes`. The kernel caps the plain request at
/// `net.core.wmem_max`/`rmem_max`; with `CAP_NET_ADMIN` the FORCE variants go beyond.
pub fn set_socket_buffers(sock: &impl AsRawFd, bytes: usize) -> io::Result<()> {
    let fd = sock.as_raw_fd();
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    for (force, plain) in
        [(libc::SO_SNDBUFFORCE, libc::SO_SNDBUF), (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF)]
    {
        if setsockopt_int(fd, libc::SOL_SOCKET, force, v).is_err() {
            setsockopt_int(fd, libc::SOL_SOCKET, plain, v)?;
        }
    }
    Ok(())
}

/// The send and receive buffer sizes the kernel gives `sock` (`SO_SNDBUF`, `SO_RCVBUF`; Linux
/// reports twice what was asked, its bookkeeping included).
pub fn socket_buffers(sock: &impl AsRawFd) -> io::Result<(usize, usize)> {
    let fd = sock.as_raw_fd();
    let get = |name| -> io::Result<usize> {
        let mut value: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `value` is a live c_int and `len` its size, as getsockopt(2) requires.
        let ret = unsafe {
            libc::getsockopt(fd, libc::SOL_SOCKET, name, (&raw mut value).cast(), &raw mut len)
        };
        check(ret)?;
        Ok(usize::try_from(value).unwrap_or(0))
    };
    Ok((get(libc::SO_SNDBUF)?, get(libc::SO_RCVBUF)?))
}

/// The CPUs the calling thread may run on (`sched_getaffinity(2)`).
pub fn current_thread_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain old data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    // SAFETY: writes at most `size_of::<cpu_set_t>()` bytes into the live set; pid 0 is this
    // thread.
    check(unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &raw mut set) })?;
    // SAFETY: CPU_ISSET reads the live set at an index below CPU_SETSIZE.
    Ok((0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
}

/// Moves the calling thread off CPU `cpu` now and leaves its affinity as it was: sets its
/// mask without `cpu` (sched_setaffinity(2) migrates a thread off a CPU its new mask excludes
/// before it returns), then restores the mask. `false` if the mask allows no other CPU (or
/// cannot be read), and nothing changed.
pub(crate) fn move_off_cpu(cpu: u32) -> bool {
    let Ok(cpu) = usize::try_from(cpu) else { return false };
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    let size = size_of::<libc::cpu_set_t>();
    // SAFETY: cpu_set_t is plain old data; all zeroes is the empty set.
    let mut mask: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    // SAFETY: writes at most `size` bytes into the live set; pid 0 is this thread.
    if unsafe { libc::sched_getaffinity(0, size, &raw mut mask) } != 0 {
        return false;
    }
    let mut others = mask;
    // SAFETY: `cpu` is below CPU_SETSIZE (checked above) and the set is live.
    unsafe { libc::CPU_CLR(cpu, &mut others) };
    // SAFETY: CPU_COUNT reads the live set.
    if unsafe { libc::CPU_COUNT(&others) } == 0 {
        return false;
    }
    // SAFETY: reads `size` bytes of the live set; pid 0 is this thread.
    if unsafe { libc::sched_setaffinity(0, size, &raw const others) } != 0 {
        return false;
    }
    // SAFETY: as above; the mask the thread had.
    unsafe { libc::sched_setaffinity(0, size, &raw const mask) };
    true
}

/// Pins the calling thread to CPU `cpu` (`sched_setaffinity(2)`).
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no such CPU"));
    }
    // SAFETY: cpu_set_t is plain old data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (checked above) and the set is live.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: reads `size_of::<cpu_set_t>()` bytes of the live set; pid 0 is this thread.
    check(unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set) })
        .map(drop)
}

/// Asks the kernel to end this process with SIGTERM when its parent exits
/// (`prctl(PR_SET_PDEATHSIG)`), so a helper process never outlives the program that started it
/// (even when that program is killed). `parent` is the pid the parent gave it: returns `false`
/// if that process is no longer the parent (it died before the request took effect).
pub fn die_with_parent(parent: u32) -> io::Result<bool> {
    // SAFETY: prctl(2) with PR_SET_PDEATHSIG takes a signal number; the rest are unused.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) })?;
    // SAFETY: getppid(2) has no preconditions.
    let now = unsafe { libc::getppid() };
    Ok(u32::try_from(now).is_ok_and(|p| p == parent))
}

/// Faults in every page of `len` bytes at `addr`, readable, or writable with `write`
/// (`madvise(2)` `MADV_POPULATE_READ`/`_WRITE`, Linux 5.14): what an ODP prefetch
/// (`ibv_advise_mr(3)`) does on a NIC, here for the CPU's page tables. Nothing is read or
/// written; an error (EFAULT, ENOMEM) for memory not mapped with that access.
pub(crate) fn populate(addr: u64, len: u64, write: bool) -> io::Result<()> {
    let start = addr & !(PAGE as u64 - 1);
    let end = addr.checked_add(len).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let span =
        usize::try_from(end - start).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let advice = if write { libc::MADV_POPULATE_WRITE } else { libc::MADV_POPULATE_READ };
    // SAFETY: madvise with a populate advice only faults pages in; it neither reads nor
    // writes their contents nor changes the mapping, so no Rust-visible memory changes.
    check(unsafe { libc::madvise(start as *mut libc::c_void, span, advice) }).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After a call that found nothing, a receive takes the one datagram it waited for and
    /// returns (a trickle's next packet goes on at once); the next call takes the rest in a
    /// batch. An empty datagram counts as one either way.
    #[test]
    fn a_receive_after_an_empty_one_takes_one_datagram_then_batches() {
        let rx = udp_socket("127.0.61.7:0".parse().unwrap(), false, false).unwrap();
        let tx = UdpSocket::bind("127.0.61.8:0").unwrap();
        let to = rx.local_addr().unwrap();
        let mut batch = RecvBatch::new(8, 256);
        assert_eq!(batch.recv(&rx).unwrap(), 0);
        for len in [0, 10, 20] {
            tx.send_to(&[7; 20][..len], to).unwrap();
        }
        assert_eq!(batch.recv(&rx).unwrap(), 1);
        assert_eq!(batch.meta[0].len, 0);
        assert_eq!(batch.meta[0].src, tx.local_addr().unwrap());
        assert_eq!(batch.recv(&rx).unwrap(), 2);
        assert_eq!((batch.payload(0), batch.payload(1)), (&[7; 10][..], &[7; 20][..]));
        assert_eq!(batch.recv(&rx).unwrap(), 0);
    }

    /// A lone datagram leaves whole whether it fits the gather buffer (`sendto`), outgrows it
    /// part-way (what was gathered goes first, then the rest as iovecs) or from its first part,
    /// and so does each of a batch.
    #[test]
    fn a_lone_datagram_leaves_whole_wherever_its_parts_outgrow_the_gather_buffer() {
        let rx = UdpSocket::bind("127.0.61.11:0").unwrap();
        rx.set_read_timeout(Some(core::time::Duration::from_secs(5))).unwrap();
        let to = rx.local_addr().unwrap();
        let tx = udp_socket("127.0.61.12:0".parse().unwrap(), false, false).unwrap();
        let bytes: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let mut batch = SendBatch::default();
        let mut got = vec![0u8; 9000];
        for lens in [
            &[12, 64, 4][..],
            &[12, SMALL_DATAGRAM - 16, 4],
            &[12, SMALL_DATAGRAM - 15, 4],
            &[SMALL_DATAGRAM + 1, 4],
            &[12, 4096, 4],
            &[],
        ] {
            let mut at = 0;
            let parts: Vec<&[u8]> = lens
                .iter()
                .map(|&l| {
                    at += l;
                    &bytes[at - l..at]
                })
                .collect();
            let d = Datagram { dst: Some(to), parts: parts.iter().copied(), segment: None };
            let (sent, stop) = batch.send(&tx, core::iter::once(d));
            assert!(sent == 1 && stop.is_none(), "{lens:?}: {stop:?}");
            let n = rx.recv(&mut got).unwrap();
            assert!(got[..n] == bytes[..at], "{lens:?}: {n} bytes arrived, not the {at} sent");
        }
        let two = [&bytes[..100], &bytes[100..200]].map(|p| Datagram {
            dst: Some(to),
            parts: core::iter::once(p),
            segment: None,
        });
        assert_eq!(batch.send(&tx, two.into_iter()).0, 2);
        for want in [&bytes[..100], &bytes[100..200]] {
            let n = rx.recv(&mut got).unwrap();
            assert_eq!(&got[..n], want);
        }
    }

    /// `move_off_cpu` leaves the thread on another CPU of its mask, and the mask as it was;
    /// with no other CPU in the mask it does nothing.
    #[test]
    fn a_thread_moves_off_a_cpu_and_keeps_its_affinity() {
        let cpus = current_thread_cpus().unwrap();
        let mine = std::thread::spawn(move || {
            let here = current_cpu().unwrap();
            let moved = move_off_cpu(here);
            (here, moved, current_cpu().unwrap(), current_thread_cpus().unwrap())
        });
        let (before, moved, after, mask) = mine.join().unwrap();
        if cpus.len() < 2 {
            eprintln!("skipped: one CPU, nowhere to move");
            return;
        }
        assert!(moved && after != before, "still on CPU {after}");
        assert_eq!(mask, cpus, "the mask was not restored");
        let single = std::thread::spawn(|| {
            let here = current_cpu().unwrap();
            pin_current_thread(usize::try_from(here).unwrap()).unwrap();
            move_off_cpu(here)
        });
        assert!(!single.join().unwrap(), "moved although pinned");
    }

    /// The preemptions the progress thread counts while it spins (`progress_spins_preempted`):
    /// a thread spinning on a CPU another spinning thread is pinned to is preempted within the
    /// scheduler's slices.
    #[test]
    #[expect(clippy::disallowed_methods, reason = "the test spins by the wall clock")]
    fn a_thread_spinning_beside_another_on_its_cpu_counts_preemptions() {
        let cpu = current_thread_cpus().unwrap()[0];
        let spin = move || {
            pin_current_thread(cpu).unwrap();
            let start = std::time::Instant::now();
            while start.elapsed() < core::time::Duration::from_millis(200) {
                core::hint::spin_loop();
            }
        };
        let measured = std::thread::spawn(move || {
            pin_current_thread(cpu).unwrap();
            let before = thread_preemptions();
            let rival = std::thread::spawn(spin);
            spin();
            rival.join().unwrap();
            thread_preemptions() - before
        });
        let preemptions = measured.join().unwrap();
        assert!(preemptions > 0, "two threads spun on CPU {cpu} for 200 ms, none preempted");
    }
}
