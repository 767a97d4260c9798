//! `tools/call` round trip through the gateway, against direct HTTP to the same loopback target
//! and against the engine alone, for a read-only tool at concurrency 1 and 32: the MCP hop's
//! own cost. Transports: the bridge socket (newline JSON-RPC, what `postern mcp` relays),
//! Streamable HTTP (an MCP session, SSE answers), and — when `POSTERN_BIN` names a built
//! `postern` — through real `postern mcp` bridge processes.
//!
//! Run: `cargo build --release -p postern-cli && POSTERN_BIN=target/release/postern \
//!       cargo bench -p postern-gateway --bench mcp_hop` (`POSTERN_BENCH_CALLS` to change N).

use axum::{Router, routing::get};
use postern_core::{Actor, IntentScope, SessionId, Timestamp};
use postern_gateway::Call;
use serde_json::{Value, json};
use sha2::Digest;
use std::{
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

mod common;
use common::{Figures, figures, ms};

/// Runs `calls` calls on `concurrency` workers; each worker owns its connection (`setup`).
async fn run<C, S, SF, F, Fut>(concurrency: usize, calls: usize, setup: S, f: F) -> Figures
where
    C: Send + 'static,
    S: Fn() -> SF,
    SF: std::future::Future<Output = C>,
    F: Fn(&mut C, usize) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let per_task = calls / concurrency;
    let mut conns = Vec::new();
    for _ in 0..concurrency {
        conns.push(setup().await);
    }
    let started = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(t, mut conn)| {
            let f = f.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_task);
                for i in 0..per_task {
                    let t0 = Instant::now();
                    f(&mut conn, t * 1_000_000 + i).await;
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

fn line(name: &str, f: &Figures, direct: &Figures, engine: &Figures) {
    println!(
        "  {name:<22} p50 {:>7.3} ms  p99 {:>7.3} ms  {:>8.0} calls/s | vs direct: p50 {:+.3} ms, {:.2}x calls/s | \
         vs engine: p50 {:+.3} ms, {:.2}x calls/s",
        ms(f.p50),
        ms(f.p99),
        f.per_sec,
        ms(f.p50) - ms(direct.p50),
        f.per_sec / direct.per_sec,
        ms(f.p50) - ms(engine.p50),
        f.per_sec / engine.per_sec,
    );
}

fn call_line(id: usize, n: usize) -> String {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"read","arguments":{"n":n}}}).to_string()
}

const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}"#;
const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

/// A newline-JSON-RPC MCP session over any byte stream.
struct LineSession<R, W> {
    read: BufReader<R>,
    write: W,
    buf: String,
}

impl<R: tokio::io::AsyncRead + Unpin, W: tokio::io::AsyncWrite + Unpin> LineSession<R, W> {
    async fn open(read: R, write: W) -> Self {
        let mut s = LineSession { read: BufReader::new(read), write, buf: String::new() };
        s.send(INIT).await;
        s.answer().await;
        s.send(INITIALIZED).await;
        s
    }

    async fn send(&mut self, line: &str) {
        self.write.write_all(line.as_bytes()).await.expect("write");
        self.write.write_all(b"\n").await.expect("write");
        self.write.flush().await.expect("flush");
    }

    async fn answer(&mut self) -> Value {
        self.buf.clear();
        self.read.read_line(&mut self.buf).await.expect("read");
        serde_json::from_str(&self.buf).expect("json")
    }

    async fn call(&mut self, n: usize) {
        self.send(&call_line(n + 1, n)).await;
        let answer = self.answer().await;
        assert_eq!(answer["result"]["structuredContent"]["state"], "completed", "{answer}");
    }
}

#[derive(Clone)]
struct HttpSession {
    client: reqwest::Client,
    url: String,
    token: String,
    session: String,
}

impl HttpSession {
    fn post(&self, body: String) -> reqwest::RequestBuilder {
        let mut r = self
            .client
            .post(&self.url)
            .header("authorization", format!("Bearer {}", self.token))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .body(body);
        if !self.session.is_empty() {
            r = r.header("mcp-session-id", &self.session);
        }
        r
    }

    /// `fresh`: no idle connection is kept, so every POST opens a new TCP connection (what
    /// rmcp's default client does).
    async fn open(url: String, token: String, fresh: bool) -> Self {
        let mut builder = reqwest::Client::builder().no_proxy();
        if fresh {
            builder = builder.pool_max_idle_per_host(0);
        }
        let client = builder.build().expect("client");
        let mut s = HttpSession { client, url, token, session: String::new() };
        let answer = s.post(INIT.into()).send().await.expect("initialize");
        s.session = answer.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        answer.bytes().await.expect("body");
        s.post(INITIALIZED.into()).send().await.expect("initialized").bytes().await.expect("body");
        s
    }

