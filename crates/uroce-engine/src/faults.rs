//! The one fault model of every fabric uroce runs on: per datagram, independent chances of loss,
//! corruption (one bit), reordering and duplication, drawn from the [seeded](crate::seeded)
//! generator so that a seed reproduces a run's faults.
//!
//! The simulator's links (`uroce_sim::LinkConfig`) and the runtime's `UROCE_FAULTS` both draw a
//! datagram's [`Fate`] here; each fabric keeps only its own meaning of "hold back" (the
//! simulator adds a delay, the runtime sends the datagram after the next one).

use core::fmt;

use crate::seeded::Rng;

/// Probabilities of each fault, per datagram (and, on a runtime device, per direction).
/// The text form is `UROCE_FAULTS`'s: `loss=0.01,dup=0.001,reorder=0.01,corrupt=0.0001`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// Drop the datagram.
    pub loss: f64,
    /// Deliver it twice.
    pub dup: f64,
    /// Hold it back so that a later one overtakes it.
    pub reorder: f64,
    /// Flip one uniformly chosen bit of it (the ICRC then fails at the receiver).
    pub corrupt: f64,
}

/// A fault setting that is not a probability, or text that does not parse as [`Faults`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultsError(pub String);

impl fmt::Display for FaultsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FaultsError {}

/// What happens to one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fate {
    /// Dropped; nothing else was drawn.
    pub drop: bool,
    /// The bit to flip (an index into the datagram's bits), if it is corrupted.
    pub flip: Option<usize>,
    /// Held back so that a later datagram overtakes it.
    pub hold: bool,
    /// Delivered a second time.
    pub duplicate: bool,
}

impl Faults {
    /// Whether any fault is configured.
    pub fn any(&self) -> bool {
        self.loss > 0.0 || self.dup > 0.0 || self.reorder > 0.0 || self.corrupt > 0.0
    }

    /// The first setting that is not a probability in 0..=1 (NaN included).
    pub fn check(&self) -> Result<(), FaultsError> {
        let settings = [
            ("loss", self.loss),
            ("dup", self.dup),
            ("reorder", self.reorder),
            ("corrupt", self.corrupt),
        ];
        match settings.into_iter().find(|(_, p)| !(0.0..=1.0).contains(p)) {
            Some((name, p)) => {
                Err(FaultsError(format!("{name}={p} is not a probability in 0..=1")))
            }
            None => Ok(()),
        }
    }

    /// Parses `loss=P,dup=P,reorder=P,corrupt=P` (any subset, any order; P in 0..=1).
    pub fn parse(text: &str) -> Result<Self, FaultsError> {
        let mut f = Self::default();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| FaultsError(format!("`{item}` is not NAME=PROBABILITY")))?;
            let p: f64 = value
                .trim()
                .parse()
                .map_err(|_| FaultsError(format!("`{value}` is not a number")))?;
            match key.trim() {
                "loss" => f.loss = p,
                "dup" => f.dup = p,
                "reorder" => f.reorder = p,
                "corrupt" => f.corrupt = p,
                other => {
                    return Err(FaultsError(format!(
                        "unknown fault `{other}` (loss, dup, reorder, corrupt)"
                    )));
                }
            }
        }
        f.check()?;
        Ok(f)
    }

    /// Draws the fate of a datagram of `len` bytes, in a fixed order — loss (and nothing more if
    /// it is lost), corruption and its bit, reordering, duplication — and nothing for a fault
    /// whose probability is 0, so disabled faults leave the stream untouched. An empty datagram
    /// is never corrupted.
    pub fn fate(&self, rng: &mut Rng, len: usize) -> Fate {
        if rng.gen_bool(self.loss) {
            return Fate { drop: true, ..Fate::default() };
        }
        let flip = if rng.gen_bool(self.corrupt) { random_bit(rng, len) } else { None };
        let hold = rng.gen_bool(self.reorder);
        Fate { drop: false, flip, hold, duplicate: rng.gen_bool(self.dup) }
    }
}

/// A uniformly chosen bit of a datagram of `len` bytes, or `None` if it is empty.
pub fn random_bit(rng: &mut Rng, len: usize) -> Option<usize> {
    let bits = u64::try_from(len).ok()?.checked_mul(8).filter(|&b| b > 0)?;
    usize::try_from(rng.gen_range(0..bits)).ok()
}

/// Flips bit `bit` of `bytes` (bit 0 is the low bit of the first byte); a bit past the end is
/// left alone.
pub fn flip_bit(bytes: &mut [u8], bit: usize) {
    if let Some(b) = bytes.get_mut(bit / 8) {
        *b ^= 1 << (bit % 8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_form_and_names_what_is_wrong() {
        let f = Faults::parse("loss=0.01,dup=0.001,reorder=0.01,corrupt=0.0001").unwrap();
        assert_eq!(f, Faults { loss: 0.01, dup: 0.001, reorder: 0.01, corrupt: 0.0001 });
        assert!(Faults::parse("").unwrap() == Faults::default());
        assert!(Faults::parse("loss=2").unwrap_err().0.contains("probability"));
        assert!(Faults::parse("dup=NaN").unwrap_err().0.contains("probability"));
        assert!(Faults::parse("lose=0.1").unwrap_err().0.contains("unknown fault"));
        assert!(Faults::parse("loss").unwrap_err().0.contains("NAME=PROBABILITY"));
    }

    #[test]
    fn draws_about_the_configured_fraction_of_each_fault() {
        let mut rng = Rng::new(1);
        let f = Faults { loss: 0.1, dup: 0.2, reorder: 0.3, corrupt: 0.4 };
        let fates: Vec<Fate> = (0..100_000).map(|_| f.fate(&mut rng, 100)).collect();
        let count = |pick: fn(&Fate) -> bool| fates.iter().filter(|x| pick(x)).count();
        let kept = 100_000 - count(|x| x.drop);
        assert!((9_000..11_000).contains(&(100_000 - kept)), "lost {}", 100_000 - kept);
        // The other faults are drawn only for datagrams that were not lost.
        for (name, n, p) in [
            ("dup", count(|x| x.duplicate), 0.2),
            ("reorder", count(|x| x.hold), 0.3),
            ("corrupt", count(|x| x.flip.is_some()), 0.4),
        ] {
            let expected = kept as f64 * p;
            assert!((n as f64 - expected).abs() < expected * 0.05, "{name}: {n} of {kept}");
        }
        assert!(fates.iter().filter_map(|x| x.flip).all(|bit| bit < 800));
    }

    #[test]
    fn disabled_faults_draw_nothing_and_empty_datagrams_are_not_corrupted() {
        let mut rng = Rng::new(7);
        assert_eq!(Faults::default().fate(&mut rng, 100), Fate::default());
        assert_eq!(rng, Rng::new(7));
        let always = Faults { corrupt: 1.0, ..Faults::default() };
        assert_eq!(always.fate(&mut rng, 0).flip, None);
        let mut bytes = [0u8; 2];
        flip_bit(&mut bytes, 9);
        flip_bit(&mut bytes, 16);
        assert_eq!(bytes, [0, 2]);
    }
}
