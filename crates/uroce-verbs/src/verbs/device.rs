//! The devices: the list from `UROCE_ADDR` or the config file, names, GUIDs.

use super::*;

/// A device: one configured address.
#[repr(C)]
pub(crate) struct Device {
    pub(super) ibv: IbvDevice,
    pub(super) addr: IpAddr,
    pub(super) index: c_int,
    /// Node GUID, as the value `ibv_get_device_guid` returns (big-endian in memory).
    pub(super) guid_be: u64,
}

/// Every device, built once from the configuration. They live as long as the process.
pub(super) fn devices() -> &'static [&'static Device] {
    static DEVICES: OnceLock<Vec<&'static Device>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let addrs = uroce_net::config::addresses().unwrap_or_else(|msg| {
            eprintln!("{msg}");
            Vec::new()
        });
        addrs
            .into_iter()
            .enumerate()
            .map(|(i, addr)| {
                let name = format!("uroce{i}");
                let dev: &'static Device = Box::leak(Box::new(Device {
                    ibv: IbvDevice {
                        ops: [None, None],
                        node_type: IBV_NODE_CA,
                        transport_type: IBV_TRANSPORT_IB,
                        // As libibverbs fills them for kernel device i (`uverbsI`, and its
                        // sysfs directories), which `uroce exec` makes real.
                        name: c_string(&name),
                        dev_name: c_string(&format!("uverbs{i}")),
                        dev_path: c_string(&format!("/sys/class/infiniband_verbs/uverbs{i}")),
                        ibdev_path: c_string(&format!("/sys/class/infiniband/{name}")),
                    },
                    addr,
                    index: c_int::try_from(i).unwrap_or(c_int::MAX),
                    // The device's CM sends the same GUID in its REQs and REPs.
                    guid_be: uroce_net::node_guid(addr).to_be(),
                }));
                dev
            })
            .collect()
    })
}

/// Ours, if `p` is one of our devices (checked by address: nothing is dereferenced).
pub(super) fn device_of(p: *mut IbvDevice) -> Option<&'static Device> {
    devices().iter().copied().find(|d| ptr::eq(&d.ibv, p))
}

/// The runtime devices open in this process, shared by every context on the same address (a
/// UDP port can be bound once).
///
/// Each is the process's that opened it: a child of `fork(2)` inherits the parent's devices
/// without their progress threads, as the parent's endpoints on the host, so it opens its own
/// (as on a real RNIC, where a child cannot use its parent's contexts but may open new ones).
/// The inherited ones are never used, and dropping one leaves the parent's endpoint alone (its
/// release checks the pid).
pub(super) fn open_net(addr: IpAddr) -> Result<Arc<NetDevice>, c_int> {
    static OPEN: Mutex<Vec<(u32, IpAddr, Weak<NetDevice>)>> = Mutex::new(Vec::new());
    let me = std::process::id();
    let mut open = lock(&OPEN);
    open.retain(|(pid, _, w)| *pid == me && w.strong_count() > 0);
    if let Some(net) = open.iter().find(|(_, a, _)| *a == addr).and_then(|(_, _, w)| w.upgrade()) {
        return Ok(net);
    }
    let options = Options::from_env().map_err(|e| {
        eprintln!("uroce: {e}");
        libc::EINVAL
    })?;
    let net = NetDevice::open(addr, options).map_err(|e| {
        eprintln!("uroce: cannot open the device of {addr}: {e}");
        match e {
            OpenError::AddressInUse(_) => libc::EADDRINUSE,
            OpenError::AddressNotAvailable(_) => libc::EADDRNOTAVAIL,
            _ => libc::EIO,
        }
    })?;
    let net = Arc::new(net);
    open.push((me, addr, Arc::downgrade(&net)));
    Ok(net)
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_get_device_list(
    num_devices: *mut c_int,
) -> *mut *mut IbvDevice {
    let devs = devices();
    let n = c_int::try_from(devs.len()).unwrap_or(c_int::MAX);
    if !num_devices.is_null() {
        // SAFETY: the caller passes a valid int or NULL (checked); ibv_get_device_list(3)
        // always sets it.
        unsafe { *num_devices = n };
    }
    let mut list: Vec<*mut IbvDevice> =
        devs.iter().map(|d| ptr::from_ref(&d.ibv).cast_mut()).collect();
    list.push(null_mut());
    Box::into_raw(list.into_boxed_slice()).cast()
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn uroce_verbs_free_device_list(list: *mut *mut IbvDevice) {
    if list.is_null() {
        return;
    }
    let mut len = 0;
    // SAFETY: `list` came from `ibv_get_device_list`: NULL-terminated, so every read up to and
    // including the terminator is inside the allocation.
    while !unsafe { *list.wrapping_add(len) }.is_null() {
        len += 1;
    }
    let slice = ptr::slice_from_raw_parts_mut(list, len + 1);
    // SAFETY: allocated by `ibv_get_device_list` as a boxed slice of exactly `len + 1`.
    drop(unsafe { Box::from_raw(slice) });
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_get_device_name(
    device: *mut IbvDevice,
) -> *const c_char {
    device_of(device).map_or(ptr::null(), |d| d.ibv.name.as_ptr())
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_get_device_guid(device: *mut IbvDevice) -> u64 {
    device_of(device).map_or(0, |d| d.guid_be)
}

#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn uroce_verbs_get_device_index(device: *mut IbvDevice) -> c_int {
    device_of(device).map_or(-1, |d| d.index)
}
