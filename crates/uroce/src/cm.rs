//! Connections set up by the InfiniBand connection manager on QP1, the way the RDMA CM sets
//! them up (`rdma_listen`, `rdma_connect`, `rdma_accept`, `rdma_disconnect`): no out-of-band
//! channel, and a peer may be any RDMA CM program on the TCP port space (`rping -s` and the
//! like), since the REQ carries the RDMA CM's IP header in its private data.
//!
//! ```
//! use std::time::Duration;
//! use uroce::{Context, QpType};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (a, b) = (Context::open("127.0.1.4".parse()?)?, Context::open("127.0.1.5".parse()?)?);
//! let listener = b.listen(0, 8)?;
//! let server = listener.local_addr();
//! let t = std::thread::spawn(move || {
//!     let (pd, cq) = (b.alloc_pd(), b.create_cq(16).unwrap());
//!     let qp = pd.qp(QpType::Rc, &cq).build().unwrap();
//!     let conn = listener.accept(&qp, b"welcome", Some(Duration::from_secs(5))).unwrap();
//!     assert!(conn.private_data().starts_with(b"hello"));
//!     conn.wait_disconnect(Some(Duration::from_secs(5))).unwrap();
//! });
//! let (pd, cq) = (a.alloc_pd(), a.create_cq(16)?);
//! let qp = pd.qp(QpType::Rc, &cq).build()?;
//! let conn = qp.connect_to(server, b"hello", Some(Duration::from_secs(5)))?;
//! assert!(conn.private_data().starts_with(b"welcome"));
//! conn.disconnect(Some(Duration::from_secs(5)))?;
//! t.join().unwrap();
//! # Ok(()) }
//! ```

use core::fmt;
use core::net::SocketAddr;
use core::time::Duration;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use uroce_net::uroce_cm::{self, AcceptParams, CommId, ConnState, ConnectParams, Event};
use uroce_net::{BindError, PortBinding};
use uroce_wire::cm::TransportType;
use uroce_wire::cma::{self, PortSpace};

use crate::{Context, Endpoint, Error, Mtu, QpType, Result};

/// Why a connection through the CM failed.
#[derive(Debug)]
pub enum CmError {
    /// The port could not be bound (in use, or none left).
    Bind(BindError),
    /// The CM refused the call (a connection limit, a state that does not allow it).
    Refused(uroce_cm::Error),
    /// The peer rejected the REQ or REP, for this reason (IBA 12.6.7.2, table 112: 8 is
    /// "invalid service ID", nobody listens on the port).
    Rejected(u16),
    /// The REQ or REP went unanswered through every retry (IBA 12.4.1).
    Unreachable,
    /// Nothing came within the caller's timeout.
    TimedOut,
    /// Only RC and UC QPs connect through the CM this way (UD services use SIDR).
    NotConnected(QpType),
    /// The RDMA CM header names both ends in one IP version: an IPv4 device cannot reach an
    /// IPv6 listener or the other way round.
    AddressFamilies,
}

impl fmt::Display for CmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bind(e) => write!(f, "RDMA CM port: {e}"),
            Self::Refused(e) => write!(f, "connection manager: {e}"),
            Self::Rejected(8) => f.write_str("rejected: invalid service ID (nobody listens)"),
            Self::Rejected(r) => write!(f, "rejected by the peer, reason {r} (IBA table 112)"),
            Self::Unreachable => f.write_str("the peer did not answer the CM (every retry)"),
            Self::TimedOut => f.write_str("no connection within the timeout"),
            Self::NotConnected(t) => write!(f, "a {t:?} QP is not connected through the CM"),
            Self::AddressFamilies => {
                f.write_str("the device and the listener are of different IP versions")
            }
        }
    }
}

impl From<CmError> for Error {
    fn from(e: CmError) -> Self {
        Self::Cm(e)
    }
}

/// The CM events of one context, for whichever call waits for them.
#[derive(Debug, Default)]
pub(crate) struct Hub {
    events: Mutex<VecDeque<Event>>,
    arrived: Condvar,
}

/// Events nobody has waited for yet are kept up to this many (the oldest go first).
const HUB_CAPACITY: usize = 1024;

