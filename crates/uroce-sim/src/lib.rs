//! A deterministic simulated fabric for testing uroce: hosts joined by lossy links and driven by
//! a virtual clock.
//!
//! [`Fabric`] owns a set of [`Node`]s (hosts: the engine's device behind a small adapter, or a
//! test double) and one [`LinkConfig`] per directed pair of nodes. It is a discrete-event loop in
//! the manner of smoltcp's netsim and quinn's test `Pair`: [`Fabric::step`] delivers the datagrams
//! that are due, fires the nodes' timers, collects what the nodes send and jumps the clock to the
//! next event. Nothing waits for real time, so a retry timeout of seconds costs microseconds.
//!
//! # Determinism
//!
//! A run is a pure function of the fabric's seed, the link configurations, the filters and the
//! nodes' own behaviour: this crate reads no clock, spawns no thread and never sleeps. Each
//! directed link draws from its own [`Rng`] stream derived from (seed, from, to), so configuring
//! links in another order, or adding faults to one link, changes no other link's random draws.
//! Events due at the same instant are handled in a fixed order: deliveries by (time, enqueue
//! sequence number), then timeouts and transmissions in node index order.
//!
//! # Use
//!
//! ```
//! use core::net::{IpAddr, SocketAddr};
//! use uroce_engine::{Duration, Instant};
//! use uroce_sim::{Datagram, Fabric, LinkConfig, Node};
//!
//! /// Sends what is in `out`, counts what arrives.
//! struct Host { addr: SocketAddr, out: Vec<Datagram>, got: usize }
//!
//! impl Node for Host {
//!     fn addr(&self) -> IpAddr { self.addr.ip() }
//!     fn handle_datagram(&mut self, _now: Instant, _d: &Datagram) { self.got += 1; }
//!     fn poll_transmit(&mut self, _now: Instant) -> Option<Datagram> { self.out.pop() }
//!     fn poll_timeout(&self) -> Option<Instant> { None }
//!     fn handle_timeout(&mut self, _now: Instant) {}
//! }
//!
//! let (a, b): (SocketAddr, SocketAddr) = ("10.0.0.1:4791".parse()?, "10.0.0.2:4791".parse()?);
//! let mut fabric = Fabric::new(7);
//! fabric.set_all_links(LinkConfig::default().delay(Duration::from_micros(10)));
//! let hello = Datagram { src: a, dst: b, payload: b"hello".to_vec() };
//! fabric.add_node(Host { addr: a, out: vec![hello], got: 0 });
//! let rx = fabric.add_node(Host { addr: b, out: Vec::new(), got: 0 });
//! let deadline = Instant::ZERO + Duration::from_millis(1);
//! assert!(fabric.run_until(deadline, |f| f.node(rx).got == 1));
//! assert_eq!(fabric.now(), Instant::ZERO + Duration::from_micros(10)); // virtual time
//! assert_eq!(fabric.link_stats(0, rx).delivered, 1);
//! # Ok::<(), core::net::AddrParseError>(())
//! ```
//!
//! Wrap a randomized scenario in [`sweep`] to run it under many seeds; a failure names the seed
//! and the command that reruns exactly it.
#![forbid(unsafe_code)]

pub mod adversary;
mod cm;
pub mod cm_adversary;
mod engine;
pub use cm::CmNode;
pub use engine::{DeviceNode, Path};

use core::net::{IpAddr, SocketAddr};
use core::ops::{AddAssign, Range};
use std::collections::{BTreeMap, HashMap};
use std::env::{self, VarError};
use std::io::{self, Write};
use std::panic::{self, AssertUnwindSafe};

use uroce_engine::{Duration, Instant};
use uroce_wire::pcap::PcapWriter;

/// A UDP datagram on the simulated fabric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// The sender's address and UDP port.
    pub src: SocketAddr,
    /// The receiver's address and UDP port; the fabric routes on the IP address alone.
    pub dst: SocketAddr,
    /// The UDP payload (for uroce, a RoCEv2 packet: BTH through ICRC).
    pub payload: Vec<u8>,
}

/// A host on the fabric (the engine's Device implements this through a small adapter).
pub trait Node {
    /// The IP address the node receives at; datagrams are routed by destination IP. It must not
    /// change once the node is added.
    fn addr(&self) -> IpAddr;
    /// Takes in a datagram that arrived at `now`.
    fn handle_datagram(&mut self, now: Instant, datagram: &Datagram);
    /// The next datagram to send at `now`, if any; called until it returns `None`.
    fn poll_transmit(&mut self, now: Instant) -> Option<Datagram>;
    /// The next instant at which the node wants [`Node::handle_timeout`], if any.
    fn poll_timeout(&self) -> Option<Instant>;
    /// Called at `now` once `now` has reached the instant [`Node::poll_timeout`] returned.
    fn handle_timeout(&mut self, now: Instant);
    /// Whether the node has joined multicast group `group`: a datagram to a group goes to every
    /// other node that joined it, each copy through its own link. None by default.
    fn joined(&self, group: IpAddr) -> bool {
        let _ = group;
        false
    }
}

pub use uroce_engine::faults::Faults;
use uroce_engine::faults::{flip_bit, random_bit};
pub use uroce_engine::seeded::Rng;

