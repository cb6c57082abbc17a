//! The verbs vocabulary: handles, access flags, work requests and work completions.

use core::fmt;
use core::net::IpAddr;
use core::ops::{BitOr, BitOrAssign};

use uroce_wire::{QKey, Qpn, RKey};

pub use uroce_wire::aeth::RnrTimer;

/// A local key: names a registered memory region for the local side of a work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LKey(pub u32);

impl fmt::Display for LKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

/// A protection domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdHandle(pub(crate) u32);

/// A shared receive queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrqHandle(pub(crate) u32);

/// A completion queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqHandle(pub(crate) u32);

/// An XRC domain (IBA Annex A14): the XRC SRQs and XRC target QPs that may serve each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct XrcdHandle(pub(crate) u32);

/// An address handle: where a UD work request goes (`ibv_ah`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AhHandle(pub(crate) u32);

macro_rules! handle_number {
    ($($t:ty),*) => {$(
        impl $t {
            /// The handle's number: what a C binding reports in an object's `handle` field.
            pub const fn get(self) -> u32 {
                self.0
            }
        }
    )*};
}
handle_number!(PdHandle, SrqHandle, CqHandle, AhHandle, XrcdHandle);

/// What an address handle is made from (`ibv_ah_attr` with its GRH, for RoCEv2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AhAttr {
    /// The destination GID, as an IP address: a unicast device address or a multicast group.
    pub dest: IpAddr,
    /// The GRH flow label (20 bits). Non-zero, it picks the UDP source port, the flow's
    /// entropy for ECMP (IBA Annex A17.4.2.1, as rdma-core's `rdma_flow_label_to_udp_sport`
    /// folds it); zero leaves the sending QP's own source port.
    pub flow_label: u32,
}

impl AhAttr {
    /// An address handle to `dest` with no flow label.
    pub const fn new(dest: IpAddr) -> Self {
        Self { dest, flow_label: 0 }
    }

    /// The UDP source port a non-zero flow label selects: its low 14 bits XOR its high 6,
    /// in the dynamic range 0xC000–0xFFFF.
    pub fn udp_sport(&self) -> Option<u16> {
        let fl = self.flow_label & 0x000F_FFFF;
        if fl == 0 {
            return None;
        }
        // 14 bits XOR 6 bits: below 2^14.
        u16::try_from((fl & 0x3FFF) ^ (fl >> 14)).ok().map(|folded| 0xC000 | folded)
    }
}

/// The destination of a UD send (`ibv_send_wr.wr.ud`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdDest {
    /// Address handle of the destination device or multicast group.
    pub ah: AhHandle,
    /// Destination QP; [`Qpn::MULTICAST`] for a group.
    pub remote_qpn: Qpn,
    /// Q_Key to send. One with the high bit set means "the QP's own Q_Key" (IBA 10.2.5:
    /// controlled Q_Keys), as `ibv_post_send(3)` describes.
    pub remote_qkey: QKey,
}

/// Access rights of a memory region or of a queue pair (`ibv_access_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// No rights beyond local read.
    pub const NONE: Self = Self(0);
    /// The local side may write (receive buffers, READ and atomic results).
    pub const LOCAL_WRITE: Self = Self(1);
    /// A peer may RDMA WRITE.
    pub const REMOTE_WRITE: Self = Self(1 << 1);
    /// A peer may RDMA READ.
    pub const REMOTE_READ: Self = Self(1 << 2);
    /// A peer may perform atomic operations.
    pub const REMOTE_ATOMIC: Self = Self(1 << 3);
    /// Memory windows may be bound to the region (`IBV_ACCESS_MW_BIND`; IBA 10.6.7.2 C10-73).
    pub const MW_BIND: Self = Self(1 << 4);
    /// The rights a memory window can grant.
    pub const REMOTE: Self =
        Self(Self::REMOTE_WRITE.0 | Self::REMOTE_READ.0 | Self::REMOTE_ATOMIC.0);

    /// Whether every right in `other` is granted.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
    /// The `ibv_access_flags` bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// From `ibv_access_flags` bits (unknown bits are kept and ignored).
    pub const fn from_bits(bits: u32) -> Self {
        Self(bits)
    }
}

impl BitOr for Access {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Self) {
        self.0 |= rhs.0;
    }
}

