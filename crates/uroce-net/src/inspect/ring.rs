//! The capture ring: one endpoint copies the packets it sends and receives into it while a
//! `uroce capture` reads them out. A file `cap-S-G-K-N` of the host directory that the
//! capturing tool creates; single producer (the endpoint), single consumer (the tool).
//!
//! Layout: a 4 KiB header (magic, session, the capturer's pid, the data size, the producer's
//! count of records it had no room for; the consumer's head and the producer's tail on their
//! own cache lines), then 4 MiB of records. A record is a 56-byte header (length,
//! direction, wall-clock time in nanoseconds, source and destination address and port, packet
//! length) and the RoCEv2 packet, padded to 8 bytes; one that would cross the end is preceded
//! by a pad record to it.
//!
//! Both sides treat the other's bytes as untrusted: every length is checked before use, and a
//! ring that makes no sense is abandoned, not followed.

use core::net::{IpAddr, SocketAddr};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::Ordering;

use crate::host::{mapped as addr_bytes, unmapped as addr_of};
use crate::sys::shm::Mapping;

const MAGIC: u64 = 0x7572_6f63_6563_6170; // "urocecap"
const MAGIC_AT: usize = 0;
const SESSION_AT: usize = 8; // u32
const CAPTURER_AT: usize = 12; // u32: the capturing tool's pid
const DROPPED_AT: usize = 24; // u64: records the producer had no room for
const SKIP_COUNT_AT: usize = 32; // u32: how many addresses follow at SKIP_AT
const SKIP_AT: usize = 256; // MAX_SKIP × 16 bytes: devices whose packets a receiver leaves out
/// Devices a ring names as captured by the same session (their packets are copied where they
/// are sent, so the receiving endpoint leaves them out).
pub(crate) const MAX_SKIP: usize = 64;
const HEAD_AT: usize = 64; // u64: consumer position
const TAIL_AT: usize = 128; // u64: producer position
const DATA_AT: usize = 4096;
/// Bytes of records (a power of two): about a thousand 4 KiB packets.
pub(crate) const DATA_BYTES: usize = 4 << 20;
const FILE_BYTES: usize = DATA_AT + DATA_BYTES;
const RECORD_HEADER: usize = 56;
/// The largest packet a record holds (larger ones are cut, as a snap length cuts).
pub(crate) const MAX_PACKET: usize = 9216;

/// Which way a captured packet went, seen from the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Sent by the endpoint.
    Sent,
    /// Received by it.
    Received,
}

const KIND_SENT: u32 = 1;
const KIND_RECEIVED: u32 = 2;
const KIND_PAD: u32 = 3;
/// Or'ed into a record's kind: the packet's ICRC field is zero (it crossed, or was built for,
/// a path that cannot corrupt it) and the reader computes it, so that the capture shows what
/// the wire would carry without the captured process spending a CRC on it.
const FILL_ICRC: u32 = 0x100;

/// One captured packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Which way it went.
    pub direction: Direction,
    /// Wall-clock time (nanoseconds since the Unix epoch).
    pub ts_ns: u64,
    /// The datagram's source.
    pub src: SocketAddr,
    /// The datagram's destination.
    pub dst: SocketAddr,
    /// The RoCEv2 packet (BTH through ICRC).
    pub bytes: Vec<u8>,
}

fn align8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// The pid of the tool that created the ring at `path`, if it is a capture ring.
pub(crate) fn capturer_of(path: &Path) -> Option<u32> {
    use std::io::Read as _;
    let mut h = [0u8; 16];
    File::open(path).ok()?.read_exact(&mut h).ok()?;
    let magic = u64::from_le_bytes(h[..8].try_into().ok()?);
    (magic == MAGIC).then(|| u32::from_le_bytes([h[12], h[13], h[14], h[15]]))
}

/// The producer side, in the captured endpoint.
#[derive(Debug)]
pub(crate) struct RingWriter {
    map: Mapping,
    tail: u64,
    head: u64,
    capturer: u32,
    dropped: u64,
    skip: Vec<IpAddr>,
}

