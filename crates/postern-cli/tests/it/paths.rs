//! Paths an agent takes that the happy path never draws: a request id reused while its first
//! call is in flight, a body written out again on retry. Each ends in at most one effect at the
//! target and a journal that says only what is known.

use super::gateway::{LONG, only_execution_of, state_of};
use super::gateway_support::{Gateway, Target, eventually};
use serde_json::{Value, json};
use std::io::{BufRead, Write};

/// A raw client on the gateway's socket that speaks for delivery as `postern mcp` does: it says
/// hello, and acknowledges only what the test tells it to.
struct RawBridge {
    reader: std::io::BufReader<std::os::unix::net::UnixStream>,
    writer: std::os::unix::net::UnixStream,
}

impl RawBridge {
    fn connect(gw: &Gateway) -> RawBridge {
        let socket =
            std::os::unix::net::UnixStream::connect(postern_gateway::door::socket::socket_path(gw.path())).unwrap();
        socket.set_read_timeout(Some(LONG)).unwrap();
        let mut bridge = RawBridge { reader: std::io::BufReader::new(socket.try_clone().unwrap()), writer: socket };
        bridge.writer.write_all(&postern_gateway::door::socket::bridge_hello_line()).unwrap();
        bridge.send(json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "raw-bridge", "version": "0" } } }));
        bridge.answer_to(&json!(0));
        bridge.send(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }));
        bridge
    }

    fn send(&mut self, message: Value) {
        writeln!(self.writer, "{message}").unwrap();
    }

    fn call(&mut self, id: u64, tool: &str, arguments: Value) {
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": { "name": tool, "arguments": arguments } }));
    }

    /// The next message from the gateway that answers `id` (`null`: an answer to no request).
    fn answer_to(&mut self, id: &Value) -> Value {
        loop {
            let mut line = String::new();
            assert!(self.reader.read_line(&mut line).unwrap() > 0, "the gateway closed the connection");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message.get("method").is_none() && &message["id"] == id {
                return message;
            }
        }
    }

    fn acknowledge(&mut self, id: u64) {
        self.send(
            json!({ "jsonrpc": "2.0", "method": postern_gateway::door::socket::DELIVERED_METHOD, "params": { "id": id } }),
        );
    }
}

/// Regression (#27 finding 7): delivery bookkeeping named a request by its JSON-RPC id, so a
/// second call under the id of one in flight took over its ticket, and one call's
/// acknowledgement could mark another delivered. An id in use — unanswered, or answered and not
/// yet acknowledged — is refused before anything runs, with an answer that names no request, so
/// the call in flight keeps its id; its delivery is journaled from its own evidence.
#[test]
fn a_request_id_in_use_is_refused_and_delivery_follows_each_call() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let mut bridge = RawBridge::connect(&gw);
    target.hold();
    bridge.call(7, "wire", json!({ "amount": 5 }));
    eventually("the target to receive the wire", LONG, || (target.posts() == 1).then_some(()));

    bridge.call(7, "balance", json!({}));
    let refused = bridge.answer_to(&Value::Null);
    assert_eq!(refused["error"]["data"]["code"], "request_id_in_use", "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("not run"), "{refused}");
    assert_eq!(target.gets(), 0, "the refused call ran nothing");

    target.release();
    let answered = bridge.answer_to(&json!(7));
    assert_eq!(answered["result"]["isError"], false, "{answered}");
    assert!(answered["result"].to_string().contains("payment"), "{answered}");
    let wire = only_execution_of(&gw, "wire");
    // Answered, not yet acknowledged: the id is still the wire's.
    bridge.call(7, "balance", json!({}));
    assert_eq!(bridge.answer_to(&Value::Null)["error"]["data"]["code"], "request_id_in_use");
    bridge.call(8, "balance", json!({}));
    assert_eq!(bridge.answer_to(&json!(8))["result"]["isError"], false);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(state_of(&gw, &wire), "completed", "a later call alone is not delivery: {:?}", gw.events_of(&wire));

    bridge.acknowledge(7);
    eventually("the wire's result to be journaled delivered", LONG, || {
        (state_of(&gw, &wire) == "result_delivered").then_some(())
    });
    assert_eq!((target.posts(), target.gets()), (1, 1));

    // A request refused for anything else leaves its id free (found by review: it stayed in use).
    bridge.send(json!({ "jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": ["balance"] }));
    assert_eq!(bridge.answer_to(&json!(9))["error"]["data"]["code"], "params_not_object");
    bridge.call(9, "balance", json!({}));
    assert_eq!(bridge.answer_to(&json!(9))["result"]["isError"], false, "id 9 is free again");
    assert_eq!(target.gets(), 2);
}