/// Path MTU: the largest payload of one packet (IBA 9.7, `ibv_mtu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes.
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes.
    Mtu4096,
}

impl Mtu {
    /// The payload size in bytes.
    pub const fn bytes(self) -> u32 {
        match self {
            Self::Mtu256 => 256,
            Self::Mtu512 => 512,
            Self::Mtu1024 => 1024,
            Self::Mtu2048 => 2048,
            Self::Mtu4096 => 4096,
        }
    }
    /// Every MTU, smallest first.
    pub const ALL: [Self; 5] =
        [Self::Mtu256, Self::Mtu512, Self::Mtu1024, Self::Mtu2048, Self::Mtu4096];

    /// The MTU of `bytes` payload, if it is one of the five.
    pub fn from_bytes(bytes: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.bytes() == bytes)
    }

    /// Its code: IBA 9.7.5 / table 7 (1 = 256 bytes … 5 = 4096), which is also rdma-core's
    /// `enum ibv_mtu` and the CM's path MTU field.
    pub const fn code(self) -> u8 {
        match self {
            Self::Mtu256 => 1,
            Self::Mtu512 => 2,
            Self::Mtu1024 => 3,
            Self::Mtu2048 => 4,
            Self::Mtu4096 => 5,
        }
    }

    /// The MTU of a [`Mtu::code`], if it is one.
    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.code() == code)
    }
}

/// The transport service of a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connection.
    Rc,
    /// Unreliable connection: SEND and RDMA WRITE, no acknowledgements, no retransmission; a
    /// message that loses a packet is dropped whole.
    Uc,
    /// Unreliable datagram: one-packet SENDs to any QP named by an address handle, no
    /// connection, no acknowledgements; multicast.
    Ud,
    /// XRC initiator (`IBV_QPT_XRC_SEND`; IBA Annex A14): the sending half of an extended
    /// reliable connection, RC's requester with no receive queue; each request names the
    /// XRC SRQ at the target that takes it.
    XrcIni,
    /// XRC target (`IBV_QPT_XRC_RECV`): the receiving half, in an XRC domain, with no send
    /// queue, CQs or PD of its own; each request is received into, completed on and checked
    /// against the PD of the XRC SRQ it names, which must be in the QP's domain.
    XrcTgt,
}

impl QpType {
    /// The wire transport of the type's packets.
    pub const fn transport(self) -> uroce_wire::Transport {
        match self {
            Self::Rc => uroce_wire::Transport::Rc,
            Self::Uc => uroce_wire::Transport::Uc,
            Self::Ud => uroce_wire::Transport::Ud,
            Self::XrcIni | Self::XrcTgt => uroce_wire::Transport::Xrc,
        }
    }

    /// Whether the type's requests are acknowledged and retried (IBA 9.7): RC and XRC.
    pub const fn is_reliable(self) -> bool {
        matches!(self, Self::Rc | Self::XrcIni | Self::XrcTgt)
    }

    /// Whether the type's send queue carries `op` (IBA 9.8: UC carries SEND and RDMA WRITE
    /// and binds windows; UD carries SEND only; SEND with invalidate exists for RC and XRC
    /// only, atomic write for RC; an XRC target has no send queue).
    pub const fn carries(self, op: WrOpcode) -> bool {
        match self {
            Self::Rc => true,
            // IBA 1.5 defines the atomic write for RC.
            Self::XrcIni => !matches!(op, WrOpcode::AtomicWrite),
            Self::Uc => {
                !op.is_read_or_atomic()
                    && !matches!(op, WrOpcode::SendWithInv | WrOpcode::AtomicWrite)
            }
            Self::Ud => matches!(op, WrOpcode::Send | WrOpcode::SendWithImm),
            Self::XrcTgt => false,
        }
    }

    /// Whether the type has a send queue: all but the XRC target.
    pub const fn sends(self) -> bool {
        !matches!(self, Self::XrcTgt)
    }

    /// Whether the type has a receive queue of its own or an SRQ: all but XRC's halves
    /// (the target receives through the XRC SRQ each request names).
    pub const fn has_receive_queue(self) -> bool {
        !matches!(self, Self::XrcIni | Self::XrcTgt)
    }

