//! Open MPI (Debian's, `pml ucx` and `osc ucx`) on uroce through `uroce exec`: a C program
//! doing ping-pong, allreduce, alltoall and one-sided `MPI_Put`/`MPI_Get`, every result
//! checked (`tests/c/mpi_check.c`), four ranks with two sharing each device — on one host,
//! and on two network namespaces joined by a veth pair on which nftables drops 1 % of the
//! RoCEv2 packets (mpirun reaches each namespace as a host, through an rsh agent that is
//! `ip netns exec`).
//!
//! Needs `openmpi-bin`, `libopenmpi-dev` and, for the namespaces, root, `ip` and `nft`;
//! without them each test says why it skips, and under `CI=true` fails.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use uroce_testkit::{Namespaces, netns_tools_present, run};

fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        let msg = format!("{tool} is not installed (apt-get install openmpi-bin libopenmpi-dev)");
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
        eprintln!("skipped: {msg}");
    }
    found
}

/// The jobs take turns: four spinning ranks each already fill two cores.
fn serial() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A scratch directory of this test process, with the program built in it.
fn workdir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("uroce-mpi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/mpi_check.c");
        let out = Command::new("mpicc.openmpi")
            .args(["-O2", "-o"])
            .arg(dir.join("mpi_check"))
            .arg(&src)
            .output()
            .unwrap();
        assert!(out.status.success(), "mpicc: {}", String::from_utf8_lossy(&out.stderr));
        dir
    })
}

/// A script `name` in the work directory.
fn script(name: &str, body: &str) -> PathBuf {
    let p = workdir().join(name);
    std::fs::write(&p, body).unwrap();
    run("chmod", &["+x", p.to_str().unwrap()]);
    p
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `mpirun` of the checking program under `uroce exec`, each rank through `rank_script`.
fn mpirun(extra: &[&str], rank_script: &Path) -> Output {
    let lib = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    Command::new("timeout")
        .args(["300", "mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "-np", "4"])
        .args(extra)
        .args(["--mca", "pml", "ucx", "--mca", "osc", "ucx", "--mca", "btl", "^openib,uct"])
        .args(["-x", "UCX_TLS=rc_verbs,ud_verbs", "-x", "UROCE_LIB_DIR"])
        .arg(rank_script)
        .arg(workdir().join("mpi_check"))
        .arg("1024")
        .env("UROCE_LIB_DIR", lib)
        .output()
        .unwrap()
}

#[test]
fn open_mpi_over_ucx_runs_four_ranks_two_per_device() {
    if !have("mpirun.openmpi") || !have("mpicc.openmpi") {
        return;
    }
    let _turn = serial();
    let uroce = env!("CARGO_BIN_EXE_uroce");
    // Ranks 0 and 1 on one device, 2 and 3 on the other.
    let rank = script(
        "rank-host.sh",
        &format!(
            "#!/bin/sh\nexec {uroce} exec --addr 127.0.21.$((1 + OMPI_COMM_WORLD_RANK / 2)) -- \"$@\"\n"
        ),
    );
    let o = mpirun(&[], &rank);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("mpi_check: ok 4 ranks"), "{}", text(&o));
    println!("{out}");
}

#[test]
fn open_mpi_over_ucx_runs_across_two_namespaces_with_one_percent_loss() {
    if !netns_tools_present() || !have("mpirun.openmpi") || !have("mpicc.openmpi") {
        return;
    }
    let _turn = serial();
    let ns = Namespaces::new('p', &["10.202.0.1/24"], &["10.202.0.2/24"]);
    // mpirun's own channel to each namespace's daemon: a veth pair from this namespace.
    let id = std::process::id() % 100_000;
    for (i, n) in [&ns.a, &ns.b].into_iter().enumerate() {
        let (here, there) = (format!("po{i}{id}"), format!("pi{i}{id}"));
        run("ip", &["link", "add", &here, "type", "veth", "peer", "name", &there, "netns", n]);
        run("ip", &["addr", "add", &format!("10.203.{i}.254/24"), "dev", &here]);
        run("ip", &["link", "set", &here, "up"]);
        run("ip", &["-n", n, "addr", "add", &format!("10.203.{i}.1/24"), "dev", &there]);
        run("ip", &["-n", n, "link", "set", &there, "up"]);
        run("ip", &["-n", n, "route", "add", "10.203.0.0/16", "via", &format!("10.203.{i}.254")]);
    }
    ns.set_loss(1);
    let agent = script(
        "nsagent.sh",
        "#!/bin/sh\n# mpirun's rsh agent: its hosts are network namespaces.\n\
         host=$1; shift\nexec ip netns exec \"$host\" sh -c \"$*\"\n",
    );
    let uroce = env!("CARGO_BIN_EXE_uroce");
    // Each rank's device is its namespace's address on the lossy pair.
    let rank = script(
        "rank-ns.sh",
        &format!(
            "#!/bin/sh\na=$(ip -o -4 addr show | sed -n 's/.* \\(10\\.202\\.0\\.[0-9]*\\)\\/.*/\\1/p')\n\
             exec {uroce} exec --addr \"$a\" -- \"$@\"\n"
        ),
    );
    let hosts = format!("{}:2,{}:2", ns.a, ns.b);
    let agent = agent.to_str().unwrap();
    let o = mpirun(
        &[
            "--host",
            &hosts,
            "--mca",
            "plm_rsh_agent",
            agent,
            "--mca",
            "plm_rsh_no_tree_spawn",
            "1",
            "--mca",
            "routed",
            "direct",
            "--mca",
            "oob_tcp_if_include",
            "10.203.0.0/16",
        ],
        &rank,
    );
    let dropped = ns.dropped();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("mpi_check: ok 4 ranks"), "{}", text(&o));
    assert!(dropped > 0, "nftables dropped nothing: the loss was not exercised");
    println!("{out}nftables dropped {dropped} RoCEv2 packets");
}