/// How a directed link treats the datagrams sent on it. Build one from [`LinkConfig::default`]
/// (2 µs fixed delay, no faults). The probability setters panic on a value outside 0..=1 (NaN
/// included): configuration is test code, so a mistake should stop the test, not be clamped.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkConfig {
    delay: Duration,
    jitter: Duration,
    faults: Faults,
    reorder_delay: Duration,
    dead: Vec<(Instant, Instant)>,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            delay: Duration::from_micros(2),
            jitter: Duration::ZERO,
            faults: Faults::default(),
            reorder_delay: Duration::ZERO,
            dead: Vec::new(),
        }
    }
}

/// Returns `p`, or panics naming the setting if it is not a probability (NaN included).
fn probability(setting: &str, p: f64) -> f64 {
    assert!((0.0..=1.0).contains(&p), "LinkConfig::{setting}: {p} is not in 0..=1");
    p
}

impl LinkConfig {
    /// Every datagram takes `delay` (propagation plus serialisation) before any jitter.
    #[must_use]
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Adds a uniform extra delay in `0..jitter` per datagram, which reorders datagrams sent
    /// closer together than `jitter`.
    #[must_use]
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// Drops each datagram with probability `p`. Panics if `p` is not in 0..=1.
    #[must_use]
    pub fn loss(mut self, p: f64) -> Self {
        self.faults.loss = probability("loss", p);
        self
    }

    /// Delivers a second copy of each datagram with probability `p`; the copy draws its own
    /// jitter. Panics if `p` is not in 0..=1.
    #[must_use]
    pub fn duplicate(mut self, p: f64) -> Self {
        self.faults.dup = probability("duplicate", p);
        self
    }

    /// Flips exactly one uniformly chosen payload bit of each datagram with probability `p`
    /// (the ICRC must catch it); empty payloads are left alone. Panics if `p` is not in 0..=1.
    #[must_use]
    pub fn corrupt(mut self, p: f64) -> Self {
        self.faults.corrupt = probability("corrupt", p);
        self
    }

    /// Holds each datagram back by an extra `hold` with probability `p`, so that later ones
    /// overtake it. Panics if `p` is not in 0..=1.
    #[must_use]
    pub fn reorder(mut self, p: f64, hold: Duration) -> Self {
        self.faults.reorder = probability("reorder", p);
        self.reorder_delay = hold;
        self
    }

    /// All four random faults at once, in the runtime's terms (`UROCE_FAULTS`, so a fault mix
    /// measured on real sockets can be replayed here), with `hold` as the extra delay of a
    /// reordered datagram. Panics if a probability is not in 0..=1.
    #[must_use]
    pub fn faults(mut self, faults: Faults, hold: Duration) -> Self {
        if let Err(e) = faults.check() {
            panic!("LinkConfig::faults: {e}");
        }
        self.faults = faults;
        self.reorder_delay = hold;
        self
    }

    /// Adds a window `start..end` (end excluded) during which everything sent on the link is
    /// dropped: a partition, to exercise retry exhaustion. Datagrams already in flight arrive.
    #[must_use]
    pub fn dead(mut self, start: Instant, end: Instant) -> Self {
        self.dead.push((start, end));
        self
    }

    fn is_dead_at(&self, t: Instant) -> bool {
        self.dead.iter().any(|&(start, end)| start <= t && t < end)
    }

    fn jitter_sample(&self, rng: &mut Rng) -> Duration {
        match self.jitter.as_nanos() {
            0 => Duration::ZERO,
            j => Duration::from_nanos(rng.gen_range(0..j)),
        }
    }
}

/// What a scripted [`Filter`] does with one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Leave it to the link's random faults.
    Pass,
    /// Drop it (counted in [`LinkStats::dropped_by_filter`]).
    Drop,
    /// Add this much delay, then apply the random faults.
    Delay(Duration),
    /// Flip one random payload bit, then apply the random faults.
    Corrupt,
}

/// A scripted fault: called with every datagram sent on a link and its index on that link
/// (0 for the first), before the dead windows and the random faults.
pub type Filter = Box<dyn FnMut(&Datagram, u64) -> Action>;

/// Counters of one directed link.
///
/// Every datagram sent is counted in `sent` and then in exactly one of `lost`, `dropped_dead`,
/// `dropped_by_filter` or, once it arrives, `delivered`; each extra copy is counted in
/// `duplicated` and, once it arrives, `delivered`. So `sent + duplicated == delivered + lost +
/// dropped_dead + dropped_by_filter + (copies still in flight)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkStats {
    /// Datagrams the sender handed to the link.
    pub sent: u64,
    /// Datagrams (copies included) handed to the receiver.
    pub delivered: u64,
    /// Datagrams dropped by the random `loss`.
    pub lost: u64,
    /// Extra copies made by `duplicate`.
    pub duplicated: u64,
    /// Datagrams with one bit flipped (randomly or by [`Action::Corrupt`]).
    pub corrupted: u64,
    /// Datagrams held back by `reorder`.
    pub reordered: u64,
    /// Datagrams sent during a dead window.
    pub dropped_dead: u64,
    /// Datagrams a filter dropped.
    pub dropped_by_filter: u64,
}

impl AddAssign for LinkStats {
    fn add_assign(&mut self, o: Self) {
        self.sent += o.sent;
        self.delivered += o.delivered;
        self.lost += o.lost;
        self.duplicated += o.duplicated;
        self.corrupted += o.corrupted;
        self.reordered += o.reordered;
        self.dropped_dead += o.dropped_dead;
        self.dropped_by_filter += o.dropped_by_filter;
    }
}

