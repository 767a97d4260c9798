//! The journal's OpenTelemetry export end to end: `postern serve` with
//! `OTEL_EXPORTER_OTLP_ENDPOINT`, the official Python SDK as the agent (one call carrying a W3C
//! `traceparent`), and a loopback OTLP receiver that decodes what arrives with the official
//! `opentelemetry-proto` package (`tests/otel/receiver.py`). The receiver is stopped while calls
//! go on and the gateway is killed; once both are back, every execution is there and every
//! journal row since the export began, with no gap.

use super::gateway_support::{Agent, Gateway, Sdk, eventually, repo_root};
use super::support::postern_with;
use postern_testkit::target::Target;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const CANARY_SECRET: &str = "otel-canary-secret-9f2c41";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

struct Receiver {
    child: Child,
}

impl Receiver {
    fn start(dir: &Path, port: u16) -> Receiver {
        let child = Command::new(repo_root().join("tests/clients/python/.venv/bin/python"))
            .arg(repo_root().join("tests/otel/receiver.py"))
            .args([&port.to_string(), dir.to_str().unwrap()])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        eventually("the OTLP receiver listening", Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        });
        Receiver { child }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lines(path: PathBuf) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The spans received, by execution id.
fn spans(dir: &Path) -> Vec<Value> {
    lines(dir.join("spans.jsonl"))
}

fn span_of<'a>(spans: &'a [Value], execution: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["attributes"]["postern.execution.id"] == execution).collect()
}

fn execution_of(result: &Value) -> String {
    result["structured"]["execution_id"].as_str().unwrap_or_else(|| panic!("no execution: {result}")).to_owned()
}