    /// The high three bits of the type's opcodes (IBA 9.2.3): the operation codes are the
    /// same in every transport, offset by this.
    pub const fn opcode_base(self) -> u8 {
        match self {
            Self::Rc => 0x00,
            Self::Uc => 0x20,
            Self::Ud => 0x60,
            Self::XrcIni | Self::XrcTgt => 0xA0,
        }
    }
}

/// Queue pair states (IBA 10.3, figure "QP/EE context state transitions"; `ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Just created or reset: no queues active.
    Reset,
    /// Initialized: receives may be posted, nothing is processed.
    Init,
    /// Ready to receive: the responder runs.
    Rtr,
    /// Ready to send: requester and responder run.
    Rts,
    /// Send queue drain: no new send WQEs are started.
    Sqd,
    /// Send queue error (UD/UC only on real hardware).
    Sqe,
    /// Error: every WQE completes with `WR_FLUSH_ERR`.
    Error,
}

/// Where a connected QP sends: the peer's address (its RoCEv2 GID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressVector {
    /// The peer device's IP address.
    pub dest: IpAddr,
}

/// One scatter/gather element: `length` bytes at `addr` in the region named by `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sge {
    /// Virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region that holds the bytes.
    pub lkey: LKey,
}

impl Sge {
    /// The empty element (address 0, no bytes, key 0).
    pub const EMPTY: Self = Self { addr: 0, length: 0, lkey: LKey(0) };
}

/// A work request's scatter/gather list. Up to [`SgList::INLINE`] elements are held in place
/// and more on the heap, so that posting the usual one or two (every `ibv_post_send` and
/// `ibv_post_recv` of a ping-pong or a stream) allocates nothing. Reads and writes as a slice.
#[derive(Clone)]
pub struct SgList(SgRepr);

#[derive(Clone)]
enum SgRepr {
    Inline { len: u8, items: [Sge; SgList::INLINE] },
    Heap(Vec<Sge>),
}

impl SgList {
    /// Elements held without an allocation.
    pub const INLINE: usize = 2;

    /// An empty list.
    pub const fn new() -> Self {
        Self(SgRepr::Inline { len: 0, items: [Sge::EMPTY; Self::INLINE] })
    }

    /// Appends `sge`.
    pub fn push(&mut self, sge: Sge) {
        match &mut self.0 {
            SgRepr::Inline { len, items } => match items.get_mut(usize::from(*len)) {
                Some(slot) => {
                    *slot = sge;
                    *len += 1;
                }
                None => {
                    let mut v = Vec::with_capacity(Self::INLINE * 2);
                    v.extend_from_slice(items);
                    v.push(sge);
                    self.0 = SgRepr::Heap(v);
                }
            },
            SgRepr::Heap(v) => v.push(sge),
        }
    }

    /// Removes every element.
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Keeps the first `n` elements.
    pub fn truncate(&mut self, n: usize) {
        match &mut self.0 {
            SgRepr::Inline { len, .. } => *len = (*len).min(u8::try_from(n).unwrap_or(u8::MAX)),
            SgRepr::Heap(v) => v.truncate(n),
        }
    }
}

impl Default for SgList {
    fn default() -> Self {
        Self::new()
    }
}

impl core::ops::Deref for SgList {
    type Target = [Sge];
    fn deref(&self) -> &[Sge] {
        match &self.0 {
            SgRepr::Inline { len, items } => &items[..usize::from(*len)],
            SgRepr::Heap(v) => v,
        }
    }
}

impl core::ops::DerefMut for SgList {
    fn deref_mut(&mut self) -> &mut [Sge] {
        match &mut self.0 {
            SgRepr::Inline { len, items } => &mut items[..usize::from(*len)],
            SgRepr::Heap(v) => v,
        }
    }
}

