//! Scatter/gather lists: where bytes `offset..offset + len` of a message laid over a list of
//! elements lie. One walker serves the requester's gather (payload pieces of a packet), and the
//! completer's and responder's scatter (READ responses, received SENDs).

use crate::ctx::Ctx;
use crate::memory::MemoryAccess;
use crate::types::{PdHandle, Sge};

/// Places `data` at byte `offset` of the message described by `sges` (checking each element's
/// key for local write by a QP of `pd`). Fails without writing anything if the data does not
/// fit or a key is bad.
pub(crate) fn scatter<M: MemoryAccess>(
    ctx: &mut Ctx<M>,
    pd: PdHandle,
    sges: &[Sge],
    offset: u64,
    data: &[u8],
) -> Result<(), ScatterError> {
    // First pass checks every piece, so that a failure writes nothing; the second writes.
    let mut placed = 0;
    for (sge, addr, _, len) in pieces(sges, offset, data.len()) {
        ctx.mrs
            .check_local(sge.lkey, pd, addr, len as u64, true)
            .map_err(|_| ScatterError::Protection)?;
        placed += len;
    }
    if placed < data.len() {
        return Err(ScatterError::Length);
    }
    for (sge, addr, at, len) in pieces(sges, offset, data.len()) {
        // Checked above: where the bytes are.
        let host = ctx
            .mrs
            .check_local(sge.lkey, pd, addr, len as u64, true)
            .map_err(|_| ScatterError::Protection)?;
        // A page the application unmapped after registering it: the receive fails as for a
        // key without local write (what lands before the fault stays; a NIC leaves it too).
        if ctx.mem.write(host, &data[at..at + len]).is_err() {
            ctx.counters.memory_faults += 1;
            return Err(ScatterError::Protection);
        }
    }
    Ok(())
}

/// The pieces of bytes `offset..offset + len` of a message laid over `sges`: for each, the
/// element, the address, the offset in the data and the length.
pub(crate) fn pieces(
    sges: &[Sge],
    offset: u64,
    len: usize,
) -> impl Iterator<Item = (Sge, u64, usize, usize)> + '_ {
    let mut skip = offset;
    let mut done = 0usize;
    sges.iter().filter_map(move |s| {
        let sl = u64::from(s.length);
        if done == len {
            return None;
        }
        if skip >= sl {
            skip -= sl;
            return None;
        }
        let take = usize::try_from((sl - skip).min((len - done) as u64)).unwrap_or(0);
        let piece = (*s, s.addr + skip, done, take);
        done += take;
        skip = 0;
        Some(piece)
    })
}

/// Why data could not be placed in local buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScatterError {
    /// The buffers are too small (`LOC_LEN_ERR`).
    Length,
    /// A key is invalid, of another PD, out of range or without local write (`LOC_PROT_ERR`).
    Protection,
}
