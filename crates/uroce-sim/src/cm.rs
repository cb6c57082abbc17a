//! A communication manager as a node of the fabric.

use core::net::{IpAddr, SocketAddr};

use uroce_cm::{Cm, Event};
use uroce_engine::Instant;

use crate::{Datagram, Node};

/// The UDP port QP1's MADs travel on here (RoCEv2's; the fabric routes on the address alone).
const PORT: u16 = 4791;

/// A [`Cm`] on the simulated fabric: each MAD travels as the whole payload of one datagram (the
/// 256 bytes QP1 carries, without the headers around them), so the links' loss, duplication,
/// reordering and corruption reach the CM as they would on a network.
///
/// The consumer is the test: it answers [`CmNode::events`] between steps through the public
/// `cm`, and what it sends leaves at the next step, at the same virtual time. Run the fabric
/// with [`CmNode::has_events`] as the condition to stop as soon as a consumer has something to
/// answer:
///
/// ```
/// # use core::net::IpAddr;
/// # use uroce_cm::{Cm, Config};
/// # use uroce_engine::{Duration, Instant};
/// use uroce_sim::{CmNode, Fabric};
/// let a: IpAddr = "10.0.0.1".parse().unwrap();
/// let mut fabric = Fabric::new(1);
/// fabric.add_node(CmNode::new(a, Cm::new(Config::new(1, 0, 1))));
/// let deadline = Instant::ZERO + Duration::from_secs(1);
/// while fabric.run_until(deadline, CmNode::has_events) {
///     for e in fabric[0].events.drain(..) { /* answer e through fabric[0].cm */ }
/// }
/// ```
pub struct CmNode {
    addr: IpAddr,
    /// The CM; the test calls its consumer API between steps.
    pub cm: Cm,
    /// Events taken from the CM and not yet answered, oldest first.
    pub events: Vec<Event>,
}

impl CmNode {
    /// A CM receiving at `addr`.
    pub fn new(addr: IpAddr, cm: Cm) -> Self {
        Self { addr, cm, events: Vec::new() }
    }

    /// Moves the CM's events into [`CmNode::events`]; whether any are waiting.
    pub fn collect_events(&mut self) -> bool {
        while let Some(e) = self.cm.poll_event() {
            self.events.push(e);
        }
        !self.events.is_empty()
    }

    /// Whether any CM on `fabric` has events for its consumer (collecting them): the
    /// condition for [`crate::Fabric::run_until`].
    pub fn has_events(fabric: &mut crate::Fabric<Self>) -> bool {
        let mut any = false;
        for i in 0..fabric.len() {
            any |= fabric[i].collect_events();
        }
        any
    }
}

impl Node for CmNode {
    fn addr(&self) -> IpAddr {
        self.addr
    }

    fn handle_datagram(&mut self, now: Instant, d: &Datagram) {
        self.cm.handle_mad(now, d.src.ip(), &d.payload);
    }

    fn poll_transmit(&mut self, _now: Instant) -> Option<Datagram> {
        let (to, mad) = self.cm.poll_transmit()?;
        let (src, dst) = (SocketAddr::new(self.addr, PORT), SocketAddr::new(to, PORT));
        Some(Datagram { src, dst, payload: mad.to_vec() })
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.cm.poll_timeout()
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.cm.handle_timeout(now);
    }
}
