//! A device: the engine's top-level object. It owns the protection domains, memory regions,
//! completion queues and queue pairs of one RoCEv2 address, takes packets and time in, and
//! gives packets and deadlines out.

use core::net::{IpAddr, SocketAddr};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use uroce_wire::aeth::{CreditCode, Syndrome};
use uroce_wire::icrc::{IdRecovery, PseudoCache, PseudoHeader};
use uroce_wire::{Psn, Qpn, RKey, ROCE_V2_PORT};

use crate::counters::Counters;
use crate::cq::{Arm, Cq};
use crate::ctx::{Ah, Ctx, flush_wc};
use crate::errors::within;
use crate::memory::MemoryAccess;
use crate::mr::{MemoryRegion, MrTable};
use crate::qp::{ModifyError, PostError, Qp, QpAttr, QpInitAttr, RecvWqe, Response, SendWqe};
use crate::rng::Rng;
use crate::srq::Srq;
use crate::time::Instant;
use crate::tm::TagMatching;
use crate::types::{
    Access, AhAttr, AhHandle, CqHandle, LKey, Mtu, MwHandle, MwType, PdHandle, QpState, QpType,
    RecvWr, SendWr, SrqHandle, WcOpcode, WorkCompletion, WrOpcode,
};
use crate::watch::QpWatch;

/// Extra copies of an RC responder's last ACK sent as its QP is destroyed ([`Device::farewell`]):
/// with independent loss p, the peer misses all of them with probability p^3.
const FAREWELL_COPIES: usize = 2;
use crate::{completer, requester, responder};

pub use crate::attr::*;
pub use crate::ctx::{AsyncEvent, Piece, RxInfo, Transmit};
pub use crate::errors::*;

/// A RoCEv2 device: the transport of one address, as a deterministic state machine.
///
/// Inputs: `handle_datagram`, `handle_timeout`, the verbs (`post_send`, `post_recv`,
/// `modify_qp`, …). Outputs: `poll_transmit`, `poll_timeout`, `poll_cq`. Given the same seed
/// and the same inputs at the same instants, it produces the same outputs.
pub struct Device<M> {
    pub(crate) ctx: Ctx<M>,
    pub(crate) qps: BTreeMap<u32, Qp>,
    /// The QPs with a timer running or work outstanding.
    pub(crate) watch: QpWatch,
    /// A CQ has been armed for a notification: the application waits for completion events.
    events_requested: bool,
    /// Completions handed to the application by [`Device::poll_cq`], ever.
    completions_taken: u64,
    /// Multicast groups and the QPs attached to each, in attach order.
    pub(crate) mcast: BTreeMap<IpAddr, Vec<Qpn>>,
    /// ICRC prefixes for datagrams reaching UD QPs, by (source, destination): a UD QP hears
    /// from many peers, so the per-QP cache of connected QPs would thrash.
    pub(crate) ud_rx_pseudo: PseudoCache,
    /// Verifies received ICRCs, finding the IPv4 identification each was computed with.
    pub(crate) icrc: IdRecovery,
    /// QP1.
    pub(crate) gsi: crate::gsi::Gsi,
    pub(crate) next_ah: u32,
    pub(crate) next_qpn: u32,
    /// The protection domains allocated and not deallocated.
    pub(crate) pds: BTreeSet<u32>,
    pub(crate) next_pd: u32,
    pub(crate) next_cq: u32,
    pub(crate) next_srq: u32,
    /// The XRC domains allocated and not deallocated.
    pub(crate) xrcds: BTreeSet<u32>,
    pub(crate) next_xrcd: u32,
    /// Packets of QPs destroyed since the last `poll_transmit`: their farewell ACKs.
    farewell: VecDeque<(Vec<u8>, Transmit)>,
}

impl<M: MemoryAccess> Device<M> {
    /// A device at `config.addr` whose application memory is `mem`.
    pub fn new(config: DeviceConfig, mem: M) -> Self {
        let mut rng = Rng::from_seed(config.seed);
        // QPNs start at a seeded point of the block (rxe starts at 17, above QPs 0 and 1).
        let block = config.qpns;
        let next_qpn = block.first + rng.next_u32() % block.len.clamp(1, 0x1_0000);
        // QP1's source port, in the dynamic range as every QP's.
        let gsi_port = 0xC000 | (rng.next_u32() & 0x3FFF) as u16;
        Self {
            ctx: Ctx {
                config,
                now: Instant::ZERO,
                mrs: MrTable::default(),
                mem,
                cqs: BTreeMap::new(),
                counters: Counters::default(),
                rng,
                rotation: VecDeque::new(),
                scratch: Vec::new(),
                srqs: BTreeMap::new(),
                cq_events: VecDeque::new(),
                async_events: VecDeque::new(),
                ahs: BTreeMap::new(),
                gather: false,
                defer_icrc: false,
                intact: false,
                tx_pieces: Vec::new(),
                pieces: Vec::new(),
                copy_buf: Vec::new(),
            },
            qps: BTreeMap::new(),
            watch: QpWatch::default(),
            mcast: BTreeMap::new(),
            ud_rx_pseudo: PseudoCache::new(1024),
            icrc: IdRecovery::new(config.ipv4_id_policy),
            gsi: crate::gsi::Gsi::new(gsi_port),
            next_ah: 1,
            next_qpn,
            pds: BTreeSet::new(),
            next_pd: 1,
            next_cq: 1,
            next_srq: 1,
            xrcds: BTreeSet::new(),
            next_xrcd: 1,
            farewell: VecDeque::new(),
            events_requested: false,
            completions_taken: 0,
        }
    }

