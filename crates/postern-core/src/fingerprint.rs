//! The intent fingerprint: a keyed digest of the canonical action record (docs/src/design.md, the action record).
//!
//! A plain hash of a record that contains low-entropy values would turn the journal into a
//! guessing oracle, so the digest is an HMAC under a per-installation key that lives in the OS
//! keychain. Two sub-keys are derived from that key with distinct labels, one for fingerprints
//! and one for digests of secret arguments, so one can never be confused with the other.

use crate::ErrorCode;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::Sha256;
use std::{fmt, str::FromStr};

type HmacSha256 = Hmac<Sha256>;

const FINGERPRINT_LABEL: &[u8] = b"postern/v1/intent-fingerprint";
const SECRET_ARGUMENT_LABEL: &[u8] = b"postern/v1/secret-argument";
const REQUEST_LABEL: &[u8] = b"postern/v1/request-as-sent";

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC accepts keys of any length; this cannot fail.
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// The installation's fingerprint key (32 random bytes from the keychain). Its `Debug` output is
/// redacted and it implements neither `Serialize` nor `Display`.
#[derive(Clone)]
pub struct FingerprintKey {
    fingerprint: [u8; 32],
    secret_argument: [u8; 32],
    request: [u8; 32],
}

impl FingerprintKey {
    pub fn from_bytes(master: [u8; 32]) -> Self {
        FingerprintKey {
            fingerprint: hmac(&master, &[FINGERPRINT_LABEL]),
            secret_argument: hmac(&master, &[SECRET_ARGUMENT_LABEL]),
            request: hmac(&master, &[REQUEST_LABEL]),
        }
    }

    /// HMAC-SHA256 over canonical record bytes.
    pub fn fingerprint(&self, canonical: &[u8]) -> Fingerprint {
        Fingerprint(hmac(&self.fingerprint, &[canonical]))
    }

    /// The keyed digest of a request exactly as it went out (before its credential is added): a
    /// recovery re-send is made only if it would send these same bytes. Keyed, so a digest in
    /// the journal cannot be used to guess a secret the request held.
    pub fn request_digest(&self, canonical_request: &[u8]) -> String {
        format!("hmac-sha256:{}", hex::encode(hmac(&self.request, &[canonical_request])))
    }

    /// The keyed digest that replaces an argument a contract marks secret.
    pub fn secret_digest(&self, canonical_value: &[u8]) -> String {
        format!("hmac-sha256:{}", hex::encode(hmac(&self.secret_argument, &[canonical_value])))
    }
}

impl fmt::Debug for FingerprintKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FingerprintKey(<redacted>)")
    }
}

/// `hmac-sha256:<64 hex digits>`: identifies the requested *effect*, not one delivery of it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub const PREFIX: &'static str = "hmac-sha256:";

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", Self::PREFIX, hex::encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("fingerprint must look like hmac-sha256:<64 lower-case hex digits>")]
pub struct FingerprintParseError;

impl ErrorCode for FingerprintParseError {
    fn code(&self) -> &'static str {
        "invalid_fingerprint"
    }
}

impl FromStr for Fingerprint {
    type Err = FingerprintParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex_part = s.strip_prefix(Self::PREFIX).ok_or(FingerprintParseError)?;
        if hex_part.len() != 64 || hex_part.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(FingerprintParseError);
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut out).map_err(|_| FingerprintParseError)?;
        Ok(Fingerprint(out))
    }
}

impl Serialize for Fingerprint {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Fingerprint {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_is_hmac_under_a_derived_key_and_round_trips() {
        let key = FingerprintKey::from_bytes([7; 32]);
        let fp = key.fingerprint(br#"{"a":1}"#);
        let shown = fp.to_string();
        assert!(shown.starts_with("hmac-sha256:"));
        assert_eq!(shown.len(), "hmac-sha256:".len() + 64);
        assert_eq!(shown.parse::<Fingerprint>().expect("parses"), fp);
        // A different installation key gives a different fingerprint for the same record.
        assert_ne!(FingerprintKey::from_bytes([8; 32]).fingerprint(br#"{"a":1}"#), fp);
        // The fingerprint and the secret digest of the same bytes are unrelated values.
        assert_ne!(key.secret_digest(br#"{"a":1}"#), shown);
    }

    #[test]
    fn fingerprint_matches_an_independent_hmac_computation() {
        // HMAC-SHA256(key = HMAC-SHA256(master, label), message): recomputed here with the
        // RFC 4231 test case 2 primitives to pin the construction.
        let rfc4231 = hmac(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(hex::encode(rfc4231), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    #[test]
    fn debug_of_the_key_is_redacted() {
        let key = FingerprintKey::from_bytes([0xAB; 32]);
        let dbg = format!("{key:?}");
        assert_eq!(dbg, "FingerprintKey(<redacted>)");
        assert!(!dbg.to_lowercase().contains("ab"));
    }

    #[test]
    fn malformed_fingerprints_are_rejected() {
        let good = FingerprintKey::from_bytes([1; 32]).fingerprint(b"x").to_string();
        assert!(good.to_uppercase().parse::<Fingerprint>().is_err());
        assert!(good.replace("hmac-sha256:", "sha256:").parse::<Fingerprint>().is_err());
        assert!(good[..good.len() - 1].parse::<Fingerprint>().is_err());
        assert!(format!("{}zz", &good[..good.len() - 2]).parse::<Fingerprint>().is_err());
    }
}