/// One directed link: its configuration, random stream, counters and filter.
struct Link {
    config: LinkConfig,
    rng: Rng,
    stats: LinkStats,
    filter: Option<Filter>,
}

impl Link {
    /// Runs `datagram`, sent at `now`, through the filter, the dead windows and the random
    /// faults. Returns its delivery time and that of a duplicate, or `None` if it is dropped.
    fn transmit(
        &mut self,
        now: Instant,
        datagram: &mut Datagram,
    ) -> Option<(Instant, Option<Instant>)> {
        let index = self.stats.sent;
        self.stats.sent += 1;
        let (mut extra, mut forced_corrupt) = (Duration::ZERO, false);
        match self.filter.as_mut().map_or(Action::Pass, |f| f(datagram, index)) {
            Action::Pass => {}
            Action::Drop => {
                self.stats.dropped_by_filter += 1;
                return None;
            }
            Action::Delay(d) => extra = d,
            Action::Corrupt => forced_corrupt = true,
        }
        let (cfg, rng) = (&self.config, &mut self.rng);
        if cfg.is_dead_at(now) {
            self.stats.dropped_dead += 1;
            return None;
        }
        let fate = cfg.faults.fate(rng, datagram.payload.len());
        if fate.drop {
            self.stats.lost += 1;
            return None;
        }
        // A filter's Corrupt flips a bit of its own when the random draw did not.
        let len = datagram.payload.len();
        let flip = fate.flip.or_else(|| forced_corrupt.then(|| random_bit(rng, len)).flatten());
        if let Some(bit) = flip {
            flip_bit(&mut datagram.payload, bit);
            self.stats.corrupted += 1;
        }
        let mut delay = cfg.delay + extra;
        if fate.hold {
            delay = delay + cfg.reorder_delay;
            self.stats.reordered += 1;
        }
        let at = now + delay + cfg.jitter_sample(rng);
        let copy = fate.duplicate.then(|| now + delay + cfg.jitter_sample(rng));
        self.stats.duplicated += u64::from(copy.is_some());
        Some((at, copy))
    }
}

/// A datagram on its way across the link `from → to`.
struct InFlight {
    from: usize,
    to: usize,
    datagram: Datagram,
}

/// Nodes joined by lossy links, driven by a virtual clock; see the [crate docs](crate).
pub struct Fabric<N: Node> {
    seed: u64,
    now: Instant,
    nodes: Vec<N>,
    routes: HashMap<IpAddr, usize>,
    /// `links[from][to]`.
    links: Vec<Vec<Link>>,
    default_link: LinkConfig,
    /// Keyed by (delivery time, enqueue sequence number): iteration order is delivery order.
    in_flight: BTreeMap<(Instant, u64), InFlight>,
    next_seq: u64,
    unroutable: u64,
    capture: Option<PcapWriter<Box<dyn Write>>>,
    capture_error: Option<io::Error>,
    /// Every datagram sent, when [`Fabric::record_sent`] asked for it.
    sent: Option<Vec<Sent>>,
}

/// A datagram as it left its sender (before any fault), kept by [`Fabric::record_sent`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// The virtual time it was sent at.
    pub at: Instant,
    /// The index of the node that sent it.
    pub from: usize,
    /// The datagram itself.
    pub datagram: Datagram,
}

