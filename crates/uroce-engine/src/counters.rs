//! Counters, named after the Linux rxe ones (`RXE_CNT_*`) and the hardware port counters, so
//! that people who know those can map them. Every dropped packet increments exactly one `drop_*`
//! counter or `icrc_errors`.

/// A device's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets handed to the network.
    pub sent_pkts: u64,
    /// Bytes of RoCE packets (BTH through ICRC) handed to the network.
    pub sent_bytes: u64,
    /// Packets received and accepted for processing.
    pub rcvd_pkts: u64,
    /// Bytes of RoCE packets received and accepted.
    pub rcvd_bytes: u64,
    /// Requests that arrived ahead of the expected PSN (each gap NAKed once) (`RCV_SEQ_ERR`).
    pub rcv_seq_err: u64,
    /// Duplicate requests: PSN behind the expected one (`DUP_REQ`).
    pub dup_req: u64,
    /// Packets sent again by go-back-N (`RETRY`-style).
    pub retransmitted_pkts: u64,
    /// ACK timeouts with packets outstanding: each starts a retry, or ends the WQE with
    /// `RETRY_EXC_ERR` once the retries are used up.
    pub ack_timeouts: u64,
    /// Tail-loss probes: the last packet sent again when no acknowledgement came for a few
    /// round trips (well before the ACK timeout).
    pub tail_probes: u64,
    /// Sequence NAKs received (`SEQ_NAK`).
    pub seq_naks_rcvd: u64,
    /// Implied NAKs: a READ or atomic response overtaken by a later ACK.
    pub implied_naks: u64,
    /// RNR NAKs sent (`SND_RNR`).
    pub rnr_naks_sent: u64,
    /// RNR NAKs received (`RCV_RNR`).
    pub rnr_naks_rcvd: u64,
    /// WQEs ended with `RETRY_EXC_ERR` (`RETRY_EXCEEDED`).
    pub retry_exceeded: u64,
    /// WQEs ended with `RNR_RETRY_EXC_ERR` (`RNR_RETRY_EXCEEDED`).
    pub rnr_retry_exceeded: u64,
    /// NAKs sent for invalid requests, access errors and operational errors.
    pub err_naks_sent: u64,
    /// Accesses that found registered memory gone (unmapped or protected by the application
    /// after registration): each failed its operation with an access error.
    pub memory_faults: u64,
    /// Completions lost because their CQ was full.
    pub cq_overflows: u64,
    /// Packets whose ICRC did not match (`ICRC_ERROR`-style).
    pub icrc_errors: u64,
    /// Dropped: the ICRC is right only for an IPv4 identification the device's policy refuses
    /// ([`crate::DeviceConfig::ipv4_id_policy`]): corruption, or a peer that numbers its
    /// datagrams otherwise (Linux rxe, an RNIC).
    pub drop_unexpected_ip_id: u64,
    /// Dropped: the packet could not be parsed (truncated, bad TVer, pad, unknown opcode…).
    pub drop_malformed: u64,
    /// Dropped: no QP with the destination QPN.
    pub drop_unknown_qp: u64,
    /// Dropped: the destination address is neither the device's nor a multicast group a QP is
    /// attached to, or it disagrees with the QPN (multicast packets, and only they, go to QPN
    /// 0xFFFFFF: IBA 10.5.2).
    pub drop_bad_dest: u64,
    /// Dropped: a UD datagram whose Q_Key is not the QP's (IBA 10.2.5).
    pub drop_bad_qkey: u64,
    /// Dropped: the opcode's transport is not the QP's.
    pub drop_wrong_transport: u64,
    /// Dropped: the P_Key does not match.
    pub drop_bad_pkey: u64,
    /// Dropped: the QP is not in a state that accepts the packet.
    pub drop_bad_state: u64,
    /// Dropped: the sender is not the QP's peer.
    pub drop_wrong_peer: u64,
    /// Dropped: further packets after a sequence NAK, until the expected PSN arrives.
    pub drop_out_of_sequence: u64,
    /// Dropped: no receive WQE (answered by an RNR NAK on RC; UC and UD drop silently).
    pub drop_rnr: u64,
    /// Dropped: a response (ACK, READ response, atomic ACK) that matches nothing outstanding.
    pub drop_stale_response: u64,
    /// Dropped: a duplicate READ or atomic whose saved responder resource is gone, or that
    /// came while the responder's queue of READ and atomic answers is at its bound (4,096).
    pub drop_dup_no_resource: u64,
    /// MADs received on QP1 (handed to the CM with [`crate::Device::poll_gsi`]).
    pub gsi_rcvd: u64,
    /// MADs sent from QP1.
    pub gsi_sent: u64,
    /// Dropped: a packet to QP1 that is not a GMP (IBA 13.5.1: a UD SEND from QP1 with Q_Key
    /// 0x80010000 and one 256-byte MAD).
    pub drop_not_gmp: u64,
    /// Dropped: QP1's receive or send queue was full (nobody takes the MADs).
    pub drop_gsi_overflow: u64,
    /// Dropped: a UC request the responder's checks refused (opcode sequence, length, R_Key);
    /// UC answers nothing, so the rest of its message goes too.
    pub drop_uc_invalid: u64,
    /// Memory window binds that failed their checks (`IBV_WC_MW_BIND_ERR`).
    pub mw_bind_errors: u64,
    /// Invalidations refused, local (`IBV_WR_LOCAL_INV`) or a peer's (SEND with invalidate).
    pub invalidate_errors: u64,
}