impl Hub {
    fn lock(&self) -> MutexGuard<'_, VecDeque<Event>> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, e: Event) {
        // Nothing acts on a comm ID leaving TimeWait.
        if matches!(e, Event::TimewaitExit { .. }) {
            return;
        }
        let mut q = self.lock();
        if q.len() >= HUB_CAPACITY {
            q.pop_front();
        }
        q.push_back(e);
        self.arrived.notify_all();
    }

    /// Takes the first event `wanted` picks, waiting for one until `timeout` passes. Asleep:
    /// busy-polling for a CM answer, which needs the peer's progress and application threads
    /// to run, only takes a core from them on a small machine.
    fn take(&self, timeout: Option<Duration>, wanted: impl Fn(&Event) -> bool) -> Option<Event> {
        #[expect(clippy::disallowed_methods, reason = "a blocking wait reads the clock")]
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        let mut q = self.lock();
        loop {
            if let Some(i) = q.iter().position(&wanted) {
                return q.remove(i);
            }
            q = match deadline.map(crate::time_left) {
                None => self.arrived.wait(q).unwrap_or_else(PoisonError::into_inner),
                Some(None) => return None,
                Some(Some(left)) => {
                    self.arrived.wait_timeout(q, left).unwrap_or_else(PoisonError::into_inner).0
                }
            };
        }
    }
}

/// The comm ID an event is about (`None` for requests, which are about a service).
const fn about(e: &Event) -> Option<CommId> {
    match e {
        Event::Reply { id, .. }
        | Event::Established { id }
        | Event::Rejected { id, .. }
        | Event::Unreachable { id }
        | Event::DisconnectRequest { id, .. }
        | Event::Disconnected { id }
        | Event::TimewaitExit { id } => Some(*id),
        _ => None,
    }
}

impl Context {
    /// This context's CM events, its sink installed on first use.
    fn hub(&self) -> Arc<Hub> {
        Arc::clone(self.cm.get_or_init(|| {
            let hub = Arc::new(Hub::default());
            let sink = Arc::clone(&hub);
            self.dev.with(|s| s.set_cm_sink(Box::new(move |e| sink.push(e))));
            hub
        }))
    }

    /// Listens for connections on TCP-space RDMA CM `port` of this device (0: a free port
    /// of the ephemeral range), at most `backlog` requests waiting (`rdma_listen(3)`).
    /// The port is the host's: another process listening on it makes this fail.
    pub fn listen(&self, port: u16, backlog: usize) -> Result<Listener> {
        let hub = self.hub();
        let space = PortSpace::Tcp;
        let binding =
            self.dev.bind_port(space.value(), port, self.addr()).map_err(CmError::Bind)?;
        let service_id = space.service_id(binding.port());
        self.dev.with(|s| s.cm().0.listen(service_id, backlog)).map_err(CmError::Refused)?;
        binding.set_listening(true);
        Ok(Listener { ctx: self.clone(), hub, binding, service_id })
    }
}

/// A listening RDMA CM port; stops listening when dropped.
#[derive(Debug)]
pub struct Listener {
    ctx: Context,
    hub: Arc<Hub>,
    binding: PortBinding,
    service_id: u64,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.binding.set_listening(false);
        let sid = self.service_id;
        self.ctx.dev.with(|s| s.cm().0.unlisten(sid));
    }
}

impl Listener {
    /// The address and port clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        SocketAddr::new(self.ctx.addr(), self.binding.port())
    }

    /// Waits for a connection request, connects `qp` to the requester (Init → RTR → RTS) and
    /// accepts with a REP carrying `private_data` (at most 196 bytes, IBA 12.6.8); returns
    /// once the requester's RTU arrives (`rdma_get_cm_event` … `rdma_accept`).
    pub fn accept(
        &self,
        qp: &crate::Qp,
        private_data: &[u8],
        timeout: Option<Duration>,
    ) -> Result<Connection> {
        let transport = transport_of(qp.qp_type)?;
        let sid = self.service_id;
        let request = self
            .hub
            .take(timeout, |e| matches!(e, Event::Request { info, .. } if info.service_id == sid));
        let Some(Event::Request { id, from, info }) = request else {
            return Err(CmError::TimedOut.into());
        };
        let reject = |why: u16| {
            self.ctx.dev.with(|s| {
                let (cm, now) = s.cm();
                let _ = cm.reject(now, id, why, &[]);
            });
        };
        if info.transport != transport {
            reject(uroce_wire::cm::reason::INVALID_TRANSPORT_TYPE);
            return Err(CmError::Rejected(uroce_wire::cm::reason::INVALID_TRANSPORT_TYPE).into());
        }
        // An RDMA CM peer's private data starts with its IP header (rdma_cm's `cma_hdr`);
        // a bare IB CM peer's does not.
        let theirs = match cma::Header::parse(&info.private_data) {
            Ok(_) => info.private_data.get(cma::HEADER_LEN..).unwrap_or(&[]).to_vec(),
            Err(_) => info.private_data.clone(),
        };
        let mtu = Mtu::from_code(info.path_mtu).map_or(qp.mtu, |m| m.min(qp.mtu));
        let remote = Endpoint {
            gid: from,
            qpn: info.remote_qpn,
            psn: info.starting_psn,
            mtu,
            qkey: qp.qkey,
            regions: Vec::new(),
        };
        if let Err(e) = qp.connect(&remote) {
            reject(uroce_wire::cm::reason::NO_RESOURCES);
            return Err(e);
        }
        let depth = uroce_engine::qp::MAX_RD_ATOMIC;
        let accept = AcceptParams {
            qpn: qp.qpn,
            starting_psn: qp.psn,
            responder_resources: info.initiator_depth.min(depth),
            initiator_depth: info.responder_resources.min(depth),
            rnr_retry_count: qp.rnr_retry & 7,
            srq: false,
            private_data: private_data.to_vec(),
        };
        self.ctx
            .dev
            .with(|s| {
                let (cm, now) = s.cm();
                cm.accept(now, id, &accept)
            })
            .map_err(CmError::Refused)?;
        let conn = Connection {
            ctx: self.ctx.clone(),
            hub: Arc::clone(&self.hub),
            id,
            qpn: qp.qpn,
            theirs,
            _port: None,
        };
        conn.until_established(timeout)?;
        Ok(conn)
    }
}

