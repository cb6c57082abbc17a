//! What a verb costs the calling thread over the kernel's UDP path, beside the system call it
//! cannot avoid: an idle `Cq::poll` (a round of progress that finds nothing) against `recvfrom`
//! on an empty socket, and a 64-byte UD SEND (`Qp::send_to`) against `sendto` of a datagram of
//! the same size. The difference is the runtime's own work per verb — what a ping-pong pays on
//! top of the kernel's one-way latency. One thread, loopback, `UROCE_FABRIC=udp` by default.
//!
//! ```sh
//! cargo run --release -p uroce --example verb_cost -- [-n ITERATIONS] [-r ROUNDS]
//! ```
//!
//! The sends go to a socket bound on 127.0.0.10:4791 that never reads (the kernel drops what
//! overflows it); the device is 127.0.0.9.

use std::net::{SocketAddr, UdpSocket};
use std::time::Instant;

use uroce::{Access, Context, Options, QKey, QpType, Qpn};

fn arg(name: &str, default: usize) -> Result<usize, Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(args.get(i + 1).ok_or(format!("{name} needs a value"))?.parse()?),
        None => Ok(default),
    }
}

/// Nanoseconds per call of `f`, over `n` calls.
fn per_call(n: usize, mut f: impl FnMut(usize)) -> f64 {
    #[expect(clippy::disallowed_methods, reason = "a benchmark reads the clock")]
    let start = Instant::now();
    for i in 0..n {
        f(i);
    }
    start.elapsed().as_nanos() as f64 / n.max(1) as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = arg("-n", 200_000)?;
    let rounds = arg("-r", 3)?;
    let sink_addr: SocketAddr = "127.0.0.10:4791".parse()?;
    let sink = UdpSocket::bind(sink_addr)?;
    sink.set_nonblocking(true)?;
    let options = Options {
        udp_only: std::env::var("UROCE_FABRIC").map_or(true, |f| f == "udp"),
        ..Options::from_env()?
    };
    let ctx = Context::open_with("127.0.0.9".parse()?, options)?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(4096)?;
    let qp = pd.qp(QpType::Ud, &cq).qkey(QKey(1)).build()?;
    let msg = pd.register(4096, Access::LOCAL_WRITE)?;
    let ah = pd.create_ah(sink_addr.ip())?;
    let bare = UdpSocket::bind("127.0.0.9:0")?;
    bare.set_nonblocking(true)?;
    // BTH, DETH, the payload and the ICRC: what the UD SEND puts in its datagram.
    let datagram = [0u8; 12 + 8 + 64 + 4];
    let mut buf = [0u8; 4096];
    let mut wcs = Vec::new();
    let drain = |buf: &mut [u8]| while sink.recv_from(buf).is_ok() {};
    println!("{:<44} {:>10} {:>14} {:>10}", "per call", "uroce ns", "syscall ns", "extra ns");
    for _ in 0..rounds {
        let poll = per_call(n, |_| {
            wcs.clear();
            cq.poll(&mut wcs);
        });
        let recv = per_call(n, |_| {
            let _ = bare.recv_from(&mut buf);
        });
        println!(
            "{:<44} {poll:>10.0} {recv:>14.0} {:>10.0}",
            "idle Cq::poll / recvfrom (empty)",
            poll - recv
        );
        let mut failed = None;
        let send = per_call(n, |i| {
            if let Err(e) = qp.send_to(i as u64, &msg, 0..64, &ah, Qpn::from_masked(2), QKey(1)) {
                failed.get_or_insert(e);
            }
            // UD SENDs complete as they leave: reap them every 32 (and count that in).
            if i % 32 == 31 {
                let mut got = 0;
                while got < 32 && failed.is_none() {
                    wcs.clear();
                    got += cq.poll(&mut wcs);
                }
            }
        });
        if let Some(e) = failed {
            return Err(e.into());
        }
        drain(&mut buf);
        let sendto = per_call(n, |_| {
            let _ = bare.send_to(&datagram, sink_addr);
        });
        drain(&mut buf);
        println!(
            "{:<44} {send:>10.0} {sendto:>14.0} {:>10.0}",
            "UD SEND of 64 B / sendto of 88 B",
            send - sendto
        );
    }
    Ok(())
}
