//! The engine alone, no sockets: two devices back to back, packets handed across in memory.
//! Reports packets per second (requests and responses, both directions, on one core) for 64 B
//! SENDs and 4 KiB RDMA WRITEs going requester → responder → ACK → completer, and the time
//! of one ping-pong message (a 64 B SEND posted, carried across with its ACK if any, both
//! completions polled, the receive posted again) over RC and UD: the engine's share of what a
//! ping-pong's side spends between a datagram's arrival and its reply's send (here with the
//! ICRC computed and checked by the engine, which the socket runtime leaves to its send, and
//! the test memory, `VecMemory`, for registered memory).
//!
//! `cargo bench -p uroce-engine --bench engine`
#![allow(clippy::unwrap_used, reason = "benchmark code: a panic is a failure")]
#![allow(clippy::cast_possible_truncation, reason = "small benchmark sizes")]

use std::hint::black_box;
use std::net::SocketAddr;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use uroce_engine::*;

const BATCH: usize = 512;

struct Side {
    dev: Device<VecMemory>,
    cq: CqHandle,
    qp: Qpn,
    mr: MemoryRegion,
}

/// A device with one QP of `qp_type`, its CQ and a registered megabyte at `base`.
fn side(addr: &str, seed: u64, base: u64, qp_type: QpType) -> Side {
    let mut mem = VecMemory::new();
    mem.insert(base, vec![0; 1 << 20]);
    let mut dev = Device::new(DeviceConfig::new(addr.parse().unwrap(), seed), mem);
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(4 * BATCH).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = dev.reg_mr(pd, base, 1 << 20, all).unwrap();
    let cap = QpCap { max_send_wr: BATCH as u32, max_recv_wr: BATCH as u32, ..QpCap::default() };
    let init = QpInitAttr {
        qp_type,
        pd,
        send_cq: cq,
        recv_cq: cq,
        cap,
        sq_sig_all: true,
        srq: None,
        xrcd: None,
    };
    let qp = dev.create_qp(init).unwrap();
    Side { dev, cq, qp, mr }
}

fn connect(mtu: Mtu) -> [Side; 2] {
    let mut s =
        [side("127.0.0.2", 1, 0x10_0000, QpType::Rc), side("127.0.0.3", 2, 0x20_0000, QpType::Rc)];
    let (qpns, addrs) = ([s[0].qp, s[1].qp], [s[0].dev.addr(), s[1].dev.addr()]);
    for (i, h) in s.iter_mut().enumerate() {
        let access = Access::REMOTE_WRITE | Access::REMOTE_READ;
        h.dev.init_qp(h.qp, access, QKey(0)).unwrap();
        let path = PathAttr {
            dest: addrs[1 - i],
            dest_qpn: qpns[1 - i],
            mtu,
            sq_psn: Psn::ZERO,
            rq_psn: Psn::ZERO,
        };
        let reliability = Reliability {
            min_rnr_timer: RnrTimer::from_masked(1),
            max_rd_atomic: 4,
            max_dest_rd_atomic: 4,
            ..Reliability::default()
        };
        h.dev.connect_qp(h.qp, &path, &reliability).unwrap();
    }
    s
}

/// Posts a batch of `len`-byte operations from side 0 and moves packets until all complete.
/// Returns the packets that crossed.
fn batch(
    s: &mut [Side; 2],
    op: WrOpcode,
    len: u32,
    buf: &mut Vec<u8>,
    wcs: &mut Vec<WorkCompletion>,
) -> u64 {
    let now = Instant::ZERO;
    for k in 0..BATCH {
        if op == WrOpcode::Send {
            let sge = Sge { addr: s[1].mr.addr, length: len, lkey: s[1].mr.lkey };
            s[1].dev.post_recv(s[1].qp, RecvWr { wr_id: k as u64, sg_list: [sge].into() }).unwrap();
        }
        let sge = Sge { addr: s[0].mr.addr, length: len, lkey: s[0].mr.lkey };
        let mut wr = SendWr::new(k as u64, op, [sge]);
        wr.remote = Some(RemoteAddr { addr: s[1].mr.addr, rkey: s[1].mr.rkey });
        s[0].dev.post_send(s[0].qp, wr).unwrap();
    }
    let mut packets = 0;
    let mut done = 0;
    while done < BATCH {
        for from in 0..2 {
            let src_ip = s[from].dev.addr();
            while let Some(tx) = s[from].dev.poll_transmit(now, buf) {
                packets += 1;
                let src = SocketAddr::new(src_ip, tx.src_port);
                s[1 - from].dev.handle_datagram(
                    now,
                    &RxInfo::new(src, s[1 - from].dev.addr()),
                    buf,
                );
            }
        }
        wcs.clear();
        s[1].dev.poll_cq(s[1].cq, usize::MAX, wcs);
        wcs.clear();
        done += s[0].dev.poll_cq(s[0].cq, usize::MAX, wcs);
    }
    packets
}

