//! The verbs backend: the tests on any device a system's `libibverbs.so.1` lists — a hardware
//! RNIC, rxe, or uroce's own drop-in — set up as perftest sets up its QPs (port 1, one GID
//! index, RESET → INIT → RTR → RTS with the peer's QPN, PSN and GID exchanged out of band).

use core::ffi::c_int;
use core::time::Duration;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

use uroce::{Endpoint, Mtu, Psn, QpType, Qpn, RKey, RemoteMr};
use uroce_verbs_abi::consts::{
    IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_ATOMIC, IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE, IBV_PORT_ACTIVE, IBV_QP_ACCESS_FLAGS, IBV_QP_AV, IBV_QP_DEST_QPN,
    IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_MAX_QP_RD_ATOMIC, IBV_QP_MIN_RNR_TIMER, IBV_QP_PATH_MTU,
    IBV_QP_PKEY_INDEX, IBV_QP_PORT, IBV_QP_QKEY, IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY, IBV_QP_RQ_PSN,
    IBV_QP_SQ_PSN, IBV_QP_STATE, IBV_QP_TIMEOUT, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS,
    IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_SEND_INLINE, IBV_WC_GRH, IBV_WC_RECV,
    IBV_WC_RECV_RDMA_WITH_IMM, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD,
    IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND,
};
use uroce_verbs_abi::{IbvAhAttr, IbvGid, IbvGlobalRoute, IbvWc, WrAtomic, WrRdma, WrUd, WrUnion};

use super::libibverbs::{self, Ah, Context, Cq, Lib, Mr, Pd, Qp, SendWr};
use super::uroce::QKEY;
use super::{Completion, Device, Kind, Queues, SidePlan, Work};

/// The one port the tests use (perftest's default, `-i 1`).
const PORT: u8 = 1;
/// Completions taken per `ibv_poll_cq`.
const POLL_BATCH: usize = 32;

/// A device of the system's libibverbs, opened for the tests.
pub(crate) struct VerbsDevice {
    ctx: Arc<Context>,
    gid_index: c_int,
    /// This side's GID, as an address (IPv4-mapped GIDs as IPv4).
    gid: IpAddr,
    /// The port's active MTU.
    port_mtu: Mtu,
}

/// The `enum ibv_mtu` value of an MTU (`IBV_MTU_256` = 1 … `IBV_MTU_4096` = 5): its IBA code.
fn ibv_mtu(m: Mtu) -> c_int {
    c_int::from(m.code())
}

/// The MTU of an `enum ibv_mtu` value; `None` for anything else.
fn mtu_of(v: c_int) -> Option<Mtu> {
    u8::try_from(v).ok().and_then(Mtu::from_code)
}

