//! Two devices back to back on the simulator's fabric, in virtual time, each rule of the RC
//! and UC transports exercised by a scripted scenario. (Random loss, reordering and the seed
//! sweep are in `uroce-sim`'s own tests.)
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::cast_possible_truncation, reason = "test sizes and offsets are small")]

use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;

use uroce_engine::*;
use uroce_sim::{Action, Datagram, DeviceNode, Fabric, LinkConfig, Path};
use uroce_wire::aeth::Syndrome;
use uroce_wire::icrc::Ipv4IdPolicy;
use uroce_wire::opcode::Opcode;
use uroce_wire::{PacketRepr, ROCE_V2_PORT};

const A: usize = 0;
const B: usize = 1;
/// Each pair QP's `max_rd_atomic` and `max_dest_rd_atomic`.
const RD_ATOMIC: u32 = 4;

struct Host {
    dev: Device<VecMemory>,
    pd: PdHandle,
    cq: CqHandle,
    qp: Qpn,
    /// Registered buffer: (addr, region).
    mr: MemoryRegion,
}

/// What a test names on one side of a [`Pair`]; the device itself is the fabric's node.
#[derive(Clone, Copy)]
struct Ends {
    pd: PdHandle,
    cq: CqHandle,
    qp: Qpn,
    mr: MemoryRegion,
}

/// Two devices on the simulator's fabric, back to back over fault-free links: the scripted
/// faults are the [`Filter`] (random loss, reordering and the seed sweep are in `uroce-sim`'s
/// own tests).
struct Pair {
    net: Fabric<DeviceNode<VecMemory>>,
    hosts: [Ends; 2],
}

const BUF: u64 = 1 << 20;

/// Sees each packet sent (sender index, packet) and says whether it arrives.
type Filter = Box<dyn FnMut(usize, &PacketRepr<'_>) -> bool>;

/// One packet as it was sent: (when, from, opcode, PSN, AETH syndrome byte).
type Logged = (Instant, usize, Opcode, u32, Option<u8>);

fn host_of(addr: &str, seed: u64, base: u64, qp_type: QpType) -> Host {
    host_checking(addr, seed, base, qp_type, Ipv4IdPolicy::default())
}

/// [`host_of`], its receiver accepting the IPv4 identifications `policy` allows.
fn host_checking(addr: &str, seed: u64, base: u64, qp_type: QpType, policy: Ipv4IdPolicy) -> Host {
    let ip: IpAddr = addr.parse().unwrap();
    let mut mem = VecMemory::new();
    mem.insert(base, vec![0; BUF as usize]);
    let config = DeviceConfig { ipv4_id_policy: policy, ..DeviceConfig::new(ip, seed) };
    let mut dev = Device::new(config, mem);
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(1024).unwrap();
    let access =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mr = dev.reg_mr(pd, base, BUF, access).unwrap();
    let init = QpInitAttr {
        qp_type,
        pd,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap::default(),
        sq_sig_all: false,
        srq: None,
        xrcd: None,
    };
    let qp = dev.create_qp(init).unwrap();
    Host { dev, pd, cq, qp, mr }
}

fn host(addr: &str, seed: u64, base: u64) -> Host {
    host_of(addr, seed, base, QpType::Rc)
}

fn rc_attrs(state: QpState) -> QpAttr {
    QpAttr { state: Some(state), ..QpAttr::default() }
}

impl Pair {
    fn new(mtu: Mtu) -> Self {
        Self::connected(mtu, QpType::Rc)
    }

    fn connected(mtu: Mtu, qp_type: QpType) -> Self {
        Self::checking(mtu, qp_type, Ipv4IdPolicy::default())
    }

    /// [`Pair::connected`], its receivers accepting the IPv4 identifications `policy` allows.
    fn checking(mtu: Mtu, qp_type: QpType, policy: Ipv4IdPolicy) -> Self {
        let mut hosts = [
            host_checking("127.0.0.2", 1, 0x10_0000, qp_type, policy),
            host_checking("127.0.0.3", 2, 0x20_0000, qp_type, policy),
        ];
        let qpns = [hosts[0].qp, hosts[1].qp];
        let addrs = [hosts[0].dev.addr(), hosts[1].dev.addr()];
        for (i, h) in hosts.iter_mut().enumerate() {
            let peer = 1 - i;
            let all = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
            h.dev.init_qp(h.qp, all, QKey(0)).unwrap();
            let path = PathAttr {
                dest: addrs[peer],
                dest_qpn: qpns[peer],
                mtu,
                sq_psn: Psn::from_masked(0xFF_FFF0 + i as u32),
                rq_psn: Psn::from_masked(0xFF_FFF0 + peer as u32),
            };
            let reliability = Reliability {
                timeout: 10,
                retry_cnt: 3,
                rnr_retry: 3,
                min_rnr_timer: RnrTimer::from_masked(1),
                max_rd_atomic: RD_ATOMIC.try_into().unwrap(),
                max_dest_rd_atomic: RD_ATOMIC.try_into().unwrap(),
            };
            h.dev.connect_qp(h.qp, &path, &reliability).unwrap();
        }
        let mut net = Fabric::new(0);
        net.set_all_links(LinkConfig::default().delay(Duration::from_micros(1)));
        net.record_sent(true);
        let ends = hosts.map(|Host { dev, pd, cq, qp, mr }| {
            net.add_node(DeviceNode::new(dev));
            Ends { pd, cq, qp, mr }
        });
        Self { net, hosts: ends }
    }

    /// Moves packets and time until nothing is left to do or `limit` passes.
    fn run(&mut self, limit: Duration) {
        let deadline = self.net.now() + limit;
        self.net.run_until_idle(deadline);
    }

    fn now(&self) -> Instant {
        self.net.now()
    }

    /// Every packet sent so far.
    fn log(&self) -> Vec<Logged> {
        let parse = |s: &uroce_sim::Sent| {
            let p = PacketRepr::parse_ignoring_icrc(&s.datagram.payload).unwrap().repr;
            let syndrome = p.ext.aeth.map(|a| a.syndrome.to_byte());
            (s.at, s.from, p.bth.opcode, p.bth.psn.get(), syndrome)
        };
        self.net.sent().iter().map(parse).collect()
    }

    /// Decides from now on, for every packet either side sends, whether it arrives.
    fn set_filter(&mut self, filter: Filter) {
        let shared = Rc::new(RefCell::new(filter));
        for from in [A, B] {
            let filter = Rc::clone(&shared);
            self.net.set_filter(from, 1 - from, move |d: &Datagram, _| {
                let packet = PacketRepr::parse_ignoring_icrc(&d.payload).unwrap().repr;
                if (filter.borrow_mut())(from, &packet) { Action::Pass } else { Action::Drop }
            });
        }
    }

    /// The one-way delay of both directions.
    fn set_delay(&mut self, delay: Duration) {
        self.net.set_all_links(LinkConfig::default().delay(delay));
    }

    /// Takes the packet `from` sends next into `buf`, by hand, past the fabric: returns the
    /// datagram's (source, destination).
    fn take(&mut self, from: usize, buf: &mut Vec<u8>) -> (SocketAddr, SocketAddr) {
        let now = self.now();
        let dev = &mut self.net[from].dev;
        let tx = dev.poll_transmit(now, buf).unwrap();
        (SocketAddr::new(dev.addr(), tx.src_port), tx.dst)
    }

    /// Hands `packet` from `src` to device `to` now, as if it had arrived.
    fn hand(&mut self, to: usize, src: SocketAddr, packet: &[u8]) {
        let now = self.now();
        let dev = &mut self.net[to].dev;
        dev.handle_datagram(now, &RxInfo::new(src, dev.addr()), packet);
    }

    /// What `from` sends now, by hand: (opcode, AETH syndrome byte) of each packet.
    fn drain_sent(&mut self, from: usize) -> Vec<(Opcode, Option<u8>)> {
        let (now, mut buf, mut sent) = (self.now(), Vec::new(), Vec::new());
        while self.net[from].dev.poll_transmit(now, &mut buf).is_some() {
            let p = PacketRepr::parse_ignoring_icrc(&buf).unwrap().repr;
            sent.push((p.bth.opcode, p.ext.aeth.map(|a| a.syndrome.to_byte())));
        }
        sent
    }

    /// How packets reach both devices.
    fn set_path(&mut self, path: Path) {
        for i in [A, B] {
            self.net[i].path = path;
        }
    }

    fn cq(&mut self, i: usize) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let cq = self.hosts[i].cq;
        self.net[i].dev.poll_cq(cq, usize::MAX, &mut out);
        out
    }

    fn mem(&mut self, i: usize, offset: u64, len: usize) -> &mut [u8] {
        let base = self.hosts[i].mr.addr;
        let buf = self.net[i].dev.memory_mut().buffer_mut(base).unwrap();
        &mut buf[offset as usize..offset as usize + len]
    }

    fn sge(&self, i: usize, offset: u64, len: u32) -> Sge {
        let mr = self.hosts[i].mr;
        Sge { addr: mr.addr + offset, length: len, lkey: mr.lkey }
    }

    fn remote(&self, i: usize, offset: u64) -> RemoteAddr {
        let mr = self.hosts[i].mr;
        RemoteAddr { addr: mr.addr + offset, rkey: mr.rkey }
    }

    fn post_recv(&mut self, i: usize, wr_id: u64, offset: u64, len: u32) {
        let sge = self.sge(i, offset, len);
        let qp = self.hosts[i].qp;
        self.net[i].dev.post_recv(qp, RecvWr { wr_id, sg_list: vec![sge].into() }).unwrap();
    }

    fn post_send(&mut self, i: usize, wr: SendWr) {
        let qp = self.hosts[i].qp;
        self.net[i].dev.post_send(qp, wr).unwrap();
    }
}

fn fill(p: &mut Pair, i: usize, offset: u64, len: usize, seed: u8) -> Vec<u8> {
    let data: Vec<u8> = (0..len).map(|k| (k as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    p.mem(i, offset, len).copy_from_slice(&data);
    data
}

#[test]
fn send_of_every_size_arrives_whole() {
    for mtu in Mtu::ALL {
        let mut p = Pair::new(mtu);
        let mut wr_id = 0;
        for len in [0usize, 1, 255, 256, 257, 1024, 4095, 4096, 4097, 10_000, 65_536] {
            wr_id += 1;
            let data = fill(&mut p, A, 0, len, wr_id as u8);
            p.post_recv(B, wr_id, 0x8_0000, 0x8_0000);
            let sge = p.sge(A, 0, len as u32);
            p.post_send(A, SendWr::new(wr_id, WrOpcode::Send, vec![sge]));
            p.run(Duration::from_millis(10));
            let send = p.cq(A);
            assert_eq!(send.len(), 1, "mtu {mtu:?} len {len}: {send:?}");
            assert_eq!((send[0].wr_id, send[0].status), (wr_id, WcStatus::SUCCESS));
            let recv = p.cq(B);
            assert_eq!(recv.len(), 1);
            assert_eq!((recv[0].status, recv[0].byte_len as usize), (WcStatus::SUCCESS, len));
            assert_eq!(p.mem(B, 0x8_0000, len), &data[..], "mtu {mtu:?} len {len}");
        }
    }
}

#[test]
fn completions_carry_the_time_the_packet_that_made_them_arrived() {
    // IBV_WC_EX_WITH_COMPLETION_TIMESTAMP: a receive is stamped when the SEND arrives, the
    // send when the ACK for it arrives, not when either is polled.
    let mut p = Pair::new(Mtu::Mtu1024);
    let delay = Duration::from_micros(70);
    p.set_delay(delay);
    p.post_recv(B, 1, 0x8_0000, 4096);
    p.run(Duration::from_millis(1));
    p.post_send(A, SendWr::new(2, WrOpcode::Send, vec![p.sge(A, 0, 100)]));
    p.run(Duration::from_millis(10));
    let log = p.log();
    let sent = |op: Opcode| log.iter().find(|l| l.2 == op).unwrap().0;
    let (send_at, ack_at) = (sent(Opcode::RC_SEND_ONLY), sent(Opcode::RC_ACKNOWLEDGE));
    let recv = p.cq(B);
    assert_eq!(recv[0].timestamp, send_at + delay);
    let send = p.cq(A);
    assert_eq!(send[0].timestamp, ack_at + delay);
    assert!(send[0].timestamp > recv[0].timestamp);
}

/// Takes what `dev` has for the three polls a runtime makes after each verb, and counts it:
/// (packets, CQ events, asynchronous events).
fn take_output(dev: &mut Device<VecMemory>, now: Instant) -> (usize, usize, usize) {
    let mut buf = Vec::new();
    let packets = core::iter::from_fn(|| dev.poll_transmit(now, &mut buf)).count();
    let events = core::iter::from_fn(|| dev.poll_cq_event()).count();
    let asynchronous = core::iter::from_fn(|| dev.poll_async_event()).count();
    (packets, events, asynchronous)
}

#[test]
fn has_output_says_when_a_poll_would_find_something() {
    let mut p = Pair::new(Mtu::Mtu1024);
    p.run(Duration::from_millis(1));
    let mut buf = Vec::new();
    let now = p.now();
    for i in [A, B] {
        take_output(&mut p.net[i].dev, now);
        assert!(!p.net[i].dev.has_output(now), "idle device {i}");
    }
    // A SEND posted: a packet to send.
    let cq = p.hosts[A].cq;
    assert!(p.net[A].dev.req_notify_cq(cq, false));
    p.post_recv(B, 1, 0x8_0000, 4096);
    assert!(!p.net[B].dev.has_output(now), "a receive posted sends nothing");
    p.post_send(A, SendWr::new(2, WrOpcode::Send, vec![p.sge(A, 0, 100)]));
    assert!(p.net[A].dev.has_output(now));
    let (src, _) = p.take(A, &mut buf);
    // Taken: nothing else (the QP's next look finds nothing, then it is off the rotation).
    assert_eq!(take_output(&mut p.net[A].dev, now), (0, 0, 0));
    assert!(!p.net[A].dev.has_output(now));
    // Its arrival: an ACK to send, then its arrival at A a completion event.
    p.hand(B, src, &buf);
    assert!(p.net[B].dev.has_output(now));
    let (ack_src, _) = p.take(B, &mut buf);
    assert_eq!(take_output(&mut p.net[B].dev, now), (0, 0, 0));
    p.hand(A, ack_src, &buf);
    assert!(p.net[A].dev.has_output(now), "the armed CQ's event");
    assert_eq!(take_output(&mut p.net[A].dev, now), (0, 1, 0));
    assert!(!p.net[A].dev.has_output(now));
    // A destroyed RC QP's farewell ACKs.
    let qp = p.hosts[B].qp;
    assert!(p.net[B].dev.destroy_qp(qp));
    assert!(p.net[B].dev.has_output(now));
    let (packets, _, _) = take_output(&mut p.net[B].dev, now);
    assert!(packets > 0);
    assert!(!p.net[B].dev.has_output(now));
}

#[test]
fn a_timer_moved_later_keeps_its_earlier_entry_which_fires_harmlessly() {
    // Each RC message moves the requester's ACK deadline and probe later; the watch keeps
    // the first entry (no reordering of its set per message) until that instant comes.
    let mut p = Pair::new(Mtu::Mtu1024);
    p.run(Duration::from_millis(1));
    for wr_id in 1..=5 {
        p.post_recv(B, wr_id, 0x8_0000, 4096);
        p.post_send(A, SendWr::new(wr_id, WrOpcode::Send, vec![p.sge(A, 0, 64)]));
        p.run(Duration::from_micros(50));
        assert_eq!(p.cq(A).len(), 1, "message {wr_id} completed");
    }
    let now = p.now();
    let entry = p.net[A].dev.poll_timeout().expect("the first message's entry is kept");
    assert!(entry > now, "not yet come: {entry:?} at {now:?}");
    // Nothing is outstanding: at that instant nothing is due, nothing is sent, nothing
    // counted, and the entry goes.
    let before = *p.net[A].dev.counters();
    p.net[A].dev.handle_timeout(entry);
    let mut buf = Vec::new();
    assert!(p.net[A].dev.poll_transmit(entry, &mut buf).is_none());
    assert_eq!(*p.net[A].dev.counters(), before);
    assert_eq!(p.net[A].dev.poll_timeout(), None);
}

fn write_wr(p: &Pair, wr_id: u64, local: u64, remote: u64, len: u32) -> SendWr {
    let mut wr = SendWr::new(wr_id, WrOpcode::RdmaWrite, vec![p.sge(A, local, len)]);
    wr.remote = Some(p.remote(B, remote));
    wr
}

fn read_wr(p: &Pair, wr_id: u64, local: u64, remote: u64, len: u32) -> SendWr {
    let mut wr = SendWr::new(wr_id, WrOpcode::RdmaRead, vec![p.sge(A, local, len)]);
    wr.remote = Some(p.remote(B, remote));
    wr
}

fn statuses(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

/// A path that guarantees integrity (shared memory) may carry packets with no ICRC: the
/// receiver taking them as intact skips that check and no other; taken as from the wire,
/// every one fails its ICRC.
#[test]
fn an_intact_path_skips_the_icrc_and_only_it() {
    let mut p = Pair::new(Mtu::Mtu1024);
    p.set_path(Path::Intact);
    let data = fill(&mut p, A, 0, 10_000, 3);
    p.post_send(A, write_wr(&p, 1, 0, 0x1000, 10_000));
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS)]);
    assert_eq!(p.mem(B, 0x1000, 10_000), &data[..]);
    assert_eq!(p.net[B].dev.counters().icrc_errors, 0);
    // Still checked: a WRITE outside the region is a remote access error, not a write.
    p.post_send(A, write_wr(&p, 2, 0, BUF - 8, 64));
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(A)), [(2, WcStatus::REM_ACCESS_ERR)]);

    let mut p = Pair::new(Mtu::Mtu1024);
    p.set_path(Path::ZeroIcrcOnWire);
    fill(&mut p, A, 0, 10_000, 3);
    p.post_send(A, write_wr(&p, 1, 0, 0x1000, 10_000));
    p.run(Duration::from_millis(1));
    assert!(p.net[B].dev.counters().icrc_errors > 0);
    assert!(p.cq(A).is_empty(), "nothing was acknowledged");
}

