//! The seam between the RDMA tests and the stack they measure: the same loops (`perf::rdma`)
//! over uroce's own API on any of its fabrics ([`uroce`]), or over a system's
//! `libibverbs.so.1` loaded at run time ([`verbs`]) — a hardware RNIC, rxe, or uroce's drop-in.
//!
//! A backend opens a [`Device`]; a device sets up one side of a test ([`Queues`]): a CQ, the
//! test's QPs, and three buffers (the source of what this side sends, the region it offers the
//! peer, and its receive slots). The loops keep their own bookkeeping (which QP, which slot,
//! which completion) and ask the queues only for what a verbs provider does.

#[allow(unsafe_code, reason = "the C calls into a system's libibverbs live in this module")]
mod libibverbs;
pub(crate) mod uroce;
pub(crate) mod verbs;

use core::time::Duration;
use std::net::IpAddr;

use ::uroce::{Endpoint, Mtu, QpType, Qpn, RemoteAddr};

/// Which stack the RDMA tests run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stack {
    /// uroce's own API, on the device of the side's address: to another process of the host
    /// over shared memory, or, with `udp_only`, every packet through the kernel's UDP path
    /// (`UROCE_FABRIC=udp`).
    Uroce { udp_only: bool },
    /// A device of the system's `libibverbs.so.1` (`--verbs [--device NAME] [--gid N]`).
    Verbs { device: Option<String>, gid_index: u32 },
}

impl Stack {
    /// Opens this stack's device; `addr` is the side's address (uroce's device).
    pub(crate) fn open(&self, addr: IpAddr) -> Result<Box<dyn Device>, String> {
        Ok(match self {
            Self::Uroce { udp_only } => Box::new(uroce::UroceDevice::open(addr, *udp_only)?),
            Self::Verbs { device, gid_index } => {
                Box::new(verbs::VerbsDevice::open(device.as_deref(), *gid_index)?)
            }
        })
    }
}

/// What one side of a test needs, sized by the loops.
#[derive(Debug, Clone)]
pub(crate) struct SidePlan {
    pub(crate) qp_type: QpType,
    /// QPs to create (streams spread work over them).
    pub(crate) qps: usize,
    /// Send queue depth of each QP.
    pub(crate) send_depth: u32,
    /// Receive queue depth of each QP.
    pub(crate) recv_depth: u32,
    /// Entries of the one CQ every QP completes on.
    pub(crate) cq_depth: usize,
    /// Bytes of the send buffer and of the region offered to the peer (at least 8: atomics).
    pub(crate) buf_len: usize,
    /// Bytes of the receive slots, all QPs together.
    pub(crate) recv_len: usize,
    /// Largest SEND posted inline.
    pub(crate) max_inline: u32,
    /// Path MTU; `None`: the port's active MTU (connecting takes the smaller of both ends').
    pub(crate) mtu: Option<Mtu>,
    /// Completions by event (sleeping) instead of busy polling.
    pub(crate) events: bool,
}

/// One operation on a QP. Offsets are into the send buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Work {
    /// A SEND of the buffer's first `len` bytes; `inline`: copied at post time; `to`: the UD
    /// destination QP (the address handle is the one [`Queues::connect`] made).
    Send { len: usize, inline: bool, to: Option<Qpn> },
    /// An RDMA WRITE of the first `len` bytes, with immediate data if `imm` is set.
    Write { len: usize, to: RemoteAddr, imm: Option<u32> },
    /// An RDMA READ of `len` bytes into the buffer's start.
    Read { len: usize, from: RemoteAddr },
    /// Fetch-and-add of 1 on the remote word; the old value lands at the buffer's start.
    FetchAdd { at: RemoteAddr },
    /// Compare-and-swap on the remote word.
    CompareSwap { at: RemoteAddr, compare: u64, swap: u64 },
}

/// What completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A receive of a SEND.
    Recv,
    /// A receive consumed by a WRITE with immediate data.
    RecvImm,
    /// Any work this side posted.
    Sent,
}

/// A work completion, as much of it as the loops read.
#[derive(Debug, Clone)]
pub(crate) struct Completion {
    pub(crate) wr_id: u64,
    pub(crate) kind: Kind,
    /// Bytes received (with the 40-byte network header in front on UD, when `grh`).
    pub(crate) byte_len: u32,
    pub(crate) grh: bool,
    /// `None` on success; otherwise what failed, in words (the status by name).
    pub(crate) error: Option<String>,
}

/// An RDMA device the tests can run on.
pub(crate) trait Device {
    /// Creates one side of a test; returns it and the endpoints (one per QP, each offering the
    /// side's region) to send to the peer.
    fn side(&self, plan: &SidePlan) -> Result<(Box<dyn Queues>, Vec<Endpoint>), String>;
    /// A line to add when a test fails (the device's counters), if the backend has one.
    fn failure_context(&self) -> Option<String>;
    /// What the device is, for people: `uroce 127.0.0.2`, `verbs mlx5_0`.
    fn describe(&self) -> String;
    /// Packets this process's device has sent so far (through the kernel's UDP path, over
    /// shared memory), where the backend can tell.
    fn sent(&self) -> Option<(u64, u64)>;
}

/// One side of a test on some device: QPs on one CQ and three registered buffers.
pub(crate) trait Queues: Send {
    /// Connects QP `i` to `peers[i]` (UD: makes an address handle to the first peer).
    fn connect(&mut self, peers: &[Endpoint]) -> Result<(), String>;
    /// Posts a receive of `len` bytes at `offset` of the receive slots on QP `qp`.
    fn post_recv(&self, qp: usize, wr_id: u64, offset: usize, len: usize) -> Result<(), String>;
    /// Posts `work` on QP `qp`, signaled.
    fn post(&self, qp: usize, wr_id: u64, work: Work) -> Result<(), String>;
    /// Appends what the CQ holds now to `out`, without waiting.
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<(), String>;
    /// Sleeps until a completion event or `limit`, then appends what the CQ holds.
    fn wait(&mut self, limit: Duration, out: &mut Vec<Completion>) -> Result<(), String>;
    /// Writes `bytes` into the send buffer at `offset`.
    fn write_buf(&self, offset: usize, bytes: &[u8]) -> Result<(), String>;
    /// Reads the offered region at `offset` (where a peer's WRITEs land).
    fn read_target(&self, offset: usize, out: &mut [u8]) -> Result<(), String>;
}
