//! The structures and constants of `<rdma/rdma_cma.h>` (rdma-core 44) that cross the C ABI,
//! laid out as the header lays them out (`tests/c/rdmacm_layout.c` checks every offset
//! against the installed header).

use core::ffi::{c_char, c_int, c_void};

use crate::abi::{IbvAhAttr, IbvCompChannel, IbvContext, IbvCq, IbvGid, IbvPd, IbvQp, IbvSrq};

/// `struct rdma_event_channel`.
#[repr(C)]
pub(crate) struct RdmaEventChannel {
    pub(crate) fd: c_int,
}

/// `struct rdma_ib_addr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RdmaIbAddr {
    pub(crate) sgid: IbvGid,
    pub(crate) dgid: IbvGid,
    pub(crate) pkey: u16,
}

/// `struct rdma_addr`: two `sockaddr_storage` unions and the IB addresses.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RdmaAddr {
    pub(crate) src: libc::sockaddr_storage,
    pub(crate) dst: libc::sockaddr_storage,
    pub(crate) ibaddr: RdmaIbAddr,
}

/// `struct ibv_sa_path_rec` (`<infiniband/sa.h>`).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct IbvSaPathRec {
    pub(crate) dgid: IbvGid,
    pub(crate) sgid: IbvGid,
    pub(crate) dlid: u16,
    pub(crate) slid: u16,
    pub(crate) raw_traffic: c_int,
    pub(crate) flow_label: u32,
    pub(crate) hop_limit: u8,
    pub(crate) traffic_class: u8,
    pub(crate) reversible: c_int,
    pub(crate) numb_path: u8,
    pub(crate) pkey: u16,
    pub(crate) sl: u8,
    pub(crate) mtu_selector: u8,
    pub(crate) mtu: u8,
    pub(crate) rate_selector: u8,
    pub(crate) rate: u8,
    pub(crate) packet_life_time_selector: u8,
    pub(crate) packet_life_time: u8,
    pub(crate) preference: u8,
}