    /// The device's address.
    pub fn addr(&self) -> IpAddr {
        self.ctx.config.addr
    }

    /// GID index 0: the address as a RoCEv2 GID (an IPv4 address IPv4-mapped, RFC 4291).
    pub fn gid(&self) -> [u8; 16] {
        match self.ctx.config.addr {
            IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            IpAddr::V6(a) => a.octets(),
        }
    }

    /// The port's active MTU (`ibv_port_attr.active_mtu`).
    pub fn port_mtu(&self) -> Mtu {
        self.ctx.config.port_mtu
    }

    /// The device's limits (`ibv_query_device`).
    pub fn attr(&self) -> DeviceAttr {
        DEVICE_ATTR
    }

    /// Application memory.
    pub fn memory(&self) -> &M {
        &self.ctx.mem
    }

    /// Application memory, mutably.
    pub fn memory_mut(&mut self) -> &mut M {
        &mut self.ctx.mem
    }

    /// Counters.
    pub fn counters(&self) -> &Counters {
        &self.ctx.counters
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&mut self) -> PdHandle {
        let pd = PdHandle(self.next_pd);
        self.next_pd += 1;
        self.pds.insert(pd.0);
        pd
    }

    /// Deallocates a protection domain (`ibv_dealloc_pd`). Refused while a memory region, QP,
    /// SRQ or address handle still belongs to it (the verb fails with `EBUSY`, as the kernel
    /// refuses a PD whose use count is not zero). Handles are never reused.
    pub fn dealloc_pd(&mut self, pd: PdHandle) -> Result<(), DestroyError> {
        if !self.pds.contains(&pd.0) {
            return Err(DestroyError::Unknown);
        }
        let used = self.ctx.mrs.any_in(pd)
            || self.ctx.mrs.any_window_in(pd)
            || self.qps.values().filter_map(Qp::held).any(|i| i.pd == pd)
            || self.ctx.srqs.values().any(|s| s.pd == pd)
            || self.ctx.ahs.values().any(|ah| ah.pd == pd);
        if used {
            return Err(DestroyError::InUse);
        }
        self.pds.remove(&pd.0);
        Ok(())
    }

    /// The allocated PD numbered `number` ([`PdHandle::get`]): how an imported PD
    /// (`ibv_import_pd(3)`) is found again.
    pub fn pd_of_number(&self, number: u32) -> Option<PdHandle> {
        self.pds.contains(&number).then_some(PdHandle(number))
    }

    /// Whether `pd` is allocated.
    fn has_pd(&self, pd: PdHandle) -> bool {
        self.pds.contains(&pd.0)
    }

    /// Registers `length` bytes at virtual address `addr` with `access` rights.
    pub fn reg_mr(
        &mut self,
        pd: PdHandle,
        addr: u64,
        length: u64,
        access: Access,
    ) -> Result<MemoryRegion, CreateError> {
        self.reg_mr_at(pd, addr, addr, length, access)
    }

    /// Registers `length` bytes at host address `host` whose keys name `iova..iova + length`
    /// (`ibv_reg_mr_iova(3)`; `iova` 0 for a zero-based region, as device memory is).
    pub fn reg_mr_at(
        &mut self,
        pd: PdHandle,
        iova: u64,
        host: u64,
        length: u64,
        access: Access,
    ) -> Result<MemoryRegion, CreateError> {
        if !self.has_pd(pd) {
            return Err(CreateError::UnknownPd);
        }
        within("max_mr", self.ctx.mrs.len() as u64 + 1, u64::from(DEVICE_ATTR.max_mr))?;
        Ok(self.ctx.mrs.register(&mut self.ctx.rng, pd, (iova, host), length, access))
    }

    /// Region `lkey`, if registered.
    pub fn mr(&self, lkey: LKey) -> Option<MemoryRegion> {
        self.ctx.mrs.get(lkey)
    }

    /// Re-registers region `lkey` (`ibv_rereg_mr`): a new PD, range and access, the same keys,
    /// which from now on reach the new range with the new rights only. Returns the region as
    /// it was; `None` if the key is unknown, an error (nothing changed) for an unknown PD.
    pub fn rereg_mr(
        &mut self,
        lkey: LKey,
        pd: PdHandle,
        addr: u64,
        length: u64,
        access: Access,
    ) -> Option<Result<MemoryRegion, CreateError>> {
        if !self.has_pd(pd) {
            return Some(Err(CreateError::UnknownPd));
        }
        self.ctx.mrs.update(lkey, pd, addr, length, access).map(Ok)
    }

    /// Allocates a memory window of `pd` (`ibv_alloc_mw`; IBA 10.6.7.1): unbound, with its
    /// handle and first key.
    pub fn alloc_mw(
        &mut self,
        pd: PdHandle,
        kind: MwType,
    ) -> Result<(MwHandle, RKey), CreateError> {
        if !self.pds.contains(&pd.0) {
            return Err(CreateError::UnknownPd);
        }
        within("max_mw", self.ctx.mrs.windows() as u64 + 1, u64::from(DEVICE_ATTR.max_mw))?;
        Ok(self.ctx.mrs.alloc_window(&mut self.ctx.rng, pd, kind))
    }

    /// Deallocates a window (`ibv_dealloc_mw`): its key stops working at once, bound or not.
    pub fn dealloc_mw(&mut self, mw: MwHandle) -> Result<(), DestroyError> {
        self.ctx.mrs.dealloc_window(mw).map(|_| ()).ok_or(DestroyError::Unknown)
    }

    /// A window's current key: what the last successful bind gave it.
    pub fn mw_rkey(&self, mw: MwHandle) -> Option<RKey> {
        self.ctx.mrs.window(mw).map(|(_, _, rkey)| rkey)
    }

