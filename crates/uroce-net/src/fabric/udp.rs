//! The kernel's UDP path: the device's port 4791 (shared by every process of the device
//! through `SO_REUSEPORT`), a send socket per UDP source port, and multicast group sockets.

use core::net::{IpAddr, SocketAddr};
use std::collections::HashMap;
use std::io;
use std::net::UdpSocket;
use std::os::fd::{AsRawFd, RawFd};

use uroce_engine::{Instant, RxInfo};
use uroce_wire::ROCE_V2_PORT;

use super::{Fabric, Outgoing, Sink};
use crate::device::NetCounters;
use crate::sys::memory::Registry;
use crate::sys::{self, RecvBatch};

const RECV_BATCH: usize = 32;

/// UDP sockets of one device address.
pub(crate) struct Udp {
    addr: IpAddr,
    main: UdpSocket,
    /// Send sockets by UDP source port (each QP's flow entropy; RoCEv2 sends to 4791 from a
    /// per-flow port, and a UDP socket sends from the port it is bound to). Shared ports too:
    /// two processes may pick the same source port.
    send_socks: HashMap<u16, UdpSocket>,
    /// Receive sockets of the multicast groups QPs are attached to.
    mcast_socks: Vec<(IpAddr, UdpSocket)>,
    recv: RecvBatch,
}

impl Udp {
    /// Binds the device's RoCEv2 port on `addr`, shared with the device's other processes.
    pub(crate) fn bind(addr: IpAddr) -> io::Result<Self> {
        let main = sys::udp_socket(SocketAddr::new(addr, ROCE_V2_PORT), false, true)?;
        Ok(Self {
            addr,
            main,
            send_socks: HashMap::new(),
            mcast_socks: Vec::new(),
            recv: RecvBatch::new(RECV_BATCH),
        })
    }

    /// The MTU of the address's interface.
    pub(crate) fn interface_mtu(&self) -> Option<u32> {
        sys::interface_mtu(&self.main, self.addr)
    }

    /// The socket that sends from UDP source port `port`, bound on first use.
    fn send_sock(&mut self, port: u16) -> Option<&UdpSocket> {
        if !self.send_socks.contains_key(&port) {
            let s = sys::udp_socket(SocketAddr::new(self.addr, port), false, true).ok()?;
            sys::set_multicast_if(&s, self.addr).ok()?;
            self.send_socks.insert(port, s);
        }
        self.send_socks.get(&port)
    }

    fn drain(
        recv: &mut RecvBatch,
        sock: &UdpSocket,
        addr: IpAddr,
        c: &mut NetCounters,
        sink: &mut Sink<'_>,
    ) -> usize {
        let mut total = 0;
        for _ in 0..16 {
            let Ok(n) = recv.recv(sock) else { break };
            if n == 0 {
                break;
            }
            c.rx_batches += 1;
            c.rx_datagrams += n as u64;
            total += n;
            for i in 0..n {
                let meta = recv.meta[i];
                let rx = RxInfo {
                    src: meta.src,
                    dst: meta.dst.unwrap_or(addr),
                    tclass: meta.tclass,
                    hop_limit: meta.hop_limit,
                    flow_label: 0,
                };
                sink(&rx, recv.payload(i), false);
            }
            if n < RECV_BATCH {
                break;
            }
        }
        total
    }
}

impl Fabric for Udp {
    /// One `sendmmsg` per run of one source port, each packet gathered from its headers, its
    /// payload in registered memory and its trailer (no copy in user space).
    fn transmit(&mut self, out: &mut Vec<Outgoing>, mem: &Registry, c: &mut NetCounters) {
        let mut start = 0;
        while start < out.len() {
            let port = out[start].port;
            let end =
                out[start..].iter().position(|o| o.port != port).map_or(out.len(), |k| start + k);
            let run = &out[start..end];
            let sent = match self.send_sock(port) {
                Some(sock) => {
                    let list: Vec<(SocketAddr, Vec<&[u8]>)> =
                        run.iter().map(|o| (o.dst, o.parts(mem).collect())).collect();
                    sys::send_batch(sock, &list).unwrap_or(0)
                }
                None => 0,
            };
            for o in run.iter().take(sent).filter(|o| o.payload_at.is_some()) {
                c.tx_zero_copy += 1;
                c.tx_zero_copy_bytes += o.zero_copy_bytes();
            }
            c.tx_batches += 1;
            c.tx_datagrams += sent as u64;
            c.tx_errors += (run.len() - sent) as u64;
            start = end;
        }
    }

    fn receive(&mut self, _now: Instant, c: &mut NetCounters, sink: &mut Sink<'_>) -> usize {
        let mut n = Self::drain(&mut self.recv, &self.main, self.addr, c, sink);
        for (_, sock) in &self.mcast_socks {
            n += Self::drain(&mut self.recv, sock, self.addr, c, sink);
        }
        n
    }

    fn wait_fds(&self, fds: &mut Vec<RawFd>) {
        fds.push(self.main.as_raw_fd());
        fds.extend(self.mcast_socks.iter().map(|(_, s)| s.as_raw_fd()));
    }

    fn sync_multicast(&mut self, groups: &[IpAddr]) -> io::Result<()> {
        self.mcast_socks.retain(|(g, _)| groups.contains(g));
        for &g in groups {
            if !self.mcast_socks.iter().any(|(m, _)| *m == g) {
                let s = sys::udp_socket(SocketAddr::new(g, ROCE_V2_PORT), true, false)?;
                sys::join_multicast(&s, g, self.addr)?;
                self.mcast_socks.push((g, s));
            }
        }
        Ok(())
    }
}
