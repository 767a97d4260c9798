//! RFC 8785 canonicalization of arbitrary JSON (deep nesting, huge numbers, odd Unicode): never
//! panics, and canonical bytes are a fixed point (canonicalizing them again changes nothing).
#![no_main]
use libfuzzer_sys::fuzz_target;
use postern_core::canonical::{canonical_bytes, check_numbers, with_unsafe_integers_as_strings};

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    let _ = check_numbers(&value, &mut String::new());
    let safe = with_unsafe_integers_as_strings(&value);
    assert!(check_numbers(&safe, &mut String::new()).is_ok(), "unsafe integers were left in {safe}");
    if let Ok(bytes) = canonical_bytes(&value) {
        let again: serde_json::Value = serde_json::from_slice(&bytes).expect("canonical bytes are JSON");
        assert_eq!(canonical_bytes(&again).expect("still canonicalizable"), bytes, "not a fixed point");
    }
});
