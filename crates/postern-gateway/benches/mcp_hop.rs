//! The user-like benchmark: a read-only `tools/call` that injects a bound bearer credential (read
//! from the OS keychain), through Postern's Streamable HTTP endpoint and its bridge socket, beside
//! the floor every MCP gateway is measured against — a minimal rmcp Streamable HTTP server whose
//! tool does the same GET itself — and one proxy hop in front of the floor (a minimal rmcp relay),
//! in the same run, against the same loopback target.
//!
//! The clients run in a separate process (this executable again), as agents do: 1, 8 and 32
//! sessions, each keeping its connection alive or opening a new TCP connection per call (rmcp's
//! default client), first on a quiet machine, then with `POSTERN_BENCH_SOCKETS` (default 2,000)
//! idle loopback connections held by a third process. Rows alternate floor, relay, mcp-proxy
//! (when installed) and Postern. Each row prints calls/s, p50/p99, the server process's CPU per
//! call and the bytes it wrote per call; the relays' rows print their ratio to the floor,
//! Postern's to the floor and each relay.
//!
//! Run: `cargo bench -p postern-gateway --bench mcp_hop` (`POSTERN_BENCH_CALLS` to change N,
//! `POSTERN_BENCH_KEYCHAIN=memory` without a Secret Service).

use axum::{Router, routing::get};
use postern_core::Timestamp;
use serde_json::json;
use sha2::Digest;
use std::{sync::Arc, time::Duration};

/// The allocator `postern` itself runs with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod common;
use common::{
    Figures,
    clients::{LineSession, client_process, http_row, report, run},
    ms,
};

/// The two servers Postern is measured against, each a minimal rmcp Streamable HTTP server with
/// no vault, journal, identity or ladder.
#[derive(Clone)]
enum Minimal {
    /// The floor: its one tool does the same GET (with the same bearer header) itself.
    Floor { client: reqwest::Client, url: String },
    /// One proxy hop, what an MCP proxy does: its tool relays each call to the floor at `url`
    /// (one kept-alive HTTP client, protocol 2026-07-28 with JSON answers) and decodes the
    /// floor's result into rmcp's types before answering with it. (mcp-proxy itself, when
    /// installed, is measured beside it: [`McpProxy`].)
    Relay { client: reqwest::Client, url: String },
}

impl rmcp::ServerHandler for Minimal {
    fn get_info(&self) -> rmcp::model::ServerConfig {
        rmcp::model::ServerConfig::new(rmcp::model::ServerCapabilities::builder().enable_tools().build())
            .with_protocol_version(rmcp::model::ProtocolVersion::V_2026_07_28)
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [rmcp::model::ProtocolVersion]> {
        std::borrow::Cow::Borrowed(postern_gateway::door::mcp::PROTOCOL_VERSIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::ListToolsResult, rmcp::ErrorData> {
        Ok(common::clients::read_tool_list("GET the target", false))
    }

    async fn call_tool(
        &self,
        request: rmcp::model::CallToolRequestParams,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        let failed = |e: &dyn std::fmt::Display| rmcp::ErrorData::internal_error(e.to_string(), None);
        match self {
            Minimal::Floor { client, url } => {
                let sent = client.get(url).bearer_auth("bench-secret-token").send().await;
                let body = sent.and_then(|r| r.error_for_status()).map_err(|e| failed(&e))?;
                Ok(common::clients::completed(body.text().await.map_err(|e| failed(&e))?))
            }
            Minimal::Relay { client, url } => {
                let line = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {"name": request.name, "arguments": request.arguments,
                        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                            "io.modelcontextprotocol/clientCapabilities": {},
                            "io.modelcontextprotocol/clientInfo": {"name": "relay", "version": "1"}}}});
                let answer: serde_json::Value = client
                    .post(url)
                    .header("content-type", "application/json")
                    .header("accept", "application/json, text/event-stream")
                    .header("mcp-protocol-version", "2026-07-28")
                    .header("mcp-method", "tools/call")
                    .header("mcp-name", request.name.as_ref())
                    .body(line.to_string())
                    .send()
                    .await
                    .map_err(|e| failed(&e))?
                    .json()
                    .await
                    .map_err(|e| failed(&e))?;
                let result: rmcp::model::CallToolResult =
                    serde_json::from_value(answer["result"].clone()).map_err(|e| failed(&format!("{e}: {answer}")))?;
                Ok(rmcp::model::CallToolResponse::Complete(result))
            }
        }
    }
}

