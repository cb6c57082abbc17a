//! Unmodified rdma-core and perftest programs on the drop-in `libibverbs.so.1`: server on
//! 127.0.0.2, client on 127.0.0.3, each its own process with `LD_LIBRARY_PATH` pointing at the
//! library this build made. Also: the exported symbol set against Debian's real library, and a
//! C program checking error completions through the ABI.
//!
//! Needs `ibverbs-utils` and `perftest` (and `libibverbs-dev` for the C program); without them
//! each test says why it skips, and under `CI=true` fails.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Side, have, lib_dir, pair, serial, verbs_cmd};

const SERVER: Side<'static> = Side { prefix: &[], addr: "127.0.0.2", env: &[] };
const CLIENT: Side<'static> = Side { prefix: &[], addr: "127.0.0.3", env: &[] };
/// The TCP port the rdma-core examples and perftest exchange addresses on.
const PORT: u16 = 18515;

fn run_alone(prog: &str, addr: &str, args: &[&str]) -> common::Outcome {
    let child = common::start(&mut verbs_cmd(&[], &[], prog, addr, args));
    common::finish(child, Duration::from_secs(20))
}

#[test]
fn ibv_devices_and_devinfo_show_the_configured_devices() {
    if !have("ibv_devinfo", "ibverbs-utils") {
        return;
    }
    let _turn = serial();
    let list = run_alone("ibv_devices", "127.0.0.2,127.0.0.3", &[]);
    assert!(list.ok(), "{list}");
    assert!(list.stdout.contains("uroce0") && list.stdout.contains("uroce1"), "{list}");
    // Node GUIDs come from the addresses.
    assert!(list.stdout.contains("0200ffff7f000002"), "{list}");

    // `ibv_devices` without UROCE_ADDR, reading the config file `config` names (or the default).
    let unconfigured = |config: Option<&std::path::Path>| {
        let mut cmd = Command::new("ibv_devices");
        cmd.env("LD_LIBRARY_PATH", lib_dir()).env_remove("UROCE_ADDR").env_remove("UROCE_CONFIG");
        if let Some(file) = config {
            cmd.env("UROCE_CONFIG", file);
        }
        let out = cmd.output().unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (text(&out.stdout), text(&out.stderr))
    };
    let (_, stderr) = unconfigured(None);
    if !std::path::Path::new("/etc/uroce/devices").exists() {
        assert!(stderr.contains("no device configured"), "{stderr}");
    }

    // The same from a config file.
    let dir = lib_dir().join("config-test");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("devices");
    std::fs::write(&file, "# uroce devices\n127.0.0.2\n127.0.0.3  # the second\n").unwrap();
    let (out, _) = unconfigured(Some(&file));
    assert!(out.contains("uroce0") && out.contains("uroce1"), "{out}");
    std::fs::write(&file, "127.0.0.2\nnot-an-address\n").unwrap();
    let (_, err) = unconfigured(Some(&file));
    assert!(err.contains("\"not-an-address\" is not an IP address"), "{err}");

    let info = run_alone("ibv_devinfo", "127.0.0.2", &["-v"]);
    assert!(info.ok(), "{info}");
    for want in [
        "hca_id:\turoce0",
        "state:\t\t\tPORT_ACTIVE (4)",
        "active_mtu:\t\t4096 (5)",
        "link_layer:\t\tEthernet",
        "GID[  0]:\t\t::ffff:127.0.0.2, RoCE v2",
        "atomic_cap:\t\t\tATOMIC_HCA (1)",
        "max_qp_rd_atom:\t\t\t16",
    ] {
        assert!(info.stdout.contains(want), "missing {want:?} in\n{info}");
    }
    println!("{}", info.stdout);
}

/// Runs an rdma-core example as a pair and checks both sides report their throughput.
fn pingpong(prog: &str, args: &[&str]) {
    let (s, c) = pair(prog, args, &SERVER, &CLIENT, PORT, Duration::from_secs(120));
    for (side, o) in [("server", &s), ("client", &c)] {
        assert!(o.ok(), "{prog} {args:?} {side}: {o}");
        assert!(o.stdout.contains(" Mbit/sec") && o.stdout.contains(" usec/iter"), "{o}");
    }
    println!("{prog} {args:?}:\n{}", c.stdout);
}