fn transport_of(t: QpType) -> Result<TransportType> {
    match t {
        QpType::Rc => Ok(TransportType::Rc),
        QpType::Uc => Ok(TransportType::Uc),
        other => Err(CmError::NotConnected(other).into()),
    }
}

impl crate::Qp {
    /// Connects this RC or UC QP to the RDMA CM listener at `dest` through the CM: REQ with
    /// `private_data` (at most 56 bytes after the RDMA CM header, IBA 12.6.5), the REP moves
    /// the QP to RTR and RTS, RTU (`rdma_resolve_addr`, `rdma_resolve_route`,
    /// `rdma_connect`). The CM's own timeouts and retries apply; `timeout` bounds the wait.
    pub fn connect_to(
        &self,
        dest: SocketAddr,
        private_data: &[u8],
        timeout: Option<Duration>,
    ) -> Result<Connection> {
        let transport = transport_of(self.qp_type)?;
        let ctx = &self.ctx;
        let hub = ctx.hub();
        let local_ip = ctx.addr();
        // The active side holds a port of its own for the connection's life (rdma_cm binds
        // one at rdma_resolve_addr), which the RDMA CM header names.
        let space = PortSpace::Tcp;
        let binding = ctx.dev.bind_port(space.value(), 0, local_ip).map_err(CmError::Bind)?;
        let header = cma::Header { src: local_ip, dst: dest.ip(), src_port: binding.port() };
        let mut private = vec![0u8; cma::HEADER_LEN];
        header.emit(&mut private).map_err(|_| CmError::AddressFamilies)?;
        private.extend_from_slice(private_data);
        let params = ConnectParams {
            remote: dest.ip(),
            local: local_ip,
            service_id: space.service_id(dest.port()),
            qpn: self.qpn,
            starting_psn: self.psn,
            transport,
            responder_resources: uroce_engine::qp::MAX_RD_ATOMIC,
            initiator_depth: self.max_rd_atomic,
            path_mtu: self.mtu.code(),
            retry_count: self.retry_cnt & 7,
            rnr_retry_count: self.rnr_retry & 7,
            srq: false,
            local_ack_timeout: self.timeout,
            private_data: private,
        };
        let id = ctx
            .dev
            .with(|s| {
                let (cm, now) = s.cm();
                cm.connect(now, &params)
            })
            .map_err(CmError::Refused)?;
        let mut conn = Connection {
            ctx: ctx.clone(),
            hub,
            id,
            qpn: self.qpn,
            theirs: Vec::new(),
            _port: None,
        };
        let answer = conn.hub.take(timeout, |e| {
            about(e) == Some(id)
                && matches!(
                    e,
                    Event::Reply { .. } | Event::Rejected { .. } | Event::Unreachable { .. }
                )
        });
        let info = match answer {
            Some(Event::Reply { info, .. }) => info,
            Some(Event::Rejected { reason, .. }) => return Err(CmError::Rejected(reason).into()),
            Some(_) => return Err(CmError::Unreachable.into()),
            None => return Err(CmError::TimedOut.into()),
        };
        let remote = Endpoint {
            gid: dest.ip(),
            qpn: info.remote_qpn,
            psn: info.starting_psn,
            mtu: self.mtu,
            qkey: self.qkey,
            regions: Vec::new(),
        };
        // On failure the connection's drop rejects the REP (IBA 12.9.5.4).
        self.connect(&remote)?;
        ctx.dev.with(|s| s.cm().0.ready(id)).map_err(CmError::Refused)?;
        conn.theirs = info.private_data;
        conn._port = Some(binding);
        conn.until_established(timeout)?;
        Ok(conn)
    }
}

