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

/// `IBV_QP_INIT_ATTR_PD`.
pub(crate) const IBV_QP_INIT_ATTR_PD: u32 = 1;
/// `IBV_MTU_256`.
pub(crate) const IBV_MTU_256: c_int = 1;