impl<N: Node> Fabric<N> {
    /// An empty fabric at virtual time zero whose links draw randomness from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            now: Instant::ZERO,
            nodes: Vec::new(),
            routes: HashMap::new(),
            links: Vec::new(),
            default_link: LinkConfig::default(),
            in_flight: BTreeMap::new(),
            next_seq: 0,
            unroutable: 0,
            capture: None,
            capture_error: None,
            sent: None,
        }
    }

    /// The seed the fabric was created with.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The current virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Adds a node and returns its index. Its links, to and from every node (itself included),
    /// get the configuration last given to [`Fabric::set_all_links`], or the default.
    ///
    /// # Panics
    ///
    /// If another node already has the same address.
    pub fn add_node(&mut self, node: N) -> usize {
        let index = self.nodes.len();
        let prior = self.routes.insert(node.addr(), index);
        assert!(prior.is_none(), "Fabric::add_node: two nodes at {}", node.addr());
        self.nodes.push(node);
        let (seed, cfg) = (self.seed, &self.default_link);
        let link = |from, to| Link {
            config: cfg.clone(),
            rng: Rng::for_link(seed, from, to),
            stats: LinkStats::default(),
            filter: None,
        };
        for (from, row) in self.links.iter_mut().enumerate() {
            row.push(link(from, index));
        }
        self.links.push((0..=index).map(|to| link(index, to)).collect());
        index
    }

    /// How many nodes there are.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The node at `index`. Panics if there is none.
    pub fn node(&self, index: usize) -> &N {
        &self.nodes[index]
    }

    /// The node at `index`, mutably. Panics if there is none.
    pub fn node_mut(&mut self, index: usize) -> &mut N {
        &mut self.nodes[index]
    }

    /// Configures the directed link `from → to` (its random stream and counters carry on).
    /// Panics if either node does not exist.
    pub fn set_link(&mut self, from: usize, to: usize, config: LinkConfig) {
        self.links[from][to].config = config;
    }

    /// Configures every directed link, and the links of nodes added later.
    pub fn set_all_links(&mut self, config: LinkConfig) {
        for link in self.links.iter_mut().flatten() {
            link.config = config.clone();
        }
        self.default_link = config;
    }

    /// Installs a scripted fault on `from → to`, replacing any earlier one; it sees each datagram
    /// before the link's random faults. Panics if either node does not exist.
    pub fn set_filter(
        &mut self,
        from: usize,
        to: usize,
        filter: impl FnMut(&Datagram, u64) -> Action + 'static,
    ) {
        self.links[from][to].filter = Some(Box::new(filter));
    }

    /// Removes the filter of `from → to`. Panics if either node does not exist.
    pub fn clear_filter(&mut self, from: usize, to: usize) {
        self.links[from][to].filter = None;
    }

    /// The counters of `from → to`. Panics if either node does not exist.
    pub fn link_stats(&self, from: usize, to: usize) -> LinkStats {
        self.links[from][to].stats
    }

    /// The counters of all links added up.
    pub fn total_stats(&self) -> LinkStats {
        let mut total = LinkStats::default();
        for link in self.links.iter().flatten() {
            total += link.stats;
        }
        total
    }

    /// Datagrams sent to an address no node has (dropped).
    pub fn unroutable(&self) -> u64 {
        self.unroutable
    }

    /// Datagrams (copies included) on their way.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Writes a pcap header to `out`, then every datagram as it leaves its sender (before any
    /// fault, so lost and unroutable ones are captured too), stamped with the virtual time.
    /// Replaces a capture in progress without flushing it.
    pub fn capture_to(&mut self, out: impl Write + 'static) -> io::Result<()> {
        self.capture = Some(PcapWriter::new(Box::new(out) as Box<dyn Write>)?);
        self.capture_error = None;
        Ok(())
    }

    /// Keeps every datagram sent from now on in memory, in order, as it leaves its sender (before
    /// any fault, like a capture), for a test to read back with [`Fabric::sent`]; `false` stops
    /// and forgets them.
    pub fn record_sent(&mut self, on: bool) {
        self.sent = on.then(Vec::new);
    }

    /// The datagrams recorded since [`Fabric::record_sent`] (none if it was not called).
    pub fn sent(&self) -> &[Sent] {
        self.sent.as_deref().unwrap_or_default()
    }

    /// Stops capturing and flushes. Returns the first error met while capturing, if any: a write
    /// error, or a datagram the pcap writer cannot frame (which also stopped the capture).
    pub fn finish_capture(&mut self) -> io::Result<()> {
        let capture = self.capture.take();
        if let Some(e) = self.capture_error.take() {
            return Err(e);
        }
        capture.map_or(Ok(()), |c| c.into_inner().map(drop))
    }

    /// Runs one round at the current time: delivers every datagram due, calls
    /// [`Node::handle_timeout`] on every node whose timeout is due, and hands everything the
    /// nodes transmit to the links. Then advances the clock to the next delivery or timeout and
    /// returns true, or returns false (without moving the clock) if nothing is pending.
    ///
    /// A node whose timeout is still at or before the current time after this round (it did not
    /// re-arm past `now`) is treated as due one nanosecond later, so the clock always moves.
    pub fn step(&mut self) -> bool {
        self.process();
        match self.next_event() {
            Some(t) => {
                self.now = t;
                true
            }
            None => false,
        }
    }

    /// Steps until `done` returns true (checked before the first step and after every step) or
    /// until the next event lies beyond `deadline`. Returns whether `done` became true; if not,
    /// the clock is left at `deadline` (or where it was, if that is later), with every event up
    /// to and including `deadline` handled.
    pub fn run_until(
        &mut self,
        deadline: Instant,
        mut done: impl FnMut(&mut Self) -> bool,
    ) -> bool {
        if done(self) {
            return true;
        }
        while self.now <= deadline {
            self.process();
            if done(self) {
                return true;
            }
            match self.next_event() {
                Some(t) if t <= deadline => self.now = t,
                _ => break,
            }
        }
        self.now = self.now.max(deadline);
        false
    }

    /// Handles events until none is pending (returns true, the clock at the last event handled)
    /// or the next lies beyond `deadline` (returns false, the clock left before it): what a
    /// scripted test wants after posting work, "run until the network is quiet".
    pub fn run_until_idle(&mut self, deadline: Instant) -> bool {
        loop {
            self.process();
            match self.next_event() {
                Some(t) if t <= deadline => self.now = t,
                Some(_) => return false,
                None => return true,
            }
        }
    }

    /// Runs every event in the next `span` of virtual time and leaves the clock at its end.
    pub fn run_for(&mut self, span: Duration) {
        let deadline = self.now + span;
        self.run_until(deadline, |_| false);
    }

    /// The three phases of a step, at `self.now`.
    fn process(&mut self) {
        let now = self.now;
        while let Some(entry) = self.in_flight.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let InFlight { from, to, datagram } = entry.remove();
            self.links[from][to].stats.delivered += 1;
            self.nodes[to].handle_datagram(now, &datagram);
        }
        for node in &mut self.nodes {
            if node.poll_timeout().is_some_and(|t| t <= now) {
                node.handle_timeout(now);
            }
        }
        for from in 0..self.nodes.len() {
            while let Some(datagram) = self.nodes[from].poll_transmit(now) {
                self.send(from, datagram);
            }
        }
    }

    /// The earliest pending delivery or node timeout, timeouts no earlier than `now + 1 ns`.
    fn next_event(&self) -> Option<Instant> {
        let soonest_timeout = self.now + Duration::from_nanos(1);
        let timeouts = self.nodes.iter().filter_map(|n| n.poll_timeout());
        let delivery = self.in_flight.keys().next().map(|&(t, _)| t);
        timeouts.map(|t| t.max(soonest_timeout)).chain(delivery).min()
    }

    /// Captures `datagram`, routes it and puts it (and any duplicate) in flight.
    fn send(&mut self, from: usize, datagram: Datagram) {
        if let Some(sent) = &mut self.sent {
            sent.push(Sent { at: self.now, from, datagram: datagram.clone() });
        }
        if let Some(capture) = &mut self.capture {
            let ts = core::time::Duration::from_nanos(self.now.as_nanos());
            if let Err(e) = capture.write_roce(ts, datagram.src, datagram.dst, &datagram.payload) {
                self.capture = None;
                self.capture_error = Some(e);
            }
        }
        let group = datagram.dst.ip();
        if group.is_multicast() {
            // As a switch floods a group: one copy per member, the sender excluded.
            let members: Vec<usize> = (0..self.nodes.len())
                .filter(|&to| to != from && self.nodes[to].joined(group))
                .collect();
            if members.is_empty() {
                self.unroutable += 1;
            }
            for to in members {
                self.send_on_link(from, to, datagram.clone());
            }
            return;
        }
        let Some(&to) = self.routes.get(&group) else {
            self.unroutable += 1;
            return;
        };
        self.send_on_link(from, to, datagram);
    }

    /// Puts `datagram` (and any duplicate) in flight on the link `from → to`.
    fn send_on_link(&mut self, from: usize, to: usize, mut datagram: Datagram) {
        let Some((at, copy)) = self.links[from][to].transmit(self.now, &mut datagram) else {
            return;
        };
        if let Some(copy_at) = copy {
            let datagram = datagram.clone();
            self.enqueue(copy_at, InFlight { from, to, datagram });
        }
        self.enqueue(at, InFlight { from, to, datagram });
    }

    fn enqueue(&mut self, at: Instant, flight: InFlight) {
        self.in_flight.insert((at, self.next_seq), flight);
        self.next_seq += 1;
    }
}