#[test]
fn write_and_read_move_bytes_across_psn_wrap() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let data = fill(&mut p, A, 0, 100_000, 7);
    p.post_send(A, write_wr(&p, 1, 0, 0x1000, 100_000));
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS)]);
    assert!(p.cq(B).is_empty(), "a WRITE without immediate completes nothing at the target");
    assert_eq!(p.mem(B, 0x1000, 100_000), &data[..]);
    // The PSNs started at 2^24 - 16: the write crossed the wrap.
    assert!(p.log().iter().any(|&(_, _, _, psn, _)| psn == 0));

    let back = fill(&mut p, B, 0x4_0000, 5000, 9);
    p.post_send(A, read_wr(&p, 2, 0x8_0000, 0x4_0000, 5000));
    p.run(Duration::from_millis(10));
    let wcs = p.cq(A);
    assert_eq!(statuses(&wcs), [(2, WcStatus::SUCCESS)]);
    assert_eq!((wcs[0].opcode, wcs[0].byte_len), (WcOpcode::RdmaRead, 5000));
    assert_eq!(p.mem(A, 0x8_0000, 5000), &back[..]);
}

#[test]
fn write_with_immediate_consumes_a_receive() {
    let mut p = Pair::new(Mtu::Mtu256);
    fill(&mut p, A, 0, 1000, 1);
    p.post_recv(B, 77, 0x9_0000, 16);
    let mut wr = write_wr(&p, 1, 0, 0x100, 1000);
    wr.opcode = WrOpcode::RdmaWriteWithImm;
    wr.imm = Some([1, 2, 3, 4]);
    p.post_send(A, wr);
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS)]);
    let recv = p.cq(B);
    assert_eq!(recv.len(), 1);
    assert_eq!(
        (recv[0].wr_id, recv[0].opcode, recv[0].byte_len),
        (77, WcOpcode::RecvRdmaWithImm, 1000)
    );
    assert_eq!(recv[0].imm, Some([1, 2, 3, 4]));
}

#[test]
fn atomics_apply_exactly_once_even_when_the_ack_is_lost() {
    let mut p = Pair::new(Mtu::Mtu1024);
    p.mem(B, 0x100, 8).copy_from_slice(&40u64.to_ne_bytes());
    // Lose the first atomic ACK: the requester's tail-loss probe resends the FETCH_ADD well
    // before the ACK timeout, and the responder must answer from its saved result without
    // adding again.
    p.set_filter(drop_once(|_, pkt| pkt.bth.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE));
    let mut wr = SendWr::new(1, WrOpcode::AtomicFetchAndAdd, vec![p.sge(A, 0x10, 8)]);
    wr.remote = Some(p.remote(B, 0x100));
    wr.compare_add = 2;
    p.post_send(A, wr);
    p.run(Duration::from_millis(50));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS)]);
    assert_eq!(u64::from_ne_bytes(p.mem(A, 0x10, 8).try_into().unwrap()), 40, "original value");
    assert_eq!(u64::from_ne_bytes(p.mem(B, 0x100, 8).try_into().unwrap()), 42, "added once");
    assert_eq!(p.net[B].dev.counters().dup_req, 1);
    let a = *p.net[A].dev.counters();
    assert_eq!((a.tail_probes, a.ack_timeouts), (1, 0));

    let mut wr = SendWr::new(2, WrOpcode::AtomicCmpAndSwp, vec![p.sge(A, 0x18, 8)]);
    wr.remote = Some(p.remote(B, 0x100));
    (wr.compare_add, wr.swap) = (42, 7);
    p.post_send(A, wr);
    p.run(Duration::from_millis(50));
    assert_eq!(statuses(&p.cq(A)), [(2, WcStatus::SUCCESS)]);
    assert_eq!(u64::from_ne_bytes(p.mem(B, 0x100, 8).try_into().unwrap()), 7);
}

/// A filter that drops the first packet `pick` chooses, once.
fn drop_once(mut pick: impl FnMut(usize, &PacketRepr<'_>) -> bool + 'static) -> Filter {
    let mut dropped = false;
    Box::new(move |from, pkt| {
        if !dropped && pick(from, pkt) {
            dropped = true;
            return false;
        }
        true
    })
}

/// A WRITE of 20 packets (MTU 256) from A to B, every packet through `filter`, run for
/// `time`: checks that it completed and arrived whole, and returns the pair for its counters.
fn write_20_packets(filter: Filter, time: Duration) -> Pair {
    let mut p = Pair::new(Mtu::Mtu256);
    let data = fill(&mut p, A, 0, 256 * 20, 3);
    p.set_filter(filter);
    p.post_send(A, write_wr(&p, 1, 0, 0, 256 * 20));
    p.run(time);
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS)]);
    assert_eq!(p.mem(B, 0, 256 * 20), &data[..]);
    p
}

#[test]
fn a_lost_packet_is_nak_ed_once_and_resent_go_back_n() {
    // Drop the third packet of the write, once.
    let p = write_20_packets(
        drop_once(|from, pkt| from == A && pkt.bth.opcode == Opcode::RC_RDMA_WRITE_MIDDLE),
        Duration::from_millis(10),
    );
    let b = *p.net[B].dev.counters();
    let a = *p.net[A].dev.counters();
    assert_eq!(b.rcv_seq_err, 1, "one NAK per gap");
    assert!(b.drop_out_of_sequence > 0, "later packets dropped until the gap is filled");
    assert_eq!(a.seq_naks_rcvd, 1);
    assert!(a.retransmitted_pkts > 0);
    assert_eq!(a.ack_timeouts, 0, "the NAK, not the timer, triggered the resend");
}

#[test]
fn a_lost_read_response_is_recovered() {
    let mut p = Pair::new(Mtu::Mtu512);
    let data = fill(&mut p, B, 0, 512 * 6, 5);
    let mut n = 0;
    p.set_filter(Box::new(move |from, pkt| {
        if from == B && pkt.bth.opcode == Opcode::RC_RDMA_READ_RESPONSE_MIDDLE {
            n += 1;
            return n != 2;
        }
        true
    }));
    p.post_send(A, read_wr(&p, 1, 0x1000, 0, 512 * 6));
    p.run(Duration::from_millis(50));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS)]);
    assert_eq!(p.mem(A, 0x1000, 512 * 6), &data[..]);
    assert!(p.net[B].dev.counters().dup_req >= 1, "the READ was replayed");
}

#[test]
fn rnr_nak_waits_the_coded_time_then_succeeds() {
    let mut p = Pair::new(Mtu::Mtu1024);
    fill(&mut p, A, 0, 64, 1);
    p.post_send(A, SendWr::new(1, WrOpcode::Send, vec![p.sge(A, 0, 64)]));
    p.run(Duration::from_micros(5));
    assert!(p.net[A].dev.counters().rnr_naks_rcvd >= 1);
    p.post_recv(B, 9, 0x100, 64);
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS)]);
    assert_eq!(statuses(&p.cq(B)), [(9, WcStatus::SUCCESS)]);
    // Every retry waits the responder's min_rnr_timer (code 1: 10 µs) after the RNR NAK.
    let naks: Vec<Instant> =
        p.log().iter().filter(|e| e.4.is_some_and(|s| s >> 5 == 1)).map(|e| e.0).collect();
    let sends: Vec<Instant> =
        p.log().iter().filter(|e| e.2 == Opcode::RC_SEND_ONLY).map(|e| e.0).collect();
    assert!(!naks.is_empty());
    assert_eq!(sends.len(), naks.len() + 1);
    for (nak, resend) in naks.iter().zip(&sends[1..]) {
        assert!(
            *resend - *nak >= Duration::from_micros(10),
            "resent {} after the NAK",
            *resend - *nak
        );
    }
}

#[test]
fn rnr_retries_exhausted_end_in_rnr_retry_exc_err_and_flush() {
    let mut p = Pair::new(Mtu::Mtu1024);
    p.post_send(A, SendWr::new(1, WrOpcode::Send, vec![p.sge(A, 0, 8)]));
    let mut second = SendWr::new(2, WrOpcode::Send, vec![p.sge(A, 0, 8)]);
    second.flags = SendFlags::NONE; // unsignaled: still reported once flushed
    p.post_send(A, second);
    p.run(Duration::from_secs(1));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::RNR_RETRY_EXC_ERR), (2, WcStatus::WR_FLUSH_ERR)]);
    assert_eq!(p.net[A].dev.qp_state(p.hosts[A].qp), Some(QpState::Error));
    // rnr_retry 3: the first try and three retries.
    assert_eq!(p.net[A].dev.counters().rnr_naks_rcvd, 4);
}

/// A lost last packet leaves no gap for the responder to see, so no NAK comes: the tail-loss
/// probe sends it again after a few round trips, well before the ACK timeout (4.2 ms here).
#[test]
fn a_lost_tail_is_probed_for_before_the_ack_timeout() {
    let p = write_20_packets(
        drop_once(|from, pkt| from == A && pkt.bth.opcode == Opcode::RC_RDMA_WRITE_LAST),
        Duration::from_micros(1500),
    );
    let a = *p.net[A].dev.counters();
    assert_eq!((a.tail_probes, a.ack_timeouts, a.retransmitted_pkts), (1, 0, 1));
}

/// A lost sequence NAK: the responder has dropped everything behind the gap and said so once.
/// The probe asks again; the responder answers it with the NAK again (once per probe, not
/// per packet behind the gap), and go-back-N runs without waiting for the ACK timeout.
#[test]
fn a_lost_nak_is_asked_for_again_by_the_probe() {
    let mut lose_request =
        drop_once(|from, pkt| from == A && pkt.bth.opcode == Opcode::RC_RDMA_WRITE_MIDDLE);
    let mut lose_nak = drop_once(|from, pkt| {
        from == B && pkt.ext.aeth.is_some_and(|a| matches!(a.syndrome, Syndrome::Nak(_)))
    });
    let p = write_20_packets(
        Box::new(move |from, pkt| lose_request(from, pkt) && lose_nak(from, pkt)),
        Duration::from_micros(1500),
    );
    let (a, b) = (*p.net[A].dev.counters(), *p.net[B].dev.counters());
    assert_eq!((a.tail_probes, a.ack_timeouts, a.seq_naks_rcvd), (1, 0, 1));
    assert_eq!(b.rcv_seq_err, 1, "one gap");
}

/// A go-back-N resend held to the shrunk window and lost whole (one segmented datagram, where
/// a drop before the interface takes every segment): the requester can send nothing more
/// (its window is full) and nothing answers. The tail-loss probe sends the last packet of the
/// resend again, the responder NAKs the gap once more, and the WRITE completes before the
/// ACK timeout (4.2 ms here), which was the only way on before.
#[test]
fn a_resend_lost_whole_with_the_window_full_is_probed_for_before_the_ack_timeout() {
    const PACKETS: u32 = 400;
    // The window after the first loss: 7/10 of the device's 256 packets in flight.
    const RESEND_BURST: usize = 256 * 7 / 10;
    let mut p = Pair::new(Mtu::Mtu256);
    let len = 256 * PACKETS as usize;
    let data = fill(&mut p, A, 0, len, 4);
    let mut seen = std::collections::HashSet::new();
    let (mut first_sends, mut resends_dropped) = (0, 0);
    p.set_filter(Box::new(move |from, pkt| {
        if from != A {
            return true;
        }
        if seen.insert(pkt.bth.psn) {
            first_sends += 1;
            return first_sends != 3;
        }
        resends_dropped += 1;
        resends_dropped > RESEND_BURST
    }));
    p.post_send(A, write_wr(&p, 1, 0, 0, 256 * PACKETS));
    p.run(Duration::from_millis(3));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS)]);
    assert_eq!(p.mem(B, 0, len), &data[..]);
    let a = *p.net[A].dev.counters();
    assert_eq!(a.ack_timeouts, 0, "{a:?}");
    assert!(a.tail_probes >= 1 && a.seq_naks_rcvd >= 2, "{a:?}");
}