/// Serves `handler` as a Streamable HTTP MCP server on a free loopback port; its `/mcp` URL.
async fn start_server<H: rmcp::ServerHandler + Clone + Send + Sync + 'static>(handler: H) -> String {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let service = StreamableHttpService::new(
        move || Ok(handler.clone()),
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
        axum::serve(listener, axum::Router::new().nest_service("/mcp", service)).await.expect("server");
    });
    format!("http://{addr}/mcp")
}

/// mcp-proxy (crates.io, the Rust MCP reverse proxy the performance goals were first set
/// against) when it is installed (`POSTERN_BENCH_MCP_PROXY`, or `mcp-proxy` on `PATH`): one hop
/// in front of the floor, as a team deploys it, with the floor as its one HTTP backend (whose
/// tools it names `floor/…`). It runs as a process of its own; its process group is stopped on
/// drop.
struct McpProxy {
    group: std::process::Child,
    url: String,
    _config: tempfile::TempDir,
}

impl McpProxy {
    /// The name mcp-proxy gives the floor's tool.
    const TOOL: &str = "floor/read";

    fn start(floor_url: &str) -> Option<McpProxy> {
        use std::os::unix::process::CommandExt as _;
        let exe = std::env::var_os("POSTERN_BENCH_MCP_PROXY").map(std::path::PathBuf::from).or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join("mcp-proxy")).find(|p| p.is_file())
        })?;
        // A free port: mcp-proxy takes its port from the config.
        let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
        let dir = tempfile::tempdir().ok()?;
        let config = dir.path().join("proxy.toml");
        // Its log level set: with no `[observability]` table, mcp-proxy 0.4.3 logs every message
        // (its default level is empty, which its filter reads as "everything").
        let toml = format!(
            "[proxy]\nname = \"bench\"\n[proxy.listen]\nhost = \"127.0.0.1\"\nport = {port}\n\
             [observability]\nlog_level = \"warn\"\n\
             [[backends]]\nname = \"floor\"\ntransport = \"http\"\nurl = \"{floor_url}\"\n"
        );
        std::fs::write(&config, toml).ok()?;
        let mut group = std::process::Command::new(&exe)
            .arg("--config")
            .arg(&config)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| eprintln!("mcp-proxy at {} did not start: {e}", exe.display()))
            .ok()?;
        for _ in 0..300 {
            if let Ok(Some(status)) = group.try_wait() {
                eprintln!("mcp-proxy at {} exited ({status}): is it the crates.io mcp-proxy?", exe.display());
                return None;
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(McpProxy { group, url: format!("http://127.0.0.1:{port}/"), _config: dir });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("mcp-proxy at {} did not listen on port {port} within 30 s", exe.display());
        let _ = group.kill();
        None
    }

    /// CPU time of every process in its group so far.
    fn cpu_time(&self) -> Duration {
        let group = self.group.id().to_string();
        let hz = rustix::param::clock_ticks_per_second() as f64;
        let Ok(procs) = std::fs::read_dir("/proc") else { return Duration::ZERO };
        let ticks: u64 = procs
            .flatten()
            .filter_map(|p| std::fs::read_to_string(p.path().join("stat")).ok())
            .filter_map(|stat| {
                // After the parenthesised command: pgrp is field 5, utime 14, stime 15.
                let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split_whitespace().collect();
                (fields.get(2) == Some(&group.as_str()))
                    .then(|| [11, 12].iter().filter_map(|&i| fields.get(i)?.parse::<u64>().ok()).sum::<u64>())
            })
            .sum();
        Duration::from_secs_f64(ticks as f64 / hz)
    }
}

impl Drop for McpProxy {
    fn drop(&mut self) {
        if let Some(group) = rustix::process::Pid::from_raw(self.group.id() as i32) {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::TERM);
        }
        let _ = self.group.wait();
    }
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
    let [via, target, token, concurrency, calls, tool] = fields[..] else { panic!("client spec: {spec}") };
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
                            Arc::new(tokio::sync::Mutex::new(LineSession::open(r, w, "read").await))
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
            "json" => http_row(concurrency, calls, target, token, tool, false, true).await,
            fresh => http_row(concurrency, calls, target, token, tool, fresh == "fresh", false).await,
        }
    });
    report(&f);
}

