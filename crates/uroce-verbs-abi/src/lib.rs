//! The objects and constants of `<infiniband/verbs.h>` (rdma-core 44) as Rust declares them:
//! `#[repr(C)]` mirrors of every structure the drop-in `libibverbs.so.1` (`uroce-verbs`) hands
//! out or reads, and that `uroce`'s benchmark uses when it drives a system's libibverbs. A unit
//! test compiles a C program against the installed header and checks every size and offset.
//!
//! Each item mirrors the header's declaration of the same name; `verbs.h` and the rdma-core
//! man pages are its documentation.
#![allow(missing_docs, reason = "mirrors of verbs.h, documented there")]

use core::ffi::{c_char, c_int, c_uint, c_void};

/// `pthread_mutex_t` on x86-64 glibc; all zeroes is `PTHREAD_MUTEX_INITIALIZER`.
pub type PthreadMutex = [u64; 5];
/// `pthread_cond_t` on x86-64 glibc; all zeroes is `PTHREAD_COND_INITIALIZER`.
pub type PthreadCond = [u64; 6];

/// A function-pointer slot this library leaves empty (NULL): the caller falls back, or fails
/// with `EOPNOTSUPP`, as it does for a provider without that verb.
pub type Unset = Option<unsafe extern "C" fn()>;

/// `IBV_SYSFS_NAME_MAX`.
pub const SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`.
pub const SYSFS_PATH_MAX: usize = 256;

/// `struct ibv_device`.
#[repr(C)]
pub struct IbvDevice {
    pub ops: [Unset; 2],
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; SYSFS_NAME_MAX],
    pub dev_name: [c_char; SYSFS_NAME_MAX],
    pub dev_path: [c_char; SYSFS_PATH_MAX],
    pub ibdev_path: [c_char; SYSFS_PATH_MAX],
}

pub type PollCqFn = unsafe extern "C" fn(*mut IbvCq, c_int, *mut IbvWc) -> c_int;
pub type ReqNotifyFn = unsafe extern "C" fn(*mut IbvCq, c_int) -> c_int;
pub type PostSendFn =
    unsafe extern "C" fn(*mut IbvQp, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut IbvQp, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int;
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut IbvSrq, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int;
pub type QueryPortFn = unsafe extern "C" fn(*mut IbvContext, u8, *mut IbvPortAttr, usize) -> c_int;

/// `struct ibv_context_ops`: the verbs the header's inline functions call through.
#[repr(C)]
pub struct IbvContextOps {
    pub compat_query_device: Unset,
    pub compat_query_port: Unset,
    pub compat_1: [Unset; 5],
    pub alloc_mw: Option<unsafe extern "C" fn(*mut IbvPd, c_int) -> *mut IbvMw>,
    pub bind_mw: Option<unsafe extern "C" fn(*mut IbvQp, *mut IbvMw, *mut IbvMwBind) -> c_int>,
    pub dealloc_mw: Option<unsafe extern "C" fn(*mut IbvMw) -> c_int>,
    pub compat_create_cq: Unset,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyFn>,
    pub compat_2: [Unset; 7],
    pub post_srq_recv: Option<PostSrqRecvFn>,
    pub compat_3: [Unset; 4],
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub compat_4: [Unset; 5],
}

/// `struct ibv_context`.
#[repr(C)]
pub struct IbvContext {
    pub device: *mut IbvDevice,
    pub ops: IbvContextOps,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: PthreadMutex,
    pub abi_compat: *mut c_void,
}

/// `__VERBS_ABI_IS_EXTENDED`: `abi_compat` says a `verbs_context` precedes the context.
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

/// `struct verbs_context`: the extended verbs, in the memory right before `ibv_context` (which
/// is its last member). A slot left NULL makes the header's inline wrapper fall back to the
/// legacy verb or fail with `EOPNOTSUPP`.
#[repr(C)]
pub struct VerbsContext {
    pub query_port: Option<QueryPortFn>,
    pub advise_mr: Option<AdviseMrFn>,
    /// `alloc_null_mr` and the counters.
    pub unset_before_reg_dm_mr: [Unset; 5],
    pub reg_dm_mr:
        Option<unsafe extern "C" fn(*mut IbvPd, *mut IbvDm, u64, usize, c_uint) -> *mut IbvMr>,
    pub alloc_dm: Option<unsafe extern "C" fn(*mut IbvContext, *mut IbvAllocDmAttr) -> *mut IbvDm>,
    pub free_dm: Option<unsafe extern "C" fn(*mut IbvDm) -> c_int>,
    /// The flow actions and `modify_qp_rate_limit`.
    pub unset_before_alloc_parent_domain: [Unset; 4],
    pub alloc_parent_domain:
        Option<unsafe extern "C" fn(*mut IbvContext, *mut IbvParentDomainInitAttr) -> *mut IbvPd>,
    pub dealloc_td: Option<unsafe extern "C" fn(*mut IbvTd) -> c_int>,
    pub alloc_td: Option<unsafe extern "C" fn(*mut IbvContext, *mut IbvTdInitAttr) -> *mut IbvTd>,
    pub modify_cq: Unset,
    pub post_srq_ops: Option<PostSrqOpsFn>,
    /// `destroy_rwq_ind_table` … `create_wq`.
    pub unset_before_query_rt_values: [Unset; 5],
    pub query_rt_values: Option<QueryRtValuesFn>,
    pub create_cq_ex: Option<CreateCqExFn>,
    pub priv_: Unset,
    pub query_device_ex: Option<QueryDeviceExFn>,
    /// `ibv_destroy_flow`, `ABI_placeholder2`, `ibv_create_flow`, `ABI_placeholder1`.
    pub unset_before_open_qp: [Unset; 4],
    pub open_qp: Option<unsafe extern "C" fn(*mut IbvContext, *mut IbvQpOpenAttr) -> *mut IbvQp>,
    pub create_qp_ex: Option<CreateQpExFn>,
    pub get_srq_num: Option<unsafe extern "C" fn(*mut IbvSrq, *mut u32) -> c_int>,
    pub create_srq_ex:
        Option<unsafe extern "C" fn(*mut IbvContext, *mut IbvSrqInitAttrEx) -> *mut IbvSrq>,
    pub open_xrcd:
        Option<unsafe extern "C" fn(*mut IbvContext, *mut IbvXrcdInitAttr) -> *mut IbvXrcd>,
    pub close_xrcd: Option<unsafe extern "C" fn(*mut IbvXrcd) -> c_int>,
    pub abi_placeholder3: Unset,
    pub sz: usize,
    pub context: IbvContext,
}

/// `union ibv_gid`: 16 bytes, aligned as its `global` view (two `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct IbvGid {
    pub raw: [u8; 16],
}