/// A UD QP on each side, in RTS, each with an address handle to the other.
fn ud_pair() -> ([Side; 2], [AhHandle; 2]) {
    let mut s =
        [side("127.0.0.2", 1, 0x10_0000, QpType::Ud), side("127.0.0.3", 2, 0x20_0000, QpType::Ud)];
    let addrs = [s[0].dev.addr(), s[1].dev.addr()];
    let mut ahs = Vec::new();
    for (i, h) in s.iter_mut().enumerate() {
        let pd = h.mr.pd;
        h.dev.init_qp(h.qp, Access::NONE, QKey(7)).unwrap();
        h.dev.ready_datagram_qp(h.qp, Psn::ZERO).unwrap();
        ahs.push(h.dev.create_ah(pd, AhAttr::new(addrs[1 - i])).unwrap());
    }
    (s, ahs.try_into().unwrap())
}

/// Posts receive `wr_id`: 256 bytes (room for a UD message's GRH) at 64 KiB.
fn post_recv(s: &mut Side, wr_id: u64) {
    let sge = Sge { addr: s.mr.addr + 0x1_0000, length: 256, lkey: s.mr.lkey };
    s.dev.post_recv(s.qp, RecvWr { wr_id, sg_list: [sge].into() }).unwrap();
}

/// One ping-pong message of 64 bytes from side `from` (to a UD peer through `ah`) at `now`:
/// posted, carried across (an RC SEND's ACK back), both sides' completions polled, the
/// receive it took posted again. Returns the completions polled.
fn hop(
    s: &mut [Side; 2],
    from: usize,
    ah: Option<AhHandle>,
    now: Instant,
    buf: &mut Vec<u8>,
    wcs: &mut Vec<WorkCompletion>,
) -> usize {
    let to = 1 - from;
    let sge = Sge { addr: s[from].mr.addr, length: 64, lkey: s[from].mr.lkey };
    let mut wr = SendWr::new(0, WrOpcode::Send, [sge]);
    wr.ud = ah.map(|ah| UdDest { ah, remote_qpn: s[to].qp, remote_qkey: QKey(7) });
    s[from].dev.post_send(s[from].qp, wr).unwrap();
    let mut moved = true;
    while moved {
        moved = false;
        for f in [from, to] {
            let src_ip = s[f].dev.addr();
            while let Some(tx) = s[f].dev.poll_transmit(now, buf) {
                moved = true;
                let rx = RxInfo::new(SocketAddr::new(src_ip, tx.src_port), s[1 - f].dev.addr());
                s[1 - f].dev.handle_datagram(now, &rx, buf);
            }
        }
    }
    wcs.clear();
    let mut polled = s[to].dev.poll_cq(s[to].cq, usize::MAX, wcs);
    for w in wcs.iter().filter(|w| w.opcode == WcOpcode::Recv) {
        post_recv(&mut s[to], w.wr_id);
    }
    wcs.clear();
    polled += s[from].dev.poll_cq(s[from].cq, usize::MAX, wcs);
    polled
}

fn bench(c: &mut Criterion) {
    for (name, op, len, mtu) in [
        ("send_64B", WrOpcode::Send, 64u32, Mtu::Mtu1024),
        ("write_4KiB", WrOpcode::RdmaWrite, 4096, Mtu::Mtu4096),
    ] {
        let mut s = connect(mtu);
        let (mut buf, mut wcs) = (Vec::new(), Vec::new());
        let per_batch = batch(&mut s, op, len, &mut buf, &mut wcs);
        let mut group = c.benchmark_group(format!("engine_{name}"));
        // Elements are packets: requests plus responses (ACKs), both directions.
        group.throughput(Throughput::Elements(per_batch));
        group.bench_function(format!("{BATCH}_messages_{per_batch}_packets"), |b| {
            b.iter(|| black_box(batch(&mut s, op, len, &mut buf, &mut wcs)));
        });
        group.finish();
    }
    let mut group = c.benchmark_group("engine_pingpong_64B");
    group.throughput(Throughput::Elements(1));
    let (rc, ud) = (connect(Mtu::Mtu1024), ud_pair());
    for (name, mut s, ahs) in [("rc", rc, None), ("ud", ud.0, Some(ud.1))] {
        let (mut buf, mut wcs) = (Vec::new(), Vec::new());
        for side in &mut s {
            post_recv(side, 0);
        }
        // Each side's send and the other's receive complete: two completions a message.
        let mut now = Instant::ZERO;
        assert_eq!(hop(&mut s, 0, ahs.map(|a| a[0]), now, &mut buf, &mut wcs), 2);
        let mut from = 1;
        group.bench_function(name, |b| {
            b.iter(|| {
                // Time moves as in a ping-pong (a few microseconds a message): an RC QP's
                // ACK deadline and probe move with it.
                now += Duration::from_micros(5);
                let ah = ahs.map(|a| a[from]);
                black_box(hop(&mut s, from, ah, now, &mut buf, &mut wcs));
                // A timer due (the QP's tail-loss probe entry, kept from an earlier message)
                // is handled as a runtime would.
                for side in s.iter_mut() {
                    if side.dev.poll_timeout().is_some_and(|t| t <= now) {
                        side.dev.handle_timeout(now);
                    }
                }
                from = 1 - from;
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
