//! The device view RDMA software looks for beside libibverbs, as the kernel shows it for a
//! soft-RoCE (rxe) device: `/sys/class/infiniband/<dev>/…`, `/sys/class/infiniband_verbs/…` and
//! the `/dev/infiniband/uverbs<i>` nodes. UCX, for one, lists a device only if its node is a
//! character device it may open read-write, and reads the RoCE version and the netdev of each
//! GID from sysfs (`gid_attrs/types/<i>`, `gid_attrs/ndevs/<i>`). Every value is the one the
//! drop-in `libibverbs.so.1` reports through the verbs for the same device.

use core::net::IpAddr;
use std::path::PathBuf;

/// One device: its index (`uroce<i>`, `uverbs<i>`), address and the interface holding it.
#[derive(Debug, Clone)]
pub(crate) struct Device {
    pub(crate) index: usize,
    pub(crate) addr: IpAddr,
    pub(crate) netdev: Option<String>,
}

/// An entry of the view, relative to the directory it goes in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
    Dir,
    /// A file and its contents.
    File(String),
    /// A symbolic link to this target.
    Link(String),
}

/// The kernel's rendering of a GUID or GID: 16-bit groups in hex, colon-separated.
fn groups(bytes: &[u8]) -> String {
    bytes
        .chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c.get(1).unwrap_or(&0)))
        .collect::<Vec<_>>()
        .join(":")
}