/// One queue pair's counters: what `rdma statistic qp` shows per QP on Linux, for finding which
/// QP of many retransmits or drops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpCounters {
    /// Packets this QP put on the wire (requests and responses).
    pub sent_pkts: u64,
    /// Their bytes (BTH through ICRC).
    pub sent_bytes: u64,
    /// Packets accepted for this QP.
    pub rcvd_pkts: u64,
    /// Their bytes.
    pub rcvd_bytes: u64,
    /// Packets sent again by go-back-N.
    pub retransmitted_pkts: u64,
    /// ACK timeouts with packets outstanding.
    pub ack_timeouts: u64,
    /// Tail-loss probes: the last packet sent again when no acknowledgement came for a few
    /// round trips (well before the ACK timeout).
    pub tail_probes: u64,
    /// Sequence NAKs received.
    pub seq_naks_rcvd: u64,
    /// RNR NAKs received.
    pub rnr_naks_rcvd: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// Requests that arrived ahead of the expected PSN.
    pub rcv_seq_err: u64,
    /// Duplicate requests.
    pub dup_req: u64,
}

impl Counters {
    /// How many counters there are: every field is one `u64`, so a field added without its
    /// line in [`Counters::fields`] fails to compile there.
    pub const COUNT: usize = size_of::<Self>() / 8;