#[test]
fn a_dead_link_ends_in_retry_exc_err_after_exactly_retry_cnt_retries() {
    let mut p = Pair::new(Mtu::Mtu1024);
    p.post_recv(B, 1, 0, 64);
    p.set_filter(Box::new(|from, _| from != A));
    p.post_send(A, SendWr::new(1, WrOpcode::Send, vec![p.sge(A, 0, 64)]));
    p.post_send(A, SendWr::new(2, WrOpcode::Send, vec![p.sge(A, 0, 64)]));
    let t0 = p.now();
    p.run(Duration::from_secs(10));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::RETRY_EXC_ERR), (2, WcStatus::WR_FLUSH_ERR)]);
    let c = *p.net[A].dev.counters();
    // retry_cnt 3: three timeouts each start a retry; the fourth ends the WQE.
    assert_eq!((c.ack_timeouts, c.retry_exceeded), (4, 1));
    // The tail-loss probe sends the last SEND again six times in all (each after twice the
    // last wait, at most a quarter of the ACK timeout): probes neither count as retries nor
    // reset them.
    assert_eq!(c.tail_probes, 6);
    assert_eq!(c.retransmitted_pkts, 3 * 2 + 6, "both SENDs go again on every retry");
    // Four timeouts of 4.096 µs × 2^10 each.
    let timeout = Duration::from_nanos(4096 << 10);
    assert!(p.now() - t0 >= timeout.saturating_mul(4), "took {}", p.now() - t0);
    assert!(p.now() - t0 < timeout.saturating_mul(5));
}

#[test]
fn receive_buffer_too_small_is_loc_len_err_there_and_rem_inv_req_err_here() {
    let mut p = Pair::new(Mtu::Mtu1024);
    p.post_recv(B, 5, 0, 100);
    p.post_recv(B, 6, 0, 100);
    p.post_send(A, SendWr::new(1, WrOpcode::Send, vec![p.sge(A, 0, 101)]));
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::REM_INV_REQ_ERR)]);
    assert_eq!(statuses(&p.cq(B)), [(5, WcStatus::LOC_LEN_ERR), (6, WcStatus::WR_FLUSH_ERR)]);
    assert_eq!(p.net[A].dev.qp_state(p.hosts[A].qp), Some(QpState::Error));
    assert_eq!(p.net[B].dev.qp_state(p.hosts[B].qp), Some(QpState::Error));
}

/// Remote accesses that must be refused: the target's memory stays untouched.
#[test]
fn bad_rkeys_bounds_rights_and_revoked_regions_are_rem_access_err_and_touch_nothing() {
    type Twist = fn(&mut Pair, &mut SendWr);
    let cases: [(&str, Twist); 6] = [
        ("forged rkey", |_, wr| wr.remote.as_mut().unwrap().rkey.0 ^= 0x55),
        ("one byte past the region", |p, wr| {
            wr.remote.as_mut().unwrap().addr = p.hosts[B].mr.addr + BUF - 15;
        }),
        ("address before the region", |p, wr| {
            wr.remote.as_mut().unwrap().addr = p.hosts[B].mr.addr - 1
        }),
        ("revoked region", |p, _| {
            let lkey = p.hosts[B].mr.lkey;
            p.net[B].dev.dereg_mr(lkey).unwrap();
        }),
        ("region of another PD", |p, wr| {
            let (h, dev) = (p.hosts[B], &mut p.net[B].dev);
            let pd2 = dev.alloc_pd();
            let mr = dev
                .reg_mr(pd2, h.mr.addr, 4096, Access::REMOTE_WRITE | Access::LOCAL_WRITE)
                .unwrap();
            wr.remote.as_mut().unwrap().rkey = mr.rkey;
        }),
        ("region without remote write", |p, wr| {
            let (h, dev) = (p.hosts[B], &mut p.net[B].dev);
            let mr = dev
                .reg_mr(h.pd, h.mr.addr, 4096, Access::LOCAL_WRITE | Access::REMOTE_READ)
                .unwrap();
            wr.remote.as_mut().unwrap().rkey = mr.rkey;
        }),
    ];
    for (what, twist) in cases {
        let mut p = Pair::new(Mtu::Mtu1024);
        fill(&mut p, A, 0, 16, 1);
        let before = p.net[B].dev.memory().buffer(p.hosts[B].mr.addr).unwrap().to_vec();
        let mut wr = write_wr(&p, 1, 0, 0, 16);
        twist(&mut p, &mut wr);
        p.post_send(A, wr);
        p.run(Duration::from_millis(10));
        assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::REM_ACCESS_ERR)], "{what}");
        let after = p.net[B].dev.memory().buffer(p.hosts[B].mr.addr).unwrap();
        assert!(after == &before[..], "{what}: memory was written");
        assert_eq!(p.net[B].dev.counters().err_naks_sent, 1, "{what}");
    }
}

/// Memory the application unmapped after registering it (registration pins nothing): a
/// peer's WRITE, READ and atomics into it end in REM_ACCESS_ERR at the peer and the access
/// violation event here (IBA 11.6.3.1), a SEND into a receive buffer that is gone in a local
/// protection error on the receive; each counted once as a memory fault, nothing touched.
#[test]
fn memory_unmapped_after_registration_fails_each_access_and_raises_the_event() {
    type Post = fn(&Pair) -> SendWr;
    let cases: [(&str, Post); 4] = [
        ("WRITE", |p| write_wr(p, 1, 0, 0, 3000)),
        ("READ", |p| read_wr(p, 1, 0, 0, 3000)),
        ("compare and swap", |p| {
            let mut wr = SendWr::new(1, WrOpcode::AtomicCmpAndSwp, vec![p.sge(A, 0, 8)]);
            wr.remote = Some(p.remote(B, 0x100));
            wr
        }),
        ("fetch and add", |p| {
            let mut wr = SendWr::new(1, WrOpcode::AtomicFetchAndAdd, vec![p.sge(A, 0, 8)]);
            wr.remote = Some(p.remote(B, 0x100));
            wr
        }),
    ];
    for (what, post) in cases {
        let mut p = Pair::new(Mtu::Mtu1024);
        let addr = p.hosts[B].mr.addr;
        p.net[B].dev.memory_mut().unmap(addr);
        let wr = post(&p);
        p.post_send(A, wr);
        p.run(Duration::from_millis(10));
        assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::REM_ACCESS_ERR)], "{what}");
        let (b, qp) = (&mut p.net[B].dev, p.hosts[B].qp);
        assert_eq!(b.poll_async_event(), Some(AsyncEvent::QpAccessError(qp)), "{what}");
        assert_eq!(b.qp_state(qp), Some(QpState::Error), "{what}");
        assert_eq!(b.counters().memory_faults, 1, "{what}");
    }
    // A SEND into a receive buffer that is gone: the receive fails, the sender hears why.
    let mut p = Pair::new(Mtu::Mtu1024);
    p.post_recv(B, 5, 0, 100);
    let addr = p.hosts[B].mr.addr;
    p.net[B].dev.memory_mut().unmap(addr);
    p.post_send(A, SendWr::new(1, WrOpcode::Send, vec![p.sge(A, 0, 64)]));
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(B)), [(5, WcStatus::LOC_PROT_ERR)]);
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::REM_OP_ERR)]);
    assert_eq!(p.net[B].dev.counters().memory_faults, 1);
    // The QP's own SEND from memory that is gone fails at once, and nothing is sent.
    let mut p = Pair::new(Mtu::Mtu1024);
    let addr = p.hosts[A].mr.addr;
    p.net[A].dev.memory_mut().unmap(addr);
    p.post_send(A, SendWr::new(1, WrOpcode::Send, vec![p.sge(A, 0, 64)]));
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::LOC_PROT_ERR)]);
    assert!(p.log().is_empty());
    assert_eq!(p.net[A].dev.counters().memory_faults, 1);
}

#[test]
fn a_bad_lkey_is_loc_prot_err_and_nothing_is_sent() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let mut sge = p.sge(A, 0, 8);
    sge.lkey = LKey(sge.lkey.0 ^ 1);
    p.post_send(A, SendWr::new(1, WrOpcode::Send, vec![sge]));
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::LOC_PROT_ERR)]);
    assert!(p.log().is_empty());
}

/// IBA 1.5's RDMA ATOMIC WRITE: 8 bytes stored once (a duplicate is acknowledged, not
/// stored again), from inline data or a gather element; a misaligned target is an invalid
/// request, a key without remote write an access error, any length but 8 refused at post.
#[test]
fn atomic_write_stores_eight_bytes_once_and_is_checked_as_a_write() {
    let mut p = Pair::new(Mtu::Mtu1024);
    p.mem(A, 0x20, 8).copy_from_slice(&0x1122_3344_5566_7788u64.to_ne_bytes());
    // Lose the first ACK: the resent request must not store again over what came after.
    p.set_filter(drop_once(|from, pkt| from == B && pkt.bth.opcode == Opcode::RC_ACKNOWLEDGE));
    let mut wr = SendWr::new(1, WrOpcode::AtomicWrite, vec![p.sge(A, 0x20, 8)]);
    wr.remote = Some(p.remote(B, 0x200));
    p.post_send(A, wr);
    p.run(Duration::from_millis(50));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS)]);
    assert_eq!(p.mem(B, 0x200, 8), &0x1122_3344_5566_7788u64.to_ne_bytes());
    assert_eq!(p.net[B].dev.counters().dup_req, 1);
    let mut wr = SendWr::new(2, WrOpcode::AtomicWrite, vec![]);
    wr.inline_data = Some(b"inline!!".to_vec());
    wr.remote = Some(p.remote(B, 0x200));
    p.post_send(A, wr);
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(A)), [(2, WcStatus::SUCCESS)]);
    assert_eq!(p.mem(B, 0x200, 8), b"inline!!");

    let qp = p.hosts[A].qp;
    let mut short = SendWr::new(3, WrOpcode::AtomicWrite, vec![p.sge(A, 0, 4)]);
    short.remote = Some(p.remote(B, 0x200));
    assert_eq!(p.net[A].dev.post_send(qp, short), Err(PostError::BadAtomicSge));

    let mut wr = SendWr::new(4, WrOpcode::AtomicWrite, vec![p.sge(A, 0x20, 8)]);
    wr.remote = Some(p.remote(B, 0x204));
    p.post_send(A, wr);
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(A)), [(4, WcStatus::REM_INV_REQ_ERR)]);

    // A region without remote write: refused as a WRITE would be, and nothing changes.
    let mut p = Pair::new(Mtu::Mtu1024);
    let pd = p.hosts[B].pd;
    let base = p.hosts[B].mr.addr;
    let ro = p.net[B].dev.reg_mr(pd, base + 0x1000, 0x1000, Access::REMOTE_READ).unwrap();
    let mut wr = SendWr::new(5, WrOpcode::AtomicWrite, vec![p.sge(A, 0x20, 8)]);
    wr.remote = Some(RemoteAddr { addr: base + 0x1000, rkey: ro.rkey });
    p.post_send(A, wr);
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(A)), [(5, WcStatus::REM_ACCESS_ERR)]);
    assert_eq!(p.mem(B, 0x1000, 8), &[0; 8]);
}

#[test]
fn misaligned_atomic_is_rem_inv_req_err() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let mut wr = SendWr::new(1, WrOpcode::AtomicFetchAndAdd, vec![p.sge(A, 0, 8)]);
    wr.remote = Some(p.remote(B, 0x104));
    p.post_send(A, wr);
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::REM_INV_REQ_ERR)]);
}

#[test]
fn modify_qp_names_the_missing_attribute_and_refuses_bad_transitions() {
    let mut h = host("127.0.0.9", 3, 0);
    assert_eq!(
        h.dev.modify_qp(h.qp, &rc_attrs(QpState::Rts)),
        Err(ModifyError::InvalidTransition { from: QpState::Reset, to: QpState::Rts })
    );
    let init = QpAttr { pkey_index: Some(0), port_num: Some(1), ..rc_attrs(QpState::Init) };
    assert_eq!(
        h.dev.modify_qp(h.qp, &init),
        Err(ModifyError::MissingAttribute {
            attr: "IBV_QP_ACCESS_FLAGS",
            from: QpState::Reset,
            to: QpState::Init
        })
    );
    let init = QpAttr { access_flags: Some(Access::NONE), ..init };
    h.dev.modify_qp(h.qp, &init).unwrap();
    let rtr = QpAttr { path_mtu: Some(Mtu::Mtu1024), ..rc_attrs(QpState::Rtr) };
    assert!(matches!(
        h.dev.modify_qp(h.qp, &rtr),
        Err(ModifyError::MissingAttribute { attr: "IBV_QP_AV", .. })
    ));
    assert_eq!(h.dev.qp_state(h.qp), Some(QpState::Init), "a refused modify changes nothing");
    let bad = QpAttr { port_num: Some(2), ..rc_attrs(QpState::Init) };
    assert!(matches!(
        h.dev.modify_qp(h.qp, &bad),
        Err(ModifyError::InvalidValue { attr: "port_num", .. })
    ));
    // An attribute the transition does not take is refused, as a device refuses it (IBA
    // 11.2.5.2): the peer's QPN belongs to RTR, the retry count to RTS.
    for (bad, name) in [
        (QpAttr { dest_qp_num: Qpn::new(7), ..rc_attrs(QpState::Init) }, "IBV_QP_DEST_QPN"),
        (QpAttr { retry_cnt: Some(8), ..rc_attrs(QpState::Init) }, "IBV_QP_RETRY_CNT"),
    ] {
        assert_eq!(
            h.dev.modify_qp(h.qp, &bad),
            Err(ModifyError::UnexpectedAttribute {
                attr: name,
                from: QpState::Init,
                to: QpState::Init
            })
        );
    }
    // IBV_QP_CUR_STATE is taken on the way to RTS only, and must be right.
    let believed = QpAttr { cur_state: Some(QpState::Init), ..rc_attrs(QpState::Init) };
    assert!(matches!(
        h.dev.modify_qp(h.qp, &believed),
        Err(ModifyError::UnexpectedAttribute { attr: "IBV_QP_CUR_STATE", .. })
    ));
    assert_eq!(
        h.dev.post_send(h.qp, SendWr::new(1, WrOpcode::Send, vec![])),
        Err(PostError::InvalidState(QpState::Init))
    );
}

#[test]
fn psns_far_out_of_window_and_wrong_qpns_are_dropped_and_counted() {
    // Rewrite every request to a PSN far ahead, then far behind, then to a QPN that is not there.
    for (shift, what) in [(0x40_0000u32, "ahead"), (0xC0_0000, "behind"), (0, "qpn")] {
        let mut q = Pair::new(Mtu::Mtu1024);
        q.post_recv(B, 1, 0, 64);
        let before = q.net[B].dev.memory().buffer(q.hosts[B].mr.addr).unwrap().to_vec();
        let qpn_b = q.hosts[B].qp;
        q.post_send(A, SendWr::new(1, WrOpcode::Send, vec![q.sge(A, 0, 64)]));
        // Take the packet off A by hand and forge it.
        let mut buf = Vec::new();
        let (src, _) = q.take(A, &mut buf);
        let mut repr = PacketRepr::parse_ignoring_icrc(&buf).unwrap().repr;
        let payload = repr.payload.to_vec();
        repr.payload = &payload;
        if what == "qpn" {
            repr.bth.dest_qp = Qpn::from_masked(qpn_b.get() ^ 0x800);
        } else {
            repr.bth.psn = repr.bth.psn.add(shift);
        }
        let dst = SocketAddr::new(q.net[B].dev.addr(), ROCE_V2_PORT);
        let pseudo = uroce_wire::icrc::PseudoHeader::for_endpoints(src, dst).unwrap();
        let mut out = vec![0u8; repr.buffer_len().unwrap()];
        repr.emit(&pseudo, &mut out).unwrap();
        for _ in 0..3 {
            q.hand(B, src, &out);
        }
        let c = *q.net[B].dev.counters();
        match what {
            "ahead" => assert_eq!((c.rcv_seq_err, c.drop_out_of_sequence), (1, 2)),
            "behind" => assert_eq!(c.dup_req, 3),
            _ => assert_eq!(c.drop_unknown_qp, 3),
        }
        assert!(q.cq(B).is_empty(), "{what}: nothing delivered");
        assert!(q.net[B].dev.memory().buffer(q.hosts[B].mr.addr).unwrap() == &before[..]);
    }
}