/// Regression (#27 finding 9): a resumption the journal has no execution for was answered
/// "nothing was sent for it" after a bounded lookup. Say what was looked at instead, and never
/// claim nothing was sent.
#[test]
fn a_resumption_with_nothing_on_record_says_what_was_looked_at() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let (addr, headers) = http_session(&gw);
    let (status, answer) = resume(&addr, &headers, "postern-1.n.4242");
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("nothing_to_resume"), "{answer}");
    assert!(!answer.contains("nothing was sent"), "{answer}");
    assert!(answer.contains("looked in the journal") && answer.contains("not proof"), "{answer}");
    assert_eq!(target.posts(), 0);
}

/// A stream resumed for a request whose JSON-RPC id is beyond 2^53 (rmcp takes any `i64`) is
/// answered and journaled (`stream_resumed`), the id kept as its exact decimal string as on the
/// call's own rows. Regression: the resumption's row held the id as a number the journal's
/// canonical JSON refuses, so it was lost (only a warning in the log).
#[test]
fn a_resumption_of_a_request_with_a_large_id_is_journaled() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let (addr, headers) = http_session(&gw);
    let (status, answer) =
        super::gateway::post_mcp(&addr, &headers, r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    assert_eq!(status, 202, "{answer}");
    let big = 9_007_199_254_740_993_u64;
    let call = json!({"jsonrpc": "2.0", "id": big, "method": "tools/call",
                      "params": {"name": "pay", "arguments": {"amount": 3}}});
    let (status, answer) = super::gateway::post_mcp(&addr, &headers, &call.to_string());
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains(&format!("id: postern-1.n.{big}")), "the stream names the request: {answer}");
    let id = only_execution_of(&gw, "pay");
    let (status, resumed) = resume(&addr, &headers, &format!("postern-1.n.{big}"));
    assert_eq!(status, 200, "{resumed}");
    assert!(resumed.contains(id.as_str()), "answered with the execution: {resumed}");
    eventually("the resumption to be journaled", LONG, || {
        gw.events_of(&id).iter().any(|e| e == "stream_resumed").then_some(())
    });
    assert_eq!(target.posts(), 1, "answered from the journal, not sent again");
}

/// A Streamable HTTP session of a new agent token on `gw` (protocol 2025-11-25): the gateway's
/// address and the headers each request on the session carries.
fn http_session(gw: &Gateway) -> (String, String) {
    let addr = gw.http.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let token = gw.add_agent("resumer");
    let auth = format!("Authorization: Bearer {token}\r\n");
    let (status, answer) = super::gateway::post_initialize(&addr, &auth);
    assert_eq!(status, 200, "{answer}");
    let session = answer.lines().find_map(|l| l.strip_prefix("mcp-session-id: ")).unwrap().trim().to_owned();
    (addr, format!("{auth}Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-11-25\r\n"))
}

/// A resumption of a broken stream: `GET /mcp` with `Last-Event-ID: event_id` on the session.
fn resume(addr: &str, headers: &str, event_id: &str) -> (u16, String) {
    super::gateway::raw_http(
        addr,
        &format!(
            "GET /mcp HTTP/1.1\r\nHost: {addr}\r\n{headers}Accept: text/event-stream\r\nLast-Event-ID: {event_id}\r\n\
             Connection: close\r\n\r\n"
        ),
    )
}

/// A TCP relay run as another user (`nobody`): the gateway cannot name the process behind a
/// connection it carries, as with a relay, a container or another user's agent. Needs root (as
/// CI runs the tests) to drop to that user.
struct ForeignRelay {
    child: std::process::Child,
    port: u16,
}

