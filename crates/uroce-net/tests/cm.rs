//! The connection manager on real devices: two endpoints (in this process, so on the host's
//! shared-memory path, and once more over UDP only) connect through QP1, the REQ routed by the
//! host's port table and every other message by comm ID; a REQ for a port nobody listens on
//! is rejected.

#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::disallowed_methods, reason = "a test waits on real time")]

use std::net::IpAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use uroce_net::uroce_cm::{AcceptParams, ConnectParams, Event};
use uroce_net::{NetDevice, Options};
use uroce_wire::cm::{TransportType, reason};
use uroce_wire::cma::PortSpace;
use uroce_wire::{Psn, Qpn};

fn open(addr: &str, udp_only: bool) -> (NetDevice, mpsc::Receiver<Event>) {
    let options = Options { udp_only, ..Options::default() };
    let dev = NetDevice::open(addr.parse().unwrap(), options).unwrap();
    let (tx, rx) = mpsc::channel();
    dev.with(|s| {
        s.set_cm_sink(Box::new(move |e| {
            let _ = tx.send(e);
        }));
    });
    (dev, rx)
}

fn next(rx: &mpsc::Receiver<Event>) -> Event {
    rx.recv_timeout(Duration::from_secs(10)).expect("no CM event within 10 s")
}

fn params(remote: IpAddr, local: IpAddr, service_id: u64) -> ConnectParams {
    ConnectParams {
        remote,
        local,
        service_id,
        qpn: Qpn::from_masked(0x11),
        starting_psn: Psn::from_masked(0x1234),
        transport: TransportType::Rc,
        responder_resources: 1,
        initiator_depth: 1,
        path_mtu: 5,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: false,
        local_ack_timeout: 14,
        private_data: b"hello".to_vec(),
    }
}

fn accept_params(private_data: &[u8]) -> AcceptParams {
    AcceptParams {
        qpn: Qpn::from_masked(0x22),
        starting_psn: Psn::from_masked(0x5678),
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        srq: false,
        private_data: private_data.to_vec(),
    }
}

fn handshake(a_addr: &str, b_addr: &str, udp_only: bool) -> (NetDevice, NetDevice) {
    let (a, arx) = open(a_addr, udp_only);
    let (b, brx) = open(b_addr, udp_only);
    let service = PortSpace::Tcp.service_id(0);
    let binding = b.bind_port(PortSpace::Tcp.value(), 0, b.addr()).unwrap();
    let service = service | u64::from(binding.port());
    binding.set_listening(true);
    b.with(|s| s.cm().0.listen(service, 8)).unwrap();
    let started = Instant::now();
    let ida = a.with(|s| {
        let (cm, now) = s.cm();
        cm.connect(now, &params(b.addr(), a.addr(), service))
    });
    let ida = ida.unwrap();
    let Event::Request { id: idb, from, info } = next(&brx) else { panic!("no request") };
    assert_eq!(from, a.addr());
    assert_eq!((info.remote_qpn, &info.private_data[..5]), (Qpn::from_masked(0x11), &b"hello"[..]));
    let accept = accept_params(b"welcome");
    b.with(|s| {
        let (cm, now) = s.cm();
        cm.accept(now, idb, &accept)
    })
    .unwrap();
    let Event::Reply { id, info } = next(&arx) else { panic!("no reply") };
    assert_eq!((id, info.remote_qpn, info.starting_psn), (ida, accept.qpn, accept.starting_psn));
    a.with(|s| s.cm().0.ready(ida)).unwrap();
    assert_eq!(next(&arx), Event::Established { id: ida });
    assert_eq!(next(&brx), Event::Established { id: idb });
    let setup = started.elapsed();
    a.with(|s| {
        let (cm, now) = s.cm();
        cm.disconnect(now, ida)
    })
    .unwrap();
    assert!(matches!(next(&brx), Event::DisconnectRequest { id, .. } if id == idb));
    b.with(|s| {
        let (cm, now) = s.cm();
        cm.disconnect(now, idb)
    })
    .unwrap();
    assert_eq!(next(&arx), Event::Disconnected { id: ida });
    eprintln!("handshake (udp_only={udp_only}): {setup:?}");
    // The comm IDs name the endpoints' slots.
    assert_eq!(ida >> 24, u32::from(a.endpoint_slot().0));
    assert_eq!(idb >> 24, u32::from(b.endpoint_slot().0));

    // Nobody listens on another port: rejected by B's host.
    let unheard = PortSpace::Tcp.service_id(1);
    let id = a.with(|s| {
        let (cm, now) = s.cm();
        cm.connect(now, &params(b.addr(), a.addr(), unheard))
    });
    let id = id.unwrap();
    match next(&arx) {
        Event::Rejected { id: r, reason: why, .. } => {
            assert_eq!((r, why), (id, reason::INVALID_SERVICE_ID));
        }
        other => panic!("{other:?}"),
    }
    (a, b)
}