/// A connection the CM set up; disconnected (DREQ) when dropped.
#[derive(Debug)]
pub struct Connection {
    ctx: Context,
    hub: Arc<Hub>,
    id: CommId,
    qpn: crate::Qpn,
    theirs: Vec<u8>,
    /// The active side's own port, held for the connection's life.
    _port: Option<PortBinding>,
}

impl Connection {
    /// The private data the peer sent, padded with zeros to the MAD field's length as the
    /// RDMA CM delivers it: the REQ's (56 bytes after the RDMA CM header) on the listening
    /// side, the REP's (196 bytes) on the other.
    pub fn private_data(&self) -> &[u8] {
        &self.theirs
    }

    /// The local communication ID (IBA 12.6.5), as `uroce decode` shows it on the wire.
    pub fn comm_id(&self) -> u32 {
        self.id
    }

    fn until_established(&self, timeout: Option<Duration>) -> Result<()> {
        let id = self.id;
        let e = self.hub.take(timeout, |e| {
            about(e) == Some(id)
                && matches!(
                    e,
                    Event::Established { .. } | Event::Rejected { .. } | Event::Unreachable { .. }
                )
        });
        match e {
            Some(Event::Established { .. }) => Ok(()),
            Some(Event::Rejected { reason, .. }) => Err(CmError::Rejected(reason).into()),
            Some(_) => Err(CmError::Unreachable.into()),
            None => Err(CmError::TimedOut.into()),
        }
    }

    /// Disconnects (DREQ; the QP goes to Error) and waits for the peer's DREP, or for the
    /// CM to give up on it (`rdma_disconnect`, then `RDMA_CM_EVENT_DISCONNECTED`).
    pub fn disconnect(self, timeout: Option<Duration>) -> Result<()> {
        self.send_disconnect()?;
        let id = self.id;
        let done = self.hub.take(timeout, |e| {
            about(e) == Some(id)
                && matches!(e, Event::Disconnected { .. } | Event::DisconnectRequest { .. })
        });
        done.map(drop).ok_or_else(|| CmError::TimedOut.into())
    }

    /// Waits for the peer to disconnect, then answers it (DREP).
    pub fn wait_disconnect(self, timeout: Option<Duration>) -> Result<()> {
        let id = self.id;
        let dreq = self.hub.take(timeout, |e| {
            about(e) == Some(id)
                && matches!(e, Event::DisconnectRequest { .. } | Event::Disconnected { .. })
        });
        dreq.ok_or(CmError::TimedOut)?;
        self.send_disconnect()
    }

    /// DREQ, or DREP to the peer's DREQ (the CM knows which), and the QP to Error: as
    /// `rdma_disconnect(3)` does, work still queued completes flushed.
    fn send_disconnect(&self) -> Result<()> {
        let (id, qpn) = (self.id, self.qpn);
        self.ctx.dev.with(|s| {
            let error = crate::QpAttr { state: Some(crate::QpState::Error), ..Default::default() };
            // The QP may be gone already; the connection is released all the same.
            let _ = s.engine().modify_qp(qpn, &error);
            let (cm, now) = s.cm();
            match cm.state(id) {
                Some(
                    ConnState::Established
                    | ConnState::RepSent
                    | ConnState::RepRcvd
                    | ConnState::DreqRcvd,
                ) => cm.disconnect(now, id).map_err(|e| CmError::Refused(e).into()),
                _ => Ok(()),
            }
        })
    }
}

impl Drop for Connection {
    /// Whatever the connection's state, the CM finishes it without telling anyone: a REP not
    /// yet answered is rejected, a live connection released (`rdma_destroy_id`).
    fn drop(&mut self) {
        let id = self.id;
        self.ctx.dev.with(|s| {
            let (cm, now) = s.cm();
            cm.destroy(now, id);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_mtu_codes_are_ibas() {
        assert_eq!(Mtu::Mtu256.code(), 1);
        assert_eq!(Mtu::Mtu4096.code(), 5);
        assert_eq!(Mtu::from_code(3), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_code(0), None);
        assert_eq!(Mtu::from_code(6), None);
    }
}
