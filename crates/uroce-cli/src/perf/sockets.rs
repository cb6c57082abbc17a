//! The kernel TCP and UDP tests, both roles: what RDMA is compared with.

use core::time::Duration;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::rdma::Measured;
use super::{Op, Params, Pattern, TestDef, now};

/// Calls on a non-blocking socket that found nothing to do: what busy-polling spins on, and
/// what shows `--busy-poll` took effect.
static WOULD_BLOCK: AtomicU64 = AtomicU64::new(0);

fn spun() {
    WOULD_BLOCK.fetch_add(1, Ordering::Relaxed);
    core::hint::spin_loop();
}

/// The server's data socket, bound before it answers `ready`.
pub(crate) enum Listener {
    Tcp(TcpListener),
    Udp(UdpSocket),
}

impl Listener {
    pub(crate) fn bind(addr: IpAddr, test: &TestDef) -> std::io::Result<Self> {
        Ok(match test.op {
            Op::Tcp => Self::Tcp(TcpListener::bind((addr, 0))?),
            _ => Self::Udp(UdpSocket::bind((addr, 0))?),
        })
    }

    pub(crate) fn port(&self) -> std::io::Result<u16> {
        Ok(match self {
            Self::Tcp(l) => l.local_addr()?.port(),
            Self::Udp(s) => s.local_addr()?.port(),
        })
    }
}

fn err(e: std::io::Error) -> String {
    e.to_string()
}