impl ForeignRelay {
    fn start(to: &str) -> ForeignRelay {
        assert_eq!(
            postern_gateway::caller::identity::current_uid().unwrap(),
            0,
            "run as root (as CI does) to relay as nobody"
        );
        let (host, port) = to.rsplit_once(':').unwrap();
        assert_eq!(host, "127.0.0.1", "the relay forwards to loopback");
        // Its text, not its path: `nobody` may not be able to read the checkout (a `mktemp -d`).
        let script =
            std::fs::read_to_string(super::gateway_support::repo_root().join("tests/clients/relay.py")).unwrap();
        let mut child = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", &script, port])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("setpriv and /usr/bin/python3");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        ForeignRelay { child, port: line.trim().parse().unwrap_or_else(|e| panic!("{e}: {line:?}")) }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for ForeignRelay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Regression (#27 finding 2): an HTTP agent whose process cannot be identified had a run per
/// request at 2026-07-28 (its lease dropped with each POST), and a run per gateway process, so
/// its repeat of an irreversible call whose answer it lost went out again. Its token's run now
/// lasts on an idle lease, across requests and a gateway restart.
#[test]
fn an_agent_the_kernel_cannot_name_keeps_one_run_per_token() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let token = gw.add_agent("relayed");
    let call = |addr: &str, id: u32| -> Value {
        let (status, raw) = super::gateway::post_sessionless_call(addr, &token, id, "wire", json!({"amount": 9}));
        assert_eq!(status, 200, "{raw}");
        serde_json::from_str(raw.split_once("\r\n\r\n").unwrap().1).unwrap()
    };
    let gateway_addr = |gw: &Gateway| gw.http.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let relay = ForeignRelay::start(&gateway_addr(&gw));
    let first = call(&relay.addr(), 1);
    let id =
        first["result"]["structuredContent"]["execution_id"].as_str().unwrap_or_else(|| panic!("{first}")).to_owned();
    assert_eq!(first["result"]["structuredContent"]["state"], "completed", "{first}");
    // The answer was lost on the way (as far as the agent knows): it asks again, a new POST.
    let again = call(&relay.addr(), 2);
    assert_eq!(again["result"]["structuredContent"]["execution_id"], id.as_str(), "{again}");
    let runs: Vec<Value> = gw.sessions().into_iter().filter(|s| s["actor"] == "agent:relayed").collect();
    assert_eq!(runs.len(), 1, "one run for the token: {runs:?}");
    assert!(runs[0]["pid"].is_null() && runs[0]["ended_at"].is_null(), "no process, still open: {runs:?}");

    // The gateway restarts; the token's run is kept, and the repeat still matches.
    let gw = gw.crash_and_restart(&target.manifest());
    let relay = ForeignRelay::start(&gateway_addr(&gw));
    let after = call(&relay.addr(), 3);
    assert_eq!(after["result"]["structuredContent"]["execution_id"], id.as_str(), "{after}");
    assert_eq!(target.posts(), 1, "one wire for one intent");
    let runs: Vec<Value> = gw.sessions().into_iter().filter(|s| s["actor"] == "agent:relayed").collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
}

/// The idle lease ends a token's run without a process once nothing used it for that long
/// (`--run-idle`, here 1 s); the Sessions journal says why.
#[test]
fn a_token_run_without_a_process_ends_when_its_idle_lease_runs_out() {
    let target = Target::start();
    let gw = Gateway::start_with(tempfile::tempdir().unwrap(), &target.manifest(), &[("POSTERN_RUN_IDLE", "1")]);
    let token = gw.add_agent("brief");
    let relay = ForeignRelay::start(gw.http.trim_start_matches("http://").trim_end_matches("/mcp"));
    let (status, raw) = super::gateway::post_sessionless_call(&relay.addr(), &token, 1, "balance", json!({}));
    assert_eq!(status, 200, "{raw}");
    eventually("the idle lease to end the run", LONG, || {
        gw.sessions()
            .into_iter()
            .find(|s| s["actor"] == "agent:brief" && !s["ended_at"].is_null())
            .map(|s| assert_eq!(s["end_reason"], "idle_lease_expired", "{s}"))
    });
}

/// Regression (#27 finding 8): a restarted agent's repeat is a new intent (a new run), but it
/// was a fresh execution with no past: nothing linked it to the earlier one. Its `accepted` row
/// now names the earlier execution of the same effect, the incident record lists it, and a
/// reviewer asked about it is told (`approval::tests`).
#[test]
fn a_restarted_agents_repeat_is_linked_to_the_earlier_run() {
    use super::gateway_support::{Agent, Sdk};
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let id_of = |v: &Value| v["structured"]["execution_id"].as_str().unwrap_or_else(|| panic!("{v}")).to_owned();
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    let first = id_of(&agent.call_and_wait("first", "wire", json!({ "amount": 12 })));
    drop(agent);
    let mut restarted = Agent::start(Sdk::Python);
    restarted.connect(gw.bridge_command());
    let again = id_of(&restarted.call_and_wait("again", "wire", json!({ "amount": 12 })));
    assert_ne!(again, first, "a new run is a new intent");
    let other = id_of(&restarted.call_and_wait("other", "wire", json!({ "amount": 13 })));

    let accepted =
        |id: &str| gw.activity().into_iter().find(|r| r["execution_id"] == id && r["event"] == "accepted").unwrap();
    let earlier = &accepted(&again)["detail"]["earlier_effect"];
    assert_eq!(earlier["execution_id"], first.as_str(), "{earlier}");
    assert!(
        earlier["state"].as_str().is_some_and(|s| s.starts_with("completed") || s == "result_delivered"),
        "{earlier}"
    );
    assert!(accepted(&other)["detail"]["earlier_effect"].is_null(), "another effect has no earlier run");
    assert_eq!(accepted(&first)["detail"]["effect_fingerprint"], accepted(&again)["detail"]["effect_fingerprint"]);
    assert_ne!(accepted(&first)["detail"]["fingerprint"], accepted(&again)["detail"]["fingerprint"]);

    let shown = gw.postern(&["execution", "show", &again, "--json"]);
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    let incident: Value = serde_json::from_str(&shown.stdout).unwrap();
    let related: Vec<&str> = incident["incident"]["related"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["execution_id"].as_str().unwrap())
        .collect();
    assert_eq!(related, [first.as_str()], "{incident}");
}

/// Sends `request` (raw HTTP) and closes the connection without reading the answer once `until`
/// holds: a 2026-07-28 client whose response stream broke.
fn send_then_close(addr: &str, request: &str, until: impl FnMut() -> Option<()>) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    eventually("the moment to close the stream", LONG, until);
    drop(stream);
}

