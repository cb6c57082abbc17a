//! Two processes, two devices (127.0.0.2 and 127.0.0.3), real RoCEv2 over loopback UDP.
//!
//! The test process is the client; it re-runs its own executable as the server (the
//! `server_role` test, which does nothing unless `UROCE_TEST_ROLE=server`). They swap endpoints
//! over TCP, then:
//! 1. one-sided, with a server that never polls anything: RC WRITE then READ back of every
//!    power of two from 1 B to 16 MiB, fetch-and-add and compare-and-swap chains;
//! 2. two-sided: RC SEND of the same sizes, echoed back by the server, compared byte for byte;
//! 3. UC SENDs and UD datagrams, whose digests the server reports: each arrived whole or not at
//!    all.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::cast_possible_truncation, reason = "test sizes are small")]

use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use uroce::{Access, Context, Cq, Endpoint, Mtu, QKey, QpType, WcStatus, WorkCompletion};
use uroce_testkit::pattern;

const ROLE: &str = "UROCE_TEST_ROLE";
const BIG: usize = 16 << 20;
const ATOMICS: usize = BIG;
const WAIT: Option<Duration> = Some(Duration::from_secs(30));

/// FNV-1a, for the digests the server reports.
fn digest(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

fn sizes() -> Vec<usize> {
    (0..=24).map(|k| 1usize << k).collect()
}

fn wait_ok(cq: &Cq) -> WorkCompletion {
    let wc = cq.wait_one(WAIT).unwrap();
    assert_eq!(wc.status, WcStatus::SUCCESS, "{wc:?}");
    wc
}

fn send_line(s: &mut TcpStream, line: &str) {
    s.write_all(line.as_bytes()).unwrap();
    s.write_all(b"\n").unwrap();
}

fn read_line(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    loop {
        s.read_exact(&mut b).unwrap();
        if b[0] == b'\n' {
            return String::from_utf8(out).unwrap();
        }
        out.push(b[0]);
    }
}

#[test]
fn server_role() {
    if std::env::var(ROLE).as_deref() != Ok("server") {
        return;
    }
    let port: u16 = std::env::var("UROCE_TEST_PORT").unwrap().parse().unwrap();
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let ctx = Context::open("127.0.0.3".parse().unwrap()).unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(4096).unwrap();
    let all =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let target = pd.register(BIG + 4096, all).unwrap();
    let rc = pd.qp(QpType::Rc, &cq).mtu(Mtu::Mtu4096).build().unwrap();
    let uc = pd.qp(QpType::Uc, &cq).mtu(Mtu::Mtu4096).build().unwrap();
    let ud = pd.qp(QpType::Ud, &cq).qkey(QKey(0x42)).build().unwrap();
    let peers: Vec<Endpoint> =
        [rc.endpoint().with_region(target.remote()), uc.endpoint(), ud.endpoint()]
            .iter()
            .map(|e| uroce::exchange(&mut tcp, e).unwrap())
            .collect();
    rc.connect(&peers[0]).unwrap();
    uc.connect(&peers[1]).unwrap();
    // Phase 1: the client works on our memory; we do not poll anything.
    assert_eq!(read_line(&mut tcp), "one-sided done");
    // Phase 2: echo every RC SEND back.
    let inbox = pd.register(BIG, Access::LOCAL_WRITE).unwrap();
    let n: usize = read_line(&mut tcp).parse().unwrap();
    for _ in 0..n {
        rc.post_recv(0, &inbox, 0..BIG).unwrap();
        let wc = loop {
            let wc = wait_ok(&cq);
            if wc.opcode == uroce::WcOpcode::Recv {
                break wc;
            }
        };
        rc.send(1, &inbox, 0..wc.byte_len as usize).unwrap();
    }
    // Phase 3: UC and UD receives; report what arrived.
    let slots = pd.register(64 * 65_536, Access::LOCAL_WRITE).unwrap();
    for k in 0..32 {
        uc.post_recv(k, &slots, k as usize * 65_536..(k as usize + 1) * 65_536).unwrap();
    }
    for k in 32..64 {
        ud.post_recv(k, &slots, k as usize * 65_536..k as usize * 65_536 + 40 + 4096).unwrap();
    }
    send_line(&mut tcp, "ready");
    assert_eq!(read_line(&mut tcp), "sent");
    // Everything that will arrive has arrived once 300 ms pass without a completion.
    let mut wcs = Vec::new();
    loop {
        let got = cq.wait(Some(Duration::from_millis(300))).unwrap();
        if got.is_empty() {
            break;
        }
        wcs.extend(got);
    }
    for wc in wcs.iter().filter(|w| w.opcode == uroce::WcOpcode::Recv) {
        let at = wc.wr_id as usize * 65_536;
        let (skip, len) =
            if wc.grh { (40, wc.byte_len as usize - 40) } else { (0, wc.byte_len as usize) };
        let bytes = slots.to_vec(at + skip..at + skip + len).unwrap();
        let imm = wc.imm.map_or(u32::MAX, u32::from_be_bytes);
        let line = format!(
            "{} {imm} {len} {} {} {}",
            wc.wr_id,
            digest(&bytes),
            wc.status,
            wc.src_qp.get()
        );
        send_line(&mut tcp, &line);
    }
    send_line(&mut tcp, "end");
    let (c, n) = ctx.counters();
    eprintln!("server counters: {c:?} {n:?}");
}

#[test]
fn rc_uc_ud_between_two_processes() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "server_role", "--nocapture", "--test-threads=1"])
        .env(ROLE, "server")
        .env("UROCE_TEST_PORT", port.to_string())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (mut tcp, _) = listener.accept().unwrap();
    let ctx = Context::open("127.0.0.2".parse().unwrap()).unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(4096).unwrap();
    let rc = pd.qp(QpType::Rc, &cq).mtu(Mtu::Mtu4096).build().unwrap();
    let uc = pd.qp(QpType::Uc, &cq).mtu(Mtu::Mtu4096).build().unwrap();
    let ud = pd.qp(QpType::Ud, &cq).qkey(QKey(0x42)).build().unwrap();
    let peers: Vec<Endpoint> = [rc.endpoint(), uc.endpoint(), ud.endpoint()]
        .iter()
        .map(|e| uroce::exchange(&mut tcp, e).unwrap())
        .collect();
    rc.connect(&peers[0]).unwrap();
    uc.connect(&peers[1]).unwrap();
    let remote = peers[0].regions[0];
    let src = pd.register(BIG, Access::LOCAL_WRITE).unwrap();
    let back = pd.register(BIG, Access::LOCAL_WRITE).unwrap();

    // Phase 1: WRITE then READ back, every size; the server never polls.
    for (i, len) in sizes().into_iter().enumerate() {
        let data = pattern(i as u64, len);
        src.write(0, &data).unwrap();
        rc.write(1, &src, 0..len, remote).unwrap();
        rc.read(2, &back, 0..len, remote.at(0)).unwrap();
        assert_eq!(wait_ok(&cq).wr_id, 1);
        assert_eq!(wait_ok(&cq).wr_id, 2);
        assert!(back.to_vec(0..len).unwrap() == data, "READ after WRITE of {len} B differs");
    }
    // Atomics on the server's word at ATOMICS (zero to start): adds, then a CAS chain.
    let word = remote.at(ATOMICS as u64);
    let mut sum = 0u64;
    for k in 1..=50u64 {
        rc.fetch_add(k, &back, 0, word, k).unwrap();
        wait_ok(&cq);
        let mut old = [0u8; 8];
        back.read(0, &mut old).unwrap();
        assert_eq!(u64::from_ne_bytes(old), sum, "fetch-and-add {k} saw the running sum");
        sum += k;
    }
    for k in 0..20u64 {
        rc.compare_swap(100 + k, &back, 8, word, sum + k, sum + k + 1).unwrap();
        wait_ok(&cq);
        let mut old = [0u8; 8];
        back.read(8, &mut old).unwrap();
        assert_eq!(u64::from_ne_bytes(old), sum + k, "compare-and-swap {k} matched and swapped");
    }
    // A CAS that does not match leaves the word alone.
    rc.compare_swap(200, &back, 8, word, 1, 2).unwrap();
    wait_ok(&cq);
    rc.read(201, &back, 16..24, word).unwrap();
    wait_ok(&cq);
    assert_eq!(back.to_vec(16..24).unwrap(), (sum + 20).to_ne_bytes());
    send_line(&mut tcp, "one-sided done");

    // Phase 2: SEND and echo.
    let sizes = sizes();
    send_line(&mut tcp, &sizes.len().to_string());
    for (i, &len) in sizes.iter().enumerate() {
        let data = pattern(1000 + i as u64, len);
        src.write(0, &data).unwrap();
        rc.post_recv(9, &back, 0..BIG).unwrap();
        rc.send(3, &src, 0..len).unwrap();
        let mut got = Vec::new();
        while got.len() < 2 {
            got.push(wait_ok(&cq));
        }
        let recv = got.iter().find(|w| w.opcode == uroce::WcOpcode::Recv).unwrap();
        assert_eq!(recv.byte_len as usize, len);
        assert!(back.to_vec(0..len).unwrap() == data, "echo of {len} B differs");
    }

    // Phase 3: UC SENDs with immediate and UD datagrams.
    assert_eq!(read_line(&mut tcp), "ready");
    let uc_sizes: Vec<usize> =
        (0..32).map(|k| [1, 100, 1000, 4096, 4097, 30_000, 65_536][k % 7]).collect();
    let mut at = 0;
    let mut expected = std::collections::HashMap::new();
    for (k, &len) in uc_sizes.iter().enumerate() {
        let data = pattern(5000 + k as u64, len);
        src.write(at, &data).unwrap();
        uc.send_with_imm(10 + k as u64, &src, at..at + len, k as u32).unwrap();
        expected.insert(k as u32, (len, digest(&data)));
        at += len;
    }
    let ah = pd.create_ah("127.0.0.3".parse::<IpAddr>().unwrap()).unwrap();
    for k in 0..32u32 {
        let len = [0, 1, 64, 1000, 4096][k as usize % 5];
        let mut data = pattern(9000 + u64::from(k), len.max(4));
        data.truncate(len);
        if len >= 4 {
            data[..4].copy_from_slice(&(1000 + k).to_be_bytes());
        }
        src.write(at, &data).unwrap();
        ud.send_to(100 + u64::from(k), &src, at..at + len, &ah, peers[2].qpn, QKey(0x42)).unwrap();
        if len >= 4 {
            expected.insert(1000 + k, (len, digest(&data)));
        }
        at += len;
    }
    let mut sends = 0;
    while sends < 64 {
        let wc = wait_ok(&cq);
        assert!(wc.wr_id >= 10, "{wc:?}");
        sends += 1;
    }
    send_line(&mut tcp, "sent");
    let (mut uc_got, mut ud_got) = (0, 0);
    loop {
        let line = read_line(&mut tcp);
        if line == "end" {
            break;
        }
        let f: Vec<&str> = line.split(' ').collect();
        let (wr_id, imm, len, dig, status, src_qp): (u64, u32, usize, u64, &str, u32) = (
            f[0].parse().unwrap(),
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
            f[3].parse().unwrap(),
            f[4],
            f[5].parse().unwrap(),
        );
        assert_eq!(status, "SUCCESS", "{line}");
        if wr_id < 32 {
            let (want_len, want) = expected[&imm];
            assert_eq!((len, dig), (want_len, want), "UC message {imm} arrived whole");
            uc_got += 1;
        } else if len >= 4 {
            assert_eq!(src_qp, ud.qpn().get(), "UD source QP");
            // The first four bytes name the datagram.
            ud_got += 1;
            let id = expected.keys().find(|&&k| k >= 1000 && expected[&k] == (len, dig));
            assert!(id.is_some(), "UD datagram of {len} B arrived intact");
        } else {
            ud_got += 1;
        }
    }
    eprintln!("UC: {uc_got} of 32 messages whole; UD: {ud_got} of 32 datagrams");
    assert!(uc_got > 0 && ud_got > 0, "loopback delivered nothing");
    let (c, n) = ctx.counters();
    eprintln!("client counters: {c:?} {n:?}");
    // The client's WRITE and SEND payloads went to the kernel straight from registered memory.
    assert!(n.tx_zero_copy > 0 && n.tx_zero_copy_bytes >= 2 * (BIG as u64), "{n:?}");
    assert!(child.wait().unwrap().success(), "server failed");
}
