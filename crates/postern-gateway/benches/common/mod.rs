//! What the gateway benches share: latency figures and an engine over a fresh journal.

#![allow(dead_code)] // each bench uses its own subset

use postern_core::Timestamp;
use postern_gateway::{Engine, LockOnlyApprover, Manifest};
use postern_store::Store;
use postern_vault::MemoryKeychain;
use std::{sync::Arc, time::Duration};

pub struct Figures {
    pub p50: Duration,
    pub p99: Duration,
    pub per_sec: f64,
}

/// p50/p99 of `latencies` and the throughput over `wall`.
pub fn figures(mut latencies: Vec<Duration>, wall: Duration) -> Figures {
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q) as usize];
    Figures { p50: at(0.50), p99: at(0.99), per_sec: latencies.len() as f64 / wall.as_secs_f64() }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A host (a fresh journal in a temporary directory, an in-memory keychain), put together the
/// way `postern serve` is.
pub fn host(config: postern_host::HostConfig) -> postern_host::Host {
    postern_host::Host::open_with(config, Arc::new(MemoryKeychain::default()), Timestamp::from_millis(1)).expect("host")
}

/// An engine with `manifest` over a fresh journal in a temporary directory (in-memory keychain).
pub fn engine(manifest: &str) -> (tempfile::TempDir, Arc<Store>, Arc<Engine>) {
    let manifest = Manifest::parse(manifest, std::path::Path::new("bench.toml")).expect("manifest");
    let dir = tempfile::tempdir().expect("tempdir");
    let host = host(postern_host::HostConfig::new(dir.path().to_owned()));
    let engine = host.engine(manifest, Arc::new(LockOnlyApprover)).expect("engine");
    (dir, Arc::clone(&host.store), engine)
}
