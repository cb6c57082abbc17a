//! The device's side of connection management: RDMA CM ports bound across the host, and the
//! node GUID the CM names the device by. The CM itself (`uroce_cm::Cm`, one per endpoint) runs
//! in the device's progress: MADs to QP1 that the host fabric routes to this endpoint go into
//! it, its timers run with the engine's, and what it sends leaves from QP1
//! ([`crate::State::cm`]).

use core::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use crate::host::{HostDir, SlotId};
use crate::ports::BindError;

/// A bound RDMA CM port; unbound when dropped.
#[derive(Debug)]
pub struct PortBinding {
    service_id: u64,
    addr: IpAddr,
    place: Place,
}

#[derive(Debug)]
enum Place {
    /// In the host's port table.
    Host { dir: Arc<HostDir>, owner: SlotId, entry: usize },
    /// A device private to this process: in the process's own table.
    Local,
}

/// Ports bound on devices private to this process (no host directory).
static LOCAL: Mutex<Vec<(u64, IpAddr)>> = Mutex::new(Vec::new());

pub(crate) fn bind(
    endpoint: Option<(Arc<HostDir>, SlotId)>,
    space: u16,
    port: u16,
    addr: IpAddr,
) -> Result<PortBinding, BindError> {
    if let Some((dir, owner)) = endpoint {
        // A port is held while its endpoint's process runs: one killed without unbinding
        // frees its ports as soon as it is gone, not when its slot is taken over.
        let live = |i: u8| dir.running_generation(i);
        let (service_id, entry) = dir.ports.bind(owner, space, port, addr, &live)?;
        return Ok(PortBinding { service_id, addr, place: Place::Host { dir, owner, entry } });
    }
    let mut local = LOCAL.lock().unwrap_or_else(PoisonError::into_inner);
    let overlaps = |a: IpAddr| a == addr || a.is_unspecified() || addr.is_unspecified();
    let service_of = |p: u16| (u64::from(space) << 16) | u64::from(p);
    let service_id = if port == 0 {
        (32768..=60999u16)
            .map(service_of)
            .find(|&s| !local.iter().any(|&(t, a)| t == s && overlaps(a)))
            .ok_or(BindError::Exhausted)?
    } else {
        let s = service_of(port);
        if local.iter().any(|&(t, a)| t == s && overlaps(a)) {
            return Err(BindError::InUse);
        }
        s
    };
    local.push((service_id, addr));
    Ok(PortBinding { service_id, addr, place: Place::Local })
}

impl PortBinding {
    /// The service ID bound: port space in bits 16–31, port in 0–15.
    pub const fn service_id(&self) -> u64 {
        self.service_id
    }

    /// The port bound.
    pub const fn port(&self) -> u16 {
        (self.service_id & 0xFFFF) as u16
    }

    /// The address bound (maybe a wildcard).
    pub const fn addr(&self) -> IpAddr {
        self.addr
    }

    /// Marks the port listening (REQs for it on this host come to this endpoint) or not.
    pub fn set_listening(&self, listening: bool) {
        if let Place::Host { dir, owner, entry } = &self.place {
            dir.ports.set_listening(*entry, *owner, listening);
        }
    }
}

impl Drop for PortBinding {
    fn drop(&mut self) {
        match &self.place {
            Place::Host { dir, owner, entry } => dir.ports.unbind(*entry, *owner),
            Place::Local => {
                let mut local = LOCAL.lock().unwrap_or_else(PoisonError::into_inner);
                local.retain(|&(s, a)| (s, a) != (self.service_id, self.addr));
            }
        }
    }
}

/// The node (and CA) GUID of the device at `addr`: the EUI-64 style rxe derives from the
/// interface's MAC, here from the address — 0x02 (locally administered), 0, and the GID's
/// last six bytes.
pub fn node_guid(addr: IpAddr) -> u64 {
    let g = uroce_cm::gid(addr);
    let mut b = [0u8; 8];
    b[0] = 0x02;
    b[2..].copy_from_slice(&g[10..]);
    u64::from_be_bytes(b)
}
