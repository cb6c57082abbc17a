//! uroce devices: the engine of `uroce-engine` driven by the wall clock, with packets moved
//! by the kernel's UDP path between hosts and by shared memory between the processes of one
//! host, with capture and fault injection.
//!
//! # The host-wide device
//!
//! A device is an address (its RoCEv2 GID), and like a NIC it is host-wide: any number of
//! processes open it at once, each with its own PDs, MRs, CQs and QPs. Each process's
//! [`NetDevice`] is one *endpoint* of the device. There is no daemon: the processes coordinate
//! through a directory in shared memory, and the kernel does the rest.
//!
//! - **What owns the port.** Every endpoint binds the device's UDP port 4791 with
//!   `SO_REUSEPORT`; the kernel admits only sockets of the same effective uid to the group, so
//!   another user cannot attach to a device's traffic. A datagram from the wire reaches one
//!   endpoint: the one owning its destination QPN, picked by the group's steering program
//!   (`fabric::steer`), or where the kernel's flow hash sends it until the endpoints have found
//!   their sockets' places; when an endpoint exits or is killed its socket closes with it, and
//!   the others keep the port.
//! - **QPNs and routing.** The host directory (`/dev/shm/uroce-<uid>-<netns>/`, mode 0700) has
//!   254 endpoint slots; claiming one is a compare-and-swap on its word (generation and pid),
//!   and a slot whose process no longer exists is taken over. Slot `s` hands out QPNs
//!   `s << 16 ..= s << 16 | 0xFFFF` (the engine's [`uroce_engine::QpnBlock`]), so QPNs are
//!   unique per device without further coordination, and a packet's destination QPN names its
//!   endpoint: as a NIC demultiplexes by QPN, the port's steering program hands each datagram
//!   to the endpoint owning its QPN, and one that still receives a datagram for another
//!   endpoint's QPN hands it over unchanged through shared memory (`udp_rx_forwarded`).
//! - **The shared-memory path.** A packet whose destination address is a device on this host
//!   and whose QPN belongs to a live endpoint there goes into a single-producer
//!   single-consumer ring from this endpoint to that one (a file of the directory, mapped by
//!   both): no system call while both sides poll. A receiver about to sleep asks for a wake-up
//!   (a flag in its slot) and sleeps on a FIFO that senders write one byte to; an idle
//!   endpoint costs nothing. A full ring pauses its sender, as priority flow control pauses a
//!   RoCE link: the packets wait in a bounded backlog, in order; a device that closes sends
//!   its backlog and waits for running peers to read their rings first (a UD send has
//!   completed by then, as on a NIC that has put it on the wire). Packets are whole RoCEv2
//!   packets with their ICRC on this path too, so capture and `uroce decode` read them as any
//!   other; `UROCE_FABRIC=udp` sends everything through the kernel instead. The counters
//!   ([`NetCounters`]) say which path each packet took.
//! - **Discovery.** The directory's slots say which devices are open on the host, and by
//!   which processes; a process that opens an address another already has joins its device.
//!   `UROCE_SHM_DIR` puts the directories somewhere other than `/dev/shm` (a container with
//!   its own tmpfs, say); without a usable one a device stays private to its process, on UDP
//!   only, and says so on stderr.
//! - **When a process dies.** Its socket and FIFO close with it; its slot is taken over by
//!   the next process that claims one (its pid is gone); rings named after its generation are
//!   removed then, and nothing of it is ever mistaken for its successor's (every ring and FIFO
//!   name carries both endpoints' generations). Packets to it wait in its ring, then in its
//!   senders' backlogs, until their RC QPs give up with `RETRY_EXC_ERR`, as with a vanished
//!   host; its UC and UD peers lose those packets. No other endpoint is affected. The RDMA CM
//!   connections it held established are released for it, as the kernel releases a dead
//!   process's on a real RNIC: each endpoint publishes them as its last will
//!   (`src/last_will.rs`), and one that survives it looks at the wills of the dead once a
//!   second while it holds connections: the peer hears the DREQ, or another endpoint of the
//!   same address sends it.
//! - **Isolation.** Another user cannot enter the directory (0700, checked on open) nor join
//!   the port's group. A process of the same user sees only packets: what it writes into a
//!   ring is judged by the engine exactly as a packet from the wire (ICRC, QPN, PSN, rkeys and
//!   bounds), and no process's memory is reachable except through an rkey it was given.
//! - **QP1 and the connection manager.** QP1 (the GSI) is the port's and every endpoint's:
//!   each endpoint runs its own CM (`uroce_cm`), whose comm IDs carry its slot in their top
//!   byte. A MAD to QP1 is routed as a packet to a QPN is: a REQ or SIDR_REQ to the endpoint
//!   listening on its service ID (the host's port table, [`PortBinding`]), every other CM
//!   message to the endpoint named by the receiver's comm ID, and what nobody claims to the
//!   endpoint that has it, whose CM rejects a request nobody listens for.
//!
//! How datagrams move is a seam inside the crate (`src/fabric.rs`): one `Fabric` interface,
//! implemented by the UDP sockets and by the shared-memory rings, joined for a host-wide
//! device, with capture and fault injection as wrappers that work on any fabric. The runtime
//! (lock, clock, progress, channels, events, deferred deregistration) sees only the interface.
//!
//! # Packets on UDP
//!
//! Every packet is RoCEv2: BTH, extension headers, payload, pad and ICRC, sent to port 4791 from
//! a UDP source port per QP (the flow's entropy; one small socket per source port, bound on
//! first use, because a UDP socket sends from the port it is bound to). Received packets have
//! their ICRC verified by the engine; mismatches are counted and dropped.
//!
//! The ICRC covers the IPv4 identification field, which user space does not choose. Unicast
//! leaves from sockets connected to their peer (the kernel keeps the route), which number their
//! datagrams from a per-socket counter with a random start: each learns it once from an empty
//! probe it sends itself and follows it (`fabric::udp`). Unconnected sockets (`IP_PMTUDISC_DO`:
//! multicast, and every destination under `UROCE_ICRC_IP_ID=linux`) send a datagram sent
//! alone with identification 0 and segment k of one GSO send with k. A run of a QP's packets
//! to one destination, all of one length but the last, leaves in one segmented send
//! (`UDP_SEGMENT`, up to 64 packets), each packet sealed for the identification it will carry;
//! receiving sockets ask for coalesced runs (`UDP_GRO`) and cut them where the sender's
//! datagrams ended. A receiver cannot see the identification, so the engine finds it from the
//! ICRC (`uroce_wire::icrc::IdRecovery`) and by default accepts any (`UROCE_ICRC_IP_ID=linux`:
//! only 0..127, what an unconnected socket sends). IPv6 has no identification. `UROCE_GSO=0`
//! and `UROCE_GRO=0` turn the offloads off; a segmented send the kernel refuses turns GSO off
//! for the process.
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
//!   ([`NetCounters::tx_zero_copy`] counts these packets). A payload under 256 bytes is
//!   copied into its packet instead: an iovec of its own costs the kernel more than the copy
//!   (64-byte SENDs over UDP went 13 % faster). On the shared-memory path that one
//!   copy goes from registered memory into the ring. Inline data is copied at post time, as
//!   verbs define it, and into the packet; with capture or fault injection on, each packet is
//!   assembled in one buffer first (one more copy).
//! - uroce receive: two. Kernel → receive buffer (`recvmmsg`), or ring → receive buffer (a
//!   record is copied out before it is parsed: another process may write the ring at any time),
//!   then → registered memory (the scatter, once every check has passed).
//!
//! # Progress
//!
//! The engine sits behind one lock. Every verb ([`NetDevice::with`]) runs under it and then
//! sends what it produced; polling a CQ first makes a round of progress in the calling thread
//! ([`NetDevice::progress`]), so a busy-polling application never waits for another thread. A
//! background thread sleeps in `ppoll(2)` on the sockets, the shared-memory wake-up FIFO, its
//! own wake-up eventfd and the engine's next deadline, and makes progress when any fires: ACKs,
//! retransmissions and one-sided operations (an RDMA WRITE or READ whose target never polls)
//! move without the application, and an idle device sleeps without a deadline, using no CPU.
//!
//! Completion channels ([`Channel`]) are eventfds: the progress thread signals them when an
//! armed CQ's notification fires, so a blocked waiter wakes without polling.
//!
//! # Capture and faults
//!
//! `UROCE_PCAP=FILE` writes every packet sent and received to a pcap (Ethernet framing, as
//! `uroce decode` and Wireshark read it), whichever path it took;
//! `UROCE_FAULTS=loss=0.01,dup=0.001,reorder=0.01,corrupt=0.0001` injects faults on send and on
//! receive, on every path. [`Options`] sets both from code.
//!
//! # Looking from outside
//!
//! A running endpoint can be inspected by another process of its user (or root) without
//! restarting it: [`inspect`] asks it for a snapshot of its counters and QPs (`uroce stat`,
//! `uroce qp`) and opens capture sessions on it (`uroce capture`), through words of its slot in
//! the host directory. Nobody looking costs one load per round of progress and one per batch
//! of packets.
#![deny(unsafe_code)]

