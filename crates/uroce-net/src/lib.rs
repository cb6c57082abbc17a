//! uroce devices on real UDP sockets: the engine of `uroce-engine` driven by the wall clock,
//! fed by the kernel's UDP path, with capture and fault injection.
//!
//! # Packets
//!
//! A device binds UDP port 4791 on one address (IPv4 or IPv6); its GID is that address. Every
//! packet is RoCEv2: BTH, extension headers, payload, pad and ICRC, sent to port 4791 from a UDP
//! source port per QP (the flow's entropy; one small socket per source port, bound on first
//! use, because a UDP socket sends from the port it is bound to). Received packets have their
//! ICRC verified by the engine; mismatches are counted and dropped.
//!
//! The ICRC covers the IPv4 identification field, which user space does not choose. Sockets are
//! unconnected with `IP_PMTUDISC_DO`, for which Linux sends identification 0 — the value the
//! engine assumes. **UDP GSO is not used**: the kernel numbers the segments of a GSO send
//! 0, 1, 2, …, which would make every segment after the first fail its ICRC over IPv4. (IPv6
//! has no identification field, so GSO would be safe there; it is left for a measured change.)
//!
//! # Batching and copies
//!
//! Received datagrams are read with `recvmmsg`, up to 32 per call, each with its destination
//! address, TOS and TTL from control messages (UD receives report them in the GRH area).
//! Packets are sent with `sendmmsg`, up to 64 per call, grouped by source port.
//!
//! Copies, per payload byte, counting the kernel's own:
//! - TCP: two per message, application → kernel on send, kernel → application on receive.
//! - uroce send (SEND, WRITE, READ responses): one. The engine builds headers and trailer only
//!   ([`uroce_engine::Device::poll_transmit_gather`]); the ICRC is computed reading the payload
//!   where it lies, and `sendmmsg` gets iovecs for headers, the payload's pieces of registered
//!   memory, and trailer, so the kernel's copy into its socket buffer is the only one
//!   ([`NetCounters::tx_zero_copy`] counts these packets). Inline data is copied at post time,
//!   as verbs define it, and into the packet; with capture or fault injection on, each packet is
//!   assembled in one buffer first (one more copy).
//! - uroce receive: two. Kernel → receive buffer (`recvmmsg`), then → registered memory (the
//!   scatter, once every check has passed: where bytes go is known only after the headers are
//!   parsed and checked, and nothing may be written before that).
//!
//! So a message costs uroce three copies to TCP's two; the receive-side staging copy is the one
//! left to remove (reading headers first, then the payload straight into its destination).
//!
//! # Progress
//!
//! The engine sits behind one lock. Every verb ([`NetDevice::with`]) runs under it and then
//! sends what it produced; polling a CQ first makes a round of progress in the calling thread
//! ([`NetDevice::progress`]), so a busy-polling application never waits for another thread. A
//! background thread sleeps in `poll(2)` on the sockets, its wake-up eventfd and the engine's
//! next deadline, and makes progress when any fires: ACKs, retransmissions and one-sided
//! operations (an RDMA WRITE or READ whose target never polls) move without the application,
//! and an idle device sleeps without a deadline, using no CPU.
//!
//! Completion channels ([`Channel`]) are eventfds: the progress thread signals them when an
//! armed CQ's notification fires, so a blocked waiter wakes without polling.
//!
//! # Capture and faults
//!
//! `UROCE_PCAP=FILE` writes every packet sent and received to a pcap (Ethernet framing, as
//! `uroce decode` and Wireshark read it); `UROCE_FAULTS=loss=0.01,dup=0.001,reorder=0.01,corrupt=0.0001`
//! injects faults on send and on receive. [`Options`] sets both from code.
#![deny(unsafe_code)]

mod device;
mod fabric;
mod faults;
mod host;
#[allow(unsafe_code, reason = "all system calls and raw memory access live in this module")]
mod sys;

pub use device::{Channel, NetCounters, NetDevice, OpenError, Options, State, SubscriberId};
pub use faults::{Faults, FaultsError};
pub use sys::memory::Registry;
pub use sys::{
    EventFd, RawRegion, die_with_parent, pin_current_thread, process_cpu_time, set_socket_buffers,
};