/// The GID of an address as RoCEv2 writes it (IPv4-mapped for IPv4).
fn gid(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// uverbs character devices: major 231, minors from 192 (`IB_UVERBS_BASE_MINOR`).
const UVERBS_MAJOR: u32 = 231;
const UVERBS_BASE_MINOR: usize = 192;

/// The entries under `/sys/class` for `devices`, on a host of `cpus` CPUs.
pub(crate) fn sys_class(devices: &[Device], cpus: usize) -> Vec<(PathBuf, Node)> {
    let mut v: Vec<(PathBuf, Node)> = Vec::new();
    let mut put = |p: String, n: Node| v.push((PathBuf::from(p), n));
    let file = |s: &str| Node::File(format!("{s}\n"));
    put("infiniband".into(), Node::Dir);
    put("infiniband_verbs".into(), Node::Dir);
    // The uverbs ABI libibverbs 44 speaks.
    put("infiniband_verbs/abi_version".into(), file("6"));
    let cpu_mask = local_cpus(cpus);
    for d in devices {
        let name = format!("uroce{}", d.index);
        let dev = format!("infiniband/{name}");
        let guid = groups(&uroce_net::node_guid(d.addr).to_be_bytes());
        put(dev.clone(), Node::Dir);
        // ibv_query_device: IBV_NODE_CA, the node GUID the device's CM also sends.
        put(format!("{dev}/node_type"), file("1: CA"));
        put(format!("{dev}/node_guid"), file(&guid));
        put(format!("{dev}/sys_image_guid"), file(&guid));
        put(format!("{dev}/fw_ver"), file(concat!("uroce ", env!("CARGO_PKG_VERSION"))));
        put(format!("{dev}/hw_rev"), file("0x0"));
        put(format!("{dev}/node_desc"), file(&format!("{name} (uroce, {})", d.addr)));
        put(format!("{dev}/device"), Node::Dir);
        put(format!("{dev}/device/numa_node"), file("-1"));
        put(format!("{dev}/device/local_cpus"), file(&cpu_mask));
        if let Some(nd) = &d.netdev {
            put(format!("{dev}/device/net"), Node::Dir);
            put(format!("{dev}/device/net/{nd}"), Node::Link(format!("/sys/class/net/{nd}")));
        }
        let port = format!("{dev}/ports/1");
        put(format!("{dev}/ports"), Node::Dir);
        put(port.clone(), Node::Dir);
        // ibv_query_port: active, Ethernet, 1X QDR, no LIDs, one GID and one P_Key.
        put(format!("{port}/state"), file("4: ACTIVE"));
        put(format!("{port}/phys_state"), file("5: LinkUp"));
        put(format!("{port}/link_layer"), file("Ethernet"));
        put(format!("{port}/rate"), file("10 Gb/sec (1X QDR)"));
        put(format!("{port}/lid"), file("0x0"));
        put(format!("{port}/sm_lid"), file("0x0"));
        put(format!("{port}/lid_mask_count"), file("0"));
        put(format!("{port}/cap_mask"), file("0x00000000"));
        for sub in ["gids", "pkeys", "gid_attrs", "gid_attrs/types", "gid_attrs/ndevs"] {
            put(format!("{port}/{sub}"), Node::Dir);
        }
        // One GID, at index 0; the table's other entries are empty, shown as the zero GID
        // (their types and netdevs cannot be read: the kernel fails such a read; here the file
        // is absent).
        put(format!("{port}/gids/0"), file(&groups(&gid(d.addr))));
        for i in 1..uroce::DEVICE_ATTR.gid_tbl_len {
            put(format!("{port}/gids/{i}"), file(&groups(&[0; 16])));
        }
        put(format!("{port}/pkeys/0"), file("0xffff"));
        put(format!("{port}/gid_attrs/types/0"), file("RoCE v2"));
        if let Some(nd) = &d.netdev {
            put(format!("{port}/gid_attrs/ndevs/0"), file(nd));
        }
        let uverbs = format!("infiniband_verbs/uverbs{}", d.index);
        put(uverbs.clone(), Node::Dir);
        put(format!("{uverbs}/ibdev"), file(&name));
        put(format!("{uverbs}/abi_version"), file("1"));
        let minor = UVERBS_BASE_MINOR + d.index;
        put(format!("{uverbs}/dev"), file(&format!("{UVERBS_MAJOR}:{minor}")));
    }
    v
}

/// The names of the device nodes under `/dev/infiniband`.
pub(crate) fn dev_nodes(devices: &[Device]) -> Vec<String> {
    let mut v: Vec<String> = devices.iter().map(|d| format!("uverbs{}", d.index)).collect();
    v.push("rdma_cm".into());
    v
}

/// `local_cpus`: a hex mask of every CPU, in 32-bit words, as the kernel prints it.
fn local_cpus(cpus: usize) -> String {
    let words = cpus.div_ceil(32).max(1);
    (0..words)
        .rev()
        .map(|w| {
            let n = cpus.saturating_sub(w * 32).min(32);
            let bits: u32 = if n == 32 { u32::MAX } else { (1u32 << n) - 1 };
            format!("{bits:08x}")
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn at<'a>(v: &'a [(PathBuf, Node)], p: &str) -> &'a Node {
        &v.iter().find(|(q, _)| q == &PathBuf::from(p)).unwrap_or_else(|| panic!("no {p}")).1
    }

    #[test]
    fn a_device_looks_as_rxe_shows_one_with_the_verbs_values() {
        let d = Device { index: 1, addr: "127.0.0.2".parse().unwrap(), netdev: Some("lo".into()) };
        let v = sys_class(&[d], 2);
        let f = |s: &str| Node::File(format!("{s}\n"));
        assert_eq!(at(&v, "infiniband/uroce1/ports/1/gid_attrs/types/0"), &f("RoCE v2"));
        assert_eq!(at(&v, "infiniband/uroce1/ports/1/gid_attrs/ndevs/0"), &f("lo"));
        let gid = "0000:0000:0000:0000:0000:ffff:7f00:0002";
        assert_eq!(at(&v, "infiniband/uroce1/ports/1/gids/0"), &f(gid));
        assert_eq!(at(&v, "infiniband/uroce1/ports/1/link_layer"), &f("Ethernet"));
        assert_eq!(at(&v, "infiniband_verbs/uverbs1/ibdev"), &f("uroce1"));
        assert_eq!(at(&v, "infiniband_verbs/uverbs1/dev"), &f("231:193"));
        assert_eq!(at(&v, "infiniband/uroce1/device/local_cpus"), &f("00000003"));
        assert_eq!(
            at(&v, "infiniband/uroce1/device/net/lo"),
            &Node::Link("/sys/class/net/lo".into())
        );
        // ibv_devinfo prints the node GUID the verbs return in this same form.
        let guid = groups(&uroce_net::node_guid("127.0.0.2".parse().unwrap()).to_be_bytes());
        assert_eq!(at(&v, "infiniband/uroce1/node_guid"), &f(&guid));
        assert_eq!(
            dev_nodes(&[Device { index: 0, addr: "::1".parse().unwrap(), netdev: None }]),
            ["uverbs0", "rdma_cm"]
        );
    }

    #[test]
    fn cpu_masks_are_the_kernels() {
        assert_eq!(local_cpus(2), "00000003");
        assert_eq!(local_cpus(32), "ffffffff");
        assert_eq!(local_cpus(40), "000000ff,ffffffff");
    }
}
