//! How an execution reaches its target: HTTP (with the vault's credential injected and the
//! target rules checked), SSH (a pinned host key, a marker that proves whether a command ran,
//! a pool of sessions) and upstream MCP servers (their processes or remote URLs, and the
//! catalogue of what they offer). A channel sends what the engine hands it and says what came
//! back; it decides nothing about retries.

pub mod http;
pub mod oauth;
pub mod ssh;
pub mod ssh_pool;
pub mod upstream;