/// `fabric[i]` is [`Fabric::node`]`(i)`: a field of a node can then be borrowed beside other
/// state of the test (`p.net[0].dev.post_send(p.qp, …)`).
impl<N: Node> core::ops::Index<usize> for Fabric<N> {
    type Output = N;

    fn index(&self, index: usize) -> &N {
        self.node(index)
    }
}

impl<N: Node> core::ops::IndexMut<usize> for Fabric<N> {
    fn index_mut(&mut self, index: usize) -> &mut N {
        self.node_mut(index)
    }
}

/// The seeds to run: `UROCE_SEED_BASE` (default 0) and the `UROCE_SEEDS` (default
/// `default_count`) seeds after it.
///
/// # Panics
///
/// If either variable is set to something other than an unsigned integer.
pub fn seeds_from_env(default_count: u64) -> Range<u64> {
    let base = env_u64("UROCE_SEED_BASE", 0);
    base..base.saturating_add(env_u64("UROCE_SEEDS", default_count))
}

fn env_u64(name: &str, default: u64) -> u64 {
    match env::var(name) {
        Err(VarError::NotPresent) => default,
        Ok(v) => match v.trim().parse() {
            Ok(n) => n,
            Err(_) => panic!("{name}={v:?} is not an unsigned integer"),
        },
        Err(e) => panic!("{name}: {e}"),
    }
}

/// The RC reliability of the seed sweeps' connections (`rc_sweep`, `xrc_sweep`, `mw_sweep`,
/// `tm_sweep`): a short ACK timeout (code 8, about 1 ms) and seven retries and RNR retries, so
/// that a few percent of loss recovers without running out of them; four READs or atomics in
/// flight each way.
pub const SWEEP_RELIABILITY: uroce_engine::Reliability = uroce_engine::Reliability {
    timeout: 8,
    retry_cnt: 7,
    rnr_retry: 7,
    min_rnr_timer: uroce_engine::RnrTimer::from_masked(1),
    max_rd_atomic: 4,
    max_dest_rd_atomic: 4,
};

/// Runs `run` for every seed of [`seeds_from_env`]`(default_count)`. On the first seed that
/// returns an error or panics, panics (or resumes the panic) after naming the seed and the
/// command that reruns exactly it.
pub fn sweep(default_count: u64, run: impl FnMut(u64) -> Result<(), String>) {
    sweep_seeds(seeds_from_env(default_count), run);
}

