//! An upstream MCP server behind Postern: the same read-only tool called directly (the client
//! launches the stdio server itself, as an agent does without Postern) and through Postern (the
//! bridge socket and Streamable HTTP), which runs that server as its child, journals every call
//! as an execution and forwards it with its execution ID. 1 and 32 sessions; rows alternate.
//!
//! The upstream is this executable again (`POSTERN_BENCH_UPSTREAM`): a minimal rmcp stdio server
//! whose `read` tool (annotated read-only) answers at once, so the figures are the hop's cost.
//! Directly, each session has its own server process (one stdio server per agent session);
//! through Postern, every session shares Postern's one child.
//!
//! Run: `cargo bench -p postern-gateway --bench upstream_hop` (`POSTERN_BENCH_CALLS` to change N).

use postern_core::Timestamp;
use rmcp::ServiceExt;
use sha2::Digest;
use std::{sync::Arc, time::Duration};

mod common;
use common::{
    Figures,
    clients::{LineSession, client_process, http_row, report, run},
    ms,
};

/// The upstream: one read-only tool that answers at once.
#[derive(Clone)]
struct Upstream;

impl rmcp::ServerHandler for Upstream {
    fn get_info(&self) -> rmcp::model::ServerConfig {
        rmcp::model::ServerConfig::new(rmcp::model::ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::ListToolsResult, rmcp::ErrorData> {
        Ok(common::clients::read_tool_list("read a value", true))
    }

    async fn call_tool(
        &self,
        _request: rmcp::model::CallToolRequestParams,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        Ok(common::clients::completed("{\"ok\":true}".into()))
    }
}

fn upstream() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let service = Upstream.serve((tokio::io::stdin(), tokio::io::stdout())).await.expect("serve");
        let _ = service.waiting().await;
    });
}

fn upstream_command() -> tokio::process::Command {
    let mut c = tokio::process::Command::new(std::env::current_exe().expect("exe"));
    c.arg("--bench").env("POSTERN_BENCH_UPSTREAM", "1").kill_on_drop(true);
    c.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
    c
}

/// The client process: one row (`POSTERN_BENCH_CLIENT`), printing `p50_ns p99_ns calls/s`.
fn client(spec: &str) {
    let fields: Vec<&str> = spec.split(' ').collect();
    let [via, target, token, concurrency, calls] = fields[..] else { panic!("client spec: {spec}") };
    let (concurrency, calls): (usize, usize) = (concurrency.parse().expect("c"), calls.parse().expect("n"));
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let f: Figures = runtime.block_on(async move {
        match via {
            "direct" => {
                let setup = || async {
                    let mut child = upstream_command().spawn().expect("upstream");
                    let (r, w) = (child.stdout.take().expect("stdout"), child.stdin.take().expect("stdin"));
                    // The child stays with its session (killed when the row's sessions are dropped).
                    Arc::new(tokio::sync::Mutex::new((LineSession::open(r, w, "read").await, child)))
                };
                run(concurrency, calls, setup, |s: &mut Arc<tokio::sync::Mutex<_>>, n| {
                    let s = Arc::clone(s);
                    async move { s.lock().await.0.call(n).await }
                })
                .await
                .0
            }
            "socket" => {
                let path = target.to_owned();
                let setup = || {
                    let path = path.clone();
                    async move {
                        let (r, w) = tokio::net::UnixStream::connect(&path).await.expect("connect").into_split();
                        Arc::new(tokio::sync::Mutex::new(LineSession::open(r, w, "up__read").await))
                    }
                };
                run(concurrency, calls, setup, |s: &mut Arc<tokio::sync::Mutex<_>>, n| {
                    let s = Arc::clone(s);
                    async move { s.lock().await.call(n).await }
                })
                .await
                .0
            }
            _ => http_row(concurrency, calls, target, token, "up__read", false, false).await,
        }
    });
    report(&f);
}

/// One row from a client process, with this (Postern's) process's CPU per call.
struct Row {
    figures: Figures,
    cpu_per_call: Duration,
}

async fn row(via: &str, target: &str, token: &str, concurrency: usize, calls: usize) -> Row {
    let cpu = common::cpu_time();
    let figures = client_process(format!("{via} {target} {token} {concurrency} {calls}")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    Row { figures, cpu_per_call: common::cpu_time().saturating_sub(cpu).div_f64(calls as f64) }
}

fn print(name: &str, r: &Row, direct: Option<&Row>) {
    let f = &r.figures;
    print!("  {name:<30} {:>7.0} calls/s  p50 {:>7.3} ms  p99 {:>7.3} ms", f.per_sec, ms(f.p50), ms(f.p99),);
    match direct {
        Some(d) => {
            println!("  postern cpu {:>6.3} ms/call  {}", ms(r.cpu_per_call), common::versus(f, &d.figures, "direct"))
        }
        None => println!(),
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("upstream_hop bench: run with `cargo bench -p postern-gateway --bench upstream_hop`");
        return;
    }
    if std::env::var_os("POSTERN_BENCH_UPSTREAM").is_some() {
        return upstream();
    }
    if let Ok(spec) = std::env::var("POSTERN_BENCH_CLIENT") {
        return client(&spec);
    }
    let calls: usize = std::env::var("POSTERN_BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(4_096);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async move {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = postern_host::HostConfig::new(dir.path().to_owned());
        config.http_port = Some(0);
        config.drain = Duration::from_secs(5);
        let host = common::host(config);
        let exe = std::env::current_exe().expect("exe").to_string_lossy().into_owned();
        let server = postern_vault::McpServer {
            name: "up".into(),
            command: exe,
            args: vec!["--bench".into()],
            env: [("POSTERN_BENCH_UPSTREAM".to_owned(), "1".to_owned())].into(),
            ..postern_vault::McpServer::default()
        };
        host.vault.add_mcp_server(&server, &[], Timestamp::from_millis(3)).expect("server");
        let token = "pst_bench_upstream";
        let digest = hex::encode(sha2::Sha256::digest(token.as_bytes()));
        host.store.add_agent("bench", &digest, Timestamp::from_millis(4)).expect("agent");
        let engine = host
            .engine(postern_engine::Manifest::default(), Arc::new(postern_engine::LockOnlyApprover))
            .expect("engine");
        let bound = host.bind(Arc::clone(&engine)).await.expect("bind gateway");
        let socket = bound.endpoints.socket.to_string_lossy().into_owned();
        let http_url = format!("http://{}/mcp", bound.endpoints.http.expect("http"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(bound.run(async move {
            let _ = stopped.await;
        }));
        // Warm-up: the upstream started and its tools known.
        let _ = row("socket", &socket, token, 1, 64).await;
        println!(
            "read-only tools/call of an upstream stdio MCP server, {calls} calls per row; clients in another process; \
             cpu is Postern's process (its upstream child not included)"
        );
        for concurrency in [1, 32] {
            println!("{concurrency} session(s):");
            let direct = row("direct", "-", "-", concurrency, calls).await;
            print("direct: client runs the server", &direct, None);
            let r = row("socket", &socket, token, concurrency, calls).await;
            print("Postern, bridge socket", &r, Some(&direct));
            let r = row("kept", &http_url, token, concurrency, calls).await;
            print("Postern, Streamable HTTP", &r, Some(&direct));
        }
        let _ = stop.send(());
        let _ = served.await;
    });
}
