//! A drop-in `libibverbs.so.1`: rdma-core's verbs C ABI (`<infiniband/verbs.h>`, rdma-core 44)
//! on the uroce engine and runtime, so that unmodified verbs programs — `ibv_devinfo`,
//! `ibv_rc_pingpong`, perftest — run over uroce with no RDMA hardware, no kernel module and no
//! root:
//!
//! ```text
//! cargo build --release -p uroce-verbs
//! ln -sf liburoce_verbs.so target/release/libibverbs.so.1
//! UROCE_ADDR=127.0.0.2 LD_LIBRARY_PATH=target/release ibv_devinfo -v
//! ```
//!
//! # Devices
//!
//! One device per configured address (`uroce0`, `uroce1`, …), from `UROCE_ADDR`
//! (comma-separated) or, when it is unset, the file `UROCE_CONFIG` names, by default
//! `/etc/uroce/devices` (one address per line, `#` comments). Each has one port: Ethernet link
//! layer, active, MTU from the interface MTU (4096 on loopback), GID index 0 = the address as a
//! RoCEv2 GID.
//!
//! Devices are host-wide (see `uroce_net`): every process that lists an address opens the same
//! device, shares its port and reaches the other processes on the host through shared memory.
//! Processes that read the same config file see the same list under the same names;
//! `UROCE_ADDR` is a per-process override, named in its own order.
//!
//! `UROCE_PCAP`, `UROCE_FAULTS`, `UROCE_FABRIC` and `UROCE_PROGRESS_RT` work as for every uroce device
//! (`uroce_net::Options::from_env`). `UROCE_VERBS_DEBUG=1` prints on stderr why each refused
//! verb was refused (the C API only returns an errno).
//!
//! # The ABI
//!
//! - The data path (`ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv`, `ibv_poll_cq`,
//!   `ibv_req_notify_cq`) is inline in the header and calls through `ibv_context.ops`.
//! - Extended verbs find a `struct verbs_context` immediately before `struct ibv_context`,
//!   recognized by `abi_compat` = all-ones. Every extended verb uroce implements is set in it
//!   (`query_port` with the caller's structure size, `query_device_ex`, `create_cq_ex`,
//!   `create_qp_ex`, `create_srq_ex`, `open_qp`, XRC domains, thread and parent domains,
//!   device memory, `post_srq_ops`, `query_rt_values`, `advise_mr`); the header's wrappers
//!   of those left empty (`modify_cq`, flows and flow actions, work queues and RSS tables,
//!   counters, `alloc_null_mr`, `modify_qp_rate_limit`) fail with `EOPNOTSUPP`.
//! - The structures are `uroce_verbs_abi`'s, which `uroce`'s benchmark also uses to drive a
//!   system's libibverbs.
//! - Every symbol of the real library exists with its version node (`src/symbols.rs`), because
//!   programs and the libraries they load (librdmacm, libmlx5, libefa) are bound at start-up.
//!   What uroce does not support fails as documented and never crashes (`compat`).
//!
//! Unsafe code is the C ABI's: raw pointers from the caller, each use with its `SAFETY:` note.

use uroce_verbs_abi as abi;
mod compat;
mod rdmacm;
mod strings;
mod symbols;
mod verbs;
