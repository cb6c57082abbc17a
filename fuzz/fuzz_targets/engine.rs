//! Two devices and an adversarial network between them (`uroce_sim::adversary`): the input
//! chooses the verbs and each packet's fate; any broken promise (a packet counted twice or
//! not at all, a write outside a region, a completion twice or out of order, a QP left
//! waiting once the network heals) is a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(v) = uroce_sim::adversary::run(data) {
        panic!("{v}");
    }
});