#[test]
fn corrupted_packets_fail_the_icrc_and_are_counted() {
    let mut p = Pair::new(Mtu::Mtu1024);
    p.post_recv(B, 1, 0, 64);
    p.post_send(A, SendWr::new(1, WrOpcode::Send, vec![p.sge(A, 0, 64)]));
    let mut buf = Vec::new();
    let (src, _) = p.take(A, &mut buf);
    buf[20] ^= 1;
    p.hand(B, src, &buf);
    p.hand(B, src, &buf[..7]);
    let c = *p.net[B].dev.counters();
    assert_eq!((c.icrc_errors, c.drop_malformed, c.rcvd_pkts), (1, 1, 0));
}

/// A receiver does not see the IPv4 identification its packets' ICRC covers. Set to what an
/// unconnected Linux socket sends (0, and k for segment k of a GSO send, k < 128) it refuses
/// others by name, so a GSO segment verifies and a forged or corrupted identity does not; by
/// default it accepts any (what a connected socket's counter gives).
#[test]
fn icrcs_for_linux_gso_identifications_pass_and_others_are_refused() {
    for strict in [true, false] {
        icrcs_for_identifications(strict);
    }
}

fn icrcs_for_identifications(strict: bool) {
    let policy = if strict { Ipv4IdPolicy::LinuxGso } else { Ipv4IdPolicy::default() };
    let mut p = Pair::checking(Mtu::Mtu1024, QpType::Rc, policy);
    p.post_recv(B, 1, 0, 64);
    p.post_send(A, SendWr::new(1, WrOpcode::Send, vec![p.sge(A, 0, 64)]));
    let mut buf = Vec::new();
    let (src, _) = p.take(A, &mut buf);
    let dst = SocketAddr::new(p.net[B].dev.addr(), ROCE_V2_PORT);
    let sealed = |id: u16| {
        let mut b = buf.clone();
        let pseudo = uroce_wire::icrc::PseudoHeader::for_endpoints(src, dst).unwrap();
        let end = b.len() - 4;
        let crc = uroce_wire::icrc::compute(&pseudo.with_ipv4_id(id), &b[..end]).unwrap();
        b[end..].copy_from_slice(&uroce_wire::icrc::to_wire(crc));
        b
    };
    let refused = if strict { 3 } else { 0 };
    for id in [128, 200, 0x69c5] {
        p.hand(B, src, &sealed(id));
    }
    let c = *p.net[B].dev.counters();
    assert_eq!((c.drop_unexpected_ip_id, c.icrc_errors, c.rcvd_pkts), (refused, 0, 3 - refused));
    p.hand(B, src, &sealed(5));
    let c = *p.net[B].dev.counters();
    assert_eq!((c.drop_unexpected_ip_id, c.icrc_errors), (refused, 0));
    assert_eq!(statuses(&p.cq(B)), [(1, WcStatus::SUCCESS)]);
}

#[test]
fn inline_data_is_copied_at_post_time() {
    let mut p = Pair::new(Mtu::Mtu1024);
    p.post_recv(B, 1, 0, 64);
    let mut wr = SendWr::new(1, WrOpcode::Send, vec![]);
    wr.inline_data = Some(b"inline bytes".to_vec());
    p.post_send(A, wr);
    p.run(Duration::from_millis(1));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS)]);
    assert_eq!(p.cq(B)[0].byte_len, 12);
    assert_eq!(p.mem(B, 0, 12), b"inline bytes");
    let mut big = SendWr::new(2, WrOpcode::Send, vec![]);
    big.inline_data = Some(vec![0; 257]);
    let (h, dev) = (p.hosts[A], &mut p.net[A].dev);
    assert_eq!(dev.post_send(h.qp, big), Err(PostError::InlineTooLong));
}

#[test]
fn unsignaled_successes_complete_nothing() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let mut wr = write_wr(&p, 1, 0, 0, 8);
    wr.flags = SendFlags::NONE;
    p.post_send(A, wr);
    p.post_send(A, write_wr(&p, 2, 0, 8, 8));
    p.run(Duration::from_millis(1));
    assert_eq!(statuses(&p.cq(A)), [(2, WcStatus::SUCCESS)]);
}

/// The first packet each of the given opcodes was sent at.
fn first_sent(p: &Pair, from: usize, op: Opcode) -> Instant {
    p.log().iter().find(|e| e.1 == from && e.2 == op).unwrap().0
}

#[test]
fn a_fenced_request_waits_for_earlier_reads() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let delay = Duration::from_micros(10);
    p.set_delay(delay);
    p.post_send(A, read_wr(&p, 1, 0x1000, 0, 4000));
    let mut wr = write_wr(&p, 2, 0, 0x8000, 8);
    wr.flags = SendFlags::SIGNALED | SendFlags::FENCE;
    p.post_send(A, wr);
    p.run(Duration::from_millis(1));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS), (2, WcStatus::SUCCESS)]);
    let last_response = first_sent(&p, B, Opcode::RC_RDMA_READ_RESPONSE_LAST);
    let write = first_sent(&p, A, Opcode::RC_RDMA_WRITE_ONLY);
    assert!(write >= last_response + delay, "the WRITE left before the READ completed");

    // Without the fence the WRITE goes right behind the READ request.
    let mut q = Pair::new(Mtu::Mtu1024);
    q.set_delay(Duration::from_micros(10));
    q.post_send(A, read_wr(&q, 1, 0x1000, 0, 4000));
    q.post_send(A, write_wr(&q, 2, 0, 0x8000, 8));
    q.run(Duration::from_millis(1));
    assert_eq!(first_sent(&q, A, Opcode::RC_RDMA_WRITE_ONLY), Instant::ZERO);
}

#[test]
fn max_rd_atomic_limits_outstanding_reads() {
    let mut p = Pair::new(Mtu::Mtu1024);
    p.set_delay(Duration::from_micros(10));
    let qp = p.hosts[A].qp;
    change_in_sqd(
        &mut p.net[A].dev,
        qp,
        QpAttr { max_rd_atomic: Some(2), ..rc_attrs(QpState::Sqd) },
    );
    for k in 0..4 {
        p.post_send(A, read_wr(&p, k, 0x1000 * (k + 1), 0, 100));
    }
    p.run(Duration::from_millis(1));
    assert_eq!(p.cq(A).len(), 4);
    let requests: Vec<Instant> = p
        .log()
        .iter()
        .filter(|e| e.1 == A && e.2 == Opcode::RC_RDMA_READ_REQUEST)
        .map(|e| e.0)
        .collect();
    assert_eq!(requests.len(), 4);
    assert_eq!(requests[1], Instant::ZERO, "two READs may be outstanding");
    assert!(requests[2] > Instant::ZERO, "the third waits for the first to complete");
}

#[test]
fn a_batch_is_posted_whole_or_not_at_all() {
    // ibv_wr_complete(3): a failure aborts the entire posting.
    let mut p = Pair::new(Mtu::Mtu1024);
    for k in 0..3 {
        p.post_recv(B, 100 + k, 0x8_0000 + k * 64, 64);
    }
    let send = |p: &Pair, id| SendWr::new(id, WrOpcode::Send, vec![p.sge(A, 0, 8)]);
    let (qp, bad) = (p.hosts[A].qp, SendWr::new(9, WrOpcode::RdmaWrite, vec![]));
    let batch = vec![send(&p, 1), bad, send(&p, 3)];
    assert_eq!(p.net[A].dev.post_send_batch(qp, batch), Err((1, PostError::MissingRemote)));
    let too_many: Vec<_> = (0..257).map(|k| send(&p, 10 + k)).collect();
    assert_eq!(p.net[A].dev.post_send_batch(qp, too_many), Err((256, PostError::QueueFull)));
    p.run(Duration::from_millis(10));
    assert!(p.cq(A).is_empty() && p.cq(B).is_empty(), "a refused batch posted something");
    let good = vec![send(&p, 1), send(&p, 2), send(&p, 3)];
    p.net[A].dev.post_send_batch(qp, good).unwrap();
    p.run(Duration::from_millis(10));
    let ok = |ids: [u64; 3]| ids.map(|id| (id, WcStatus::SUCCESS)).to_vec();
    assert_eq!(statuses(&p.cq(A)), ok([1, 2, 3]));
    assert_eq!(statuses(&p.cq(B)), ok([100, 101, 102]));
}

#[test]
fn post_checks_name_the_rule_broken() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let (h, dev) = (p.hosts[A], &mut p.net[A].dev);
    let mr = h.mr;
    let huge = vec![
        Sge { addr: mr.addr, length: 1 << 30, lkey: mr.lkey },
        Sge { addr: mr.addr, length: 1 << 30, lkey: mr.lkey },
        Sge { addr: mr.addr, length: 1, lkey: mr.lkey },
    ];
    assert_eq!(
        dev.post_send(h.qp, SendWr::new(1, WrOpcode::Send, huge)),
        Err(PostError::MessageTooLong)
    );
    assert_eq!(
        dev.post_send(h.qp, SendWr::new(1, WrOpcode::RdmaWrite, vec![])),
        Err(PostError::MissingRemote)
    );
    let five = vec![Sge { addr: mr.addr, length: 1, lkey: mr.lkey }; 5];
    assert_eq!(
        dev.post_send(h.qp, SendWr::new(1, WrOpcode::Send, five)),
        Err(PostError::TooManySge)
    );
    let mut atomic = SendWr::new(
        1,
        WrOpcode::AtomicFetchAndAdd,
        vec![Sge { addr: mr.addr, length: 4, lkey: mr.lkey }],
    );
    atomic.remote = Some(RemoteAddr { addr: 0, rkey: mr.rkey });
    assert_eq!(dev.post_send(h.qp, atomic), Err(PostError::BadAtomicSge));
    assert_eq!(
        dev.post_send(h.qp, SendWr::new(1, WrOpcode::SendWithImm, vec![])),
        Err(PostError::MissingImm)
    );
    for k in 0..256 {
        dev.post_send(h.qp, SendWr::new(k, WrOpcode::Send, vec![])).unwrap();
    }
    assert_eq!(
        dev.post_send(h.qp, SendWr::new(9, WrOpcode::Send, vec![])),
        Err(PostError::QueueFull)
    );
}

#[test]
fn a_full_cq_loses_completions_and_says_so() {
    let mut h = host("127.0.0.9", 3, 0);
    let small = h.dev.create_cq(2).unwrap();
    let init = QpInitAttr::new(QpType::Rc, h.pd, small);
    let qp = h.dev.create_qp(init).unwrap();
    let access = QpAttr {
        pkey_index: Some(0),
        port_num: Some(1),
        access_flags: Some(Access::NONE),
        ..rc_attrs(QpState::Init)
    };
    h.dev.modify_qp(qp, &access).unwrap();
    for k in 0..3 {
        h.dev.post_recv(qp, RecvWr { wr_id: k, sg_list: vec![].into() }).unwrap();
    }
    h.dev.modify_qp(qp, &rc_attrs(QpState::Error)).unwrap();
    assert_eq!(h.dev.cq_len(small), 2);
    assert!(h.dev.cq_overflowed(small));
    assert_eq!(h.dev.counters().cq_overflows, 1);
    assert_eq!(h.dev.poll_async_event(), Some(AsyncEvent::CqError(small)));
    let _ = h.cq;
}

#[test]
fn an_rnr_nak_stands_for_the_packets_behind_it() {
    let mut p = Pair::new(Mtu::Mtu256);
    fill(&mut p, A, 0, 1000, 1);
    p.post_send(A, SendWr::new(1, WrOpcode::Send, vec![p.sge(A, 0, 1000)]));
    p.run(Duration::from_micros(5));
    p.post_recv(B, 7, 0x1000, 1000);
    p.run(Duration::from_millis(1));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS)]);
    let b = *p.net[B].dev.counters();
    let a = *p.net[A].dev.counters();
    assert!(b.rnr_naks_sent >= 1);
    assert_eq!(b.rcv_seq_err, 0, "no sequence NAK on top of the RNR NAK");
    assert_eq!(b.drop_out_of_sequence, 3 * b.rnr_naks_sent, "the rest of each try dropped");
    assert_eq!(a.seq_naks_rcvd, 0);
}

#[test]
fn rnr_retry_seven_retries_forever() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let qp = p.hosts[A].qp;
    change_in_sqd(&mut p.net[A].dev, qp, QpAttr { rnr_retry: Some(7), ..rc_attrs(QpState::Sqd) });
    p.post_send(A, SendWr::new(1, WrOpcode::Send, vec![p.sge(A, 0, 8)]));
    // min_rnr_timer code 1 is 10 µs: 10 ms is hundreds of RNR NAKs.
    p.run(Duration::from_millis(10));
    assert!(p.cq(A).is_empty(), "still retrying");
    assert!(p.net[A].dev.counters().rnr_naks_rcvd > 100);
    p.post_recv(B, 1, 0, 8);
    p.run(Duration::from_millis(1));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS)]);
}

#[test]
fn send_queue_drain_finishes_started_work_and_starts_nothing_new() {
    let mut p = Pair::new(Mtu::Mtu1024);
    p.set_delay(Duration::from_micros(10));
    p.post_send(A, write_wr(&p, 1, 0, 0, 8));
    let mut buf = Vec::new();
    // The first WRITE goes on the wire; then the QP drains.
    let (src, _) = p.take(A, &mut buf);
    let qp = p.hosts[A].qp;
    p.net[A].dev.modify_qp(qp, &rc_attrs(QpState::Sqd)).unwrap();
    p.post_send(A, write_wr(&p, 2, 0, 8, 8));
    p.hand(B, src, &buf);
    p.run(Duration::from_millis(1));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS)], "the started WRITE completes");
    assert!(
        !p.log().iter().any(|e| e.1 == A && e.2 == Opcode::RC_RDMA_WRITE_ONLY),
        "nothing new started"
    );
    p.net[A].dev.modify_qp(qp, &rc_attrs(QpState::Rts)).unwrap();
    p.run(Duration::from_millis(1));
    assert_eq!(statuses(&p.cq(A)), [(2, WcStatus::SUCCESS)]);
}

#[test]
fn creation_beyond_the_device_limits_is_refused() {
    let mut h = host("127.0.0.9", 3, 0);
    let attr = h.dev.attr();
    assert_eq!(attr.max_msg_sz, 1 << 31);
    assert!(attr.max_qp_rd_atom > 0);
    assert!(matches!(
        h.dev.create_cq(attr.max_cqe as usize + 1),
        Err(CreateError::ExceedsLimit { limit: "max_cqe", .. })
    ));
    let mut init = QpInitAttr {
        qp_type: QpType::Rc,
        pd: h.pd,
        send_cq: h.cq,
        recv_cq: h.cq,
        cap: QpCap { max_send_sge: attr.max_sge + 1, ..QpCap::default() },
        sq_sig_all: false,
        srq: None,
        xrcd: None,
    };
    assert!(matches!(
        h.dev.create_qp(init),
        Err(CreateError::ExceedsLimit { limit: "max_sge", .. })
    ));
    init.cap = QpCap { max_recv_wr: attr.max_qp_wr + 1, ..QpCap::default() };
    assert!(matches!(
        h.dev.create_qp(init),
        Err(CreateError::ExceedsLimit { limit: "max_qp_wr", .. })
    ));
    assert_eq!(h.dev.gid()[10..12], [0xff, 0xff], "IPv4-mapped GID");
}

