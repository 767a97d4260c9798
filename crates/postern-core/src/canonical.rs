//! RFC 8785 (JSON Canonicalization Scheme) bytes: the only form of an action that is ever hashed.
//!
//! The bytes are written here, straight from a `serde_json::Value`: members sorted by UTF-16 code
//! units (skipping the sort when the map already iterates in that order, as it does for ASCII
//! keys), strings escaped as serde_json escapes them (which is RFC 8785's rule), integers as
//! decimals and other numbers the ECMAScript way via `ryu-js`. The `serde_json_canonicalizer`
//! crate is the oracle: a property test requires byte-identical output on hostile input (control
//! characters, keys either side of the surrogate range, every double). It was the serialiser until
//! the journal writer's profile showed it at a third of the writer's time (it buffers and sorts
//! every member of every object). `canon-json` was tried before it and fails RFC 8785 Appendix B
//! (it prints `1424953923781206.3` for `0x43143ff3c1cb0959`, where ECMAScript prints `…206.2`);
//! the Appendix B test below keeps that from regressing.
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
    let mut out = Vec::with_capacity(256);
    write_canonical(value, &mut out)?;
    Ok(out)
}

/// Canonical bytes of any serialisable `value` (through a `serde_json::Value`).
pub fn canonical_bytes_of<T: Serialize>(value: &T) -> Result<Vec<u8>, CanonicalError> {
    let value = serde_json::to_value(value).map_err(|e| CanonicalError::Serialise(e.to_string()))?;
    canonical_bytes(&value)
}

/// Appends the canonical bytes of `value` to `out`, refusing (with the JSON path) any number that
/// would lose precision. On error `out` holds a partial document and must be discarded.
pub fn write_canonical(value: &Value, out: &mut Vec<u8>) -> Result<(), CanonicalError> {
    write_value(value, out).map_err(|UnsafeNumber| {
        let mut path = String::new();
        match check_numbers(value, &mut path) {
            Err(e) => e,
            // Unreachable: `write_value` refuses exactly what `check_numbers` refuses.
            Ok(()) => CanonicalError::IntegerOutOfRange { path: "/".into() },
        }
    })
}

/// A string in its canonical form: RFC 8785 escapes `"`, `\\` and the C0 controls (`\b \t \n \f \r`
/// by name, the rest as `\u00xx` in lower case) and nothing else, exactly what serde_json writes.
pub fn write_canonical_str(s: &str, out: &mut Vec<u8>) {
    serde_json::to_writer(&mut *out, s).expect("writing to a Vec cannot fail");
}

/// A number [`write_canonical`] refuses; the caller finds its path (only on this rare path).
struct UnsafeNumber;

fn write_value(value: &Value, out: &mut Vec<u8>) -> Result<(), UnsafeNumber> {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(n, out)?,
        Value::String(s) => write_canonical_str(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out)?;
            }
            out.push(b']');
        }
        Value::Object(map) => {
            out.push(b'{');
            let in_order = map.keys().zip(map.keys().skip(1)).all(|(a, b)| utf16_order(a, b).is_lt());
            if in_order {
                write_members(map.iter(), out)?;
            } else {
                let mut members: Vec<(&String, &Value)> = map.iter().collect();
                members.sort_unstable_by(|a, b| utf16_order(a.0, b.0));
                write_members(members.into_iter(), out)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

fn write_members<'a>(
    members: impl Iterator<Item = (&'a String, &'a Value)>,
    out: &mut Vec<u8>,
) -> Result<(), UnsafeNumber> {
    for (i, (key, item)) in members.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_canonical_str(key, out);
        out.push(b':');
        write_value(item, out)?;
    }
    Ok(())
}

/// RFC 8785 §3.2.3 member order: by UTF-16 code units. For ASCII keys that is byte order.
fn utf16_order(a: &str, b: &str) -> std::cmp::Ordering {
    if a.is_ascii() && b.is_ascii() { a.as_bytes().cmp(b.as_bytes()) } else { a.encode_utf16().cmp(b.encode_utf16()) }
}

fn write_number(n: &serde_json::Number, out: &mut Vec<u8>) -> Result<(), UnsafeNumber> {
    if is_unsafe(n) {
        return Err(UnsafeNumber);
    }
    if n.is_u64() || n.is_i64() {
        // In ±(2^53 − 1): ECMAScript prints these exactly as decimal integers.
        serde_json::to_writer(&mut *out, n).expect("writing to a Vec cannot fail");
    } else {
        write_float(n.as_f64().expect("a serde_json number that is not an integer is a double"), out);
    }
    Ok(())
}

