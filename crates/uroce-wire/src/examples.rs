//! Representative packets of every opcode, for tests, benchmarks and sample captures.

use crate::aeth::{self, CreditCode, RnrTimer, Syndrome};
use crate::opcode::{ExtHeader, OpFlags, Opcode};
use crate::packet::{ExtHeaders, PacketRepr};
use crate::types::{Msn, Psn, QKey, Qpn, RKey};
use crate::{atomic_ack_eth, atomic_eth, bth, deth, ieth, immdt, reth, xrceth};

/// Extension headers with plausible values for every header `opcode` requires; `None` for an
/// opcode the table does not know.
pub fn ext_headers_for(opcode: Opcode) -> Option<ExtHeaders> {
    let info = opcode.info()?;
    let mut ext = ExtHeaders::default();
    for &h in info.headers {
        match h {
            ExtHeader::Reth => {
                ext.reth = Some(reth::Repr {
                    va: 0x7f00_dead_b000,
                    rkey: RKey(0x1234_5678),
                    dma_len: 8192,
                });
            }
            ExtHeader::Aeth => {
                let syndrome = Syndrome::Ack(CreditCode::UNLIMITED);
                ext.aeth = Some(aeth::Repr { syndrome, msn: Msn::from_masked(42) });
            }
            ExtHeader::AtomicEth => {
                ext.atomic_eth = Some(atomic_eth::Repr {
                    va: 0x7f00_dead_c008,
                    rkey: RKey(0x1234_5678),
                    swap_add: 1,
                    compare: if opcode.0 & 0x1F == crate::opcode::op::COMPARE_SWAP {
                        0x55
                    } else {
                        0
                    },
                });
            }
            ExtHeader::AtomicAckEth => ext.atomic_ack_eth = Some(atomic_ack_eth::Repr { orig: 41 }),
            ExtHeader::ImmDt => ext.immdt = Some(immdt::Repr { imm: [0xca, 0xfe, 0xf0, 0x0d] }),
            ExtHeader::Ieth => ext.ieth = Some(ieth::Repr { rkey: RKey(0x1234_5678) }),
            ExtHeader::Deth => {
                ext.deth =
                    Some(deth::Repr { qkey: QKey(0x1111_1111), src_qp: Qpn::from_masked(0x12) });
            }
            ExtHeader::Xrceth => ext.xrceth = Some(xrceth::Repr { srqn: 0x00_0042 }),
            ExtHeader::CnpReserved => {}
        }
    }
    Some(ext)
}

/// A packet of `opcode` to `dest_qp` at `psn`, with `payload` if the opcode carries one (and
/// none otherwise), AckReq set where the requester would set it; `None` for an unknown opcode.
pub fn packet_for(
    opcode: Opcode,
    dest_qp: Qpn,
    psn: Psn,
    payload: &[u8],
) -> Option<PacketRepr<'_>> {
    let info = opcode.info()?;
    let mut bth = bth::Repr::new(opcode, dest_qp, psn);
    bth.ack_req = info.has(OpFlags::NEEDS_ACK);
    if info.transport == crate::Transport::Cnp {
        bth.becn = true;
    }
    let payload = if info.has(OpFlags::PAYLOAD) { payload } else { &[] };
    Some(PacketRepr::new(bth, ext_headers_for(opcode)?, payload))
}

/// One packet of a sample conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamplePacket {
    /// Capture time since the Unix epoch.
    pub ts: core::time::Duration,
    /// Sender.
    pub src: core::net::SocketAddr,
    /// Receiver.
    pub dst: core::net::SocketAddr,
    /// The RoCEv2 packet, BTH through ICRC.
    pub bytes: Vec<u8>,
    /// What the packet shows, for readers of the capture.
    pub note: &'static str,
}