#[test]
fn endpoints_connect_through_qp1_on_shared_memory() {
    handshake("127.0.14.1", "127.0.14.2", false);
}

#[test]
fn endpoints_connect_through_qp1_over_udp() {
    let (a, b) = handshake("127.0.14.3", "127.0.14.4", true);
    let handed = |d: &NetDevice| d.with(|s| s.counters().udp_gsi_handed_over);
    assert_eq!((handed(&a), handed(&b)), (0, 0), "another address: every MAD through UDP");
}

/// Two endpoints of one address over UDP only (`UROCE_FABRIC=udp`, two processes on one
/// device): their CM messages go to each other through shared memory, not to the port they
/// share, where the sender's own socket may take one and, should the sender exit before it
/// next receives, never forward it (an `rdma_disconnect` just before exit lost its DREQ, and
/// rdma-core's `test_rdmacm_async_traffic_external_qp` hung in one run of three).
#[test]
fn endpoints_of_one_address_hand_their_cm_messages_over_even_over_udp() {
    let (a, b) = handshake("127.0.14.5", "127.0.14.5", true);
    let handed = |d: &NetDevice| d.with(|s| s.counters().udp_gsi_handed_over);
    // REQ, RTU and DREP from A (its second REQ, for a port nobody listens on, has no owner
    // and goes through UDP); REP and DREQ from B.
    assert!(handed(&a) >= 3 && handed(&b) >= 2, "{} {}", handed(&a), handed(&b));
}

/// Run as a child process by [`a_connection_of_a_killed_process_is_released_for_its_peer`]
/// (`UROCE_TEST_VICTIM=ADDR,PEER,SERVICE`; without it, it does nothing): connects from ADDR
/// to the listener at PEER, says "established", and waits to be killed.
#[test]
fn victim_role() {
    let Ok(spec) = std::env::var("UROCE_TEST_VICTIM") else { return };
    let mut it = spec.split(',');
    let (addr, peer) = (it.next().unwrap(), it.next().unwrap().parse().unwrap());
    let service: u64 = it.next().unwrap().parse().unwrap();
    let (a, arx) = open(addr, false);
    let id = a.with(|s| {
        let (cm, now) = s.cm();
        cm.connect(now, &params(peer, a.addr(), service))
    });
    let id = id.unwrap();
    assert!(matches!(next(&arx), Event::Reply { .. }));
    a.with(|s| s.cm().0.ready(id)).unwrap();
    assert_eq!(next(&arx), Event::Established { id });
    println!("established");
    std::thread::sleep(Duration::from_secs(60));
}

/// A process killed while it holds an established connection cannot send the DREQ that the
/// kernel's CM sends for a dying process on a real RNIC; its peer would have waited for
/// `Disconnected` for ever. The connection was in its last will, and the peer, looking at
/// the wills of the dead once a second while it holds connections, hears the release.
#[test]
fn a_connection_of_a_killed_process_is_released_for_its_peer() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let (b, brx) = open("127.0.14.7", false);
    let binding = b.bind_port(PortSpace::Tcp.value(), 0, b.addr()).unwrap();
    let service = PortSpace::Tcp.service_id(0) | u64::from(binding.port());
    binding.set_listening(true);
    b.with(|s| s.cm().0.listen(service, 8)).unwrap();
    let mut victim = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "victim_role", "--nocapture", "--test-threads=1"])
        .env("UROCE_TEST_VICTIM", format!("127.0.14.6,{},{service}", b.addr()))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let Event::Request { id: idb, .. } = next(&brx) else { panic!("no request") };
    let accept = accept_params(b"");
    b.with(|s| {
        let (cm, now) = s.cm();
        cm.accept(now, idb, &accept)
    })
    .unwrap();
    assert_eq!(next(&brx), Event::Established { id: idb });
    let mut said = String::new();
    let mut out = BufReader::new(victim.stdout.take().unwrap());
    while !said.contains("established") {
        said.clear();
        assert!(out.read_line(&mut said).unwrap() > 0, "the victim ended early");
    }
    victim.kill().unwrap(); // SIGKILL: no exit handler runs.
    victim.wait().unwrap();
    let killed = Instant::now();
    assert!(matches!(next(&brx), Event::DisconnectRequest { id, .. } if id == idb));
    eprintln!("released {:?} after the kill", killed.elapsed());
    assert_eq!(b.with(|s| s.counters().cm_released_for_dead), 1);
    // Answered as any release: the DREP goes to the dead endpoint, and B's side ends.
    b.with(|s| {
        let (cm, now) = s.cm();
        cm.disconnect(now, idb)
    })
    .unwrap();
}
