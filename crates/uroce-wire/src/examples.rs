//! Representative packets of every opcode, for tests, benchmarks and sample captures.

use crate::aeth::{self, CreditCode, Syndrome};
use crate::opcode::{ExtHeader, OpFlags, Opcode};
use crate::packet::{ExtHeaders, PacketRepr};
use crate::types::{Msn, Psn, QKey, Qpn, RKey};
use crate::{atomic_ack_eth, atomic_eth, bth, deth, ieth, immdt, reth};

/// Extension headers with plausible values for every header `opcode` requires; `None` for an
/// opcode the table does not know.
pub fn ext_headers_for(opcode: Opcode) -> Option<ExtHeaders> {
    let info = opcode.info()?;
    let mut ext = ExtHeaders::default();
    for &h in info.headers {
        match h {
            ExtHeader::Reth => {
                ext.reth = Some(reth::Repr { va: 0x7f00_dead_b000, rkey: RKey(0x1234_5678), dma_len: 8192 });
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
                    compare: if opcode == Opcode::RC_COMPARE_SWAP { 0x55 } else { 0 },
                });
            }
            ExtHeader::AtomicAckEth => ext.atomic_ack_eth = Some(atomic_ack_eth::Repr { orig: 41 }),
            ExtHeader::ImmDt => ext.immdt = Some(immdt::Repr { imm: [0xca, 0xfe, 0xf0, 0x0d] }),
            ExtHeader::Ieth => ext.ieth = Some(ieth::Repr { rkey: RKey(0x1234_5678) }),
            ExtHeader::Deth => {
                ext.deth = Some(deth::Repr { qkey: QKey(0x1111_1111), src_qp: Qpn::from_masked(0x12) });
            }
            ExtHeader::CnpReserved => {}
        }
    }
    Some(ext)
}

/// A packet of `opcode` to `dest_qp` at `psn`, with `payload` if the opcode carries one (and
/// none otherwise), AckReq set where the requester would set it; `None` for an unknown opcode.
pub fn packet_for(opcode: Opcode, dest_qp: Qpn, psn: Psn, payload: &[u8]) -> Option<PacketRepr<'_>> {
    let info = opcode.info()?;
    let mut bth = bth::Repr::new(opcode, dest_qp, psn);
    bth.ack_req = info.has(OpFlags::NEEDS_ACK);
    if info.transport == crate::Transport::Cnp {
        bth.becn = true;
    }
    let payload = if info.has(OpFlags::PAYLOAD) { payload } else { &[] };
    Some(PacketRepr::new(bth, ext_headers_for(opcode)?, payload))
}