/// A short, coherent RoCEv2 conversation between two devices (127.0.0.2 and 127.0.0.3, path
/// MTU 1024) that shows each mechanism once: an RC SEND and its ACK, a three-packet RDMA
/// WRITE, a two-packet RDMA READ, a fetch-and-add, an RNR NAK and the retried SEND, a lost
/// packet answered by a PSN sequence NAK and go-back-N, UC and UD traffic (UD over IPv6), and a
/// CNP. The repository's `samples/` capture is this, written by `examples/write_sample.rs`.
pub fn sample_conversation() -> Vec<SamplePacket> {
    use core::net::SocketAddr;
    use core::time::Duration;

    let a: SocketAddr = SocketAddr::from(([127, 0, 0, 2], 49_153));
    let b: SocketAddr = SocketAddr::from(([127, 0, 0, 3], 4791));
    let b_src: SocketAddr = SocketAddr::from(([127, 0, 0, 3], 49_154));
    let a_dst: SocketAddr = SocketAddr::from(([127, 0, 0, 2], 4791));
    let a6: SocketAddr = "[fd00::2]:49155".parse().unwrap_or(a);
    let b6: SocketAddr = "[fd00::3]:4791".parse().unwrap_or(b);
    let (qp_a, qp_b) = (Qpn::from_masked(0x11), Qpn::from_masked(0x12));
    let rkey = RKey(0x0042_1a07);
    let data: Vec<u8> =
        b"uroce: RDMA that runs anywhere. ".iter().copied().cycle().take(2500).collect();

    let mut out = Vec::new();
    let t = core::cell::Cell::new(Duration::new(1_767_225_600, 0)); // 2026-01-01T00:00:00Z
    let mut push = |src: SocketAddr, dst: SocketAddr, repr: PacketRepr<'_>, note: &'static str| {
        let Ok(pseudo) = crate::icrc::PseudoHeader::for_endpoints(src, dst) else {
            return;
        };
        let Ok(len) = repr.buffer_len() else { return };
        let mut bytes = vec![0u8; len];
        if repr.emit(&pseudo, &mut bytes).is_ok() {
            out.push(SamplePacket { ts: t.get(), src, dst, bytes, note });
        }
        t.set(t.get() + Duration::from_micros(9));
    };
    let req = |op: Opcode, psn: u32, ack_req: bool| {
        let mut b = bth::Repr::new(op, qp_b, Psn::from_masked(psn));
        b.ack_req = ack_req;
        b
    };
    let resp = |op: Opcode, psn: u32| bth::Repr::new(op, qp_a, Psn::from_masked(psn));
    let ack = |syndrome: Syndrome, msn: u32| ExtHeaders {
        aeth: Some(aeth::Repr { syndrome, msn: Msn::from_masked(msn) }),
        ..ExtHeaders::default()
    };
    let acked = Syndrome::Ack(CreditCode::from_masked(12));
    let reth = |len: u32| ExtHeaders {
        reth: Some(reth::Repr { va: 0x7f3a_2000_0000, rkey, dma_len: len }),
        ..ExtHeaders::default()
    };
    let none = ExtHeaders::default();

    push(a, b, PacketRepr::new(req(Opcode::RC_SEND_ONLY, 100, true), none, &data[..64]), "RC SEND");
    push(
        b_src,
        a_dst,
        PacketRepr::new(resp(Opcode::RC_ACKNOWLEDGE, 100), ack(acked, 1), &[]),
        "ACK",
    );
    push(
        a,
        b,
        PacketRepr::new(req(Opcode::RC_RDMA_WRITE_FIRST, 101, false), reth(2500), &data[..1024]),
        "WRITE",
    );
    push(
        a,
        b,
        PacketRepr::new(req(Opcode::RC_RDMA_WRITE_MIDDLE, 102, false), none, &data[1024..2048]),
        "WRITE",
    );
    push(
        a,
        b,
        PacketRepr::new(req(Opcode::RC_RDMA_WRITE_LAST, 103, true), none, &data[2048..]),
        "WRITE",
    );
    push(
        b_src,
        a_dst,
        PacketRepr::new(resp(Opcode::RC_ACKNOWLEDGE, 103), ack(acked, 2), &[]),
        "ACK",
    );
    // A READ of 1500 bytes reserves two PSNs, one per response packet.
    push(
        a,
        b,
        PacketRepr::new(req(Opcode::RC_RDMA_READ_REQUEST, 104, true), reth(1500), &[]),
        "READ",
    );
    push(
        b_src,
        a_dst,
        PacketRepr::new(
            resp(Opcode::RC_RDMA_READ_RESPONSE_FIRST, 104),
            ack(acked, 3),
            &data[..1024],
        ),
        "READ response",
    );
    push(
        b_src,
        a_dst,
        PacketRepr::new(
            resp(Opcode::RC_RDMA_READ_RESPONSE_LAST, 105),
            ack(acked, 3),
            &data[1024..1500],
        ),
        "READ response",
    );
    let fadd = ExtHeaders {
        atomic_eth: Some(atomic_eth::Repr { va: 0x7f3a_2000_1000, rkey, swap_add: 1, compare: 0 }),
        ..ExtHeaders::default()
    };
    push(a, b, PacketRepr::new(req(Opcode::RC_FETCH_ADD, 106, true), fadd, &[]), "FETCH_ADD");
    let mut aack = ack(acked, 4);
    aack.atomic_ack_eth = Some(atomic_ack_eth::Repr { orig: 41 });
    push(
        b_src,
        a_dst,
        PacketRepr::new(resp(Opcode::RC_ATOMIC_ACKNOWLEDGE, 106), aack, &[]),
        "atomic ACK",
    );
    let imm =
        ExtHeaders { immdt: Some(immdt::Repr { imm: [0, 0, 0, 7] }), ..ExtHeaders::default() };
    push(
        a,
        b,
        PacketRepr::new(req(Opcode::RC_SEND_ONLY_WITH_IMMEDIATE, 107, true), imm, &data[..32]),
        "SEND, no receive posted",
    );
    push(
        b_src,
        a_dst,
        PacketRepr::new(
            resp(Opcode::RC_ACKNOWLEDGE, 107),
            ack(Syndrome::RnrNak(RnrTimer::from_masked(14)), 4),
            &[],
        ),
        "RNR NAK: retry in 1.28 ms",
    );
    t.set(t.get() + Duration::from_micros(1280));
    push(
        a,
        b,
        PacketRepr::new(req(Opcode::RC_SEND_ONLY_WITH_IMMEDIATE, 107, true), imm, &data[..32]),
        "SEND retried",
    );
    push(
        b_src,
        a_dst,
        PacketRepr::new(resp(Opcode::RC_ACKNOWLEDGE, 107), ack(acked, 5), &[]),
        "ACK",
    );
    // PSN 108 is lost on the way; 109 arrives out of sequence.
    push(
        a,
        b,
        PacketRepr::new(req(Opcode::RC_RDMA_WRITE_ONLY, 109, true), reth(16), &data[..16]),
        "WRITE after a lost packet",
    );
    push(
        b_src,
        a_dst,
        PacketRepr::new(
            resp(Opcode::RC_ACKNOWLEDGE, 108),
            ack(Syndrome::Nak(aeth::NakCode::PSN_SEQUENCE_ERROR), 5),
            &[],
        ),
        "NAK: expected PSN 108",
    );
    push(
        a,
        b,
        PacketRepr::new(req(Opcode::RC_SEND_ONLY, 108, true), none, &data[32..96]),
        "go-back-N from 108",
    );
    push(
        a,
        b,
        PacketRepr::new(req(Opcode::RC_RDMA_WRITE_ONLY, 109, true), reth(16), &data[..16]),
        "go-back-N",
    );
    push(
        b_src,
        a_dst,
        PacketRepr::new(resp(Opcode::RC_ACKNOWLEDGE, 109), ack(acked, 7), &[]),
        "ACK",
    );
    let uc = bth::Repr::new(Opcode::UC_SEND_ONLY, Qpn::from_masked(0x21), Psn::from_masked(7));
    push(a, b, PacketRepr::new(uc, none, &data[..100]), "UC SEND");
    let mut ud = bth::Repr::new(
        Opcode::UD_SEND_ONLY_WITH_IMMEDIATE,
        Qpn::from_masked(0x31),
        Psn::from_masked(1),
    );
    ud.solicited = true;
    let deth = ExtHeaders {
        deth: Some(deth::Repr { qkey: QKey(0x1111_1111), src_qp: Qpn::from_masked(0x32) }),
        immdt: Some(immdt::Repr { imm: [0xca, 0xfe, 0xf0, 0x0d] }),
        ..ExtHeaders::default()
    };
    push(a6, b6, PacketRepr::new(ud, deth, &data[..200]), "UD SEND over IPv6");
    let mut cnp = bth::Repr::new(Opcode::CNP, qp_a, Psn::ZERO);
    cnp.becn = true;
    push(b_src, a_dst, PacketRepr::new(cnp, none, &[]), "CNP");
    out
}