/// `struct ibv_gid_entry`.
#[repr(C)]
pub struct IbvGidEntry {
    pub gid: IbvGid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `struct ibv_device_attr`.
#[repr(C)]
pub struct IbvDeviceAttr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_odp_caps`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvOdpCaps {
    pub general_caps: u64,
    pub per_transport_caps: IbvOdpTransportCaps,
}

/// `ibv_odp_caps.per_transport_caps`: `enum ibv_odp_transport_cap_bits` per transport.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvOdpTransportCaps {
    pub rc_odp_caps: u32,
    pub uc_odp_caps: u32,
    pub ud_odp_caps: u32,
}

/// `struct ibv_tso_caps`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvTsoCaps {
    pub max_tso: u32,
    pub supported_qpts: u32,
}

/// `struct ibv_rss_caps`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvRssCaps {
    pub supported_qpts: u32,
    pub max_rwq_indirection_tables: u32,
    pub max_rwq_indirection_table_size: u32,
    pub rx_hash_fields_mask: u64,
    pub rx_hash_function: u8,
}

/// `struct ibv_packet_pacing_caps`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvPacketPacingCaps {
    pub qp_rate_limit_min: u32,
    pub qp_rate_limit_max: u32,
    pub supported_qpts: u32,
}

/// `struct ibv_tm_caps`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvTmCaps {
    pub max_rndv_hdr_size: u32,
    pub max_num_tags: u32,
    pub flags: u32,
    pub max_ops: u32,
    pub max_sge: u32,
}

/// `struct ibv_cq_moderation_caps`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvCqModerationCaps {
    pub max_cq_count: u16,
    pub max_cq_period: u16,
}

/// `struct ibv_pci_atomic_caps`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvPciAtomicCaps {
    pub fetch_add: u16,
    pub swap: u16,
    pub compare_swap: u16,
}

/// `struct ibv_device_attr_ex`.
#[repr(C)]
pub struct IbvDeviceAttrEx {
    pub orig_attr: IbvDeviceAttr,
    pub comp_mask: u32,
    pub odp_caps: IbvOdpCaps,
    pub completion_timestamp_mask: u64,
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
    pub tso_caps: IbvTsoCaps,
    pub rss_caps: IbvRssCaps,
    pub max_wq_type_rq: u32,
    pub packet_pacing_caps: IbvPacketPacingCaps,
    pub raw_packet_caps: u32,
    pub tm_caps: IbvTmCaps,
    pub cq_mod_caps: IbvCqModerationCaps,
    pub max_dm_size: u64,
    pub pci_atomic_caps: IbvPciAtomicCaps,
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}

/// `struct ibv_cq_ex`: a `struct ibv_cq` and, after it, the current completion of a poll in
/// progress and the functions that poll and read it.
#[repr(C)]
pub struct IbvCqEx {
    pub cq: IbvCq,
    pub comp_mask: u32,
    pub status: c_int,
    pub wr_id: u64,
    pub start_poll: Option<StartPollFn>,
    pub next_poll: CqExRead<c_int>,
    pub end_poll: Option<EndPollFn>,
    pub read_opcode: CqExRead<c_int>,
    pub read_vendor_err: CqExRead<u32>,
    pub read_byte_len: CqExRead<u32>,
    pub read_imm_data: CqExRead<u32>,
    pub read_qp_num: CqExRead<u32>,
    pub read_src_qp: CqExRead<u32>,
    pub read_wc_flags: CqExRead<c_uint>,
    pub read_slid: CqExRead<u32>,
    pub read_sl: CqExRead<u8>,
    pub read_dlid_path_bits: CqExRead<u8>,
    pub read_completion_ts: CqExRead<u64>,
    pub read_cvlan: CqExRead<u16>,
    pub read_flow_tag: CqExRead<u32>,
    pub read_tm_info: Option<unsafe extern "C" fn(*mut Self, *mut IbvWcTmInfo)>,
    pub read_completion_wallclock_ns: CqExRead<u64>,
}

/// `struct ibv_wc_tm_info`.
#[repr(C)]
pub struct IbvWcTmInfo {
    pub tag: u64,
    pub priv_: u32,
}

/// `verbs_context.post_srq_ops` (`ibv_post_srq_ops(3)`).
pub type PostSrqOpsFn =
    unsafe extern "C" fn(*mut IbvSrq, *mut IbvOpsWr, *mut *mut IbvOpsWr) -> c_int;

/// `struct ibv_ops_wr`: a tag operation on a TM-SRQ.
#[repr(C)]
pub struct IbvOpsWr {
    pub wr_id: u64,
    pub next: *mut Self,
    pub opcode: c_int,
    pub flags: c_int,
    pub tm: IbvOpsWrTm,
}

/// `ibv_ops_wr.tm`.
#[repr(C)]
pub struct IbvOpsWrTm {
    pub unexpected_cnt: u32,
    pub handle: u32,
    pub add: IbvOpsWrAdd,
}

/// `ibv_ops_wr.tm.add`.
#[repr(C)]
pub struct IbvOpsWrAdd {
    pub recv_wr_id: u64,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub tag: u64,
    pub mask: u64,
}

/// `struct ibv_tm_cap`: a TM-SRQ's sizes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvTmCap {
    pub max_num_tags: u32,
    pub max_ops: u32,
}

/// `ibv_cq_ex.start_poll`.
pub type StartPollFn = unsafe extern "C" fn(*mut IbvCqEx, *mut IbvPollCqAttr) -> c_int;
/// `ibv_cq_ex.end_poll`.
pub type EndPollFn = unsafe extern "C" fn(*mut IbvCqEx);
/// `ibv_cq_ex.next_poll` and the `read_*` functions.
pub type CqExRead<R> = Option<unsafe extern "C" fn(*mut IbvCqEx) -> R>;

/// `struct ibv_poll_cq_attr`.
#[repr(C)]
pub struct IbvPollCqAttr {
    pub comp_mask: u32,
}

/// `struct ibv_cq_init_attr_ex`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvCqInitAttrEx {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut IbvCompChannel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut IbvPd,
}

/// `verbs_context.create_cq_ex`.
pub type CreateCqExFn = unsafe extern "C" fn(*mut IbvContext, *mut IbvCqInitAttrEx) -> *mut IbvCqEx;

/// `struct ibv_values_ex`.
#[repr(C)]
pub struct IbvValuesEx {
    pub comp_mask: u32,
    pub raw_clock: libc::timespec,
}

/// `verbs_context.advise_mr`.
pub type AdviseMrFn = unsafe extern "C" fn(*mut IbvPd, c_int, u32, *mut IbvSge, u32) -> c_int;

/// `verbs_context.query_rt_values`.
pub type QueryRtValuesFn = unsafe extern "C" fn(*mut IbvContext, *mut IbvValuesEx) -> c_int;

/// `struct ibv_query_device_ex_input`.
#[repr(C)]
pub struct IbvQueryDeviceExInput {
    pub comp_mask: u32,
}

/// `verbs_context.query_device_ex`.
pub type QueryDeviceExFn = unsafe extern "C" fn(
    *mut IbvContext,
    *const IbvQueryDeviceExInput,
    *mut IbvDeviceAttrEx,
    usize,
) -> c_int;

/// `struct ibv_port_attr`. `ibv_query_port@IBVERBS_1.1` writes only its first
/// [`COMPAT_PORT_ATTR_SIZE`] bytes (`struct _compat_ibv_port_attr`, without
/// `port_cap_flags2`).
#[repr(C)]
pub struct IbvPortAttr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// Bytes of `struct _compat_ibv_port_attr`: `ibv_port_attr` up to and including `flags`.
pub const COMPAT_PORT_ATTR_SIZE: usize = core::mem::offset_of!(IbvPortAttr, flags) + 1;

/// `struct ibv_pd`.
#[repr(C)]
pub struct IbvPd {
    pub context: *mut IbvContext,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct IbvMr {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct IbvCompChannel {
    pub context: *mut IbvContext,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct IbvCq {
    pub context: *mut IbvContext,
    pub channel: *mut IbvCompChannel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: PthreadMutex,
    pub cond: PthreadCond,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct IbvSrq {
    pub context: *mut IbvContext,
    pub srq_context: *mut c_void,
    pub pd: *mut IbvPd,
    pub handle: u32,
    pub mutex: PthreadMutex,
    pub cond: PthreadCond,
    pub events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct IbvQp {
    pub context: *mut IbvContext,
    pub qp_context: *mut c_void,
    pub pd: *mut IbvPd,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut IbvSrq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_int,
    pub qp_type: c_int,
    pub mutex: PthreadMutex,
    pub cond: PthreadCond,
    pub events_completed: u32,
}

/// `struct ibv_qp_ex`: a `struct ibv_qp`, the `wr_id` and `wr_flags` the next work-request
/// builder takes, and the `ibv_wr_*` functions (`ibv_wr_post(3)`).
#[repr(C)]
#[expect(clippy::use_self, reason = "the callbacks' C signatures, as verbs.h spells them")]
pub struct IbvQpEx {
    pub qp_base: IbvQp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut IbvQpEx, u32, u64, u64, u64)>,
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut IbvQpEx, u32, u64, u64)>,
    pub wr_bind_mw:
        Option<unsafe extern "C" fn(*mut IbvQpEx, *mut IbvMw, u32, *const IbvMwBindInfo)>,
    pub wr_local_inv: Option<unsafe extern "C" fn(*mut IbvQpEx, u32)>,
    pub wr_rdma_read: Option<unsafe extern "C" fn(*mut IbvQpEx, u32, u64)>,
    pub wr_rdma_write: Option<unsafe extern "C" fn(*mut IbvQpEx, u32, u64)>,
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut IbvQpEx, u32, u64, u32)>,
    pub wr_send: Option<unsafe extern "C" fn(*mut IbvQpEx)>,
    pub wr_send_imm: Option<unsafe extern "C" fn(*mut IbvQpEx, u32)>,
    pub wr_send_inv: Option<unsafe extern "C" fn(*mut IbvQpEx, u32)>,
    pub wr_send_tso: Option<unsafe extern "C" fn(*mut IbvQpEx, *mut c_void, u16, u16)>,
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(*mut IbvQpEx, *mut IbvAh, u32, u32)>,
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut IbvQpEx, u32)>,
    pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut IbvQpEx, *mut c_void, usize)>,
    pub wr_set_inline_data_list:
        Option<unsafe extern "C" fn(*mut IbvQpEx, usize, *const IbvDataBuf)>,
    pub wr_set_sge: Option<unsafe extern "C" fn(*mut IbvQpEx, u32, u64, u32)>,
    pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut IbvQpEx, usize, *const IbvSge)>,
    pub wr_start: Option<unsafe extern "C" fn(*mut IbvQpEx)>,
    pub wr_complete: Option<unsafe extern "C" fn(*mut IbvQpEx) -> c_int>,
    pub wr_abort: Option<unsafe extern "C" fn(*mut IbvQpEx)>,
    pub wr_atomic_write: Option<unsafe extern "C" fn(*mut IbvQpEx, u32, u64, *const c_void)>,
}

/// `struct ibv_data_buf`.
#[repr(C)]
pub struct IbvDataBuf {
    pub addr: *mut c_void,
    pub length: usize,
}

/// `struct ibv_dm`: device memory.
#[repr(C)]
#[expect(clippy::use_self, reason = "the callbacks' C signatures, as verbs.h spells them")]
pub struct IbvDm {
    pub context: *mut IbvContext,
    pub memcpy_to_dm: Option<unsafe extern "C" fn(*mut IbvDm, u64, *const c_void, usize) -> c_int>,
    pub memcpy_from_dm: Option<unsafe extern "C" fn(*mut c_void, *mut IbvDm, u64, usize) -> c_int>,
    pub comp_mask: u32,
    pub handle: u32,
}

/// `struct ibv_alloc_dm_attr`.
#[repr(C)]
pub struct IbvAllocDmAttr {
    pub length: usize,
    pub log_align_req: u32,
    pub comp_mask: u32,
}

/// `struct ibv_td`: a thread domain.
#[repr(C)]
pub struct IbvTd {
    pub context: *mut IbvContext,
}

/// `struct ibv_td_init_attr`.
#[repr(C)]
pub struct IbvTdInitAttr {
    pub comp_mask: u32,
}

/// `ibv_parent_domain_init_attr.alloc`.
pub type PdAllocFn =
    unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, usize, u64) -> *mut c_void;
/// `ibv_parent_domain_init_attr.free`.
pub type PdFreeFn = unsafe extern "C" fn(*mut IbvPd, *mut c_void, *mut c_void, u64);

/// `struct ibv_parent_domain_init_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvParentDomainInitAttr {
    pub pd: *mut IbvPd,
    pub td: *mut IbvTd,
    pub comp_mask: u32,
    pub alloc: Option<PdAllocFn>,
    pub free: Option<PdFreeFn>,
    pub pd_context: *mut c_void,
}

/// `struct ibv_ah`.
#[repr(C)]
pub struct IbvAh {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub handle: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut IbvSrq,
    pub cap: IbvQpCap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

/// `struct ibv_rx_hash_conf`.
#[repr(C)]
pub struct IbvRxHashConf {
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
}

/// `struct ibv_qp_init_attr_ex`: `struct ibv_qp_init_attr` and the extended fields after it.
#[repr(C)]
pub struct IbvQpInitAttrEx {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut IbvSrq,
    pub cap: IbvQpCap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut IbvPd,
    pub xrcd: *mut IbvXrcd,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: IbvRxHashConf,
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

/// `verbs_context.create_qp_ex`.
pub type CreateQpExFn = unsafe extern "C" fn(*mut IbvContext, *mut IbvQpInitAttrEx) -> *mut IbvQp;

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvGlobalRoute {
    pub dgid: IbvGid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvAhAttr {
    pub grh: IbvGlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvQpAttr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: IbvQpCap,
    pub ah_attr: IbvAhAttr,
    pub alt_ah_attr: IbvAhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
pub struct IbvSrqAttr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct IbvSrqInitAttr {
    pub srq_context: *mut c_void,
    pub attr: IbvSrqAttr,
}

/// `struct ibv_srq_init_attr_ex`.
#[repr(C)]
pub struct IbvSrqInitAttrEx {
    pub srq_context: *mut c_void,
    pub attr: IbvSrqAttr,
    pub comp_mask: u32,
    pub srq_type: c_int,
    pub pd: *mut IbvPd,
    pub xrcd: *mut IbvXrcd,
    pub cq: *mut IbvCq,
    pub tm_cap: IbvTmCap,
}

/// `struct ibv_xrcd`.
#[repr(C)]
pub struct IbvXrcd {
    pub context: *mut IbvContext,
}

/// `struct ibv_xrcd_init_attr`.
#[repr(C)]
pub struct IbvXrcdInitAttr {
    pub comp_mask: u32,
    pub fd: c_int,
    pub oflags: c_int,
}

/// `struct ibv_qp_open_attr`.
#[repr(C)]
pub struct IbvQpOpenAttr {
    pub comp_mask: u32,
    pub qp_num: u32,
    pub xrcd: *mut IbvXrcd,
    pub qp_context: *mut c_void,
    pub qp_type: c_int,
}

/// `struct ibv_async_event`: `element` is the union of the CQ, QP, SRQ or WQ pointer and the
/// port number.
#[repr(C)]
pub struct IbvAsyncEvent {
    pub element: *mut c_void,
    pub event_type: c_int,
}

/// `struct ibv_sge`.
#[repr(C)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct IbvRecvWr {
    pub wr_id: u64,
    pub next: *mut Self,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
}

/// `wr.rdma` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WrRdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `wr.atomic` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WrAtomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `wr.ud` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WrUd {
    pub ah: *mut IbvAh,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// The `wr` union of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union WrUnion {
    pub rdma: WrRdma,
    pub atomic: WrAtomic,
    pub ud: WrUd,
}

/// `struct ibv_send_wr`. `imm_data` is big-endian (`__be32`); the trailing unions (XRC's
/// `remote_srqn`, memory-window binding and TSO) are opaque here.
#[repr(C)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut Self,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: c_uint,
    pub imm_data: u32,
    pub wr: WrUnion,
    pub qp_type: u32,
    /// The `bind_mw` member of the union it shares with `tso`.
    pub bind_mw: IbvSendWrBindMw,
}

/// `ibv_send_wr.bind_mw`: a type 2 bind request (`IBV_WR_BIND_MW`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvSendWrBindMw {
    pub mw: *mut IbvMw,
    pub rkey: u32,
    pub bind_info: IbvMwBindInfo,
}

/// `struct ibv_mw`.
#[repr(C)]
pub struct IbvMw {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub rkey: u32,
    pub handle: u32,
    pub mw_type: c_int,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvMwBindInfo {
    pub mr: *mut IbvMr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

/// `struct ibv_mw_bind`: a type 1 bind (`ibv_bind_mw(3)`).
#[repr(C)]
pub struct IbvMwBind {
    pub wr_id: u64,
    pub send_flags: c_uint,
    pub bind_info: IbvMwBindInfo,
}

/// `struct ibv_wc`. `imm_data` is big-endian.
#[repr(C)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: c_int,
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_grh`: the 40 bytes at the start of a UD receive buffer.
#[repr(C)]
pub struct IbvGrh {
    pub version_tclass_flow: u32,
    pub paylen: u16,
    pub next_hdr: u8,
    pub hop_limit: u8,
    pub sgid: IbvGid,
    pub dgid: IbvGid,
}

/// Constants of the header's enums.
pub mod consts {
    use core::ffi::c_int;

    pub const IBV_NODE_CA: c_int = 1;
    pub const IBV_TRANSPORT_IB: c_int = 0;

    pub const IBV_QPT_RC: c_int = 2;
    pub const IBV_QPT_UC: c_int = 3;
    pub const IBV_QPT_UD: c_int = 4;
    pub const IBV_QPT_XRC_SEND: c_int = 9;
    pub const IBV_QPT_XRC_RECV: c_int = 10;

    pub const IBV_SRQT_BASIC: c_int = 0;
    pub const IBV_SRQT_XRC: c_int = 1;
    pub const IBV_SRQ_INIT_ATTR_TYPE: u32 = 1 << 0;
    pub const IBV_SRQ_INIT_ATTR_PD: u32 = 1 << 1;
    pub const IBV_SRQ_INIT_ATTR_XRCD: u32 = 1 << 2;
    pub const IBV_SRQ_INIT_ATTR_CQ: u32 = 1 << 3;
    pub const IBV_SRQT_TM: c_int = 2;
    pub const IBV_SRQ_INIT_ATTR_TM: u32 = 1 << 4;
    pub const IBV_WR_TAG_ADD: c_int = 0;
    pub const IBV_WR_TAG_DEL: c_int = 1;
    pub const IBV_WR_TAG_SYNC: c_int = 2;
    pub const IBV_OPS_SIGNALED: c_int = 1 << 0;
    pub const IBV_OPS_TM_SYNC: c_int = 1 << 1;
    pub const IBV_TM_CAP_RC: u32 = 1 << 0;
    pub const IBV_XRCD_INIT_ATTR_FD: u32 = 1 << 0;
    pub const IBV_XRCD_INIT_ATTR_OFLAGS: u32 = 1 << 1;
    pub const IBV_QP_OPEN_ATTR_NUM: u32 = 1 << 0;
    pub const IBV_QP_OPEN_ATTR_XRCD: u32 = 1 << 1;
    pub const IBV_QP_OPEN_ATTR_CONTEXT: u32 = 1 << 2;
    pub const IBV_QP_OPEN_ATTR_TYPE: u32 = 1 << 3;
    pub const IBV_QP_INIT_ATTR_XRCD: u32 = 1 << 1;
    pub const IBV_DEVICE_XRC: u32 = 1 << 20;

    pub const IBV_QPS_RESET: c_int = 0;
    pub const IBV_QPS_INIT: c_int = 1;
    pub const IBV_QPS_RTR: c_int = 2;
    pub const IBV_QPS_RTS: c_int = 3;
    pub const IBV_QPS_SQD: c_int = 4;
    pub const IBV_QPS_SQE: c_int = 5;
    pub const IBV_QPS_ERR: c_int = 6;

    pub const IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;
    pub const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
    pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;
    pub const IBV_QP_EX_WITH_RDMA_WRITE: u64 = 1 << 0;
    pub const IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM: u64 = 1 << 1;
    pub const IBV_QP_EX_WITH_SEND: u64 = 1 << 2;
    pub const IBV_QP_EX_WITH_SEND_WITH_IMM: u64 = 1 << 3;
    pub const IBV_QP_EX_WITH_RDMA_READ: u64 = 1 << 4;
    pub const IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP: u64 = 1 << 5;
    pub const IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD: u64 = 1 << 6;

    pub const IBV_QP_STATE: c_int = 1 << 0;
    pub const IBV_QP_CUR_STATE: c_int = 1 << 1;
    pub const IBV_QP_EN_SQD_ASYNC_NOTIFY: c_int = 1 << 2;
    pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
    pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
    pub const IBV_QP_PORT: c_int = 1 << 5;
    pub const IBV_QP_QKEY: c_int = 1 << 6;
    pub const IBV_QP_AV: c_int = 1 << 7;
    pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
    pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
    pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
    pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
    pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
    pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
    pub const IBV_QP_ALT_PATH: c_int = 1 << 14;
    pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
    pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
    pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
    pub const IBV_QP_PATH_MIG_STATE: c_int = 1 << 18;
    pub const IBV_QP_CAP: c_int = 1 << 19;
    pub const IBV_QP_DEST_QPN: c_int = 1 << 20;
    pub const IBV_QP_RATE_LIMIT: c_int = 1 << 25;

    pub const IBV_WR_RDMA_WRITE: c_int = 0;
    pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_int = 1;
    pub const IBV_WR_SEND: c_int = 2;
    pub const IBV_WR_SEND_WITH_IMM: c_int = 3;
    pub const IBV_WR_RDMA_READ: c_int = 4;
    pub const IBV_WR_ATOMIC_CMP_AND_SWP: c_int = 5;
    pub const IBV_WR_ATOMIC_FETCH_AND_ADD: c_int = 6;
    pub const IBV_WR_LOCAL_INV: c_int = 7;
    pub const IBV_WR_BIND_MW: c_int = 8;
    pub const IBV_WR_ATOMIC_WRITE: c_int = 15;
    pub const IBV_WR_SEND_WITH_INV: c_int = 9;
    pub const IBV_MW_TYPE_1: c_int = 1;
    pub const IBV_MW_TYPE_2: c_int = 2;
    pub const IBV_DEVICE_MEM_WINDOW: u32 = 1 << 17;
    pub const IBV_DEVICE_MEM_WINDOW_TYPE_2B: u32 = 1 << 24;
    pub const IBV_QP_EX_WITH_LOCAL_INV: u64 = 1 << 7;
    pub const IBV_QP_EX_WITH_BIND_MW: u64 = 1 << 8;
    pub const IBV_QP_EX_WITH_ATOMIC_WRITE: u64 = 1 << 12;
    pub const IBV_QP_EX_WITH_SEND_WITH_INV: u64 = 1 << 9;

    pub const IBV_SEND_FENCE: u32 = 1;
    pub const IBV_SEND_SIGNALED: u32 = 2;
    pub const IBV_SEND_SOLICITED: u32 = 4;
    pub const IBV_SEND_INLINE: u32 = 8;

    pub const IBV_WC_SEND: c_int = 0;
    pub const IBV_WC_RDMA_WRITE: c_int = 1;
    pub const IBV_WC_RDMA_READ: c_int = 2;
    pub const IBV_WC_COMP_SWAP: c_int = 3;
    pub const IBV_WC_FETCH_ADD: c_int = 4;
    pub const IBV_WC_BIND_MW: c_int = 5;
    pub const IBV_WC_LOCAL_INV: c_int = 6;
    pub const IBV_WC_ATOMIC_WRITE: c_int = 9;
    pub const IBV_WC_RECV: c_int = 128;
    pub const IBV_WC_RECV_RDMA_WITH_IMM: c_int = 129;
    pub const IBV_WC_TM_ADD: c_int = 130;
    pub const IBV_WC_TM_DEL: c_int = 131;
    pub const IBV_WC_TM_SYNC: c_int = 132;
    pub const IBV_WC_TM_RECV: c_int = 133;
    pub const IBV_WC_TM_NO_TAG: c_int = 134;
    pub const IBV_WC_TM_SYNC_REQ: u32 = 1 << 4;
    pub const IBV_WC_TM_MATCH: u32 = 1 << 5;
    pub const IBV_WC_TM_DATA_VALID: u32 = 1 << 6;
    pub const IBV_WC_EX_WITH_TM_INFO: u64 = 1 << 10;
    pub const IBV_WC_TM_ERR: c_int = 22;
    pub const IBV_WC_TM_RNDV_INCOMPLETE: c_int = 23;
    pub const IBV_WC_GRH: u32 = 1;
    pub const IBV_WC_WITH_IMM: u32 = 2;
    pub const IBV_WC_WITH_INV: u32 = 1 << 3;

    pub const IBV_WC_EX_WITH_BYTE_LEN: u64 = 1 << 0;
    pub const IBV_WC_EX_WITH_IMM: u64 = 1 << 1;
    pub const IBV_WC_EX_WITH_QP_NUM: u64 = 1 << 2;
    pub const IBV_WC_EX_WITH_SRC_QP: u64 = 1 << 3;
    pub const IBV_WC_EX_WITH_SLID: u64 = 1 << 4;
    pub const IBV_WC_EX_WITH_SL: u64 = 1 << 5;
    pub const IBV_WC_EX_WITH_DLID_PATH_BITS: u64 = 1 << 6;
    pub const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP: u64 = 1 << 7;
    pub const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK: u64 = 1 << 11;
    pub const IBV_WC_STANDARD_FLAGS: u64 = IBV_WC_EX_WITH_BYTE_LEN
        | IBV_WC_EX_WITH_IMM
        | IBV_WC_EX_WITH_QP_NUM
        | IBV_WC_EX_WITH_SRC_QP
        | IBV_WC_EX_WITH_SLID
        | IBV_WC_EX_WITH_SL
        | IBV_WC_EX_WITH_DLID_PATH_BITS;
    pub const IBV_CQ_INIT_ATTR_MASK_FLAGS: u32 = 1 << 0;
    pub const IBV_CQ_INIT_ATTR_MASK_PD: u32 = 1 << 1;
    pub const IBV_CREATE_CQ_ATTR_SINGLE_THREADED: u32 = 1 << 0;
    pub const IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN: u32 = 1 << 1;
    pub const IBV_VALUES_MASK_RAW_CLOCK: u32 = 1 << 0;

    pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
    pub const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
    pub const IBV_ACCESS_REMOTE_READ: c_int = 4;
    pub const IBV_ACCESS_REMOTE_ATOMIC: c_int = 8;
    pub const IBV_REREG_MR_CHANGE_TRANSLATION: c_int = 1 << 0;
    pub const IBV_REREG_MR_CHANGE_PD: c_int = 1 << 1;
    pub const IBV_REREG_MR_CHANGE_ACCESS: c_int = 1 << 2;
    pub const IBV_ACCESS_MW_BIND: c_int = 1 << 4;
    pub const IBV_ACCESS_ZERO_BASED: c_int = 1 << 5;
    pub const IBV_ACCESS_ON_DEMAND: c_int = 1 << 6;
    pub const IBV_ACCESS_HUGETLB: c_int = 1 << 7;
    pub const IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS: u32 = 1 << 0;
    pub const IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT: u32 = 1 << 1;
    pub const IBV_ADVISE_MR_ADVICE_PREFETCH: c_int = 0;
    pub const IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE: c_int = 1;
    pub const IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT: c_int = 2;
    pub const IBV_ADVISE_MR_FLAG_FLUSH: u32 = 1;
    pub const IBV_ODP_SUPPORT: u64 = 1 << 0;
    pub const IBV_ODP_SUPPORT_IMPLICIT: u64 = 1 << 1;
    pub const IBV_ODP_SUPPORT_SEND: u32 = 1 << 0;
    pub const IBV_ODP_SUPPORT_RECV: u32 = 1 << 1;
    pub const IBV_ODP_SUPPORT_WRITE: u32 = 1 << 2;
    pub const IBV_ODP_SUPPORT_READ: u32 = 1 << 3;
    pub const IBV_ODP_SUPPORT_ATOMIC: u32 = 1 << 4;
    pub const IBV_ODP_SUPPORT_SRQ_RECV: u32 = 1 << 5;
    /// `IBV_ACCESS_OPTIONAL_RANGE`: hints a provider may ignore (relaxed ordering among them).
    pub const IBV_ACCESS_OPTIONAL_RANGE: c_int = 0x3ff0_0000;

    pub const IBV_SRQ_MAX_WR: c_int = 1;
    pub const IBV_SRQ_LIMIT: c_int = 2;

    pub const IBV_PORT_ACTIVE: c_int = 4;
    pub const IBV_MTU_4096: c_int = 5;
    pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
    pub const IBV_QPF_GRH_REQUIRED: u8 = 1;
    /// PortInfo ActiveWidth 1X (IBA 14.2.5.6; not named in the header).
    pub const ACTIVE_WIDTH_1X: u8 = 1;
    /// PortInfo ActiveSpeed QDR, 10 Gbit/s per lane (IBA 14.2.5.6; not named in the header).
    pub const ACTIVE_SPEED_QDR: u8 = 4;
    /// Port physical state `LinkUp`.
    pub const PHYS_STATE_LINK_UP: u8 = 5;

    pub const IBV_ATOMIC_HCA: c_int = 1;
    pub const IBV_DEVICE_RC_RNR_NAK_GEN: u32 = 1 << 12;
    pub const IBV_DEVICE_SYS_IMAGE_GUID: u32 = 1 << 11;

    pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
    /// `IBV_GID_TYPE_SYSFS_ROCE_V2`, what `ibv_query_gid_type` reports.
    pub const IBV_GID_TYPE_SYSFS_ROCE_V2: c_int = 1;

    pub const IBV_EVENT_CQ_ERR: c_int = 0;
    pub const IBV_EVENT_QP_FATAL: c_int = 1;
    pub const IBV_EVENT_QP_ACCESS_ERR: c_int = 3;
    pub const IBV_EVENT_COMM_EST: c_int = 4;
    pub const IBV_EVENT_SRQ_LIMIT_REACHED: c_int = 15;
    pub const IBV_EVENT_QP_LAST_WQE_REACHED: c_int = 16;

    /// `IBV_FORK_UNNEEDED`: no DMA, so a child's copy-on-write pages cannot be a problem.
    pub const IBV_FORK_UNNEEDED: c_int = 2;
}

/// Every size, offset and constant above, checked against the installed header by a C program
/// compiled from this list.
#[cfg(test)]
mod tests {
    use core::mem::{offset_of, size_of};

    use super::consts::*;
    use super::*;

    /// (C expression, the value Rust has for it).
    type Facts = Vec<(String, i128)>;

    macro_rules! layout {
        ($out:ident, $rust:ty, $c:literal, [$($f:ident),* $(,)?]) => {
            $out.push((format!("sizeof(struct {})", $c), size_of::<$rust>() as i128));
            $($out.push((
                format!("offsetof(struct {}, {})", $c, stringify!($f)),
                offset_of!($rust, $f) as i128,
            ));)*
        };
    }

    macro_rules! constants {
        ($out:ident, [$($name:ident),* $(,)?]) => {
            $($out.push((format!("(long long){}", stringify!($name)), i128::from($name)));)*
        };
    }

    fn facts() -> Facts {
        let mut v = Facts::new();
        layout!(
            v,
            IbvDevice,
            "ibv_device",
            [node_type, transport_type, name, dev_name, dev_path, ibdev_path]
        );
        layout!(
            v,
            IbvContextOps,
            "ibv_context_ops",
            [
                alloc_mw,
                bind_mw,
                dealloc_mw,
                poll_cq,
                req_notify_cq,
                post_srq_recv,
                post_send,
                post_recv
            ]
        );
        layout!(
            v,
            IbvContext,
            "ibv_context",
            [device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat]
        );
        layout!(
            v,
            VerbsContext,
            "verbs_context",
            [
                query_port,
                advise_mr,
                reg_dm_mr,
                alloc_dm,
                free_dm,
                alloc_parent_domain,
                dealloc_td,
                alloc_td,
                post_srq_ops,
                query_rt_values,
                create_cq_ex,
                query_device_ex,
                open_qp,
                create_qp_ex,
                get_srq_num,
                create_srq_ex,
                open_xrcd,
                close_xrcd,
                sz,
                context
            ]
        );
        layout!(
            v,
            IbvSrqInitAttrEx,
            "ibv_srq_init_attr_ex",
            [srq_context, attr, comp_mask, srq_type, pd, xrcd, cq, tm_cap]
        );
        layout!(v, IbvXrcd, "ibv_xrcd", [context]);
        layout!(v, IbvTmCap, "ibv_tm_cap", [max_num_tags, max_ops]);
        layout!(v, IbvWcTmInfo, "ibv_wc_tm_info", [tag]);
        v.push((
            "offsetof(struct ibv_wc_tm_info, priv)".into(),
            offset_of!(IbvWcTmInfo, priv_) as i128,
        ));
        layout!(v, IbvOpsWr, "ibv_ops_wr", [wr_id, next, opcode, flags, tm]);
        // The nested `tm` and `tm.add`, by their C paths.
        let tm = offset_of!(IbvOpsWr, tm);
        let add = tm + offset_of!(IbvOpsWrTm, add);
        for (path, at) in [
            ("tm.unexpected_cnt", tm + offset_of!(IbvOpsWrTm, unexpected_cnt)),
            ("tm.handle", tm + offset_of!(IbvOpsWrTm, handle)),
            ("tm.add.recv_wr_id", add + offset_of!(IbvOpsWrAdd, recv_wr_id)),
            ("tm.add.sg_list", add + offset_of!(IbvOpsWrAdd, sg_list)),
            ("tm.add.num_sge", add + offset_of!(IbvOpsWrAdd, num_sge)),
            ("tm.add.tag", add + offset_of!(IbvOpsWrAdd, tag)),
            ("tm.add.mask", add + offset_of!(IbvOpsWrAdd, mask)),
        ] {
            v.push((format!("offsetof(struct ibv_ops_wr, {path})"), at as i128));
        }
        layout!(v, IbvXrcdInitAttr, "ibv_xrcd_init_attr", [comp_mask, fd, oflags]);
        layout!(
            v,
            IbvQpOpenAttr,
            "ibv_qp_open_attr",
            [comp_mask, qp_num, xrcd, qp_context, qp_type]
        );
        layout!(
            v,
            IbvCqEx,
            "ibv_cq_ex",
            [
                comp_mask,
                status,
                wr_id,
                start_poll,
                next_poll,
                end_poll,
                read_opcode,
                read_imm_data,
                read_wc_flags,
                read_sl,
                read_completion_ts,
                read_tm_info,
                read_completion_wallclock_ns
            ]
        );
        layout!(
            v,
            IbvQpEx,
            "ibv_qp_ex",
            [
                qp_base,
                comp_mask,
                wr_id,
                wr_flags,
                wr_atomic_cmp_swp,
                wr_bind_mw,
                wr_rdma_write_imm,
                wr_send,
                wr_send_tso,
                wr_set_ud_addr,
                wr_set_xrc_srqn,
                wr_set_sge_list,
                wr_start,
                wr_complete,
                wr_abort,
                wr_atomic_write
            ]
        );
        layout!(v, IbvDataBuf, "ibv_data_buf", [addr, length]);
        layout!(v, IbvTd, "ibv_td", [context]);
        layout!(v, IbvDm, "ibv_dm", [context, memcpy_to_dm, memcpy_from_dm, comp_mask, handle]);
        layout!(v, IbvAllocDmAttr, "ibv_alloc_dm_attr", [length, log_align_req, comp_mask]);
        layout!(v, IbvTdInitAttr, "ibv_td_init_attr", [comp_mask]);
        layout!(
            v,
            IbvParentDomainInitAttr,
            "ibv_parent_domain_init_attr",
            [pd, td, comp_mask, alloc, free, pd_context]
        );
        layout!(v, IbvMw, "ibv_mw", [context, pd, rkey, handle]);
        v.push(("offsetof(struct ibv_mw, type)".into(), offset_of!(IbvMw, mw_type) as i128));
        layout!(v, IbvMwBindInfo, "ibv_mw_bind_info", [mr, addr, length, mw_access_flags]);
        layout!(v, IbvMwBind, "ibv_mw_bind", [wr_id, send_flags, bind_info]);
        layout!(v, IbvPollCqAttr, "ibv_poll_cq_attr", [comp_mask]);
        layout!(
            v,
            IbvCqInitAttrEx,
            "ibv_cq_init_attr_ex",
            [cqe, cq_context, channel, comp_vector, wc_flags, comp_mask, flags, parent_domain]
        );
        layout!(v, IbvValuesEx, "ibv_values_ex", [comp_mask, raw_clock]);
        layout!(
            v,
            IbvQpInitAttrEx,
            "ibv_qp_init_attr_ex",
            [
                qp_context,
                cap,
                qp_type,
                sq_sig_all,
                comp_mask,
                pd,
                xrcd,
                create_flags,
                max_tso_header,
                rwq_ind_tbl,
                rx_hash_conf,
                source_qpn,
                send_ops_flags
            ]
        );
        layout!(
            v,
            IbvDeviceAttrEx,
            "ibv_device_attr_ex",
            [
                orig_attr,
                comp_mask,
                odp_caps,
                completion_timestamp_mask,
                hca_core_clock,
                device_cap_flags_ex,
                tso_caps,
                rss_caps,
                max_wq_type_rq,
                packet_pacing_caps,
                raw_packet_caps,
                tm_caps,
                cq_mod_caps,
                max_dm_size,
                pci_atomic_caps,
                xrc_odp_caps,
                phys_port_cnt_ex,
            ]
        );
        layout!(v, IbvOdpCaps, "ibv_odp_caps", [general_caps, per_transport_caps]);
        layout!(
            v,
            IbvRssCaps,
            "ibv_rss_caps",
            [
                supported_qpts,
                max_rwq_indirection_tables,
                max_rwq_indirection_table_size,
                rx_hash_fields_mask,
                rx_hash_function
            ]
        );
        layout!(
            v,
            IbvGidEntry,
            "ibv_gid_entry",
            [gid, gid_index, port_num, gid_type, ndev_ifindex]
        );
        layout!(
            v,
            IbvDeviceAttr,
            "ibv_device_attr",
            [
                fw_ver,
                node_guid,
                sys_image_guid,
                max_mr_size,
                page_size_cap,
                vendor_id,
                vendor_part_id,
                hw_ver,
                max_qp,
                max_qp_wr,
                device_cap_flags,
                max_sge,
                max_sge_rd,
                max_cq,
                max_cqe,
                max_mr,
                max_pd,
                max_qp_rd_atom,
                max_ee_rd_atom,
                max_res_rd_atom,
                max_qp_init_rd_atom,
                max_ee_init_rd_atom,
                atomic_cap,
                max_ee,
                max_rdd,
                max_mw,
                max_raw_ipv6_qp,
                max_raw_ethy_qp,
                max_mcast_grp,
                max_mcast_qp_attach,
                max_total_mcast_qp_attach,
                max_ah,
                max_fmr,
                max_map_per_fmr,
                max_srq,
                max_srq_wr,
                max_srq_sge,
                max_pkeys,
                local_ca_ack_delay,
                phys_port_cnt,
            ]
        );
        layout!(
            v,
            IbvPortAttr,
            "ibv_port_attr",
            [
                state,
                max_mtu,
                active_mtu,
                gid_tbl_len,
                port_cap_flags,
                max_msg_sz,
                bad_pkey_cntr,
                qkey_viol_cntr,
                pkey_tbl_len,
                lid,
                sm_lid,
                lmc,
                max_vl_num,
                sm_sl,
                subnet_timeout,
                init_type_reply,
                active_width,
                active_speed,
                phys_state,
                link_layer,
                flags,
                port_cap_flags2,
            ]
        );
        layout!(v, IbvPd, "ibv_pd", [context, handle]);
        layout!(v, IbvMr, "ibv_mr", [context, pd, addr, length, handle, lkey, rkey]);
        layout!(v, IbvCompChannel, "ibv_comp_channel", [context, fd, refcnt]);
        layout!(
            v,
            IbvCq,
            "ibv_cq",
            [
                context,
                channel,
                cq_context,
                handle,
                cqe,
                mutex,
                cond,
                comp_events_completed,
                async_events_completed,
            ]
        );
        layout!(
            v,
            IbvSrq,
            "ibv_srq",
            [context, srq_context, pd, handle, mutex, cond, events_completed]
        );
        layout!(
            v,
            IbvQp,
            "ibv_qp",
            [
                context,
                qp_context,
                pd,
                send_cq,
                recv_cq,
                srq,
                handle,
                qp_num,
                state,
                qp_type,
                mutex,
                cond,
                events_completed,
            ]
        );
        layout!(v, IbvAh, "ibv_ah", [context, pd, handle]);
        layout!(
            v,
            IbvQpCap,
            "ibv_qp_cap",
            [max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data]
        );
        layout!(
            v,
            IbvQpInitAttr,
            "ibv_qp_init_attr",
            [qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all]
        );
        layout!(
            v,
            IbvGlobalRoute,
            "ibv_global_route",
            [dgid, flow_label, sgid_index, hop_limit, traffic_class]
        );
        layout!(
            v,
            IbvAhAttr,
            "ibv_ah_attr",
            [grh, dlid, sl, src_path_bits, static_rate, is_global, port_num]
        );
        layout!(
            v,
            IbvQpAttr,
            "ibv_qp_attr",
            [
                qp_state,
                cur_qp_state,
                path_mtu,
                path_mig_state,
                qkey,
                rq_psn,
                sq_psn,
                dest_qp_num,
                qp_access_flags,
                cap,
                ah_attr,
                alt_ah_attr,
                pkey_index,
                alt_pkey_index,
                en_sqd_async_notify,
                sq_draining,
                max_rd_atomic,
                max_dest_rd_atomic,
                min_rnr_timer,
                port_num,
                timeout,
                retry_cnt,
                rnr_retry,
                alt_port_num,
                alt_timeout,
                rate_limit,
            ]
        );
        layout!(v, IbvSrqAttr, "ibv_srq_attr", [max_wr, max_sge, srq_limit]);
        layout!(v, IbvSrqInitAttr, "ibv_srq_init_attr", [srq_context, attr]);
        layout!(v, IbvAsyncEvent, "ibv_async_event", [element, event_type]);
        layout!(v, IbvSge, "ibv_sge", [addr, length, lkey]);
        layout!(v, IbvRecvWr, "ibv_recv_wr", [wr_id, next, sg_list, num_sge]);
        layout!(
            v,
            IbvSendWr,
            "ibv_send_wr",
            [wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data, wr, qp_type]
        );
        let wr = offset_of!(IbvSendWr, wr) as i128;
        for (c, rust) in [
            ("wr.rdma.remote_addr", offset_of!(WrRdma, remote_addr)),
            ("wr.rdma.rkey", offset_of!(WrRdma, rkey)),
            ("wr.atomic.remote_addr", offset_of!(WrAtomic, remote_addr)),
            ("wr.atomic.compare_add", offset_of!(WrAtomic, compare_add)),
            ("wr.atomic.swap", offset_of!(WrAtomic, swap)),
            ("wr.atomic.rkey", offset_of!(WrAtomic, rkey)),
            ("wr.ud.ah", offset_of!(WrUd, ah)),
            ("wr.ud.remote_qpn", offset_of!(WrUd, remote_qpn)),
            ("wr.ud.remote_qkey", offset_of!(WrUd, remote_qkey)),
        ] {
            v.push((format!("offsetof(struct ibv_send_wr, {c})"), wr + rust as i128));
        }
        let bind = offset_of!(IbvSendWr, bind_mw) as i128;
        v.push(("offsetof(struct ibv_send_wr, bind_mw)".into(), bind));
        for (c, rust) in [
            ("bind_mw.mw", offset_of!(IbvSendWrBindMw, mw)),
            ("bind_mw.rkey", offset_of!(IbvSendWrBindMw, rkey)),
            ("bind_mw.bind_info", offset_of!(IbvSendWrBindMw, bind_info)),
        ] {
            v.push((format!("offsetof(struct ibv_send_wr, {c})"), bind + rust as i128));
        }
        layout!(
            v,
            IbvWc,
            "ibv_wc",
            [
                wr_id,
                status,
                opcode,
                vendor_err,
                byte_len,
                imm_data,
                qp_num,
                src_qp,
                wc_flags,
                pkey_index,
                slid,
                sl,
                dlid_path_bits,
            ]
        );
        layout!(
            v,
            IbvGrh,
            "ibv_grh",
            [version_tclass_flow, paylen, next_hdr, hop_limit, sgid, dgid]
        );
        v.push(("offsetof(struct ibv_port_attr, flags) + 1".into(), COMPAT_PORT_ATTR_SIZE as i128));
        constants!(
            v,
            [
                IBV_NODE_CA,
                IBV_TRANSPORT_IB,
                IBV_QPT_RC,
                IBV_QPT_UC,
                IBV_QPT_UD,
                IBV_QPS_RESET,
                IBV_QPS_INIT,
                IBV_QPS_RTR,
                IBV_QPS_RTS,
                IBV_QPS_SQD,
                IBV_QPS_SQE,
                IBV_QPS_ERR,
                IBV_QP_STATE,
                IBV_QP_ACCESS_FLAGS,
                IBV_QP_PKEY_INDEX,
                IBV_QP_PORT,
                IBV_QP_QKEY,
                IBV_QP_AV,
                IBV_QP_PATH_MTU,
                IBV_QP_TIMEOUT,
                IBV_QP_RETRY_CNT,
                IBV_QP_RNR_RETRY,
                IBV_QP_RQ_PSN,
                IBV_QP_MAX_QP_RD_ATOMIC,
                IBV_QP_ALT_PATH,
                IBV_QP_MIN_RNR_TIMER,
                IBV_QP_SQ_PSN,
                IBV_QP_MAX_DEST_RD_ATOMIC,
                IBV_QP_DEST_QPN,
                IBV_WR_RDMA_WRITE,
                IBV_WR_RDMA_WRITE_WITH_IMM,
                IBV_WR_SEND,
                IBV_WR_SEND_WITH_IMM,
                IBV_WR_RDMA_READ,
                IBV_WR_ATOMIC_CMP_AND_SWP,
                IBV_WR_ATOMIC_FETCH_AND_ADD,
                IBV_WR_LOCAL_INV,
                IBV_WR_BIND_MW,
                IBV_WR_SEND_WITH_INV,
                IBV_MW_TYPE_1,
                IBV_MW_TYPE_2,
                IBV_DEVICE_MEM_WINDOW,
                IBV_DEVICE_MEM_WINDOW_TYPE_2B,
                IBV_QP_EX_WITH_LOCAL_INV,
                IBV_QP_EX_WITH_BIND_MW,
                IBV_QP_EX_WITH_SEND_WITH_INV,
                IBV_WC_BIND_MW,
                IBV_WC_LOCAL_INV,
                IBV_WC_WITH_INV,
                IBV_SEND_FENCE,
                IBV_SEND_SIGNALED,
                IBV_SEND_SOLICITED,
                IBV_SEND_INLINE,
                IBV_WC_SEND,
                IBV_WC_RDMA_WRITE,
                IBV_WC_RDMA_READ,
                IBV_WC_COMP_SWAP,
                IBV_WC_FETCH_ADD,
                IBV_WC_RECV,
                IBV_WC_RECV_RDMA_WITH_IMM,
                IBV_WC_GRH,
                IBV_WC_WITH_IMM,
                IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                IBV_QP_INIT_ATTR_XRCD,
                IBV_WR_ATOMIC_WRITE,
                IBV_WC_ATOMIC_WRITE,
                IBV_QP_EX_WITH_ATOMIC_WRITE,
                IBV_QPT_XRC_SEND,
                IBV_QPT_XRC_RECV,
                IBV_SRQT_BASIC,
                IBV_SRQT_XRC,
                IBV_SRQT_TM,
                IBV_SRQ_INIT_ATTR_TM,
                IBV_WR_TAG_ADD,
                IBV_WR_TAG_DEL,
                IBV_WR_TAG_SYNC,
                IBV_OPS_SIGNALED,
                IBV_OPS_TM_SYNC,
                IBV_TM_CAP_RC,
                IBV_WC_TM_ADD,
                IBV_WC_TM_DEL,
                IBV_WC_TM_SYNC,
                IBV_WC_TM_RECV,
                IBV_WC_TM_NO_TAG,
                IBV_WC_TM_SYNC_REQ,
                IBV_WC_TM_MATCH,
                IBV_WC_TM_DATA_VALID,
                IBV_WC_EX_WITH_TM_INFO,
                IBV_WC_TM_ERR,
                IBV_WC_TM_RNDV_INCOMPLETE,
                IBV_SRQ_INIT_ATTR_TYPE,
                IBV_SRQ_INIT_ATTR_PD,
                IBV_SRQ_INIT_ATTR_XRCD,
                IBV_SRQ_INIT_ATTR_CQ,
                IBV_XRCD_INIT_ATTR_FD,
                IBV_XRCD_INIT_ATTR_OFLAGS,
                IBV_QP_OPEN_ATTR_NUM,
                IBV_QP_OPEN_ATTR_XRCD,
                IBV_QP_OPEN_ATTR_CONTEXT,
                IBV_QP_OPEN_ATTR_TYPE,
                IBV_DEVICE_XRC,
                IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS,
                IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
                IBV_ADVISE_MR_ADVICE_PREFETCH,
                IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
                IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT,
                IBV_ADVISE_MR_FLAG_FLUSH,
                IBV_ODP_SUPPORT,
                IBV_ODP_SUPPORT_IMPLICIT,
                IBV_ODP_SUPPORT_SEND,
                IBV_ODP_SUPPORT_RECV,
                IBV_ODP_SUPPORT_WRITE,
                IBV_ODP_SUPPORT_READ,
                IBV_ODP_SUPPORT_ATOMIC,
                IBV_ODP_SUPPORT_SRQ_RECV,
                IBV_QP_EX_WITH_RDMA_WRITE,
                IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM,
                IBV_QP_EX_WITH_SEND,
                IBV_QP_EX_WITH_SEND_WITH_IMM,
                IBV_QP_EX_WITH_RDMA_READ,
                IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP,
                IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
                IBV_WC_EX_WITH_BYTE_LEN,
                IBV_WC_EX_WITH_IMM,
                IBV_WC_EX_WITH_QP_NUM,
                IBV_WC_EX_WITH_SRC_QP,
                IBV_WC_EX_WITH_SLID,
                IBV_WC_EX_WITH_SL,
                IBV_WC_EX_WITH_DLID_PATH_BITS,
                IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
                IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK,
                IBV_WC_STANDARD_FLAGS,
                IBV_CQ_INIT_ATTR_MASK_FLAGS,
                IBV_CQ_INIT_ATTR_MASK_PD,
                IBV_CREATE_CQ_ATTR_SINGLE_THREADED,
                IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN,
                IBV_VALUES_MASK_RAW_CLOCK,
                IBV_ACCESS_LOCAL_WRITE,
                IBV_ACCESS_REMOTE_WRITE,
                IBV_ACCESS_REMOTE_READ,
                IBV_ACCESS_REMOTE_ATOMIC,
                IBV_ACCESS_OPTIONAL_RANGE,
                IBV_SRQ_MAX_WR,
                IBV_SRQ_LIMIT,
                IBV_PORT_ACTIVE,
                IBV_MTU_4096,
                IBV_LINK_LAYER_ETHERNET,
                IBV_QPF_GRH_REQUIRED,
                IBV_ATOMIC_HCA,
                IBV_DEVICE_RC_RNR_NAK_GEN,
                IBV_DEVICE_SYS_IMAGE_GUID,
                IBV_GID_TYPE_ROCE_V2,
                IBV_EVENT_CQ_ERR,
                IBV_EVENT_QP_FATAL,
                IBV_EVENT_QP_ACCESS_ERR,
                IBV_EVENT_COMM_EST,
                IBV_EVENT_SRQ_LIMIT_REACHED,
                IBV_EVENT_QP_LAST_WQE_REACHED,
                IBV_FORK_UNNEEDED,
            ]
        );
        v.push(("(long long)IBV_SYSFS_NAME_MAX".into(), SYSFS_NAME_MAX as i128));
        v.push(("(long long)IBV_SYSFS_PATH_MAX".into(), SYSFS_PATH_MAX as i128));
        v.push(("(long long)(uintptr_t)__VERBS_ABI_IS_EXTENDED".into(), i128::from(u64::MAX)));
        v
    }

    fn c_program(facts: &Facts) -> String {
        let mut c = String::from(
            "#include <stddef.h>\n#include <stdint.h>\n#include <stdio.h>\n\
             #include <infiniband/verbs.h>\nint main(void) {\n",
        );
        for (i, (expr, _)) in facts.iter().enumerate() {
            // Unsigned print so that all-ones (the extended-ABI marker) compares as u64.
            c.push_str(&format!("    printf(\"{i} %llu\\n\", (unsigned long long)({expr}));\n"));
        }
        c.push_str("    return 0;\n}\n");
        c
    }

    /// Compiles the list as C against `<infiniband/verbs.h>` and compares every value.
    #[test]
    fn layouts_and_constants_match_the_installed_header() {
        let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
        if !header.exists() {
            let why = "no /usr/include/infiniband/verbs.h (Debian: libibverbs-dev)";
            assert!(std::env::var_os("CI").is_none(), "{why}: required under CI");
            eprintln!("skipped: {why}");
            return;
        }
        let facts = facts();
        let dir = std::env::temp_dir().join(format!("uroce-verbs-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("layout.c");
        let exe = dir.join("layout");
        std::fs::write(&src, c_program(&facts)).unwrap();
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let built = std::process::Command::new(&cc).arg("-o").arg(&exe).arg(&src).output().unwrap();
        assert!(built.status.success(), "{cc} failed:\n{}", String::from_utf8_lossy(&built.stderr));
        let out = std::process::Command::new(&exe).output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let mut wrong = Vec::new();
        for line in text.lines() {
            let (i, value) = line.split_once(' ').unwrap();
            let (expr, rust) = &facts[i.parse::<usize>().unwrap()];
            let c: u64 = value.parse().unwrap();
            if i128::from(c) != *rust && !(*rust < 0 && i128::from(c.cast_signed()) == *rust) {
                wrong.push(format!("{expr}: C says {c}, Rust says {rust}"));
            }
        }
        assert_eq!(text.lines().count(), facts.len());
        let _ = std::fs::remove_dir_all(&dir);
        assert!(wrong.is_empty(), "layout mismatches:\n{}", wrong.join("\n"));
    }
}
