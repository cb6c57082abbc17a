//! What a comparison was measured on, and how: the machine, the software and the settings,
//! for the report and `results.json`, so that a figure can be read against its conditions.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The conditions of one `uroce compare` run.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Machine {
    pub(crate) host: String,
    pub(crate) cpu: String,
    pub(crate) cores: usize,
    pub(crate) kernel: String,
    pub(crate) uroce: &'static str,
    /// When the run started, UTC, ISO 8601.
    pub(crate) date: String,
    /// The options that shaped the matrix, as a person would type them.
    pub(crate) settings: String,
    /// The fastest and slowest [`cache_line_round_trip`] of the run, in ns (probed before
    /// every point): how far the host moved the vCPUs' cache placement meanwhile.
    pub(crate) cache_line_rt_ns: Option<[f64; 2]>,
    /// How the run waited out the host's slow spells ([`Spells::probe`]).
    pub(crate) slow_spells: Spells,
    /// Points whose repeats disagreed (spanned more than a quarter of their median) and
    /// were measured twice more.
    pub(crate) remeasured: usize,
}

impl Machine {
    /// This machine now, with `settings` describing the run.
    pub(crate) fn now(settings: String) -> Self {
        let read = |path: &str| {
            std::fs::read_to_string(path)
                .map_or_else(|_| "unknown".into(), |s| s.trim().to_string())
        };
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find_map(|l| l.strip_prefix("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, name)| name.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        #[expect(clippy::disallowed_methods, reason = "the report says when it was measured")]
        let wall = SystemTime::now();
        let secs = wall.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Self {
            host: read("/proc/sys/kernel/hostname"),
            cpu,
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            kernel: read("/proc/sys/kernel/osrelease"),
            uroce: env!("CARGO_PKG_VERSION"),
            date: iso8601(secs),
            settings,
            cache_line_rt_ns: None,
            slow_spells: Spells::default(),
            remeasured: 0,
        }
    }

    /// One line for a person.
    pub(crate) fn describe(&self) -> String {
        format!(
            "{} ({}, {} cores), Linux {}, uroce {}, {}; {}",
            self.host, self.cpu, self.cores, self.kernel, self.uroce, self.date, self.settings
        )
    }
}

/// A probe this many times the run's typical one finds the machine in a slow spell.
const SLOW_SPELL_FACTOR: f64 = 2.5;

/// How often a point waiting for a slow spell to pass probes again.
const SPELL_PROBE_EVERY: Duration = Duration::from_millis(100);

/// How many times it does before it is measured in the spell all the same (3 s).
const SPELL_PROBES: u32 = 30;

/// The host's slow spells over a run, and how the run dealt with them: before each point
/// the machine is probed ([`cache_line_round_trip`]), and a probe [`SLOW_SPELL_FACTOR`] times
/// the run's median so far means the host has moved the vCPUs apart (here 55 ns became
/// 330 ns for seconds at a time, and a 256 KiB ping-pong, RDMA's and TCP's alike, took 2.5
/// to 3 times as long). The point then waits, probing, for the spell to pass, up to
/// [`SPELL_PROBES`] probes; one that outlasts them is measured all the same and counted.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct Spells {
    /// Points that waited for a spell to pass.
    pub(crate) waited: u32,
    /// Seconds they waited in all.
    pub(crate) waited_s: f64,
    /// Points measured in a spell that lasted past the limit.
    pub(crate) measured_in_spell: u32,
    /// Every probe of the run, in ns (not written out).
    #[serde(skip)]
    probes: Vec<f64>,
}

impl Spells {
    /// Calibrates: a few probes a little apart, so that the first points know what is
    /// typical.
    pub(crate) fn calibrate(&mut self) {
        for _ in 0..5 {
            self.probes.extend(cache_line_round_trip());
            pause(Duration::from_millis(20));
        }
    }

    /// Probes the machine before a point, waiting out a slow spell; returns the probe the
    /// point is measured after (`None` on one CPU).
    pub(crate) fn probe(&mut self) -> Option<f64> {
        self.probe_by(cache_line_round_trip, pause)
    }

    /// [`Spells::probe`] with `probe` for the machine and `pause` for the wait.
    fn probe_by(
        &mut self,
        mut probe: impl FnMut() -> Option<f64>,
        mut pause: impl FnMut(Duration),
    ) -> Option<f64> {
        let start = super::now();
        let mut p = probe()?;
        let typical = if self.probes.is_empty() { p } else { super::median(self.probes.clone()) };
        let mut tries = 0;
        while p > typical * SLOW_SPELL_FACTOR {
            if tries == SPELL_PROBES {
                self.measured_in_spell += 1;
                break;
            }
            tries += 1;
            pause(SPELL_PROBE_EVERY);
            p = probe()?;
        }
        if tries > 0 {
            self.waited += 1;
            self.waited_s += start.elapsed().as_secs_f64();
        }
        self.probes.push(p);
        Some(p)
    }