impl fmt::Debug for SgList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for SgList {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for SgList {}

impl FromIterator<Sge> for SgList {
    fn from_iter<I: IntoIterator<Item = Sge>>(iter: I) -> Self {
        let mut list = Self::new();
        for sge in iter {
            list.push(sge);
        }
        list
    }
}

impl From<Vec<Sge>> for SgList {
    fn from(v: Vec<Sge>) -> Self {
        if v.len() <= Self::INLINE { v.into_iter().collect() } else { Self(SgRepr::Heap(v)) }
    }
}

impl<const N: usize> From<[Sge; N]> for SgList {
    fn from(a: [Sge; N]) -> Self {
        a.into_iter().collect()
    }
}

impl From<SgList> for Vec<Sge> {
    fn from(list: SgList) -> Self {
        match list.0 {
            SgRepr::Inline { .. } => list.to_vec(),
            SgRepr::Heap(v) => v,
        }
    }
}

impl<'a> IntoIterator for &'a SgList {
    type Item = &'a Sge;
    type IntoIter = core::slice::Iter<'a, Sge>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// The operation of a send work request (`ibv_wr_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WrOpcode {
    /// SEND.
    Send,
    /// SEND with immediate data.
    SendWithImm,
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA WRITE with immediate data (consumes a receive WQE at the peer).
    RdmaWriteWithImm,
    /// RDMA READ.
    RdmaRead,
    /// Atomic compare and swap of 8 bytes.
    AtomicCmpAndSwp,
    /// Atomic fetch and add of 8 bytes.
    AtomicFetchAndAdd,
    /// SEND that invalidates a key at the responder (`IBV_WR_SEND_WITH_INV`; IETH, IBA 9.4.1.2
    /// and 10.6.7.2.7): RC only.
    SendWithInv,
    /// Invalidates a type 2 memory window's key here (`IBV_WR_LOCAL_INV`; IBA 10.6.7.2.6).
    LocalInv,
    /// Binds a memory window (`IBV_WR_BIND_MW`, `ibv_bind_mw`; IBA 10.6.7.2).
    BindMw,
    /// Stores 8 bytes at an aligned remote address at once (`IBV_WR_ATOMIC_WRITE`, IBA 1.5's
    /// RDMA ATOMIC WRITE): acknowledged as a WRITE, needing remote write access; RC only.
    AtomicWrite,
}

impl WrOpcode {
    /// Local operations: executed on this device in send-queue order, nothing on the wire.
    pub const fn is_local(self) -> bool {
        matches!(self, Self::LocalInv | Self::BindMw)
    }
    /// READ or atomic: operations that wait for response data and count against
    /// `max_rd_atomic`.
    pub const fn is_read_or_atomic(self) -> bool {
        matches!(self, Self::RdmaRead | Self::AtomicCmpAndSwp | Self::AtomicFetchAndAdd)
    }
    /// Atomic operations.
    pub const fn is_atomic(self) -> bool {
        matches!(self, Self::AtomicCmpAndSwp | Self::AtomicFetchAndAdd)
    }
    /// Operations that name remote memory.
    pub const fn is_rdma(self) -> bool {
        matches!(
            self,
            Self::RdmaWrite
                | Self::AtomicWrite
                | Self::RdmaWriteWithImm
                | Self::RdmaRead
                | Self::AtomicCmpAndSwp
                | Self::AtomicFetchAndAdd
        )
    }
    /// SENDs of every kind.
    pub const fn is_send(self) -> bool {
        matches!(self, Self::Send | Self::SendWithImm | Self::SendWithInv)
    }
    /// Operations that carry immediate data.
    pub const fn has_imm(self) -> bool {
        matches!(self, Self::SendWithImm | Self::RdmaWriteWithImm)
    }
}

/// Flags of a send work request (`ibv_send_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SendFlags(u32);

impl SendFlags {
    /// No flags: unsignaled, no fence.
    pub const NONE: Self = Self(0);
    /// Wait for every earlier READ and atomic to complete before starting.
    pub const FENCE: Self = Self(1);
    /// Generate a completion on success (errors always complete).
    pub const SIGNALED: Self = Self(1 << 1);
    /// Set the solicited-event bit on the last packet.
    pub const SOLICITED: Self = Self(1 << 2);

    /// Whether every flag in `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// These flags without those of `other`.
    pub const fn without(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }
}

impl BitOr for SendFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// The remote side of an RDMA or atomic operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    /// Remote virtual address.
    pub addr: u64,
    /// Remote key.
    pub rkey: RKey,
}

