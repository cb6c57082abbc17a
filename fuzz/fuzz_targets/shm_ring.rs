//! The shared-memory ring reader on records a hostile process of the same user wrote: the
//! first 12 bytes place the published span (head, and tail as an offset from it), the rest
//! is the ring's content there. Every packet the reader takes goes to a device with live QPs
//! (`uroce_sim::adversary::Victim`), without an ICRC check when the record says it has
//! none; the reader must never pass the tail or take a packet no record holds, and the device
//! must keep every promise its own fuzz target checks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uroce_sim::adversary::Victim;

fuzz_target!(|data: &[u8]| {
    let Some((span, ring)) = data.split_at_checked(12) else { return };
    let head = u64::from_le_bytes(span[..8].try_into().unwrap_or_default());
    let tail = head
        .wrapping_add(u64::from(u32::from_le_bytes(span[8..12].try_into().unwrap_or_default())));
    let mut victim = Victim::new();
    let mut broken = None;
    let mut sink = |rx: &uroce_engine::RxInfo, p: &[u8], intact: bool| {
        if broken.is_none() {
            broken = victim.receive(rx.src, p, intact).err();
        }
    };
    if let Err(e) = uroce_net::fuzzing::shm_ring(ring, head, tail, &mut sink) {
        panic!("ring reader: {e}");
    }
    if let Some(v) = broken {
        panic!("{v}");
    }
    if let Err(v) = victim.finish() {
        panic!("{v}");
    }
});
