//! The adversarial schedules of `uroce_sim::adversary` over seeded inputs: the same checks the
//! `engine` fuzz target makes, run on every test run, with a floor on what the schedules reach
//! so that a change that stops them reaching the transport (every packet refused, nothing
//! completing) fails here rather than passing quietly.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::cast_possible_truncation, reason = "values drawn below the target type's range")]

use uroce_engine::seeded::Rng;
use uroce_sim::adversary::{self, Reached};
use uroce_sim::cm_adversary;

/// Inputs per run (each up to 600 bytes: a few dozen operations); about a second.
const INPUTS: u64 = 4_000;

/// A seeded input: mostly small bytes (operation codes and offsets that land where they
/// matter), some of any value.
fn input(seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let len = rng.gen_range(0..600) as usize;
    (0..len)
        .map(|_| {
            if rng.gen_bool(0.7) { rng.gen_range(0..16) as u8 } else { rng.gen_range(0..256) as u8 }
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn seeded_schedules_keep_every_promise() {
    let mut total = Reached::default();
    for seed in 0..INPUTS {
        let input = input(seed);
        match adversary::run(&input) {
            Ok(r) => total += r,
            Err(v) => panic!("seed {seed}: {v}\ninput: {}", hex(&input)),
        }
    }
    eprintln!("{total:?}");
    assert!(total.successes > INPUTS, "{total:?}");
    assert!(total.errors > INPUTS / 10, "{total:?}");
    assert!(total.flushes > INPUTS / 10, "{total:?}");
    assert!(total.refused > INPUTS, "{total:?}");
}

#[test]
fn seeded_cm_schedules_keep_every_promise() {
    let mut total = cm_adversary::Reached::default();
    for seed in 0..INPUTS {
        let input = input(seed);
        match cm_adversary::run(&input) {
            Ok(r) => total += r,
            Err(v) => panic!("seed {seed}: {v}\ninput: {}", hex(&input)),
        }
    }
    eprintln!("{total:?}");
    assert!(total.established > INPUTS, "{total:?}");
    assert!(total.rejected > INPUTS / 10, "{total:?}");
    assert!(total.unreachable > INPUTS / 10, "{total:?}");
}

/// Every input a fuzz target ever failed on, kept under `tests/regressions/<target>/`: each
/// must now pass.
#[test]
fn inputs_that_once_broke_a_promise_keep_them() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/regressions");
    let mut ran = 0;
    for (target, run) in [
        ("engine", (|i: &[u8]| adversary::run(i).map(drop)) as fn(&[u8]) -> Result<(), _>),
        ("cm", |i: &[u8]| cm_adversary::run(i).map(drop)),
    ] {
        let mut files: Vec<_> =
            std::fs::read_dir(dir.join(target)).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        for f in files {
            let input = std::fs::read(&f).unwrap();
            if let Err(v) = run(&input) {
                panic!("{}: {v}", f.display());
            }
            ran += 1;
        }
    }
    assert!(ran >= 2, "the regression inputs are missing");
}
