//! The shared-memory path under injected loss, and its capture: two devices of this host (so
//! every packet goes through shared memory), `loss=0.01` on both, RC SEND, WRITE and READ of
//! up to 4 MiB. RC recovers every byte; the capture of one side holds packets that `uroce
//! decode` verifies (every ICRC) and tshark decodes with nothing malformed.

#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use std::process::Command;
use std::time::Duration;

use uroce::{Access, Context, Faults, Mtu, Options, QpType, WcOpcode, WcStatus};
use uroce_testkit::{pattern, tshark_available, tshark_finds_nothing_malformed};

#[test]
fn shared_memory_with_one_percent_loss_recovers_and_its_capture_verifies() {
    let dir = std::env::temp_dir().join(format!("uroce-shm-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("shm.pcap");
    let faults = Faults::parse("loss=0.01").unwrap();
    let opts_a = Options { pcap: Some(file.clone()), faults, seed: Some(1), ..Options::default() };
    let opts_b = Options { faults, seed: Some(2), ..Options::default() };
    let a = Context::open_with("127.0.12.2".parse().unwrap(), opts_a).unwrap();
    let b = Context::open_with("127.0.12.3".parse().unwrap(), opts_b).unwrap();
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let qa = pa.qp(QpType::Rc, &ca).mtu(Mtu::Mtu4096).build().unwrap();
    let qb = pb.qp(QpType::Rc, &cb).mtu(Mtu::Mtu4096).build().unwrap();
    qa.connect(&qb.endpoint()).unwrap();
    qb.connect(&qa.endpoint()).unwrap();
    const BIG: usize = 4 << 20;
    let ma = pa.register(2 * BIG, Access::LOCAL_WRITE).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mb = pb.register(2 * BIG, all).unwrap();
    let wait = Some(Duration::from_secs(60));
    for (k, size) in [64usize, 4096, 100_000, BIG].into_iter().enumerate() {
        let data = pattern(k as u64, size);
        ma.write(0, &data).unwrap();
        qb.post_recv(1, &mb, BIG..2 * BIG).unwrap();
        qa.send(1, &ma, 0..size).unwrap();
        qa.write(2, &ma, 0..size, mb.remote()).unwrap();
        qa.read(3, &ma, BIG..BIG + size, mb.remote().at(0)).unwrap();
        for _ in 0..3 {
            assert_eq!(ca.wait_one(wait).unwrap().status, WcStatus::SUCCESS);
        }
        let wc = cb.wait_one(wait).unwrap();
        assert_eq!(
            (wc.status, wc.opcode, wc.byte_len as usize),
            (WcStatus::SUCCESS, WcOpcode::Recv, size)
        );
        assert!(mb.to_vec(BIG..BIG + size).unwrap() == data, "SEND of {size} B intact");
        assert!(mb.to_vec(0..size).unwrap() == data, "WRITE of {size} B intact");
        assert!(ma.to_vec(BIG..BIG + size).unwrap() == data, "READ of {size} B intact");
    }
    // Late copies (a tail probe's answer, a retransmission crossing its ACK) may still be on
    // their way: destroy both QPs and let the devices go quiet before counting, or a packet
    // captured after the count is one the count lacks.
    drop((qa, qb));
    let moved = |c: &Context| {
        let n = c.counters().1;
        n.shm_tx_packets + n.shm_rx_packets
    };
    let mut last = (moved(&a), moved(&b));
    for _ in 0..250 {
        #[expect(clippy::disallowed_methods, reason = "waits for another thread, bounded")]
        std::thread::sleep(Duration::from_millis(20));
        let now = (moved(&a), moved(&b));
        if now == last {
            break;
        }
        last = now;
    }
    let (engine, net) = a.counters();
    let (_, net_b) = b.counters();
    eprintln!("a: {net:?}\nretransmitted {}", engine.retransmitted_pkts);
    assert_eq!(net.tx_datagrams + net_b.tx_datagrams, 0, "nothing went through the kernel");
    assert!(net.shm_tx_packets > 1000 && net.shm_rx_packets > 0, "{net:?}");
    assert!(net.fault_drops + net_b.fault_drops > 0, "the loss dropped nothing");
    let (_, _) = (drop((ca, ma, pa)), drop(a));
    let out = Command::new(env!("CARGO_BIN_EXE_uroce")).arg("decode").arg(&file).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "uroce decode: {}", String::from_utf8_lossy(&out.stderr));
    let lines = text.lines().count() as u64;
    assert_eq!(lines, net.shm_tx_packets + net.shm_rx_packets, "one line per captured packet");
    assert!(text.lines().all(|l| l.contains("icrc=ok")), "every ICRC verifies");
    if tshark_available() {
        tshark_finds_nothing_malformed(&file);
    }
    drop(b);
    let _ = std::fs::remove_dir_all(dir);
}
