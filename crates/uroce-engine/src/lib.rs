//! The RoCEv2 transport as a sans-IO state machine: what an RNIC does in silicon.
//!
//! A [`Device`] is the transport of one address. It never reads a clock, sleeps, spawns a
//! thread or touches a socket: packets go in through [`Device::handle_datagram`] and out through
//! [`Device::poll_transmit`]; time is passed in as an [`Instant`], and the next deadline comes
//! out of [`Device::poll_timeout`]; application memory is reached through [`MemoryAccess`].
//! Given the same seed and the same inputs at the same instants it produces the same outputs,
//! which is what lets `uroce-sim` test every loss and timing rule in virtual time.
//!
//! The call order a runtime follows: after every input (a datagram, a verb, a timeout), call
//! `poll_transmit` until it returns `None`; sleep until `poll_timeout` or the next datagram.
//!
//! Module map (Linux rxe's split): `device` holds the objects and the verbs, `receive` every
//! check a datagram passes on its way to a QP, `ctx` what the protocol steps share beside
//! one QP; `requester` builds request packets, `responder` executes requests and answers
//! them, `completer` handles answers and timers and completes send WQEs; `sg` walks
//! scatter/gather lists for all three; `mr` checks every memory access (regions and
//! windows), `qp` holds the state machine, `tm` the tag matching of TM-SRQs; `attr` and
//! `errors` the configuration, limits and error types.
#![forbid(unsafe_code)]

mod attr;
pub mod bring_up;
mod completer;
pub mod counters;
mod cq;
mod ctx;
pub mod device;
mod errors;
pub mod faults;
pub mod gsi;
pub mod inspect;
pub mod memory;
pub mod mr;
pub mod qp;
pub mod qp_transitions;
mod receive;
mod requester;
mod responder;
mod rng;
pub mod seeded;
mod sg;
mod srq;
pub mod time;
pub mod tm;
pub mod types;
mod watch;
mod xrc;

pub use bring_up::{PathAttr, Reliability};
pub use counters::{Counters, PacketFate, QpCounters};
pub use device::{
    AsyncEvent, CreateError, DEVICE_ATTR, DestroyError, Device, DeviceAttr, DeviceConfig,
    McastError, QpnBlock, ResizeCqError, RxInfo, Transmit,
};
pub use gsi::GsiMad;
pub use inspect::QpInfo;
pub use memory::{MemoryAccess, MemoryFault, VecMemory};
pub use mr::{AccessError, MemoryRegion};
pub use qp::{ModifyError, PostError, QpAttr, QpCap, QpInitAttr};
pub use time::{Duration, Instant};
pub use types::*;
pub use uroce_wire::{PKey, Psn, QKey, Qpn, RKey};
