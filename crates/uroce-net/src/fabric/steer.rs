//! Steering: each datagram for the device's port goes to the process that owns its destination
//! QPN, as a NIC demultiplexes by QPN.
//!
//! The processes of a host-wide device share its port (`SO_REUSEPORT`), and by default the
//! kernel picks the socket for a datagram by a hash of its addresses and ports: with two
//! processes about half of the flows land in the wrong one, which hands each packet over
//! through shared memory ([`super::host`], `udp_rx_forwarded`). That is correct, but it costs
//! a hop, and when the process that receives is idle, the wake-up of its progress thread: a
//! UCX `tag_lat` over UDP took 35 µs (typical) instead of 6–8 whenever an idle `uroce server`
//! shared the device and the flow hashed to it.
//!
//! So the group gets a classic BPF program (`SO_ATTACH_REUSEPORT_CBPF`, socket(7)) that reads
//! the top byte of the BTH's destination QPN (the owner's slot, [`crate::host`]) and returns
//! that slot's socket index in the group. The kernel numbers a group's sockets in the order
//! they joined and, when one leaves, moves the last into its place (net/core/sock_reuseport.c,
//! `reuseport_add_sock` and `__reuseport_detach_sock`), and it tells no socket its index. Each
//! endpoint finds its own by probing: it sends itself datagrams carrying the indexes 0, 1, …,
//! n + 1, which the program hands to the socket of that index; the lowest that comes back is
//! its own. (An index past the group's end falls back to the hash, which sends all of those,
//! from one source port, to one socket: at worst to ours, after our own.) It publishes the
//! index in its slot and bumps the directory's steering epoch, and every endpoint that sees
//! the epoch move gives the group a program built from every published index. Until then,
//! and while an index is stale (a process left and the last socket moved into its place), a
//! datagram goes where the hash sends it and is handed over as before: steering saves the hop;
//! delivery never depends on it.

use core::net::IpAddr;
use std::sync::atomic::Ordering;

use uroce_engine::{Duration, Instant};
use uroce_wire::steer_probe::{self, Probe};

use super::udp::Udp;
use crate::device::NetCounters;
use crate::host::{HostDir, SlotId};

/// What the program returns for a datagram it does not steer: past any group's end, so the
/// kernel's hash picks.
const UNSTEERED: u32 = u32::MAX;

/// How often an endpoint looks at who shares its address and at the steering epoch.
const CHECK_EVERY: Duration = Duration::from_millis(10);
/// How long a probe round waits for its probes to come back.
const PROBE_WAIT: Duration = Duration::from_millis(2);
/// How long after a probe round that found nothing the next one starts: [`CHECK_EVERY`] after
/// the first such round, twice as long after each further one in a row, at most this long (a
/// probe that cannot come back, say dropped by a firewall, is not sent a hundred times a
/// second; one that came back too late for its round, on a loaded machine, is tried again
/// within [`CHECK_EVERY`]).
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The wait before the next probe round after `lost` rounds in a row found nothing.
fn retry_delay(lost: u32) -> Duration {
    let factor = 1u64.checked_shl(lost.saturating_sub(1)).unwrap_or(u64::MAX);
    let nanos = CHECK_EVERY.as_nanos().saturating_mul(factor).min(RETRY_AFTER.as_nanos());
    Duration::from_nanos(nanos)
}
/// How often one endpoint may ask every endpoint to probe again.
const ASK_AT_MOST_EVERY: Duration = Duration::from_millis(100);

