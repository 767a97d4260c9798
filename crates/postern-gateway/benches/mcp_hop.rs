//! The user-like benchmark: a read-only `tools/call` that injects a bound bearer credential (read
//! from the OS keychain), through Postern's Streamable HTTP endpoint and its bridge socket, beside
//! the floor every MCP gateway is measured against — a minimal rmcp Streamable HTTP server whose
//! tool does the same GET itself — in the same run, against the same loopback target.
//!
//! The clients run in a separate process (this executable again), as agents do: 1, 8 and 32
//! sessions, each keeping its connection alive or opening a new TCP connection per call (rmcp's
//! default client), first on a quiet machine, then with `POSTERN_BENCH_SOCKETS` (default 2,000)
//! idle loopback connections held by a third process. Rows alternate floor and Postern. Each row
//! prints calls/s, p50/p99, the server process's CPU per call and the bytes it wrote per call;
//! Postern's rows also print their ratio to the floor.
//!
//! Run: `cargo bench -p postern-gateway --bench mcp_hop` (`POSTERN_BENCH_CALLS` to change N,
//! `POSTERN_BENCH_KEYCHAIN=memory` without a Secret Service).

use axum::{Router, routing::get};
use postern_core::Timestamp;
use serde_json::{Value, json};
use sha2::Digest;
use std::{
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

mod common;
use common::{Figures, figures, ms};

/// Runs `calls` calls on `concurrency` workers; each worker owns its connection (`setup`), handed
/// back at the end.
async fn run<C, S, SF, F, Fut>(concurrency: usize, calls: usize, setup: S, f: F) -> (Figures, Vec<C>)
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
                (latencies, conn)
            })
        })
        .collect();
    let mut all = Vec::with_capacity(calls);
    let mut conns = Vec::with_capacity(concurrency);
    for t in tasks {
        let (latencies, conn) = t.await.expect("task");
        all.extend(latencies);
        conns.push(conn);
    }
    (figures(all, started.elapsed()), conns)
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
    /// Protocol 2026-07-28: no session, the version in every request's `_meta`.
    stateless: bool,
}

impl HttpSession {
    fn post(&self, body: String) -> reqwest::RequestBuilder {
        let mut r = self
            .client
            .post(&self.url)
            .header("authorization", format!("Bearer {}", self.token))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", if self.stateless { "2026-07-28" } else { "2025-11-25" })
            .body(body);
        if !self.session.is_empty() {
            r = r.header("mcp-session-id", &self.session);
        }
        r
    }

    /// `fresh`: no idle connection is kept, so every POST opens a new TCP connection (what
    /// rmcp's default client does).
    async fn open(url: String, token: String, fresh: bool, stateless: bool) -> Self {
        let mut builder = reqwest::Client::builder().no_proxy();
        if fresh {
            builder = builder.pool_max_idle_per_host(0);
        }
        let client = builder.build().expect("client");
        let mut s = HttpSession { client, url, token, session: String::new(), stateless };
        if stateless {
            return s;
        }
        let answer = s.post(INIT.into()).send().await.expect("initialize");
        s.session = answer.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        answer.bytes().await.expect("body");
        s.post(INITIALIZED.into()).send().await.expect("initialized").bytes().await.expect("body");
        s
    }

    /// Ends the session, as a well-behaved client does.
    async fn close(&self) {
        if self.stateless {
            return;
        }
        let mut r = self.client.delete(&self.url).header("authorization", format!("Bearer {}", self.token));
        r = r.header("mcp-session-id", &self.session).header("mcp-protocol-version", "2025-11-25");
        let _ = r.send().await;
    }

    async fn call(&self, n: usize) {
        let line = if self.stateless {
            json!({"jsonrpc":"2.0","id":n + 1,"method":"tools/call","params":{"name":"read","arguments":{"n":n},
                "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",
                "io.modelcontextprotocol/clientCapabilities":{},
                "io.modelcontextprotocol/clientInfo":{"name":"bench","version":"1"}}}})
            .to_string()
        } else {
            call_line(n + 1, n)
        };
        let mut request = self.post(line);
        if self.stateless {
            // SEP-2243: the method and tool name as headers too.
            request = request.header("mcp-method", "tools/call").header("mcp-name", "read");
        }
        let body = request.send().await.expect("call").text().await.expect("body");
        assert!(body.contains("\"completed\""), "{body}");
    }
}

