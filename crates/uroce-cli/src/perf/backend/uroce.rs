//! The uroce backend: the tests on uroce's own API (`uroce::Context`), on whichever fabric the
//! device runs (shared memory between processes of a host, UDP between hosts).

use core::time::Duration;
use std::net::IpAddr;

use uroce::{
    Access, Ah, Context, Cq, Endpoint, Mr, Pd, QKey, Qp, QpType, Qpn, WcOpcode, WcStatus,
    WorkCompletion,
};

use super::{Completion, Device, Kind, Queues, SidePlan, Work};

/// Q_Key of the UD tests.
pub(crate) const QKEY: QKey = QKey(0x5045_5246);

/// A uroce device, opened by its address.
pub(crate) struct UroceDevice {
    ctx: Context,
    addr: IpAddr,
}

impl UroceDevice {
    /// Opens the device of `addr` with the `UROCE_*` settings of the environment; `udp_only`
    /// sends every packet through the kernel's UDP path whatever they say.
    pub(crate) fn open(addr: IpAddr, udp_only: bool) -> Result<Self, String> {
        let why = |e: &dyn std::fmt::Display| format!("cannot open the RDMA device: {e}");
        let mut options = uroce::Options::from_env().map_err(|e| why(&e))?;
        options.udp_only |= udp_only;
        let ctx = Context::open_with(addr, options).map_err(|e| why(&e))?;
        Ok(Self { ctx, addr })
    }
}

impl Device for UroceDevice {
    fn side(&self, plan: &SidePlan) -> Result<(Box<dyn Queues>, Vec<Endpoint>), String> {
        let e = |e: uroce::Error| e.to_string();
        let pd = self.ctx.alloc_pd();
        let cq = self.ctx.create_cq(plan.cq_depth).map_err(e)?;
        let mut qps = Vec::with_capacity(plan.qps);
        for _ in 0..plan.qps {
            let mut qp = pd
                .qp(plan.qp_type, &cq)
                .depth(plan.send_depth, plan.recv_depth)
                .qkey(QKEY)
                .max_inline(plan.max_inline);
            if let Some(mtu) = plan.mtu {
                qp = qp.mtu(mtu);
            }
            qps.push(qp.build().map_err(e)?);
        }
        let all = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let buf = pd.register(plan.buf_len, Access::LOCAL_WRITE).map_err(e)?;
        let target = pd.register(plan.buf_len, all).map_err(e)?;
        let recv = pd.register(plan.recv_len.max(1), Access::LOCAL_WRITE).map_err(e)?;
        let endpoints = qps.iter().map(|q| q.endpoint().with_region(target.remote())).collect();
        let side = UroceQueues {
            pd,
            qp_type: plan.qp_type,
            cq,
            qps,
            buf,
            target,
            recv,
            ah: None,
            polled: Vec::new(),
        };
        Ok((Box::new(side), endpoints))
    }

    fn failure_context(&self) -> Option<String> {
        Some(format!("this device's counters: {:?}", self.ctx.counters()))
    }

    fn describe(&self) -> String {
        format!("uroce {}", self.addr)
    }

    fn sent(&self) -> Option<(u64, u64)> {
        let net = self.ctx.counters().1;
        Some((net.tx_datagrams, net.shm_tx_packets))
    }
}

struct UroceQueues {
    pd: Pd,
    qp_type: QpType,
    cq: Cq,
    qps: Vec<Qp>,
    buf: Mr,
    target: Mr,
    recv: Mr,
    /// UD: the address handle of the peer.
    ah: Option<Ah>,
    /// Completions as uroce gives them, before conversion (kept to spare an allocation per poll).
    polled: Vec<WorkCompletion>,
}

impl UroceQueues {
    fn qp(&self, i: usize) -> Result<&Qp, String> {
        self.qps.get(i).ok_or_else(|| format!("no QP {i}"))
    }
}

