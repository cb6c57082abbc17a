//! The pcap/pcapng reader on arbitrary files: it must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uroce_wire::pcap;

fuzz_target!(|data: &[u8]| {
    if let Ok(frames) = pcap::read_frames(data) {
        for f in frames {
            let _ = f.ip_packet().map(uroce_wire::ip::parse_udp_datagram);
        }
    }
});
