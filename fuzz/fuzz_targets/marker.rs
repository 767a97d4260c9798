//! The SSH marker probe's answer comes from a remote host: any line parses or is refused.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = postern_engine::channel::ssh::parse_marker(&String::from_utf8_lossy(data));
});