/// One Streamable HTTP row: `concurrency` sessions against `url`, `calls` in all; `fresh`: a new
/// TCP connection for every call.
async fn http_row(concurrency: usize, calls: usize, url: &str, token: &str, fresh: bool, stateless: bool) -> Figures {
    let (url, token) = (url.to_owned(), token.to_owned());
    let (figures, sessions) = run(
        concurrency,
        calls,
        move || HttpSession::open(url.clone(), token.clone(), fresh, stateless),
        |s: &mut HttpSession, n| {
            let s = s.clone();
            async move { s.call(n).await }
        },
    )
    .await;
    for s in sessions {
        s.close().await;
    }
    figures
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
        StreamableHttpServerConfig::default().with_json_response(true),
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

/// A row of calls from the client process: what it runs against, and how.
#[derive(Clone, Copy)]
enum Via {
    /// Streamable HTTP; `fresh`: a new TCP connection for every call.
    Http { fresh: bool },
    /// The bridge socket (newline JSON-RPC, what `postern mcp` relays).
    Socket,
    /// Streamable HTTP at protocol 2026-07-28: no session, answers as `application/json`.
    Json,
}

/// The client process: runs one row (`POSTERN_BENCH_CLIENT`) and prints `p50_ns p99_ns calls/s`.
fn client(spec: &str) {
    let fields: Vec<&str> = spec.split(' ').collect();
    let [via, target, token, concurrency, calls] = fields[..] else { panic!("client spec: {spec}") };
    let (concurrency, calls): (usize, usize) = (concurrency.parse().expect("c"), calls.parse().expect("n"));
    // The TLS crypto provider every reqwest client needs (Postern's engine installs it server-side).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let f = runtime.block_on(async move {
        match via {
            "socket" => {
                let path = target.to_owned();
                run(
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
                .await
                .0
            }
            "json" => http_row(concurrency, calls, target, token, false, true).await,
            fresh => http_row(concurrency, calls, target, token, fresh == "fresh", false).await,
        }
    });
    println!("{} {} {}", f.p50.as_nanos(), f.p99.as_nanos(), f.per_sec);
}

/// One row from a client process, with this (the server) process's CPU and bytes written per call.
struct Row {
    figures: Figures,
    cpu_per_call: Duration,
    bytes_per_call: Option<f64>,
}

async fn row(via: Via, target: &str, token: &str, concurrency: usize, calls: usize) -> Row {
    let how = match via {
        Via::Http { fresh: true } => "fresh",
        Via::Http { fresh: false } => "kept",
        Via::Socket => "socket",
        Via::Json => "json",
    };
    let (cpu, bytes) = (common::cpu_time(), common::bytes_written());
    let out = tokio::process::Command::new(std::env::current_exe().expect("exe"))
        .arg("--bench")
        .env("POSTERN_BENCH_CLIENT", format!("{how} {target} {token} {concurrency} {calls}"))
        .env_remove("POSTERN_BENCH_HOLD")
        .output()
        .await
        .expect("client");
    assert!(out.status.success(), "client: {}", String::from_utf8_lossy(&out.stderr));
    // What the row set in motion lands on disk after its last answer (delivery records, the
    // WAL checkpoint): counted with the row that caused it, not the next one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<f64> = text.split_whitespace().map(|f| f.parse().expect("figure")).collect();
    let calls = calls as f64;
    Row {
        figures: Figures {
            p50: Duration::from_nanos(v[0] as u64),
            p99: Duration::from_nanos(v[1] as u64),
            per_sec: v[2],
        },
        cpu_per_call: (common::cpu_time().saturating_sub(cpu)).div_f64(calls),
        bytes_per_call: common::bytes_written().zip(bytes).map(|(after, before)| (after - before) as f64 / calls),
    }
}

