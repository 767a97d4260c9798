//! What the OpenTelemetry export costs a call: the same read-only `tools/call` (a bound bearer
//! credential, Streamable HTTP, keep-alive clients in another process) through three gateways in
//! one run — no export, an export to a live OTLP sink on loopback, and an export to an endpoint
//! that is away (nothing listens) — at 1 and 8 sessions, rows interleaved. Each row prints
//! calls/s, p50/p99 and this process's CPU per call; the live export's row waits until the
//! exporter has caught up with the journal before its CPU is read, so the export's own work is
//! counted, and prints what reached the sink.
//!
//! Run: `cargo bench -p postern-gateway --bench export` (`POSTERN_BENCH_CALLS` to change N,
//! `POSTERN_BENCH_KEYCHAIN=memory` without a Secret Service).

use axum::{Router, body::Bytes, routing::get, routing::post};
use postern_core::Timestamp;
use serde_json::json;
use sha2::Digest;
use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};
use std::time::{Duration, Instant};

mod common;
use common::{
    Figures,
    clients::{client_process, http_row, report},
    ms,
};

/// The client process: one row, `POSTERN_BENCH_CLIENT` = `URL TOKEN SESSIONS CALLS`.
fn client(spec: &str) {
    let fields: Vec<&str> = spec.split(' ').collect();
    let [target, token, concurrency, calls] = fields[..] else { panic!("client spec: {spec}") };
    let (concurrency, calls): (usize, usize) = (concurrency.parse().expect("c"), calls.parse().expect("n"));
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let f = runtime.block_on(http_row(concurrency, calls, target, token, "read", false, false));
    report(&f);
}

/// A loopback OTLP/HTTP sink: accepts every export, counts requests and bytes.
#[derive(Default)]
struct Sink {
    requests: AtomicU64,
    bytes: AtomicU64,
}

async fn start_sink() -> (String, Arc<Sink>) {
    let sink = Arc::new(Sink::default());
    let counted = |sink: Arc<Sink>| {
        move |body: Bytes| {
            let sink = Arc::clone(&sink);
            async move {
                sink.requests.fetch_add(1, Ordering::Relaxed);
                sink.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                ([("content-type", "application/x-protobuf")], Vec::<u8>::new())
            }
        }
    };
    let app = Router::new()
        .route("/v1/traces", post(counted(Arc::clone(&sink))))
        .route("/v1/logs", post(counted(Arc::clone(&sink))));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (url, sink)
}

/// One gateway of the run.
struct Gateway {
    name: &'static str,
    url: String,
    token: String,
    store: Arc<postern_store::Store>,
    _dir: tempfile::TempDir,
}

