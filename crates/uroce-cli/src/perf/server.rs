//! `uroce server`: waits for clients and answers their tests, one client at a time.

use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};

use super::backend::{Device, Stack};
use super::control::{Control, endpoints_from_hex, endpoints_hex};
use super::rdma::{self, Side};
use super::sockets::{self, Listener};
use super::{Cpu, PROTOCOL_VERSION, Params, TestDef, find};

/// Listens on `addr:port` for control connections; the RDMA device is `stack`'s (uroce's: the
/// device of `addr`).
pub(crate) fn serve(addr: IpAddr, port: u16, stack: &Stack) -> Result<(), String> {
    // A server that `uroce compare` started goes when it goes (the variable holds its pid).
    if let Ok(parent) = std::env::var("UROCE_DIE_WITH_PARENT") {
        let parent: u32 = parent.parse().map_err(|_| "UROCE_DIE_WITH_PARENT is not a pid")?;
        if !uroce_net::die_with_parent(parent).map_err(|e| e.to_string())? {
            return Err("the process that started this server is gone".into());
        }
    }
    let listener = TcpListener::bind((addr, port))
        .map_err(|e| format!("cannot listen on {addr}:{port}: {e}"))?;
    let device = stack.open(addr)?;
    eprintln!(
        "uroce server: control on {addr}:{port}, RDMA device {}; waiting for clients",
        device.describe()
    );
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                eprintln!("uroce server: accept: {e}");
                continue;
            }
        };
        let peer = stream.peer_addr().map_or_else(|_| "?".to_string(), |a| a.to_string());
        let mut client_device = None;
        let outcome = handle(device.as_ref(), addr, stream, &mut client_device);
        // The client's RDMA device, once an RDMA test named it, beside its control address.
        let who =
            client_device.map_or_else(|| peer.clone(), |d| format!("{peer} (RDMA device {d})"));
        match outcome {
            Ok(()) => eprintln!("uroce server: client {who} done"),
            Err(e) => eprintln!("uroce server: client {who}: {e}"),
        }
    }
    Ok(())
}

/// Serves one client's tests; `device` learns the address of the client's RDMA device.
fn handle(
    rdma: &dyn Device,
    addr: IpAddr,
    stream: TcpStream,
    device: &mut Option<IpAddr>,
) -> Result<(), String> {
    let mut ctl = Control::new(stream).map_err(|e| e.to_string())?;
    let hello = ctl.recv().map_err(|e| e.to_string())?;
    let version = hello.strip_prefix("uroce-perf ").and_then(|v| v.parse::<u32>().ok());
    if version != Some(PROTOCOL_VERSION) {
        let why = match version {
            Some(v) => format!("version mismatch: server speaks {PROTOCOL_VERSION}, client {v}"),
            None => "not a uroce client".to_string(),
        };
        let _ = ctl.send(&format!("error {why}"));
        return Err(why);
    }
    ctl.send(&format!("uroce-perf {PROTOCOL_VERSION}")).map_err(|e| e.to_string())?;
    loop {
        let Ok(line) = ctl.recv() else { return Ok(()) };
        let mut words = line.split(' ');
        if words.next() != Some("run") {
            let _ = ctl.send("error expected `run`");
            return Err(format!("unexpected `{line}`"));
        }
        let name = words.next().unwrap_or("");
        let Some(test) = find(name) else {
            ctl.send(&format!("error unknown test '{name}'")).map_err(|e| e.to_string())?;
            continue;
        };
        let params = Params::from_words(words).and_then(|p| p.check(test).map(|()| p));
        let p = match params {
            Ok(p) => p,
            Err(e) => {
                ctl.send(&format!("error {e}")).map_err(|e| e.to_string())?;
                continue;
            }
        };
        if let Err(e) = run(rdma, addr, &mut ctl, test, &p, device) {
            let _ = ctl.send(&format!("error {e}"));
            return Err(format!("{}: {e}", test.name));
        }
    }
}

