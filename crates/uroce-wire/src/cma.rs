//! The RDMA CM's conventions on top of the IB CM (IBA Annex A11, "RDMA IP CM Service"; Linux
//! `drivers/infiniband/core/cma.c`): IP port spaces mapped to service IDs, and the 36-byte
//! header at the start of a REQ's (and SIDR_REQ's) private data that carries the IP
//! addresses and port of the connection.
//!
//! ```text
//! byte 0      CMA version (0)
//! byte 1      IP version in the top four bits (4 or 6)
//! bytes 2-3   source port (the active side's)
//! bytes 4-19  source address (IPv4: 12 zero bytes, then the address)
//! bytes 20-35 destination address
//! ```

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::{Error, Result, be16};

/// Length of the header.
pub const HEADER_LEN: usize = 36;
/// The header's version (`CMA_VERSION`).
pub const VERSION: u8 = 0;

/// RDMA CM port spaces (`enum rdma_port_space` in `rdma_cma.h`): the top of a service ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortSpace {
    /// `RDMA_PS_IPOIB`.
    Ipoib,
    /// `RDMA_PS_IB`: any QP type.
    Ib,
    /// `RDMA_PS_TCP`: RC, like a TCP connection.
    Tcp,
    /// `RDMA_PS_UDP`: UD, resolved with SIDR.
    Udp,
}

impl PortSpace {
    /// The value `rdma_cma.h` gives it.
    pub const fn value(self) -> u16 {
        match self {
            Self::Ipoib => 0x0002,
            Self::Ib => 0x013F,
            Self::Tcp => 0x0106,
            Self::Udp => 0x0111,
        }
    }

    /// The port space of value `v`.
    pub const fn from_value(v: u32) -> Option<Self> {
        match v {
            0x0002 => Some(Self::Ipoib),
            0x013F => Some(Self::Ib),
            0x0106 => Some(Self::Tcp),
            0x0111 => Some(Self::Udp),
            _ => None,
        }
    }

    /// The IB service ID of `port` in this space (`rdma_get_service_id`: port space in bits
    /// 16–31, port in 0–15).
    pub const fn service_id(self, port: u16) -> u64 {
        ((self.value() as u64) << 16) | port as u64
    }

    /// The port space and port a service ID names, if it is an RDMA CM one (the top 32 bits
    /// zero and a known space).
    pub const fn of_service_id(sid: u64) -> Option<(Self, u16)> {
        if sid >> 32 != 0 {
            return None;
        }
        match Self::from_value(((sid >> 16) & 0xFFFF) as u32) {
            Some(ps) => Some((ps, (sid & 0xFFFF) as u16)),
            None => None,
        }
    }
}

/// The RDMA CM header of a connection request, as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The active side's address.
    pub src: IpAddr,
    /// The address it connects to.
    pub dst: IpAddr,
    /// The active side's port.
    pub src_port: u16,
}

impl Header {
    /// Reads the header from the start of private data.
    pub fn parse(private: &[u8]) -> Result<Self> {
        let b = private.get(..HEADER_LEN).ok_or(Error::Truncated)?;
        if b[0] != VERSION {
            return Err(Error::BadCmaHeader);
        }
        let addr = |a: &[u8]| -> Option<IpAddr> {
            let mut o = [0u8; 16];
            o.copy_from_slice(a);
            match b[1] >> 4 {
                4 => Some(IpAddr::V4(Ipv4Addr::new(o[12], o[13], o[14], o[15]))),
                6 => Some(IpAddr::V6(Ipv6Addr::from(o))),
                _ => None,
            }
        };
        let (Some(src), Some(dst)) = (addr(&b[4..20]), addr(&b[20..36])) else {
            return Err(Error::BadCmaHeader);
        };
        Ok(Self { src, dst, src_port: be16(&b[2..4]) })
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `out`. The two addresses
    /// must be of one family.
    pub fn emit(&self, out: &mut [u8]) -> Result<()> {
        let b = out.get_mut(..HEADER_LEN).ok_or(Error::BufferTooSmall)?;
        b.fill(0);
        b[0] = VERSION;
        b[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                b[1] = 4 << 4;
                b[16..20].copy_from_slice(&s.octets());
                b[32..36].copy_from_slice(&d.octets());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                b[1] = 6 << 4;
                b[4..20].copy_from_slice(&s.octets());
                b[20..36].copy_from_slice(&d.octets());
            }
            _ => return Err(Error::FieldOutOfRange),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn service_ids_are_rdma_cm_ones() {
        assert_eq!(PortSpace::Tcp.service_id(20079), 0x0000_0000_0106_4E6F);
        assert_eq!(PortSpace::of_service_id(0x0111_0007), Some((PortSpace::Udp, 7)));
        assert_eq!(PortSpace::of_service_id(0x1_0106_0007), None);
        assert_eq!(PortSpace::of_service_id(0x0999_0007), None);
    }

    #[test]
    fn header_roundtrip_v4_and_v6() {
        let h = Header {
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            src_port: 0xBEEF,
        };
        let mut b = [0xFFu8; 40];
        h.emit(&mut b).unwrap();
        assert_eq!(&b[..4], &[0, 0x40, 0xBE, 0xEF]);
        assert_eq!(&b[4..20], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 1]);
        assert_eq!(Header::parse(&b).unwrap(), h);
        let h6 =
            Header { src: "fe80::1".parse().unwrap(), dst: "::1".parse().unwrap(), src_port: 1 };
        h6.emit(&mut b).unwrap();
        assert_eq!(Header::parse(&b).unwrap(), h6);
        b[1] = 0x50;
        assert_eq!(Header::parse(&b), Err(Error::BadCmaHeader));
        assert_eq!(Header::parse(&b[..35]), Err(Error::Truncated));
    }
}