    /// Deregisters a region: its keys stop working at once. `None` if the key is unknown.
    pub fn dereg_mr(&mut self, lkey: LKey) -> Option<MemoryRegion> {
        self.ctx.mrs.deregister(lkey)
    }

    /// Number of registered regions.
    pub fn mr_count(&self) -> usize {
        self.ctx.mrs.len()
    }

    /// Whether a work request not yet completed names `lkey` in its scatter/gather list: a
    /// send WQE (not inline), a receive WQE of a QP or an SRQ, a TM-SRQ's posted tag, or the
    /// receive a message in progress is landing in. A runtime defers deregistering such a
    /// region, so the memory an outstanding work request uses stays alive until its completion.
    pub fn lkey_in_use(&self, lkey: LKey) -> bool {
        let names = |sges: &[crate::types::Sge]| sges.iter().any(|s| s.lkey == lkey);
        let recv_uses = |w: &RecvWqe| names(&w.wr.sg_list);
        self.qps.values().any(|qp| {
            qp.req.sq.iter().any(|w| w.wr.inline_data.is_none() && names(&w.wr.sg_list))
                || qp.rq.iter().any(recv_uses)
                || matches!(&qp.resp.current, Some(crate::qp::InMessage::Send { wqe, .. }) if recv_uses(wqe))
        }) || self.ctx.srqs.values().any(|s| {
            s.wqes.iter().any(recv_uses) || s.tm.as_ref().is_some_and(|t| t.names_lkey(lkey))
        })
    }

    /// Whether RC QP `qpn` has packets on the wire not yet acknowledged: an acknowledgement is
    /// coming, and with it a round of progress.
    pub fn awaits_ack(&self, qpn: Qpn) -> bool {
        self.qps
            .get(&qpn.get())
            .is_some_and(|qp| qp.init.qp_type.is_reliable() && qp.req.awaits_ack())
    }

    /// Whether any work request could still complete: a send WQE not yet completed, or a
    /// receive WQE posted to a QP or an SRQ. Without any, polling a CQ cannot find anything new
    /// (only an incoming one-sided operation can happen, and it completes nothing).
    pub fn has_pending_work(&self) -> bool {
        self.watch.any_busy()
            || self
                .ctx
                .srqs
                .values()
                .any(|s| !s.wqes.is_empty() || s.tm.as_ref().is_some_and(TagMatching::has_tags))
    }

    /// Creates a completion queue that holds `capacity` completions.
    pub fn create_cq(&mut self, capacity: usize) -> Result<CqHandle, CreateError> {
        within("max_cqe", capacity as u64, u64::from(DEVICE_ATTR.max_cqe))?;
        let cq = CqHandle(self.next_cq);
        self.next_cq += 1;
        self.ctx.cqs.insert(cq.0, Cq::new(capacity));
        Ok(cq)
    }

    /// Changes a completion queue's capacity (`ibv_resize_cq`), keeping what it holds. Refused
    /// outside 1..=`max_cqe`, and below the completions queued now.
    pub fn resize_cq(&mut self, cq: CqHandle, capacity: usize) -> Result<(), ResizeCqError> {
        if capacity == 0 || capacity > DEVICE_ATTR.max_cqe as usize {
            return Err(ResizeCqError::OutOfRange);
        }
        let q = self.ctx.cqs.get_mut(&cq.0).ok_or(ResizeCqError::UnknownCq)?;
        let queued = q.len();
        if q.resize(capacity) { Ok(()) } else { Err(ResizeCqError::BelowQueued { queued }) }
    }

    /// Destroys a completion queue (`ibv_destroy_cq`). Refused while a QP still uses it
    /// (the verb fails with `EBUSY` then).
    pub fn destroy_cq(&mut self, cq: CqHandle) -> Result<(), DestroyError> {
        if !self.ctx.cqs.contains_key(&cq.0) {
            return Err(DestroyError::Unknown);
        }
        let by_qp =
            self.qps.values().filter_map(Qp::held).any(|i| i.send_cq == cq || i.recv_cq == cq);
        let by_srq = self.ctx.srqs.values().any(|s| s.cq() == Some(cq));
        if by_qp || by_srq {
            return Err(DestroyError::InUse);
        }
        self.ctx.cqs.remove(&cq.0);
        self.ctx.cq_events.retain(|&c| c != cq);
        Ok(())
    }

    /// Takes up to `max` completions from `cq`, oldest first, appending them to `out`; returns
    /// how many.
    pub fn poll_cq(&mut self, cq: CqHandle, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        let Some(q) = self.ctx.cqs.get_mut(&cq.0) else {
            return 0;
        };
        let mut n = 0;
        while n < max {
            let Some(wc) = q.pop() else { break };
            out.push(wc);
            n += 1;
        }
        self.completions_taken += n as u64;
        n
    }

    /// How many completions [`Device::poll_cq`] has handed out, ever: a runtime tells by it
    /// whether a poll gave the application something to react to.
    pub fn completions_taken(&self) -> u64 {
        self.completions_taken
    }

    /// Arms `cq` to notify its next completion, or with `solicited_only` its next solicited or
    /// unsuccessful one (`ibv_req_notify_cq`). One notification per arming; completions already
    /// queued do not count. `false` for an unknown CQ.
    pub fn req_notify_cq(&mut self, cq: CqHandle, solicited_only: bool) -> bool {
        let arm = if solicited_only { Arm::Solicited } else { Arm::Any };
        let armed = self.ctx.cqs.get_mut(&cq.0).map(|q| q.arm(arm)).is_some();
        self.events_requested |= armed;
        armed
    }

