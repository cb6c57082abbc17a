//! How a device is set up (`DeviceConfig`, its QPN block) and the limits every device has.

use core::net::IpAddr;

use uroce_wire::icrc::Ipv4IdPolicy;

use crate::types::Mtu;

/// How a device is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceConfig {
    /// The address the device sends from and receives at (its RoCEv2 GID).
    pub addr: IpAddr,
    /// The 256-bit seed of every random choice the device makes (memory keys, the first QPN,
    /// initial PSNs through [`Device::random_psn`](crate::Device::random_psn)): secret on a real device
    /// ([`DeviceConfig::secret`]), a test's number in the simulator ([`DeviceConfig::new`]).
    pub seed: [u8; 32],
    /// Packets a QP may have sent and not had acknowledged.
    pub max_inflight_pkts: u32,
    /// The requester asks for an ACK at least every this many packets of a long message.
    pub ack_req_interval: u32,
    /// The port's active MTU (`ibv_port_attr.active_mtu`): the largest UD datagram, and the
    /// most a connected QP's path MTU should be. A runtime derives it from the interface MTU
    /// less the IP, UDP, BTH and ICRC overhead, as RoCE NICs do.
    pub port_mtu: Mtu,
    /// The QPNs this device may hand out. Several engines serving one host-wide device (one
    /// per process) each take a disjoint block, so QPNs stay unique per device (IBA 10.2.4:
    /// a QPN names one QP of the channel adapter).
    pub qpns: QpnBlock,
    /// The IPv4 identifications a received packet's ICRC may have been computed with (the
    /// receiver cannot see the IP header; IBA Annex A17.3.3 covers the field). By default any:
    /// uroce's own IPv4 sender numbers datagrams from a connected socket's counter.
    pub ipv4_id_policy: Ipv4IdPolicy,
}

impl DeviceConfig {
    /// Defaults for a device at `addr` whose every choice is reproducible from `seed` (for the
    /// simulator and tests: anyone who knows the seed can derive the keys).
    pub const fn new(addr: IpAddr, seed: u64) -> Self {
        Self::secret(addr, crate::rng::expand(seed))
    }

    /// Defaults for a real device at `addr`, seeded with 256 bits from the operating system's
    /// randomness: its keys, QPNs and PSNs cannot be derived from the ones a peer sees (IBA
    /// 10.6.3.3 leaves key choice to the CA; 9.7.2 wants initial PSNs hard to predict).
    pub const fn secret(addr: IpAddr, seed: [u8; 32]) -> Self {
        Self {
            addr,
            seed,
            max_inflight_pkts: 256,
            ack_req_interval: 32,
            port_mtu: Mtu::Mtu4096,
            qpns: QpnBlock::ALL,
            ipv4_id_policy: Ipv4IdPolicy::Any,
        }
    }
}

/// A range of queue pair numbers, `first..first + len`, from which `create_qp` allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpnBlock {
    /// The first QPN of the block.
    pub first: u32,
    /// How many QPNs it holds.
    pub len: u32,
}

impl QpnBlock {
    /// Every QPN a device may give an ordinary QP: above the special QPs 0 and 1 (and the
    /// range rxe keeps for them, 0..0x10), below the multicast QPN 0xFFFFFF.
    pub const ALL: Self = Self { first: 0x10, len: 0x00FF_FFFF - 0x10 };

    /// Whether `qpn` lies in the block.
    pub const fn contains(self, qpn: u32) -> bool {
        qpn >= self.first && qpn - self.first < self.len
    }
}

/// What a device supports (`ibv_device_attr`'s limits). Creating an object beyond them is a
/// typed error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Queue pairs at once.
    pub max_qp: u32,
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// Scatter/gather elements per work request.
    pub max_sge: u32,
    /// Completions per completion queue.
    pub max_cqe: u32,
    /// Memory regions at once.
    pub max_mr: u32,
    /// Memory windows at once.
    pub max_mw: u32,
    /// Bytes of inline data per send work request.
    pub max_inline_data: u32,
    /// READ and atomic requests a QP may have outstanding, or serve, at once.
    pub max_qp_rd_atom: u8,
    /// Longest message: 2^31 bytes (IBA 9.7).
    pub max_msg_sz: u32,
    /// Address handles at once.
    pub max_ah: u32,
    /// Multicast groups with at least one QP attached.
    pub max_mcast_grp: u32,
    /// QPs attached to one multicast group.
    pub max_mcast_qp_attach: u32,
    /// Attachments over all groups.
    pub max_total_mcast_qp_attach: u32,
    /// Entries of the port's GID table (`gid_tbl_len`): entry 0 holds the device's RoCE v2
    /// GID (its address, IPv4-mapped for IPv4), the others are empty, as on a RoCE NIC whose
    /// table has room for the GIDs its host may add.
    pub gid_tbl_len: u32,
}

/// The limits every uroce device has.
pub const DEVICE_ATTR: DeviceAttr = DeviceAttr {
    max_qp: 1 << 16,
    max_qp_wr: 1 << 15,
    max_sge: 32,
    max_cqe: 1 << 20,
    max_mr: 1 << 20,
    max_mw: 1 << 20,
    max_inline_data: 1024,
    max_qp_rd_atom: crate::qp::MAX_RD_ATOMIC,
    max_msg_sz: 1 << 31,
    max_ah: 1 << 16,
    max_mcast_grp: 1 << 10,
    max_mcast_qp_attach: 64,
    max_total_mcast_qp_attach: 1 << 16,
    gid_tbl_len: 16,
};
