//! The no-duplicate promise end to end, under faults: bridges killed or frozen after dispatch,
//! the gateway killed between completion and delivery, full disks, crash points at every durable
//! boundary, HTTP connections cut, streams broken and resumed — driven by the official Python and
//! TypeScript MCP SDKs against a loopback target that counts side effects.

use super::gateway::{LONG, assert_answered_from_first, only_execution_of, state_of};
use super::gateway_support::{Agent, CutProxy, Gateway, Sdk, SmallDisk, Target, eventually, freeze, kill};
use serde_json::{Value, json};
use std::time::Duration;

/// The decisive scenario over stdio: the bridge dies after the target executed and before the
/// answer reached the agent; the same agent process starts a new bridge and repeats the call.
fn stdio_bridge_killed_after_dispatch(sdk: Sdk, tool: &str) {
    let target = Target::start();
    let gw = Gateway::start(&target.manifest());
    let mut agent = Agent::start(sdk);
    let connected = agent.connect(gw.bridge_command());
    assert_eq!(connected["event"], "connected", "{connected}");
    if sdk == Sdk::PythonDiscover {
        assert_eq!(connected["protocol"], "2026-07-28", "{connected}");
    }
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
fn python_discover_stdio_bridge_killed_after_dispatch_idempotency_key() {
    stdio_bridge_killed_after_dispatch(Sdk::PythonDiscover, "pay");
}

#[test]
fn typescript_stdio_bridge_killed_after_dispatch_idempotency_key() {
    stdio_bridge_killed_after_dispatch(Sdk::TypeScript, "pay");
}

#[test]
fn typescript_stdio_bridge_killed_after_dispatch_irreversible() {
    stdio_bridge_killed_after_dispatch(Sdk::TypeScript, "wire");
}

#[test]
fn typescript_client_stdio_bridge_killed_after_dispatch_idempotency_key() {
    stdio_bridge_killed_after_dispatch(Sdk::TypeScriptClient, "pay");
}

#[test]
fn typescript_client_stdio_bridge_killed_after_dispatch_irreversible() {
    stdio_bridge_killed_after_dispatch(Sdk::TypeScriptClient, "wire");
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
    if matches!(sdk, Sdk::TypeScriptClient | Sdk::PythonDiscover) {
        // A sessionless agent: its run stands in for the session (a repeat matched, delivery).
        assert_eq!(connected["protocol"], "2026-07-28", "{connected}");
    }

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
fn python_discover_http_connection_cut_after_dispatch_irreversible() {
    http_connection_cut_after_dispatch(Sdk::PythonDiscover, "wire");
}

#[test]
fn typescript_http_connection_cut_after_dispatch_idempotency_key() {
    http_connection_cut_after_dispatch(Sdk::TypeScript, "pay");
}

#[test]
fn typescript_http_connection_cut_after_dispatch_irreversible() {
    http_connection_cut_after_dispatch(Sdk::TypeScript, "wire");
}

#[test]
fn typescript_client_http_connection_cut_after_dispatch_idempotency_key() {
    http_connection_cut_after_dispatch(Sdk::TypeScriptClient, "pay");
}

#[test]
fn typescript_client_http_connection_cut_after_dispatch_irreversible() {
    http_connection_cut_after_dispatch(Sdk::TypeScriptClient, "wire");
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