/// One row from a client process, with this (the server) process's CPU and bytes written per call.
struct Row {
    figures: Figures,
    cpu_per_call: Duration,
    bytes_per_call: Option<f64>,
}

/// `also`: a relay in processes of its own, whose CPU counts with this process's.
async fn row(via: Via, target: &str, token: &str, concurrency: usize, calls: usize, also: Option<&McpProxy>) -> Row {
    let tool = if also.is_some() { McpProxy::TOOL } else { "read" };
    let how = match via {
        Via::Http { fresh: true } => "fresh",
        Via::Http { fresh: false } => "kept",
        Via::Socket => "socket",
        Via::Json => "json",
    };
    let cpu_now = || common::cpu_time() + also.map_or(Duration::ZERO, McpProxy::cpu_time);
    let (cpu, bytes) = (cpu_now(), common::bytes_written());
    let figures = client_process(format!("{how} {target} {token} {concurrency} {calls} {tool}")).await;
    // What the row set in motion lands on disk after its last answer (delivery records, the
    // WAL checkpoint): counted with the row that caused it, not the next one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls = calls as f64;
    Row {
        figures,
        cpu_per_call: (cpu_now().saturating_sub(cpu)).div_f64(calls),
        bytes_per_call: common::bytes_written().zip(bytes).map(|(after, before)| (after - before) as f64 / calls),
    }
}

fn print(name: &str, r: &Row, floor: Option<&Row>, relay: Option<&Row>, proxy: Option<&Row>) {
    let f = &r.figures;
    let bytes = r.bytes_per_call.map_or("?".to_owned(), |b| format!("{:.1} KiB", b / 1024.0));
    print!(
        "  {name:<26} {:>7.0} calls/s  p50 {:>7.3} ms  p99 {:>7.3} ms  cpu {:>6.3} ms/call  written {bytes:>9}/call",
        f.per_sec,
        ms(f.p50),
        ms(f.p99),
        ms(r.cpu_per_call)
    );
    if let Some(floor) = floor {
        print!("  {}", common::versus(f, &floor.figures, "floor"));
    }
    if let Some(relay) = relay {
        print!("  {}", common::versus(f, &relay.figures, "relay"));
    }
    if let Some(proxy) = proxy {
        print!("  {}", common::versus(f, &proxy.figures, "mcp-proxy"));
    }
    println!();
}

