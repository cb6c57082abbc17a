//! The kernel's floor for a 64-byte ping-pong over loopback, with no RDMA in it: what the
//! latency goals of a UDP path are measured against. Two processes (this one and an echo it
//! starts) bounce a datagram, each spinning on non-blocking calls, in two arrangements taken in
//! alternating rounds:
//!
//! - **sockperf's**: one socket a side, `recvfrom` and unconnected `sendto` (what
//!   `sockperf ping-pong --nonblocked` does, without its bookkeeping);
//! - **uroce's UD receive and send**: the datagram of a 64-byte UD SEND (88 bytes: BTH, DETH,
//!   payload, ICRC), received on a bound socket by `recvmsg` with the TTL and TOS control
//!   messages (which the GRH of a UD completion reports) into a 64 KiB buffer, and sent from a
//!   second socket connected to the peer, as the runtime does.
//!
//! Each round prints the median half round trip of both; the difference is what the
//! arrangement alone costs, and a uroce ping-pong's distance from the second is uroce's own.
//!
//! ```sh
//! cargo run --release -p uroce --example udp_floor -- [-n ITERATIONS] [-r ROUNDS]
//! ```
//!
//! Addresses 127.0.0.11 and 127.0.0.12, ports 7000 (receive) and 7001 (connected send).

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

fn arg(name: &str, default: usize) -> Result<usize, Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(args.get(i + 1).ok_or(format!("{name} needs a value"))?.parse()?),
        None => Ok(default),
    }
}

/// One side's sockets: where it receives, and how it sends.
struct Side {
    rx: UdpSocket,
    tx: UdpSocket,
    peer: SocketAddr,
    /// uroce's arrangement: receive with `recvmsg` and the TTL and TOS control messages, send
    /// from `tx` connected to `peer`. Otherwise sockperf's: `tx` is `rx`, unconnected.
    uroce: bool,
}

impl Side {
    #[expect(clippy::cast_possible_truncation, reason = "the size of a C int")]
    fn new(me: &str, peer: &str, uroce: bool) -> std::io::Result<Self> {
        let rx = UdpSocket::bind(format!("{me}:7000"))?;
        rx.set_nonblocking(true)?;
        let peer: SocketAddr = format!("{peer}:7000").parse().map_err(std::io::Error::other)?;
        if !uroce {
            let tx = rx.try_clone()?;
            return Ok(Self { rx, tx, peer, uroce });
        }
        for opt in [libc::IP_RECVTTL, libc::IP_RECVTOS] {
            let one: libc::c_int = 1;
            // SAFETY: setsockopt(2) reads the 4-byte `one`, which lives through the call.
            let ret = unsafe {
                libc::setsockopt(
                    rx.as_raw_fd(),
                    libc::IPPROTO_IP,
                    opt,
                    (&raw const one).cast(),
                    size_of_val(&one) as libc::socklen_t,
                )
            };
            if ret < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        let tx = UdpSocket::bind(format!("{me}:7001"))?;
        tx.connect(peer)?;
        Ok(Self { rx, tx, peer, uroce })
    }

    fn send(&self, datagram: &[u8]) {
        let _ =
            if self.uroce { self.tx.send(datagram) } else { self.tx.send_to(datagram, self.peer) };
    }

    /// Spins until a datagram comes; `false` if none came within `limit` polls.
    #[expect(clippy::cast_possible_truncation, reason = "the size of a sockaddr_storage")]
    fn recv(&self, buf: &mut [u8], control: &mut [u64; 20], limit: u64) -> bool {
        for _ in 0..limit {
            let got = if self.uroce {
                // SAFETY: sockaddr_storage is plain old data; all zeroes is a valid value.
                let mut name: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
                let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
                // SAFETY: msghdr is plain old data; all zeroes is a valid value.
                let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
                msg.msg_name = (&raw mut name).cast();
                msg.msg_namelen = size_of_val(&name) as libc::socklen_t;
                msg.msg_iov = &raw mut iov;
                msg.msg_iovlen = 1;
                msg.msg_control = control.as_mut_ptr().cast();
                msg.msg_controllen = size_of_val(control);
                // SAFETY: the header points at a live name, iovec (over `buf`) and control
                // buffer, each of its stated length, all living through the call.
                unsafe { libc::recvmsg(self.rx.as_raw_fd(), &raw mut msg, libc::MSG_DONTWAIT) >= 0 }
            } else {
                self.rx.recv_from(buf).is_ok()
            };
            if got {
                return true;
            }
        }
        false
    }
}

/// The echo side, in a process of its own (`--echo uroce|sockperf N`), as the peers of a
/// benchmark are: answers `n` datagrams, having said `ready` once its sockets are bound.
fn echo(uroce: bool, n: usize) -> Result<(), Box<dyn std::error::Error>> {
    let server = Side::new("127.0.0.11", "127.0.0.12", uroce)?;
    println!("ready");
    std::io::Write::flush(&mut std::io::stdout())?;
    let (mut buf, mut control) = (vec![0u8; 65_536], [0u64; 20]);
    for _ in 0..n {
        if !server.recv(&mut buf, &mut control, LIMIT) {
            return Err("the client stopped".into());
        }
        server.send(&buf[..88]);
    }
    Ok(())
}

/// Polls before a side gives up waiting.
const LIMIT: u64 = 50_000_000;
/// Unmeasured rounds first.
const WARM: usize = 1_000;

/// The median half round trip of `n` rounds in one arrangement, in microseconds, against an
/// echo process.
fn ping_pong(n: usize, uroce: bool) -> Result<f64, Box<dyn std::error::Error>> {
    let mode = if uroce { "uroce" } else { "sockperf" };
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(["--echo", mode, &(n + WARM).to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut ready = String::new();
    let out = child.stdout.take().ok_or("no pipe from the echo")?;
    std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut ready)?;
    if ready.trim() != "ready" {
        let _ = child.kill();
        return Err("the echo did not start".into());
    }
    let client = Side::new("127.0.0.12", "127.0.0.11", uroce)?;
    let (mut buf, mut control) = (vec![0u8; 65_536], [0u64; 20]);
    let datagram = [7u8; 88];
    let mut half = Vec::with_capacity(n);
    for i in 0..n + WARM {
        #[expect(clippy::disallowed_methods, reason = "a benchmark reads the clock")]
        let start = Instant::now();
        client.send(&datagram);
        if !client.recv(&mut buf, &mut control, LIMIT) {
            let _ = child.kill();
            return Err("the echo stopped answering".into());
        }
        if i >= WARM {
            half.push(start.elapsed() / 2);
        }
    }
    child.wait()?;
    half.sort_unstable();
    Ok(half.get(n / 2).copied().unwrap_or(Duration::ZERO).as_secs_f64() * 1e6)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--echo") {
        let uroce = args.get(i + 1).is_some_and(|m| m == "uroce");
        let n = args.get(i + 2).ok_or("--echo MODE N")?.parse()?;
        return echo(uroce, n);
    }
    let n = arg("-n", 50_000)?.max(1);
    let rounds = arg("-r", 3)?;
    println!(
        "{:<6} {:>26} {:>26} {:>7}",
        "round", "sockperf's arrangement µs", "uroce's UD arrangement µs", "ratio"
    );
    for r in 1..=rounds {
        let plain = ping_pong(n, false)?;
        let uroce = ping_pong(n, true)?;
        println!("{r:<6} {plain:>26.3} {uroce:>26.3} {:>7.2}", uroce / plain);
    }
    Ok(())
}