    /// A line for the report when the run met a slow spell.
    pub(crate) fn describe(&self) -> Option<String> {
        (self.waited > 0).then(|| {
            format!(
                "the host's slow spells (a cache line between the CPUs {SLOW_SPELL_FACTOR} times \
                 slower than typical): {} points waited {:.1} s in all for one to pass; measured \
                 in a spell that outlasted {SPELL_PROBES} probes {} ms apart all the same: {}",
                self.waited,
                self.waited_s,
                SPELL_PROBE_EVERY.as_millis(),
                self.measured_in_spell
            )
        })
    }
}

/// The benchmark waits between probes.
fn pause(d: Duration) {
    #[expect(clippy::disallowed_methods, reason = "the benchmark, not protocol code, waits")]
    std::thread::sleep(d);
}

/// Round trips of [`cache_line_round_trip`].
const PROBE_ROUND_TRIPS: u32 = 4_000;

/// How long one cache line takes to go from CPU 0 to CPU 1 and back, in ns: two threads pinned
/// there hand a counter to each other [`PROBE_ROUND_TRIPS`] times. It is what every
/// shared-memory handoff costs (a ring's head and tail, a packet, a completion), so a
/// latency that moves with it moves with the machine, not the stack: on a VM the host may run
/// the two vCPUs on cores that share a cache one moment and on cores that do not the next
/// (123 ns against 340 ns here, each state lasting seconds). `None` on one CPU, or when the
/// other thread does not get to run within 50 ms.
pub(crate) fn cache_line_round_trip() -> Option<f64> {
    use std::sync::atomic::{AtomicU32, Ordering};
    if std::thread::available_parallelism().map_or(1, usize::from) < 2 {
        return None;
    }
    let ball = AtomicU32::new(0);
    let limit = Duration::from_millis(50);
    // Waits until `ball` is `want`; false when that takes longer than `limit`.
    let wait = |want: u32, start: std::time::Instant| {
        let mut spins = 0u32;
        while ball.load(Ordering::Acquire) != want {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && start.elapsed() > limit {
                return false;
            }
            core::hint::spin_loop();
        }
        true
    };
    std::thread::scope(|s| {
        let peer = s.spawn(|| {
            uroce_net::pin_current_thread(1).ok()?;
            let start = super::now();
            for k in 0..PROBE_ROUND_TRIPS {
                if !wait(2 * k + 1, start) {
                    return None;
                }
                ball.store(2 * k + 2, Ordering::Release);
            }
            Some(())
        });
        let mine = s.spawn(|| {
            uroce_net::pin_current_thread(0).ok()?;
            let start = super::now();
            for k in 0..PROBE_ROUND_TRIPS {
                ball.store(2 * k + 1, Ordering::Release);
                if !wait(2 * k + 2, start) {
                    // Let the peer stop too.
                    ball.store(u32::MAX, Ordering::Release);
                    return None;
                }
            }
            Some(start.elapsed())
        });
        let took = mine.join().ok()??;
        peer.join().ok()??;
        Some(took.as_secs_f64() * 1e9 / f64::from(PROBE_ROUND_TRIPS))
    })
}

/// `secs` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (the proleptic Gregorian calendar,
/// by days since the epoch: H. Hinnant's `civil_from_days`).
fn iso8601(secs: u64) -> String {
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A point waits while the machine probes slow against the run's median, and is measured
    /// in the spell when it outlasts the probes; both are counted.
    #[test]
    fn a_point_waits_out_a_slow_spell_up_to_a_limit() {
        let mut spells = Spells { probes: vec![60.0, 55.0, 58.0], ..Spells::default() };
        let mut script = [62.0].into_iter();
        assert_eq!(spells.probe_by(|| script.next(), |_| {}), Some(62.0));
        assert_eq!(spells.waited, 0, "a typical probe is not a spell");
        let mut script = [330.0, 340.0, 61.0].into_iter();
        let mut pauses = 0;
        assert_eq!(spells.probe_by(|| script.next(), |_| pauses += 1), Some(61.0));
        assert_eq!((spells.waited, spells.measured_in_spell, pauses), (1, 0, 2));
        let mut pauses = 0;
        assert_eq!(spells.probe_by(|| Some(330.0), |_| pauses += 1), Some(330.0));
        assert_eq!((spells.waited, spells.measured_in_spell, pauses), (2, 1, SPELL_PROBES));
        assert!(spells.describe().is_some_and(|d| d.contains("2 points waited")));
    }

    #[test]
    fn a_cache_line_goes_between_two_cpus_and_back() {
        // On two CPUs or more: a figure, well under the 50 ms a round trip may wait.
        if std::thread::available_parallelism().map_or(1, usize::from) >= 2 {
            // A loaded machine may not run the second thread in time: a few tries.
            let ns = (0..5).find_map(|_| cache_line_round_trip());
            let ns = ns.expect("a round trip on two CPUs");
            assert!(ns > 0.0 && ns < 1e7, "{ns} ns");
        }
    }

    #[test]
    fn dates_are_iso_8601_utc() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso8601(1_796_518_861), "2026-12-06T01:01:01Z");
    }
}
