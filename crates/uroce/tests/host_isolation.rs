//! What the host-wide device promises beyond the wire: another user can neither read nor write
//! a device's shared memory nor join its port, and devices open in several idle processes cost
//! next to no CPU: with QPs connected and nothing to do, every progress thread sleeps without
//! a deadline. (Its own test binary, so no other test's work is counted as idle CPU.)
//!
//! Both re-run this executable in another role (`UROCE_TEST_ROLE`).
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::disallowed_methods, reason = "the idle test measures two seconds of wall time")]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Stdio};
use std::time::Duration;

use uroce::{Access, Context, Error, OpenError, QpType, WcStatus};

const ROLE: &str = "UROCE_TEST_ROLE";

/// The host directory of user `uid` in this network namespace (where the runtime puts it).
fn host_dir(uid: u32) -> std::path::PathBuf {
    let netns = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
    format!("/dev/shm/uroce-{uid}-{netns}").into()
}

/// As another user: the owner's segments cannot be opened, the directory not listed, and the
/// device's port not joined.
#[test]
fn intruder_role() {
    if std::env::var(ROLE).as_deref() != Ok("intruder") {
        return;
    }
    let dir = std::path::PathBuf::from(std::env::var("UROCE_TEST_DIR").unwrap());
    let e = std::fs::read_dir(&dir).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "listing {}", dir.display());
    let e = std::fs::OpenOptions::new().read(true).open(dir.join("slots-2")).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "opening the slots");
    let addr = std::env::var("UROCE_TEST_ADDR").unwrap().parse().unwrap();
    match Context::open(addr) {
        Err(Error::Open(OpenError::AddressInUse(_))) => {}
        other => panic!("another user opened the device: {:?}", other.map(|c| c.addr())),
    }
    println!("intruder refused");
}

#[test]
fn another_user_cannot_reach_the_segments_or_the_port() {
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let setpriv =
        Command::new("setpriv").arg("--version").output().is_ok_and(|o| o.status.success());
    if !root || !setpriv {
        assert!(!uroce_testkit::ci(), "this test needs root and setpriv (util-linux) under CI");
        eprintln!("SKIPPED: needs root and setpriv (util-linux) to run a process as nobody");
        return;
    }
    let addr = "127.0.10.2";
    let ctx = Context::open(addr.parse().unwrap()).unwrap();
    let dir = host_dir(0);
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{}", dir.display());
    // The test executable may sit where nobody cannot reach: run a copy from /tmp.
    let copy = std::env::temp_dir().join(format!("uroce-intruder-{}", std::process::id()));
    std::fs::copy(std::env::current_exe().unwrap(), &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(&copy)
        .args(["--exact", "intruder_role", "--nocapture"])
        .env(ROLE, "intruder")
        .env("UROCE_TEST_DIR", &dir)
        .env("UROCE_TEST_ADDR", addr)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&copy);
    let _ = std::fs::remove_dir_all(host_dir(65534));
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("intruder refused"), "{text}");
    drop(ctx);
}

/// An idle process: both devices open, QPs of every type connected, one WRITE done, then
/// nothing until its standard input closes.
#[test]
fn idle_role() {
    if std::env::var(ROLE).as_deref() != Ok("idle") {
        return;
    }
    let a = Context::open("127.0.10.3".parse().unwrap()).unwrap();
    let b = Context::open("127.0.10.4".parse().unwrap()).unwrap();
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let mut qps = Vec::new();
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let (qa, qb) = (pa.qp(t, &ca).build().unwrap(), pb.qp(t, &cb).build().unwrap());
        qa.connect(&qb.endpoint()).unwrap();
        qb.connect(&qa.endpoint()).unwrap();
        qps.push((qa, qb));
    }
    let mr = pa.register(4096, Access::LOCAL_WRITE).unwrap();
    let target = pb.register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    qps[0].0.write(1, &mr, 0..4096, target.remote()).unwrap();
    assert_eq!(ca.wait_one(Some(Duration::from_secs(10))).unwrap().status, WcStatus::SUCCESS);
    println!("ready");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// CPU time of a process so far (user + system), from /proc.
fn cpu_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    let f: Vec<u64> =
        rest.split_whitespace().skip(11).take(2).map(|x| x.parse().unwrap()).collect();
    // Clock ticks: 100 per second on Linux (USER_HZ).
    Duration::from_millis((f[0] + f[1]) * 10)
}

#[test]
fn idle_devices_in_four_processes_use_under_one_percent_of_a_core() {
    let mut children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "idle_role", "--nocapture"])
                .env(ROLE, "idle")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in &mut children {
        let mut r = BufReader::new(c.stdout.as_mut().unwrap());
        let mut line = String::new();
        while !line.contains("ready") {
            line.clear();
            assert!(r.read_line(&mut line).unwrap() > 0, "an idle process ended early");
        }
    }
    let before: Vec<Duration> = children.iter().map(|c| cpu_of(c.id())).collect();
    let span = Duration::from_secs(3);
    std::thread::sleep(span);
    let used: Duration = children.iter().zip(&before).map(|(c, b)| cpu_of(c.id()) - *b).sum();
    for mut c in children {
        drop(c.stdin.take());
        assert!(c.wait().unwrap().success());
    }
    eprintln!(
        "4 idle processes, 8 device endpoints, for {span:?}: {used:?} of CPU ({:.2} % of a core)",
        used.as_secs_f64() / span.as_secs_f64() * 100.0
    );
    assert!(used < span / 100, "idle processes used {used:?} of CPU in {span:?}");
}
