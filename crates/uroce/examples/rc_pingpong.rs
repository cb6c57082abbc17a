//! RC ping-pong between two processes, as rdma-core's `ibv_rc_pingpong` does it: the server
//! waits for a client on TCP port 18515, they swap endpoints, then bounce a message back and
//! forth and print the throughput and the time per iteration.
//!
//! ```sh
//! cargo run --release -p uroce --example rc_pingpong -- --addr 127.0.0.3 &        # server
//! cargo run --release -p uroce --example rc_pingpong -- --addr 127.0.0.2 127.0.0.3 # client
//! ```
//!
//! Options: `--addr ADDR` (this device's address), `-s SIZE` (default 4096), `-n ITERS`
//! (default 1000), `-p PORT` (TCP port, default 18515), `-e` (sleep on completion events
//! instead of busy polling).

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, TcpListener, TcpStream};
use std::time::Instant;

use uroce::{Access, Context, Cq, Mtu, QpType, WcOpcode, WcStatus, WorkCompletion};

struct Args {
    addr: IpAddr,
    server: Option<IpAddr>,
    size: usize,
    iters: u32,
    port: u16,
    events: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        addr: "127.0.0.2".parse().map_err(|e| format!("{e}"))?,
        server: None,
        size: 4096,
        iters: 1000,
        port: 18515,
        events: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--addr" => a.addr = value("--addr")?.parse().map_err(|e| format!("--addr: {e}"))?,
            "-s" => a.size = value("-s")?.parse().map_err(|e| format!("-s: {e}"))?,
            "-n" => a.iters = value("-n")?.parse().map_err(|e| format!("-n: {e}"))?,
            "-p" => a.port = value("-p")?.parse().map_err(|e| format!("-p: {e}"))?,
            "-e" => a.events = true,
            other if !other.starts_with('-') => {
                a.server = Some(other.parse().map_err(|e| format!("server address: {e}"))?);
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(a)
}

/// The next completion: from those already taken, else by busy polling, or with `events` by
/// sleeping on the completion channel.
fn next(
    cq: &Cq,
    events: bool,
    taken: &mut VecDeque<WorkCompletion>,
) -> Result<WorkCompletion, Box<dyn std::error::Error>> {
    let mut out = Vec::new();
    while taken.is_empty() {
        if events {
            out = cq.wait(None)?;
        } else {
            cq.poll(&mut out);
        }
        taken.extend(out.drain(..));
    }
    Ok(taken.pop_front().ok_or("no completion")?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let ctx = Context::open(args.addr)?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64)?;
    let qp = pd.qp(QpType::Rc, &cq).mtu(Mtu::Mtu4096).build()?;
    let buf = pd.register(args.size, Access::LOCAL_WRITE)?;
    let mut tcp = match args.server {
        Some(server) => TcpStream::connect((server, args.port))?,
        None => TcpListener::bind((args.addr, args.port))?.accept()?.0,
    };
    let remote = uroce::exchange(&mut tcp, &qp.endpoint())?;
    println!("  local address:  GID {} QPN {} PSN {}", args.addr, qp.qpn(), qp.endpoint().psn);
    println!("  remote address: GID {} QPN {} PSN {}", remote.gid, remote.qpn, remote.psn);
    qp.connect(&remote)?;
    // Both sides keep a receive posted; the client serves first.
    qp.post_recv(0, &buf, 0..args.size)?;
    uroce::exchange(&mut tcp, &qp.endpoint())?; // a barrier: both receives are posted
    #[expect(clippy::disallowed_methods, reason = "a benchmark reads the clock")]
    let start = Instant::now();
    let client = args.server.is_some();
    let (mut sent, mut received, mut completed) = (0, 0, 0);
    let mut taken = VecDeque::new();
    if client {
        qp.send(1, &buf, 0..args.size)?;
        sent += 1;
    }
    // Every receive is answered by a send (the client's last one excepted), until both
    // directions have done `iters` messages.
    while received < args.iters || completed < sent {
        let wc = next(&cq, args.events, &mut taken)?;
        if wc.status != WcStatus::SUCCESS {
            return Err(format!("{:?} failed: {}", wc.opcode, wc.status).into());
        }
        if wc.opcode != WcOpcode::Recv {
            completed += 1;
            continue;
        }
        received += 1;
        qp.post_recv(0, &buf, 0..args.size)?;
        if sent < args.iters {
            qp.send(1, &buf, 0..args.size)?;
            sent += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // ibv_rc_pingpong counts each message once per direction.
    let bytes = args.size as u64 * u64::from(args.iters) * 2;
    #[expect(clippy::cast_precision_loss, reason = "a rate to two decimals")]
    let mbits = bytes as f64 * 8.0 / secs / 1e6;
    println!("{bytes} bytes in {secs:.2} seconds = {mbits:.2} Mbit/sec");
    println!(
        "{} iters in {secs:.2} seconds = {:.2} usec/iter",
        args.iters,
        secs * 1e6 / f64::from(args.iters)
    );
    Ok(())
}
