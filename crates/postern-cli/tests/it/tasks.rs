//! MCP tasks driven by rmcp's own client: the task a side-effecting call becomes is the
//! execution, followed with `tasks/get` across a dropped connection and a gateway restart, and
//! only by the agent that made it.

use super::approvals::journal_rows;
use super::gateway::{LONG, state_of};
use super::gateway_support::{Gateway, Target, eventually};
use rmcp::{
    ClientHandler, RoleClient,
    model::{
        CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, GetTaskParams, Implementation,
        ProtocolVersion, TaskPayload, TaskStatus,
    },
    service::{ClientLifecycleMode, ClientServiceExt, RunningService},
    transport::{StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig},
};
use serde_json::{Value, json};

/// An agent whose client declares the tasks extension.
#[derive(Clone)]
struct TaskAgent;

impl ClientHandler for TaskAgent {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(ClientCapabilities::builder().enable_tasks().build(), Implementation::new("task-agent", "1"))
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A 2026-07-28 client (no session: `server/discover`, everything in each request's `_meta`).
async fn connect(gw: &Gateway, token: &str) -> RunningService<RoleClient, TaskAgent> {
    let config = StreamableHttpClientTransportConfig::with_uri(gw.http.clone()).auth_header(token.to_owned());
    // The gateway's own client: rustls with a crypto provider installed (any reqwest client would do).
    let transport = StreamableHttpClientTransport::with_client(postern_engine::channel::http::client(), config);
    let lifecycle = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
    TaskAgent.serve_with_lifecycle(transport, lifecycle).await.unwrap()
}

/// Polls task `id` until it is terminal; the last answer.
async fn until_terminal(client: &RunningService<RoleClient, TaskAgent>, id: &str) -> rmcp::model::GetTaskResult {
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        let got = client.get_task(GetTaskParams::new(id)).await.unwrap();
        if got.task.status().is_terminal() || tokio::time::Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// `tasks/get` of `task` from a process of its own (python3's standard library, no SDK), as a
/// 2026-07-28 client that declares the tasks extension sends it.
fn fetch_from_another_process(gw: &Gateway, token: &str, task: &str) -> Value {
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": { "taskId": task, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": { "extensions": { "io.modelcontextprotocol/tasks": {} } },
        "io.modelcontextprotocol/clientInfo": { "name": "elsewhere", "version": "1" } } } });
    let script = r#"
import sys, urllib.error, urllib.request
url, token, body = sys.argv[1:4]
req = urllib.request.Request(url, data=body.encode(), method="POST", headers={
    "Authorization": "Bearer " + token, "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
    "Mcp-Method": "tasks/get", "Mcp-Name": sys.argv[4]})
try:
    print(urllib.request.urlopen(req, timeout=30).read().decode())
except urllib.error.HTTPError as e:
    sys.exit(f"HTTP {e.code}: {e.read().decode()}")
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, &gw.http, token, &body.to_string(), task])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// The task's terminal result, as JSON.
fn completed_result(got: &rmcp::model::GetTaskResult) -> Value {
    match &got.task.payload {
        TaskPayload::Completed { result } => Value::Object(result.clone()),
        other => panic!("not completed: {other:?}"),
    }
}

