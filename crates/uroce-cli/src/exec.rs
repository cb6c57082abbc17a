//! `uroce exec [--addr ADDR,…] -- COMMAND [ARGS]`: runs an unmodified program on uroce. The
//! drop-in `libibverbs.so.1` and `librdmacm.so.1` come first in its library path, `UROCE_ADDR`
//! names its devices, and in a mount namespace of its own it finds the device view RDMA
//! software looks for beside the library ([`view`]): `/dev/infiniband/uverbs<i>` and
//! `rdma_cm` (bind mounts of `/dev/null`: character devices it may open read-write, which is
//! what UCX checks) and `/sys/class/infiniband/…`, `/sys/class/infiniband_verbs/…`.
//!
//! `/dev` and `/sys/class` become tmpfs copies of themselves, every original entry bind-mounted
//! back, so nothing else changes for the program and nothing changes for the host. As root the
//! namespace is a mount namespace; otherwise a user namespace too, mapping the caller to itself
//! (which needs unprivileged user namespaces: `kernel.unprivileged_userns_clone=1`, or
//! `user.max_user_namespaces` above 0).

mod view;

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};
use nix::unistd::{getegid, geteuid};

pub(crate) const USAGE: &str = "\
uroce exec [--addr ADDR[,ADDR…]] -- COMMAND [ARGS]

Runs COMMAND on uroce: the drop-in libibverbs.so.1 and librdmacm.so.1 first in its library
path, its devices those of --addr (default: UROCE_ADDR, or /etc/uroce/devices), and, in a mount
namespace of its own, /dev/infiniband/uverbs<i> and /sys/class/infiniband/uroce<i> as a
soft-RoCE device shows them. Without root it also needs an unprivileged user namespace.";

/// Parses the arguments, prepares the process and replaces it with the command; returns only
/// with what went wrong.
pub(crate) fn run(args: Vec<OsString>) -> String {
    let mut args = args.into_iter();
    let mut command: Vec<OsString> = Vec::new();
    let mut addr: Option<String> = None;
    while let Some(a) = args.next() {
        match a.to_str() {
            Some("--") => {
                command.extend(args.by_ref());
                break;
            }
            Some("--addr") => match args.next().and_then(|v| v.into_string().ok()) {
                Some(v) => addr = Some(v),
                None => return "uroce exec: --addr needs an address list".into(),
            },
            Some("-h" | "--help") => return USAGE.into(),
            _ => {
                // The command starts at the first argument that is not an option of ours.
                command.push(a);
                command.extend(args.by_ref());
                break;
            }
        }
    }
    let Some((program, program_args)) = command.split_first() else {
        return format!("uroce exec: no command\n\n{USAGE}");
    };
    let addrs = match &addr {
        Some(list) => uroce_net::config::parse(list, "--addr"),
        None => uroce_net::config::addresses(),
    };
    let addrs = match addrs {
        Ok(a) => a,
        Err(e) => return e,
    };
    let devices: Vec<view::Device> = addrs
        .iter()
        .enumerate()
        .map(|(index, &addr)| view::Device { index, addr, netdev: uroce_net::interface_of(addr) })
        .collect();
    let libs = match drop_in_dir() {
        Ok(d) => d,
        Err(e) => return e,
    };
    if let Err(e) = enter_namespace().and_then(|()| make_view(&devices)) {
        return format!("uroce exec: {e}");
    }
    let mut path = libs.into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let err = std::process::Command::new(program)
        .args(program_args)
        .env("LD_LIBRARY_PATH", path)
        .env(uroce_net::config::ENV, join(&addrs))
        .exec();
    format!("uroce exec: {}: {err}", Path::new(program).display())
}

fn join(addrs: &[core::net::IpAddr]) -> String {
    addrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

/// The directory holding `libibverbs.so.1` and `librdmacm.so.1` links to the drop-in
/// libraries built beside this executable (`UROCE_LIB_DIR` names another place to find them).
fn drop_in_dir() -> Result<PathBuf, String> {
    let base = match std::env::var_os("UROCE_LIB_DIR") {
        Some(d) => PathBuf::from(d),
        None => std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf))
            .ok_or("uroce exec: cannot tell where this executable is")?,
    };
    let verbs = base.join("liburoce_verbs.so");
    let cm = base.join("liburoce_rdmacm.so");
    // Both or nothing: without the drop-in librdmacm the system's would load, find the
    // device view's /dev/infiniband/rdma_cm (no kernel CM behind it) and wait forever.
    if let Some(missing) = [&verbs, &cm].into_iter().find(|l| !l.exists()) {
        return Err(format!(
            "uroce exec: {} is missing: build the drop-in libraries (cargo build --release \
             --workspace) or name their directory in UROCE_LIB_DIR",
            missing.display()
        ));
    }
    // The caller's own directory: the build's may not be theirs to write.
    let build = {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        base.hash(&mut h);
        h.finish()
    };
    let dir = std::env::temp_dir().join(format!("uroce-exec-lib-{}-{build:016x}", geteuid()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("uroce exec: {}: {e}", dir.display()))?;
    let mine = std::fs::symlink_metadata(&dir)
        .is_ok_and(|m| m.is_dir() && std::os::unix::fs::MetadataExt::uid(&m) == geteuid().as_raw());
    if !mine {
        return Err(format!("uroce exec: {} is not a directory of this user's", dir.display()));
    }
    for (name, target) in [("libibverbs.so.1", &verbs), ("librdmacm.so.1", &cm)] {
        // Made under a private name and renamed: processes starting together do not race.
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(target, &tmp)
            .and_then(|()| std::fs::rename(&tmp, dir.join(name)))
            .map_err(|e| format!("uroce exec: {}: {e}", dir.join(name).display()))?;
    }
    Ok(dir)
}

