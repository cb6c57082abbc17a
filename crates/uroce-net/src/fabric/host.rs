//! The fabric of a host-wide device: shared memory to the device's (and the host's) other
//! local endpoints, UDP to everything else.
//!
//! A packet goes through shared memory when its destination address is a local device and its
//! destination QPN belongs to a live endpoint there (the QPN's slot, see [`crate::host`]);
//! otherwise through the kernel's UDP path. `UROCE_FABRIC=udp` sends everything through UDP.
//!
//! The device's port is shared (`SO_REUSEPORT`), so the kernel hands a datagram from the wire
//! to any one of the device's processes. The one that receives a datagram for a QPN it does
//! not own forwards it, unchanged, into the owner's ring (`udp_rx_forwarded`): routing by
//! destination QPN, as a NIC demultiplexes.

use core::net::{IpAddr, SocketAddr};
use std::io;
use std::os::fd::RawFd;

use uroce_engine::RxInfo;
use uroce_wire::ROCE_V2_PORT;

use super::shm::Shm;
use super::udp::Udp;
use super::{Fabric, Outgoing, Sink, dest_qpn};
use crate::device::NetCounters;
use crate::sys::memory::Registry;

/// UDP plus, where a host directory could be opened, shared memory.
pub(crate) struct HostFabric {
    addr: IpAddr,
    udp: Udp,
    shm: Option<Shm>,
    /// `UROCE_FABRIC=udp`: send every packet through UDP (received ones for another local
    /// endpoint are still handed over in shared memory: that is the device's own routing).
    udp_only: bool,
    udp_out: Vec<Outgoing>,
    done: Vec<Outgoing>,
}

impl HostFabric {
    pub(crate) fn new(addr: IpAddr, udp: Udp, shm: Option<Shm>, udp_only: bool) -> Self {
        Self { addr, udp, shm, udp_only, udp_out: Vec::new(), done: Vec::new() }
    }
}

impl Fabric for HostFabric {
    fn transmit(&mut self, out: &mut Vec<Outgoing>, mem: &Registry, c: &mut NetCounters) {
        let Some(shm) = self.shm.as_mut().filter(|_| !self.udp_only) else {
            self.udp.transmit(out, mem, c);
            return;
        };
        for o in out.drain(..) {
            let local = (o.dst.port() == ROCE_V2_PORT)
                .then(|| dest_qpn(&o.bytes))
                .flatten()
                .and_then(|q| shm.owner_of(o.dst.ip(), q));
            match local {
                Some(slot) => {
                    // A full ring loses the packet (counted), as a congested switch would.
                    shm.push_outgoing(slot, SocketAddr::new(self.addr, o.port), &o, mem, c);
                    self.done.push(o);
                }
                None => self.udp_out.push(o),
            }
        }
        shm.commit(c);
        self.udp.transmit(&mut self.udp_out, mem, c);
        out.append(&mut self.udp_out);
        out.append(&mut self.done);
    }

    fn receive(&mut self, c: &mut NetCounters, sink: &mut Sink<'_>) -> usize {
        let Some(shm) = self.shm.as_mut() else { return self.udp.receive(c, sink) };
        let mut n = shm.receive(c, sink);
        let mut side = NetCounters::default();
        n += self.udp.receive(c, &mut |rx: &RxInfo, bytes: &[u8]| {
            if let Some(slot) = dest_qpn(bytes).and_then(|q| shm.owner_of(rx.dst, q)) {
                let mut parts = core::iter::once(bytes);
                if shm.push(slot, rx, &mut parts, bytes.len(), &mut side) {
                    side.udp_rx_forwarded += 1;
                }
                return;
            }
            sink(rx, bytes);
        });
        shm.commit(&mut side);
        *c += side;
        n
    }

    fn wait_fds(&self, fds: &mut Vec<RawFd>) {
        self.udp.wait_fds(fds);
        if let Some(shm) = &self.shm {
            fds.push(shm.wake_fd());
        }
    }

    fn prepare_sleep(&mut self) -> bool {
        self.shm.as_mut().is_none_or(Shm::prepare_sleep)
    }

    fn woken(&mut self) {
        if let Some(shm) = &mut self.shm {
            shm.woken();
        }
    }

    fn sync_multicast(&mut self, groups: &[IpAddr]) -> io::Result<()> {
        self.udp.sync_multicast(groups)
    }
}