#[test]
fn every_execution_is_a_span_and_every_row_a_log_record_across_an_outage_and_a_restart() {
    let target = Target::start();
    let base = target.base();
    let host = base.trim_start_matches("http://").to_owned();
    let otlp = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let receiver = Receiver::start(otlp.path(), port);
    let manifest = format!(
        r#"{}
[[tool]]
name = "secret_balance"
description = "Read the balance with a credential."
method = "GET"
url = "{base}/balance"
credential = "tok"

[export]
arguments = ["pay"]
"#,
        target.manifest()
    );
    let data = tempfile::tempdir().unwrap();
    let add = postern_with(
        &["vault", "add", "tok", "--kind", "bearer", "--host", &host],
        Some(data.path()),
        Some(&format!("{CANARY_SECRET}\n")),
        &[],
    );
    assert_eq!(add.code, 0, "{}", add.stderr);
    let endpoint = format!("http://127.0.0.1:{port}");
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())];
    let gw = Gateway::start_with(data, &manifest, &env);
    // Where the export begins: the journal's end when it first started (its bookmark then).
    let begun = eventually("the export's bookmark", Duration::from_secs(20), || {
        let s: Value = serde_json::from_str(&gw.postern(&["status", "--json"]).stdout).ok()?;
        s["export"]["otlp"]["seq"].as_u64()
    });
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());

    agent.call_with_meta("pay", "pay", json!({ "amount": 4 }), json!({ "traceparent": TRACEPARENT }));
    let pay = execution_of(&agent.result("pay"));
    let wire = execution_of(&agent.call_and_wait("wire", "wire", json!({ "amount": 7_777_123 })));
    let balance = execution_of(&agent.call_and_wait("balance", "balance", json!({})));
    let secret = execution_of(&agent.call_and_wait("secret", "secret_balance", json!({})));
    let first = [pay.clone(), wire.clone(), balance.clone(), secret.clone()];
    eventually("a span for each execution", Duration::from_secs(30), || {
        let all = spans(otlp.path());
        first.iter().all(|id| !span_of(&all, id).is_empty()).then_some(())
    });

    let all = spans(otlp.path());
    for id in &first {
        assert_eq!(span_of(&all, id).len(), 1, "one span per execution: {id}");
    }
    let pay_span = span_of(&all, &pay)[0];
    let a = &pay_span["attributes"];
    assert_eq!(pay_span["name"], "tools/call pay");
    assert_eq!(pay_span["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736", "the agent's trace");
    assert_eq!(pay_span["parent_span_id"], "00f067aa0ba902b7", "parented by the agent's span");
    assert_eq!(a["mcp.method.name"], "tools/call");
    assert_eq!(a["gen_ai.operation.name"], "execute_tool");
    assert_eq!(a["gen_ai.tool.name"], "pay");
    assert_eq!(a["network.transport"], "pipe");
    assert_eq!(a["postern.execution.state"], "completed");
    assert_eq!(a["postern.retry.decision"], "new_execution");
    assert!(a["postern.intent.fingerprint"].as_str().unwrap().starts_with("hmac-sha256:"), "{a}");
    assert!(a["postern.actor"].as_str().unwrap().starts_with("process:"), "{a}");
    assert!(a["postern.approval.rung"].is_string(), "{a}");
    assert!(
        a["postern.journal.seq"].is_i64() && a["postern.journal.row_hash"].as_str().unwrap().starts_with("sha256:"),
        "{a}"
    );
    assert!(a["mcp.protocol.version"].is_string() && a["jsonrpc.request.id"].is_string(), "{a}");
    assert!(a.get("mcp.session.id").is_none(), "no MCP session over stdio: {a}");
    assert_eq!(a["postern.tool.arguments"], "{\"amount\":4}", "pay's arguments are exported: the owner named it");
    let events: Vec<&str> =
        pay_span["events"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(events.first(), Some(&"accepted"), "{events:?}");
    assert!(events.contains(&"dispatched") && events.last() == Some(&"completed"), "{events:?}");
    // A read-only call is two journal rows (its steps to the dispatch folded into `accepted`, then
    // `completed`), and still a span event per step.
    let balance_span = span_of(&all, &balance)[0];
    let events: Vec<&str> =
        balance_span["events"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(events, ["accepted", "authorized", "dispatched", "completed"]);
    let wire_span = span_of(&all, &wire)[0];
    assert!(wire_span["attributes"].get("postern.tool.arguments").is_none(), "wire's arguments stay home");
    assert_ne!(wire_span["trace_id"], pay_span["trace_id"], "a call without a traceparent has its own trace");
    assert_eq!(wire_span["parent_span_id"], "");
    assert_eq!(wire_span["resource"]["service.name"], "postern");
    assert!(wire_span["resource"]["host.name"].is_string(), "{}", wire_span["resource"]);

    // The endpoint goes away; calls go on, undelayed by it, and status says how far behind.
    drop(receiver);
    let b1 = execution_of(&agent.call_and_wait("b1", "balance", json!({})));
    let b2 = execution_of(&agent.call_and_wait("b2", "pay", json!({ "amount": 9 })));
    eventually("the export's lag and error in status", Duration::from_secs(30), || {
        let status = gw.postern(&["status", "--json"]);
        let s: Value = serde_json::from_str(&status.stdout).ok()?;
        (s["export"]["lag_rows"].as_u64()? > 0 && s["export"]["otlp"]["last_error"].is_string()).then_some(())
    });
    let doctor = gw.postern(&["doctor"]);
    assert!(doctor.stdout.contains("row(s) behind; last error"), "{}", doctor.stdout);

    // The gateway is killed, the endpoint comes back, the gateway restarts: the rest arrives.
    let gw = gw.crash_and_restart_with(&manifest, &env);
    let _receiver = Receiver::start(otlp.path(), port);
    let ids: Vec<String> = first.iter().cloned().chain([b1, b2]).collect();
    eventually("every execution exported after the outage", Duration::from_secs(60), || {
        let all = spans(otlp.path());
        ids.iter().all(|id| !span_of(&all, id).is_empty()).then_some(())
    });
    eventually("the export caught up", Duration::from_secs(30), || {
        let status = gw.postern(&["status", "--json"]);
        let s: Value = serde_json::from_str(&status.stdout).ok()?;
        (s["export"]["lag_rows"].as_u64()? == 0).then_some(())
    });
    let head: Value = serde_json::from_str(&gw.postern(&["status", "--json"]).stdout).unwrap();
    let head = head["journal"]["size"].as_u64().unwrap();
    let mut seqs: Vec<u64> = lines(otlp.path().join("logs.jsonl"))
        .iter()
        .map(|l| l["attributes"]["postern.journal.seq"].as_u64().unwrap())
        .collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs, (begun + 1..=head).collect::<Vec<_>>(), "every row since the export began, no gap");
    // A batch cut by the outage is sent again (at least once): the same span, with the same ids.
    let all = spans(otlp.path());
    for id in &ids {
        let sent: std::collections::BTreeSet<(String, String)> = span_of(&all, id)
            .iter()
            .map(|s| (s["trace_id"].as_str().unwrap().to_owned(), s["span_id"].as_str().unwrap().to_owned()))
            .collect();
        assert_eq!(sent.len(), 1, "one span per execution, the outage and restart included: {id} {sent:?}");
    }
    let logs = lines(otlp.path().join("logs.jsonl"));
    let dispatched = logs
        .iter()
        .find(|l| l["attributes"]["postern.execution.id"] == pay.as_str() && l["body"] == "dispatched")
        .expect("pay's dispatched row");
    assert_eq!(dispatched["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736", "a row's record is in its span's trace");
    assert_eq!(dispatched["span_id"], pay_span["span_id"]);
    // ... and a log record per step, each naming the row that holds it.
    let balance_records: std::collections::BTreeSet<(u64, String)> = logs
        .iter()
        .filter(|l| l["attributes"]["postern.execution.id"] == balance.as_str())
        .map(|l| (l["attributes"]["postern.journal.seq"].as_u64().unwrap(), l["body"].as_str().unwrap().to_owned()))
        .collect();
    let steps: Vec<&str> = balance_records.iter().map(|(_, body)| body.as_str()).collect();
    let rows: std::collections::BTreeSet<u64> = balance_records.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(rows.len(), 2, "{balance_records:?}");
    for step in ["accepted", "authorized", "dispatched", "completed"] {
        assert!(steps.contains(&step), "{step}: {balance_records:?}");
    }

    // An endpoint that refuses for good (HTTP 400) does not stop the export: the batch is halved
    // down to the row it cannot take, which is skipped with its reason, and the export moves on.
    std::fs::write(otlp.path().join("reject"), "").unwrap();
    agent.drop_connection();
    agent.connect(gw.bridge_command());
    let refused = agent.call_and_wait("refused", "balance", json!({}));
    assert_eq!(refused["structured"]["state"], "completed", "{refused}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let status = gw.postern(&["status", "--json"]).stdout;
        let s: Value = serde_json::from_str(&status).unwrap_or_default();
        let error = s["export"]["otlp"]["last_error"].as_str().unwrap_or_default().to_owned();
        if s["export"]["lag_rows"].as_u64() == Some(0) && error.contains("refused by the endpoint and skipped") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the refused rows were not skipped: {status}\n{}",
            gw.stderr.lock().unwrap().lines().rev().take(30).collect::<Vec<_>>().join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::fs::remove_file(otlp.path().join("reject")).unwrap();

    // Nothing the owner did not name leaves: not the credential, not wire's arguments, not the
    // target's address.
    let raw = std::fs::read(otlp.path().join("raw.bin")).unwrap();
    for needle in [CANARY_SECRET, "7777123", host.as_str()] {
        assert!(!raw.windows(needle.len()).any(|w| w == needle.as_bytes()), "{needle} reached the OTLP endpoint");
    }
    assert_eq!(postern_testkit::file_containing(gw.path(), CANARY_SECRET), None);
}
