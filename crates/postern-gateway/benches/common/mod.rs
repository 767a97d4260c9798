//! What the gateway benches share: latency figures and an engine over a fresh journal.

#![allow(dead_code)] // each bench uses its own subset

pub mod clients;

use postern_core::Timestamp;
use postern_engine::{Engine, LockOnlyApprover, Manifest};
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

/// `| 0.42x <base>, p50 +0.123 ms`: a row against its baseline.
pub fn versus(f: &Figures, base: &Figures, label: &str) -> String {
    format!("| {:.2}x {label}, p50 {:+.3} ms", f.per_sec / base.per_sec, ms(f.p50) - ms(base.p50))
}

/// The name of the bearer credential every bench tool uses, bound to 127.0.0.1.
pub const CREDENTIAL: &str = "bench-api";

/// A host (a fresh journal in a temporary directory) put together the way `postern serve` is,
/// with the OS keychain — a user's machine reads secrets from it — unless it cannot be reached
/// or `POSTERN_BENCH_KEYCHAIN=memory` (then an in-memory one, and the figures say so).
pub fn host(config: postern_host::HostConfig) -> postern_host::Host {
    let keychain: Arc<dyn postern_vault::SecretStore> =
        match (std::env::var("POSTERN_BENCH_KEYCHAIN").as_deref(), postern_vault::OsKeychain::connect()) {
            (Ok("memory"), _) => {
                println!("keychain: in memory (POSTERN_BENCH_KEYCHAIN=memory)");
                Arc::new(MemoryKeychain::default())
            }
            (_, Ok(os)) => {
                println!("keychain: the OS keychain (Secret Service)");
                Arc::new(os)
            }
            (_, Err(e)) => {
                println!(
                    "keychain: in memory — the OS keychain is not reachable ({e}); run under scripts/test.sh's setup"
                );
                Arc::new(MemoryKeychain::default())
            }
        };
    let host = postern_host::Host::open_with(config, keychain, Timestamp::from_millis(1)).expect("host");
    let credential = postern_vault::Credential {
        name: CREDENTIAL.into(),
        kind: postern_vault::CredentialKind::Bearer,
        bindings: vec![postern_vault::Binding::new("127.0.0.1", None).expect("binding")],
        approve_every_use: false,
        idempotency_header: None,
        reads_have_effects: false,
    };
    host.vault
        .add_credential(
            &credential,
            &postern_vault::Sensitive::new("bench-secret-token".into()),
            Timestamp::from_millis(2),
        )
        .expect("credential");
    host
}

/// Bytes this process has caused to be written to storage so far (`/proc/self/io`), for
/// "bytes written per call".
pub fn bytes_written() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines().find_map(|l| l.strip_prefix("write_bytes: ")).and_then(|v| v.trim().parse().ok())
}

/// An engine with `manifest` over a fresh journal in a temporary directory (in-memory keychain).
pub fn engine(manifest: &str) -> (tempfile::TempDir, Arc<Store>, Arc<Engine>) {
    let manifest = Manifest::parse(manifest, std::path::Path::new("bench.toml")).expect("manifest");
    let dir = tempfile::tempdir().expect("tempdir");
    let host = host(postern_host::HostConfig::new(dir.path().to_owned()));
    let engine = host.engine(manifest, Arc::new(LockOnlyApprover)).expect("engine");
    (dir, Arc::clone(&host.store), engine)
}

/// The other process of a busy-table bench: opens `n` idle loopback connections (both ends),
/// prints how many, and holds them until its standard input closes.
pub fn hold(n: usize) {
    // Two descriptors per connection: raise the soft limit to the hard one.
    if let Some(limit) = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum {
        let _ = rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit { current: Some(limit), maximum: Some(limit) },
        );
    }
    let sink = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let sink_addr = sink.local_addr().expect("addr");
    let mut idle = Vec::with_capacity(n * 2);
    for _ in 0..n {
        let Ok(c) = std::net::TcpStream::connect(sink_addr) else { break };
        idle.push(c);
        idle.push(sink.accept().expect("accept").0);
    }
    println!("{}", idle.len() / 2);
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
}

/// A child of this bench executable holding `n` idle loopback connections (see [`hold`]), once
/// they are open; dropping its stdin (or the child) closes them.
pub fn idle_sockets(n: usize) -> std::process::Child {
    bench_child("POSTERN_BENCH_HOLD", &n.to_string())
}

/// A child of this bench executable with `var` set to `value` (which tells it its part), once it
/// said on its first line that it is ready; dropping its stdin (or the child) ends it.
pub fn bench_child(var: &str, value: &str) -> std::process::Child {
    let mut child = std::process::Command::new(std::env::current_exe().expect("exe"))
        .arg("--bench")
        .env(var, value)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("bench child");
    let mut ready = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().expect("stdout")), &mut ready)
        .expect("ready");
    child
}

/// CPU time this process has used so far (user + system, all threads; 10 ms resolution).
pub fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command: state is field 3, utime 14, stime 15.
    let after = stat.rsplit_once(") ").map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = [11, 12].iter().filter_map(|&i| fields.get(i)?.parse::<u64>().ok()).sum();
    let hz = rustix::param::clock_ticks_per_second();
    Duration::from_secs_f64(ticks as f64 / hz as f64)
}
