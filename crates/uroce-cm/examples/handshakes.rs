//! What a handshake costs as connections pile up: two CMs in one process pass MADs directly,
//! establish `N` connections (default 60,000) and print the time per handshake for each
//! tenth of them. Flat columns mean a MAD's cost does not grow with the connections held.
//! Last, the resident memory the connections took, per connection and CM.
//!
//! `cargo run --release -p uroce-cm --example handshakes [N]`

#![allow(clippy::disallowed_methods, reason = "a measurement reads the wall clock; the CMs do not")]

use std::net::IpAddr;
use std::time::Instant as Wall;

use uroce_cm::{AcceptParams, Cm, Config, ConnectParams, Event, Instant};
use uroce_wire::cm::TransportType;
use uroce_wire::{Psn, Qpn};

const SERVICE: u64 = 0x0106_0000_0000_4791;

fn main() {
    let n: u32 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(60_000);
    let a: IpAddr = [10, 0, 0, 1].into();
    let b: IpAddr = [10, 0, 0, 2].into();
    let config = |prefix| {
        let mut c = Config::new(prefix, 0, u64::from(prefix));
        c.max_connections = n as usize + 1;
        c.max_connections_per_remote = n as usize + 1;
        Cm::new(c)
    };
    let (mut active, mut passive) = (config(1), config(2));
    passive.listen(SERVICE, 0).expect("a fresh CM listens");
    let now = Instant::ZERO;
    let rss_before = resident_bytes();
    let tenth = (n / 10).max(1);
    let mut start = Wall::now();
    for k in 0..n {
        let p = ConnectParams {
            remote: b,
            local: a,
            service_id: SERVICE,
            qpn: Qpn::from_masked(k + 1),
            starting_psn: Psn::from_masked(k),
            transport: TransportType::Rc,
            responder_resources: 1,
            initiator_depth: 1,
            path_mtu: 5,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            local_ack_timeout: 14,
            private_data: Vec::new(),
        };
        active.connect(now, &p).expect("below the limit");
        // REQ → REP → RTU, each side's timers consulted after every MAD as a runtime does.
        loop {
            let mut moved = false;
            while let Some((_, mad)) = active.poll_transmit() {
                passive.handle_mad(now, a, &mad);
                moved = true;
            }
            while let Some((_, mad)) = passive.poll_transmit() {
                active.handle_mad(now, b, &mad);
                moved = true;
            }
            while let Some(e) = passive.poll_event() {
                if let Event::Request { id, .. } = e {
                    let p = AcceptParams {
                        qpn: Qpn::from_masked(k + 1),
                        starting_psn: Psn::from_masked(k),
                        responder_resources: 1,
                        initiator_depth: 1,
                        rnr_retry_count: 7,
                        srq: false,
                        private_data: Vec::new(),
                    };
                    passive.accept(now, id, &p).expect("a request just heard");
                    moved = true;
                }
            }
            while let Some(e) = active.poll_event() {
                if let Event::Reply { id, .. } = e {
                    active.ready(id).expect("a reply just heard");
                    moved = true;
                }
            }
            let _ = (active.poll_timeout(), passive.poll_timeout());
            if !moved {
                break;
            }
        }
        if (k + 1) % tenth == 0 {
            let per = start.elapsed().as_secs_f64() * 1e6 / f64::from(tenth);
            println!("{:>7} connections: {per:8.2} µs per handshake", k + 1);
            start = Wall::now();
        }
    }
    assert_eq!(passive.connections(), n as usize);
    let grown = resident_bytes().saturating_sub(rss_before);
    let per = grown as f64 / f64::from(n) / 2.0;
    println!("resident memory: {per:.0} bytes per connection and CM (Linux only)");
}

/// The process's resident memory, from `/proc/self/statm` (0 where there is none).
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}
