//! Wall-clock instants as plain values, so the core can reason about time without reading a clock.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Milliseconds since the Unix epoch (UTC). The caller reads the clock; the core only compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(i64);

impl Timestamp {
    pub const fn from_millis(ms: i64) -> Self {
        Timestamp(ms)
    }

    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// Milliseconds elapsed from `earlier` to `self`, clamped at zero when the clock went backwards
    /// (a prior execution accepted "in the future" counts as just accepted).
    pub fn millis_since(self, earlier: Timestamp) -> u64 {
        u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0)
    }

    pub fn saturating_add_millis(self, ms: u64) -> Self {
        Timestamp(self.0.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX)))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// The wall clock, as a parameter: the crates that need the time are handed one (the shells
/// hand them `postern_engine::engine::system_clock`), so tests can move it and the core reads
/// none.
pub type Clock = std::sync::Arc<dyn Fn() -> Timestamp + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elapsed_is_clamped_when_clock_goes_backwards() {
        let later = Timestamp::from_millis(1_000);
        let earlier = Timestamp::from_millis(400);
        assert_eq!(later.millis_since(earlier), 600);
        assert_eq!(earlier.millis_since(later), 0);
    }
}
