//! The bench clients: MCP sessions over a newline-JSON-RPC stream (the bridge socket, a stdio
//! server) and over Streamable HTTP, and the loop that runs a row of calls on them.

use super::{Figures, figures};
use serde_json::{Value, json};
use std::time::Instant;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Runs `calls` calls on `concurrency` workers; each worker owns its connection (`setup`), handed
/// back at the end.
pub async fn run<C, S, SF, F, Fut>(concurrency: usize, calls: usize, setup: S, f: F) -> (Figures, Vec<C>)
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

pub fn call_line(id: usize, tool: &str, n: usize) -> String {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":tool,"arguments":{"n":n}}}).to_string()
}

pub const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}"#;
pub const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

/// A newline-JSON-RPC MCP session over any byte stream.
pub struct LineSession<R, W> {
    read: BufReader<R>,
    write: W,
    buf: String,
    tool: String,
}

impl<R: tokio::io::AsyncRead + Unpin, W: tokio::io::AsyncWrite + Unpin> LineSession<R, W> {
    pub async fn open(read: R, write: W, tool: &str) -> Self {
        let mut s = LineSession { read: BufReader::new(read), write, buf: String::new(), tool: tool.to_owned() };
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

    pub async fn call(&mut self, n: usize) {
        let line = call_line(n + 1, &self.tool, n);
        self.send(&line).await;
        let answer = self.answer().await;
        assert_eq!(answer["result"]["structuredContent"]["state"], "completed", "{answer}");
    }
}

#[derive(Clone)]
pub struct HttpSession {
    client: reqwest::Client,
    tool: String,
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
    pub async fn open(url: String, token: String, tool: String, fresh: bool, stateless: bool) -> Self {
        let mut builder = reqwest::Client::builder().no_proxy();
        if fresh {
            builder = builder.pool_max_idle_per_host(0);
        }
        let client = builder.build().expect("client");
        let mut s = HttpSession { client, tool, url, token, session: String::new(), stateless };
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
    pub async fn close(&self) {
        if self.stateless {
            return;
        }
        let mut r = self.client.delete(&self.url).header("authorization", format!("Bearer {}", self.token));
        r = r.header("mcp-session-id", &self.session).header("mcp-protocol-version", "2025-11-25");
        let _ = r.send().await;
    }

    pub async fn call(&self, n: usize) {
        let line = if self.stateless {
            json!({"jsonrpc":"2.0","id":n + 1,"method":"tools/call","params":{"name":self.tool,"arguments":{"n":n},
                "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",
                "io.modelcontextprotocol/clientCapabilities":{},
                "io.modelcontextprotocol/clientInfo":{"name":"bench","version":"1"}}}})
            .to_string()
        } else {
            call_line(n + 1, &self.tool, n)
        };
        let mut request = self.post(line);
        if self.stateless {
            // SEP-2243: the method and tool name as headers too.
            request = request.header("mcp-method", "tools/call").header("mcp-name", &self.tool);
        }
        let body = request.send().await.expect("call").text().await.expect("body");
        assert!(body.contains("\"completed\""), "{body}");
    }
}

/// One Streamable HTTP row: `concurrency` sessions against `url`, `calls` in all; `fresh`: a new
/// TCP connection for every call.
pub async fn http_row(
    concurrency: usize,
    calls: usize,
    url: &str,
    token: &str,
    tool: &str,
    fresh: bool,
    stateless: bool,
) -> Figures {
    let (url, token, tool) = (url.to_owned(), token.to_owned(), tool.to_owned());
    let (figures, sessions) = run(
        concurrency,
        calls,
        move || HttpSession::open(url.clone(), token.clone(), tool.clone(), fresh, stateless),
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

/// Runs one row in a client process — this executable again, with `POSTERN_BENCH_CLIENT=spec`,
/// as agents are processes of their own — and reads back the figures it [`report`]s.
pub async fn client_process(spec: String) -> Figures {
    let out = tokio::process::Command::new(std::env::current_exe().expect("exe"))
        .arg("--bench")
        .env("POSTERN_BENCH_CLIENT", spec)
        .env_remove("POSTERN_BENCH_HOLD")
        .output()
        .await
        .expect("client");
    assert!(out.status.success(), "client: {}", String::from_utf8_lossy(&out.stderr));
    let v: Vec<f64> =
        String::from_utf8_lossy(&out.stdout).split_whitespace().map(|f| f.parse().expect("figure")).collect();
    Figures {
        p50: std::time::Duration::from_nanos(v[0] as u64),
        p99: std::time::Duration::from_nanos(v[1] as u64),
        per_sec: v[2],
    }
}

/// What a client process prints for [`client_process`].
pub fn report(f: &Figures) {
    println!("{} {} {}", f.p50.as_nanos(), f.p99.as_nanos(), f.per_sec);
}

/// The one tool the bench servers offer: `read`, taking `n`.
pub fn read_tool_list(description: &str, read_only: bool) -> rmcp::model::ListToolsResult {
    let schema = json!({ "type": "object", "properties": { "n": { "type": "integer" } } });
    let mut tool = rmcp::model::Tool::new(
        "read",
        description.to_owned(),
        std::sync::Arc::new(schema.as_object().cloned().unwrap_or_default()),
    );
    if read_only {
        tool = tool.with_annotations(rmcp::model::ToolAnnotations::new().read_only(true));
    }
    rmcp::model::ListToolsResult::with_all_items(vec![tool])
}

/// A bench server's answer: `text`, with `state: completed` where the clients look for it.
pub fn completed(text: String) -> rmcp::model::CallToolResponse {
    let mut result = rmcp::model::CallToolResult::success(vec![rmcp::model::ContentBlock::text(text)]);
    result.structured_content = Some(json!({ "state": "completed" }));
    rmcp::model::CallToolResponse::Complete(result)
}
