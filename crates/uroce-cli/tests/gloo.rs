//! Gloo (Debian's `libgloo-dev`) on uroce: its ring allreduce over its ibverbs transport
//! between two processes, each under `uroce exec` on a device of its own, every element of
//! every iteration checked (`tests/c/gloo_allreduce.cc`), both processes ending cleanly.
//!
//! Needs `libgloo-dev` and `g++`; without them the test says why it skips, and under
//! `CI=true` fails.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use std::path::Path;
use std::process::{Command, Stdio};

use uroce_testkit::{describe, installed};

#[test]
fn gloo_ring_allreduce_over_ibverbs_is_correct_and_ends_cleanly() {
    if !installed(&["g++"], "g++") {
        return;
    }
    let header = Path::new("/usr/include/gloo/transport/ibverbs/device.h");
    if !header.exists() {
        let msg = "Gloo's headers are missing (apt-get install libgloo-dev)";
        assert!(!uroce_testkit::ci(), "{msg}");
        eprintln!("skipped: {msg}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("uroce-gloo-{}", std::process::id()));
    let store = dir.join("store");
    std::fs::create_dir_all(&store).unwrap();
    let prog = dir.join("gloo_allreduce");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/gloo_allreduce.cc");
    let out = Command::new("g++")
        .args(["-O2", "-std=c++17", "-o"])
        .arg(&prog)
        .arg(&src)
        .args(["-lgloo", "-libverbs", "-lpthread"])
        .output()
        .unwrap();
    assert!(out.status.success(), "g++: {}", String::from_utf8_lossy(&out.stderr));
    let lib = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let rank = |r: u32, addr: &str| {
        Command::new(env!("CARGO_BIN_EXE_uroce"))
            .env("UROCE_LIB_DIR", &lib)
            .args(["exec", "--addr", addr, "--"])
            .arg(&prog)
            .arg(r.to_string())
            .arg("2")
            .arg(&store)
            .args(["4096", "50"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (rank(0, "127.0.24.1"), rank(1, "127.0.24.2"));
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(
        a.status.success() && b.status.success(),
        "rank 0: {}\nrank 1: {}",
        describe(&a),
        describe(&b)
    );
    let text = String::from_utf8_lossy(&a.stdout);
    assert!(text.contains("gloo_allreduce: ok, 2 ranks, 4096 floats"), "{}", describe(&a));
    println!("{text}");
    let _ = std::fs::remove_dir_all(dir);
}
