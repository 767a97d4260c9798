//! Integration tests of the engine: real HTTP targets on 127.0.0.1, a fault-injecting TCP proxy,
//! a real SQLite journal and the real OS keychain (run through scripts/test.sh).

#![allow(clippy::unwrap_used)]

mod builtin;
mod faults;
mod ladder;
mod ssh;
mod support;
