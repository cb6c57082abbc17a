//! uroce's steering probe: a 16-byte UDP payload to port 4791 that a uroce endpoint sends to
//! its own device address to find its socket's place in the port's `SO_REUSEPORT` group (see
//! `uroce-net`'s `fabric::steer`). It is not a RoCE packet, and never leaves the host; it
//! shows up in a capture on the interface that holds the address (`lo`), which is why a
//! decoder should know it.
//!
//! Layout: opcode byte [`OPCODE`] (0xFF, in the BTH's manufacturer-specific range, IBA 9.2,
//! Table 35: 0xC0–0xFF), three zero bytes, the probed index (32 bits, big-endian: where the
//! kernel's classic BPF program loads it), the prober's nonce (64 bits, big-endian).

/// The probe's first byte, where a BTH has its opcode.
pub const OPCODE: u8 = 0xFF;
/// A probe's length.
pub const LEN: usize = 16;

/// A steering probe's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// The socket index in the group the probe asks to be delivered to.
    pub index: u32,
    /// The round it belongs to (the prober recognises its own).
    pub nonce: u64,
}

impl Probe {
    /// The probe in `bytes`, if they are one (exactly [`LEN`] bytes of this layout).
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let p: &[u8; LEN] = bytes.try_into().ok()?;
        if p[0] != OPCODE || p[1..4] != [0; 3] {
            return None;
        }
        let index = u32::from_be_bytes([p[4], p[5], p[6], p[7]]);
        let nonce = u64::from_be_bytes([p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15]]);
        Some(Self { index, nonce })
    }

    /// The probe's bytes.
    pub fn emit(&self) -> [u8; LEN] {
        let mut p = [0u8; LEN];
        p[0] = OPCODE;
        p[4..8].copy_from_slice(&self.index.to_be_bytes());
        p[8..].copy_from_slice(&self.nonce.to_be_bytes());
        p
    }
}

impl core::fmt::Display for Probe {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "uroce steering probe (not RoCE) index={} nonce={:#018x}", self.index, self.nonce)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_is_told_apart_from_any_packet() {
        let p = Probe { index: 3, nonce: 0x0102_0304_0506_0708 };
        let bytes = p.emit();
        assert_eq!(Probe::parse(&bytes), Some(p));
        assert_eq!(Probe::parse(&bytes[..15]), None);
        let mut other = bytes;
        other[1] = 1;
        assert_eq!(Probe::parse(&other), None);
        // An RC SEND's BTH and four bytes: not a probe.
        let mut send = [0u8; 16];
        send[0] = 0x04;
        assert_eq!(Probe::parse(&send), None);
    }
}
