//! What `uroce stat`, `uroce qp` and `uroce capture` share: which endpoints a user asked for,
//! and a clear refusal when they belong to someone else.

use core::net::IpAddr;
use std::io::Write;
use std::sync::OnceLock;

use uroce_net::inspect::{EndpointRef, Host};

/// Exit status when nothing could be looked at (no such device, or not the user's).
pub(crate) const REFUSED: u8 = 2;

/// A device as the user names it: `uroceN` (the Nth configured address) or an address.
pub(crate) fn parse_device(name: &str) -> Result<IpAddr, String> {
    if let Ok(a) = name.parse() {
        return Ok(a);
    }
    let index = name
        .strip_prefix("uroce")
        .and_then(|n| n.parse::<usize>().ok())
        .ok_or_else(|| format!("{name:?} is neither a device name (uroce0, …) nor an address"))?;
    let addrs = uroce_net::config::addresses()?;
    addrs.get(index).copied().ok_or_else(|| {
        format!("{name}: only {} device(s) are configured ({})", addrs.len(), list(&addrs))
    })
}

fn list(addrs: &[IpAddr]) -> String {
    addrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// The name a device has in this configuration, if it has one.
pub(crate) fn device_name(addr: IpAddr) -> Option<String> {
    // Read once: every QP and every line of a report names its device.
    static CONFIGURED: OnceLock<Vec<IpAddr>> = OnceLock::new();
    let addrs = CONFIGURED.get_or_init(|| uroce_net::config::addresses().unwrap_or_default());
    addrs.iter().position(|&a| a == addr).map(|i| format!("uroce{i}"))
}

/// `addr (uroceN)` or just the address.
pub(crate) fn device_label(addr: IpAddr) -> String {
    device_name(addr).map_or_else(|| addr.to_string(), |n| format!("{addr} ({n})"))
}

/// A process's command name (`/proc/PID/comm`).
pub(crate) fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map_or_else(|_| "?".to_owned(), |s| s.trim_end().to_owned())
}

/// The host view and the endpoints of `devices` (every device when empty); or, when there is
/// nothing to look at, the line that says why, on `err` for command `cmd`, and the exit status.
pub(crate) fn select(
    cmd: &str,
    devices: &[IpAddr],
    err: &mut dyn Write,
) -> Result<(Host, Vec<EndpointRef>), u8> {
    let host = Host::open().map_err(|e| {
        let _ = writeln!(err, "uroce {cmd}: cannot read the host directories: {e}");
        REFUSED
    })?;
    let eps = endpoints_of(&host, devices);
    if eps.is_empty() {
        let _ = writeln!(err, "uroce {cmd}: {}", nothing_to_see(&host, devices));
        return Err(REFUSED);
    }
    Ok((host, eps))
}

/// The devices of `eps`, each once, in order.
pub(crate) fn devices_of<'a>(eps: impl Iterator<Item = &'a EndpointRef>) -> Vec<IpAddr> {
    let mut d: Vec<IpAddr> = eps.map(|e| e.addr).collect();
    d.sort_unstable();
    d.dedup();
    d
}

/// The endpoints of `devices` (all when empty).
pub(crate) fn endpoints_of(host: &Host, devices: &[IpAddr]) -> Vec<EndpointRef> {
    host.endpoints()
        .into_iter()
        .filter(|e| devices.is_empty() || devices.contains(&e.addr))
        .collect()
}

/// Why there is nothing: no such device of this user, and whose devices there are.
fn nothing_to_see(host: &Host, devices: &[IpAddr]) -> String {
    let me = nix::unistd::geteuid().as_raw();
    let what = if devices.is_empty() {
        "a uroce device".to_owned()
    } else {
        format!("device {}", list(devices))
    };
    let mut s = format!("no process of uid {me} on this host (network namespace) has {what} open");
    if !host.others().is_empty() {
        let uids: Vec<String> = host.others().iter().map(|(u, _)| u.to_string()).collect();
        s.push_str(&format!(
            "; permission denied for the devices of uid {}: a user sees only the devices \
             and processes they could open themselves (root sees all)",
            uids.join(", ")
        ));
    }
    s
}