// Classic BPF (linux/filter.h; the kernel runs it on the UDP payload).
const LD_W_LEN: u16 = 0x80; // A = packet length
const LD_W_ABS: u16 = 0x20; // A = 32-bit word at k (network order)
const LD_B_ABS: u16 = 0x30; // A = byte at k
const JEQ_K: u16 = 0x15; // A == k ? jt : jf
const JGE_K: u16 = 0x35; // A >= k ? jt : jf
const RET_K: u16 = 0x06; // return k
const RET_A: u16 = 0x16; // return A

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The program for a group whose endpoints (slot, socket index) are `table`: a datagram too
/// short for a BTH is left to the hash, a probe goes to the index it carries, and a packet to
/// the index of the slot in its destination QPN's top byte (BTH byte 5, IBA 9.2), or to the
/// hash when the table does not name that slot (QP1, the GSI, is every endpoint's).
pub(crate) fn program(table: &[(u8, u32)]) -> Vec<libc::sock_filter> {
    let mut p = vec![
        insn(LD_W_LEN, 0, 0, 0),
        insn(JGE_K, 1, 0, 12),
        insn(RET_K, 0, 0, UNSTEERED),
        insn(LD_B_ABS, 0, 0, 0),
        insn(JEQ_K, 0, 2, u32::from(steer_probe::OPCODE)),
        insn(LD_W_ABS, 0, 0, 4),
        insn(RET_A, 0, 0, 0),
        insn(LD_B_ABS, 0, 0, 5),
    ];
    for &(slot, index) in table {
        p.push(insn(JEQ_K, 0, 1, u32::from(slot)));
        p.push(insn(RET_K, 0, 0, index));
    }
    p.push(insn(RET_K, 0, 0, UNSTEERED));
    p
}

/// One endpoint's part in steering its port: finding its index, publishing it, and giving the
/// group a program whenever someone's index changed.
#[derive(Debug)]
pub(crate) struct Steering {
    me: SlotId,
    addr: IpAddr,
    round: Option<Round>,
    rounds: u64,
    next_check: Instant,
    /// The last probe round found nothing: when to probe again.
    retry_at: Option<Instant>,
    /// Probe rounds in a row that found nothing.
    lost_rounds: u32,
    /// The directory's probe requests this endpoint last answered, and when it last asked.
    ask_seen: Option<u32>,
    asked_at: Option<Instant>,
    /// Who shared the address when this endpoint last looked.
    sharers: Vec<SlotId>,
    /// The steering epoch the group's program was last built for by this endpoint.
    epoch_seen: Option<u32>,
    /// The kernel refused a program: no more tries.
    refused: bool,
}

#[derive(Debug)]
struct Round {
    nonce: u64,
    sent_at: Instant,
    lowest: Option<u32>,
}

impl Steering {
    pub(crate) fn new(me: SlotId, addr: IpAddr) -> Self {
        let zero = Instant::from_nanos(0);
        Self {
            me,
            addr,
            round: None,
            rounds: 0,
            next_check: zero,
            retry_at: None,
            lost_rounds: 0,
            ask_seen: None,
            asked_at: None,
            sharers: Vec::new(),
            epoch_seen: None,
            refused: false,
        }
    }