/// UC: SEND and WRITE go out once, nothing comes back, and completions happen on sending.
#[test]
fn uc_delivers_without_acknowledgements() {
    let mut p = Pair::connected(Mtu::Mtu256, QpType::Uc);
    let data = fill(&mut p, A, 0, 1000, 4);
    p.post_recv(B, 9, 0x1000, 1000);
    let mut send = SendWr::new(1, WrOpcode::SendWithImm, vec![p.sge(A, 0, 1000)]);
    send.imm = Some([0, 0, 0, 1]);
    p.post_send(A, send);
    p.post_send(A, write_wr(&p, 2, 0, 0x8000, 1000));
    p.run(Duration::from_millis(1));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS), (2, WcStatus::SUCCESS)]);
    let recv = p.cq(B);
    assert_eq!((recv[0].wr_id, recv[0].byte_len, recv[0].imm), (9, 1000, Some([0, 0, 0, 1])));
    assert_eq!(p.mem(B, 0x1000, 1000), &data[..]);
    assert_eq!(p.mem(B, 0x8000, 1000), &data[..]);
    assert!(p.log().iter().all(|e| e.1 == A), "UC sends no ACKs");
    assert!(p.log().iter().all(|e| e.2.0 & 0xE0 == 0x20), "UC opcodes");
    assert!(p.log().iter().all(|e| e.4.is_none()));
}

#[test]
fn uc_a_lost_packet_drops_the_message_and_its_receive_takes_the_next() {
    let mut p = Pair::connected(Mtu::Mtu256, QpType::Uc);
    fill(&mut p, A, 0, 1000, 1);
    let second = fill(&mut p, A, 0x4000, 300, 2);
    p.post_recv(B, 7, 0x1000, 1000);
    p.set_filter(drop_once(|_, pkt| pkt.bth.opcode == Opcode::UC_SEND_MIDDLE));
    p.post_send(A, SendWr::new(1, WrOpcode::Send, vec![p.sge(A, 0, 1000)]));
    p.post_send(A, SendWr::new(2, WrOpcode::Send, vec![p.sge(A, 0x4000, 300)]));
    p.run(Duration::from_millis(1));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS), (2, WcStatus::SUCCESS)]);
    let recv = p.cq(B);
    assert_eq!(recv.len(), 1, "the broken message never completes");
    assert_eq!((recv[0].wr_id, recv[0].byte_len), (7, 300), "its receive took the next message");
    assert_eq!(p.mem(B, 0x1000, 300), &second[..]);
    let c = *p.net[B].dev.counters();
    assert_eq!(c.rcv_seq_err, 1);
    assert!(c.drop_out_of_sequence >= 1);
}

#[test]
fn uc_refuses_read_and_atomics_and_drops_what_it_cannot_place() {
    let mut p = Pair::connected(Mtu::Mtu1024, QpType::Uc);
    let (h, dev) = (p.hosts[A], &mut p.net[A].dev);
    let mut read = SendWr::new(
        1,
        WrOpcode::RdmaRead,
        vec![Sge { addr: h.mr.addr, length: 8, lkey: h.mr.lkey }],
    );
    read.remote = Some(RemoteAddr { addr: 0, rkey: h.mr.rkey });
    assert_eq!(dev.post_send(h.qp, read), Err(PostError::UnsupportedOpcode));
    // No receive posted: the SEND is dropped, no RNR NAK.
    p.post_send(A, SendWr::new(2, WrOpcode::Send, vec![p.sge(A, 0, 8)]));
    // A forged rkey: the WRITE is dropped, the QP lives on, memory untouched.
    let before = p.net[B].dev.memory().buffer(p.hosts[B].mr.addr).unwrap().to_vec();
    let mut wr = write_wr(&p, 3, 0, 0, 8);
    wr.remote.as_mut().unwrap().rkey.0 ^= 1;
    p.post_send(A, wr);
    p.run(Duration::from_millis(1));
    assert_eq!(statuses(&p.cq(A)), [(2, WcStatus::SUCCESS), (3, WcStatus::SUCCESS)]);
    assert!(p.cq(B).is_empty());
    assert!(p.net[B].dev.memory().buffer(p.hosts[B].mr.addr).unwrap() == &before[..]);
    let c = *p.net[B].dev.counters();
    assert_eq!((c.drop_rnr, c.rnr_naks_sent, c.drop_uc_invalid), (1, 0, 1));
    assert_eq!(p.net[B].dev.qp_state(p.hosts[B].qp), Some(QpState::Rts));
    assert!(p.log().iter().all(|e| e.1 == A));
}

#[test]
fn an_armed_cq_notifies_once_and_solicited_only_waits_for_se_or_an_error() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let cq_b = p.hosts[B].cq;
    for k in 0..4 {
        p.post_recv(B, k, 0x1000 * (k + 1), 64);
    }
    // Armed for solicited only: a plain SEND does not fire it, a solicited one does.
    assert!(p.net[B].dev.req_notify_cq(cq_b, true));
    p.post_send(A, SendWr::new(1, WrOpcode::Send, vec![p.sge(A, 0, 8)]));
    p.run(Duration::from_millis(1));
    assert_eq!(p.net[B].dev.poll_cq_event(), None);
    let mut se = SendWr::new(2, WrOpcode::Send, vec![p.sge(A, 0, 8)]);
    se.flags = SendFlags::SIGNALED | SendFlags::SOLICITED;
    p.post_send(A, se);
    p.run(Duration::from_millis(1));
    assert_eq!(p.net[B].dev.poll_cq_event(), Some(cq_b));
    assert_eq!(p.net[B].dev.poll_cq_event(), None);
    // One notification per arming: the next completion, unarmed, raises nothing.
    p.post_send(A, SendWr::new(3, WrOpcode::Send, vec![p.sge(A, 0, 8)]));
    p.run(Duration::from_millis(1));
    assert_eq!(p.net[B].dev.poll_cq_event(), None);
    // Armed for any completion: the next one fires it.
    p.net[B].dev.req_notify_cq(cq_b, false);
    p.post_send(A, SendWr::new(4, WrOpcode::Send, vec![p.sge(A, 0, 8)]));
    p.run(Duration::from_millis(1));
    assert_eq!(p.net[B].dev.poll_cq_event(), Some(cq_b));
    assert_eq!(p.cq(B).len(), 4);
}

#[test]
fn transport_errors_and_cq_overflow_raise_async_events() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let mut h = host("127.0.0.9", 5, 0);
    // RNR retries run out at A: QP_FATAL for A's QP.
    p.post_send(A, SendWr::new(1, WrOpcode::Send, vec![p.sge(A, 0, 8)]));
    p.run(Duration::from_secs(1));
    assert_eq!(p.cq(A)[0].status, WcStatus::RNR_RETRY_EXC_ERR);
    assert_eq!(p.net[A].dev.poll_async_event(), Some(AsyncEvent::QpFatal(p.hosts[A].qp)));
    assert_eq!(p.net[A].dev.poll_async_event(), None);
    // Moving a QP to Error by hand is not a fatal event.
    let qp = h.qp;
    h.dev.modify_qp(qp, &rc_attrs(QpState::Error)).unwrap();
    assert_eq!(h.dev.poll_async_event(), None);
}

#[test]
fn the_first_packet_at_a_qp_in_rtr_raises_comm_established() {
    let mut p = Pair::new(Mtu::Mtu1024);
    // Put B back to RTR: reset it and bring it up to RTR only.
    let (qp_a, qp_b) = (p.hosts[A].qp, p.hosts[B].qp);
    let b = &mut p.net[B].dev;
    b.modify_qp(qp_b, &rc_attrs(QpState::Reset)).unwrap();
    let all = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    b.modify_qp(
        qp_b,
        &QpAttr {
            pkey_index: Some(0),
            port_num: Some(1),
            access_flags: Some(all),
            ..rc_attrs(QpState::Init)
        },
    )
    .unwrap();
    let a_addr: IpAddr = "127.0.0.2".parse().unwrap();
    let rtr = QpAttr {
        av: Some(AddressVector { dest: a_addr }),
        path_mtu: Some(Mtu::Mtu1024),
        dest_qp_num: Some(qp_a),
        rq_psn: Some(Psn::from_masked(0xFF_FFF0)),
        max_dest_rd_atomic: Some(4),
        min_rnr_timer: Some(RnrTimer::from_masked(1)),
        ..rc_attrs(QpState::Rtr)
    };
    b.modify_qp(qp_b, &rtr).unwrap();
    p.post_send(A, write_wr(&p, 1, 0, 0, 8));
    p.post_send(A, write_wr(&p, 2, 0, 8, 8));
    p.run(Duration::from_millis(1));
    assert_eq!(
        statuses(&p.cq(A)),
        [(1, WcStatus::SUCCESS), (2, WcStatus::SUCCESS)],
        "RTR responds"
    );
    assert_eq!(p.net[B].dev.poll_async_event(), Some(AsyncEvent::CommEstablished(qp_b)));
    assert_eq!(p.net[B].dev.poll_async_event(), None, "once");
}

/// Changes a sending RC QP's `attr` the way IBA 11.2.5.2 allows: RTS→RTS does not take the
/// retry counts or the requester's depth, SQD→SQD does; then back to RTS.
fn change_in_sqd(dev: &mut Device<VecMemory>, qp: Qpn, attr: QpAttr) {
    dev.modify_qp(qp, &rc_attrs(QpState::Sqd)).unwrap();
    dev.modify_qp(qp, &attr).unwrap();
    dev.modify_qp(qp, &rc_attrs(QpState::Rts)).unwrap();
}

/// Brings `qp` on `dev` to RTS, connected to `peer_qpn` at `peer`.
fn connect_rc(dev: &mut Device<VecMemory>, qp: Qpn, peer: IpAddr, peer_qpn: Qpn) {
    let all = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let init = QpAttr {
        pkey_index: Some(0),
        port_num: Some(1),
        access_flags: Some(all),
        ..rc_attrs(QpState::Init)
    };
    dev.modify_qp(qp, &init).unwrap();
    let rtr = QpAttr {
        av: Some(AddressVector { dest: peer }),
        path_mtu: Some(Mtu::Mtu1024),
        dest_qp_num: Some(peer_qpn),
        rq_psn: Some(Psn::ZERO),
        max_dest_rd_atomic: Some(1),
        min_rnr_timer: Some(RnrTimer::from_masked(1)),
        ..rc_attrs(QpState::Rtr)
    };
    dev.modify_qp(qp, &rtr).unwrap();
    let rts = QpAttr {
        sq_psn: Some(Psn::ZERO),
        timeout: Some(10),
        retry_cnt: Some(3),
        rnr_retry: Some(7),
        max_rd_atomic: Some(1),
        ..rc_attrs(QpState::Rts)
    };
    dev.modify_qp(qp, &rts).unwrap();
}

#[test]
fn qps_share_a_receive_queue_with_its_limit_rnr_and_last_wqe_events() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let (ip_a, ip_b) = (p.net[A].dev.addr(), p.net[B].dev.addr());
    let srq = p.net[B].dev.create_srq(p.hosts[B].pd, 8, 1).unwrap();
    let mut make = |i: usize, srq: Option<SrqHandle>| {
        let (h, dev) = (p.hosts[i], &mut p.net[i].dev);
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            pd: h.pd,
            send_cq: h.cq,
            recv_cq: h.cq,
            cap: QpCap::default(),
            sq_sig_all: true,
            srq,
            xrcd: None,
        };
        dev.create_qp(init).unwrap()
    };
    let (a1, a2, b1, b2) = (make(A, None), make(A, None), make(B, Some(srq)), make(B, Some(srq)));
    connect_rc(&mut p.net[A].dev, a1, ip_b, b1);
    connect_rc(&mut p.net[A].dev, a2, ip_b, b2);
    connect_rc(&mut p.net[B].dev, b1, ip_a, a1);
    connect_rc(&mut p.net[B].dev, b2, ip_a, a2);
    let mr_b = p.hosts[B].mr;
    for k in 0..3u64 {
        let sge = Sge { addr: mr_b.addr + 0x100 * k, length: 64, lkey: mr_b.lkey };
        p.net[B].dev.post_srq_recv(srq, RecvWr { wr_id: k, sg_list: vec![sge].into() }).unwrap();
    }
    assert!(p.net[B].dev.arm_srq_limit(srq, 2));
    let sge = p.sge(A, 0, 8);
    for (wr_id, qp) in [(10, a1), (11, a2), (12, a1)] {
        p.net[A].dev.post_send(qp, SendWr::new(wr_id, WrOpcode::Send, vec![sge])).unwrap();
        p.run(Duration::from_micros(100));
    }
    let recv = p.cq(B);
    let got: Vec<(u64, Qpn)> = recv.iter().map(|w| (w.wr_id, w.qp_num)).collect();
    assert_eq!(got, [(0, b1), (1, b2), (2, b1)], "one pool, taken in order by both QPs");
    assert_eq!(p.net[B].dev.poll_async_event(), Some(AsyncEvent::SrqLimitReached(srq)));
    assert_eq!(p.net[B].dev.poll_async_event(), None, "once per arming");
    // An empty SRQ answers RNR NAK; a receive posted later is taken by the retry.
    p.net[A].dev.post_send(a2, SendWr::new(13, WrOpcode::Send, vec![sge])).unwrap();
    p.run(Duration::from_micros(100));
    assert!(p.net[B].dev.counters().rnr_naks_sent >= 1);
    let sge_b = Sge { addr: mr_b.addr + 0x400, length: 64, lkey: mr_b.lkey };
    p.net[B].dev.post_srq_recv(srq, RecvWr { wr_id: 3, sg_list: vec![sge_b].into() }).unwrap();
    p.run(Duration::from_millis(1));
    assert_eq!(p.cq(B).iter().map(|w| (w.wr_id, w.qp_num)).collect::<Vec<_>>(), [(3, b2)]);
    assert_eq!(p.cq(A).len(), 4);
    // Receives go to the SRQ, not the QP; a QP leaving leaves the SRQ's WQEs to the others.
    let dev = &mut p.net[B].dev;
    assert_eq!(
        dev.post_recv(b1, RecvWr { wr_id: 9, sg_list: vec![].into() }),
        Err(PostError::UsesSrq)
    );
    dev.post_srq_recv(srq, RecvWr { wr_id: 4, sg_list: vec![sge_b].into() }).unwrap();
    dev.modify_qp(b1, &rc_attrs(QpState::Error)).unwrap();
    assert_eq!(dev.poll_async_event(), Some(AsyncEvent::LastWqeReached(b1)));
    assert_eq!(dev.srq_len(srq), 1, "not flushed");
}