/// A GID as an address: IPv4-mapped (`::ffff:a.b.c.d`, RoCE v2 over IPv4) as IPv4.
fn gid_addr(raw: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(raw);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

/// An address as a GID.
fn addr_gid(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// A random 24-bit PSN (the standard library's per-process random hash keys, from the OS).
fn random_psn() -> u32 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(u64::from(std::process::id()));
    u32::try_from(h.finish() & 0xff_ffff).unwrap_or(0)
}

impl VerbsDevice {
    /// Loads the library and opens `device` (or the first device listed), checking that port 1
    /// is up and has GID `gid_index`.
    pub(crate) fn open(device: Option<&str>, gid_index: u32) -> Result<Self, String> {
        let lib = Lib::load()?;
        let ctx = Context::open(&lib, device)?;
        let name = ctx.name().to_string();
        let port = ctx.port(PORT).map_err(|e| format!("{name}: {e}"))?;
        if port.state != IBV_PORT_ACTIVE {
            return Err(format!("{name}: port {PORT} is not active (state {})", port.state));
        }
        let port_mtu = mtu_of(port.active_mtu)
            .ok_or_else(|| format!("{name}: port {PORT} reports MTU code {}", port.active_mtu))?;
        let gid_index = c_int::try_from(gid_index).map_err(|_| "a GID index out of range")?;
        let raw = ctx.gid(PORT, gid_index).map_err(|e| format!("{name}: {e}"))?;
        if raw == [0; 16] {
            return Err(format!("{name}: GID index {gid_index} of port {PORT} is empty"));
        }
        Ok(Self { ctx, gid_index, gid: gid_addr(raw), port_mtu })
    }
}

/// The `ibv_qp_type` of a transport.
fn qpt(t: QpType) -> Result<c_int, String> {
    match t {
        QpType::Rc => Ok(IBV_QPT_RC),
        QpType::Uc => Ok(IBV_QPT_UC),
        QpType::Ud => Ok(IBV_QPT_UD),
        other => Err(format!("no test runs on {other:?} QPs")),
    }
}

impl Device for VerbsDevice {
    fn side(&self, plan: &SidePlan) -> Result<(Box<dyn Queues>, Vec<Endpoint>), String> {
        let pd = Pd::new(&self.ctx)?;
        let cq = Cq::new(&self.ctx, plan.cq_depth, plan.events)?;
        let all = IBV_ACCESS_LOCAL_WRITE
            | IBV_ACCESS_REMOTE_WRITE
            | IBV_ACCESS_REMOTE_READ
            | IBV_ACCESS_REMOTE_ATOMIC;
        let buf = Mr::new(&pd, plan.buf_len, IBV_ACCESS_LOCAL_WRITE)?;
        let target = Mr::new(&pd, plan.buf_len, all)?;
        let recv = Mr::new(&pd, plan.recv_len, IBV_ACCESS_LOCAL_WRITE)?;
        let mtu = plan.mtu.unwrap_or(self.port_mtu).min(self.port_mtu);
        let mut qps = Vec::with_capacity(plan.qps);
        let mut endpoints = Vec::with_capacity(plan.qps);
        for _ in 0..plan.qps {
            let mut init = libibverbs::zeroed_init_attr();
            init.cap.max_send_wr = plan.send_depth;
            init.cap.max_recv_wr = plan.recv_depth;
            init.cap.max_send_sge = 1;
            init.cap.max_recv_sge = 1;
            init.cap.max_inline_data = plan.max_inline;
            init.qp_type = qpt(plan.qp_type)?;
            let qp = Qp::new(&pd, &cq, &mut init)?;
            // RESET → INIT (man ibv_modify_qp: the attributes each transition requires).
            let mut a = libibverbs::zeroed_qp_attr();
            a.qp_state = IBV_QPS_INIT;
            a.pkey_index = 0;
            a.port_num = PORT;
            let mut mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
            if plan.qp_type == QpType::Ud {
                a.qkey = QKEY.0;
                mask |= IBV_QP_QKEY;
            } else {
                a.qp_access_flags = u32::try_from(all & !IBV_ACCESS_LOCAL_WRITE).unwrap_or(0);
                mask |= IBV_QP_ACCESS_FLAGS;
            }
            qp.modify(&mut a, mask)?;
            let psn = random_psn();
            endpoints.push(Endpoint {
                gid: self.gid,
                qpn: Qpn::new(qp.num()).ok_or("the library returned a QPN over 24 bits")?,
                psn: Psn::new(psn).ok_or("a PSN over 24 bits")?,
                mtu,
                qkey: QKEY,
                regions: vec![RemoteMr {
                    addr: target.addr(),
                    len: target.len() as u64,
                    rkey: RKey(target.rkey()),
                }],
            });
            qps.push((qp, psn));
        }
        let queues = VerbsQueues {
            ctx: Arc::clone(&self.ctx),
            qp_type: plan.qp_type,
            gid_index: self.gid_index,
            mtu,
            ah: None,
            qps,
            buf,
            target,
            recv,
            cq,
            pd,
            wcs: (0..POLL_BATCH).map(|_| libibverbs::zeroed_wc()).collect(),
        };
        Ok((Box::new(queues), endpoints))
    }

    fn failure_context(&self) -> Option<String> {
        None
    }

    fn sent(&self) -> Option<(u64, u64)> {
        None
    }

    fn describe(&self) -> String {
        format!("verbs {} (GID {} = {})", self.ctx.name(), self.gid_index, self.gid)
    }
}

/// One side of a test on a verbs device. Fields drop in order: the address handle and QPs
/// before the memory, the memory before the CQ, the CQ before the PD.
struct VerbsQueues {
    ctx: Arc<Context>,
    qp_type: QpType,
    gid_index: c_int,
    mtu: Mtu,
    ah: Option<Ah>,
    /// Each QP and the first PSN it sends.
    qps: Vec<(Qp, u32)>,
    buf: Mr,
    target: Mr,
    recv: Mr,
    cq: Arc<Cq>,
    pd: Arc<Pd>,
    /// Where `ibv_poll_cq` writes.
    wcs: Vec<IbvWc>,
}

impl VerbsQueues {
    fn qp(&self, i: usize) -> Result<&Qp, String> {
        self.qps.get(i).map(|(q, _)| q).ok_or_else(|| format!("no QP {i}"))
    }

    /// The address vector of a peer (RoCE: a GRH to its GID from ours).
    fn ah_attr(&self, peer: IpAddr) -> IbvAhAttr {
        IbvAhAttr {
            grh: IbvGlobalRoute {
                dgid: IbvGid { raw: addr_gid(peer) },
                flow_label: 0,
                sgid_index: u8::try_from(self.gid_index).unwrap_or(0),
                hop_limit: 64,
                traffic_class: 0,
            },
            dlid: 0,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            is_global: 1,
            port_num: PORT,
        }
    }

    /// INIT → RTR → RTS of one QP towards `peer` (man ibv_modify_qp; perftest's values: 7
    /// retries, 7 RNR retries, timeout 14, 16 outstanding READs/atomics each way).
    fn connect_one(&self, qp: &Qp, my_psn: u32, peer: &Endpoint) -> Result<(), String> {
        let mut a = libibverbs::zeroed_qp_attr();
        a.qp_state = IBV_QPS_RTR;
        let mut mask = IBV_QP_STATE;
        if self.qp_type != QpType::Ud {
            a.path_mtu = ibv_mtu(self.mtu.min(peer.mtu));
            a.dest_qp_num = peer.qpn.get();
            a.rq_psn = peer.psn.get();
            a.ah_attr = self.ah_attr(peer.gid);
            mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
            if self.qp_type == QpType::Rc {
                a.max_dest_rd_atomic = 16;
                a.min_rnr_timer = 12;
                mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
            }
        }
        qp.modify(&mut a, mask)?;
        let mut a = libibverbs::zeroed_qp_attr();
        a.qp_state = IBV_QPS_RTS;
        a.sq_psn = my_psn;
        let mut mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
        if self.qp_type == QpType::Rc {
            a.timeout = 14;
            a.retry_cnt = 7;
            a.rnr_retry = 7;
            a.max_rd_atomic = 16;
            mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
        }
        qp.modify(&mut a, mask)
    }

    /// The loops' view of a verbs completion.
    fn completion(&self, wc: &IbvWc) -> Completion {
        let kind = match wc.opcode {
            IBV_WC_RECV => Kind::Recv,
            IBV_WC_RECV_RDMA_WITH_IMM => Kind::RecvImm,
            _ => Kind::Sent,
        };
        // IBV_WC_SUCCESS is 0.
        let error = (wc.status != 0).then(|| {
            let status = self.ctx.lib().status_str(wc.status);
            format!("work request {} (opcode {}) completed with {status}", wc.wr_id, wc.opcode)
        });
        Completion {
            wr_id: wc.wr_id,
            kind,
            byte_len: wc.byte_len,
            grh: wc.wc_flags & IBV_WC_GRH != 0,
            error,
        }
    }
}

impl Queues for VerbsQueues {
    fn connect(&mut self, peers: &[Endpoint]) -> Result<(), String> {
        for ((qp, psn), peer) in self.qps.iter().zip(peers) {
            self.connect_one(qp, *psn, peer)?;
        }
        if self.qp_type == QpType::Ud {
            let first = peers.first().ok_or("no peer endpoint")?;
            let mut attr = self.ah_attr(first.gid);
            self.ah = Some(Ah::new(&self.pd, &mut attr)?);
        }
        Ok(())
    }

    fn post_recv(&self, qp: usize, wr_id: u64, offset: usize, len: usize) -> Result<(), String> {
        self.qp(qp)?.post_recv(wr_id, self.recv.sge(offset, len)?)
    }

    fn post(&self, qp: usize, wr_id: u64, work: Work) -> Result<(), String> {
        let qp = self.qp(qp)?;
        let rdma = |addr: u64, rkey: u32| WrUnion { rdma: WrRdma { remote_addr: addr, rkey } };
        let none = rdma(0, 0);
        let wr = match work {
            Work::Send { len, inline, to } => {
                let mut w = SendWr::new(wr_id, self.buf.sge(0, len)?, none);
                w.opcode = IBV_WR_SEND;
                if inline {
                    w.flags |= IBV_SEND_INLINE;
                }
                if let Some(qpn) = to {
                    let ah = self.ah.as_ref().ok_or("UD: not connected")?;
                    w.wr = WrUnion {
                        ud: WrUd { ah: ah.as_ptr(), remote_qpn: qpn.get(), remote_qkey: QKEY.0 },
                    };
                }
                w
            }
            Work::Write { len, to, imm } => {
                let mut w = SendWr::new(wr_id, self.buf.sge(0, len)?, rdma(to.addr, to.rkey.0));
                if let Some(imm) = imm {
                    w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
                    w.imm = imm;
                } else {
                    w.opcode = IBV_WR_RDMA_WRITE;
                }
                w
            }
            Work::Read { len, from } => {
                let mut w = SendWr::new(wr_id, self.buf.sge(0, len)?, rdma(from.addr, from.rkey.0));
                w.opcode = IBV_WR_RDMA_READ;
                w
            }
            Work::FetchAdd { at } => {
                let atomic =
                    WrAtomic { remote_addr: at.addr, compare_add: 1, swap: 0, rkey: at.rkey.0 };
                let mut w = SendWr::new(wr_id, self.buf.sge(0, 8)?, WrUnion { atomic });
                w.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
                w
            }
            Work::CompareSwap { at, compare, swap } => {
                let atomic =
                    WrAtomic { remote_addr: at.addr, compare_add: compare, swap, rkey: at.rkey.0 };
                let mut w = SendWr::new(wr_id, self.buf.sge(0, 8)?, WrUnion { atomic });
                w.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
                w
            }
        };
        qp.post_send(wr)
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<(), String> {
        let mut wcs = core::mem::take(&mut self.wcs);
        let got = self.cq.poll(&mut wcs);
        if let Ok(n) = got {
            out.extend(wcs.iter().take(n).map(|wc| self.completion(wc)));
        }
        self.wcs = wcs;
        got.map(|_| ())
    }

    fn wait(&mut self, limit: Duration, out: &mut Vec<Completion>) -> Result<(), String> {
        // Whatever is already there first: the event for it may have been taken by an earlier
        // wait that returned on an earlier completion.
        let before = out.len();
        self.poll(out)?;
        if out.len() > before {
            return Ok(());
        }
        if self.cq.wait_event(limit)? {
            self.poll(out)?;
        }
        Ok(())
    }

    fn write_buf(&self, offset: usize, bytes: &[u8]) -> Result<(), String> {
        self.buf.write(offset, bytes)
    }

    fn read_target(&self, offset: usize, out: &mut [u8]) -> Result<(), String> {
        self.target.read(offset, out)
    }
}
