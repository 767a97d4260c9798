//! Engine overhead against direct reqwest to the same loopback target, in the same run:
//! a read-only tool (GET) and an `idempotency_key` tool (POST, durable journal), at concurrency
//! 1 and 64. Prints p50/p99 latency and calls/s side by side, and the ratios.
//!
//! Both tools inject a bearer credential bound to 127.0.0.1, read from the OS keychain when it
//! is reachable (as on a user's machine); the direct client sends the same header.
//!
//! Run: `cargo bench -p postern-gateway --bench engine` (`POSTERN_BENCH_CALLS` to change N).

use axum::{
    Router,
    routing::{get, post},
};
use postern_core::{Actor, IntentScope, SessionId, Timestamp};
use postern_engine::Call;
use serde_json::json;
use std::{sync::Arc, time::Instant};

mod common;
use common::{Figures, figures, ms};

async fn run<F, Fut>(concurrency: usize, calls: usize, f: F) -> Figures
where
    F: Fn(usize) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let started = Instant::now();
    let per_task = calls / concurrency;
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let f = f.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_task);
                for i in 0..per_task {
                    let t0 = Instant::now();
                    f(t * 1_000_000 + i).await;
                    latencies.push(t0.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::with_capacity(calls);
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    figures(all, started.elapsed())
}

fn show(name: &str, direct: &Figures, engine: &Figures) {
    println!(
        "{name:<34} direct p50 {:>6.3} ms p99 {:>6.3} ms {:>8.0}/s | engine p50 {:>6.3} ms p99 {:>6.3} ms {:>8.0}/s | overhead p50 {:+.3} ms, throughput {:.2}x",
        ms(direct.p50),
        ms(direct.p99),
        direct.per_sec,
        ms(engine.p50),
        ms(engine.p99),
        engine.per_sec,
        ms(engine.p50) - ms(direct.p50),
        engine.per_sec / direct.per_sec
    );
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("engine bench: run with `cargo bench -p postern-gateway --bench engine`");
        return;
    }
    let calls: usize = std::env::var("POSTERN_BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(2_048);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = Router::new()
            .route("/r", get(|| async { axum::Json(json!({"ok": true})) }))
            .route("/w", post(|| async { (axum::http::StatusCode::CREATED, axum::Json(json!({"id": 1}))) }));
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        let base = format!("http://{addr}");
        let credential = common::CREDENTIAL;
        let (_dir, _store, engine) = common::engine(&format!(
            "[[tool]]\nname = \"read\"\nmethod = \"GET\"\nurl = \"{base}/r\"\ncredential = \"{credential}\"\n\
                 input_schema = {{ type = \"object\", properties = {{ n = {{ type = \"integer\" }} }} }}\n\n\
                 [[tool]]\nname = \"write\"\nmethod = \"POST\"\nurl = \"{base}/w\"\ncredential = \"{credential}\"\n\
                 input_schema = {{ type = \"object\", properties = {{ n = {{ type = \"integer\" }} }} }}\n\
                 contract = {{ class = \"idempotency_key\", idempotency_header = \"Idempotency-Key\" }}\n"
        ));
        let client = reqwest::Client::builder().build().expect("client");
        let session = SessionId::from_parts(Timestamp::from_millis(3), 1);
        // POSTERN_BENCH_ONLY=read:1 runs one combination (for profiling).
        let only = std::env::var("POSTERN_BENCH_ONLY").ok();
        for (tool, method) in [("read", "GET"), ("write", "POST")] {
            for concurrency in [1usize, 64] {
                if only.as_deref().is_some_and(|o| o != format!("{tool}:{concurrency}")) {
                    continue;
                }
                let url = format!("{base}/{}", &tool[..1]);
                let c = client.clone();
                let direct = run(concurrency, calls, move |_| {
                    let c = c.clone();
                    let url = url.clone();
                    async move {
                        let req = if method == "GET" { c.get(&url) } else { c.post(&url).body("{\"n\":1}") };
                        // The same header the engine injects from the credential.
                        let req = req.bearer_auth("bench-secret-token");
                        req.send().await.expect("send").bytes().await.expect("body");
                    }
                })
                .await;
                let e = Arc::clone(&engine);
                let written = common::bytes_written();
                let through_engine = run(concurrency, calls, move |n| {
                    let e = Arc::clone(&e);
                    async move {
                        let call = Call {
                            tool: tool.into(),
                            arguments: json!({ "n": n }),
                            actor: Actor::token_agent("bench"),
                            intent_scope: IntentScope::agent_run(session),
                            session: None,
                            correlation: json!({}),
                            cancel: Default::default(),
                            bound: Default::default(),
                            resolved: None,
                            opening: Default::default(),
                        };
                        let outcome = e.call(call).await.expect("call");
                        assert!(outcome.http().is_some(), "{outcome:?}");
                    }
                })
                .await;
                show(&format!("{tool} ({method}), concurrency {concurrency}"), &direct, &through_engine);
                if let (Some(before), Some(after)) = (written, common::bytes_written()) {
                    println!(
                        "{:<34} {:.1} KiB written to disk per call",
                        "",
                        (after - before) as f64 / calls as f64 / 1024.0
                    );
                }
            }
        }
    });
}