impl RingWriter {
    /// Maps the ring a tool created for `session`; `None` if it is not that session's.
    pub(crate) fn open(path: &Path, session: u32) -> io::Result<Option<Self>> {
        let file = crate::host::open_existing_shared(path, FILE_BYTES)?;
        let map = Mapping::new(&file, FILE_BYTES)?;
        if map.u64_at(MAGIC_AT).load(Ordering::Acquire) != MAGIC
            || map.u32_at(SESSION_AT).load(Ordering::Acquire) != session
        {
            return Ok(None);
        }
        let tail = map.u64_at(TAIL_AT).load(Ordering::Acquire);
        let head = map.u64_at(HEAD_AT).load(Ordering::Acquire);
        let capturer = map.u32_at(CAPTURER_AT).load(Ordering::Acquire);
        let n = (map.u32_at(SKIP_COUNT_AT).load(Ordering::Acquire) as usize).min(MAX_SKIP);
        let skip = (0..n)
            .map(|i| {
                let mut b = [0u8; 16];
                map.read(SKIP_AT + 16 * i, &mut b);
                addr_of(b)
            })
            .collect();
        Ok(Some(Self { map, tail, head, capturer, dropped: 0, skip }))
    }

    /// Whether a packet received from `src` is left out: its sender is captured too.
    pub(crate) fn skips(&self, src: IpAddr) -> bool {
        self.skip.contains(&src)
    }

    /// The capturing tool's pid.
    pub(crate) fn capturer(&self) -> u32 {
        self.capturer
    }

    /// Records not written for want of room, since this writer opened.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Room for `need` contiguous bytes at the tail, writing a pad record to the end first if
    /// needed; `None` if the consumer has not freed enough.
    fn reserve(&mut self, need: usize) -> Option<usize> {
        let cap = DATA_BYTES as u64;
        for refreshed in [false, true] {
            if refreshed {
                self.head = self.map.u64_at(HEAD_AT).load(Ordering::Acquire);
            }
            // A head that moved past the tail, or fell a whole ring behind, is garbage: room
            // is then what the tail alone says there is, and nothing is written.
            let used = self.tail.checked_sub(self.head).filter(|&u| u <= cap)?;
            let at = usize::try_from(self.tail % cap).ok()?;
            let to_end = DATA_BYTES - at;
            let want = if need <= to_end { need } else { to_end + need };
            if used + want as u64 <= cap {
                if need > to_end {
                    self.put_header(at, to_end, KIND_PAD);
                    self.tail += to_end as u64;
                    return Some(0);
                }
                return Some(at);
            }
        }
        None
    }

    fn put_header(&self, at: usize, len: usize, kind: u32) {
        let mut h = [0u8; 8];
        h[..4].copy_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
        h[4..].copy_from_slice(&kind.to_le_bytes());
        self.map.write(DATA_AT + at, &h);
    }

    /// Copies one packet (given in parts) into the ring; counts it as dropped if there is no
    /// room. Call [`RingWriter::publish`] after a batch.
    pub(crate) fn push<'a>(
        &mut self,
        direction: Direction,
        fill_icrc: bool,
        ts_ns: u64,
        src: SocketAddr,
        dst: SocketAddr,
        parts: impl Iterator<Item = &'a [u8]> + Clone,
    ) {
        let total: usize = parts.clone().map(<[u8]>::len).sum();
        let len = total.min(MAX_PACKET);
        let need = align8(RECORD_HEADER + len);
        let Some(at) = self.reserve(need) else {
            self.dropped += 1;
            self.map.u64_at(DROPPED_AT).fetch_add(1, Ordering::Relaxed);
            return;
        };
        let kind = match direction {
            Direction::Sent => KIND_SENT,
            Direction::Received => KIND_RECEIVED,
        } | if fill_icrc && len == total { FILL_ICRC } else { 0 };
        let mut h = [0u8; RECORD_HEADER];
        h[..4].copy_from_slice(&u32::try_from(need).unwrap_or(u32::MAX).to_le_bytes());
        h[4..8].copy_from_slice(&kind.to_le_bytes());
        h[8..16].copy_from_slice(&ts_ns.to_le_bytes());
        h[16..32].copy_from_slice(&addr_bytes(src.ip()));
        h[32..48].copy_from_slice(&addr_bytes(dst.ip()));
        h[48..50].copy_from_slice(&src.port().to_le_bytes());
        h[50..52].copy_from_slice(&dst.port().to_le_bytes());
        h[52..56].copy_from_slice(&u32::try_from(len).unwrap_or(0).to_le_bytes());
        self.map.write(DATA_AT + at, &h);
        let mut off = at + RECORD_HEADER;
        let mut left = len;
        for p in parts {
            let n = p.len().min(left);
            self.map.write(DATA_AT + off, &p[..n]);
            off += n;
            left -= n;
        }
        self.tail += need as u64;
    }

    /// Makes the records pushed so far visible to the consumer.
    pub(crate) fn publish(&self) {
        self.map.u64_at(TAIL_AT).store(self.tail, Ordering::Release);
    }
}