/// A send work request (`ibv_send_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub opcode: WrOpcode,
    /// Local buffers: gathered for SEND and WRITE, scattered into for READ and atomics (one
    /// 8-byte element for atomics).
    pub sg_list: SgList,
    /// Flags.
    pub flags: SendFlags,
    /// Immediate data, in network byte order, for the `*WithImm` opcodes.
    pub imm: Option<[u8; 4]>,
    /// Remote buffer, for RDMA and atomic opcodes.
    pub remote: Option<RemoteAddr>,
    /// Compare operand (compare-and-swap).
    pub compare_add: u64,
    /// Swap operand (compare-and-swap); for fetch-and-add the add operand is `compare_add`,
    /// as in `ibv_send_wr.wr.atomic`.
    pub swap: u64,
    /// Inline data (`IBV_SEND_INLINE`): the bytes to send, copied at post time; `sg_list` is
    /// then ignored and no local key is checked. The caller copies them from wherever they are.
    pub inline_data: Option<Vec<u8>>,
    /// UD only: where the datagram goes.
    pub ud: Option<UdDest>,
    /// The key `SendWithInv` invalidates at the responder, or `LocalInv` here.
    pub invalidate_rkey: Option<RKey>,
    /// `BindMw`: the window and what it is bound to.
    pub bind: Option<Box<MwBind>>,
    /// XRC initiator only: the XRC SRQ at the target that takes the request (sent in the
    /// XRCETH; `wr.qp_type.xrc.remote_srqn`, `ibv_wr_set_xrc_srqn`).
    pub xrc_remote_srqn: u32,
}

/// A memory window binding (`struct ibv_mw_bind_info` with the window and its new key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBind {
    /// The window.
    pub mw: MwHandle,
    /// The window's key as the consumer named it (`ibv_bind_mw`: the current one; a type 2
    /// bind request: the new one, whose low 8 bits are the consumer's key, IBA 10.6.7.2.3).
    pub rkey: RKey,
    /// The region the window lies in (`lkey`: `bind_info.mr`).
    pub mr: LKey,
    /// First address of the window.
    pub addr: u64,
    /// Length; 0 unbinds a type 1 window.
    pub length: u64,
    /// The remote rights the window grants (a subset of [`Access::REMOTE`]).
    pub access: Access,
}

/// A memory window (`ibv_alloc_mw`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MwHandle(pub u32);

/// The two kinds of memory window (IBA 10.6.7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MwType {
    /// Bound with `ibv_bind_mw`, usable by every QP of its PD, never invalidated.
    Type1,
    /// Bound by a work request to one QP (type 2B), invalidated locally or by the peer.
    Type2,
}

impl SendWr {
    /// A signaled work request of `opcode` over `sg_list`, with no remote side.
    pub fn new(wr_id: u64, opcode: WrOpcode, sg_list: impl Into<SgList>) -> Self {
        Self {
            wr_id,
            opcode,
            sg_list: sg_list.into(),
            flags: SendFlags::SIGNALED,
            imm: None,
            remote: None,
            compare_add: 0,
            swap: 0,
            inline_data: None,
            ud: None,
            invalidate_rkey: None,
            bind: None,
            xrc_remote_srqn: 0,
        }
    }
}

/// A receive work request (`ibv_recv_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Buffers the incoming message is scattered into, in order.
    pub sg_list: SgList,
}

/// Work completion status, numbered as `ibv_wc_status` (IBA 11.6 / rdma-core `verbs.h`).
/// `Debug` names it as rdma-core does: `WcStatus::REM_ACCESS_ERR`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct WcStatus(pub u32);

impl WcStatus {
    /// The operation completed.
    pub const SUCCESS: Self = Self(0);
    /// Local length error: a received message did not fit the receive buffers.
    pub const LOC_LEN_ERR: Self = Self(1);
    /// Local QP operation error.
    pub const LOC_QP_OP_ERR: Self = Self(2);
    /// Local protection error: a local key was invalid, of another PD, out of range, or lacked
    /// local write access.
    pub const LOC_PROT_ERR: Self = Self(4);
    /// Flushed: the QP was in the Error state.
    pub const WR_FLUSH_ERR: Self = Self(5);
    /// A memory window bind failed its checks (IBA 10.6.7.2.4).
    pub const MW_BIND_ERR: Self = Self(6);
    /// Bad response: an unexpected response opcode or length.
    pub const BAD_RESP_ERR: Self = Self(7);
    /// The responder reported an invalid request (NAK invalid request).
    pub const REM_INV_REQ_ERR: Self = Self(9);
    /// The responder reported a remote access error (NAK remote access error).
    pub const REM_ACCESS_ERR: Self = Self(10);
    /// The responder reported a remote operational error.
    pub const REM_OP_ERR: Self = Self(11);
    /// Transport retries (ACK timeouts and sequence NAKs) exhausted.
    pub const RETRY_EXC_ERR: Self = Self(12);
    /// RNR NAK retries exhausted.
    pub const RNR_RETRY_EXC_ERR: Self = Self(13);
    /// The responder reported an invalid RD request.
    pub const REM_INV_RD_REQ_ERR: Self = Self(15);
    /// A tag operation failed: a DEL of a tag a message had already taken (rdma-core
    /// `tag_matching.md`).
    pub const TM_ERR: Self = Self(22);
    /// A matched rendezvous request whose data does not fit the tag's buffer: its headers
    /// are there instead, and software carries on (rdma-core `tag_matching.md`).
    pub const TM_RNDV_INCOMPLETE: Self = Self(23);