/// The one value a JSON text (a request body an agent wrote out itself) stands for, when every
/// reader of the text sees that value and nothing else; `None` when the text must be taken byte
/// for byte. Models write the same body with other spacing or key order when they retry, so the
/// value, not the spelling, is the intent. A text qualifies when it is an object or an array, no
/// object in it repeats a member name (readers disagree on which one wins), and every number in
/// it reads the same in any parser: an integer within ±(2^53 − 1), or a decimal of at most 15
/// significant digits in a double's normal range (or zero). `1.0` and `1` are one value here, as
/// in RFC 8785; `0.10000000000000000001` and `0.1` would be too once read as doubles, so a
/// number like that keeps its text byte for byte.
pub fn json_text(text: &str) -> Option<Value> {
    let Strict(value) = serde_json::from_str(text).ok()?;
    if !matches!(value, Value::Object(_) | Value::Array(_)) || !numbers_read_alike(text) {
        return None;
    }
    check_numbers(&value, &mut String::new()).ok()?;
    Some(value)
}

/// A `Value` whose objects never repeat a member name (deserialising fails if one does).
struct Strict(Value);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Strict;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_bool<E>(self, v: bool) -> Result<Strict, E> {
                Ok(Strict(Value::Bool(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Strict, E> {
                Ok(Strict(Value::from(v)))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Strict, E> {
                Ok(Strict(Value::from(v)))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Strict, E> {
                serde_json::Number::from_f64(v)
                    .map(|n| Strict(Value::Number(n)))
                    .ok_or_else(|| E::custom("not a finite number"))
            }
            fn visit_str<E>(self, v: &str) -> Result<Strict, E> {
                Ok(Strict(Value::String(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Strict, E> {
                Ok(Strict(Value::String(v)))
            }
            fn visit_unit<E>(self) -> Result<Strict, E> {
                Ok(Strict(Value::Null))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
                let mut items = Vec::new();
                while let Some(Strict(item)) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Strict(Value::Array(items)))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
                let mut members = serde_json::Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    let Strict(item) = map.next_value()?;
                    if members.insert(key, item).is_some() {
                        return Err(serde::de::Error::custom("a member name is repeated"));
                    }
                }
                Ok(Strict(Value::Object(members)))
            }
        }
        deserializer.deserialize_any(Visit)
    }
}

/// Whether every number literal in `text` (valid JSON) names its double exactly enough that no
/// two different literals of different values meet (see [`json_text`]).
fn numbers_read_alike(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'"' => {
                i += 1;
                while let Some(&c) = bytes.get(i) {
                    i += if c == b'\\' { 2 } else { 1 };
                    if c == b'"' {
                        break;
                    }
                }
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while bytes.get(i).is_some_and(|c| matches!(c, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')) {
                    i += 1;
                }
                if !number_reads_alike(&text[start..i]) {
                    return false;
                }
            }
            _ => i += 1,
        }
    }
    true
}

fn number_reads_alike(literal: &str) -> bool {
    if let Ok(integer) = literal.parse::<i64>() {
        return integer.unsigned_abs() <= MAX_SAFE_INTEGER;
    }
    if !literal.contains(['.', 'e', 'E']) {
        return false; // an integer beyond i64: readers with big integers see its every digit
    }
    let mantissa = literal.split(['e', 'E']).next().unwrap_or("");
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let significant = digits.trim_start_matches('0').trim_end_matches('0');
    if significant.is_empty() {
        return true; // zero, however it is written
    }
    significant.len() <= 15 && literal.parse::<f64>().is_ok_and(f64::is_normal)
}

/// A finite double as ECMAScript's `Number.prototype.toString` prints it (RFC 8785 §3.2.2.3).
fn write_float(f: f64, out: &mut Vec<u8>) {
    out.extend_from_slice(ryu_js::Buffer::new().format_finite(f).as_bytes());
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
            // The serializer's formatting (Postern's range rule would refuse some of these).
            let mut out = Vec::new();
            write_float(f64::from_bits(bits), &mut out);
            let got = String::from_utf8(out).expect("utf-8");
            assert_eq!(got, expected, "bits {bits:#018x}");
        }
    }

    /// Any JSON an agent can send, with the corners RFC 8785 is strict about: every C0 control
    /// and DEL in strings, keys either side of the surrogate range (UTF-16 order puts U+10000
    /// before U+E000, code-point order after), every finite double.
    fn hostile_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let text = prop_oneof![
            any::<String>(),
            "[\\x00-\\x1f\\x7f\"\\\\/a]{0,6}",
            "[\\u{d7ff}\\u{e000}\\u{ffff}\\u{10000}\\u{10ffff}a]{0,4}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_filter_map("finite", serde_json::Number::from_f64).prop_map(Value::Number),
            text.clone().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((text.clone(), inner), 0..8).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]
        /// The `serde_json_canonicalizer` crate is the oracle: byte-identical output, or (only
        /// where Postern's range rule refuses a number) a refusal naming where.
        #[test]
        fn the_writer_agrees_with_an_independent_rfc8785_implementation(v in hostile_value()) {
            let oracle = serde_json_canonicalizer::to_vec(&v).expect("the oracle canonicalises");
            match canonical_bytes(&v) {
                Ok(ours) => proptest::prop_assert_eq!(String::from_utf8(ours).unwrap(), String::from_utf8(oracle).unwrap()),
                Err(CanonicalError::IntegerOutOfRange { path }) => {
                    proptest::prop_assert!(check_numbers(&v, &mut String::new()).is_err(), "refused at {} but in range", path);
                }
                Err(e) => proptest::prop_assert!(false, "{e}"),
            }
        }
    }

    #[test]
    fn a_json_text_stands_for_its_value_only_when_every_reader_agrees() {
        let five = canonical_bytes(&json!({"amount": 5})).unwrap();
        for text in ["{\"amount\": 5}", "{\"amount\":5}", " {\n  \"amount\" : 5.0 }\t", "{\"amount\":5e0}"] {
            assert_eq!(json_text(text).map(|v| canonical_bytes(&v).unwrap()), Some(five.clone()), "{text}");
        }
        assert_eq!(json_text(r#"{"b":[1,{"c":"x\"}"}],"a":null}"#), Some(json!({"a": null, "b": [1, {"c": "x\"}"}]})));
        for byte_for_byte in [
            r#"{"amount":5,"amount":6}"#,           // which one wins depends on the reader
            r#"[{"a":1,"a":1}]"#,                   // even when the repeats agree
            r#"{"amount":0.10000000000000000001}"#, // a double would make it 0.1
            r#"{"id":12345678901234567}"#,          // beyond 2^53
            r#"{"tiny":1e-320}"#,                   // a subnormal double has fewer digits
            "\"{\\\"amount\\\":5}\"",               // a JSON string, not an object
            "5",
            "null",
            "{\"amount\": 5", // not JSON at all
            "amount=5",
        ] {
            assert_eq!(json_text(byte_for_byte), None, "{byte_for_byte}");
        }
        assert_eq!(
            json_text(r#"{"n":1.5,"z":-0.0,"e":"1e999 in a string"}"#),
            Some(json!({"n": 1.5, "z": -0.0, "e": "1e999 in a string"}))
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1024))]
        /// However a value is spelled (compact, pretty, keys in another order), a text that
        /// qualifies stands for the value serde_json reads from it, and its canonical bytes are
        /// those of every other spelling.
        #[test]
        fn every_spelling_of_a_body_is_one_intent(v in hostile_value()) {
            let compact = serde_json::to_string(&v).unwrap();
            let pretty = serde_json::to_string_pretty(&v).unwrap();
            let reversed = reversed_keys(&v);
            let first = json_text(&compact);
            if let Some(value) = &first {
                let read: Value = serde_json::from_str(&compact).unwrap();
                proptest::prop_assert_eq!(value, &read);
                proptest::prop_assert!(matches!(value, Value::Object(_) | Value::Array(_)));
            }
            let bytes = |t: &str| json_text(t).map(|v| canonical_bytes(&v).unwrap());
            proptest::prop_assert_eq!(bytes(&compact), bytes(&pretty));
            proptest::prop_assert_eq!(bytes(&compact), bytes(&reversed));
        }

        /// Arbitrary text, including JSON cut anywhere, never panics the scanner.
        #[test]
        fn any_text_is_judged_without_panicking(v in hostile_value(), cut in 0usize..200, noise in ".{0,40}") {
            let text = serde_json::to_string(&v).unwrap();
            let cut = text.char_indices().map(|(i, _)| i).nth(cut).unwrap_or(text.len());
            let _ = json_text(&text[..cut]);
            let _ = json_text(&noise);
            let _ = json_text(&format!("[{noise}]"));
        }
    }

    /// `value` written with every object's members in reverse order.
    fn reversed_keys(value: &Value) -> String {
        match value {
            Value::Object(map) => {
                let members: Vec<String> = map
                    .iter()
                    .rev()
                    .map(|(k, v)| format!("{} : {}", serde_json::to_string(k).unwrap(), reversed_keys(v)))
                    .collect();
                format!("{{ {} }}", members.join(" , "))
            }
            Value::Array(items) => format!("[{}]", items.iter().map(reversed_keys).collect::<Vec<_>>().join(", ")),
            other => other.to_string(),
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
