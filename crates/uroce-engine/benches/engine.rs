//! The engine alone, no sockets: two devices back to back, packets handed across in memory.
//! Reports packets per second (requests and responses, both directions, on one core) for 64 B
//! SENDs and 4 KiB RDMA WRITEs going requester → responder → ACK → completer.
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

fn side(addr: &str, seed: u64, base: u64) -> Side {
    let mut mem = VecMemory::new();
    mem.insert(base, vec![0; 1 << 20]);
    let mut dev = Device::new(DeviceConfig::new(addr.parse().unwrap(), seed), mem);
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(4 * BATCH).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = dev.reg_mr(pd, base, 1 << 20, all).unwrap();
    let cap = QpCap { max_send_wr: BATCH as u32, max_recv_wr: BATCH as u32, ..QpCap::default() };
    let init = QpInitAttr {
        qp_type: QpType::Rc,
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
    let mut s = [side("127.0.0.2", 1, 0x10_0000), side("127.0.0.3", 2, 0x20_0000)];
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
            s[1].dev.post_recv(s[1].qp, RecvWr { wr_id: k as u64, sg_list: vec![sge] }).unwrap();
        }
        let sge = Sge { addr: s[0].mr.addr, length: len, lkey: s[0].mr.lkey };
        let mut wr = SendWr::new(k as u64, op, vec![sge]);
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
}

criterion_group!(benches, bench);
criterion_main!(benches);
