//! What the tests of the drop-in library share: the library's directory, tool checks, and
//! running a verbs program as a server and a client.
#![allow(dead_code, reason = "each test file uses part of this module")]
#![allow(
    clippy::disallowed_methods,
    reason = "tests run real programs: they wait for them by the wall clock"
)]
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

pub(crate) use uroce_testkit::ci;

/// Whether `tool` can run; if not, says why the test skips (or fails under CI).
pub(crate) fn have(tool: &str, package: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(!ci(), "{tool} is required under CI (apt-get install -y {package})");
        eprintln!("SKIPPED: {tool} not found (apt-get install -y {package})");
    }
    found
}

/// A directory holding `libibverbs.so.1`: a link to the library this build made.
pub(crate) fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // The test executable is target/<profile>/deps/<name>; `cargo test` builds the library
        // beside it (and copies it up to target/<profile> only on `cargo build`).
        let exe = std::env::current_exe().unwrap();
        let deps = exe.parent().unwrap();
        let so = deps.join("liburoce_verbs.so");
        assert!(so.exists(), "{} not built", so.display());
        let dir = deps.parent().unwrap().join("uroce-verbs-lib");
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("libibverbs.so.1");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&so, &link).unwrap();
        // The drop-in librdmacm.so.1, where the tests that use it have built it.
        let cm = deps.join("liburoce_rdmacm.so");
        if cm.exists() {
            let link = dir.join("librdmacm.so.1");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&cm, &link).unwrap();
        }
        dir
    })
}

/// Tests that bind the device addresses and TCP ports take turns.
pub(crate) fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A command running a verbs program on the drop-in library with `UROCE_ADDR=addr` and the
/// `K=V` settings of `env`.
pub(crate) fn verbs_cmd(
    prefix: &[&str],
    env: &[&str],
    prog: &str,
    addr: &str,
    args: &[&str],
) -> Command {
    let mut all: Vec<&str> = prefix.to_vec();
    all.push("env");
    let lib = format!("LD_LIBRARY_PATH={}", lib_dir().display());
    let dev = format!("UROCE_ADDR={addr}");
    all.push(&lib);
    all.push(&dev);
    all.extend_from_slice(env);
    all.push(prog);
    all.extend_from_slice(args);
    let mut cmd = Command::new(all[0]);
    cmd.args(&all[1..]).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

/// What a program printed and how it ended (`None`: killed at the deadline).
pub(crate) struct Outcome {
    pub(crate) status: Option<ExitStatus>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Outcome {
    pub(crate) fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "status {:?}\n--- stdout\n{}--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// A program started with its output drained as it comes: a program that prints more than
/// a pipe holds would otherwise stall on its next write until someone reads.
pub(crate) struct Running {
    child: Child,
    stdout: std::thread::JoinHandle<String>,
    stderr: std::thread::JoinHandle<String>,
}

impl Running {
    /// Whether the program still runs.
    pub(crate) fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

/// SIGKILL to the child's process group.
fn kill_group(child: &Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) of a process group this test created; no memory is involved.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut p) = pipe {
            let mut bytes = Vec::new();
            let _ = p.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        text
    })
}

/// Starts `cmd` (its stdout and stderr piped, as [`verbs_cmd`] sets them) in a process group
/// of its own, so that what it forks (fio's job processes) ends with it.
pub(crate) fn start(cmd: &mut Command) -> Running {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    Running { child, stdout, stderr }
}

/// Waits for a program up to `limit`, killing it then.
pub(crate) fn finish(mut r: Running, limit: Duration) -> Outcome {
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = r.child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() >= deadline {
            kill_group(&r.child);
            let _ = r.child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // What the program left running (and holding its output open) goes with it.
    kill_group(&r.child);
    let output = |h: std::thread::JoinHandle<String>| {
        let until = Instant::now() + Duration::from_secs(5);
        while !h.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        if h.is_finished() { h.join().unwrap_or_default() } else { "(output still open)".into() }
    };
    Outcome { status, stdout: output(r.stdout), stderr: output(r.stderr) }
}

/// Whether some socket listens on TCP `port` (any namespace-local address), from
/// `/proc/net/tcp` of the namespace `prefix` runs in.
fn listening(prefix: &[&str], port: u16) -> bool {
    let mut all: Vec<&str> = prefix.to_vec();
    all.extend_from_slice(&["cat", "/proc/net/tcp", "/proc/net/tcp6"]);
    let out = Command::new(all[0]).args(&all[1..]).output().unwrap();
    let port = format!(":{port:04X}");
    String::from_utf8_lossy(&out.stdout).lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[1].ends_with(&port) && f[3] == "0A"
    })
}

