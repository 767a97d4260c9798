//! A client sends back any `Last-Event-ID`: it parses to nothing, or to a token whose event ID is
//! exactly what was sent (one spelling per request).
#![no_main]
use libfuzzer_sys::fuzz_target;
use postern_gateway::door::resumption::ResumeToken;

fuzz_target!(|data: &[u8]| {
    let raw = String::from_utf8_lossy(data);
    if let Some(token) = ResumeToken::parse(&raw) {
        assert_eq!(token.event_id(), raw);
    }
});