fn sweep_seeds(seeds: Range<u64>, mut run: impl FnMut(u64) -> Result<(), String>) {
    // libtest names each test's thread after the test.
    let test = match std::thread::current().name() {
        Some(name) if name != "main" => format!(" {name} -- --exact"),
        _ => String::new(),
    };
    for seed in seeds {
        let rerun = format!("UROCE_SEED_BASE={seed} UROCE_SEEDS=1 cargo test{test}");
        match panic::catch_unwind(AssertUnwindSafe(|| run(seed))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("seed {seed} failed: {e}\nrerun exactly this seed: {rerun}"),
            Err(payload) => {
                eprintln!("seed {seed} panicked; rerun exactly this seed: {rerun}");
                panic::resume_unwind(payload);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::VecDeque;
    use std::rc::Rc;

    use uroce_wire::{Opcode, Psn, Qpn, bth};

    use super::*;

    /// Sends scheduled datagrams at their times, records what arrives, optionally echoes it.
    #[derive(Default)]
    struct TestNode {
        host: u8,
        echo: bool,
        scheduled: VecDeque<(Instant, Datagram)>,
        outbox: VecDeque<Datagram>,
        received: Vec<(Instant, Datagram)>,
        fired: Vec<Instant>,
    }

    impl TestNode {
        /// The number `numbered` put at the start of each datagram received.
        fn numbers(&self) -> Vec<u32> {
            let number = |d: &Datagram| u32::from_le_bytes(d.payload[..4].try_into().unwrap());
            self.received.iter().map(|(_, d)| number(d)).collect()
        }
    }

    impl Node for TestNode {
        fn addr(&self) -> IpAddr {
            addr(self.host).ip()
        }
        fn handle_datagram(&mut self, now: Instant, d: &Datagram) {
            self.received.push((now, d.clone()));
            if self.echo {
                let mut reply = d.clone();
                core::mem::swap(&mut reply.src, &mut reply.dst);
                self.outbox.push_back(reply);
            }
        }
        fn poll_transmit(&mut self, _now: Instant) -> Option<Datagram> {
            self.outbox.pop_front()
        }
        fn poll_timeout(&self) -> Option<Instant> {
            self.scheduled.front().map(|&(t, _)| t)
        }
        fn handle_timeout(&mut self, now: Instant) {
            self.fired.push(now);
            while self.scheduled.front().is_some_and(|&(t, _)| t <= now) {
                let (_, d) = self.scheduled.pop_front().unwrap();
                self.outbox.push_back(d);
            }
        }
    }

    fn addr(host: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, host], 4791))
    }

    fn us(n: u64) -> Instant {
        Instant::ZERO + Duration::from_micros(n)
    }

    /// A datagram from 10.0.0.1 to 10.0.0.`to` whose 32-byte payload starts with `i`.
    fn numbered_to(to: u8, i: u32) -> Datagram {
        let mut payload = i.to_le_bytes().to_vec();
        payload.resize(32, 0xA5);
        let (src, dst) = (addr(1), addr(to));
        Datagram { src, dst, payload }
    }

    /// Node 0 (10.0.0.1) and node 1 (10.0.0.2, echoing if `echo`), every link `cfg`.
    fn pair(seed: u64, cfg: LinkConfig, echo: bool) -> Fabric<TestNode> {
        let mut f = Fabric::new(seed);
        f.set_all_links(cfg);
        f.add_node(TestNode { host: 1, ..TestNode::default() });
        f.add_node(TestNode { host: 2, echo, ..TestNode::default() });
        f
    }

    /// Schedules `count` numbered datagrams from node 0 to node 1, one every `every` from 0.
    fn numbered(f: &mut Fabric<TestNode>, count: u32, every: Duration) {
        let at = |i: u32| Instant::ZERO + every.saturating_mul(i.into());
        (f.node_mut(0).scheduled).extend((0..count).map(|i| (at(i), numbered_to(2, i))));
    }

    fn run_idle(f: &mut Fabric<TestNode>) {
        while f.step() {}
    }

    #[test]
    fn rng_ranges_and_link_streams() {
        let mut rng = Rng::new(1);
        for _ in 0..10_000 {
            assert!((0.0..1.0).contains(&rng.gen_f64()));
            assert!((10..13).contains(&rng.gen_range(10..13)));
        }
        assert_eq!(Rng::new(5).next_u64(), Rng::new(5).next_u64());
        let first = |seed, from, to| Rng::for_link(seed, from, to).next_u64();
        assert_ne!(first(9, 0, 1), first(9, 1, 0));
        assert_ne!(first(9, 0, 1), first(9, 0, 2));
        assert_ne!(first(9, 0, 1), first(10, 0, 1));
    }

    #[test]
    fn same_seed_same_trace_other_seed_other_trace() {
        let cfg = (LinkConfig::default().jitter(Duration::from_micros(5)))
            .loss(0.05)
            .duplicate(0.05)
            .corrupt(0.05)
            .reorder(0.05, Duration::from_micros(20));
        let trace = |seed, links: [(usize, usize); 2]| {
            let mut f = pair(seed, LinkConfig::default(), true);
            for (from, to) in links {
                f.set_link(from, to, cfg.clone());
            }
            numbered(&mut f, 500, Duration::from_micros(1));
            run_idle(&mut f);
            let (a, b) = (&f.node(0).received, &f.node(1).received);
            (a.clone(), b.clone(), f.total_stats())
        };
        let a = trace(42, [(0, 1), (1, 0)]);
        assert!(a.0.len() > 400 && a.2.lost > 0 && a.2.duplicated > 0 && a.2.corrupted > 0);
        assert_eq!(a, trace(42, [(0, 1), (1, 0)]));
        assert_eq!(a, trace(42, [(1, 0), (0, 1)]), "configuration order must not matter");
        assert_ne!(a, trace(43, [(0, 1), (1, 0)]));
    }

    #[test]
    fn loss_drops_about_the_configured_fraction() {
        let mut f = pair(3, LinkConfig::default().loss(0.1), false);
        numbered(&mut f, 10_000, Duration::from_nanos(100));
        run_idle(&mut f);
        let s = f.link_stats(0, 1);
        assert!((800..=1200).contains(&s.lost), "lost {} of 10000", s.lost);
        assert_eq!((s.sent, s.delivered + s.lost), (10_000, 10_000));
        assert_eq!(f.node(1).received.len() as u64, s.delivered);
    }

    #[test]
    fn jitter_and_reorder_reorder_but_zero_jitter_keeps_order() {
        let in_order = |cfg: LinkConfig| {
            let mut f = pair(4, cfg, false);
            numbered(&mut f, 1000, Duration::from_micros(1));
            run_idle(&mut f);
            let n = f.node(1).numbers();
            assert_eq!(n.len(), 1000);
            (n.is_sorted(), f.link_stats(0, 1).reordered)
        };
        let cfg = LinkConfig::default();
        assert_eq!(in_order(cfg.clone()), (true, 0));
        assert_eq!(in_order(cfg.clone().jitter(Duration::from_micros(3))), (false, 0));
        let (sorted, held) = in_order(cfg.reorder(0.1, Duration::from_micros(5)));
        assert!(!sorted && (50..=150).contains(&held), "held {held}");
    }

    #[test]
    fn duplicate_delivers_twice() {
        let mut f = pair(5, LinkConfig::default().duplicate(1.0), false);
        numbered(&mut f, 10, Duration::from_micros(1));
        run_idle(&mut f);
        let mut n = f.node(1).numbers();
        n.sort_unstable();
        assert_eq!(n, (0..10).flat_map(|i| [i, i]).collect::<Vec<_>>());
        let s = f.link_stats(0, 1);
        assert_eq!((s.sent, s.duplicated, s.delivered), (10, 10, 20));
    }

    #[test]
    fn corrupt_flips_exactly_one_bit() {
        let mut f = pair(6, LinkConfig::default().corrupt(1.0), false);
        numbered(&mut f, 100, Duration::from_micros(1));
        run_idle(&mut f);
        let rx = &f.node(1).received;
        assert_eq!(rx.len(), 100);
        for (i, (_, d)) in (0..).zip(rx) {
            let sent = numbered_to(2, i).payload;
            let flips = d.payload.iter().zip(sent).map(|(a, b)| (a ^ b).count_ones());
            assert_eq!(flips.sum::<u32>(), 1, "datagram {i}");
        }
        assert_eq!(f.link_stats(0, 1).corrupted, 100);
    }

    #[test]
    fn dead_window_drops_exactly_what_is_sent_inside_it() {
        let mut f = pair(7, LinkConfig::default().dead(us(30), us(60)), false);
        numbered(&mut f, 100, Duration::from_micros(1));
        run_idle(&mut f);
        let expected: Vec<u32> = (0..30).chain(60..100).collect();
        assert_eq!(f.node(1).numbers(), expected);
        assert_eq!(f.link_stats(0, 1).dropped_dead, 30);
    }

    #[test]
    fn filter_drops_exactly_the_third_datagram_and_can_delay() {
        let mut f = pair(8, LinkConfig::default(), false);
        f.set_filter(0, 1, |_, i| if i == 2 { Action::Drop } else { Action::Pass });
        numbered(&mut f, 5, Duration::from_micros(1));
        run_idle(&mut f);
        assert_eq!(f.node(1).numbers(), [0, 1, 3, 4]);
        assert_eq!(f.link_stats(0, 1).dropped_by_filter, 1);

        let mut f = pair(8, LinkConfig::default(), false);
        let hold = Action::Delay(Duration::from_micros(10));
        f.set_filter(0, 1, move |_, i| if i == 0 { hold } else { Action::Pass });
        numbered(&mut f, 5, Duration::from_micros(1));
        run_idle(&mut f);
        assert_eq!(f.node(1).numbers(), [1, 2, 3, 4, 0]);
    }

    #[test]
    fn filter_parses_roce_to_drop_the_third_ack() {
        fn bth_of(d: &Datagram) -> bth::Packet<&[u8]> {
            bth::Packet::new_checked(&d.payload[..]).unwrap()
        }
        let mut f = pair(9, LinkConfig::default(), false);
        let mut acks = 0;
        f.set_filter(0, 1, move |d, _| {
            let is_ack = bth_of(d).opcode() == Opcode::RC_ACKNOWLEDGE;
            acks += u32::from(is_ack);
            if is_ack && acks == 3 { Action::Drop } else { Action::Pass }
        });
        for psn in 0..10u32 {
            let opcode = [Opcode::RC_SEND_ONLY, Opcode::RC_ACKNOWLEDGE][psn as usize % 2];
            let mut d = numbered_to(2, 0);
            d.payload.truncate(bth::HEADER_LEN);
            let repr = bth::Repr::new(opcode, Qpn::from_masked(0x11), Psn::from_masked(psn));
            repr.emit(&mut bth::Packet::new_unchecked(&mut d.payload[..])).unwrap();
            f.node_mut(0).scheduled.push_back((Instant::ZERO, d));
        }
        run_idle(&mut f);
        let rx = &f.node(1).received;
        let psns: Vec<u32> = rx.iter().map(|(_, d)| bth_of(d).psn().get()).collect();
        assert_eq!(psns, [0, 1, 2, 3, 4, 6, 7, 8, 9], "the 3rd ACK is PSN 5");
    }

    #[test]
    fn timeout_fires_at_exactly_its_deadline() {
        let mut f = pair(10, LinkConfig::default(), false);
        let at = Instant::from_nanos(1_234_567);
        f.node_mut(0).scheduled.push_back((at, numbered_to(2, 0)));
        assert!(f.step());
        assert_eq!(f.now(), at);
        run_idle(&mut f);
        assert_eq!(f.node(0).fired, [at]);
        assert_eq!(f.node(1).received[0].0, at + Duration::from_micros(2));
    }

    #[test]
    fn run_until_stops_at_the_deadline_or_when_done() {
        let mut f = pair(11, LinkConfig::default(), false);
        numbered(&mut f, 1000, Duration::from_micros(10));
        assert!(!f.run_until(us(1000), |_| false));
        assert_eq!(f.now(), us(1000));
        assert_eq!(f.node(1).received.len(), 100, "sent at 0..=990 µs");
        assert!(f.run_until(us(5000), |f| f.node(1).received.len() == 105));
        assert_eq!(f.now(), us(1042));
        f.run_for(Duration::from_millis(1));
        assert_eq!(f.now(), us(2042));
        // An idle fabric lets the clock run to the deadline.
        let mut idle = pair(11, LinkConfig::default(), false);
        assert!(!idle.run_until(us(7), |_| false));
        assert_eq!(idle.now(), us(7));
    }

    #[test]
    fn unroutable_datagram_is_counted_and_dropped() {
        let mut f = pair(12, LinkConfig::default(), false);
        f.node_mut(0).outbox.push_back(numbered_to(99, 0));
        assert!(!f.step());
        assert_eq!((f.unroutable(), f.total_stats()), (1, LinkStats::default()));
    }

    /// A node that never re-arms its timer past the present.
    struct Stuck(u64);

    impl Node for Stuck {
        fn addr(&self) -> IpAddr {
            addr(1).ip()
        }
        fn handle_datagram(&mut self, _: Instant, _: &Datagram) {}
        fn poll_transmit(&mut self, _: Instant) -> Option<Datagram> {
            None
        }
        fn poll_timeout(&self) -> Option<Instant> {
            Some(Instant::ZERO)
        }
        fn handle_timeout(&mut self, _: Instant) {
            self.0 += 1;
        }
    }

    #[test]
    fn stale_timeout_still_advances_the_clock() {
        let mut f = Fabric::new(13);
        f.add_node(Stuck(0));
        f.run_for(Duration::from_micros(1));
        assert_eq!((f.now(), f.node(0).0), (us(1), 1001), "at 0..=1000 ns");
    }

    #[derive(Clone, Default)]
    struct Shared(Rc<RefCell<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.borrow_mut().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn capture_records_every_datagram_as_it_leaves_even_if_lost() {
        let mut f = pair(14, LinkConfig::default().loss(1.0), false);
        let out = Shared::default();
        f.capture_to(out.clone()).unwrap();
        numbered(&mut f, 3, Duration::from_micros(1));
        run_idle(&mut f);
        f.finish_capture().unwrap();
        let bytes = out.0.borrow();
        let frames = uroce_wire::pcap::read_frames(&bytes).unwrap();
        let ts: Vec<_> = frames.iter().map(|fr| fr.ts.as_micros()).collect();
        assert_eq!((ts, f.link_stats(0, 1).lost), (vec![0, 1, 2], 3));
    }

    #[test]
    fn sweep_runs_every_seed() {
        let mut seen = Vec::new();
        sweep_seeds(5..8, |seed| {
            seen.push(seed);
            Ok(())
        });
        assert_eq!(seen, [5, 6, 7]);
        let seeds = seeds_from_env(4);
        assert_eq!(seeds.end - seeds.start, env_u64("UROCE_SEEDS", 4));
    }

    #[test]
    #[should_panic(expected = "seed 6 failed: boom\nrerun exactly this seed: UROCE_SEED_BASE=6")]
    fn sweep_names_the_failing_seed() {
        sweep_seeds(5..8, |seed| if seed == 6 { Err("boom".into()) } else { Ok(()) });
    }

    #[test]
    #[should_panic(expected = "LinkConfig::loss")]
    fn probability_outside_unit_interval_panics() {
        let _ = LinkConfig::default().loss(1.5);
    }

    #[test]
    fn runtime_faults_replay_on_a_link_as_the_setters_configure_them() {
        let mix = Faults { loss: 0.05, dup: 0.05, reorder: 0.05, corrupt: 0.05 };
        let hold = Duration::from_micros(20);
        let by_setters = LinkConfig::default().loss(0.05).duplicate(0.05).corrupt(0.05);
        let runs = [LinkConfig::default().faults(mix, hold), by_setters.reorder(0.05, hold)];
        let [a, b] = runs.map(|cfg| {
            let mut f = pair(9, cfg, false);
            numbered(&mut f, 2_000, Duration::from_nanos(100));
            run_idle(&mut f);
            (f.link_stats(0, 1), f.node(1).received.clone())
        });
        assert!(a.0.lost > 0 && a.0.duplicated > 0 && a.0.corrupted > 0 && a.0.reordered > 0);
        assert_eq!(a, b);
    }

    #[test]
    #[should_panic(expected = "LinkConfig::faults: dup=NaN")]
    fn faults_that_are_not_probabilities_panic() {
        let _ = LinkConfig::default()
            .faults(Faults { dup: f64::NAN, ..Faults::default() }, Duration::ZERO);
    }
}