    /// Whether any CQ has ever been armed ([`Device::req_notify_cq`]): the application waits
    /// for completion events rather than (only) polling.
    pub fn events_requested(&self) -> bool {
        self.events_requested
    }

    /// Whether `cq` is armed (`ibv_req_notify_cq`) and its notification has not fired yet:
    /// whoever polls it means to sleep until an event.
    pub fn cq_armed(&self, cq: CqHandle) -> bool {
        self.ctx.cqs.get(&cq.0).is_some_and(Cq::armed)
    }

    /// The next completion queue whose notification fired (what a completion channel delivers:
    /// `ibv_get_cq_event`), oldest first.
    pub fn poll_cq_event(&mut self) -> Option<CqHandle> {
        self.ctx.cq_events.pop_front()
    }

    /// The next asynchronous event (`ibv_get_async_event`).
    pub fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.ctx.async_events.pop_front()
    }

    /// Whether `cq` lost a completion because it was full.
    pub fn cq_overflowed(&self, cq: CqHandle) -> bool {
        self.ctx.cqs.get(&cq.0).is_some_and(Cq::overflowed)
    }

    /// Completions waiting in `cq`.
    pub fn cq_len(&self, cq: CqHandle) -> usize {
        self.ctx.cqs.get(&cq.0).map_or(0, Cq::len)
    }

    /// Creates a shared receive queue of up to `max_wr` WQEs of up to `max_sge` elements.
    pub fn create_srq(
        &mut self,
        pd: PdHandle,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<SrqHandle, CreateError> {
        if !self.has_pd(pd) {
            return Err(CreateError::UnknownPd);
        }
        within("max_srq_wr", u64::from(max_wr), u64::from(DEVICE_ATTR.max_qp_wr))?;
        within("max_srq_sge", u64::from(max_sge), u64::from(DEVICE_ATTR.max_sge))?;
        let h = SrqHandle(self.next_srq);
        self.next_srq += 1;
        self.ctx.srqs.insert(h.0, Srq::new(pd, max_wr, max_sge));
        Ok(h)
    }

    /// Destroys a shared receive queue (`ibv_destroy_srq`); its WQEs go with it. Refused while
    /// a QP still takes receives from it (`EBUSY`).
    pub fn destroy_srq(&mut self, srq: SrqHandle) -> Result<(), DestroyError> {
        if !self.ctx.srqs.contains_key(&srq.0) {
            return Err(DestroyError::Unknown);
        }
        if self.qps.values().filter_map(Qp::held).any(|i| i.srq == Some(srq)) {
            return Err(DestroyError::InUse);
        }
        self.ctx.srqs.remove(&srq.0);
        Ok(())
    }

    /// Posts a receive WQE to a shared receive queue (`ibv_post_srq_recv`).
    pub fn post_srq_recv(&mut self, srq: SrqHandle, wr: RecvWr) -> Result<(), PostError> {
        let Some(s) = self.ctx.srqs.get_mut(&srq.0) else { return Err(PostError::UnknownSrq) };
        if wr.sg_list.len() > s.max_sge as usize {
            return Err(PostError::TooManySge);
        }
        if s.wqes.len() >= s.max_wr as usize {
            return Err(PostError::QueueFull);
        }
        s.wqes.push_back(RecvWqe { wr });
        Ok(())
    }

    /// Arms the SRQ's limit: one SRQ_LIMIT_REACHED event when fewer than `limit` WQEs remain
    /// (`ibv_modify_srq` with `IBV_SRQ_LIMIT`; 0 disarms). `false` for an unknown SRQ.
    pub fn arm_srq_limit(&mut self, srq: SrqHandle, limit: u32) -> bool {
        self.ctx.srqs.get_mut(&srq.0).map(|s| s.limit = limit).is_some()
    }

    /// The SRQ's armed limit, 0 once it fired or when never armed (`ibv_query_srq`).
    pub fn srq_limit(&self, srq: SrqHandle) -> Option<u32> {
        self.ctx.srqs.get(&srq.0).map(|s| s.limit)
    }

    /// Receive WQEs waiting in an SRQ.
    pub fn srq_len(&self, srq: SrqHandle) -> usize {
        self.ctx.srqs.get(&srq.0).map_or(0, |s| s.wqes.len())
    }

    /// Creates an address handle for UD sends to `attr.dest` (`ibv_create_ah`).
    pub fn create_ah(&mut self, pd: PdHandle, attr: AhAttr) -> Result<AhHandle, CreateError> {
        if !self.has_pd(pd) {
            return Err(CreateError::UnknownPd);
        }
        if attr.dest.is_ipv4() != self.ctx.config.addr.is_ipv4() {
            return Err(CreateError::AhAddressFamily);
        }
        within("max_ah", self.ctx.ahs.len() as u64 + 1, u64::from(DEVICE_ATTR.max_ah))?;
        let h = AhHandle(self.next_ah);
        self.next_ah += 1;
        self.ctx.ahs.insert(h.0, Ah { pd, attr, pseudo: None });
        Ok(h)
    }

    /// Destroys an address handle; work requests already posted with it fail when they are
    /// reached. `false` if there is no such handle.
    pub fn destroy_ah(&mut self, ah: AhHandle) -> bool {
        self.ctx.ahs.remove(&ah.0).is_some()
    }

    /// Attaches UD QP `qpn` to multicast group `group` (`ibv_attach_mcast`): datagrams to the
    /// group's address with destination QPN 0xFFFFFF are delivered to it (IBA 10.5.2).
    /// Attaching twice is not an error. A runtime joins the IP group for the groups that
    /// [`Device::multicast_groups`] lists.
    pub fn attach_mcast(&mut self, qpn: Qpn, group: IpAddr) -> Result<(), McastError> {
        let qp = self.qps.get(&qpn.get()).ok_or(McastError::UnknownQp(qpn))?;
        if qp.init.qp_type != QpType::Ud {
            return Err(McastError::NotUd(qpn));
        }
        if !group.is_multicast() || group.is_ipv4() != self.ctx.config.addr.is_ipv4() {
            return Err(McastError::NotMulticast(group));
        }
        let total: usize = self.mcast.values().map(Vec::len).sum();
        let groups = self.mcast.len();
        let members = self.mcast.get(&group);
        if members.is_some_and(|m| m.contains(&qpn)) {
            return Ok(());
        }
        let a = DEVICE_ATTR;
        if members.is_none() && groups >= a.max_mcast_grp as usize {
            return Err(McastError::ExceedsLimit("max_mcast_grp"));
        }
        if members.is_some_and(|m| m.len() >= a.max_mcast_qp_attach as usize) {
            return Err(McastError::ExceedsLimit("max_mcast_qp_attach"));
        }
        if total >= a.max_total_mcast_qp_attach as usize {
            return Err(McastError::ExceedsLimit("max_total_mcast_qp_attach"));
        }
        self.mcast.entry(group).or_default().push(qpn);
        Ok(())
    }

    /// Detaches `qpn` from `group` (`ibv_detach_mcast`).
    pub fn detach_mcast(&mut self, qpn: Qpn, group: IpAddr) -> Result<(), McastError> {
        if !self.qps.contains_key(&qpn.get()) {
            return Err(McastError::UnknownQp(qpn));
        }
        let members = self.mcast.get_mut(&group).ok_or(McastError::NotAttached)?;
        let at = members.iter().position(|&q| q == qpn).ok_or(McastError::NotAttached)?;
        members.remove(at);
        if members.is_empty() {
            self.mcast.remove(&group);
        }
        Ok(())
    }

    /// The multicast groups at least one QP is attached to: the IP groups a runtime joins.
    pub fn multicast_groups(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.mcast.keys().copied()
    }

    /// Creates a queue pair in the Reset state and returns its number.
    pub fn create_qp(&mut self, init: QpInitAttr) -> Result<Qpn, CreateError> {
        if init.qp_type == QpType::XrcTgt {
            if init.srq.is_some() {
                return Err(CreateError::XrcMisuse);
            }
            let Some(xrcd) = init.xrcd.filter(|&x| self.has_xrcd(x)) else {
                return Err(CreateError::UnknownXrcd);
            };
            return self.number_qp(QpInitAttr::xrc_target(xrcd));
        }
        if init.qp_type == QpType::XrcIni && init.srq.is_some() {
            return Err(CreateError::XrcMisuse);
        }
        if !self.has_pd(init.pd) {
            return Err(CreateError::UnknownPd);
        }
        let cqs = &self.ctx.cqs;
        if !cqs.contains_key(&init.send_cq.0) || !cqs.contains_key(&init.recv_cq.0) {
            return Err(CreateError::UnknownCq);
        }
        if let Some(srq) = init.srq {
            // Receive buffers are checked against the QP's PD, so the SRQ must share it.
            match self.ctx.srqs.get(&srq.0) {
                Some(s) if s.tm.is_some() && init.qp_type != QpType::Rc => {
                    return Err(CreateError::TmSrqNeedsRc);
                }
                Some(s) if s.pd == init.pd => {}
                Some(_) => return Err(CreateError::SrqOfAnotherPd),
                None => return Err(CreateError::UnknownSrq),
            }
        }
        self.number_qp(init)
    }

    /// Gives a checked QP its number and creates it.
    fn number_qp(&mut self, init: QpInitAttr) -> Result<Qpn, CreateError> {
        let (a, c) = (DEVICE_ATTR, init.cap);
        within("max_qp", self.qps.len() as u64 + 1, u64::from(a.max_qp))?;
        within("max_qp_wr", u64::from(c.max_send_wr.max(c.max_recv_wr)), u64::from(a.max_qp_wr))?;
        within("max_sge", u64::from(c.max_send_sge.max(c.max_recv_sge)), u64::from(a.max_sge))?;
        within("max_inline_data", u64::from(c.max_inline_data), u64::from(a.max_inline_data))?;
        let block = self.ctx.config.qpns;
        // The block may be nearly full of live QPs: skip the numbers still in use.
        let mut candidate = self.next_qpn;
        for _ in 0..block.len {
            if !block.contains(candidate) {
                candidate = block.first;
            }
            if !self.qps.contains_key(&candidate) && candidate != Qpn::MULTICAST.get() {
                break;
            }
            candidate += 1;
        }
        if self.qps.contains_key(&candidate) || !block.contains(candidate) {
            let max = u64::from(block.len);
            return Err(CreateError::ExceedsLimit { limit: "max_qp", requested: max + 1, max });
        }
        let qpn = Qpn::from_masked(candidate);
        self.next_qpn = candidate + 1;
        let mut qp = Qp::new(qpn, init);
        if init.qp_type == QpType::Ud {
            qp.mtu = self.ctx.config.port_mtu;
        }
        self.qps.insert(qpn.get(), qp);
        Ok(qpn)
    }

    /// Destroys a queue pair, detaching it from its multicast groups; packets for it are
    /// dropped from then on.
    pub fn destroy_qp(&mut self, qpn: Qpn) -> bool {
        self.mcast.retain(|_, members| {
            members.retain(|&q| q != qpn);
            !members.is_empty()
        });
        let Some(mut qp) = self.qps.remove(&qpn.get()) else { return false };
        self.watch.forget(&mut qp);
        self.farewell(&mut qp);
        true
    }

    /// The last acknowledgement of an RC responder, sent [`FAREWELL_COPIES`] more times as its
    /// QP goes. A program that received its peer's last message destroys its QP and exits at
    /// once (`ibv_rc_pingpong` does): if the ACK of that message is lost, nobody is left to
    /// answer the peer's retries, and its SEND, delivered, ends in RETRY_EXC_ERR. TCP keeps
    /// TIME_WAIT for its last ACK; this sends it again while it still can. Duplicate ACKs are
    /// harmless to a requester (IBA 9.7.6.1: an ACK for PSNs already acknowledged changes
    /// nothing).
    fn farewell(&mut self, qp: &mut Qp) {
        let acked = qp.resp.msn.get() > 0;
        let receiving = matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd);
        if qp.init.qp_type != QpType::Rc || !acked || !receiving {
            return;
        }
        let last = Response::Ack {
            psn: qp.resp.epsn.sub(1),
            syndrome: Syndrome::Ack(CreditCode::for_available(0)),
            msn: qp.resp.msn,
        };
        // What the responder still had to send goes first, then the copies.
        qp.resp.out.retain(|r| matches!(r, Response::Ack { .. }));
        qp.resp.out.extend([last; FAREWELL_COPIES]);
        let mut buf = Vec::new();
        while let Some(tx) = responder::poll(qp, &mut self.ctx, &mut buf) {
            // Each its own datagram: copies lost together are no copies.
            self.farewell.push_back((core::mem::take(&mut buf), Transmit { alone: true, ..tx }));
        }
    }

    /// Records in the watch what QP `qpn` has running and outstanding, after an input that
    /// reached it.
    pub(crate) fn watch(&mut self, qpn: u32) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            self.watch.update(qp);
        }
    }

    /// A one-line account of a QP's transport state (requester position, acknowledged PSN,
    /// timers, the send queue, the responder's expected PSN), for traces and test failures.
    pub fn describe_qp(&self, qpn: Qpn) -> Option<String> {
        let q = self.qps.get(&qpn.get())?;
        let r = &q.req;
        let sq: Vec<_> =
            r.sq.iter()
                .map(|w| (w.wr.wr_id, w.wr.opcode, w.first_psn.get(), w.npkts, w.resp_pkts, w.done))
                .collect();
        Some(format!(
            "qp {} {:?}: next wqe {} pkt {} psn {}, una {}, high {}, ack timer {:?}, rnr {:?}, \
             recovering {:?}, retries left {}, sq {:?}; responder epsn {}, {} responses queued",
            q.qpn,
            q.state,
            r.next_wqe,
            r.next_pkt,
            r.next_psn,
            r.una,
            r.high_psn,
            r.ack_deadline,
            r.rnr_resume,
            r.recovering,
            r.retries_left,
            sq,
            q.resp.epsn,
            q.resp.out.len()
        ))
    }

    /// A PSN for a QP to start from, from the device's generator (IBA 9.7.2: hard for anyone
    /// to predict, so a stale or forged packet does not fall in the window by chance).
    pub fn random_psn(&mut self) -> Psn {
        Psn::from_masked(self.ctx.rng.next_u32())
    }

    /// A QP's counters.
    pub fn qp_counters(&self, qpn: Qpn) -> Option<crate::counters::QpCounters> {
        self.qps.get(&qpn.get()).map(|q| q.counters)
    }

    /// The state of a QP.
    pub fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
        self.qps.get(&qpn.get()).map(|q| q.state)
    }

    /// The transport of a QP.
    pub fn qp_type(&self, qpn: Qpn) -> Option<QpType> {
        self.qps.get(&qpn.get()).map(|q| q.init.qp_type)
    }

    /// Moves a QP through its state machine (IBA 10.3; `ibv_modify_qp(3)`).
    pub fn modify_qp(&mut self, qpn: Qpn, attr: &QpAttr) -> Result<(), ModifyError> {
        let r = self.modify_qp_unwatched(qpn, attr);
        self.watch(qpn.get());
        r
    }

    fn modify_qp_unwatched(&mut self, qpn: Qpn, attr: &QpAttr) -> Result<(), ModifyError> {
        let qp = self.qps.get_mut(&qpn.get()).ok_or(ModifyError::UnknownQp(qpn))?;
        let from = qp.modify(attr)?;
        match qp.state {
            QpState::Rtr | QpState::Rts if qp.tx_pseudo.is_none() || attr.av.is_some() => {
                if let Some(av) = qp.av {
                    let src = SocketAddr::new(self.ctx.config.addr, qp.src_port);
                    let dst = SocketAddr::new(av.dest, ROCE_V2_PORT);
                    qp.tx_pseudo = PseudoHeader::for_endpoints(src, dst).ok();
                }
            }
            QpState::Error if from != QpState::Error => completer::enter_error(qp, &mut self.ctx),
            QpState::Reset if from != QpState::Reset => {
                // Its completions not yet polled go with it, as ConnectX drivers clean the CQs
                // of a QP moved to Reset (mlx4/mlx5 `cq_clean`): a QP brought back to RTS
                // does not hand its new work the flushes of its old.
                for cq in [qp.init.send_cq, qp.init.recv_cq] {
                    if let Some(q) = self.ctx.cqs.get_mut(&cq.0) {
                        q.forget_qp(qpn);
                    }
                }
                let (init, mtu, watched) = (qp.init, qp.mtu, qp.watched);
                *qp = Qp::new(qpn, init);
                qp.watched = watched;
                if init.qp_type == QpType::Ud {
                    qp.mtu = mtu;
                }
            }
            _ => {}
        }
        if qp.has_request_work(Instant::ZERO) {
            self.ctx.schedule(qp);
        }
        Ok(())
    }

    /// Posts a send work request (`ibv_post_send`). On a QP in the Error state it completes at
    /// once with `WR_FLUSH_ERR`, as verbs specify.
    pub fn post_send(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), PostError> {
        let r = self.post_send_unwatched(qpn, wr);
        self.watch(qpn.get());
        r
    }

    /// Posts `wrs` all or none (`ibv_wr_complete(3)`: a failure aborts the entire posting):
    /// every request is checked, and the queue's room for all of them, before any is posted.
    /// The error names the first request refused.
    pub fn post_send_batch(
        &mut self,
        qpn: Qpn,
        wrs: Vec<SendWr>,
    ) -> Result<(), (usize, PostError)> {
        let qp = self.qps.get(&qpn.get()).ok_or((0, PostError::UnknownQp(qpn)))?;
        let room = (qp.init.cap.max_send_wr as usize).saturating_sub(qp.req.sq.len());
        if wrs.len() > room {
            return Err((room, PostError::QueueFull));
        }
        let lens = wrs
            .iter()
            .enumerate()
            .map(|(i, wr)| check_post(qp, &self.ctx.ahs, wr).map_err(|e| (i, e)))
            .collect::<Result<Vec<u32>, _>>()?;
        for (wr, len) in wrs.into_iter().zip(lens) {
            self.enqueue(qpn, wr, len);
        }
        self.watch(qpn.get());
        Ok(())
    }

    fn post_send_unwatched(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), PostError> {
        let qp = self.qps.get(&qpn.get()).ok_or(PostError::UnknownQp(qpn))?;
        let len = check_post(qp, &self.ctx.ahs, &wr)?;
        self.enqueue(qpn, wr, len);
        Ok(())
    }

    /// Queues a checked send WR of `len` bytes on QP `qpn` (or flushes it on a QP in Error).
    fn enqueue(&mut self, qpn: Qpn, wr: SendWr, len: u32) {
        let Some(qp) = self.qps.get_mut(&qpn.get()) else { return };
        let signaled = qp.init.sq_sig_all || wr.flags.contains(crate::types::SendFlags::SIGNALED);
        if qp.state == QpState::Error {
            let wc = flush_wc(qpn, wr.wr_id, wr.opcode.into());
            self.ctx.complete(qp.init.send_cq, wc);
            return;
        }
        qp.req.sq.push_back(SendWqe::new(wr, len, qp.mtu.bytes(), signaled, None));
        if qp.can_send() {
            self.ctx.schedule(qp);
        }
    }

    /// Posts a receive work request (`ibv_post_recv`).
    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), PostError> {
        let qp = self.qps.get_mut(&qpn.get()).ok_or(PostError::UnknownQp(qpn))?;
        if qp.state == QpState::Reset {
            return Err(PostError::InvalidState(qp.state));
        }
        if !qp.init.qp_type.has_receive_queue() {
            return Err(PostError::NoReceiveQueue);
        }
        if qp.init.srq.is_some() {
            return Err(PostError::UsesSrq);
        }
        if wr.sg_list.len() > qp.init.cap.max_recv_sge as usize {
            return Err(PostError::TooManySge);
        }
        if qp.rq.len() >= qp.init.cap.max_recv_wr as usize {
            return Err(PostError::QueueFull);
        }
        if qp.state == QpState::Error {
            let wc = flush_wc(qpn, wr.wr_id, WcOpcode::Recv);
            self.ctx.complete(qp.init.recv_cq, wc);
            return Ok(());
        }
        qp.rq.push_back(RecvWqe { wr });
        self.watch.update(qp);
        Ok(())
    }

    /// As [`Device::poll_transmit`], but a payload in registered memory stays there, for a
    /// runtime that sends with scatter/gather I/O: when [`Transmit::payload_at`] is `Some(h)`,
    /// the datagram is `buf[..h]`, then the memory `pieces` (address, length) in order, then
    /// `buf[h..]`; the ICRC already covers them. Payloads that are not in registered memory
    /// (inline data) and packets without payload come whole in `buf`. The pieces must go out
    /// before any other input reaches the device, which may change that memory.
    pub fn poll_transmit_gather(
        &mut self,
        now: Instant,
        buf: &mut Vec<u8>,
        pieces: &mut Vec<Piece>,
    ) -> Option<Transmit> {
        self.ctx.gather = true;
        let tx = self.poll_transmit(now, buf);
        self.ctx.gather = false;
        pieces.clear();
        if tx.is_some_and(|t| t.payload_at.is_some()) {
            core::mem::swap(pieces, &mut self.ctx.tx_pieces);
        }
        tx
    }

    /// Whether [`Device::poll_transmit`], [`Device::poll_cq_event`] or
    /// [`Device::poll_async_event`] may have something, having advanced the device's clock to
    /// `now` as a poll does. `false` means all three would return `None`: a runtime that asks
    /// after every verb, most of which produce nothing, then skips the three polls and the
    /// cache lines they read, on the way to a ping-pong's reply.
    pub fn has_output(&mut self, now: Instant) -> bool {
        self.ctx.advance_clock(now);
        !self.ctx.rotation.is_empty()
            || !self.ctx.cq_events.is_empty()
            || !self.ctx.async_events.is_empty()
            || !self.farewell.is_empty()
            || self.gsi.has_transmit()
    }

    /// Writes the next packet to send into `buf` (replacing its contents) and says where it
    /// goes; `None` when nothing is ready. Call until `None` after every input.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        self.ctx.advance_clock(now);
        if let Some((bytes, tx)) = self.farewell.pop_front() {
            *buf = bytes;
            return Some(tx);
        }
        let local = self.ctx.config.addr;
        if let Some(tx) =
            self.gsi.poll_transmit(local, self.ctx.defer_icrc, buf, &mut self.ctx.counters)
        {
            return Some(tx);
        }
        for _ in 0..self.ctx.rotation.len() {
            let qpn = self.ctx.rotation.pop_front()?;
            let Some(qp) = self.qps.get_mut(&qpn.get()) else {
                continue;
            };
            qp.scheduled = false;
            let tx = responder::poll(qp, &mut self.ctx, buf)
                .or_else(|| requester::poll(qp, &mut self.ctx, now, buf));
            self.watch.update(qp);
            if let Some(tx) = tx {
                qp.counters.sent_pkts += 1;
                qp.counters.sent_bytes += buf.len() as u64;
                self.ctx.schedule(qp);
                return Some(tx);
            }
        }
        None
    }

    /// Queues a MAD to send from QP1 to QP1 at `dst` (IBA 13.5.1); it goes out with the next
    /// [`Device::poll_transmit`]. Past [`crate::gsi::GSI_QUEUE`] waiting, it is dropped and
    /// counted (`drop_gsi_overflow`), as a send queue that is full.
    pub fn gsi_send(&mut self, dst: IpAddr, mad: &[u8; uroce_wire::mad::MAD_LEN]) {
        self.gsi.queue_send(dst, mad, &mut self.ctx.counters);
    }

    /// The next MAD received on QP1, oldest first.
    pub fn poll_gsi(&mut self) -> Option<crate::GsiMad> {
        self.gsi.take()
    }

    /// The earliest instant at which `handle_timeout` may have work: a timer moved later since
    /// it was recorded is found there not yet due, and recorded again.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.watch.next_due()
    }

    /// Runs the timers due at `now`: ACK timeouts, tail-loss probes and RNR waits.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.ctx.advance_clock(now);
        for qpn in self.watch.due_at(now) {
            if let Some(qp) = self.qps.get_mut(&qpn) {
                completer::on_timer(qp, &mut self.ctx, now);
                self.watch.refresh(qp);
            }
        }
    }
}