/// #27: the task is created durably before the client hears of it and *is* the execution; the
/// client drops its connection while the payment is in flight, the gateway restarts, and a new
/// client fetches the result with `tasks/get`: one payment at the target, the same execution,
/// journaled `result_delivered` once fetched. Another agent asking for it is told there is no
/// such task, and the attempt is journaled.
#[test]
fn a_task_survives_a_dropped_connection_and_a_gateway_restart() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let token = gw.add_agent("tasker");
    // Before any client connects: this test process becomes an agent's (as its kernel names
    // it) and may not add tokens after that.
    let other = gw.add_agent("other");
    let rt = runtime();
    target.hold();
    let (task_id, created) = rt.block_on(async {
        let client = connect(&gw, &token).await;
        let call =
            CallToolRequestParams::new("wire").with_arguments(json!({ "amount": 21 }).as_object().unwrap().clone());
        let created = match client.call_tool_once(call).await.unwrap() {
            CallToolResponse::Task(t) => t,
            other => panic!("a side-effecting call from a tasks client is a task: {other:?}"),
        };
        let id = created.task.task_id.clone();
        // The handle names a durable execution before the client heard of it.
        let working = client.get_task(GetTaskParams::new(&id)).await.unwrap();
        assert_eq!(working.task.status(), TaskStatus::Working, "{working:?}");
        drop(client.cancel().await);
        (id, created)
    });
    assert_eq!(created.task.status, TaskStatus::Working);
    assert!(task_id.starts_with("act_"), "the task ID is the execution ID: {task_id}");
    assert_eq!(gw.executions_of("wire"), std::slice::from_ref(&task_id));
    // The connection is gone; the payment is still at the target. It finishes without anyone.
    eventually("the payment to reach the target", LONG, || (target.posts() == 1).then_some(()));
    target.release();
    eventually("the execution to complete", LONG, || (state_of(&gw, &task_id) == "completed").then_some(()));

    let gw = gw.crash_and_restart(&target.manifest());
    // Another process holding the same token (another run, another intent scope) may read the
    // task, but its fetch is no evidence that this run has the result.
    let elsewhere = fetch_from_another_process(&gw, &token, &task_id);
    assert_eq!(elsewhere["result"]["status"], "completed", "{elsewhere}");
    // Delivery is journaled off the request path (within milliseconds when it is): wait that
    // long before looking for its absence.
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert_eq!(state_of(&gw, &task_id), "completed_result_not_delivered");
    let got = rt.block_on(async {
        let client = connect(&gw, &token).await;
        let got = until_terminal(&client, &task_id).await;
        drop(client.cancel().await);
        got
    });
    assert_eq!(got.task.status(), TaskStatus::Completed, "{got:?}");
    assert_eq!(got.task.task.task_id, task_id);
    let result = completed_result(&got);
    assert_eq!(result["structuredContent"]["execution_id"], task_id.as_str(), "{result}");
    assert_eq!(result["isError"], false, "{result}");
    assert!(result["structuredContent"]["result"]["body"].as_str().unwrap().contains("\"payment\":1"), "{result}");
    assert_eq!(target.posts(), 1, "one payment for one task, across the drop and the restart");
    eventually("the fetched result journaled as delivered", LONG, || {
        (state_of(&gw, &task_id) == "result_delivered").then_some(())
    });

    // Another agent: no such task (as for one that does not exist), and the attempt journaled.
    let err = rt.block_on(async {
        let client = connect(&gw, &other).await;
        let err = client.get_task(GetTaskParams::new(&task_id)).await.unwrap_err();
        let missing = client.get_task(GetTaskParams::new("act_01JAAAAAAAAAAAAAAAAAAAAAAA")).await.unwrap_err();
        assert_eq!(
            format!("{err}").replace(&task_id, "X"),
            format!("{missing}").replace("act_01JAAAAAAAAAAAAAAAAAAAAAAA", "X")
        );
        drop(client.cancel().await);
        err
    });
    assert!(format!("{err}").contains("unknown_task") || format!("{err:?}").contains("unknown_task"), "{err:?}");
    let refused = journal_rows(&gw, "request_refused");
    assert!(
        refused.iter().any(|r| r["payload"]["attempted"] == format!("tasks/get {task_id}")
            && r["payload"]["peer"]["actor"] == "agent:other"),
        "{refused:?}"
    );
    assert_eq!(state_of(&gw, &task_id), "result_delivered", "another agent's look changes nothing");
}

/// `tasks/cancel` once the request was sent undoes nothing and pretends nothing: the request is
/// journaled (`cancel_requested`), the execution runs to its end, and the task reads
/// `completed` with the target's answer. A read-only call from the same client is answered at
/// once, not made a task.
#[test]
fn a_task_cancelled_after_it_was_sent_keeps_its_outcome() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let token = gw.add_agent("canceller");
    let rt = runtime();
    target.hold();
    let got = rt.block_on(async {
        let client = connect(&gw, &token).await;
        let read = client.call_tool_once(CallToolRequestParams::new("balance")).await.unwrap();
        assert!(matches!(read, CallToolResponse::Complete(_)), "a read is answered, not made a task: {read:?}");
        let call =
            CallToolRequestParams::new("wire").with_arguments(json!({ "amount": 5 }).as_object().unwrap().clone());
        let CallToolResponse::Task(created) = client.call_tool_once(call).await.unwrap() else { panic!("not a task") };
        let id = created.task.task_id;
        while target.posts() == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        client.cancel_task(rmcp::model::CancelTaskParams::new(&id)).await.unwrap();
        target.release();
        let got = until_terminal(&client, &id).await;
        drop(client.cancel().await);
        got
    });
    assert_eq!(got.task.status(), TaskStatus::Completed, "{got:?}");
    let id = got.task.task.task_id.clone();
    assert_eq!(completed_result(&got)["structuredContent"]["state"], "completed");
    assert_eq!(target.posts(), 1);
    assert_eq!(target.gets(), 1);
    eventually("the cancel request journaled", LONG, || {
        gw.events_of(&id).iter().any(|e| e == "cancel_requested").then_some(())
    });
}