/// `ibv_rc_pingpong -t`: an extended CQ with completion timestamps. The pingpong prints the
/// average device-clock ticks between receive completions; at `hca_core_clock` 1 GHz that is
/// nanoseconds, and it must describe the same iterations its own wall clock timed (the
/// deltas add up to the span from the first receive to the last), not a constant or zero.
fn completion_timestamps_time_the_pingpong() {
    let args = ["-g", "0", "-t", "-n", "2000"];
    let (s, c) = pair("ibv_rc_pingpong", &args, &SERVER, &CLIENT, PORT, Duration::from_secs(120));
    for (side, o) in [("server", &s), ("client", &c)] {
        assert!(o.ok(), "ibv_rc_pingpong -t {side}: {o}");
        // "<label> = <value>[ <unit>]" on the line that names `unit` (or `label`).
        let value = |label: &str, unit: &str| -> f64 {
            let line = o.stdout.lines().find(|l| l.contains(label) && l.contains(unit));
            let line = line.unwrap_or_else(|| panic!("no {label:?} in:\n{o}"));
            let after = line.rsplit(" = ").next().unwrap().trim_end_matches(unit).trim();
            after.parse().unwrap_or_else(|_| panic!("{line}"))
        };
        let ticks = value("Average receive completion clock cycles", "");
        let usec = value(" iters in ", "usec/iter");
        let ratio = ticks / (usec * 1000.0);
        println!("ibv_rc_pingpong -t {side}: {ticks:.0} ns between receives, {usec} usec/iter");
        assert!((0.5..2.0).contains(&ratio), "{side}: {ticks} ticks against {usec} us:\n{o}");
    }
}

#[test]
fn rdma_core_pingpongs_run_unmodified() {
    if !have("ibv_rc_pingpong", "ibverbs-utils") {
        return;
    }
    let _turn = serial();
    pingpong("ibv_rc_pingpong", &["-g", "0"]);
    pingpong("ibv_rc_pingpong", &["-g", "0", "-e"]);
    pingpong("ibv_rc_pingpong", &["-g", "0", "-s", "65536", "-n", "10000"]);
    completion_timestamps_time_the_pingpong();
    // On-demand paging: explicit (-o), implicit (-O) and with prefetch (-P).
    pingpong("ibv_rc_pingpong", &["-g", "0", "-o"]);
    pingpong("ibv_rc_pingpong", &["-g", "0", "-o", "-O", "-P"]);
    pingpong("ibv_uc_pingpong", &["-g", "0"]);
    pingpong("ibv_ud_pingpong", &["-g", "0"]);
    pingpong("ibv_ud_pingpong", &["-g", "0", "-e"]);
    pingpong("ibv_srq_pingpong", &["-g", "0"]);
    pingpong("ibv_srq_pingpong", &["-g", "0", "-e"]);
    // XRC: a domain named by a file, an XRC SRQ, a target and an initiator QP per side.
    for args in
        [&["-g", "0", "-n", "500"][..], &["-g", "0", "-e"], &["-g", "0", "-o", "-s", "65536"]]
    {
        let (s, c) =
            pair("ibv_xsrq_pingpong", args, &SERVER, &CLIENT, PORT, Duration::from_secs(60));
        for (side, o) in [("server", &s), ("client", &c)] {
            assert!(
                o.ok() && o.stdout.contains("success"),
                "ibv_xsrq_pingpong {args:?} {side}: {o}"
            );
        }
    }
}

/// The host-wide device: two `ibv_rc_pingpong` servers share 127.0.0.2 (each on its own TCP
/// port), two clients share 127.0.0.3, all four running at once.
#[test]
fn two_servers_share_one_address_and_two_clients_another() {
    if !have("ibv_rc_pingpong", "ibverbs-utils") {
        return;
    }
    let _turn = serial();
    let ports = ["18601", "18602"];
    let args = |p: &'static str| ["-g", "0", "-p", p, "-n", "1000"];
    let servers: Vec<_> = ports
        .iter()
        .map(|p| common::start(&mut verbs_cmd(&[], &[], "ibv_rc_pingpong", "127.0.0.2", &args(p))))
        .collect();
    for p in ports {
        assert!(common::wait_listening(&[], p.parse().unwrap()), "server on {p} never listened");
    }
    // A third process opens the same device meanwhile (it used to fail: the port was taken).
    let info = run_alone("ibv_devinfo", "127.0.0.2", &[]);
    assert!(info.ok() && info.stdout.contains("PORT_ACTIVE"), "{info}");
    let clients: Vec<_> = ports
        .iter()
        .map(|p| {
            let mut a = args(p).to_vec();
            a.push("127.0.0.2");
            common::start(&mut verbs_cmd(&[], &[], "ibv_rc_pingpong", "127.0.0.3", &a))
        })
        .collect();
    let limit = Duration::from_secs(60);
    let outcomes: Vec<_> =
        clients.into_iter().chain(servers).map(|c| common::finish(c, limit)).collect();
    for o in &outcomes {
        assert!(o.ok() && o.stdout.contains("1000 iters"), "{o}");
    }
    println!("{}{}", outcomes[0].stdout, outcomes[1].stdout);
}

