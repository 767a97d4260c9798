//! RFC 8785 (JSON Canonicalization Scheme) bytes: the only form of an action that is ever hashed.
//!
//! Serialisation is delegated to the `serde_json_canonicalizer` crate (keys sorted by UTF-16 code
//! units, numbers formatted the ECMAScript way via `ryu-js`). `canon-json` was tried first and
//! fails RFC 8785 Appendix B (it prints `1424953923781206.3` for `0x43143ff3c1cb0959`, where
//! ECMAScript prints `…206.2`); the Appendix B test below keeps that from regressing.
//! Postern adds one rule on top:
//! JCS numbers are IEEE-754 doubles, so an integer whose magnitude exceeds 2^53 − 1 cannot be
//! represented without silently changing its value. Such integers are **rejected** with
//! [`CanonicalError::IntegerOutOfRange`] naming the JSON path; they are not carried as strings,
//! because `123` and `"123"` are different requests and must not share a fingerprint.

use crate::ErrorCode;
use serde::Serialize;
use serde_json::Value;

/// The largest integer magnitude a JSON number can carry exactly (I-JSON, RFC 7493 §2.2).
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanonicalError {
    #[error(
        "number at {path} is an integer (or a decimal that stands for one) beyond ±(2^53 − 1) and \
         cannot be canonicalised without losing precision; send it as a string if the target accepts one"
    )]
    IntegerOutOfRange { path: String },
    #[error("value could not be canonicalised: {0}")]
    Serialise(String),
}

impl ErrorCode for CanonicalError {
    fn code(&self) -> &'static str {
        match self {
            CanonicalError::IntegerOutOfRange { .. } => "integer_out_of_range",
            CanonicalError::Serialise(_) => "canonicalisation_failed",
        }
    }
}

/// Checks every number in `value` is representable as a double without loss.
/// `path` is the JSON Pointer of `value` inside the document being canonicalised.
pub fn check_numbers(value: &Value, path: &mut String) -> Result<(), CanonicalError> {
    match value {
        Value::Number(n) => {
            if is_unsafe(n) {
                return Err(CanonicalError::IntegerOutOfRange {
                    path: if path.is_empty() { "/".into() } else { path.clone() },
                });
            }
            Ok(())
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push('/');
                path.push_str(&i.to_string());
                check_numbers(item, path)?;
                path.truncate(len);
            }
            Ok(())
        }
        Value::Object(map) => {
            for (key, item) in map {
                let len = path.len();
                path.push('/');
                // RFC 6901 escaping so the path names the member unambiguously.
                path.push_str(&key.replace('~', "~0").replace('/', "~1"));
                check_numbers(item, path)?;
                path.truncate(len);
            }
            Ok(())
        }
        Value::Null | Value::Bool(_) | Value::String(_) => Ok(()),
    }
}

/// Whether `n` cannot be canonicalised without losing digits: an integer beyond ±(2^53 − 1), or
/// a double that JCS writes as such an integer.
fn is_unsafe(n: &serde_json::Number) -> bool {
    match (n.as_u64(), n.as_i64()) {
        (Some(u), _) => u > MAX_SAFE_INTEGER,
        (None, Some(i)) => i.unsigned_abs() > MAX_SAFE_INTEGER,
        // A double: finite by construction in serde_json, and exactly what JCS formats — as an
        // integer literal between 2^53 and 10^21 (ECMAScript switches to exponent form only
        // there), which would be an unsafe integer once read back. Such a double has already
        // lost its digits (`3333333333333333333.3` is sent as `3333333333333333500`): refused
        // like the integer it stands for. Found by the `canonical` fuzz target (canonical bytes
        // were not a fixed point).
        (None, None) => n.as_f64().is_some_and(|f| f.abs() > MAX_SAFE_INTEGER as f64 && f.abs() < 1e21),
    }
}

/// A copy of `value` in which every integer beyond ±(2^53 − 1) is replaced by its exact decimal
/// string. Only for *evidence* that must be recorded whatever the client sent (e.g. a JSON-RPC
/// id); never for anything that is fingerprinted, where `123` and `"123"` must stay different.
pub fn with_unsafe_integers_as_strings(value: &Value) -> Value {
    match value {
        // (and every double JCS would write as one: its text as serde_json parsed it)
        Value::Number(n) if is_unsafe(n) => Value::String(n.to_string()),
        Value::Array(items) => Value::Array(items.iter().map(with_unsafe_integers_as_strings).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), with_unsafe_integers_as_strings(v))).collect())
        }
        other => other.clone(),
    }
}

/// RFC 8785 canonical bytes of `value`, after checking no number would lose precision.
pub fn canonical_bytes(value: &Value) -> Result<Vec<u8>, CanonicalError> {
    check_numbers(value, &mut String::new())?;
    canonical_bytes_unchecked(value)
}

/// Canonical bytes of `value` without first copying it into a `serde_json::Value`; `free_form`
/// is the part of it that can carry arbitrary numbers (checked in place), the rest being
/// numbers Postern made itself (sequence numbers, millisecond times).
pub fn canonical_bytes_checking<T: Serialize>(value: &T, free_form: &Value) -> Result<Vec<u8>, CanonicalError> {
    check_numbers(free_form, &mut String::new())?;
    canonical_bytes_unchecked(value)
}

