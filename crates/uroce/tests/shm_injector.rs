//! Another process of the same user can open the shared-memory ring between two endpoints of
//! a host and write into it (its mode lets the user in, as any file of theirs). What it
//! writes is judged as bytes from the wire are: records that are not records are counted
//! (`shm_rx_malformed`) and skipped, and the ring works on afterwards; a forged packet meets
//! the engine's rules (QPN, PSN, R_Key and bounds) and is refused by name; nothing crashes and
//! nothing lands outside a region.
//!
//! The test plays that process itself: it finds the ring from A's endpoint to B's in the host
//! directory and writes into the file, knowing the layout the ring module documents (`HEAD` at
//! 0, `TAIL` at 64, records from 4096; a record is a 32-byte header and the packet, padded to
//! 64 bytes). Its own test binary, so no other test's endpoints share the directory with it.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::cast_possible_truncation, reason = "ring offsets are below 2 MiB")]
#![allow(clippy::disallowed_methods, reason = "waits for another thread, bounded")]

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use uroce::{Access, Context, Cq, Mr, Mtu, Options, Qp, QpState, QpType, WcStatus};

const WAIT: Option<Duration> = Some(Duration::from_secs(30));
const TAIL: u64 = 64;
const DATA: u64 = 4096;
const RING_BYTES: u64 = 2 << 20;
const RECORD_HEADER: usize = 32;
/// A packet whose sender left the ICRC out: the receiver checks none.
const KIND_PACKET_NO_ICRC: u32 = 3;

struct Side {
    ctx: Context,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    /// A small region of its own: a forged WRITE aims across its end.
    small: Mr,
}

fn side(addr: &str) -> Side {
    let ctx = Context::open_with(addr.parse().unwrap(), Options::default()).unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256).unwrap();
    let qp = pd.qp(QpType::Rc, &cq).mtu(Mtu::Mtu1024).retries(7, 7, 7).build().unwrap();
    let mr = pd.register(1 << 16, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let small = pd.register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    small.write(0, &[0x5A; 4096]).unwrap();
    Side { ctx, cq, qp, mr, small }
}

/// The host directory the runtime uses for this user and network namespace.
fn host_dir() -> PathBuf {
    let base = std::env::var_os("UROCE_SHM_DIR").map_or_else(|| "/dev/shm".into(), PathBuf::from);
    let uid = std::fs::metadata("/proc/self").unwrap().uid();
    let netns = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
    base.join(format!("uroce-{uid}-{netns}"))
}

/// Waits until `done` holds, for at most ten seconds.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A SEND of `data` from `a` to `b`, both completions checked.
fn send(a: &Side, b: &Side, wr_id: u64, data: &[u8]) {
    a.mr.write(0, data).unwrap();
    b.qp.post_recv(wr_id, &b.mr, 0x8000..0x8000 + data.len()).unwrap();
    a.qp.send(wr_id, &a.mr, 0..data.len()).unwrap();
    assert_eq!(a.cq.wait_one(WAIT).unwrap().status, WcStatus::SUCCESS);
    let wc = b.cq.wait_one(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::SUCCESS));
    assert_eq!(b.mr.to_vec(0x8000..0x8000 + data.len()).unwrap(), data);
}

/// The injector's view of one ring file.
struct Ring(std::fs::File);

impl Ring {
    fn u64_at(&self, at: u64) -> u64 {
        let mut b = [0u8; 8];
        self.0.read_exact_at(&mut b, at).unwrap();
        u64::from_le_bytes(b)
    }
    fn tail(&self) -> u64 {
        self.u64_at(TAIL)
    }
    fn record_at(&self, pos: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.0.read_exact_at(&mut b, DATA + pos % RING_BYTES).unwrap();
        b
    }
    /// Writes `bytes` where the next record goes and publishes them.
    fn publish(&self, bytes: &[u8]) {
        let tail = self.tail();
        assert!(tail % RING_BYTES + bytes.len() as u64 <= RING_BYTES, "no wrap in this test");
        self.0.write_all_at(bytes, DATA + tail % RING_BYTES).unwrap();
        self.0.write_all_at(&(tail + bytes.len() as u64).to_le_bytes(), TAIL).unwrap();
    }
}

/// Wakes the endpoint in slot `(index, generation)` if its progress thread sleeps, as a
/// producer does after publishing.
fn poke(dir: &std::path::Path, (index, generation): (u8, u32)) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(format!("wake-{index}-{generation}"));
    // O_NONBLOCK: a FIFO opened for writing does not wait for a reader.
    let mut f = OpenOptions::new()
        .write(true)
        .custom_flags(0o4000)
        .open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let _ = f.write(&[1]);
}

