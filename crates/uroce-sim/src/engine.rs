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
    /// Take packets as a scatter/gather runtime does ([`Device::poll_transmit_gather`]).
    gather: bool,
    pieces: Vec<uroce_engine::device::Piece>,
    /// How datagrams reach the device.
    pub path: Path,
}

/// The path datagrams take to a [`DeviceNode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Path {
    /// A network: the sender's ICRC arrives and the receiver checks it.
    #[default]
    Wire,
    /// A path that guarantees integrity, as shared memory does: the ICRC is left out (zeroed
    /// on the way) and the receiver is told not to check it ([`Device::handle_datagram_intact`]).
    Intact,
    /// The ICRC zeroed on the way but the packet taken as from a network: what a receiver sees
    /// if an intact path's packets reach it over the wire. Every one must fail the ICRC check.
    ZeroIcrcOnWire,
}

impl<M: MemoryAccess> DeviceNode<M> {
    /// Wraps a device.
    pub fn new(dev: Device<M>) -> Self {
        Self {
            dev,
            buf: Vec::with_capacity(4200),
            gather: false,
            pieces: Vec::new(),
            path: Path::Wire,
        }
    }

    /// Takes packets with their payload left in memory, as the socket runtime does, and
    /// assembles each datagram from headers, memory and trailer.
    #[must_use]
    pub fn gathering(mut self, on: bool) -> Self {
        self.gather = on;
        self
    }
}

impl<M: MemoryAccess> Node for DeviceNode<M> {
    fn addr(&self) -> IpAddr {
        self.dev.addr()
    }

    fn handle_datagram(&mut self, now: Instant, d: &Datagram) {
        let rx = RxInfo::new(d.src, d.dst.ip());
        match self.path {
            Path::Wire => self.dev.handle_datagram(now, &rx, &d.payload),
            Path::Intact => self.dev.handle_datagram_intact(now, &rx, &zero_icrc(&d.payload)),
            Path::ZeroIcrcOnWire => self.dev.handle_datagram(now, &rx, &zero_icrc(&d.payload)),
        }
    }

    fn joined(&self, group: IpAddr) -> bool {
        self.dev.multicast_groups().any(|g| g == group)
    }

    fn poll_transmit(&mut self, now: Instant) -> Option<Datagram> {
        let src_ip = self.dev.addr();
        // A runtime skips polling where the device says it has nothing: it must never be
        // wrong about a packet (every simulated test checks it).
        let has_output = self.dev.has_output(now);
        let datagram = self.take_datagram(now, src_ip);
        assert!(has_output || datagram.is_none(), "has_output denied a packet");
        datagram
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.dev.poll_timeout()
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.dev.handle_timeout(now);
    }
}

impl<M: MemoryAccess> DeviceNode<M> {
    /// The next packet, whole.
    fn take_datagram(&mut self, now: Instant, src_ip: IpAddr) -> Option<Datagram> {
        if !self.gather {
            let tx = self.dev.poll_transmit(now, &mut self.buf)?;
            let src = SocketAddr::new(src_ip, tx.src_port);
            return Some(Datagram { src, dst: tx.dst, payload: self.buf.clone() });
        }
        let tx = self.dev.poll_transmit_gather(now, &mut self.buf, &mut self.pieces)?;
        let payload = match tx.payload_at {
            None => self.buf.clone(),
            Some(h) => {
                let mut p = self.buf[..h].to_vec();
                for &(addr, len) in &self.pieces {
                    // The engine lent these pieces, so the memory has them.
                    p.extend_from_slice(self.dev.memory().slice(addr, len as usize)?);
                }
                p.extend_from_slice(&self.buf[h..]);
                p
            }
        };
        Some(Datagram { src: SocketAddr::new(src_ip, tx.src_port), dst: tx.dst, payload })
    }
}

/// `packet` with its ICRC (the last four bytes) zeroed, as a path that leaves it out sends it.
fn zero_icrc(packet: &[u8]) -> Vec<u8> {
    let mut packet = packet.to_vec();
    let icrc = packet.len().saturating_sub(4);
    packet[icrc..].fill(0);
    packet
}