    async fn call(&self, n: usize) {
        let body = self.post(call_line(n + 1, n)).send().await.expect("call").text().await.expect("body");
        assert!(body.contains("\"completed\""), "{body}");
    }
}

/// One Streamable HTTP row: `concurrency` sessions against `url`, `calls` in all; `fresh`: a new
/// TCP connection for every call.
async fn http_row(concurrency: usize, calls: usize, url: &str, token: &str, fresh: bool) -> Figures {
    let (url, token) = (url.to_owned(), token.to_owned());
    run(
        concurrency,
        calls,
        move || HttpSession::open(url.clone(), token.clone(), fresh),
        |s: &mut HttpSession, n| {
            let s = s.clone();
            async move { s.call(n).await }
        },
    )
    .await
}

/// The floor: a minimal rmcp Streamable HTTP server whose one tool does the same GET (with the
/// same bearer header) itself — no vault, no journal, no identity, no ladder.
#[derive(Clone)]
struct Floor {
    client: reqwest::Client,
    url: String,
}

impl rmcp::ServerHandler for Floor {
    fn get_info(&self) -> rmcp::model::ServerConfig {
        rmcp::model::ServerConfig::new(rmcp::model::ServerCapabilities::builder().enable_tools().build())
            .with_protocol_version(rmcp::model::ProtocolVersion::V_2026_07_28)
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [rmcp::model::ProtocolVersion]> {
        std::borrow::Cow::Borrowed(postern_gateway::mcp::PROTOCOL_VERSIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::ListToolsResult, rmcp::ErrorData> {
        let schema = json!({ "type": "object", "properties": { "n": { "type": "integer" } } });
        let tool =
            rmcp::model::Tool::new("read", "GET the target", Arc::new(schema.as_object().cloned().unwrap_or_default()));
        Ok(rmcp::model::ListToolsResult::with_all_items(vec![tool]))
    }

    async fn call_tool(
        &self,
        _request: rmcp::model::CallToolRequestParams,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        let body = self
            .client
            .get(&self.url)
            .bearer_auth("bench-secret-token")
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| rmcp::ErrorData::internal_error(e.to_string(), None))?
            .text()
            .await
            .map_err(|e| rmcp::ErrorData::internal_error(e.to_string(), None))?;
        let mut result = rmcp::model::CallToolResult::success(vec![rmcp::model::ContentBlock::text(body)]);
        result.structured_content = Some(json!({ "state": "completed" }));
        Ok(rmcp::model::CallToolResponse::Complete(result))
    }
}

/// Serves [`Floor`] on a free loopback port; its `/mcp` URL.
async fn start_floor(target: String) -> String {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let floor = Floor { client: reqwest::Client::builder().no_proxy().build().expect("client"), url: target };
    let service = StreamableHttpService::new(
        move || Ok(floor.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    use axum::serve::ListenerExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    // TCP_NODELAY, as Postern's own listener: otherwise Nagle and delayed ACKs add ~40 ms.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        axum::serve(listener, axum::Router::new().nest_service("/mcp", service)).await.expect("floor");
    });
    format!("http://{addr}/mcp")
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("mcp_hop bench: run with `cargo bench -p postern-gateway --bench mcp_hop`");
        return;
    }
    if let Ok(filter) = std::env::var("POSTERN_LOG") {
        tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter).init();
    }
    let calls: usize = std::env::var("POSTERN_BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(4_096);
    let bridge_bin = std::env::var("POSTERN_BIN").ok();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = Router::new().route("/r", get(|| async { axum::Json(json!({"ok": true})) }));
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        let base = format!("http://{addr}");
        let manifest = postern_gateway::Manifest::parse(
            &format!(
                "[[tool]]\nname = \"read\"\nmethod = \"GET\"\nurl = \"{base}/r\"\ncredential = \"{}\"\n\
                 input_schema = {{ type = \"object\", properties = {{ n = {{ type = \"integer\" }} }} }}\n",
                common::CREDENTIAL
            ),
            std::path::Path::new("bench.toml"),
        )
        .expect("manifest");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = postern_host::HostConfig::new(dir.path().to_owned());
        config.http_port = Some(0);
        config.drain = Duration::from_secs(5);
        let host = common::host(config);
        let store = Arc::clone(&host.store);
        let engine = host.engine(manifest, Arc::new(postern_gateway::LockOnlyApprover)).expect("engine");
        // After the engine, which installs the TLS crypto provider every reqwest client needs.
        let floor_url = start_floor(format!("{base}/r")).await;
        let token = "pst_bench".to_owned();
        store
            .add_agent("bench", &hex::encode(sha2::Sha256::digest(token.as_bytes())), Timestamp::from_millis(3))
            .expect("agent");
        // A second agent for the connection-per-call client: each token holds at most 64 sessions.
        let fresh_token = "pst_bench_fresh".to_owned();
        store
            .add_agent(
                "bench-fresh",
                &hex::encode(sha2::Sha256::digest(fresh_token.as_bytes())),
                Timestamp::from_millis(3),
            )
            .expect("agent");
        let bound = host.bind(Arc::clone(&engine)).await.expect("bind gateway");
        let socket = bound.endpoints.socket.clone();
        let http_url = format!("http://{}/mcp", bound.endpoints.http.expect("http"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(bound.run(async move {
            let _ = stopped.await;
        }));
        let session = SessionId::from_parts(Timestamp::from_millis(4), 1);
        let url = format!("{base}/r");

        println!("read-only tools/call, {calls} calls per row (loopback target; same run, same machine)");
        for concurrency in [1usize, 32] {
            println!("concurrency {concurrency}:");
            let direct =
                run(concurrency, calls, || async { reqwest::Client::builder().no_proxy().build().expect("client") }, {
                    let url = url.clone();
                    move |c: &mut reqwest::Client, _| {
                        let req = c.get(&url).bearer_auth("bench-secret-token");
                        async move {
                            req.send().await.expect("send").bytes().await.expect("body");
                        }
                    }
                })
                .await;
            let e = Arc::clone(&engine);
            let alone = run(
                concurrency,
                calls,
                || async {},
                move |_: &mut (), n| {
                    let e = Arc::clone(&e);
                    async move {
                        let call = Call {
                            tool: "read".into(),
                            arguments: json!({ "n": n }),
                            actor: Actor::token_agent("bench"),
                            intent_scope: IntentScope::agent_run(session),
                            session: None,
                            correlation: json!({}),
                            cancel: Default::default(),
                        };
                        assert!(e.call(call).await.expect("call").result.is_some());
                    }
                },
            )
            .await;
            println!(
                "  {:<22} p50 {:>7.3} ms  p99 {:>7.3} ms  {:>8.0} calls/s",
                "direct HTTP",
                ms(direct.p50),
                ms(direct.p99),
                direct.per_sec
            );
            line("engine alone", &alone, &direct, &alone);
            let path = socket.clone();
            let via_socket = run(
                concurrency,
                calls,
                || {
                    let path = path.clone();
                    async move {
                        let (r, w) = tokio::net::UnixStream::connect(&path).await.expect("connect").into_split();
                        Arc::new(tokio::sync::Mutex::new(LineSession::open(r, w).await))
                    }
                },
                |s: &mut Arc<tokio::sync::Mutex<_>>, n| {
                    let s = Arc::clone(s);
                    async move { s.lock().await.call(n).await }
                },
            )
            .await;
            line("MCP over socket", &via_socket, &direct, &alone);
            let via_http = http_row(concurrency, calls, &http_url, &token, false).await;
            line("MCP Streamable HTTP", &via_http, &direct, &alone);
            let fresh = http_row(concurrency, calls / 4, &http_url, &fresh_token, true).await;
            line("HTTP, conn. per call", &fresh, &direct, &alone);
            // The floor, with the same clients: Postern's HTTP rows as a ratio of it.
            let floor_kept = http_row(concurrency, calls, &floor_url, &token, false).await;
            line("floor: minimal rmcp", &floor_kept, &direct, &alone);
            let floor_fresh = http_row(concurrency, calls / 4, &floor_url, &token, true).await;
            line("floor, conn. per call", &floor_fresh, &direct, &alone);
            println!(
                "  Postern / floor: keep-alive {:.2}x calls/s (p50 {:+.3} ms), connection per call {:.2}x (p50 {:+.3} ms)",
                via_http.per_sec / floor_kept.per_sec,
                ms(via_http.p50) - ms(floor_kept.p50),
                fresh.per_sec / floor_fresh.per_sec,
                ms(fresh.p50) - ms(floor_fresh.p50)
            );
            if let Some(bin) = &bridge_bin {
                let data_dir = dir.path().to_owned();
                let via_bridge = run(
                    concurrency,
                    calls,
                    || {
                        let (bin, data_dir) = (bin.clone(), data_dir.clone());
                        async move {
                            let mut child = tokio::process::Command::new(bin)
                                .arg("mcp")
                                .env("POSTERN_DATA_DIR", data_dir)
                                .stdin(std::process::Stdio::piped())
                                .stdout(std::process::Stdio::piped())
                                .kill_on_drop(true)
                                .spawn()
                                .expect("postern mcp");
                            let (r, w) = (child.stdout.take().expect("stdout"), child.stdin.take().expect("stdin"));
                            (child, Arc::new(tokio::sync::Mutex::new(LineSession::open(r, w).await)))
                        }
                    },
                    |s: &mut (tokio::process::Child, Arc<tokio::sync::Mutex<_>>), n| {
                        let s = Arc::clone(&s.1);
                        async move { s.lock().await.call(n).await }
                    },
                )
                .await;
                line("MCP via postern mcp", &via_bridge, &direct, &alone);
            }
        }
        let _ = stop.send(());
        let _ = server.await;
    });
}
