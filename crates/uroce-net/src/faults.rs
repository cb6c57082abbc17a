//! Fault injection for real-socket tests: `UROCE_FAULTS=loss=0.01,dup=0.001,reorder=0.01,corrupt=0.0001`
//! (or [`Faults`] through the API), applied to every datagram sent and every datagram received.

use core::fmt;

/// Probabilities of each fault, per datagram and per direction.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// Drop the datagram.
    pub loss: f64,
    /// Deliver it twice.
    pub dup: f64,
    /// Hold it back until after the next one.
    pub reorder: f64,
    /// Flip one random bit of it (the ICRC then fails at the receiver).
    pub corrupt: f64,
}

/// A `UROCE_FAULTS` value that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultsError(pub String);

impl fmt::Display for FaultsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UROCE_FAULTS: {}", self.0)
    }
}

impl std::error::Error for FaultsError {}

impl Faults {
    /// Whether any fault is configured.
    pub fn any(&self) -> bool {
        self.loss > 0.0 || self.dup > 0.0 || self.reorder > 0.0 || self.corrupt > 0.0
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
            if !(0.0..=1.0).contains(&p) {
                return Err(FaultsError(format!("{key}={p} is not a probability in 0..=1")));
            }
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
        Ok(f)
    }
}

/// What happens to one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fate {
    pub(crate) drop: bool,
    pub(crate) dup: bool,
    pub(crate) hold: bool,
    /// Bit to flip, if any.
    pub(crate) flip: Option<usize>,
}

/// The fault draws of one device: the simulator's seeded generator, so a seed reproduces a
/// run's faults as it does the simulator's.
#[derive(Debug, Clone)]
pub(crate) struct FaultRng(uroce_engine::seeded::Rng);

impl FaultRng {
    pub(crate) const fn new(seed: u64) -> Self {
        Self(uroce_engine::seeded::Rng::new(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn chance(&mut self, p: f64) -> bool {
        self.0.gen_bool(p)
    }

    pub(crate) fn fate(&mut self, f: &Faults, len: usize) -> Fate {
        let drop = self.chance(f.loss);
        let flip = (self.chance(f.corrupt) && len > 0)
            .then(|| usize::try_from(self.next() % (len as u64 * 8)).unwrap_or(0));
        Fate { drop, dup: self.chance(f.dup), hold: self.chance(f.reorder), flip }
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
        assert!(Faults::parse("lose=0.1").unwrap_err().0.contains("unknown fault"));
        assert!(Faults::parse("loss").unwrap_err().0.contains("NAME=PROBABILITY"));
    }

    #[test]
    fn draws_about_the_configured_fraction() {
        let mut rng = FaultRng::new(1);
        let f = Faults { loss: 0.1, ..Faults::default() };
        let lost = (0..100_000).filter(|_| rng.fate(&f, 100).drop).count();
        assert!((9_000..11_000).contains(&lost), "{lost}");
    }
}