    fn nonce(&self) -> u64 {
        (u64::from(std::process::id()) << 32 | u64::from(self.me.generation))
            ^ (u64::from(self.me.index) << 56)
            ^ self.rounds.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    /// A probe that reached this endpoint's socket from `src`: one of ours (from our own
    /// address, this round) tells where our socket is; another endpoint's says that someone
    /// joined (or looks again), so this one looks at once instead of at its next check — an
    /// idle endpoint may not check for a long time.
    pub(crate) fn heard(&mut self, src: IpAddr, probe: Probe) {
        if src != self.addr {
            return;
        }
        match self.round.as_mut() {
            Some(r) if r.nonce == probe.nonce => {
                r.lowest = Some(r.lowest.map_or(probe.index, |l| l.min(probe.index)));
            }
            Some(_) => {}
            None => self.next_check = Instant::from_nanos(0),
        }
    }

    /// This endpoint received a datagram for another endpoint's QP (not QP1's, which no
    /// program steers) whose place is published, and handed it over: an index is stale, most
    /// likely because a process left without releasing its slot (killed) and the last socket
    /// moved into its place. It asks every endpoint to probe again, at most every
    /// [`ASK_AT_MOST_EVERY`].
    pub(crate) fn misdelivered(&mut self, now: Instant, dir: &HostDir) {
        if self.asked_at.is_some_and(|at| now < at + ASK_AT_MOST_EVERY) {
            return;
        }
        self.asked_at = Some(now);
        dir.steer_ask().fetch_add(1, Ordering::AcqRel);
        self.next_check = Instant::from_nanos(0);
    }

    /// When the probe round under way ends (the progress thread must come back then).
    pub(crate) fn round_ends(&self) -> Option<Instant> {
        self.round.as_ref().map(|r| r.sent_at + PROBE_WAIT)
    }

    /// Whether [`Steering::tick`] has anything to do at `now`.
    pub(crate) fn due(&self, now: Instant) -> bool {
        !self.refused && now >= self.next_check
    }

    /// Ends a probe round that has waited long enough; starts one when this endpoint's place
    /// is not known, may have moved (someone left) or someone asked; and gives the group a new
    /// program when the steering epoch moved.
    pub(crate) fn tick(&mut self, now: Instant, dir: &HostDir, udp: &Udp, c: &mut NetCounters) {
        if !self.due(now) {
            return;
        }
        self.next_check = now + CHECK_EVERY;
        if let Some(r) = &self.round {
            if now < r.sent_at + PROBE_WAIT {
                self.next_check = r.sent_at + PROBE_WAIT;
                return;
            }
            let value = r.lowest.map_or(0, |i| i.saturating_add(1));
            if r.lowest.is_none() {
                c.udp_steer_probes_lost += 1;
                self.lost_rounds = self.lost_rounds.saturating_add(1);
                self.retry_at = Some(now + retry_delay(self.lost_rounds));
            } else {
                self.lost_rounds = 0;
            }
            self.round = None;
            if dir.steer_index(self.me.index).swap(value, Ordering::AcqRel) != value {
                dir.steer_epoch().fetch_add(1, Ordering::AcqRel);
            }
        }
        let sharers: Vec<SlotId> = dir.endpoints_at(self.addr).collect();
        let left = self.sharers.iter().any(|s| !sharers.contains(s));
        self.sharers.clone_from(&sharers);
        if sharers.len() < 2 {
            // Alone on the address: the group's one socket gets everything anyway.
            return;
        }
        let ask = dir.steer_ask().load(Ordering::Acquire);
        let asked = self.ask_seen.is_some_and(|seen| seen != ask);
        self.ask_seen = Some(ask);
        // A socket that joins goes to the group's end, and nobody else's place changes; one
        // that leaves takes the last socket into its place: the endpoint with the highest
        // index may have moved. (With many processes on one address, every one probing at
        // every change would cost each join and leave a number of probes growing with the
        // square of their count.)
        let index_of = |s: &SlotId| dir.steer_index(s.index).load(Ordering::Acquire);
        let mine = dir.steer_index(self.me.index).load(Ordering::Acquire);
        let moved = left && mine != 0 && sharers.iter().all(|s| index_of(s) <= mine);
        let unknown = mine == 0 && self.retry_at.is_none_or(|at| now >= at);
        if unknown || moved || asked {
            self.retry_at = None;
            // The probes are steered by the group's program: make sure it has one.
            if self.epoch_seen.is_none() {
                self.give_program(dir, &sharers, udp, c);
            }
            self.rounds += 1;
            let nonce = self.nonce();
            let count = u32::try_from(sharers.len() + 2).unwrap_or(u32::MAX);
            let probes: Vec<[u8; steer_probe::LEN]> =
                (0..count).map(|index| Probe { index, nonce }.emit()).collect();
            match udp.send_to_own_port(&probes) {
                Ok(()) => c.udp_steer_probes_sent += u64::from(count),
                Err(_) => c.udp_steer_probes_lost += 1,
            }
            self.round = Some(Round { nonce, sent_at: now, lowest: None });
            self.next_check = now + PROBE_WAIT;
            return;
        }
        if self.epoch_seen != Some(dir.steer_epoch().load(Ordering::Acquire)) {
            self.give_program(dir, &sharers, udp, c);
        }
    }

    /// Gives the group a program built from the published index of every endpoint in
    /// `sharers` whose process runs, until the epoch stays put across the build (an index
    /// published meanwhile makes it build again, a few times at most).
    fn give_program(&mut self, dir: &HostDir, sharers: &[SlotId], udp: &Udp, c: &mut NetCounters) {
        for _ in 0..4 {
            let epoch = dir.steer_epoch().load(Ordering::Acquire);
            // A slot whose process is gone keeps its index until claimed again; its socket
            // is gone, and the last one may hold that index now.
            let table: Vec<(u8, u32)> = sharers
                .iter()
                .filter(|s| dir.alive(s.index))
                .filter_map(|s| {
                    let v = dir.steer_index(s.index).load(Ordering::Acquire);
                    v.checked_sub(1).map(|i| (s.index, i))
                })
                .collect();
            if udp.steer(&program(&table)).is_err() {
                c.udp_steer_refused += 1;
                self.refused = true;
                return;
            }
            c.udp_steer_programs += 1;
            self.epoch_seen = Some(epoch);
            if dir.steer_epoch().load(Ordering::Acquire) == epoch {
                return;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
mod tests {
    use std::collections::BTreeMap;
    use std::net::{SocketAddr, UdpSocket};
    use std::sync::Arc;

    use super::*;
    use crate::fabric::Fabric;
    use crate::fabric::host::HostFabric;
    use crate::fabric::shm::Shm;
    use crate::fabric::udp::Offloads;
    use crate::sys::{self, shm};

    /// A probe round that found nothing is tried again soon (its probes may only have come
    /// back late, on a loaded machine), then less and less often, at most once a second.
    #[test]
    fn a_lost_probe_round_is_retried_soon_then_less_often() {
        let ms = |d: Duration| d.as_nanos() / 1_000_000;
        let delays: Vec<u64> = (1..=9).map(|lost| ms(retry_delay(lost))).collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        assert_eq!(ms(retry_delay(u32::MAX)), 1000);
    }

    /// Two sockets sharing one port, as two processes of one device.
    fn group(addr: &str) -> (SocketAddr, [UdpSocket; 2]) {
        let first = sys::udp_socket(format!("{addr}:0").parse().unwrap(), false, true).unwrap();
        let at = first.local_addr().unwrap();
        let second = sys::udp_socket(at, false, true).unwrap();
        (at, [first, second])
    }

    fn bth_to(slot: u8) -> [u8; 12] {
        let mut b = [0u8; 12];
        b[0] = 0x04; // RC SEND only
        b[5] = slot;
        b[7] = 0x11;
        b
    }

    /// Which of `socks` received each datagram: payload byte 5 (a slot) or a probe's index,
    /// and the socket that got it.
    fn arrivals(socks: &[UdpSocket; 2], expected: usize) -> Vec<(u32, usize)> {
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        for _ in 0..200 {
            for (k, s) in socks.iter().enumerate() {
                while let Ok(n) = s.recv(&mut buf) {
                    let id = Probe::parse(&buf[..n]).map_or(u32::from(buf[5]), |p| p.index);
                    got.push((id, k));
                }
            }
            if got.len() >= expected {
                break;
            }
            let fds: Vec<_> = socks.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
            let _ = sys::poll_readable_ns(&fds, Some(5_000_000));
        }
        got
    }

    /// IPv4 and IPv6 (the kernel runs the program on the UDP payload for both).
    #[test]
    fn probes_find_each_sockets_index_and_the_program_steers_by_destination_slot() {
        for ip in ["127.0.0.71", "[::1]"] {
            probe_and_steer(ip);
        }
    }

    fn probe_and_steer(ip: &str) {
        let (at, socks) = group(ip);
        sys::attach_reuseport_program(&socks[0], &program(&[])).unwrap();
        // Probes 0..4 from one source port: each socket's lowest is its index (2 and 3 are
        // past the group's end, and the hash sends both to one of the two).
        let from = UdpSocket::bind(format!("{ip}:0")).unwrap();
        for p in 0..4 {
            from.send_to(&Probe { index: p, nonce: 7 }.emit(), at).unwrap();
        }
        let got = arrivals(&socks, 4);
        assert_eq!(got.len(), 4, "{got:?}");
        let lowest = |k| got.iter().filter(|&&(_, s)| s == k).map(|&(p, _)| p).min();
        let index = [lowest(0).unwrap(), lowest(1).unwrap()];
        let mut sorted = index;
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1], "indexes found: {index:?}");
        // Slot 9 is socket 0's endpoint, slot 3 socket 1's: from 64 source ports, every packet
        // lands at its slot's socket (the hash alone would split them about evenly).
        sys::attach_reuseport_program(&socks[0], &program(&[(9, index[0]), (3, index[1])]))
            .unwrap();
        let senders: Vec<UdpSocket> =
            (0..64).map(|_| UdpSocket::bind(format!("{ip}:0")).unwrap()).collect();
        for s in &senders {
            s.send_to(&bth_to(9), at).unwrap();
            s.send_to(&bth_to(3), at).unwrap();
        }
        let got = arrivals(&socks, 128);
        let mut by_slot: BTreeMap<(u32, usize), usize> = BTreeMap::new();
        for g in got {
            *by_slot.entry(g).or_default() += 1;
        }
        assert_eq!(by_slot, BTreeMap::from([((3, 1), 64), ((9, 0), 64)]));
        // A slot the table does not name (QP1's 0 here) and a runt go where the hash sends them:
        // both still arrive.
        senders[0].send_to(&bth_to(0), at).unwrap();
        senders[1].send_to(&[1, 2, 3], at).unwrap();
        assert_eq!(arrivals(&socks, 2).len(), 2);
    }

    /// Three endpoints of 127.0.0.72 in a directory of their own, each with its fabric.
    fn endpoints(name: &str) -> (Arc<HostDir>, std::path::PathBuf, Vec<(SlotId, HostFabric)>) {
        let p = std::env::temp_dir().join(format!("uroce-steer-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        let dir = Arc::new(HostDir::open_at(&p, shm::effective_uid()).unwrap());
        let ip: IpAddr = "127.0.0.72".parse().unwrap();
        let offloads = Offloads { gso: false, gro: false, connected_ipv4: false };
        let eps = (0..3)
            .map(|_| {
                let udp = Udp::bind(ip, offloads).unwrap();
                let me = dir.claim(ip).unwrap();
                let shm = Shm::new(Arc::clone(&dir), me, ip).unwrap();
                (me, HostFabric::new(ip, udp, Some(shm), true))
            })
            .collect();
        (dir, p, eps)
    }

    /// Runs every endpoint's receive `rounds` times, 3 ms of device time apart from `*now`;
    /// returns which endpoint's engine got each packet's destination slot, and the packets
    /// handed over.
    fn pump(
        eps: &mut [(SlotId, HostFabric)],
        now: &mut u64,
        rounds: usize,
    ) -> (Vec<(u8, u8)>, u64) {
        let (mut got, mut forwarded) = (Vec::new(), 0);
        for _ in 0..rounds {
            *now += 3_000_000;
            for (me, f) in eps.iter_mut() {
                let mut c = NetCounters::default();
                let mine = me.index;
                f.receive(Instant::from_nanos(*now), &mut c, &mut |_, bytes, _| {
                    got.push((mine, bytes[5]));
                });
                forwarded += c.udp_rx_forwarded;
            }
        }
        (got, forwarded)
    }

    /// A datagram for slot `slot` from each of 16 source ports.
    fn send_flows(slot: u8) {
        for _ in 0..16 {
            let s = UdpSocket::bind("127.0.0.73:0").unwrap();
            s.send_to(&bth_to(slot), "127.0.0.72:4791").unwrap();
        }
    }

    /// A process killed keeps its slot (nobody releases it) while its socket leaves the group,
    /// and the kernel moves the last socket into its place: nobody sees the endpoints change.
    /// The datagrams of the moved endpoint then land where the hash sends them; the one that
    /// hands such a datagram over asks every endpoint to probe again, and steering holds again.
    #[test]
    fn a_killed_endpoints_place_is_found_again_for_the_socket_moved_into_it() {
        let (dir, path, mut eps) = endpoints("killed");
        let mut now = 0;
        pump(&mut eps, &mut now, 10);
        let slots: Vec<u8> = eps.iter().map(|(me, _)| me.index).collect();
        for &s in &slots {
            send_flows(s);
        }
        let (got, forwarded) = pump(&mut eps, &mut now, 3);
        assert_eq!(forwarded, 0, "steered from the start: {got:?}");
        assert_eq!(got.len(), 48);
        // The first endpoint's process dies: its slot stays taken, its socket goes.
        let dead = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = dead.id();
        let mut dead = dead;
        dead.wait().unwrap();
        let (first, _) = eps.remove(0);
        dir.set_holder(first.index, first.generation, dead_pid);
        for &s in &slots[1..] {
            send_flows(s);
        }
        let (got, _) = pump(&mut eps, &mut now, 10);
        assert_eq!(got.len(), 32, "every datagram still arrives");
        for &s in &slots[1..] {
            send_flows(s);
        }
        let (got, forwarded) = pump(&mut eps, &mut now, 3);
        assert_eq!(got.len(), 32);
        assert_eq!(forwarded, 0, "steered again after the kill: {got:?}");
        let _ = std::fs::remove_dir_all(path);
    }
}
