//! The sample capture in `samples/` is what `examples::write_sample_pcap` writes today, so the
//! README's demonstration never drifts from the encoder.

#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

#[test]
fn committed_sample_matches_the_encoder() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../samples/rc-conversation.pcap");
    let committed = std::fs::read(path).expect("samples/rc-conversation.pcap");
    let fresh = uroce_wire::examples::write_sample_pcap(Vec::new()).unwrap();
    assert!(
        committed == fresh,
        "samples/rc-conversation.pcap is stale: regenerate it with \
         `cargo run -p uroce-wire --example write_sample -- samples/rc-conversation.pcap`"
    );
}