#[test]
fn per_qp_counters_add_up_to_the_device_counters() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let mut n = 0;
    p.set_filter(Box::new(move |from, _| {
        n += 1;
        !(from == A && n == 3)
    }));
    p.post_recv(B, 1, 0, 8192);
    p.post_send(A, SendWr::new(1, WrOpcode::Send, vec![p.sge(A, 0, 5000)]));
    p.run(Duration::from_millis(100));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS)]);
    for i in [A, B] {
        let d = &p.net[i].dev;
        let (q, c) = (d.qp_counters(p.hosts[i].qp).unwrap(), d.counters());
        assert_eq!((q.sent_pkts, q.sent_bytes), (c.sent_pkts, c.sent_bytes));
        assert_eq!((q.rcvd_pkts, q.rcvd_bytes), (c.rcvd_pkts, c.rcvd_bytes));
        assert_eq!(q.retransmitted_pkts, c.retransmitted_pkts);
        assert_eq!(q.rcv_seq_err, c.rcv_seq_err);
    }
    let qa = p.net[A].dev.qp_counters(p.hosts[A].qp).unwrap();
    assert!(qa.retransmitted_pkts > 0 && qa.seq_naks_rcvd == 1, "{qa:?}");
}

#[test]
fn losses_shrink_the_window_so_go_back_n_resends_less() {
    let mut p = Pair::new(Mtu::Mtu1024);
    // 512 KiB WRITEs: 512 packets each; every 100th request packet from A is lost.
    let data = fill(&mut p, A, 0, 512 << 10, 3);
    let mut n = 0u32;
    p.set_filter(Box::new(move |from, _| {
        if from != A {
            return true;
        }
        n += 1;
        !n.is_multiple_of(100)
    }));
    for k in 0..4 {
        p.post_send(A, write_wr(&p, k, 0, 0x1000, 512 << 10));
    }
    p.run(Duration::from_secs(2));
    let done = statuses(&p.cq(A));
    assert_eq!(done, (0..4).map(|k| (k, WcStatus::SUCCESS)).collect::<Vec<_>>());
    assert_eq!(p.mem(B, 0x1000, 512 << 10), &data[..]);
    let c = *p.net[A].dev.counters();
    // With the device's full window of 256 packets every loss would resend about that many;
    // the loss-driven window keeps the waste to a fraction of it.
    assert!(c.seq_naks_rcvd >= 10, "{c:?}");
    assert!(
        c.retransmitted_pkts < 60 * c.seq_naks_rcvd,
        "{} packets resent for {} losses",
        c.retransmitted_pkts,
        c.seq_naks_rcvd
    );
}

#[test]
fn qp1_carries_mads_as_gmps_and_counts_what_is_not_one() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let b_addr = p.net[B].dev.addr();
    let a_addr = p.net[A].dev.addr();
    let mad = uroce_wire::examples::sample_cm_messages()[0];
    p.net[A].dev.gsi_send(b_addr, &mad);
    let mut buf = Vec::new();
    let (src, dst) = p.take(A, &mut buf);
    assert_eq!(dst, SocketAddr::new(b_addr, ROCE_V2_PORT));
    let parsed = PacketRepr::parse_ignoring_icrc(&buf).unwrap().repr;
    assert_eq!(uroce_wire::mad::gmp_payload(&parsed).unwrap(), &mad[..]);
    p.hand(B, src, &buf);
    let got = p.net[B].dev.poll_gsi().unwrap();
    assert_eq!((got.from, got.mad), (a_addr, mad));
    assert!(p.net[B].dev.poll_gsi().is_none());

    // Corrupted: the ICRC catches it. A UD SEND to QP1 with another Q_Key is no GMP.
    let mut bad = buf.clone();
    bad[40] ^= 1;
    p.hand(B, src, &bad);
    let mut m = parsed;
    let mut deth = m.ext.deth.unwrap();
    deth.qkey = QKey(0x1234);
    m.ext.deth = Some(deth);
    let pseudo =
        uroce_wire::icrc::PseudoHeader::for_endpoints(src, SocketAddr::new(b_addr, ROCE_V2_PORT))
            .unwrap();
    let mut forged = vec![0; m.buffer_len().unwrap()];
    m.emit(&pseudo, &mut forged).unwrap();
    p.hand(B, src, &forged);
    let c = *p.net[B].dev.counters();
    assert_eq!((c.gsi_rcvd, c.icrc_errors, c.drop_not_gmp), (1, 1, 1));
    assert!(p.net[B].dev.poll_gsi().is_none());
    assert_eq!(p.net[A].dev.counters().gsi_sent, 1);
}

/// A NAK names the PSN the responder expects, which must still be unacknowledged: an old RNR
/// NAK (a duplicate, or a forgery) for a PSN already acknowledged is stale and dropped. The
/// requester once took it: it cleared the ACK timer for the RNR wait, went "back" to that PSN
/// when the wait ended, found no WQE holding it, and was left with packets outstanding and
/// only its tail probes to recover; with those used up, with none (the adversary's input
/// `uroce-sim/tests/regressions/engine/hung-rc-recovery`).
#[test]
fn an_rnr_nak_for_an_acknowledged_psn_is_stale_and_the_qp_still_completes() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let dst_a = SocketAddr::new(p.net[A].dev.addr(), ROCE_V2_PORT);
    p.post_recv(B, 1, 0, 64);
    p.post_recv(B, 2, 64, 64);
    p.post_send(A, SendWr::new(1, WrOpcode::Send, vec![p.sge(A, 0, 64)]));
    // By hand: the SEND to B, B's ACK back to A (kept).
    let mut buf = Vec::new();
    let (from_a, _) = p.take(A, &mut buf);
    p.hand(B, from_a, &buf);
    let (src_b, _) = p.take(B, &mut buf);
    let mut ack = buf.clone();
    p.hand(A, src_b, &ack);
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS)]);
    // The second SEND is lost; then the old ACK comes back as an RNR NAK for the first.
    p.post_send(A, SendWr::new(2, WrOpcode::Send, vec![p.sge(A, 0, 64)]));
    p.take(A, &mut buf);
    ack[12] = 0x21; // AETH syndrome: RNR NAK, timer code 1
    reseal(src_b, dst_a, &mut ack);
    let stale = p.net[A].dev.counters().drop_stale_response;
    p.hand(A, src_b, &ack);
    assert_eq!(p.net[A].dev.counters().drop_stale_response, stale + 1);
    p.run(Duration::from_secs(1));
    assert_eq!(statuses(&p.cq(A)), [(2, WcStatus::SUCCESS)]);
    assert_eq!(statuses(&p.cq(B)), [(1, WcStatus::SUCCESS), (2, WcStatus::SUCCESS)]);
}

/// Recomputes the ICRC of a forged packet from `src` to `dst`.
fn reseal(src: SocketAddr, dst: SocketAddr, packet: &mut [u8]) {
    let n = packet.len() - 4;
    let pseudo = uroce_wire::icrc::PseudoHeader::for_endpoints(src, dst).unwrap();
    let crc = uroce_wire::icrc::compute(&pseudo, &packet[..n]).unwrap();
    packet[n..].copy_from_slice(&uroce_wire::icrc::to_wire(crc));
}

/// A peer may have at most `max_dest_rd_atomic` READ and atomic requests outstanding (IBA 9.5).
/// A peer that ignores the limit and floods READ requests, with a valid R_Key and each at the
/// expected PSN, faster than the responses go out gets an invalid-request NAK and an Error QP
/// at the one past the limit (the pair's 4); once, every request queued one more response,
/// without bound.
#[test]
fn a_flood_of_read_requests_past_the_responder_resources_is_refused_not_queued() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let (src_a, read) = forged_read(&mut p);
    for k in 0..5000u32 {
        p.hand(B, src_a, &read(k));
    }
    let c = *p.net[B].dev.counters();
    assert_eq!((c.err_naks_sent, c.drop_bad_state), (1, 5000 - u64::from(RD_ATOMIC) - 1), "{c:?}");
    assert_eq!(p.net[B].dev.qp_state(p.hosts[B].qp), Some(QpState::Error));
    // The queued READ responses went with the QP; the NAK for request 5 is what goes out.
    let nak_invalid = Syndrome::Nak(uroce_wire::aeth::NakCode::INVALID_REQUEST).to_byte();
    assert_eq!(p.drain_sent(B), [(Opcode::RC_ACKNOWLEDGE, Some(nak_invalid))]);
}

/// The answers to duplicates do not count against the responder's resources: a requester that
/// resent its READs, then saw their first answers complete and posted one more, is within its
/// limit while the answers to the copies still wait (`ib_read_bw -a` does this when the ACK
/// timer fires during an 8 MiB READ: 16 answers to copies were seen queued there). A
/// responder that counted them NAKed the new READ.
#[test]
fn answers_to_duplicate_reads_leave_the_responder_resources_free() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let (src_a, read) = forged_read(&mut p);
    for k in 0..RD_ATOMIC {
        p.hand(B, src_a, &read(k));
    }
    assert_eq!(p.drain_sent(B).len(), RD_ATOMIC as usize, "each READ answered");
    for k in 0..RD_ATOMIC {
        p.hand(B, src_a, &read(k));
    }
    p.hand(B, src_a, &read(RD_ATOMIC));
    let sent = p.drain_sent(B);
    assert_eq!(sent.len(), RD_ATOMIC as usize + 1, "{sent:?}");
    assert!(sent.iter().all(|&(op, _)| op == Opcode::RC_RDMA_READ_RESPONSE_ONLY), "{sent:?}");
    assert_eq!(p.net[B].dev.counters().err_naks_sent, 0);
    assert_eq!(p.net[B].dev.qp_state(p.hosts[B].qp), Some(QpState::Rts));
    // New READs with no answer gone out fill the resources again: the next is refused.
    let next = RD_ATOMIC + 1;
    for k in next..next + RD_ATOMIC {
        p.hand(B, src_a, &read(k));
    }
    assert_eq!(p.net[B].dev.counters().err_naks_sent, 0);
    p.hand(B, src_a, &read(next + RD_ATOMIC));
    assert_eq!(p.net[B].dev.counters().err_naks_sent, 1);
}

/// A copy of a READ whose answer has not gone out replaces that answer and counts as it did:
/// repeating requests cannot free the resources their first copies hold.
#[test]
fn a_duplicate_that_replaces_an_unsent_answer_still_holds_its_resource() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let (src_a, read) = forged_read(&mut p);
    for _ in 0..2 {
        for k in 0..RD_ATOMIC {
            p.hand(B, src_a, &read(k));
        }
    }
    assert_eq!(p.net[B].dev.counters().err_naks_sent, 0);
    p.hand(B, src_a, &read(RD_ATOMIC));
    assert_eq!(p.net[B].dev.counters().err_naks_sent, 1);
}

/// A's first READ request to B, taken off the wire, and copies of it at later PSNs (one packet
/// each), resealed: a peer forging READs with a valid R_Key.
fn forged_read(p: &mut Pair) -> (SocketAddr, impl Fn(u32) -> Vec<u8> + use<>) {
    let dst_b = SocketAddr::new(p.net[B].dev.addr(), ROCE_V2_PORT);
    p.post_send(A, read_wr(p, 1, 0, 0, 64));
    let mut request = Vec::new();
    let (src_a, _) = p.take(A, &mut request);
    let first = u32::from_be_bytes([0, request[9], request[10], request[11]]);
    let at = move |k: u32| {
        let mut r = request.clone();
        r[9..12].copy_from_slice(&(first.wrapping_add(k) & 0xFF_FFFF).to_be_bytes()[1..]);
        reseal(src_a, dst_b, &mut r);
        r
    };
    (src_a, at)
}

/// A peer repeating one atomic request gets one answer however often it repeats it before the
/// answer goes out (each repeat used to queue one more), and the atomic runs once.
#[test]
fn repeated_duplicates_queue_one_answer_each_not_one_per_copy() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let mut wr = SendWr::new(1, WrOpcode::AtomicFetchAndAdd, vec![p.sge(A, 0, 8)]);
    wr.remote = Some(p.remote(B, 0));
    wr.compare_add = 1;
    p.post_send(A, wr);
    let mut request = Vec::new();
    let (src_a, _) = p.take(A, &mut request);
    p.hand(B, src_a, &request);
    assert_eq!(p.drain_sent(B).len(), 1, "the atomic answered once");
    for _ in 0..1000 {
        p.hand(B, src_a, &request);
    }
    let sent = p.drain_sent(B);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].0, Opcode::RC_ATOMIC_ACKNOWLEDGE);
    assert_eq!(p.mem(B, 0, 8), &1u64.to_le_bytes(), "executed once");
}

#[test]
fn reset_drops_the_completions_its_qp_left_unpolled() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let qp = p.hosts[B].qp;
    for k in 0..3 {
        p.post_recv(B, k, 0, 8);
    }
    // Error flushes the three receives into the CQ; Reset takes them out again, as ConnectX
    // drivers clean a QP's CQs when it is reset.
    p.net[B].dev.modify_qp(qp, &rc_attrs(QpState::Error)).unwrap();
    p.net[B].dev.modify_qp(qp, &rc_attrs(QpState::Reset)).unwrap();
    assert!(p.cq(B).is_empty(), "the flushes of the QP's old work are gone");
    // Without the reset they are there to poll.
    for k in 0..2 {
        connect_again_and_post(&mut p, k);
    }
    p.net[B].dev.modify_qp(qp, &rc_attrs(QpState::Error)).unwrap();
    assert_eq!(statuses(&p.cq(B)), [(0, WcStatus::WR_FLUSH_ERR), (1, WcStatus::WR_FLUSH_ERR)]);
}

/// Brings B's QP from Reset to Init again and posts receive `k`.
fn connect_again_and_post(p: &mut Pair, k: u64) {
    let qp = p.hosts[B].qp;
    if p.net[B].dev.qp_state(qp) == Some(QpState::Reset) {
        let init = QpAttr {
            pkey_index: Some(0),
            port_num: Some(1),
            access_flags: Some(Access::NONE),
            ..rc_attrs(QpState::Init)
        };
        p.net[B].dev.modify_qp(qp, &init).unwrap();
    }
    p.post_recv(B, k, 0, 8);
}

// ---------------------------------------------------------------------------------------------
// Memory windows (IBA 10.6.7): B binds, A reaches B's memory through the window's key.

/// The key after `k` with the next 8-bit tag (`ibv_inc_rkey`).
fn next_tag(k: RKey) -> RKey {
    RKey((k.0 & !0xff) | (k.0.wrapping_add(1) & 0xff))
}

/// A region of B's buffer that windows may be bound to, with `access` besides `MW_BIND`.
fn bindable(p: &mut Pair, access: Access) -> MemoryRegion {
    let (pd, base) = (p.hosts[B].pd, p.hosts[B].mr.addr);
    p.net[B].dev.reg_mr(pd, base, BUF, access | Access::MW_BIND).unwrap()
}

/// B binds window `mw` (key `rkey`) to `len` bytes at `offset` of `mr` with `access`, on its
/// QP; returns the bind's completion status.
fn bind(
    p: &mut Pair,
    mw: MwHandle,
    rkey: RKey,
    mr: &MemoryRegion,
    span: (u64, u64),
    access: Access,
) -> WcStatus {
    let mut wr = SendWr::new(50, WrOpcode::BindMw, vec![]);
    let (offset, length) = span;
    wr.bind =
        Some(Box::new(MwBind { mw, rkey, mr: mr.lkey, addr: mr.addr + offset, length, access }));
    p.post_send(B, wr);
    p.run(Duration::from_millis(5));
    let wcs = p.cq(B);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!(wcs[0].opcode, WcOpcode::BindMw);
    wcs[0].status
}