fn print(name: &str, r: &Row, floor: Option<&Row>) {
    let f = &r.figures;
    let bytes = r.bytes_per_call.map_or("?".to_owned(), |b| format!("{:.1} KiB", b / 1024.0));
    print!(
        "  {name:<26} {:>7.0} calls/s  p50 {:>7.3} ms  p99 {:>7.3} ms  cpu {:>6.3} ms/call  written {bytes:>9}/call",
        f.per_sec,
        ms(f.p50),
        ms(f.p99),
        ms(r.cpu_per_call)
    );
    match floor {
        Some(floor) => println!(
            "  | {:.2}x floor, p50 {:+.3} ms",
            f.per_sec / floor.figures.per_sec,
            ms(f.p50) - ms(floor.figures.p50)
        ),
        None => println!(),
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("mcp_hop bench: run with `cargo bench -p postern-gateway --bench mcp_hop`");
        return;
    }
    if let Some(n) = std::env::var("POSTERN_BENCH_HOLD").ok().and_then(|v| v.parse().ok()) {
        return common::hold(n);
    }
    if let Ok(spec) = std::env::var("POSTERN_BENCH_CLIENT") {
        return client(&spec);
    }
    if let Ok(filter) = std::env::var("POSTERN_LOG") {
        tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter).init();
    }
    let calls: usize = std::env::var("POSTERN_BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(4_096);
    let busy: usize = std::env::var("POSTERN_BENCH_SOCKETS").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000);
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
        // One agent token per client kind: each token holds at most 64 sessions.
        let mut tokens = Vec::new();
        for (i, name) in ["kept", "fresh", "socket"].into_iter().enumerate() {
            let token = format!("pst_bench_{name}");
            let digest = hex::encode(sha2::Sha256::digest(token.as_bytes()));
            store.add_agent(name, &digest, Timestamp::from_millis(3 + i as i64)).expect("agent");
            tokens.push(token);
        }
        let bound = host.bind(Arc::clone(&engine)).await.expect("bind gateway");
        let socket = bound.endpoints.socket.to_string_lossy().into_owned();
        let http_url = format!("http://{}/mcp", bound.endpoints.http.expect("http"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(bound.run(async move {
            let _ = stopped.await;
        }));

        println!(
            "read-only tools/call with a bound bearer credential, {calls} calls per row (a quarter with a \
             connection per call); clients in another process; cpu and bytes written are the server process's"
        );
        // `POSTERN_BENCH_ONLY=kept` (or `fresh`, `socket`, `floor`) runs only the rows so named, for
        // profiling one of them; `POSTERN_BENCH_SESSIONS=32` only that many sessions.
        let only = std::env::var("POSTERN_BENCH_ONLY").ok();
        let wanted = |name: &str| only.as_deref().is_none_or(|o| name.contains(o));
        let sessions: Vec<usize> = std::env::var("POSTERN_BENCH_SESSIONS")
            .ok()
            .map(|v| v.split(',').filter_map(|n| n.parse().ok()).collect())
            .unwrap_or_else(|| vec![1, 8, 32]);
        for idle in [0, busy] {
            let holder = (idle > 0).then(|| common::idle_sockets(idle));
            let table = std::fs::read_to_string("/proc/net/tcp").map(|t| t.lines().count() - 1).unwrap_or(0);
            println!("— {idle} idle loopback connections held by another process ({table} IPv4 TCP sockets)");
            for &concurrency in &sessions {
                println!("{concurrency} session(s):");
                let mut floor = None;
                for (name, via, kind) in [
                    ("floor: minimal rmcp", Via::Http { fresh: false }, "floor kept"),
                    ("Postern, Streamable HTTP", Via::Http { fresh: false }, "kept"),
                    ("Postern, bridge socket", Via::Socket, "socket"),
                    ("floor: JSON, 2026-07-28", Via::Json, "floor json"),
                    ("Postern, JSON, 2026-07-28", Via::Json, "json"),
                    ("floor, conn. per call", Via::Http { fresh: true }, "floor fresh"),
                    ("Postern, conn. per call", Via::Http { fresh: true }, "fresh"),
                ] {
                    if !wanted(kind) {
                        continue;
                    }
                    let n = if matches!(via, Via::Http { fresh: true }) { calls / 4 } else { calls };
                    let (target, token) = match (kind, via) {
                        (k, _) if k.starts_with("floor") => (floor_url.as_str(), "-"),
                        (_, Via::Socket) => (socket.as_str(), tokens[2].as_str()),
                        (_, Via::Json) => (http_url.as_str(), tokens[0].as_str()),
                        (_, Via::Http { fresh: true }) => (http_url.as_str(), tokens[1].as_str()),
                        (_, Via::Http { fresh: false }) => (http_url.as_str(), tokens[0].as_str()),
                    };
                    let r = row(via, target, token, concurrency, n).await;
                    if kind.starts_with("floor") {
                        print(name, &r, None);
                        floor = Some(r);
                    } else {
                        print(name, &r, floor.as_ref());
                    }
                }
            }
            if let Some(mut holder) = holder {
                drop(holder.stdin.take());
                let _ = holder.wait();
            }
        }
        let _ = stop.send(());
        let _ = server.await;
    });
}