async fn start_gateway(
    name: &'static str,
    manifest: &str,
    otlp: Option<&str>,
    stops: &mut Vec<tokio::sync::oneshot::Sender<()>>,
) -> Gateway {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = postern_host::HostConfig::new(dir.path().to_owned());
    config.http_port = Some(0);
    config.drain = Duration::from_secs(5);
    config.otlp = otlp.map(|endpoint| {
        postern_otel::ExportSettings::resolve(Some(endpoint), &[], |_| None).expect("settings").expect("on")
    });
    let host = common::host(config);
    let store = Arc::clone(&host.store);
    let manifest = postern_engine::Manifest::parse(manifest, std::path::Path::new("bench.toml")).expect("manifest");
    let engine = host.engine(manifest, Arc::new(postern_engine::LockOnlyApprover)).expect("engine");
    let token = format!("pst_bench_{name}");
    let digest = hex::encode(sha2::Sha256::digest(token.as_bytes()));
    store.add_agent("bench", &digest, Timestamp::from_millis(3)).expect("agent");
    let bound = host.bind(Arc::clone(&engine)).await.expect("bind gateway");
    let url = format!("http://{}/mcp", bound.endpoints.http.expect("http"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    stops.push(stop);
    tokio::spawn(bound.run(async move {
        let _ = stopped.await;
    }));
    Gateway { name, url, token, store, _dir: dir }
}

/// How far behind the journal a gateway's export is (`None`: it has none).
fn lag(store: &postern_store::Store) -> Option<u64> {
    let view = store.view();
    let cursor = view.export_cursor(postern_otel::CURSOR).ok()??;
    Some(view.head().ok()?.size.saturating_sub(cursor.seq))
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("export bench: run with `cargo bench -p postern-gateway --bench export`");
        return;
    }
    if let Ok(spec) = std::env::var("POSTERN_BENCH_CLIENT") {
        return client(&spec);
    }
    let calls: usize = std::env::var("POSTERN_BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(2_048);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = Router::new().route("/r", get(|| async { axum::Json(json!({"ok": true})) }));
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        let manifest = format!(
            "[[tool]]\nname = \"read\"\nmethod = \"GET\"\nurl = \"http://{addr}/r\"\ncredential = \"{}\"\n\
             input_schema = {{ type = \"object\", properties = {{ n = {{ type = \"integer\" }} }} }}\n",
            common::CREDENTIAL
        );
        let (sink_url, sink) = start_sink().await;
        // A port nothing listens on: every export attempt is refused at once.
        let away = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            format!("http://{}", l.local_addr().expect("addr"))
        };
        let mut stops = Vec::new();
        let gateways = [
            start_gateway("none", &manifest, None, &mut stops).await,
            start_gateway("live", &manifest, Some(&sink_url), &mut stops).await,
            start_gateway("away", &manifest, Some(&away), &mut stops).await,
        ];
        println!(
            "read-only tools/call with a bound bearer credential over Streamable HTTP (keep-alive), {calls} calls per \
             row; clients in another process; cpu is this process's (all three gateways), per call"
        );
        for sessions in [1usize, 8] {
            println!("{sessions} session(s):");
            let mut base: Option<(Figures, Duration)> = None;
            for g in &gateways {
                let (requests, bytes) = (sink.requests.load(Ordering::Relaxed), sink.bytes.load(Ordering::Relaxed));
                let cpu = common::cpu_time();
                let started = Instant::now();
                let figures = client_process(format!("{} {} {sessions} {calls}", g.url, g.token)).await;
                // The live export's work is counted: wait until it has sent everything.
                let mut caught_up = Duration::ZERO;
                if g.name == "live" {
                    while lag(&g.store).is_none_or(|l| l > 0) && started.elapsed() < Duration::from_secs(60) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    caught_up = started.elapsed();
                } else {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                let cpu = common::cpu_time().saturating_sub(cpu).div_f64(calls as f64);
                print!(
                    "  export {:<5} {:>7.0} calls/s  p50 {:>7.3} ms  p99 {:>7.3} ms  cpu {:>6.3} ms/call",
                    g.name,
                    figures.per_sec,
                    ms(figures.p50),
                    ms(figures.p99),
                    ms(cpu)
                );
                match &base {
                    None => {
                        println!();
                        base = Some((figures, cpu));
                    }
                    Some((b, b_cpu)) => {
                        print!(
                            "  {}  cpu {:+.3} ms/call",
                            common::versus(&figures, b, "no export"),
                            ms(cpu) - ms(*b_cpu)
                        );
                        if g.name == "live" {
                            let sent = sink.bytes.load(Ordering::Relaxed) - bytes;
                            print!(
                                "  sink: {} requests, {:.2} KiB/call, caught up {:.2} s after the row began",
                                sink.requests.load(Ordering::Relaxed) - requests,
                                sent as f64 / 1024.0 / calls as f64,
                                caught_up.as_secs_f64()
                            );
                        } else {
                            print!("  lag {} rows (the journal keeps them)", lag(&g.store).unwrap_or(0));
                        }
                        println!();
                    }
                }
            }
        }
        for stop in stops {
            let _ = stop.send(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    });
}