/// A's RDMA WRITE of 8 bytes at `offset` of B's buffer through `rkey`: its status.
fn write_through(p: &mut Pair, rkey: RKey, offset: u64) -> WcStatus {
    let mut wr = write_wr(p, 60, 0, offset, 8);
    wr.remote = Some(RemoteAddr { addr: p.hosts[B].mr.addr + offset, rkey });
    p.post_send(A, wr);
    p.run(Duration::from_millis(20));
    let wcs = p.cq(A);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    wcs[0].status
}

#[test]
fn a_type_1_window_opens_its_range_and_nothing_else() {
    // Not yet bound: the key reaches nothing.
    let mut p = Pair::new(Mtu::Mtu1024);
    let pd = p.hosts[B].pd;
    let (_, k0) = p.net[B].dev.alloc_mw(pd, MwType::Type1).unwrap();
    assert_eq!(write_through(&mut p, k0, 0x100), WcStatus::REM_ACCESS_ERR);

    let mut p = Pair::new(Mtu::Mtu1024);
    let mr = bindable(&mut p, Access::LOCAL_WRITE);
    let pd = p.hosts[B].pd;
    let (mw, k0) = p.net[B].dev.alloc_mw(pd, MwType::Type1).unwrap();
    let k1 = next_tag(k0);
    assert_eq!(
        bind(&mut p, mw, k1, &mr, (0x1000, 0x1000), Access::REMOTE_WRITE),
        WcStatus::SUCCESS
    );
    assert_eq!(p.net[B].dev.mw_rkey(mw), Some(k1));
    let data = fill(&mut p, A, 0, 8, 9);
    assert_eq!(write_through(&mut p, k1, 0x1ff8), WcStatus::SUCCESS, "inside the window");
    assert_eq!(p.mem(B, 0x1ff8, 8), &data[..]);
    // Four bytes past the window, though inside the region: refused.
    assert_eq!(write_through(&mut p, k1, 0x1ffc), WcStatus::REM_ACCESS_ERR);
}

#[test]
fn a_window_refuses_rights_it_was_not_given_and_stale_keys() {
    // Bound for READ only: a WRITE through it is a remote access error.
    let mut p = Pair::new(Mtu::Mtu1024);
    let mr = bindable(&mut p, Access::LOCAL_WRITE);
    let pd = p.hosts[B].pd;
    let (mw, k0) = p.net[B].dev.alloc_mw(pd, MwType::Type1).unwrap();
    assert_eq!(
        bind(&mut p, mw, next_tag(k0), &mr, (0, 0x1000), Access::REMOTE_READ),
        WcStatus::SUCCESS
    );
    assert_eq!(write_through(&mut p, next_tag(k0), 0), WcStatus::REM_ACCESS_ERR);

    // A rebind gives a new key: the old one stops working.
    let mut p = Pair::new(Mtu::Mtu1024);
    let mr = bindable(&mut p, Access::LOCAL_WRITE);
    let pd = p.hosts[B].pd;
    let (mw, k0) = p.net[B].dev.alloc_mw(pd, MwType::Type1).unwrap();
    let (k1, k2) = (next_tag(k0), next_tag(next_tag(k0)));
    let rw = Access::REMOTE_WRITE;
    assert_eq!(bind(&mut p, mw, k1, &mr, (0, 0x1000), rw), WcStatus::SUCCESS);
    assert_eq!(bind(&mut p, mw, k2, &mr, (0, 0x1000), rw), WcStatus::SUCCESS);
    assert_eq!(write_through(&mut p, k2, 0), WcStatus::SUCCESS);
    assert_eq!(write_through(&mut p, k1, 0), WcStatus::REM_ACCESS_ERR, "the key before the rebind");
}

#[test]
fn binds_that_break_a_rule_end_in_mw_bind_err() {
    type Case = (&'static str, Access, MwType, (u64, u64), Access);
    let cases: [Case; 4] = [
        // C10-73: the region must allow binding.
        ("region without MW_BIND", Access::NONE, MwType::Type1, (0, 64), Access::REMOTE_READ),
        // C10-74: a writable window needs local write on the region.
        ("writable over read-only", Access::MW_BIND, MwType::Type1, (0, 64), Access::REMOTE_WRITE),
        // C10-75: inside the region.
        (
            "past the region",
            Access::MW_BIND | Access::LOCAL_WRITE,
            MwType::Type1,
            (BUF - 8, 64),
            Access::REMOTE_READ,
        ),
        // o10-37.2.40: a type 2 window is never bound to nothing.
        ("type 2 of length 0", Access::MW_BIND, MwType::Type2, (0, 0), Access::REMOTE_READ),
    ];
    for (what, mr_access, kind, span, rights) in cases {
        let mut p = Pair::new(Mtu::Mtu1024);
        let (pd, base) = (p.hosts[B].pd, p.hosts[B].mr.addr);
        let mr = p.net[B].dev.reg_mr(pd, base, BUF, mr_access).unwrap();
        let (mw, k0) = p.net[B].dev.alloc_mw(pd, kind).unwrap();
        let status = bind(&mut p, mw, next_tag(k0), &mr, span, rights);
        assert_eq!(status, WcStatus::MW_BIND_ERR, "{what}");
        assert_eq!(p.net[B].dev.counters().mw_bind_errors, 1, "{what}");
        assert_eq!(p.net[B].dev.mw_rkey(mw), Some(k0), "{what}: the key did not change");
    }
}

#[test]
fn a_type_2_window_is_invalidated_by_the_peer_and_then_refuses_access() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let mr = bindable(&mut p, Access::LOCAL_WRITE);
    let pd = p.hosts[B].pd;
    let (mw, k0) = p.net[B].dev.alloc_mw(pd, MwType::Type2).unwrap();
    let k1 = next_tag(k0);
    assert_eq!(bind(&mut p, mw, k1, &mr, (0, 0x1000), Access::REMOTE_WRITE), WcStatus::SUCCESS);
    assert_eq!(write_through(&mut p, k1, 0x10), WcStatus::SUCCESS);
    // A bound type 2 window cannot be bound again before it is invalidated (o10-37.2.30).
    let k2 = next_tag(k1);
    assert_eq!(bind(&mut p, mw, k2, &mr, (0, 0x1000), Access::REMOTE_WRITE), WcStatus::MW_BIND_ERR);

    let mut p = Pair::new(Mtu::Mtu1024);
    let mr = bindable(&mut p, Access::LOCAL_WRITE);
    let pd = p.hosts[B].pd;
    let (mw, k0) = p.net[B].dev.alloc_mw(pd, MwType::Type2).unwrap();
    let k1 = next_tag(k0);
    assert_eq!(bind(&mut p, mw, k1, &mr, (0, 0x1000), Access::REMOTE_WRITE), WcStatus::SUCCESS);
    p.post_recv(B, 7, 0x8_0000, 64);
    let mut inv = SendWr::new(8, WrOpcode::SendWithInv, vec![p.sge(A, 0, 16)]);
    inv.invalidate_rkey = Some(k1);
    p.post_send(A, inv);
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(A)), [(8, WcStatus::SUCCESS)]);
    let recv = p.cq(B);
    assert_eq!((recv[0].status, recv[0].byte_len), (WcStatus::SUCCESS, 16));
    assert_eq!(recv[0].invalidated_rkey, Some(k1), "IBV_WC_WITH_INV and the key");
    assert!(p.log().iter().any(|l| l.2 == Opcode::RC_SEND_ONLY_WITH_INVALIDATE));
    assert_eq!(write_through(&mut p, k1, 0x10), WcStatus::REM_ACCESS_ERR, "invalidated");
}

#[test]
fn a_type_2_window_is_rebound_after_a_local_invalidate() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let mr = bindable(&mut p, Access::LOCAL_WRITE);
    let pd = p.hosts[B].pd;
    let (mw, k0) = p.net[B].dev.alloc_mw(pd, MwType::Type2).unwrap();
    let (k1, k2) = (next_tag(k0), next_tag(next_tag(k0)));
    let rw = Access::REMOTE_WRITE;
    assert_eq!(bind(&mut p, mw, k1, &mr, (0, 0x1000), rw), WcStatus::SUCCESS);
    let mut inv = SendWr::new(51, WrOpcode::LocalInv, vec![]);
    inv.invalidate_rkey = Some(k1);
    p.post_send(B, inv);
    p.run(Duration::from_millis(5));
    let wcs = p.cq(B);
    assert_eq!((wcs[0].opcode, wcs[0].status), (WcOpcode::LocalInv, WcStatus::SUCCESS));
    assert_eq!(bind(&mut p, mw, k2, &mr, (0x2000, 0x1000), rw), WcStatus::SUCCESS);
    assert_eq!(write_through(&mut p, k2, 0x2000), WcStatus::SUCCESS);
}

#[test]
fn invalidating_what_cannot_be_invalidated_fails() {
    // A type 1 window cannot be invalidated (o10-37.2.26): locally, MW_BIND_ERR here.
    let mut p = Pair::new(Mtu::Mtu1024);
    let mr = bindable(&mut p, Access::LOCAL_WRITE);
    let pd = p.hosts[B].pd;
    let (mw, k0) = p.net[B].dev.alloc_mw(pd, MwType::Type1).unwrap();
    assert_eq!(
        bind(&mut p, mw, next_tag(k0), &mr, (0, 64), Access::REMOTE_READ),
        WcStatus::SUCCESS
    );
    let mut inv = SendWr::new(51, WrOpcode::LocalInv, vec![]);
    inv.invalidate_rkey = Some(next_tag(k0));
    p.post_send(B, inv);
    p.run(Duration::from_millis(5));
    assert_eq!(statuses(&p.cq(B)), [(51, WcStatus::MW_BIND_ERR)]);

    // By the peer, a region's key: an invalid request on both sides, nothing invalidated.
    let mut p = Pair::new(Mtu::Mtu1024);
    p.post_recv(B, 7, 0x8_0000, 64);
    let mut inv = SendWr::new(8, WrOpcode::SendWithInv, vec![p.sge(A, 0, 16)]);
    inv.invalidate_rkey = Some(p.hosts[B].mr.rkey);
    p.post_send(A, inv);
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(A)), [(8, WcStatus::REM_INV_REQ_ERR)]);
    assert_eq!(statuses(&p.cq(B)), [(7, WcStatus::REM_INV_REQ_ERR)]);
    assert_eq!(p.net[B].dev.counters().invalidate_errors, 1);
}

/// A region whose keys name other addresses than its bytes' (`ibv_reg_mr_iova`; zero-based,
/// as device memory is): every access is translated, locally and remotely, and bounded by
/// the key space.
#[test]
fn a_zero_based_region_is_reached_at_offsets_from_zero() {
    let mut p = Pair::new(Mtu::Mtu1024);
    let (pd, base) = (p.hosts[B].pd, p.hosts[B].mr.addr);
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let zb = p.net[B].dev.reg_mr_at(pd, 0, base + 0x4000, 0x1000, access).unwrap();
    let data = fill(&mut p, A, 0, 64, 5);
    let mut wr = write_wr(&p, 1, 0, 0, 64);
    wr.remote = Some(RemoteAddr { addr: 0x10, rkey: zb.rkey });
    p.post_send(A, wr);
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(A)), [(1, WcStatus::SUCCESS)]);
    assert_eq!(p.mem(B, 0x4010, 64), &data[..], "offset 0x10 of the region");
    // READ it back through the same key into A's buffer at 0x800.
    let mut rd = read_wr(&p, 2, 0x800, 0, 64);
    rd.remote = Some(RemoteAddr { addr: 0x10, rkey: zb.rkey });
    p.post_send(A, rd);
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(A)), [(2, WcStatus::SUCCESS)]);
    assert_eq!(p.mem(A, 0x800, 64), &data[..]);
    // B sends from the region by its local key at offset 0x10.
    p.post_recv(A, 3, 0x2000, 64);
    let sge = Sge { addr: 0x10, length: 64, lkey: zb.lkey };
    p.post_send(B, SendWr::new(4, WrOpcode::Send, vec![sge]));
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(B)), [(4, WcStatus::SUCCESS)]);
    assert_eq!(statuses(&p.cq(A)), [(3, WcStatus::SUCCESS)]);
    assert_eq!(p.mem(A, 0x2000, 64), &data[..]);
    // The key space ends at the region's length.
    let mut past = write_wr(&p, 5, 0, 0, 8);
    past.remote = Some(RemoteAddr { addr: 0xffc, rkey: zb.rkey });
    p.post_send(A, past);
    p.run(Duration::from_millis(10));
    assert_eq!(statuses(&p.cq(A)), [(5, WcStatus::REM_ACCESS_ERR)]);
}

/// A TM-SRQ at B and a QP of A connected to a QP of B that takes from it; A's own QP keeps a
/// receive queue (a rendezvous's FIN arrives there).
struct TmPair {
    p: Pair,
    srq: SrqHandle,
    a: Qpn,
}

fn tm_pair() -> TmPair {
    use uroce_engine::tm::{MAX_NUM_TAGS, MAX_OPS};
    let mut p = Pair::new(Mtu::Mtu1024);
    let (ip_a, ip_b) = (p.net[A].dev.addr(), p.net[B].dev.addr());
    let (pd_b, cq_b) = (p.hosts[B].pd, p.hosts[B].cq);
    let srq = p.net[B].dev.create_tm_srq(pd_b, cq_b, 16, 1, MAX_NUM_TAGS, MAX_OPS).unwrap();
    let mut make = |i: usize, srq: Option<SrqHandle>| {
        let (h, dev) = (p.hosts[i], &mut p.net[i].dev);
        dev.create_qp(QpInitAttr {
            srq,
            sq_sig_all: true,
            ..QpInitAttr::new(QpType::Rc, h.pd, h.cq)
        })
        .unwrap()
    };
    let (a, b) = (make(A, None), make(B, Some(srq)));
    // Tag matching is an RC offload.
    let (pd, cq) = (p.hosts[B].pd, p.hosts[B].cq);
    let uc = QpInitAttr { srq: Some(srq), ..QpInitAttr::new(QpType::Uc, pd, cq) };
    assert_eq!(p.net[B].dev.create_qp(uc), Err(CreateError::TmSrqNeedsRc));
    connect_rc(&mut p.net[A].dev, a, ip_b, b);
    connect_rc(&mut p.net[B].dev, b, ip_a, a);
    TmPair { p, srq, a }
}

impl TmPair {
    fn ops(&mut self, ops: &[tm::TagOp]) -> Vec<Option<u32>> {
        ops.iter().map(|op| self.p.net[B].dev.post_srq_op(self.srq, op).unwrap()).collect()
    }

    /// Adds a signaled tag whose buffer is `len` bytes at `offset` of B's region.
    fn add(&mut self, tag: u64, offset: u64, len: u32) -> u32 {
        let kind = tm::TagOpKind::Add {
            recv_wr_id: tag,
            sg_list: vec![self.p.sge(B, offset, len)],
            tag,
            mask: u64::MAX,
        };
        let op =
            tm::TagOp { wr_id: 1000 + tag, kind, signaled: true, sync: false, unexpected_cnt: 0 };
        self.ops(&[op])[0].unwrap()
    }