/// Each Postern row's ratios of calls/s to the floor, the relay and mcp-proxy of its own round,
/// in the order the rows first ran.
#[derive(Default)]
struct Ratios(Vec<(&'static str, [Vec<f64>; 3])>);

impl Ratios {
    fn add(&mut self, name: &'static str, r: &Row, against: [Option<&Row>; 3]) {
        let at = self.0.iter().position(|(n, ..)| *n == name).unwrap_or_else(|| {
            self.0.push((name, Default::default()));
            self.0.len() - 1
        });
        for (ratios, base) in self.0[at].1.iter_mut().zip(against) {
            ratios.extend(base.map(|b| r.figures.per_sec / b.figures.per_sec));
        }
    }

    fn print_medians(&mut self, rounds: usize) {
        for (name, ratios) in &mut self.0 {
            let medians: String = ratios
                .iter_mut()
                .zip(["floor", "relay", "mcp-proxy"])
                .filter_map(|(r, label)| median(r).map(|m| format!(" {m:.2}x {label}")))
                .collect();
            println!("  median of {rounds} rounds, {name}:{medians}");
        }
    }
}

/// The middle value (the mean of the two middle ones for an even count).
fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    (n > 0).then(|| if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 })
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
        let manifest = postern_engine::Manifest::parse(
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
        let engine = host.engine(manifest, Arc::new(postern_engine::LockOnlyApprover)).expect("engine");
        // After the engine, which installs the TLS crypto provider every reqwest client needs.
        let http = reqwest::Client::builder().no_proxy().build().expect("client");
        let floor_url = start_server(Minimal::Floor { client: http.clone(), url: format!("{base}/r") }).await;
        let relay_url = start_server(Minimal::Relay { client: http, url: floor_url.clone() }).await;
        let proxy = McpProxy::start(&floor_url);
        let proxy_url = proxy.as_ref().map_or(String::new(), |p| p.url.clone());
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
        // `POSTERN_BENCH_ROUNDS=3` runs each concurrency's rows three times in turn and then prints
        // the median of each Postern row's ratios, each taken within one round: a machine whose
        // speed drifts from minute to minute moves one round's rows together.
        let rounds: usize = std::env::var("POSTERN_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(1).max(1);
        // `POSTERN_BENCH_SOCKETS=0` runs the quiet table once, not twice.
        let tables: &[usize] = if busy > 0 { &[0, busy] } else { &[0] };
        for &idle in tables {
            let holder = (idle > 0).then(|| common::idle_sockets(idle));
            let table = std::fs::read_to_string("/proc/net/tcp").map(|t| t.lines().count() - 1).unwrap_or(0);
            println!("— {idle} idle loopback connections held by another process ({table} IPv4 TCP sockets)");
            for &concurrency in &sessions {
                println!("{concurrency} session(s):");
                let mut ratios = Ratios::default();
                for round in 1..=rounds {
                    if rounds > 1 {
                        println!(" round {round} of {rounds}:");
                    }
                    let (mut floor, mut relay, mut relayed_by_proxy) = (None, None, None);
                    for (name, via, kind) in [
                        ("floor: minimal rmcp", Via::Http { fresh: false }, "floor kept"),
                        ("relay: one proxy hop", Via::Http { fresh: false }, "relay kept"),
                        ("mcp-proxy (crates.io)", Via::Http { fresh: false }, "proxy kept"),
                        ("Postern, Streamable HTTP", Via::Http { fresh: false }, "kept"),
                        ("Postern, bridge socket", Via::Socket, "socket"),
                        ("floor: JSON, 2026-07-28", Via::Json, "floor json"),
                        ("Postern, JSON, 2026-07-28", Via::Json, "json"),
                        ("floor, conn. per call", Via::Http { fresh: true }, "floor fresh"),
                        ("relay, conn. per call", Via::Http { fresh: true }, "relay fresh"),
                        ("mcp-proxy, conn. per call", Via::Http { fresh: true }, "proxy fresh"),
                        ("Postern, conn. per call", Via::Http { fresh: true }, "fresh"),
                    ] {
                        if !wanted(kind) || (kind.starts_with("proxy") && proxy.is_none()) {
                            continue;
                        }
                        let n = if matches!(via, Via::Http { fresh: true }) { calls / 4 } else { calls };
                        let (target, token) = match (kind, via) {
                            (k, _) if k.starts_with("floor") => (floor_url.as_str(), "-"),
                            (k, _) if k.starts_with("relay") => (relay_url.as_str(), "-"),
                            (k, _) if k.starts_with("proxy") => (proxy_url.as_str(), "-"),
                            (_, Via::Socket) => (socket.as_str(), tokens[2].as_str()),
                            (_, Via::Json) => (http_url.as_str(), tokens[0].as_str()),
                            (_, Via::Http { fresh: true }) => (http_url.as_str(), tokens[1].as_str()),
                            (_, Via::Http { fresh: false }) => (http_url.as_str(), tokens[0].as_str()),
                        };
                        let also = proxy.as_ref().filter(|_| kind.starts_with("proxy"));
                        let r = row(via, target, token, concurrency, n, also).await;
                        if kind.starts_with("floor") {
                            print(name, &r, None, None, None);
                            (floor, relay, relayed_by_proxy) = (Some(r), None, None);
                        } else if kind.starts_with("relay") {
                            print(name, &r, floor.as_ref(), None, None);
                            relay = Some(r);
                        } else if kind.starts_with("proxy") {
                            print(name, &r, floor.as_ref(), None, None);
                            relayed_by_proxy = Some(r);
                        } else {
                            print(name, &r, floor.as_ref(), relay.as_ref(), relayed_by_proxy.as_ref());
                            ratios.add(name, &r, [floor.as_ref(), relay.as_ref(), relayed_by_proxy.as_ref()]);
                        }
                    }
                }
                if rounds > 1 {
                    ratios.print_medians(rounds);
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