/// Checks a send WR against the QP, and a UD WR's address handle against the QP's PD; returns
/// the message length.
fn check_post(qp: &Qp, ahs: &BTreeMap<u32, Ah>, wr: &SendWr) -> Result<u32, PostError> {
    let len = validate_send(qp, wr)?;
    if qp.init.qp_type == QpType::Ud {
        let ud = wr.ud.ok_or(PostError::MissingAddressHandle)?;
        if ahs.get(&ud.ah.0).is_none_or(|ah| ah.pd != qp.init.pd) {
            return Err(PostError::UnknownAh);
        }
    }
    Ok(len)
}

/// Checks a send WR against the QP and returns the message length.
fn validate_send(qp: &Qp, wr: &SendWr) -> Result<u32, PostError> {
    if !qp.init.qp_type.sends() {
        return Err(PostError::NoSendQueue);
    }
    if !matches!(qp.state, QpState::Rts | QpState::Sqd | QpState::Error) {
        return Err(PostError::InvalidState(qp.state));
    }
    if qp.req.sq.len() >= qp.init.cap.max_send_wr as usize {
        return Err(PostError::QueueFull);
    }
    let op = wr.opcode;
    let supported = qp.init.qp_type.carries(op);
    if !supported {
        return Err(PostError::UnsupportedOpcode);
    }
    match op {
        WrOpcode::BindMw if wr.bind.is_none() => return Err(PostError::MissingBind),
        WrOpcode::LocalInv | WrOpcode::SendWithInv if wr.invalidate_rkey.is_none() => {
            return Err(PostError::MissingInvalidateKey);
        }
        _ => {}
    }
    if wr.opcode.is_rdma() && wr.remote.is_none() {
        return Err(PostError::MissingRemote);
    }
    if wr.opcode.has_imm() && wr.imm.is_none() {
        return Err(PostError::MissingImm);
    }
    let len: u64 = match &wr.inline_data {
        Some(data) => {
            // An atomic write's 8 bytes are its operand, carried in the WQE as an atomic's
            // are (ibv_wr_atomic_write(3) takes them by value), not inline data.
            let operand = wr.opcode == WrOpcode::AtomicWrite;
            let room = if operand { 8 } else { qp.init.cap.max_inline_data as usize };
            if data.len() > room || wr.opcode.is_read_or_atomic() {
                return Err(PostError::InlineTooLong);
            }
            data.len() as u64
        }
        None => {
            if wr.sg_list.len() > qp.init.cap.max_send_sge as usize {
                return Err(PostError::TooManySge);
            }
            wr.sg_list.iter().map(|s| u64::from(s.length)).sum()
        }
    };
    if wr.opcode.is_atomic() && (wr.sg_list.len() != 1 || len != 8) {
        return Err(PostError::BadAtomicSge);
    }
    // IBA 1.5: an atomic write stores exactly 8 bytes.
    if wr.opcode == WrOpcode::AtomicWrite && len != 8 {
        return Err(PostError::BadAtomicSge);
    }
    // IBA 9.7: an RC message is at most 2^31 bytes.
    if len > 1 << 31 {
        return Err(PostError::MessageTooLong);
    }
    // IBA 9.8.2: a UD message is one packet.
    if qp.init.qp_type == QpType::Ud && len > u64::from(qp.mtu.bytes()) {
        return Err(PostError::ExceedsMtu { len, mtu: qp.mtu.bytes() });
    }
    u32::try_from(len).map_err(|_| PostError::MessageTooLong)
}