/// Writes [`sample_conversation`] as a pcap.
pub fn write_sample_pcap<W: std::io::Write>(out: W) -> std::io::Result<W> {
    let mut w = crate::pcap::PcapWriter::new(out)?;
    for p in sample_conversation() {
        w.write_roce(p.ts, p.src, p.dst, &p.bytes)?;
    }
    w.into_inner()
}

/// A CM exchange as an rdma_cm connection makes it (REQ with the RDMA CM header, REP, RTU,
/// DREQ, DREP) and one of every other message (MRA, REJ, SIDR_REQ, SIDR_REP): what the
/// decoders and dissector tests read. Comm IDs 0x0100_0001 (active) and 0x0200_0002
/// (passive), QPNs 0x01_0011 and 0x02_0022, starting PSNs 0xABCDEF and 0x123456.
pub fn sample_cm_messages() -> Vec<[u8; crate::mad::MAD_LEN]> {
    use crate::cm::{
        CmMad, Dreq, Ids, Message, Mra, MsgRef, Path, Rej, Rep, Req, SidrRep, SidrReq,
        TransportType, reason, sidr_status,
    };
    let (active, passive) = (0x0100_0001, 0x0200_0002);
    let mut header = [0u8; crate::cma::HEADER_LEN + 4];
    let cma = crate::cma::Header {
        src: core::net::Ipv4Addr::new(127, 0, 0, 2).into(),
        dst: core::net::Ipv4Addr::new(127, 0, 0, 3).into(),
        src_port: 40000,
    };
    if cma.emit(&mut header).is_err() {
        return Vec::new();
    }
    header[crate::cma::HEADER_LEN..].copy_from_slice(b"ping");
    let mapped = |a: [u8; 4]| {
        let mut g = [0u8; 16];
        g[10] = 0xFF;
        g[11] = 0xFF;
        g[12..].copy_from_slice(&a);
        g
    };
    let req = Req {
        local_comm_id: active,
        vendor_id: 0,
        service_id: crate::cma::PortSpace::Tcp.service_id(7174),
        local_ca_guid: 0x0202_03FF_FE04_0506,
        local_qkey: QKey(0),
        local_qpn: Qpn::from_masked(0x01_0011),
        responder_resources: 4,
        local_eecn: 0,
        initiator_depth: 4,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport: TransportType::Rc,
        end_to_end_flow_control: true,
        starting_psn: Psn::from_masked(0xAB_CDEF),
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: 0xFFFF,
        path_mtu: 5,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        extended_transport: 0,
        primary: Path {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            local_gid: mapped([127, 0, 0, 2]),
            remote_gid: mapped([127, 0, 0, 3]),
            hop_limit: 64,
            local_ack_timeout: 18,
            ..Path::default()
        },
        alternate: Path::default(),
        private_data: &header,
    };
    let rep = Rep {
        local_comm_id: passive,
        remote_comm_id: active,
        local_qkey: QKey(0),
        local_qpn: Qpn::from_masked(0x02_0022),
        local_eecn: 0,
        starting_psn: Psn::from_masked(0x12_3456),
        responder_resources: 4,
        initiator_depth: 4,
        target_ack_delay: 0,
        failover_accepted: 0,
        end_to_end_flow_control: true,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 0x0202_03FF_FE04_0507,
        private_data: b"pong",
    };
    let ari = [0u8; 72];
    let messages = [
        (1, Message::Req(req)),
        (
            1,
            Message::Mra(Mra {
                local_comm_id: passive,
                remote_comm_id: active,
                message: MsgRef::Req,
                service_timeout: 22,
                private_data: &[],
            }),
        ),
        (1, Message::Rep(rep)),
        (
            1,
            Message::Rtu(Ids { local_comm_id: active, remote_comm_id: passive, private_data: &[] }),
        ),
        (
            2,
            Message::Dreq(Dreq {
                local_comm_id: active,
                remote_comm_id: passive,
                remote_qpn: Qpn::from_masked(0x02_0022),
                private_data: &[],
            }),
        ),
        (
            2,
            Message::Drep(Ids {
                local_comm_id: passive,
                remote_comm_id: active,
                private_data: &[],
            }),
        ),
        (
            3,
            Message::Rej(Rej {
                local_comm_id: 0,
                remote_comm_id: active,
                message: MsgRef::Req,
                reject_info_len: 0,
                reason: reason::INVALID_SERVICE_ID,
                ari: &ari,
                private_data: &[],
            }),
        ),
        (
            4,
            Message::SidrReq(SidrReq {
                request_id: active,
                pkey: 0xFFFF,
                service_id: crate::cma::PortSpace::Udp.service_id(7174),
                private_data: &header,
            }),
        ),
        (
            4,
            Message::SidrRep(SidrRep {
                request_id: active,
                status: sidr_status::OK,
                additional_info_len: 0,
                qpn: Qpn::from_masked(0x02_0023),
                service_id: crate::cma::PortSpace::Udp.service_id(7174),
                qkey: QKey(0x0111_0000),
                class_port_info: &ari,
                private_data: &[],
            }),
        ),
    ];
    messages
        .into_iter()
        .filter_map(|(tid, message)| CmMad { tid, message }.to_bytes().ok())
        .collect()
}