mod cm;
pub mod config;
mod device;
mod fabric;
mod host;
pub mod inspect;
mod last_will;
pub mod mappings;
mod ports;
#[allow(unsafe_code, reason = "all system calls and raw memory access live in this module")]
mod sys;

pub use cm::{PortBinding, node_guid};
pub use device::{
    Channel, CmSink, EnvError, NetCounters, NetDevice, OpenError, Options, State, SubscriberId,
};
pub use uroce_engine::faults::{Faults, FaultsError};

/// 32 bits of the operating system's randomness (for choices a peer must not predict, such as
/// an RDMA CM connection's first PSN), or 0 if the OS has none to give.
pub fn random_u32() -> u32 {
    getrandom::u32().unwrap_or(0)
}
pub use ports::BindError;
pub use sys::memory::Registry;
pub use sys::{
    EventFd, RawRegion, current_thread_cpus, die_with_parent, interface_of, pin_current_thread,
    process_cpu_time, set_socket_buffers, socket_buffers,
};
pub use uroce_cm;

/// Entry points for the fuzz targets: the readers of bytes another process writes, reached
/// without a host directory. Not a stable interface.
#[doc(hidden)]
pub mod fuzzing {
    use uroce_engine::RxInfo;

    pub use crate::device::NetCounters;

    /// The shared-memory ring reader on `data`, published by a hostile producer as
    /// `head..tail`: every packet it takes goes to `sink` (source, bytes, whether the sender
    /// left the ICRC out); the counters say what it refused. `Err` names a broken promise of
    /// the reader itself.
    pub fn shm_ring(
        data: &[u8],
        head: u64,
        tail: u64,
        sink: &mut dyn FnMut(&RxInfo, &[u8], bool),
    ) -> Result<NetCounters, String> {
        crate::fabric::shm::fuzz_ring(data, head, tail, sink)
    }
}
