//! The terminal approver's input: only a line that is exactly one offered key answers.
#![no_main]
use libfuzzer_sys::fuzz_target;

const KEYS: [(char, &str); 3] = [('a', "allow once"), ('s', "allow for this run"), ('d', "deny")];

fuzz_target!(|data: &[u8]| {
    let line = String::from_utf8_lossy(data);
    let picked = postern_engine::approval::pick(&line, &KEYS);
    let trimmed = line.trim().to_ascii_lowercase();
    match picked {
        Some((k, _)) => assert_eq!(trimmed, k.to_string()),
        None => assert!(!KEYS.iter().any(|(k, _)| trimmed == k.to_string())),
    }
});