fn canonical_bytes_unchecked<T: Serialize>(value: &T) -> Result<Vec<u8>, CanonicalError> {
    serde_json_canonicalizer::to_vec(value).map_err(|e| CanonicalError::Serialise(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon_text(input: &str) -> String {
        let v: Value = serde_json::from_str(input).expect("test input is JSON");
        String::from_utf8(canonical_bytes(&v).expect("canonicalises")).expect("utf-8")
    }

    /// Fuzz find (`fuzz/corpus/canonical`): a decimal beyond 2^53 is formatted by JCS as an
    /// integer literal that is itself out of range, so canonical bytes were not a fixed point.
    #[test]
    fn a_decimal_that_formats_as_an_unsafe_integer_is_refused() {
        let v: Value = serde_json::from_str("{\"n\":3333333333333333333.331333333333336333333333}").expect("json");
        assert_eq!(canonical_bytes(&v), Err(CanonicalError::IntegerOutOfRange { path: "/n".into() }));
        for fine in ["9007199254740991.0", "1e21", "1.5e300", "-0.5", "4503599627370495.5"] {
            let v: Value = serde_json::from_str(fine).expect("json");
            let bytes = canonical_bytes(&v).unwrap_or_else(|e| panic!("{fine}: {e}"));
            let again: Value = serde_json::from_slice(&bytes).expect("json");
            assert_eq!(canonical_bytes(&again).as_deref(), Ok(bytes.as_slice()), "{fine}");
        }
    }

    /// RFC 8785 §3.2.2: the "Sample Input" and its canonical output.
    #[test]
    fn rfc8785_sample_input() {
        let input = r#"{
          "numbers": [333333333.33333329, 1E30, 4.50,
                      2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        let expected = "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],\"string\":\"€$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}";
        assert_eq!(canon_text(input), expected);
    }

    /// RFC 8785 §3.2.3: property sorting by UTF-16 code units (not UTF-8 bytes, not code points).
    #[test]
    fn rfc8785_property_sorting() {
        let input = r#"{
          "\u20ac": "Euro Sign",
          "\r": "Carriage Return",
          "\ufb33": "Hebrew Letter Dalet With Dagesh",
          "1": "One",
          "\ud83d\ude00": "Emoji: Grinning Face",
          "\u0080": "Control",
          "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        let expected = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}";
        assert_eq!(canon_text(input), expected);
    }

    /// RFC 8785 Appendix B: IEEE-754 bit patterns and their ECMAScript serialisation.
    /// (Each expected string was also checked against Node.js `String(number)`.)
    #[test]
    fn rfc8785_appendix_b_numbers() {
        let table: &[(u64, &str)] = &[
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ];
        for &(bits, expected) in table {
            let n = serde_json::Number::from_f64(f64::from_bits(bits)).expect("finite");
            // The serializer's formatting (Postern's range rule would refuse some of these).
            let got = String::from_utf8(canonical_bytes_unchecked(&Value::Number(n)).expect("ok")).expect("utf-8");
            assert_eq!(got, expected, "bits {bits:#018x}");
        }
    }

    #[test]
    fn nan_and_infinity_cannot_even_be_represented() {
        // RFC 8785 Appendix B lists NaN and Infinity as errors; serde_json refuses to build them.
        assert!(serde_json::Number::from_f64(f64::NAN).is_none());
        assert!(serde_json::Number::from_f64(f64::INFINITY).is_none());
    }

    #[test]
    fn integers_beyond_2_pow_53_are_rejected_with_their_path() {
        assert_eq!(canon_text("9007199254740991"), "9007199254740991");
        assert_eq!(canon_text("-9007199254740991"), "-9007199254740991");
        let err = canonical_bytes(&json!({"a": [1, {"b~/c": 9007199254740993u64}]})).unwrap_err();
        assert_eq!(err, CanonicalError::IntegerOutOfRange { path: "/a/1/b~0~1c".into() });
        assert_eq!(err.code(), "integer_out_of_range");
        let neg = canonical_bytes(&json!(-9007199254740992i64)).unwrap_err();
        assert_eq!(neg, CanonicalError::IntegerOutOfRange { path: "/".into() });
        // 1e20 is exact in IEEE-754, but JCS writes it as the integer literal
        // 100000000000000000000, which a reader takes for an unsafe integer: refused too, so
        // canonical bytes always canonicalize to themselves. From 1e21 JCS uses exponent form.
        assert_eq!(canonical_bytes(&json!(1e20)), Err(CanonicalError::IntegerOutOfRange { path: "/".into() }));
        assert_eq!(canon_text("1e21"), "1e+21");
    }

    #[test]
    fn evidence_keeps_huge_integers_exactly_as_strings() {
        let v = json!({"jsonrpc_id": 9007199254740993u64, "n": [-9007199254740995i64, 5]});
        let safe = with_unsafe_integers_as_strings(&v);
        assert_eq!(safe, json!({"jsonrpc_id": "9007199254740993", "n": ["-9007199254740995", 5]}));
        assert!(canonical_bytes(&safe).is_ok());
        // Fuzz find: a 20-digit id is a double to serde_json; it is evidence too, never a refusal.
        let v: Value = serde_json::from_str(r#"{"jsonrpc_id": 33333331666663333333}"#).expect("json");
        let safe = with_unsafe_integers_as_strings(&v);
        assert!(safe["jsonrpc_id"].is_string(), "{safe}");
        assert!(canonical_bytes(&safe).is_ok());
    }

    #[test]
    fn integer_and_float_spellings_of_one_number_agree() {
        assert_eq!(canon_text(r#"{"a":1.0}"#), canon_text(r#"{"a":1}"#));
        assert_eq!(canon_text(r#"{"a":1e2}"#), r#"{"a":100}"#);
    }
}