#[test]
fn a_refused_verb_is_explained_on_request() {
    if !have("ibv_rc_pingpong", "ibverbs-utils") {
        return;
    }
    let _turn = serial();
    // Without -g the example addresses its peer by LID alone: RoCE needs the GID (as on a
    // RoCE NIC, where modify_qp to RTR fails the same way).
    let mut server = verbs_cmd(&[], &[], "ibv_rc_pingpong", SERVER.addr, &[]);
    server.env("UROCE_VERBS_DEBUG", "1");
    let srv = common::start(&mut server);
    assert!(common::wait_listening(&[], PORT), "the server never listened");
    let cli =
        common::start(&mut verbs_cmd(&[], &[], "ibv_rc_pingpong", CLIENT.addr, &[SERVER.addr]));
    let c = common::finish(cli, Duration::from_secs(20));
    let s = common::finish(srv, Duration::from_secs(20));
    // The server connects its QP first, fails, and hangs up on the client.
    assert!(!c.ok() && !s.ok(), "{c}\n{s}");
    assert!(s.stderr.contains("Failed to modify QP to RTR"), "{s}");
    assert!(s.stderr.contains("uroce: ibv_modify_qp: ah_attr: RoCE needs is_global = 1"), "{s}");
}

/// Rows of a perftest result table: lines that start with a message size.
fn table_rows(out: &str) -> usize {
    out.lines()
        .filter(|l| l.split_whitespace().next().is_some_and(|w| w.parse::<u64>().is_ok()))
        .count()
}

fn perftest(prog: &str, args: &[&str], rows: usize) {
    let mut all = vec!["-x", "0"];
    all.extend_from_slice(args);
    let (s, c) = pair(prog, &all, &SERVER, &CLIENT, PORT, Duration::from_secs(180));
    assert!(c.ok(), "{prog} {args:?} client: {c}");
    assert!(s.ok(), "{prog} {args:?} server: {s}");
    assert!(c.stdout.contains("#bytes"), "{c}");
    assert!(table_rows(&c.stdout) >= rows, "{prog} {args:?}: expected {rows} rows:\n{c}");
    // perftest fell back to the standard verbs: uroce does not offer the ibv_wr_* API.
    assert!(c.stdout.contains("ibv_wr* API     : OFF"), "{c}");
    let table: Vec<&str> = c.stdout.lines().skip_while(|l| !l.contains("#bytes")).collect();
    println!("{prog} {}:\n{}", all.join(" "), table.join("\n"));
}

#[test]
fn perftest_rc_runs_with_default_sizes_and_all_sizes() {
    if !have("ib_send_lat", "perftest") {
        return;
    }
    let _turn = serial();
    for prog in [
        "ib_send_lat",
        "ib_send_bw",
        "ib_write_lat",
        "ib_write_bw",
        "ib_read_lat",
        "ib_read_bw",
        "ib_atomic_lat",
        "ib_atomic_bw",
    ] {
        perftest(prog, &[], 1);
    }
    // Every size from 2 bytes to 8 MiB (23 rows); fewer iterations keep the run short.
    for prog in
        ["ib_send_lat", "ib_send_bw", "ib_write_lat", "ib_write_bw", "ib_read_lat", "ib_read_bw"]
    {
        perftest(prog, &["-a", "-n", "20"], 23);
    }
}