/// #27, 2026-07-28 ("closing a response stream MUST be treated as cancellation"): a stream
/// closed after the request was sent keeps the outcome. The payment happened once; the
/// execution completes, journals the cancellation request, and the call re-issued as a new
/// request (a new id, as the revision says) is answered from it: still one payment.
#[test]
fn a_stream_closed_after_dispatch_keeps_the_outcome_for_the_reissued_call() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let token = gw.add_agent("closer");
    let addr = gw.http.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    target.hold();
    let request = super::gateway::sessionless_call_request(&addr, &token, 1, "wire", json!({ "amount": 31 }));
    send_then_close(&addr, &request, || (target.posts() == 1).then_some(()));
    target.release();
    let id = eventually("the execution to finish", LONG, || {
        let id = gw.executions_of("wire").pop()?;
        gw.events_of(&id).contains(&"cancel_requested".to_owned()).then_some(id)
    });
    assert!(state_of(&gw, &id).starts_with("completed"), "{:?}", gw.events_of(&id));
    let (status, raw) = super::gateway::post_sessionless_call(&addr, &token, 2, "wire", json!({ "amount": 31 }));
    assert_eq!(status, 200, "{raw}");
    let again: Value = serde_json::from_str(raw.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(again["result"]["structuredContent"]["execution_id"], id.as_str(), "{again}");
    assert_eq!(target.posts(), 1, "one payment");
}

/// #27: a 2026-07-28 agent has no session, so its side-effecting results were never counted
/// as delivered. The evidence is now its run's: the client's kernel acknowledged the answer, and
/// the agent then called another tool (a repeat of the same tool confirms nothing: it may be
/// the retry of an answer that was lost).
#[test]
fn a_sessionless_result_is_delivered_when_its_run_carries_on() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let token = gw.add_agent("carrier");
    let addr = gw.http.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let call = |id: u32, tool: &str, arguments: Value| -> Value {
        let (status, raw) = super::gateway::post_sessionless_call(&addr, &token, id, tool, arguments);
        assert_eq!(status, 200, "{raw}");
        serde_json::from_str(raw.split_once("\r\n\r\n").unwrap().1).unwrap()
    };
    let first = call(1, "wire", json!({ "amount": 3 }));
    let id = first["result"]["structuredContent"]["execution_id"].as_str().unwrap().to_owned();
    let other = call(2, "wire", json!({ "amount": 4 }));
    let other = other["result"]["structuredContent"]["execution_id"].as_str().unwrap().to_owned();
    assert_eq!(state_of(&gw, &id), "completed", "a call of the same tool is no evidence");
    call(3, "balance", json!({}));
    eventually("both results journaled as delivered", LONG, || {
        (state_of(&gw, &id) == "result_delivered" && state_of(&gw, &other) == "result_delivered").then_some(())
    });
    assert_eq!(target.posts(), 2);
}