    /// rdma-core's name for the status (`ibv_wc_status_str` without the prose).
    pub const fn name(self) -> &'static str {
        match self.0 {
            0 => "SUCCESS",
            1 => "LOC_LEN_ERR",
            2 => "LOC_QP_OP_ERR",
            4 => "LOC_PROT_ERR",
            5 => "WR_FLUSH_ERR",
            6 => "MW_BIND_ERR",
            7 => "BAD_RESP_ERR",
            9 => "REM_INV_REQ_ERR",
            10 => "REM_ACCESS_ERR",
            11 => "REM_OP_ERR",
            12 => "RETRY_EXC_ERR",
            13 => "RNR_RETRY_EXC_ERR",
            15 => "REM_INV_RD_REQ_ERR",
            22 => "TM_ERR",
            23 => "TM_RNDV_INCOMPLETE",
            _ => "OTHER",
        }
    }
}

impl fmt::Debug for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            "OTHER" => write!(f, "WcStatus({})", self.0),
            name => write!(f, "WcStatus::{name}"),
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a completion completes (`ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A SEND (with or without immediate).
    Send,
    /// An RDMA WRITE (with or without immediate).
    RdmaWrite,
    /// An RDMA READ.
    RdmaRead,
    /// A compare and swap.
    CompSwap,
    /// A fetch and add.
    FetchAdd,
    /// A received SEND.
    Recv,
    /// A received RDMA WRITE with immediate.
    RecvRdmaWithImm,
    /// A memory window bound.
    BindMw,
    /// A key invalidated locally.
    LocalInv,
    /// An RDMA ATOMIC WRITE.
    AtomicWrite,
    /// A tag added to a TM-SRQ (`IBV_WC_TM_ADD`).
    TmAdd,
    /// A tag removed from a TM-SRQ (`IBV_WC_TM_DEL`).
    TmDel,
    /// The count of unexpected messages reported to a TM-SRQ (`IBV_WC_TM_SYNC`).
    TmSync,
    /// A tagged message received at a TM-SRQ, matched or not (`IBV_WC_TM_RECV`; the
    /// [`TmInfo`] flags say which).
    TmRecv,
    /// A NO_TAG message received at a TM-SRQ (`IBV_WC_TM_NO_TAG`).
    TmNoTag,
}

impl From<WrOpcode> for WcOpcode {
    fn from(op: WrOpcode) -> Self {
        match op {
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => Self::Send,
            WrOpcode::LocalInv => Self::LocalInv,
            WrOpcode::BindMw => Self::BindMw,
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => Self::RdmaWrite,
            WrOpcode::RdmaRead => Self::RdmaRead,
            WrOpcode::AtomicCmpAndSwp => Self::CompSwap,
            WrOpcode::AtomicFetchAndAdd => Self::FetchAdd,
            WrOpcode::AtomicWrite => Self::AtomicWrite,
        }
    }
}

/// A work completion (`ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed. For flushed receive WQEs this is `Recv`.
    pub opcode: WcOpcode,
    /// Bytes received (receives, READ) or the message length (sends).
    pub byte_len: u32,
    /// Immediate data, for receives that carried it.
    pub imm: Option<[u8; 4]>,
    /// The local QP.
    pub qp_num: Qpn,
    /// The sending QP, for receives (from the DETH on UD).
    pub src_qp: Qpn,
    /// UD receives: the first 40 bytes of the receive buffer hold the packet's network header
    /// (`IBV_WC_GRH`).
    pub grh: bool,
    /// UD receives: that header is IPv4 (RoCEv2 over IPv4; IPv6 otherwise).
    pub ipv4: bool,
    /// Receives of a SEND with invalidate: the key the sender invalidated here
    /// (`IBV_WC_WITH_INV`, `wc.invalidated_rkey`).
    pub invalidated_rkey: Option<RKey>,
    /// When the completion entered its CQ, on the engine's clock (the latest time the runtime
    /// has passed in): `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`.
    pub timestamp: crate::Instant,
    /// Completions of a TM-SRQ: the tag-matching flags and, for a matched message, its tag
    /// (`IBV_WC_EX_WITH_TM_INFO`).
    pub tm: Option<TmInfo>,
}

