//! Capture (`UROCE_PCAP`): every packet the wrapped fabric sends or delivers, written to a
//! pcap file with Ethernet framing, whichever path it took.

use core::net::{IpAddr, SocketAddr};
use core::time::Duration;
use std::fs::File;
use std::io::BufWriter;

use uroce_engine::{Instant, RxInfo};
use uroce_wire::ROCE_V2_PORT;
use uroce_wire::pcap::PcapWriter;

use super::{Fabric, Outgoing, Sink, with_icrc};
use crate::device::NetCounters;
use crate::sys::memory::Registry;

/// A fabric whose traffic is captured.
pub(crate) struct Capture<F> {
    inner: F,
    pcap: PcapWriter<BufWriter<File>>,
    addr: IpAddr,
    origin: std::time::Instant,
    /// Wall-clock time at `origin`, for timestamps.
    wall_origin: Duration,
}

impl<F: Fabric> Capture<F> {
    pub(crate) fn new(
        inner: F,
        pcap: PcapWriter<BufWriter<File>>,
        addr: IpAddr,
        origin: std::time::Instant,
        wall_origin: Duration,
    ) -> Self {
        Self { inner, pcap, addr, origin, wall_origin }
    }
}

impl<F: Fabric> Fabric for Capture<F> {
    /// Records what left, once it has: a packet sent through the kernel's UDP path is sealed
    /// there for the IPv4 identification its socket gives it (a connected socket's counter,
    /// segment k of a segmented send), and the frame written shows that identification and
    /// that ICRC, as the wire does. A packet for a local peer's ring gets its ICRC here (0).
    fn transmit(&mut self, out: &mut Vec<Outgoing>, mem: &Registry, c: &mut NetCounters) {
        self.inner.transmit(out, mem, c);
        let ts = self.wall_origin + self.origin.elapsed();
        for o in out.iter_mut() {
            o.fill_icrc(mem, SocketAddr::new(self.addr, o.port));
            o.materialize(mem);
            let _ = self.pcap.write_roce(ts, SocketAddr::new(self.addr, o.port), o.dst, &o.bytes);
        }
        let _ = self.pcap.flush();
    }

    fn receive(&mut self, now: Instant, c: &mut NetCounters, sink: &mut Sink<'_>) -> usize {
        let (pcap, origin, wall) = (&mut self.pcap, self.origin, self.wall_origin);
        let n = self.inner.receive(now, c, &mut |rx: &RxInfo, bytes: &[u8], intact| {
            let ts = wall + origin.elapsed();
            let dst = SocketAddr::new(rx.dst, ROCE_V2_PORT);
            // Every captured packet carries a valid ICRC, whichever path it took.
            let _ = if intact {
                pcap.write_roce(ts, rx.src, dst, &with_icrc(rx, bytes))
            } else {
                pcap.write_roce(ts, rx.src, dst, bytes)
            };
            sink(rx, bytes, intact);
        });
        if n > 0 {
            let _ = self.pcap.flush();
        }
        n
    }

    super::delegate_to_inner!();
}