/// The consumer side, in the capturing tool.
#[derive(Debug)]
pub struct RingReader {
    map: Mapping,
    head: u64,
    /// Records that made no sense (the ring was then emptied).
    pub malformed: u64,
}

impl RingReader {
    /// Creates the ring at `path` (mode 0600, replacing any old one) for `session`, captured by
    /// this process; as root in another user's directory it is given to `owner_uid`, so the
    /// captured endpoint can open it. `skip`: the devices the session captures (the first
    /// [`MAX_SKIP`]), whose packets the endpoint need not copy on receipt.
    pub(crate) fn create(
        path: &Path,
        session: u32,
        owner_uid: u32,
        skip: &[IpAddr],
    ) -> io::Result<Self> {
        let _ = std::fs::remove_file(path);
        let file: File = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        file.set_len(FILE_BYTES as u64)?;
        if crate::sys::shm::effective_uid() != owner_uid {
            std::os::unix::fs::fchown(&file, Some(owner_uid), None)?;
        }
        let map = Mapping::new(&file, FILE_BYTES)?;
        map.u32_at(SESSION_AT).store(session, Ordering::Release);
        map.u32_at(CAPTURER_AT).store(std::process::id(), Ordering::Release);
        let skip = &skip[..skip.len().min(MAX_SKIP)];
        for (i, a) in skip.iter().enumerate() {
            map.write(SKIP_AT + 16 * i, &addr_bytes(*a));
        }
        map.u32_at(SKIP_COUNT_AT).store(u32::try_from(skip.len()).unwrap_or(0), Ordering::Release);
        map.u64_at(MAGIC_AT).store(MAGIC, Ordering::Release);
        Ok(Self { map, head: 0, malformed: 0 })
    }

    /// Records the producer had no room for.
    pub fn dropped(&self) -> u64 {
        self.map.u64_at(DROPPED_AT).load(Ordering::Acquire)
    }

    /// Takes every published record, handing each to `f`; returns how many.
    pub fn drain(&mut self, f: &mut dyn FnMut(Record)) -> usize {
        let tail = self.map.u64_at(TAIL_AT).load(Ordering::Acquire);
        let mut n = 0;
        while self.head < tail {
            match self.record_at(tail) {
                Some((len, record)) => {
                    self.head += len as u64;
                    if let Some(r) = record {
                        n += 1;
                        f(r);
                    }
                }
                None => {
                    self.abandon(tail);
                    break;
                }
            }
        }
        self.map.u64_at(HEAD_AT).store(self.head, Ordering::Release);
        n
    }

    /// The entry at the head, published up to `tail`: its length and its record (`None` for a
    /// pad); `None` if it makes no sense.
    fn record_at(&self, tail: u64) -> Option<(usize, Option<Record>)> {
        let cap = DATA_BYTES as u64;
        let at = usize::try_from(self.head % cap).ok()?;
        let room = DATA_BYTES - at;
        let mut h = [0u8; RECORD_HEADER];
        if tail - self.head > cap || room < 8 || !self.map.read(DATA_AT + at, &mut h[..8]) {
            return None;
        }
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let kind = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        if len < 8 || !len.is_multiple_of(8) || len > room || self.head + len as u64 > tail {
            return None;
        }
        if kind == KIND_PAD {
            return Some((len, None));
        }
        let direction = match kind & !FILL_ICRC {
            KIND_SENT => Direction::Sent,
            KIND_RECEIVED => Direction::Received,
            _ => return None,
        };
        if len < RECORD_HEADER || !self.map.read(DATA_AT + at, &mut h) {
            return None;
        }
        let word16 = |from: usize| -> [u8; 16] { h[from..from + 16].try_into().unwrap_or([0; 16]) };
        let ts_ns = u64::from_le_bytes(h[8..16].try_into().unwrap_or([0; 8]));
        let src = SocketAddr::new(addr_of(word16(16)), u16::from_le_bytes([h[48], h[49]]));
        let dst = SocketAddr::new(addr_of(word16(32)), u16::from_le_bytes([h[50], h[51]]));
        let plen = u32::from_le_bytes([h[52], h[53], h[54], h[55]]) as usize;
        if RECORD_HEADER + plen > len {
            return None;
        }
        let mut bytes = vec![0u8; plen];
        if !self.map.read(DATA_AT + at + RECORD_HEADER, &mut bytes) {
            return None;
        }
        if kind & FILL_ICRC != 0 {
            crate::fabric::seal(src, dst, &mut bytes);
        }
        Some((len, Some(Record { direction, ts_ns, src, dst, bytes })))
    }

