//! `uroce exec`: unmodified programs see uroce devices the way they see a soft-RoCE device.
//! UCX (Debian's `ucx-utils`) lists `rc_verbs` and `ud_verbs` on each device and runs its
//! perftest over them, between two processes each in its own `uroce exec`, with no UCX
//! variable but `UCX_TLS`; the view matches what the verbs report; the host's `/dev` and
//! `/sys` are left as they were; an unprivileged user gets the same view.
//!
//! Needs `ucx-utils`; without it each test says why it skips, and under `CI=true` fails.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(
    clippy::disallowed_methods,
    reason = "tests run real programs: they wait by the wall clock"
)]

use std::path::PathBuf;
use std::process::{Command, Stdio};

use std::time::Duration;
use uroce_testkit::{describe, installed};

fn have(tool: &str) -> bool {
    installed(&[tool], "ucx-utils")
}

/// Where `cargo test` built the drop-in libraries: beside this test's executable.
fn lib_dir() -> PathBuf {
    std::env::current_exe().unwrap().parent().unwrap().to_path_buf()
}

fn exec(addr: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_uroce"));
    c.env("UROCE_LIB_DIR", lib_dir()).args(["exec", "--addr", addr, "--"]);
    c
}

#[test]
fn ucx_lists_rc_and_ud_verbs_on_every_device_and_the_view_matches_the_verbs() {
    if !have("ucx_info") {
        return;
    }
    let host_had_it = std::path::Path::new("/dev/infiniband").exists();
    let o = exec("127.0.20.1,127.0.20.2").args(["ucx_info", "-d"]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", describe(&o));
    for dev in ["uroce0:1", "uroce1:1"] {
        for tl in ["rc_verbs", "ud_verbs"] {
            let listed = out
                .split("#      Transport: ")
                .any(|s| s.starts_with(tl) && s.contains(&format!("Device: {dev}")));
            assert!(listed, "{tl} on {dev} not listed:\n{out}");
        }
    }
    // The view, against what ibv_devinfo reads through the verbs in the same namespace.
    let script = "ibv_devinfo -d uroce1 | sed -n 's/.*node_guid:[[:space:]]*//p'; \
                  cat /sys/class/infiniband/uroce1/node_guid \
                      /sys/class/infiniband/uroce1/ports/1/gid_attrs/types/0 \
                      /sys/class/infiniband/uroce1/ports/1/gids/0 \
                      /sys/class/infiniband_verbs/uverbs1/ibdev; \
                  stat -c %F /dev/infiniband/uverbs1";
    let o = exec("127.0.20.1,127.0.20.2").args(["sh", "-c", script]).output().unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    let lines: Vec<String> =
        String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 6, "{}", describe(&o));
    assert_eq!(lines[0], lines[1], "node GUID: the verbs and sysfs differ");
    assert_eq!(lines[2], "RoCE v2");
    assert_eq!(lines[3], "0000:0000:0000:0000:0000:ffff:7f00:1402");
    assert_eq!(lines[4], "uroce1");
    assert_eq!(lines[5], "character special file");
    // Nothing of it reached the host.
    assert_eq!(std::path::Path::new("/dev/infiniband").exists(), host_had_it);
    assert!(!std::path::Path::new("/sys/class/infiniband/uroce1").exists());
}

/// One `ucx_perftest` run: the server on 127.0.20.3, the client on 127.0.20.4, each in its
/// own `uroce exec`. Returns the client's "Final:" line.
fn perftest(tls: &str, port: u16, args: &[&str]) -> String {
    let p = port.to_string();
    let server = exec("127.0.20.3")
        .env("UCX_TLS", tls)
        .args(["timeout", "120", "ucx_perftest", "-p", &p])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The server listens on its TCP port for the client's exchange.
    let mut client = None;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(50));
        let o = exec("127.0.20.4")
            .env("UCX_TLS", tls)
            .args(["timeout", "60", "ucx_perftest", "-p", &p, "127.0.0.1", "-n", "2000"])
            .args(args)
            .output()
            .unwrap();
        // ucx_perftest reports a refused connect on standard output, not standard error.
        let refused = [&o.stdout, &o.stderr]
            .iter()
            .any(|b| String::from_utf8_lossy(b).contains("Connection refused"));
        if !refused {
            client = Some(o);
            break;
        }
    }
    let server = server.wait_with_output().unwrap();
    let client = client.expect("the server never listened");
    let out = String::from_utf8_lossy(&client.stdout).to_string();
    assert!(
        client.status.success() && server.status.success(),
        "UCX_TLS={tls} ucx_perftest {args:?}:\n{}\n--- server\n{}",
        describe(&client),
        String::from_utf8_lossy(&server.stderr)
    );
    let last = out.lines().find(|l| l.starts_with("Final:")).unwrap_or_default().to_string();
    assert!(!last.is_empty(), "no result:\n{out}");
    last
}

#[test]
fn ucx_perftest_runs_over_rc_and_ud_verbs() {
    if !have("ucx_perftest") {
        return;
    }
    let mut port = 13501;
    let mut run = |tls: &str, args: &[&str]| {
        port += 1;
        let r = perftest(tls, port, args);
        println!("UCX_TLS={tls} {}: {r}", args.join(" "));
    };
    for t in [
        "tag_lat",
        "tag_bw",
        "ucp_put_bw",
        "ucp_get",
        "ucp_am_lat",
        "stream_bw",
        "ucp_fadd",
        "ucp_cswap",
    ] {
        run("rc_verbs,ud_verbs", &["-t", t]);
    }
    for t in ["tag_lat", "tag_bw", "ucp_am_lat", "stream_bw"] {
        run("ud_verbs", &["-t", t]);
    }
    // The transport level: UCT itself over each.
    for t in [["-t", "am_lat"], ["-t", "put_bw"], ["-t", "fadd"]] {
        run("rc_verbs", &[&["-x", "rc_verbs", "-d", "uroce0:1"][..], &t[..]].concat());
    }
    run("rc_verbs", &["-x", "rc_verbs", "-d", "uroce0:1", "-t", "get", "-D", "bcopy"]);
    run("ud_verbs", &["-x", "ud_verbs", "-d", "uroce0:1", "-t", "am_lat"]);
}

#[test]
fn an_unprivileged_user_gets_the_same_view_in_a_user_namespace() {
    if !installed(&["setpriv"], "util-linux") {
        return;
    }
    if !Command::new("id").arg("-u").output().unwrap().stdout.starts_with(b"0\n") {
        eprintln!("skipped: needs root to become another user");
        return;
    }
    let uroce = env!("CARGO_BIN_EXE_uroce");
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", uroce, "exec", "--addr"])
        .args(["127.0.20.5", "--", "sh", "-c"])
        .arg(
            "id -u; cat /sys/class/infiniband/uroce0/ports/1/gid_attrs/types/0; \
              test -c /dev/infiniband/uverbs0 && test -w /dev/infiniband/uverbs0 && echo ok",
        )
        .env("UROCE_LIB_DIR", lib_dir())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "65534\nRoCE v2\nok\n", "{}", describe(&o));
}

#[test]
fn a_command_that_cannot_run_is_named() {
    let o = exec("127.0.20.6").arg("/nonexistent/program").output().unwrap();
    assert_eq!(o.status.code(), Some(127));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("uroce exec: /nonexistent/program: No such file"), "{err}");
    let o = Command::new(env!("CARGO_BIN_EXE_uroce"))
        .args(["exec", "--addr", "not-an-address", "--", "true"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("\"not-an-address\" is not an IP address"));
}