/// The loops' view of a uroce completion.
fn completion(wc: &WorkCompletion) -> Completion {
    let kind = match wc.opcode {
        WcOpcode::Recv => Kind::Recv,
        WcOpcode::RecvRdmaWithImm => Kind::RecvImm,
        _ => Kind::Sent,
    };
    let error = (wc.status != WcStatus::SUCCESS)
        .then(|| format!("{:?} completed with {}", wc.opcode, wc.status));
    Completion { wr_id: wc.wr_id, kind, byte_len: wc.byte_len, grh: wc.grh, error }
}

impl Queues for UroceQueues {
    fn connect(&mut self, peers: &[Endpoint]) -> Result<(), String> {
        for (qp, peer) in self.qps.iter().zip(peers) {
            qp.connect(peer).map_err(|e| e.to_string())?;
        }
        if self.qp_type == QpType::Ud {
            let first = peers.first().ok_or("no peer endpoint")?;
            self.ah = Some(self.pd.create_ah(first.gid).map_err(|e| e.to_string())?);
        }
        Ok(())
    }

    fn post_recv(&self, qp: usize, wr_id: u64, offset: usize, len: usize) -> Result<(), String> {
        self.qp(qp)?.post_recv(wr_id, &self.recv, offset..offset + len).map_err(|e| e.to_string())
    }

    fn post(&self, qp: usize, wr_id: u64, work: Work) -> Result<(), String> {
        let qp = self.qp(qp)?;
        let (buf, e) = (&self.buf, |e: uroce::Error| e.to_string());
        let ud = |to: Option<Qpn>| -> Result<Option<(&Ah, Qpn)>, String> {
            match to {
                None => Ok(None),
                Some(qpn) => Ok(Some((self.ah.as_ref().ok_or("UD: not connected")?, qpn))),
            }
        };
        match work {
            Work::Send { len, inline: true, to } => {
                // Inline: the bytes are copied now, as the CPU writes them into the WQE on an
                // RNIC.
                let data = buf.to_vec(0..len).map_err(e)?;
                let to = ud(to)?.map(|(ah, qpn)| (ah, qpn, QKEY));
                qp.send_inline(wr_id, &data, to).map_err(e)
            }
            Work::Send { len, inline: false, to } => match ud(to)? {
                Some((ah, qpn)) => qp.send_to(wr_id, buf, 0..len, ah, qpn, QKEY).map_err(e),
                None => qp.send(wr_id, buf, 0..len).map_err(e),
            },
            Work::Write { len, to, imm: None } => qp.write(wr_id, buf, 0..len, to).map_err(e),
            Work::Write { len, to, imm: Some(imm) } => {
                qp.write_with_imm(wr_id, buf, 0..len, to, imm).map_err(e)
            }
            Work::Read { len, from } => qp.read(wr_id, buf, 0..len, from).map_err(e),
            Work::FetchAdd { at } => qp.fetch_add(wr_id, buf, 0, at, 1).map_err(e),
            Work::CompareSwap { at, compare, swap } => {
                qp.compare_swap(wr_id, buf, 0, at, compare, swap).map_err(e)
            }
        }
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<(), String> {
        self.polled.clear();
        self.cq.poll(&mut self.polled);
        out.extend(self.polled.iter().map(completion));
        Ok(())
    }

    fn wait(&mut self, limit: Duration, out: &mut Vec<Completion>) -> Result<(), String> {
        let wcs = self.cq.wait(Some(limit)).map_err(|e| e.to_string())?;
        out.extend(wcs.iter().map(completion));
        Ok(())
    }

    fn write_buf(&self, offset: usize, bytes: &[u8]) -> Result<(), String> {
        self.buf.write(offset, bytes).map_err(|e| e.to_string())
    }

    fn read_target(&self, offset: usize, out: &mut [u8]) -> Result<(), String> {
        self.target.read(offset, out).map_err(|e| e.to_string())
    }
}