    /// Skips to `tail` after a record that made no sense.
    fn abandon(&mut self, tail: u64) {
        self.malformed += 1;
        self.head = tail;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("uroce-capring-{name}-{}", std::process::id()))
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("addr")
    }

    /// A ring for `session` at a fresh path, with its reader and writer.
    fn ring(
        name: &str,
        session: u32,
        skip: &[IpAddr],
    ) -> (std::path::PathBuf, RingReader, RingWriter) {
        let p = temp(name);
        let uid = crate::sys::shm::effective_uid();
        let r = RingReader::create(&p, session, uid, skip).expect("create");
        let w = RingWriter::open(&p, session).expect("open").expect("session");
        (p, r, w)
    }

    #[test]
    fn records_cross_the_ring_in_order_and_wrap() {
        let (p, mut r, mut w) = ring("wrap", 7, &[]);
        assert!(RingWriter::open(&p, 8).expect("open").is_none(), "another session's ring");
        let mut seen = 0u32;
        // Several times round the ring, with sizes that do not divide it.
        for i in 0u32..5000 {
            let body = vec![u8::try_from(i % 251).expect("byte"); 1000 + (i as usize % 700)];
            let (a, b) = body.split_at(10);
            w.push(
                Direction::Sent,
                false,
                u64::from(i),
                addr("127.0.0.1:49152"),
                addr("[::1]:4791"),
                [a, b].into_iter(),
            );
            w.publish();
            if i % 7 == 0 {
                r.drain(&mut |rec| {
                    assert_eq!(rec.ts_ns, u64::from(seen));
                    assert_eq!(rec.bytes.len(), 1000 + (seen as usize % 700));
                    assert!(rec.bytes.iter().all(|&x| u32::from(x) == seen % 251));
                    assert_eq!(rec.src, addr("127.0.0.1:49152"));
                    assert_eq!(rec.dst, addr("[::1]:4791"));
                    seen += 1;
                });
            }
        }
        r.drain(&mut |_| seen += 1);
        assert_eq!(seen, 5000);
        assert_eq!((w.dropped(), r.dropped(), r.malformed), (0, 0, 0));
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn the_reader_computes_an_icrc_left_zero() {
        use uroce_wire::icrc::{self, PseudoHeader};
        let (p, mut r, mut w) = ring("icrc", 3, &[]);
        let (src, dst) = (addr("127.0.0.2:49152"), addr("127.0.0.3:4791"));
        let mut packet: Vec<u8> = (0u8..60).collect();
        packet.extend_from_slice(&[0; 4]);
        w.push(Direction::Sent, true, 1, src, dst, [&packet[..]].into_iter());
        w.push(Direction::Sent, false, 2, src, dst, [&packet[..]].into_iter());
        w.publish();
        let mut got = Vec::new();
        r.drain(&mut |rec| got.push(rec.bytes));
        let pseudo = PseudoHeader::for_endpoints(src, dst).expect("pseudo");
        assert!(icrc::verify(&pseudo, &got[0]).is_ok(), "filled by the reader");
        assert_eq!(got[1], packet, "left as it came");
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn a_full_ring_counts_drops_and_garbage_is_abandoned() {
        let (p, mut r, mut w) = ring("full", 1, &["127.0.0.9".parse().expect("addr")]);
        assert!(w.skips("127.0.0.9".parse().expect("addr")));
        assert!(!w.skips("127.0.0.1".parse().expect("addr")));
        let body = [0u8; 4096];
        for _ in 0..2000 {
            w.push(
                Direction::Received,
                false,
                0,
                addr("127.0.0.1:1"),
                addr("127.0.0.1:2"),
                [&body[..]].into_iter(),
            );
        }
        w.publish();
        assert!(w.dropped() > 0 && r.dropped() == w.dropped());
        let mut n = 0u64;
        r.drain(&mut |_| n += 1);
        assert_eq!(n + w.dropped(), 2000);
        // A producer that writes nonsense: the reader skips it, counts it, and goes on.
        w.map.write(
            DATA_AT + usize::try_from(w.tail % DATA_BYTES as u64).expect("at"),
            &[3, 0, 0, 0, 9, 9, 9, 9],
        );
        w.tail += 64;
        w.publish();
        r.drain(&mut |_| panic!("no record"));
        assert_eq!(r.malformed, 1);
        let _ = std::fs::remove_file(&p);
    }
}