/// What a TM-SRQ's completion reports of tag matching (`ibv_wc_read_tm_info`, and the
/// `IBV_WC_TM_*` bits of `wc_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TmInfo {
    /// The matched message's tag (0 when none was matched).
    pub tag: u64,
    /// The matched message's application context (`priv`, from its TMH).
    pub app_ctx: u32,
    /// Match, data valid, synchronisation required.
    pub flags: TmFlags,
}

/// The tag-matching bits of a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TmFlags(u8);

impl TmFlags {
    /// None.
    pub const NONE: Self = Self(0);
    /// `IBV_WC_TM_SYNC_REQ`: the device and the consumer disagree on the count of unexpected
    /// messages; matching is off until an operation with `IBV_OPS_TM_SYNC` reports it.
    pub const SYNC_REQ: Self = Self(1);
    /// `IBV_WC_TM_MATCH`: a posted tag took the message.
    pub const MATCH: Self = Self(1 << 1);
    /// `IBV_WC_TM_DATA_VALID`: all of the matched message's data is in the tag's buffer.
    pub const DATA_VALID: Self = Self(1 << 2);

    /// Whether every flag in `other` is set.
    #[must_use]
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for TmFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

#[cfg(test)]
mod tests {
    use super::{LKey, SgList, Sge, WcStatus};

    #[test]
    fn a_status_prints_its_rdma_core_name() {
        assert_eq!(format!("{:?}", WcStatus::REM_ACCESS_ERR), "WcStatus::REM_ACCESS_ERR");
        assert_eq!(format!("{:?}", WcStatus::SUCCESS), "WcStatus::SUCCESS");
        assert_eq!(format!("{:?}", WcStatus(99)), "WcStatus(99)");
        assert_eq!(WcStatus::RETRY_EXC_ERR.to_string(), "RETRY_EXC_ERR");
    }

    /// A scatter/gather list reads as the elements pushed, in order, whether it holds them in
    /// place or has spilled to the heap; truncating and clearing work in both.
    #[test]
    fn a_scatter_gather_list_holds_what_was_pushed_in_place_or_spilled() {
        let sge =
            |k: u64| Sge { addr: k * 100, length: u32::try_from(k).unwrap_or(0), lkey: LKey(7) };
        let mut list = SgList::new();
        assert!(list.is_empty());
        for k in 0..5 {
            list.push(sge(k));
            assert_eq!(list.len(), usize::try_from(k + 1).unwrap_or(0));
            assert_eq!(list.last(), Some(&sge(k)));
        }
        assert_eq!(*list, [sge(0), sge(1), sge(2), sge(3), sge(4)]);
        list[1].length = 99;
        assert_eq!(list[1].length, 99);
        list.truncate(2);
        assert_eq!(list.len(), 2);
        list.clear();
        assert!(list.is_empty());

        let two: SgList = [sge(1), sge(2)].into();
        assert_eq!(two, SgList::from(vec![sge(1), sge(2)]));
        assert_eq!(two, [sge(1), sge(2)].into_iter().collect::<SgList>());
        let mut short = two.clone();
        short.truncate(1);
        assert_eq!(*short, [sge(1)]);
        assert_eq!(Vec::from(two.clone()), vec![sge(1), sge(2)]);
        let many = SgList::from(vec![sge(1), sge(2), sge(3)]);
        assert_eq!(many.len(), 3);
        assert_ne!(many, two);
        assert_eq!(format!("{two:?}"), format!("{:?}", vec![sge(1), sge(2)]));
    }
}
