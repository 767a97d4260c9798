//! What the gateway benches share: latency figures and an engine over a fresh journal.

#![allow(dead_code)] // each bench uses its own subset

use postern_core::Timestamp;
use postern_gateway::{Engine, LockOnlyApprover, Manifest, engine::system_clock};
use postern_store::Store;
use postern_vault::{MemoryKeychain, Vault};
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

/// An engine with `manifest` over a fresh journal in a temporary directory (in-memory keychain).
pub fn engine(manifest: &str) -> (tempfile::TempDir, Arc<Store>, Arc<Engine>) {
    let manifest = Manifest::parse(manifest, std::path::Path::new("bench.toml")).expect("manifest");
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(&dir.path().join("postern.db"), Timestamp::from_millis(1)).expect("store");
    let store = Arc::new(store);
    let vault = Arc::new(
        Vault::open(Arc::clone(&store), Arc::new(MemoryKeychain::default()), Timestamp::from_millis(2)).expect("vault"),
    );
    let engine = Engine::new(Arc::clone(&store), vault, Arc::new(manifest), Arc::new(LockOnlyApprover), system_clock())
        .expect("engine");
    (dir, store, Arc::new(engine))
}