    /// Every counter with its name, in declaration order (for tools that print or sum them).
    pub fn fields(&self) -> [(&'static str, u64); Self::COUNT] {
        [
            ("sent_pkts", self.sent_pkts),
            ("sent_bytes", self.sent_bytes),
            ("rcvd_pkts", self.rcvd_pkts),
            ("rcvd_bytes", self.rcvd_bytes),
            ("rcv_seq_err", self.rcv_seq_err),
            ("dup_req", self.dup_req),
            ("retransmitted_pkts", self.retransmitted_pkts),
            ("ack_timeouts", self.ack_timeouts),
            ("tail_probes", self.tail_probes),
            ("seq_naks_rcvd", self.seq_naks_rcvd),
            ("implied_naks", self.implied_naks),
            ("rnr_naks_sent", self.rnr_naks_sent),
            ("rnr_naks_rcvd", self.rnr_naks_rcvd),
            ("retry_exceeded", self.retry_exceeded),
            ("rnr_retry_exceeded", self.rnr_retry_exceeded),
            ("err_naks_sent", self.err_naks_sent),
            ("memory_faults", self.memory_faults),
            ("cq_overflows", self.cq_overflows),
            ("icrc_errors", self.icrc_errors),
            ("drop_unexpected_ip_id", self.drop_unexpected_ip_id),
            ("drop_malformed", self.drop_malformed),
            ("drop_unknown_qp", self.drop_unknown_qp),
            ("drop_bad_dest", self.drop_bad_dest),
            ("drop_bad_qkey", self.drop_bad_qkey),
            ("drop_wrong_transport", self.drop_wrong_transport),
            ("drop_bad_pkey", self.drop_bad_pkey),
            ("drop_bad_state", self.drop_bad_state),
            ("drop_wrong_peer", self.drop_wrong_peer),
            ("drop_out_of_sequence", self.drop_out_of_sequence),
            ("drop_rnr", self.drop_rnr),
            ("drop_stale_response", self.drop_stale_response),
            ("drop_dup_no_resource", self.drop_dup_no_resource),
            ("gsi_rcvd", self.gsi_rcvd),
            ("gsi_sent", self.gsi_sent),
            ("drop_not_gmp", self.drop_not_gmp),
            ("drop_gsi_overflow", self.drop_gsi_overflow),
            ("drop_uc_invalid", self.drop_uc_invalid),
            ("mw_bind_errors", self.mw_bind_errors),
            ("invalidate_errors", self.invalidate_errors),
        ]
    }

    /// The rules that drop a packet after the device accepted it for processing (it counted
    /// in `rcvd_pkts`): the transport's own (sequence, receive queue, UC message state, stale
    /// responses, saved responder resources, QP1's receive queue). Every other `drop_*`
    /// counter and `icrc_errors` refuses a packet before it is accepted.
    pub const DROPPED_AFTER_ACCEPTANCE: [&'static str; 6] = [
        "drop_out_of_sequence",
        "drop_rnr",
        "drop_gsi_overflow",
        "drop_uc_invalid",
        "drop_stale_response",
        "drop_dup_no_resource",
    ];

    /// What became of the one packet received between `before` and `after`, judged by this
    /// module's promise: accepted, or refused under exactly one named rule. `Err` lists the
    /// counters that moved when the promise was broken.
    pub fn packet_fate(before: &Self, after: &Self) -> Result<PacketFate, String> {
        let moved: Vec<(&'static str, u64)> = after
            .fields()
            .iter()
            .zip(before.fields())
            .filter(|(a, b)| a.1 != b.1)
            .map(|(a, b)| (a.0, a.1.wrapping_sub(b.1)))
            .collect();
        let accepted = moved.iter().find(|(n, _)| *n == "rcvd_pkts").map_or(0, |&(_, d)| d);
        let mut drops = moved.iter().filter(|(n, _)| n.starts_with("drop_") || *n == "icrc_errors");
        let after_acceptance = |rule: &str| Self::DROPPED_AFTER_ACCEPTANCE.contains(&rule);
        match (accepted, drops.next(), drops.next()) {
            (1, None, _) => Ok(PacketFate::Accepted),
            (1, Some(&(rule, 1)), None) if after_acceptance(rule) => {
                Ok(PacketFate::DroppedAfterAcceptance(rule))
            }
            (0, Some(&(rule, 1)), None) if !after_acceptance(rule) => Ok(PacketFate::Refused(rule)),
            _ => Err(format!("counters moved: {moved:?}")),
        }
    }
}

/// What became of one received packet ([`Counters::packet_fate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketFate {
    /// Accepted and processed.
    Accepted,
    /// Accepted, then dropped under this transport rule.
    DroppedAfterAcceptance(&'static str),
    /// Refused under this rule before it was accepted.
    Refused(&'static str),
}

impl QpCounters {
    /// How many counters there are: every field is one `u64`, so a field added without its
    /// line in [`QpCounters::fields`] fails to compile there.
    pub const COUNT: usize = size_of::<Self>() / 8;

    /// Every counter with its name, in declaration order (for tools that print or sum them).
    pub fn fields(&self) -> [(&'static str, u64); Self::COUNT] {
        [
            ("sent_pkts", self.sent_pkts),
            ("sent_bytes", self.sent_bytes),
            ("rcvd_pkts", self.rcvd_pkts),
            ("rcvd_bytes", self.rcvd_bytes),
            ("retransmitted_pkts", self.retransmitted_pkts),
            ("ack_timeouts", self.ack_timeouts),
            ("tail_probes", self.tail_probes),
            ("seq_naks_rcvd", self.seq_naks_rcvd),
            ("rnr_naks_rcvd", self.rnr_naks_rcvd),
            ("rnr_naks_sent", self.rnr_naks_sent),
            ("rcv_seq_err", self.rcv_seq_err),
            ("dup_req", self.dup_req),
        ]
    }
}
