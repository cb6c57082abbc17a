//! What a comparison was measured on, and how: the machine, the software and the settings,
//! for the report and `results.json`, so that a figure can be read against its conditions.

use std::time::{SystemTime, UNIX_EPOCH};

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
    use super::iso8601;

    #[test]
    fn dates_are_iso_8601_utc() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso8601(1_796_518_861), "2026-12-06T01:01:01Z");
    }
}