/// Waits up to 10 s for a listener on TCP `port`; whether one came.
pub(crate) fn wait_listening(prefix: &[&str], port: u16) -> bool {
    let start = Instant::now();
    while !listening(prefix, port) {
        if start.elapsed() > Duration::from_secs(10) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Where each side of a pair runs: a command prefix (`ip netns exec NS`, or nothing) and the
/// device address.
pub(crate) struct Side<'a> {
    pub(crate) prefix: &'a [&'a str],
    pub(crate) addr: &'a str,
    /// `K=V` settings for the program.
    pub(crate) env: &'a [&'a str],
}

/// Runs `prog args` as a server on `server`, waits for it to listen on `port`, then as a client
/// on `client` connecting to the server's address; both limited to `limit`.
pub(crate) fn pair(
    prog: &str,
    args: &[&str],
    server: &Side<'_>,
    client: &Side<'_>,
    port: u16,
    limit: Duration,
) -> (Outcome, Outcome) {
    let srv = start(&mut verbs_cmd(server.prefix, server.env, prog, server.addr, args));
    if !wait_listening(server.prefix, port) {
        let s = finish(srv, Duration::ZERO);
        panic!("{prog} server never listened on {port}:\n{s}");
    }
    let mut cargs = args.to_vec();
    cargs.push(server.addr);
    let cli = start(&mut verbs_cmd(client.prefix, client.env, prog, client.addr, &cargs));
    let c = finish(cli, limit);
    let s = finish(srv, if c.status.is_some() { Duration::from_secs(10) } else { Duration::ZERO });
    (s, c)
}

/// Runs an rdma_cm server (`server_args`) and then its client (`client_args`), both limited
/// to `limit`. An RDMA CM server listens on no TCP port to wait for, so a client that fails
/// within 5 s while the server still runs (its REQ came before the server listened, and was
/// rejected) is started again, for up to 20 s.
pub(crate) fn cm_pair(
    prog: &str,
    server_args: &[&str],
    client_args: &[&str],
    server: &Side<'_>,
    client: &Side<'_>,
    limit: Duration,
) -> (Outcome, Outcome) {
    cm_pair_unless(prog, server_args, client_args, server, client, limit, &|_| false)
}

/// [`cm_pair`], but a client failure for which `server_stuck` holds is not retried: the server
/// has gone past the point a new client could meet it, and the caller decides.
pub(crate) fn cm_pair_unless(
    prog: &str,
    server_args: &[&str],
    client_args: &[&str],
    server: &Side<'_>,
    client: &Side<'_>,
    limit: Duration,
    server_stuck: &dyn Fn(&Outcome) -> bool,
) -> (Outcome, Outcome) {
    let mut srv = start(&mut verbs_cmd(server.prefix, server.env, prog, server.addr, server_args));
    let began = Instant::now();
    std::thread::sleep(Duration::from_millis(200));
    let mut earlier = String::new();
    let c = loop {
        let t = Instant::now();
        let cli = start(&mut verbs_cmd(client.prefix, client.env, prog, client.addr, client_args));
        let mut c = finish(cli, limit);
        let early = !c.ok() && t.elapsed() < Duration::from_secs(5);
        if early && began.elapsed() < Duration::from_secs(20) && srv.running() && !server_stuck(&c)
        {
            let at = t - began;
            earlier.push_str(&format!("--- an attempt {at:?} after the server started:\n{c}\n"));
            std::thread::sleep(Duration::from_millis(300));
            continue;
        }
        c.stderr.push_str(&earlier);
        break c;
    };
    let ended = c.status.is_some() && !server_stuck(&c);
    let s = finish(srv, if ended { Duration::from_secs(10) } else { Duration::ZERO });
    (s, c)
}

/// Defined dynamic symbols as `name version` (hidden versions in parentheses), without the
/// `Base` ones and without the absolute symbols naming each version node (the linker's
/// bookkeeping; the nodes themselves are compared from the version definitions).
pub(crate) fn dynamic_symbols(path: &str) -> BTreeSet<String> {
    let out = Command::new("objdump").args(["-T", path]).output().unwrap();
    assert!(out.status.success(), "objdump -T {path}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.contains("*UND*") && (l.contains(" DF ") || l.contains(" DO ")))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (ver, name) = (f[f.len() - 2], f[f.len() - 1]);
            (ver != "Base" && ver != name).then(|| format!("{name} {ver}"))
        })
        .collect()
}
