//! The engine's [`Device`] as a node of the fabric.

use core::net::{IpAddr, SocketAddr};

use uroce_engine::{Device, Instant, MemoryAccess, RxInfo};

use crate::{Datagram, Node};

/// A uroce device on the simulated fabric: datagrams in and out, timers driven by the fabric's
/// virtual clock.
pub struct DeviceNode<M> {
    /// The device; tests post work and poll completions through it between steps.
    pub dev: Device<M>,
    buf: Vec<u8>,
}

impl<M: MemoryAccess> DeviceNode<M> {
    /// Wraps a device.
    pub fn new(dev: Device<M>) -> Self {
        Self { dev, buf: Vec::with_capacity(4200) }
    }
}

impl<M: MemoryAccess> Node for DeviceNode<M> {
    fn addr(&self) -> IpAddr {
        self.dev.addr()
    }

    fn handle_datagram(&mut self, now: Instant, d: &Datagram) {
        self.dev.handle_datagram(now, &RxInfo::new(d.src, d.dst.ip()), &d.payload);
    }

    fn joined(&self, group: IpAddr) -> bool {
        self.dev.multicast_groups().any(|g| g == group)
    }

    fn poll_transmit(&mut self, now: Instant) -> Option<Datagram> {
        let tx = self.dev.poll_transmit(now, &mut self.buf)?;
        let src = SocketAddr::new(self.dev.addr(), tx.src_port);
        Some(Datagram { src, dst: tx.dst, payload: self.buf.clone() })
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.dev.poll_timeout()
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.dev.handle_timeout(now);
    }
}
