//! The CM MAD parser and the CM state machine: arbitrary bytes as a MAD must parse or be
//! refused, and what parses must re-encode to bytes that parse to the same message; then the
//! input drives two CMs through an adversarial network (`uroce_sim::cm_adversary`), where any
//! broken promise is a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uroce_wire::cm::CmMad;
use uroce_wire::mad::MAD_LEN;

fuzz_target!(|data: &[u8]| {
    let mut mad = [0u8; MAD_LEN];
    let n = data.len().min(MAD_LEN);
    mad[..n].copy_from_slice(&data[..n]);
    if let Ok(m) = CmMad::parse(&mad) {
        let bytes = m.to_bytes().expect("a parsed message encodes");
        let again = CmMad::parse(&bytes).expect("an encoded message parses");
        assert_eq!(again, m);
    }
    let _ = uroce_cm::answer_unclaimed(&mad);
    if let Err(v) = uroce_sim::cm_adversary::run(data) {
        panic!("{v}");
    }
});