/// One test: set up, say `ready`, take the client's `peer`, say `go`, serve until `stop`,
/// report `done` with this side's CPU and what arrived.
fn run(
    rdma: &dyn Device,
    addr: IpAddr,
    ctl: &mut Control,
    test: &TestDef,
    p: &Params,
    device: &mut Option<IpAddr>,
) -> Result<(), String> {
    let e = |e: std::io::Error| e.to_string();
    let stop = AtomicBool::new(false);
    // This side's CPU and time are counted from `go`: setting up (registering and zeroing
    // buffers, creating QPs) is not the test.
    let mut started = None;
    let mut go = |ctl: &mut Control| {
        started = Some((Cpu::now(), super::now()));
        ctl.send("go").map_err(e)
    };
    // What this side's device sent during the test, and through which path: the client sets
    // it beside its own, and says when the two directions went different ways.
    let mut sent_before = None;
    let mut polls = None;
    let (msgs, bytes) = if test.transport.is_none() {
        let listener = Listener::bind(addr, test).map_err(e)?;
        ctl.send(&format!("ready {}", listener.port().map_err(e)?)).map_err(e)?;
        expect_peer(ctl)?;
        go(ctl)?;
        let cpu = p.pin.map(|c| c.1);
        serve_until_stop(ctl, &stop, || {
            super::on_cpu(cpu, || sockets::server(listener, test, p, &stop))
        })?
    } else {
        let (mut side, mine) = Side::new(rdma, test, p)?;
        ctl.send(&format!("ready {}", endpoints_hex(&mine))).map_err(e)?;
        let peers = expect_peer(ctl)?.ok_or("the client sent no endpoint")?;
        *device = peers.first().map(|e| e.gid).or(*device);
        side.connect(&peers)?;
        rdma::server_ready(&side, test)?;
        sent_before = rdma.sent();
        go(ctl)?;
        let cpu = p.pin.map(|c| c.1);
        let served = serve_until_stop(ctl, &stop, || {
            super::on_cpu(cpu, || rdma::server(&mut side, test, p, &stop))
        })?;
        polls = Some(side.polls());
        served
    };
    let (cpu0, t0) = started.ok_or("the test never started")?;
    let cpu = Cpu::now().since(cpu0);
    let secs = t0.elapsed().as_secs_f64();
    let mut done = format!(
        "done user={:.6} sys={:.6} secs={secs:.6} msgs={msgs} bytes={bytes}",
        cpu.user, cpu.sys
    );
    if let Some((udp, shm)) = super::sent_since(sent_before, rdma.sent()) {
        done.push_str(&format!(" udp={udp} shm={shm}"));
    }
    if let Some(polls) = polls {
        done.push_str(&format!(" polls={polls}"));
    }
    ctl.send(&done).map_err(e)
}

/// `peer -` (sockets) or `peer <endpoint hex>,…` (RDMA: one per QP).
fn expect_peer(ctl: &mut Control) -> Result<Option<Vec<uroce::Endpoint>>, String> {
    let line = ctl.recv().map_err(|e| e.to_string())?;
    let rest =
        line.strip_prefix("peer ").ok_or_else(|| format!("expected `peer`, got `{line}`"))?;
    if rest == "-" {
        return Ok(None);
    }
    endpoints_from_hex(rest).map(Some)
}

/// Runs `serve` while a second thread waits for the client's `stop` line and raises `stop`.
fn serve_until_stop(
    ctl: &mut Control,
    stop: &AtomicBool,
    serve: impl FnOnce() -> Result<(u64, u64), String>,
) -> Result<(u64, u64), String> {
    std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let line = ctl.recv();
            stop.store(true, Ordering::Release);
            line
        });
        let result = serve();
        let line = watcher.join().map_err(|_| "the control thread panicked".to_string())?;
        match line {
            Ok(l) if l == "stop" => result,
            Ok(l) => Err(format!("expected `stop`, got `{l}`")),
            Err(e) => Err(e.to_string()),
        }
    })
}