/// Reads exactly `buf.len()` bytes, spinning through `WouldBlock` on a non-blocking socket
/// (busy-poll); `false` at end of stream.
fn read_full(s: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => return Ok(false),
            Ok(n) => got += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => spun(),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Writes all of `buf`, spinning through `WouldBlock` on a non-blocking socket.
fn write_full(s: &mut TcpStream, buf: &[u8]) -> std::io::Result<()> {
    let mut put = 0;
    while put < buf.len() {
        match s.write(&buf[put..]) {
            Ok(n) => put += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => spun(),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Applies the socket buffer sizes of `p`; returns the sizes the kernel then reports.
fn tune(sock: &impl std::os::fd::AsRawFd, p: &Params) -> Result<(usize, usize), String> {
    if p.sockbuf > 0 {
        uroce_net::set_socket_buffers(sock, p.sockbuf).map_err(err)?;
    }
    uroce_net::socket_buffers(sock).map_err(err)
}

/// The server's side: echoes (ping-pong) or sinks (stream) until the client is done. Returns
/// the messages and bytes it received.
pub(crate) fn server(
    listener: Listener,
    test: &TestDef,
    p: &Params,
    stop: &AtomicBool,
) -> Result<(u64, u64), String> {
    let mut buf = vec![0u8; p.size.max(65_536)];
    let (mut msgs, mut bytes) = (0u64, 0u64);
    match listener {
        Listener::Tcp(l) => {
            let (mut s, _) = l.accept().map_err(err)?;
            s.set_nodelay(p.nodelay).map_err(err)?;
            tune(&s, p)?;
            s.set_nonblocking(p.busy_poll).map_err(err)?;
            loop {
                if test.pattern == Pattern::PingPong {
                    match read_full(&mut s, &mut buf[..p.size]) {
                        Ok(true) => {}
                        Ok(false) => break,
                        Err(e) if e.kind() == ErrorKind::UnexpectedEof => break,
                        Err(e) => return Err(err(e)),
                    }
                    write_full(&mut s, &buf[..p.size]).map_err(err)?;
                    msgs += 1;
                    bytes += p.size as u64;
                } else {
                    let n = match s.read(&mut buf) {
                        Ok(n) => n,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            spun();
                            continue;
                        }
                        Err(e) => return Err(err(e)),
                    };
                    if n == 0 {
                        break;
                    }
                    bytes += n as u64;
                    msgs = bytes / p.size as u64;
                }
            }
        }
        Listener::Udp(s) => {
            tune(&s, p)?;
            if p.busy_poll {
                s.set_nonblocking(true).map_err(err)?;
            } else {
                s.set_read_timeout(Some(Duration::from_millis(20))).map_err(err)?;
            }
            while !stop.load(Ordering::Acquire) {
                match s.recv_from(&mut buf) {
                    Ok((n, from)) => {
                        msgs += 1;
                        bytes += n as u64;
                        if test.pattern == Pattern::PingPong {
                            s.send_to(&buf[..n], from).map_err(err)?;
                        }
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    Err(e) => return Err(err(e)),
                }
            }
        }
    }
    Ok((msgs, bytes))
}

/// The client's side against the server's data port.
pub(crate) fn client(server: SocketAddr, test: &TestDef, p: &Params) -> Result<Measured, String> {
    let mut m = Measured::default();
    let size = p.size;
    let data = vec![0x5a_u8; size];
    let mut back = vec![0u8; size];
    let total_warm = p.warmup;
    let measure =
        |m: &mut Measured, mut round: Box<dyn FnMut() -> Result<Option<u64>, String> + '_>| {
            for _ in 0..total_warm {
                round()?;
            }
            let start = now();
            while !match p.duration {
                Some(d) => start.elapsed() >= d,
                None => m.msgs >= p.iters,
            } {
                if let Some(sample) = round()? {
                    m.samples.push(sample);
                }
                m.msgs += 1;
            }
            m.seconds = start.elapsed().as_secs_f64();
            Ok::<(), String>(())
        };
    let spins = WOULD_BLOCK.load(Ordering::Relaxed);
    match (test.op, test.pattern) {
        (Op::Tcp, pattern) => {
            let mut s = TcpStream::connect(server).map_err(err)?;
            s.set_nodelay(p.nodelay).map_err(err)?;
            m.applied.sockbuf = Some(tune(&s, p)?);
            s.set_nonblocking(p.busy_poll).map_err(err)?;
            let ping = pattern == Pattern::PingPong;
            measure(
                &mut m,
                Box::new(|| {
                    let t0 = now();
                    write_full(&mut s, &data).map_err(err)?;
                    if ping {
                        if !read_full(&mut s, &mut back).map_err(err)? {
                            return Err("the server closed the data connection".into());
                        }
                        return Ok(Some(
                            u64::try_from(t0.elapsed().as_nanos() / 2).unwrap_or(u64::MAX),
                        ));
                    }
                    Ok(None)
                }),
            )?;
            m.bytes = m.msgs * size as u64;
            m.total_posted = m.msgs + total_warm;
        }
        (Op::Udp, pattern) => {
            let s = UdpSocket::bind((server.ip(), 0))
                .or_else(|_| UdpSocket::bind(("0.0.0.0", 0)))
                .map_err(err)?;
            s.connect(server).map_err(err)?;
            m.applied.sockbuf = Some(tune(&s, p)?);
            s.set_read_timeout(Some(Duration::from_secs(1))).map_err(err)?;
            s.set_nonblocking(p.busy_poll).map_err(err)?;
            let ping = pattern == Pattern::PingPong;
            measure(
                &mut m,
                Box::new(|| {
                    let t0 = now();
                    match s.send(&data) {
                        Ok(_) => {}
                        // A full buffer loses the datagram, as the network would.
                        Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                        Err(e) => return Err(err(e)),
                    }
                    // Busy-polling spins until the answer comes (or the second a blocking
                    // receive would wait): a round whose answer is still on its way is not lost.
                    if ping {
                        loop {
                            match s.recv(&mut back) {
                                Ok(_) => {
                                    return Ok(Some(
                                        u64::try_from(t0.elapsed().as_nanos() / 2)
                                            .unwrap_or(u64::MAX),
                                    ));
                                }
                                Err(e)
                                    if e.kind() == ErrorKind::WouldBlock
                                        && t0.elapsed() < Duration::from_secs(1) =>
                                {
                                    spun();
                                }
                                Err(e)
                                    if matches!(
                                        e.kind(),
                                        ErrorKind::WouldBlock | ErrorKind::TimedOut
                                    ) =>
                                {
                                    return Ok(None);
                                }
                                Err(e) => return Err(err(e)),
                            }
                        }
                    }
                    Ok(None)
                }),
            )?;
            m.bytes = m.msgs * size as u64;
            m.total_posted = m.msgs + total_warm;
        }
        _ => return Err(format!("{} is not a socket test", test.name)),
    }
    m.applied.would_block = WOULD_BLOCK.load(Ordering::Relaxed) - spins;
    Ok(m)
}