/// A mount namespace (and, without root, a user namespace mapping the caller to itself),
/// whose mounts do not propagate back to the host.
fn enter_namespace() -> Result<(), String> {
    let (uid, gid) = (geteuid(), getegid());
    if uid.is_root() {
        unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare(CLONE_NEWNS): {e}"))?;
    } else {
        unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS).map_err(|e| {
            format!(
                "unshare(CLONE_NEWUSER | CLONE_NEWNS): {e}: without root, uroce exec needs \
                 unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, \
                 user.max_user_namespaces > 0)"
            )
        })?;
        let write = |f: &str, s: String| std::fs::write(f, s).map_err(|e| format!("{f}: {e}"));
        write("/proc/self/setgroups", "deny".into())?;
        write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
        write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    }
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(|e| format!("making / private: {e}"))
}

fn bind(from: &Path, to: &Path, recursive: bool) -> Result<(), String> {
    let flags = if recursive { MsFlags::MS_BIND | MsFlags::MS_REC } else { MsFlags::MS_BIND };
    mount(Some(from), to, None::<&str>, flags, None::<&str>)
        .map_err(|e| format!("bind {} on {}: {e}", from.display(), to.display()))
}

fn tmpfs(at: &Path) -> Result<(), String> {
    mount(Some("uroce"), at, Some("tmpfs"), MsFlags::MS_NOSUID, Some("mode=0755"))
        .map_err(|e| format!("tmpfs on {}: {e}", at.display()))
}

/// Replaces `dir` by a tmpfs holding what it held: each entry of the original (seen through
/// `orig`, a bind mount of it) bind-mounted back, symbolic links copied.
fn shadow(dir: &Path, orig: &Path) -> Result<(), String> {
    bind(dir, orig, true)?;
    tmpfs(dir)?;
    let io = |e: std::io::Error| format!("{}: {e}", dir.display());
    for entry in std::fs::read_dir(orig).map_err(io)? {
        let entry = entry.map_err(io)?;
        let (from, to) = (entry.path(), dir.join(entry.file_name()));
        let kind = entry.file_type().map_err(io)?;
        if kind.is_symlink() {
            let target = std::fs::read_link(&from).map_err(io)?;
            std::os::unix::fs::symlink(target, &to).map_err(io)?;
        } else if kind.is_dir() {
            std::fs::create_dir(&to).map_err(io)?;
            bind(&from, &to, true)?;
        } else {
            std::fs::File::create(&to).map_err(io)?;
            bind(&from, &to, false)?;
        }
    }
    Ok(())
}

/// Writes the device view into this namespace's `/dev` and `/sys/class`.
fn make_view(devices: &[view::Device]) -> Result<(), String> {
    let stage = std::env::temp_dir().join(format!("uroce-exec-{}", std::process::id()));
    std::fs::create_dir_all(&stage).map_err(|e| format!("{}: {e}", stage.display()))?;
    tmpfs(&stage)?;
    let io = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    let (old_dev, old_class) = (stage.join("dev"), stage.join("class"));
    for d in [&old_dev, &old_class] {
        std::fs::create_dir(d).map_err(|e| io(d, e))?;
    }
    shadow(Path::new("/dev"), &old_dev)?;
    shadow(Path::new("/sys/class"), &old_class)?;
    let ib = Path::new("/dev/infiniband");
    std::fs::create_dir_all(ib).map_err(|e| io(ib, e))?;
    for name in view::dev_nodes(devices) {
        let node = ib.join(name);
        std::fs::File::create(&node).map_err(|e| io(&node, e))?;
        bind(&old_dev.join("null"), &node, false)?;
    }
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let class = Path::new("/sys/class");
    for (rel, node) in view::sys_class(devices, cpus) {
        let p = class.join(rel);
        let r = match node {
            view::Node::Dir => std::fs::create_dir_all(&p),
            view::Node::File(text) => std::fs::write(&p, text),
            view::Node::Link(target) => std::os::unix::fs::symlink(target, &p),
        };
        r.map_err(|e| io(&p, e))?;
    }
    // The originals stay reachable through the bind mounts made from them; the stage goes.
    umount2(&stage, MntFlags::MNT_DETACH).map_err(|e| format!("{}: {e}", stage.display()))?;
    let _ = std::fs::remove_dir(&stage);
    Ok(())
}