/// The first step of a result's delivery is the client's kernel acknowledging every byte of it,
/// and for a task result the agent fetched itself that step alone settles it. An agent's own
/// `tasks/get` whose client reads the answer's head but not its 300 KB body, then closes (the
/// kernel resets the connection: unread bytes), did not get the result: it is journaled not
/// delivered, and a fetch that reads everything then delivers it.
#[test]
fn a_fetched_task_result_the_client_never_read_is_not_delivered() {
    use std::io::{Read, Write};
    let target = Target::start();
    let manifest = format!(
        "{}\n[[tool]]\nname = \"report\"\ndescription = \"Make a report (large).\"\nmethod = \"POST\"\nurl = \"{}/v1/report\"\ncontract = {{ class = \"irreversible\" }}\n",
        target.manifest(),
        target.base()
    );
    let gw = Gateway::start(&manifest);
    let token = gw.add_agent("reader");
    let rt = runtime();
    let client = rt.block_on(connect(&gw, &token));
    let task_id = rt.block_on(async {
        match client.call_tool_once(CallToolRequestParams::new("report")).await.unwrap() {
            CallToolResponse::Task(t) => t.task.task_id,
            other => panic!("a side-effecting call from a tasks client is a task: {other:?}"),
        }
    });
    // Waits on the journal, not with `tasks/get`: a fetch would deliver the result.
    eventually("the report to complete", LONG, || (state_of(&gw, &task_id) == "completed").then_some(()));

    // The same run (this process, this token) fetches it over a connection of its own.
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": { "taskId": task_id, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": { "extensions": { "io.modelcontextprotocol/tasks": {} } },
        "io.modelcontextprotocol/clientInfo": { "name": "slow-reader", "version": "1" } } } })
    .to_string();
    let authority = gw.http.trim_start_matches("http://").split('/').next().unwrap().to_owned();
    // A small receive buffer, so the unread answer cannot all be taken in by the client's kernel
    // whatever this machine's defaults.
    let fd = rustix::net::socket(rustix::net::AddressFamily::INET, rustix::net::SocketType::STREAM, None).unwrap();
    rustix::net::sockopt::set_socket_recv_buffer_size(&fd, 16 * 1024).unwrap();
    let gateway: std::net::SocketAddr = authority.parse().unwrap();
    rustix::net::connect(&fd, &gateway).unwrap();
    let mut conn = std::net::TcpStream::from(fd);
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tasks/get\r\n\
         Mcp-Name: {task_id}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut chunk).unwrap();
        assert!(n > 0, "the connection closed before the answer's head: {}", String::from_utf8_lossy(&head));
        head.extend_from_slice(&chunk[..n]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    // The answer is being written; its body was never read. Closing with unread bytes resets.
    drop(conn);
    eventually("the unread result journaled as not delivered", LONG, || match state_of(&gw, &task_id).as_str() {
        "completed_result_not_delivered" => Some(()),
        "result_delivered" => panic!("journaled delivered, though the client read none of the result"),
        _ => None,
    });

    // A fetch that reads the answer delivers it.
    let got = rt.block_on(async { client.get_task(GetTaskParams::new(&task_id)).await.unwrap() });
    assert_eq!(completed_result(&got)["structuredContent"]["result"]["body"].as_str().map(str::len), Some(150_000));
    eventually("the read result journaled as delivered", LONG, || {
        (state_of(&gw, &task_id) == "result_delivered").then_some(())
    });
    assert_eq!(target.posts(), 1);
    rt.block_on(async { drop(client.cancel().await) });
}