/// `struct rdma_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RdmaRoute {
    pub(crate) addr: RdmaAddr,
    pub(crate) path_rec: *mut IbvSaPathRec,
    pub(crate) num_paths: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub(crate) struct RdmaCmId {
    pub(crate) verbs: *mut IbvContext,
    pub(crate) channel: *mut RdmaEventChannel,
    pub(crate) context: *mut c_void,
    pub(crate) qp: *mut IbvQp,
    pub(crate) route: RdmaRoute,
    pub(crate) ps: c_int,
    pub(crate) port_num: u8,
    pub(crate) event: *mut RdmaCmEvent,
    pub(crate) send_cq_channel: *mut IbvCompChannel,
    pub(crate) send_cq: *mut IbvCq,
    pub(crate) recv_cq_channel: *mut IbvCompChannel,
    pub(crate) recv_cq: *mut IbvCq,
    pub(crate) srq: *mut IbvSrq,
    pub(crate) pd: *mut IbvPd,
    pub(crate) qp_type: c_int,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RdmaConnParam {
    pub(crate) private_data: *const c_void,
    pub(crate) private_data_len: u8,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    pub(crate) flow_control: u8,
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry_count: u8,
    pub(crate) srq: u8,
    pub(crate) qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RdmaUdParam {
    pub(crate) private_data: *const c_void,
    pub(crate) private_data_len: u8,
    pub(crate) ah_attr: IbvAhAttr,
    pub(crate) qp_num: u32,
    pub(crate) qkey: u32,
}

/// The `param` union of `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union RdmaEventParam {
    pub(crate) conn: RdmaConnParam,
    pub(crate) ud: RdmaUdParam,
}

/// `struct rdma_cm_event`.
#[repr(C)]
pub(crate) struct RdmaCmEvent {
    pub(crate) id: *mut RdmaCmId,
    pub(crate) listen_id: *mut RdmaCmId,
    pub(crate) event: c_int,
    pub(crate) status: c_int,
    pub(crate) param: RdmaEventParam,
}

/// `struct rdma_addrinfo`.
#[repr(C)]
pub(crate) struct RdmaAddrinfo {
    pub(crate) ai_flags: c_int,
    pub(crate) ai_family: c_int,
    pub(crate) ai_qp_type: c_int,
    pub(crate) ai_port_space: c_int,
    pub(crate) ai_src_len: libc::socklen_t,
    pub(crate) ai_dst_len: libc::socklen_t,
    pub(crate) ai_src_addr: *mut libc::sockaddr,
    pub(crate) ai_dst_addr: *mut libc::sockaddr,
    pub(crate) ai_src_canonname: *mut c_char,
    pub(crate) ai_dst_canonname: *mut c_char,
    pub(crate) ai_route_len: usize,
    pub(crate) ai_route: *mut c_void,
    pub(crate) ai_connect_len: usize,
    pub(crate) ai_connect: *mut c_void,
    pub(crate) ai_next: *mut Self,
}

/// `struct rdma_cm_join_mc_attr_ex`.
#[repr(C)]
pub(crate) struct RdmaCmJoinMcAttrEx {
    pub(crate) comp_mask: u32,
    pub(crate) join_flags: u32,
    pub(crate) addr: *mut libc::sockaddr,
}

/// `enum rdma_cm_event_type`.
pub(crate) mod event {
    use core::ffi::c_int;
    pub(crate) const ADDR_RESOLVED: c_int = 0;
    pub(crate) const ADDR_ERROR: c_int = 1;
    pub(crate) const ROUTE_RESOLVED: c_int = 2;
    pub(crate) const ROUTE_ERROR: c_int = 3;
    pub(crate) const CONNECT_REQUEST: c_int = 4;
    pub(crate) const CONNECT_RESPONSE: c_int = 5;
    pub(crate) const CONNECT_ERROR: c_int = 6;
    pub(crate) const UNREACHABLE: c_int = 7;
    pub(crate) const REJECTED: c_int = 8;
    pub(crate) const ESTABLISHED: c_int = 9;
    pub(crate) const DISCONNECTED: c_int = 10;
    pub(crate) const DEVICE_REMOVAL: c_int = 11;
    pub(crate) const MULTICAST_JOIN: c_int = 12;
    pub(crate) const MULTICAST_ERROR: c_int = 13;
    pub(crate) const ADDR_CHANGE: c_int = 14;
    pub(crate) const TIMEWAIT_EXIT: c_int = 15;
}

/// `enum rdma_port_space`.
pub(crate) mod ps {
    use core::ffi::c_int;
    pub(crate) const IPOIB: c_int = 0x0002;
    pub(crate) const TCP: c_int = 0x0106;
    pub(crate) const UDP: c_int = 0x0111;
    pub(crate) const IB: c_int = 0x013F;
}

/// `RDMA_UDP_QKEY`: the Q_Key of every RDMA CM UD QP and multicast group.
pub(crate) const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// `rdma_addrinfo` flags.
pub(crate) const RAI_PASSIVE: c_int = 1;
pub(crate) const RAI_NUMERICHOST: c_int = 2;

/// `rdma_set_option` levels and names.
pub(crate) const RDMA_OPTION_ID: c_int = 0;
pub(crate) const RDMA_OPTION_IB: c_int = 1;
pub(crate) const RDMA_OPTION_ID_TOS: c_int = 0;
pub(crate) const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
pub(crate) const RDMA_OPTION_ID_AFONLY: c_int = 2;
pub(crate) const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
pub(crate) const RDMA_OPTION_IB_PATH: c_int = 1;

/// `RDMA_CM_JOIN_MC_ATTR_ADDRESS`.
pub(crate) const JOIN_MC_ATTR_ADDRESS: u32 = 1;

/// The head of `struct ibv_qp_init_attr_ex`: the fields `rdma_create_qp_ex` reads (the
/// application's structure is the whole one; only this prefix is read).
#[repr(C)]
pub(crate) struct IbvQpInitAttrExHead {
    pub(crate) qp_context: *mut c_void,
    pub(crate) send_cq: *mut IbvCq,
    pub(crate) recv_cq: *mut IbvCq,
    pub(crate) srq: *mut IbvSrq,
    pub(crate) cap: crate::abi::IbvQpCap,
    pub(crate) qp_type: c_int,
    pub(crate) sq_sig_all: c_int,
    pub(crate) comp_mask: u32,
    pub(crate) pd: *mut IbvPd,
}

/// `IBV_MTU_256`.
pub(crate) const IBV_MTU_256: c_int = 1;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use core::mem::{offset_of, size_of};

    use super::*;

    /// Every size and field offset above, against what a C compiler makes of the installed
    /// `<rdma/rdma_cma.h>`.
    #[test]
    fn layouts_match_the_installed_header() {
        if !std::path::Path::new("/usr/include/rdma/rdma_cma.h").exists() {
            assert!(
                std::env::var("CI").map_or(true, |v| v != "true"),
                "librdmacm-dev is required under CI"
            );
            eprintln!("SKIPPED: no <rdma/rdma_cma.h> (apt-get install -y librdmacm-dev)");
            return;
        }
        let ours: Vec<(&str, usize)> = vec![
            ("sizeof(struct rdma_cm_id)", size_of::<RdmaCmId>()),
            ("offsetof(struct rdma_cm_id, verbs)", offset_of!(RdmaCmId, verbs)),
            ("offsetof(struct rdma_cm_id, channel)", offset_of!(RdmaCmId, channel)),
            ("offsetof(struct rdma_cm_id, context)", offset_of!(RdmaCmId, context)),
            ("offsetof(struct rdma_cm_id, qp)", offset_of!(RdmaCmId, qp)),
            ("offsetof(struct rdma_cm_id, route)", offset_of!(RdmaCmId, route)),
            ("offsetof(struct rdma_cm_id, ps)", offset_of!(RdmaCmId, ps)),
            ("offsetof(struct rdma_cm_id, port_num)", offset_of!(RdmaCmId, port_num)),
            ("offsetof(struct rdma_cm_id, event)", offset_of!(RdmaCmId, event)),
            ("offsetof(struct rdma_cm_id, send_cq_channel)", offset_of!(RdmaCmId, send_cq_channel)),
            ("offsetof(struct rdma_cm_id, send_cq)", offset_of!(RdmaCmId, send_cq)),
            ("offsetof(struct rdma_cm_id, recv_cq_channel)", offset_of!(RdmaCmId, recv_cq_channel)),
            ("offsetof(struct rdma_cm_id, recv_cq)", offset_of!(RdmaCmId, recv_cq)),
            ("offsetof(struct rdma_cm_id, srq)", offset_of!(RdmaCmId, srq)),
            ("offsetof(struct rdma_cm_id, pd)", offset_of!(RdmaCmId, pd)),
            ("offsetof(struct rdma_cm_id, qp_type)", offset_of!(RdmaCmId, qp_type)),
            ("sizeof(struct rdma_route)", size_of::<RdmaRoute>()),
            ("offsetof(struct rdma_route, path_rec)", offset_of!(RdmaRoute, path_rec)),
            ("offsetof(struct rdma_route, num_paths)", offset_of!(RdmaRoute, num_paths)),
            ("sizeof(struct rdma_addr)", size_of::<RdmaAddr>()),
            ("offsetof(struct rdma_addr, dst_addr)", offset_of!(RdmaAddr, dst)),
            ("offsetof(struct rdma_addr, addr)", offset_of!(RdmaAddr, ibaddr)),
            ("offsetof(struct rdma_ib_addr, pkey)", offset_of!(RdmaIbAddr, pkey)),
            ("sizeof(struct ibv_sa_path_rec)", size_of::<IbvSaPathRec>()),
            ("offsetof(struct ibv_sa_path_rec, flow_label)", offset_of!(IbvSaPathRec, flow_label)),
            ("offsetof(struct ibv_sa_path_rec, reversible)", offset_of!(IbvSaPathRec, reversible)),
            ("offsetof(struct ibv_sa_path_rec, pkey)", offset_of!(IbvSaPathRec, pkey)),
            ("offsetof(struct ibv_sa_path_rec, preference)", offset_of!(IbvSaPathRec, preference)),
            ("sizeof(struct rdma_conn_param)", size_of::<RdmaConnParam>()),
            (
                "offsetof(struct rdma_conn_param, private_data_len)",
                offset_of!(RdmaConnParam, private_data_len),
            ),
            ("offsetof(struct rdma_conn_param, srq)", offset_of!(RdmaConnParam, srq)),
            ("offsetof(struct rdma_conn_param, qp_num)", offset_of!(RdmaConnParam, qp_num)),
            ("sizeof(struct rdma_ud_param)", size_of::<RdmaUdParam>()),
            ("offsetof(struct rdma_ud_param, ah_attr)", offset_of!(RdmaUdParam, ah_attr)),
            ("offsetof(struct rdma_ud_param, qp_num)", offset_of!(RdmaUdParam, qp_num)),
            ("offsetof(struct rdma_ud_param, qkey)", offset_of!(RdmaUdParam, qkey)),
            ("sizeof(struct rdma_cm_event)", size_of::<RdmaCmEvent>()),
            ("offsetof(struct rdma_cm_event, listen_id)", offset_of!(RdmaCmEvent, listen_id)),
            ("offsetof(struct rdma_cm_event, event)", offset_of!(RdmaCmEvent, event)),
            ("offsetof(struct rdma_cm_event, status)", offset_of!(RdmaCmEvent, status)),
            ("offsetof(struct rdma_cm_event, param)", offset_of!(RdmaCmEvent, param)),
            ("sizeof(struct rdma_addrinfo)", size_of::<RdmaAddrinfo>()),
            ("offsetof(struct rdma_addrinfo, ai_src_len)", offset_of!(RdmaAddrinfo, ai_src_len)),
            ("offsetof(struct rdma_addrinfo, ai_src_addr)", offset_of!(RdmaAddrinfo, ai_src_addr)),
            (
                "offsetof(struct rdma_addrinfo, ai_route_len)",
                offset_of!(RdmaAddrinfo, ai_route_len),
            ),
            ("offsetof(struct rdma_addrinfo, ai_next)", offset_of!(RdmaAddrinfo, ai_next)),
            ("sizeof(struct rdma_cm_join_mc_attr_ex)", size_of::<RdmaCmJoinMcAttrEx>()),
            (
                "offsetof(struct rdma_cm_join_mc_attr_ex, addr)",
                offset_of!(RdmaCmJoinMcAttrEx, addr),
            ),
            (
                "offsetof(struct ibv_qp_init_attr_ex, comp_mask)",
                offset_of!(IbvQpInitAttrExHead, comp_mask),
            ),
            ("offsetof(struct ibv_qp_init_attr_ex, pd)", offset_of!(IbvQpInitAttrExHead, pd)),
        ];
        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <rdma/rdma_cma.h>\nint main(void) {\n",
        );
        for (expr, _) in &ours {
            c.push_str(&format!("    printf(\"%zu\\n\", (size_t){expr});\n"));
        }
        c.push_str("    return 0;\n}\n");
        let dir = std::env::temp_dir().join(format!("uroce-rdmacm-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, exe) = (dir.join("layout.c"), dir.join("layout"));
        std::fs::write(&src, c).unwrap();
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let built = std::process::Command::new(cc).arg("-o").arg(&exe).arg(&src).output().unwrap();
        assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
        let out = std::process::Command::new(&exe).output().unwrap();
        let theirs: Vec<usize> =
            String::from_utf8_lossy(&out.stdout).lines().map(|l| l.parse().unwrap()).collect();
        assert_eq!(theirs.len(), ours.len());
        for ((expr, mine), c) in ours.iter().zip(&theirs) {
            assert_eq!(mine, c, "{expr}: ours {mine}, the header's {c}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