/// The progress-thread options (uroce-net `Options::from_env`) through the drop-in: a
/// real-time progress thread for `ib_write_lat`, one that never spins (spinning for a trickle
/// is the default) for `ib_read_lat`.
#[test]
fn perftest_with_progress_thread_options() {
    if !have("ib_write_lat", "perftest") {
        return;
    }
    let _turn = serial();
    let spin = ["UROCE_PROGRESS_SPIN_US=0"];
    let (server, client) = (Side { env: &spin, ..SERVER }, Side { env: &spin, ..CLIENT });
    let args = ["-x", "0"];
    let (s, c) = pair("ib_read_lat", &args, &server, &client, PORT, Duration::from_secs(120));
    assert!(c.ok() && s.ok() && table_rows(&c.stdout) >= 1, "{c}\n{s}");

    let env = ["UROCE_PROGRESS_RT=1"];
    let server = Side { env: &env, ..SERVER };
    let client = Side { env: &env, ..CLIENT };
    let args = ["-x", "0", "-s", "8192"];
    let (s, c) = pair("ib_write_lat", &args, &server, &client, PORT, Duration::from_secs(120));
    assert!(c.ok() && s.ok(), "{c}\n{s}");
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if root {
        // Permitted, so it took effect: no warning.
        assert!(!c.stderr.contains("SCHED_OTHER") && !s.stderr.contains("SCHED_OTHER"), "{c}\n{s}");
    }
    let table: Vec<&str> = c.stdout.lines().skip_while(|l| !l.contains("#bytes")).collect();
    println!("ib_write_lat -s 8192, UROCE_PROGRESS_RT=1:\n{}", table.join("\n"));
}

#[test]
fn perftest_uc_and_ud_run() {
    if !have("ib_send_lat", "perftest") {
        return;
    }
    let _turn = serial();
    for prog in ["ib_send_lat", "ib_send_bw", "ib_write_lat", "ib_write_bw"] {
        perftest(prog, &["-c", "UC"], 1);
    }
    for prog in ["ib_send_lat", "ib_send_bw"] {
        perftest(prog, &["-c", "UD"], 1);
    }
}

/// The version nodes a library defines, in order. (Only the names: the real library also
/// records each node's parent, which the dynamic loader never reads and rustc's default
/// linker, lld, does not write.)
fn version_nodes(path: &str) -> Vec<String> {
    let out = Command::new("objdump").args(["-p", path]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.lines()
        .skip_while(|l| !l.starts_with("Version definitions"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("Version References"))
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| l.split_whitespace().last().unwrap_or("").to_string())
        .collect()
}

#[test]
fn exports_every_symbol_and_version_of_the_real_library() {
    let real = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";
    if !std::path::Path::new(real).exists() {
        assert!(
            !common::ci(),
            "Debian's libibverbs1 is required under CI (apt-get install -y libibverbs1)"
        );
        eprintln!("SKIPPED: no {real} to compare with (apt-get install -y libibverbs1)");
        return;
    }
    if !have("objdump", "binutils") {
        return;
    }
    let ours = lib_dir().join("libibverbs.so.1");
    let ours = ours.to_str().unwrap();
    let want = common::dynamic_symbols(real);
    let have = common::dynamic_symbols(ours);
    let missing: Vec<_> = want.difference(&have).collect();
    let extra: Vec<_> = have.difference(&want).collect();
    assert!(missing.is_empty() && extra.is_empty(), "missing {missing:?}\nextra {extra:?}");
    assert!(want.len() > 150, "{} symbols", want.len());
    assert_eq!(version_nodes(ours), version_nodes(real));
    let soname = Command::new("objdump").args(["-p", ours]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&soname.stdout).contains("SONAME               libibverbs.so.1")
    );
}

#[test]
fn error_completions_through_the_abi() {
    let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
    if !header.exists() {
        assert!(!common::ci(), "libibverbs-dev is required under CI");
        eprintln!("SKIPPED: no <infiniband/verbs.h> (apt-get install -y libibverbs-dev)");
        return;
    }
    let _turn = serial();
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/verbs_errors.c");
    let exe = lib_dir().join("verbs_errors");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc)
        .args(["-Wall", "-Wextra", "-Werror", "-O2", "-o"])
        .arg(&exe)
        .arg(src)
        .args(["-libverbs", "-lpthread"])
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let o = run_alone(exe.to_str().unwrap(), "127.0.0.2,127.0.0.3", &[]);
    assert!(o.ok(), "{o}");
    println!("{}", o.stdout);
}
