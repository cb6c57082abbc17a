//! QP1, the general services interface (IBA 13.5.1): the port's management datagrams. The
//! device carries MADs to and from QP1 as UD packets with the GSI's Q_Key; what they say is
//! the business of the communication manager above (`uroce-cm`), which hands the device whole
//! MADs to send and takes whole MADs received.

use core::net::{IpAddr, SocketAddr};
use std::collections::VecDeque;

use uroce_wire::ROCE_V2_PORT;
use uroce_wire::icrc::PseudoHeader;
use uroce_wire::mad::{self, MAD_LEN};

use crate::ctx::Transmit;
use crate::{Counters, Psn};

/// MADs queued each way before the device drops (`drop_gsi_overflow`): QP1's queues, sized as
/// Linux's MAD layer sizes its receive queue (`mad_recvq_size`, 512) and then some.
pub const GSI_QUEUE: usize = 1024;

/// A MAD received on QP1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GsiMad {
    /// The sender's address.
    pub from: IpAddr,
    /// The MAD.
    pub mad: [u8; MAD_LEN],
}

#[derive(Debug)]
pub(crate) struct Gsi {
    rx: VecDeque<GsiMad>,
    tx: VecDeque<(IpAddr, [u8; MAD_LEN])>,
    psn: Psn,
    /// QP1's UDP source port.
    src_port: u16,
    pseudo: Option<(IpAddr, PseudoHeader)>,
}

impl Gsi {
    pub(crate) fn new(src_port: u16) -> Self {
        Self {
            rx: VecDeque::new(),
            tx: VecDeque::new(),
            psn: Psn::from_masked(0),
            src_port,
            pseudo: None,
        }
    }

    pub(crate) fn queue_send(&mut self, dst: IpAddr, mad: &[u8; MAD_LEN], c: &mut Counters) {
        if self.tx.len() >= GSI_QUEUE {
            c.drop_gsi_overflow += 1;
            return;
        }
        self.tx.push_back((dst, *mad));
    }

    /// Whether MADs wait to be sent.
    pub(crate) fn has_transmit(&self) -> bool {
        !self.tx.is_empty()
    }

    pub(crate) fn take(&mut self) -> Option<GsiMad> {
        self.rx.pop_front()
    }

    /// Takes a verified packet to QP1. Returns whether it was a GMP, which QP1 accepts (and
    /// queues, or drops as `drop_gsi_overflow` when its receive queue is full); anything else
    /// is refused as `drop_not_gmp`.
    pub(crate) fn receive(
        &mut self,
        from: IpAddr,
        packet: &uroce_wire::PacketRepr<'_>,
        c: &mut Counters,
    ) -> bool {
        let Ok(payload) = mad::gmp_payload(packet) else {
            c.drop_not_gmp += 1;
            return false;
        };
        if self.rx.len() >= GSI_QUEUE {
            c.drop_gsi_overflow += 1;
            return true;
        }
        let mut m = [0u8; MAD_LEN];
        m.copy_from_slice(payload);
        self.rx.push_back(GsiMad { from, mad: m });
        c.gsi_rcvd += 1;
        true
    }

    /// Builds the next queued MAD into `buf` as a packet from `local`.
    pub(crate) fn poll_transmit(
        &mut self,
        local: IpAddr,
        defer_icrc: bool,
        buf: &mut Vec<u8>,
        c: &mut Counters,
    ) -> Option<Transmit> {
        loop {
            let (dst, m) = self.tx.pop_front()?;
            let pseudo = match self.pseudo {
                Some((d, p)) if d == dst => p,
                _ => {
                    let Ok(p) = PseudoHeader::for_endpoints(
                        SocketAddr::new(local, self.src_port),
                        SocketAddr::new(dst, ROCE_V2_PORT),
                    ) else {
                        c.drop_bad_dest += 1;
                        continue;
                    };
                    self.pseudo = Some((dst, p));
                    p
                }
            };
            let repr = mad::gmp(&m, self.psn);
            self.psn = self.psn.next();
            let Ok(len) = repr.buffer_len() else { continue };
            buf.clear();
            buf.resize(len, 0);
            let emitted =
                if defer_icrc { repr.emit_without_icrc(buf) } else { repr.emit(&pseudo, buf) };
            if emitted.is_err() {
                continue;
            }
            c.gsi_sent += 1;
            c.sent_pkts += 1;
            c.sent_bytes += len as u64;
            return Some(Transmit {
                dst: SocketAddr::new(dst, ROCE_V2_PORT),
                src_port: self.src_port,
                payload_at: None,
                icrc_deferred: defer_icrc,
                alone: false,
            });
        }
    }
}
