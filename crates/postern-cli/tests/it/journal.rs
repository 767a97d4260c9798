//! `postern status`, `activity`, `sessions`, `execution show`.

use crate::support::*;

#[test]
fn status_creates_a_journal_and_recovers_dispatched_executions_once() {
    let fresh = tempfile::tempdir().expect("tempdir");
    let nested = fresh.path().join("a/b");
    let run = postern(&["--data-dir", nested.to_str().expect("utf-8"), "status"], None);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("journal     0 rows"), "{}", run.stdout);
    assert!(nested.join("postern.db").is_file());

    let j = journal(2);
    let run = postern(&["status"], Some(j.data_dir()));
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("recovered   1 execution(s) left dispatched"), "{}", run.stdout);
    assert!(run.stdout.contains(&exec(999).to_string()), "{}", run.stdout);
    let run = postern(&["status", "--json"], Some(j.data_dir()));
    let status: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    assert_eq!(status["recovered_to_outcome_unknown"], serde_json::json!([]));
    assert_eq!(status["executions_by_state"]["outcome_unknown"], 1);
    assert_eq!(status["executions_by_state"]["result_delivered"], 2);
}

#[test]
fn read_commands_explain_a_missing_journal_and_reject_bad_ids() {
    let empty = tempfile::tempdir().expect("tempdir");
    let run = postern(&["activity"], Some(empty.path()));
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("no Postern journal at"), "{}", run.stderr);
    assert!(run.stderr.contains("postern status"), "{}", run.stderr);
    assert!(!empty.path().join("postern.db").exists(), "reading must not create a journal");

    let j = journal(1);
    let run = postern(&["execution", "show", "act_not-an-id"], Some(j.data_dir()));
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("must be 30 characters long"), "{}", run.stderr);
    let run = postern(&["execution", "show", &exec(12345).to_string()], Some(j.data_dir()));
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("no execution act_"), "{}", run.stderr);
}

#[test]
fn activity_filters_by_execution_and_session_in_both_formats() {
    let j = journal(3);
    let run = postern(&["activity", "--execution", &exec(2).to_string(), "--json"], Some(j.data_dir()));
    assert_eq!(run.code, 0, "{}", run.stderr);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&run.stdout).expect("json");
    let events: Vec<&str> = rows.iter().map(|r| r["event"].as_str().expect("event")).collect();
    assert_eq!(events, ["accepted", "authorized", "dispatched", "completed", "result_delivered"]);
    assert!(rows.iter().all(|r| r["execution_id"] == exec(2).to_string()));
    assert!(rows.iter().all(|r| r["row_hash"].as_str().expect("hash").starts_with("sha256:")));

    let run = postern(&["activity", "--session", &session().to_string(), "--limit", "4"], Some(j.data_dir()));
    assert_eq!(run.code, 0, "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "header + 4 rows:\n{}", run.stdout);
    assert!(lines[0].contains("seq") && lines[0].contains("event"));
    assert!(lines[4].contains("dispatched") && lines[4].contains(&exec(999).to_string()), "{}", run.stdout);

    let run = postern(&["sessions", "--json"], Some(j.data_dir()));
    let sessions: Vec<serde_json::Value> = serde_json::from_str(&run.stdout).expect("json");
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0]["executions"], 4);
    assert_eq!(sessions[0]["client"], "test-agent 1.0");
    let run = postern(&["sessions"], Some(j.data_dir()));
    assert!(run.stdout.contains("stdio") && run.stdout.contains("active"), "{}", run.stdout);
}

#[test]
fn execution_show_prints_the_lifecycle_timeline() {
    let j = journal(1);
    let run = postern(&["execution", "show", &exec(1).to_string()], Some(j.data_dir()));
    assert_eq!(run.code, 0, "{}", run.stderr);
    insta::assert_snapshot!(run.stdout);
    let run = postern(&["execution", "show", &exec(1).to_string(), "--json"], Some(j.data_dir()));
    let shown: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    assert_eq!(shown["execution"]["state"], "result_delivered");
    assert_eq!(shown["timeline"].as_array().expect("timeline").len(), 5);
    assert_eq!(shown["result"]["sha256"].as_str().expect("sha").len(), 64);
}

#[test]
fn tools_check_lists_tools_or_every_located_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "[[tool]]\nname = \"refund\"\nmethod = \"POST\"\nurl = \"https://pay.example/v1/refunds\"\ncredential = \"pay\"\n\
         contract = { class = \"idempotency_key\", idempotency_header = \"Idempotency-Key\" }\n\
         [[tool]]\nname = \"list_refunds\"\nmethod = \"GET\"\nurl = \"https://pay.example/v1/refunds\"\n",
    )
    .expect("write");
    let run = postern(&["tools", "check", good.to_str().expect("utf-8")], None);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("refund") && run.stdout.contains("idempotency_key"), "{}", run.stdout);
    // A contract that rests on the verb alone says so.
    assert!(run.stdout.contains("read_only (by its GET verb)"), "{}", run.stdout);

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "\n[[tool]]\nname = \"deploy\"\nmethod = \"POST\"\nurl = \"https://deploy.example/v1\"\n")
        .expect("write");
    let run = postern(&["tools", "check", bad.to_str().expect("utf-8")], None);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains(&format!("{}:2: tool \"deploy\":", bad.display())), "{}", run.stderr);
    assert!(run.stderr.contains("declares no replay contract"), "{}", run.stderr);

    // Without FILE, the manifest `serve` would load: POSTERN_TOOLS names it.
    let run =
        crate::support::postern_with(&["tools", "check"], None, None, &[("POSTERN_TOOLS", bad.to_str().unwrap())]);
    assert_eq!(run.code, 2, "POSTERN_TOOLS is the file serve loads, so it is the file checked: {}", run.stdout);
    assert!(run.stderr.contains("declares no replay contract"), "{}", run.stderr);
}
