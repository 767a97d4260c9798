//! Postern's own identifiers: `act_<ULID>` for an accepted execution, `ses_<ULID>` for an agent run.
//!
//! These are never confused with the client's JSON-RPC `id` (protocol correlation, docs/src/design.md):
//! they are minted by Postern, sort by creation time, and have exactly one spelling.

use crate::{ErrorCode, time::Timestamp};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::{fmt, str::FromStr};
use ulid::Ulid;

/// Why a string is not a valid Postern identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("identifier {found:?} must start with {expected:?}")]
    WrongPrefix { expected: &'static str, found: String },
    #[error("identifier {found:?} must be {expected_len} characters long")]
    WrongLength { expected_len: usize, found: String },
    #[error("identifier {found:?} does not contain a valid ULID")]
    InvalidUlid { found: String },
    #[error("identifier {found:?} is not in canonical form (ULIDs are upper-case Crockford base32)")]
    NonCanonical { found: String },
}

impl ErrorCode for IdError {
    fn code(&self) -> &'static str {
        "invalid_identifier"
    }
}

/// Keep error messages bounded when somebody passes a megabyte as an id.
fn shown(s: &str) -> String {
    s.chars().take(64).collect()
}

fn parse_prefixed(s: &str, prefix: &'static str) -> Result<Ulid, IdError> {
    const ULID_LEN: usize = 26;
    let rest = s.strip_prefix(prefix).ok_or_else(|| IdError::WrongPrefix { expected: prefix, found: shown(s) })?;
    if rest.len() != ULID_LEN {
        return Err(IdError::WrongLength { expected_len: prefix.len() + ULID_LEN, found: shown(s) });
    }
    // 26 base32 digits carry 130 bits; a first digit above '7' would overflow the 128-bit ULID
    // (the `ulid` crate wraps it silently), so it is refused here.
    if !matches!(rest.as_bytes()[0], b'0'..=b'7') {
        return Err(IdError::InvalidUlid { found: shown(s) });
    }
    let ulid = Ulid::from_string(rest).map_err(|_| IdError::InvalidUlid { found: shown(s) })?;
    if ulid.to_string() != rest {
        return Err(IdError::NonCanonical { found: shown(s) });
    }
    Ok(ulid)
}

macro_rules! prefixed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Ulid);

        impl $name {
            pub const PREFIX: &'static str = $prefix;

            /// Builds an identifier from its creation time and 80 bits of caller-supplied randomness.
            pub fn from_parts(at: Timestamp, random: u128) -> Self {
                let ms = u64::try_from(at.as_millis()).unwrap_or(0);
                $name(Ulid::from_parts(ms, random))
            }

            /// When the identifier was minted (millisecond precision).
            pub fn timestamp(&self) -> Timestamp {
                Timestamp::from_millis(i64::try_from(self.0.timestamp_ms()).unwrap_or(i64::MAX))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}{}", Self::PREFIX, self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                parse_prefixed(s, Self::PREFIX).map($name)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

prefixed_id!(
    /// One accepted attempt to perform one action. Also the idempotency key sent to targets.
    ExecutionId,
    "act_"
);
prefixed_id!(
    /// One agent run (one agent process session); the default intent scope.
    SessionId,
    "ses_"
);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn display_has_prefix_and_fixed_length() {
        let id = ExecutionId::from_parts(Timestamp::from_millis(1_764_445_000_000), 42);
        let s = id.to_string();
        assert!(s.starts_with("act_"));
        assert_eq!(s.len(), 30);
        assert_eq!(id.timestamp(), Timestamp::from_millis(1_764_445_000_000));
    }

    #[test]
    fn malformed_ids_are_rejected_with_a_specific_reason() {
        let good = SessionId::from_parts(Timestamp::from_millis(5), 7).to_string();
        assert!(matches!(good.parse::<ExecutionId>(), Err(IdError::WrongPrefix { .. })));
        assert!(matches!("act_".parse::<ExecutionId>(), Err(IdError::WrongLength { .. })));
        assert!(matches!("act_01ARZ3NDEKTSV4RRFFQ69G5FA".parse::<ExecutionId>(), Err(IdError::WrongLength { .. })));
        // 'U' is not in Crockford base32.
        assert!(matches!("act_01ARZ3NDEKTSV4RRFFQ69G5FAU".parse::<ExecutionId>(), Err(IdError::InvalidUlid { .. })));
        // First character above '7' overflows 128 bits.
        assert!(matches!("act_81ARZ3NDEKTSV4RRFFQ69G5FAV".parse::<ExecutionId>(), Err(IdError::InvalidUlid { .. })));
        assert!(matches!("act_01arz3ndektsv4rrffq69g5fav".parse::<ExecutionId>(), Err(IdError::NonCanonical { .. })));
        assert!(matches!(" act_01ARZ3NDEKTSV4RRFFQ69G5FAV".parse::<ExecutionId>(), Err(IdError::WrongPrefix { .. })));
    }

    #[test]
    fn serde_uses_the_display_form() {
        let id: ExecutionId = "act_01ARZ3NDEKTSV4RRFFQ69G5FAV".parse().expect("valid");
        let json = serde_json::to_string(&id).expect("serialise");
        assert_eq!(json, "\"act_01ARZ3NDEKTSV4RRFFQ69G5FAV\"");
        let back: ExecutionId = serde_json::from_str(&json).expect("deserialise");
        assert_eq!(back, id);
        assert!(serde_json::from_str::<ExecutionId>("\"ses_01ARZ3NDEKTSV4RRFFQ69G5FAV\"").is_err());
    }

    proptest! {
        #[test]
        fn parse_display_round_trip(ms in 0i64..(1i64 << 48), random in any::<u128>()) {
            let id = ExecutionId::from_parts(Timestamp::from_millis(ms), random);
            let parsed: ExecutionId = id.to_string().parse().expect("own output parses");
            prop_assert_eq!(parsed, id);
            let sid = SessionId::from_parts(Timestamp::from_millis(ms), random);
            prop_assert_eq!(sid.to_string().parse::<SessionId>().expect("parses"), sid);
        }

        #[test]
        fn arbitrary_strings_never_panic(s in ".{0,40}") {
            let _ = s.parse::<ExecutionId>();
        }
    }
}