#[test]
fn garbage_and_forged_records_in_a_ring_are_counted_and_refused_never_trusted() {
    let (a, b) = (side("127.0.31.2"), side("127.0.31.3"));
    let (ea, eb) = (a.qp.endpoint(), b.qp.endpoint());
    a.qp.connect(&eb).unwrap();
    b.qp.connect(&ea).unwrap();
    let dir = host_dir();
    let (sa, sb) = (a.ctx.endpoint_slot(), b.ctx.endpoint_slot());
    let path = dir.join(format!("ring-{}-{}-{}-{}", sa.0, sa.1, sb.0, sb.1));

    // A first message makes the ring, and shows the packets take it.
    let before = b.ctx.counters().1.shm_rx_packets;
    send(&a, &b, 1, &[7; 64]);
    assert!(b.ctx.counters().1.shm_rx_packets > before, "A's packets to B take the ring");
    let ring = Ring(OpenOptions::new().read(true).write(true).open(&path).unwrap());

    // 1. Garbage published as records: counted once, skipped, and the ring works on.
    let malformed = b.ctx.counters().1.shm_rx_malformed;
    ring.publish(&[0xEE; 512]);
    poke(&dir, sb);
    wait_for("the garbage to be counted", || b.ctx.counters().1.shm_rx_malformed == malformed + 1);
    // A's next tail is behind the false one; B goes back to it, and the message arrives (its
    // first copy may be skipped with the false tail, and is sent again).
    send(&a, &b, 2, &[8; 100]);
    let c = b.ctx.counters().1;
    assert_eq!(c.shm_rx_malformed, malformed + 1, "B went back to A's tail: {c:?}");

    // 2. A's next record, kept as a model for forgeries: a SEND of 100 bytes, one packet.
    let tail = ring.tail();
    send(&a, &b, 3, &[9; 100]);
    let header = ring.record_at(tail, RECORD_HEADER);
    let len = u32::from_le_bytes(header[8..12].try_into().unwrap()) as usize;
    let model = ring.record_at(tail + RECORD_HEADER as u64, len);
    assert_eq!(model[0], 0x04, "RC SEND_ONLY");
    let next_psn = (u32::from_be_bytes([0, model[9], model[10], model[11]]) + 1) & 0xFF_FFFF;
    let forge = |packet: &[u8]| {
        let total = (RECORD_HEADER + packet.len()).next_multiple_of(64);
        let mut r = header.clone();
        r[0..4].copy_from_slice(&(total as u32).to_le_bytes());
        r[4..8].copy_from_slice(&KIND_PACKET_NO_ICRC.to_le_bytes());
        r[8..12].copy_from_slice(&(packet.len() as u32).to_le_bytes());
        r.extend_from_slice(packet);
        r.resize(total, 0);
        r
    };

    // 3. A packet for a QPN that is not there: refused by name.
    let engine_before = b.ctx.counters().0;
    let mut stray = model.clone();
    stray[5..8].copy_from_slice(&(b.qp.qpn().get() ^ 0x40).to_be_bytes()[1..]);
    ring.publish(&forge(&stray));
    poke(&dir, sb);
    wait_for("the stray packet to be refused", || {
        b.ctx.counters().0.drop_unknown_qp == engine_before.drop_unknown_qp + 1
    });

    // 4. A WRITE at the PSN B expects, with B's own R_Key, across the end of B's small region:
    // refused as a remote access error, and not one byte of the region written.
    let mut write = model[..12].to_vec();
    write[0] = 0x0A; // RC RDMA WRITE_ONLY
    write[9..12].copy_from_slice(&next_psn.to_be_bytes()[1..]);
    write.extend_from_slice(&(b.small.addr() + 4000).to_be_bytes());
    write.extend_from_slice(&b.small.rkey().0.to_be_bytes());
    write.extend_from_slice(&200u32.to_be_bytes());
    write.extend_from_slice(&[0xAB; 200]);
    write.extend_from_slice(&[0; 4]); // the ICRC field, left out
    ring.publish(&forge(&write));
    poke(&dir, sb);
    wait_for("the forged WRITE to be refused", || b.qp.state() == Some(QpState::Error));
    let c = b.ctx.counters().0;
    assert_eq!(c.err_naks_sent, engine_before.err_naks_sent + 1, "{c:?}");
    assert_eq!(b.small.to_vec(0..4096).unwrap(), vec![0x5A; 4096], "nothing written");

    // The process is alive, B's device serves its other work: a fresh pair over the same
    // endpoints carries a message.
    let pd_a = a.ctx.alloc_pd();
    let pd_b = b.ctx.alloc_pd();
    let (qa, qb) = (
        pd_a.qp(QpType::Rc, &a.cq).mtu(Mtu::Mtu1024).build().unwrap(),
        pd_b.qp(QpType::Rc, &b.cq).mtu(Mtu::Mtu1024).build().unwrap(),
    );
    qa.connect(&qb.endpoint()).unwrap();
    qb.connect(&qa.endpoint()).unwrap();
    let (ma, mb) = (
        pd_a.register(4096, Access::LOCAL_WRITE).unwrap(),
        pd_b.register(4096, Access::LOCAL_WRITE).unwrap(),
    );
    ma.write(0, b"after").unwrap();
    qb.post_recv(9, &mb, 0..64).unwrap();
    qa.send(9, &ma, 0..5).unwrap();
    // B's old QP flushes its receives; take completions until this one's.
    let wc = loop {
        let wc = b.cq.wait_one(WAIT).unwrap();
        if wc.wr_id == 9 {
            break wc;
        }
    };
    assert_eq!(wc.status, WcStatus::SUCCESS);
    assert_eq!(mb.to_vec(0..5).unwrap(), b"after");
}