    /// A SEND from A of a TMH (`op`, `tag`, context 7) then `body`, from `offset` of A's region.
    fn send(&mut self, wr_id: u64, op: u8, tag: u64, body: &[u8], offset: u64) {
        let mut msg = vec![op, 0, 0, 0, 0, 0, 0, 7];
        msg.extend_from_slice(&tag.to_be_bytes());
        msg.extend_from_slice(body);
        self.p.mem(A, offset, msg.len()).copy_from_slice(&msg);
        let sge = self.p.sge(A, offset, msg.len() as u32);
        self.p.net[A].dev.post_send(self.a, SendWr::new(wr_id, WrOpcode::Send, vec![sge])).unwrap();
        self.p.run(Duration::from_millis(1));
    }

    fn post_plain(&mut self, wr_id: u64, offset: u64) {
        let sg_list = [self.p.sge(B, offset, 4096)].into();
        self.p.net[B].dev.post_srq_recv(self.srq, RecvWr { wr_id, sg_list }).unwrap();
    }
}

/// (wr_id, status, opcode, byte_len, tag, flags) of each completion.
type TmSeen = (u64, WcStatus, WcOpcode, u32, u64, TmFlags);

fn tm_seen(wcs: &[WorkCompletion]) -> Vec<TmSeen> {
    wcs.iter()
        .map(|w| {
            let tm = w.tm.unwrap_or_default();
            (w.wr_id, w.status, w.opcode, w.byte_len, tm.tag, tm.flags)
        })
        .collect()
}

#[test]
fn a_tm_srq_matches_eager_messages_by_tag_and_keeps_order_with_unexpected_ones() {
    let mut t = tm_pair();
    let (match_all, none) = (TmFlags::MATCH | TmFlags::DATA_VALID, TmFlags::NONE);
    for (k, offset) in [(100, 0x1_0000), (101, 0x1_1000), (102, 0x1_2000)] {
        t.post_plain(k, offset);
    }
    let h1 = t.add(1, 0x2_0000, 256);
    let h2 = t.add(2, 0x2_1000, 256);
    assert_ne!(h1, h2);
    let added = tm_seen(&t.p.cq(B));
    assert_eq!(
        added,
        [(1001, WcStatus::SUCCESS, WcOpcode::TmAdd, 0, 0, none); 1]
            .into_iter()
            .chain([(1002, WcStatus::SUCCESS, WcOpcode::TmAdd, 0, 0, none)])
            .collect::<Vec<_>>()
    );

    // Tag 2 is matched although tag 1 was posted first: the payload lands in its buffer
    // without the TMH.
    let body: Vec<u8> = (0..48).collect();
    t.send(1, tm::tmh_op::EAGER, 2, &body, 0);
    assert_eq!(tm_seen(&t.p.cq(B)), [(2, WcStatus::SUCCESS, WcOpcode::TmRecv, 48, 2, match_all)]);
    assert_eq!(t.p.mem(B, 0x2_1000, 48), &body[..]);
    // NO_TAG goes whole to an SRQ buffer, uncounted.
    t.send(2, tm::tmh_op::NO_TAG, 0, &body, 0);
    assert_eq!(tm_seen(&t.p.cq(B)), [(100, WcStatus::SUCCESS, WcOpcode::TmNoTag, 64, 0, none)]);
    // A tag nobody posted is unexpected: whole, to an SRQ buffer, no match flags.
    t.send(3, tm::tmh_op::EAGER, 9, &body, 0);
    assert_eq!(tm_seen(&t.p.cq(B)), [(101, WcStatus::SUCCESS, WcOpcode::TmRecv, 64, 0, none)]);
    assert_eq!(t.p.mem(B, 0x1_1000 + 16, 48), &body[..]);
    assert_eq!(t.p.mem(B, 0x1_1000 + 8, 8), 9u64.to_be_bytes());
    // Until software reports that it saw it, tag 1 is not matched either: software must match
    // the unexpected message first (MPI's order).
    t.send(4, tm::tmh_op::EAGER, 1, &body, 0);
    assert_eq!(tm_seen(&t.p.cq(B)), [(102, WcStatus::SUCCESS, WcOpcode::TmRecv, 64, 0, none)]);
    // A stale count leaves matching off and says so; the right one turns it back on.
    let sync = |cnt| tm::TagOp {
        wr_id: 7,
        kind: tm::TagOpKind::Sync,
        signaled: true,
        sync: true,
        unexpected_cnt: cnt,
    };
    t.ops(&[sync(1)]);
    assert_eq!(
        tm_seen(&t.p.cq(B)),
        [(7, WcStatus::SUCCESS, WcOpcode::TmSync, 0, 0, TmFlags::SYNC_REQ)]
    );
    t.ops(&[sync(2)]);
    assert_eq!(tm_seen(&t.p.cq(B)), [(7, WcStatus::SUCCESS, WcOpcode::TmSync, 0, 0, none)]);
    t.send(5, tm::tmh_op::EAGER, 1, &body[..10], 0);
    assert_eq!(tm_seen(&t.p.cq(B)), [(1, WcStatus::SUCCESS, WcOpcode::TmRecv, 10, 1, match_all)]);
    assert_eq!(t.p.cq(A).len(), 5, "every send completed");

    // A deleted tag is not matched; deleting it twice is refused at post.
    let h3 = t.add(3, 0x2_2000, 256);
    t.p.cq(B);
    let del = tm::TagOp {
        wr_id: 8,
        kind: tm::TagOpKind::Del { handle: h3 },
        signaled: true,
        sync: false,
        unexpected_cnt: 0,
    };
    t.ops(std::slice::from_ref(&del));
    assert_eq!(tm_seen(&t.p.cq(B)), [(8, WcStatus::SUCCESS, WcOpcode::TmDel, 0, 0, none)]);
    let again = t.p.net[B].dev.post_srq_op(t.srq, &del);
    assert_eq!(again, Err(tm::TagOpError::UnknownHandle(h3)));
    // Unsignaled operations complete nothing.
    let quiet = tm::TagOp {
        wr_id: 9,
        kind: tm::TagOpKind::Sync,
        signaled: false,
        sync: false,
        unexpected_cnt: 0,
    };
    t.ops(&[quiet]);
    assert!(t.p.cq(B).is_empty());
}

#[test]
fn a_matched_eager_message_of_several_packets_reports_the_match_then_the_data() {
    let mut t = tm_pair();
    t.add(5, 0x2_0000, 8192);
    t.p.cq(B);
    let body: Vec<u8> = (0..3000u32).map(|k| (k * 7) as u8).collect();
    t.send(1, tm::tmh_op::EAGER, 5, &body, 0);
    let tm = TmFlags::MATCH;
    assert_eq!(
        tm_seen(&t.p.cq(B)),
        [
            (5, WcStatus::SUCCESS, WcOpcode::TmRecv, 0, 5, tm),
            (5, WcStatus::SUCCESS, WcOpcode::TmRecv, 3000, 0, TmFlags::DATA_VALID),
        ]
    );
    assert_eq!(t.p.mem(B, 0x2_0000, 3000), &body[..]);
}

/// The RVH of a rendezvous request for `len` bytes at `offset` of A's region.
fn rvh(p: &Pair, offset: u64, len: u32) -> Vec<u8> {
    let remote = p.remote(A, offset);
    let mut rvh = remote.addr.to_be_bytes().to_vec();
    rvh.extend_from_slice(&remote.rkey.0.to_be_bytes());
    rvh.extend_from_slice(&len.to_be_bytes());
    rvh
}

#[test]
fn a_matched_rendezvous_request_is_read_by_the_device_which_then_sends_the_fin() {
    let mut t = tm_pair();
    t.add(6, 0x2_0000, 8192);
    t.p.cq(B);
    let data = fill(&mut t.p, A, 0x8000, 5000, 3);
    // The FIN comes back to A's receive queue.
    let sge = t.p.sge(A, 0x4000, 64);
    let a = t.a;
    t.p.net[A].dev.post_recv(a, RecvWr { wr_id: 77, sg_list: vec![sge].into() }).unwrap();
    let request = rvh(&t.p, 0x8000, 5000);
    t.send(1, tm::tmh_op::RNDV, 6, &request, 0);
    t.p.run(Duration::from_millis(5));
    assert_eq!(
        tm_seen(&t.p.cq(B)),
        [
            (6, WcStatus::SUCCESS, WcOpcode::TmRecv, 0, 6, TmFlags::MATCH),
            (6, WcStatus::SUCCESS, WcOpcode::TmRecv, 5000, 0, TmFlags::DATA_VALID),
        ]
    );
    assert_eq!(t.p.mem(B, 0x2_0000, 5000), &data[..]);
    // A: its SEND's completion and the FIN: the request's TMH and RVH with the FIN opcode.
    let got: Vec<(u64, WcOpcode, u32)> =
        t.p.cq(A).iter().map(|w| (w.wr_id, w.opcode, w.byte_len)).collect();
    assert_eq!(got, [(1, WcOpcode::Send, 32), (77, WcOpcode::Recv, 32)]);
    let mut fin = vec![tm::tmh_op::FIN, 0, 0, 0, 0, 0, 0, 7];
    fin.extend_from_slice(&6u64.to_be_bytes());
    fin.extend_from_slice(&request);
    assert_eq!(t.p.mem(A, 0x4000, 32), &fin[..]);
    // The device's own READ and SEND never complete on A's or B's send CQ: B saw only the two.
    let reads =
        t.p.log().iter().filter(|l| l.1 == B && l.2 == Opcode::RC_RDMA_READ_REQUEST).count();
    assert_eq!(reads, 1);
}

#[test]
fn a_rendezvous_too_large_for_the_tag_leaves_its_headers_there_for_software() {
    let mut t = tm_pair();
    t.add(6, 0x2_0000, 100);
    t.p.cq(B);
    let request = rvh(&t.p, 0x8000, 5000);
    t.send(1, tm::tmh_op::RNDV, 6, &request, 0);
    assert_eq!(
        tm_seen(&t.p.cq(B)),
        [(6, WcStatus::TM_RNDV_INCOMPLETE, WcOpcode::TmRecv, 32, 6, TmFlags::MATCH)]
    );
    assert_eq!(t.p.mem(B, 0x2_0000 + 16, 16), &request[..]);
    // No READ was issued; the tag is free again.
    assert!(!t.p.log().iter().any(|l| l.2 == Opcode::RC_RDMA_READ_REQUEST));
    assert_eq!(t.add(7, 0x2_1000, 100), 0);
}

#[test]
fn a_responder_destroyed_after_its_last_ack_was_lost_still_lets_the_sender_complete() {
    let mut p = Pair::new(Mtu::Mtu1024);
    p.post_recv(B, 1, 0, 64);
    // The ACK of the SEND is lost (the first ACK B sends).
    let mut acks = 0;
    p.set_filter(Box::new(move |from, packet| {
        if from == B && packet.bth.opcode == Opcode::RC_ACKNOWLEDGE {
            acks += 1;
            return acks > 1;
        }
        true
    }));
    p.post_send(A, SendWr::new(7, WrOpcode::Send, vec![p.sge(A, 0, 64)]));
    // B takes the message, and at once destroys its QP (as a program that exits does).
    p.run(Duration::from_micros(20));
    assert_eq!(statuses(&p.cq(B)), [(1, WcStatus::SUCCESS)]);
    let qp_b = p.hosts[B].qp;
    assert!(p.net[B].dev.destroy_qp(qp_b));
    p.run(Duration::from_millis(500));
    // The farewell copies of the ACK reached A: its SEND completed, no retry ran out.
    assert_eq!(statuses(&p.cq(A)), [(7, WcStatus::SUCCESS)]);
    let farewells = p.log().iter().filter(|l| l.1 == B && l.2 == Opcode::RC_ACKNOWLEDGE).count();
    assert_eq!(farewells, 3, "the lost ACK and its two farewell copies");
}

#[test]
fn farewell_acks_leave_as_datagrams_of_their_own() {
    let mut p = Pair::new(Mtu::Mtu1024);
    p.post_recv(B, 1, 0, 64);
    p.post_send(A, SendWr::new(7, WrOpcode::Send, vec![p.sge(A, 0, 64)]));
    p.run(Duration::from_micros(20));
    let qp_b = p.hosts[B].qp;
    assert!(p.net[B].dev.destroy_qp(qp_b));
    // Segmented into one send with its neighbours, a copy would share their fate on the way
    // (a UDP GSO buffer is dropped whole): each is marked to go alone.
    let now = p.now();
    let mut buf = Vec::new();
    let mut alone = Vec::new();
    while let Some(tx) = p.net[B].dev.poll_transmit(now, &mut buf) {
        alone.push(tx.alone);
    }
    assert_eq!(alone, [true, true]);
}

/// In gather mode a payload stays in registered memory, for the runtime to send from there
/// with scatter/gather I/O, only when it is long enough to be worth an I/O vector element of
/// its own: a small one is copied into its packet, which then comes whole.
#[test]
fn gather_mode_leaves_long_payloads_in_memory_and_copies_short_ones() {
    let mut p = Pair::new(Mtu::Mtu4096);
    let mut gathered = Vec::new();
    for (wr_id, len) in [(1u64, 64usize), (2, 252), (3, 256), (4, 4096)] {
        let data = fill(&mut p, A, 0, len, wr_id as u8);
        let sge = p.sge(A, 0, len as u32);
        p.post_send(A, SendWr::new(wr_id, WrOpcode::Send, vec![sge]));
        let (mut buf, mut pieces) = (Vec::new(), Vec::new());
        let tx = p.net[A].dev.poll_transmit_gather(Instant::ZERO, &mut buf, &mut pieces).unwrap();
        match tx.payload_at {
            // BTH, payload (a multiple of four bytes: no pad), ICRC.
            None => assert_eq!(&buf[buf.len() - 4 - len..buf.len() - 4], &data[..], "{len}"),
            Some(_) => assert_eq!(pieces.iter().map(|&(_, l)| l as usize).sum::<usize>(), len),
        }
        gathered.push((len, tx.payload_at.is_some()));
    }
    assert_eq!(gathered, [(64, false), (252, false), (256, true), (4096, true)]);
}

/// The requester's loss-driven window: none of its own until the first loss, which cuts the
/// device's limit (256 packets) to 7/10; then each window of packets acknowledged grows it by
/// eight (a random drop on a datacenter path is rarely congestion, and go-back-N already
/// pays for it: growing by one per window left a 1 %-lossy path at under a third of its
/// window).
#[test]
fn a_loss_cuts_the_window_to_seven_tenths_and_each_window_acknowledged_grows_it_by_eight() {
    let window = |p: &Pair| p.net[A].dev.qp_infos()[0].window;
    let mut p = write_20_packets(drop_once(|from, _| from == A), Duration::from_millis(50));
    assert_eq!(window(&p), 256 * 7 / 10);
    // One more window's worth (179 packets of 256 bytes), without loss.
    let len = 256 * 179;
    let data = fill(&mut p, A, 0, len, 9);
    p.post_send(A, write_wr(&p, 2, 0, 0, len as u32));
    p.run(Duration::from_millis(50));
    assert_eq!(statuses(&p.cq(A)), [(2, WcStatus::SUCCESS)]);
    assert_eq!(p.mem(B, 0, len), &data[..]);
    let grown = window(&p) - 256 * 7 / 10;
    assert!((7..=9).contains(&grown), "grew by {grown}");
}
