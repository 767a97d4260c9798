//! `postern audit verify` / `checkpoint` as an incident responder uses them.

use crate::support::*;

#[test]
fn verify_refuses_unusable_input_with_exit_2_and_names_the_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing.db");
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").expect("write");
    let text = dir.path().join("text.db");
    std::fs::write(&text, "id,amount\n1,500\n".repeat(20)).expect("write");
    let foreign = dir.path().join("foreign.db");
    rusqlite::Connection::open(&foreign)
        .expect("create")
        .execute_batch("CREATE TABLE notes (body TEXT)")
        .expect("table");
    let newer = journal(1);
    rusqlite::Connection::open(newer.db()).expect("open").pragma_update(None, "user_version", 42).expect("bump");

    let newer_message = format!(
        "schema version 42 is newer than this postern supports ({}); upgrade postern",
        postern_store::supported_version()
    );
    let cases = [
        (missing.clone(), "no such file"),
        (empty.clone(), "the file is empty (0 bytes)"),
        (text.clone(), "not an SQLite database"),
        (foreign.clone(), "not a Postern one"),
        (newer.db(), newer_message.as_str()),
    ];
    for (path, message) in cases {
        let before = std::fs::read(&path).ok();
        let run = postern(&["audit", "verify", "--db", path.to_str().expect("utf-8")], None);
        assert_eq!(run.code, 2, "{}: {}", path.display(), run.stderr);
        assert!(run.stderr.contains(message), "{}: {}", path.display(), run.stderr);
        assert!(run.stderr.contains(path.to_str().expect("utf-8")), "names the file: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{}", run.stdout);
        assert_eq!(std::fs::read(&path).ok(), before, "verify must not create or change {}", path.display());
    }
}

#[test]
fn verify_reports_intact_then_names_a_tampered_row() {
    let j = journal(4);
    let run = postern(&["audit", "verify"], Some(j.data_dir()));
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("rows        24\n"), "{}", run.stdout);
    assert!(run.stdout.contains("executions  5\n"), "{}", run.stdout);
    assert!(run.stdout.contains("sessions    1\n"), "{}", run.stdout);
    assert!(run.stdout.contains("result      INTACT"), "{}", run.stdout);

    tamper(&j.db(), "DELETE FROM journal WHERE seq = 7");
    let run = postern(&["audit", "verify", "--db", j.db().to_str().expect("utf-8")], None);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("TAMPERING FOUND\n  - row 7: missing (deleted)"), "{}", run.stdout);

    let run = postern(&["audit", "verify", "--json"], Some(j.data_dir()));
    assert_eq!(run.code, 1);
    let report: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    assert_eq!(report["intact"], false);
    assert_eq!(report["findings"][0], serde_json::json!({"kind": "missing", "from": 7, "to": 7}));
    assert!(report["elapsed_ms"].is_u64());
}

#[test]
fn an_exported_checkpoint_catches_a_cut_off_tail() {
    let j = journal(3);
    let cp = j.data_dir().join("head.json");
    let run = postern(&["audit", "checkpoint", "--out", cp.to_str().expect("utf-8")], Some(j.data_dir()));
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.contains("keep a copy off this machine"), "{}", run.stderr);
    let exported: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cp).expect("read")).expect("json");
    assert_eq!(exported["format"], "postern-checkpoint/1");
    let size = exported["journal_size"].as_u64().expect("size");

    let cp_arg = cp.to_str().expect("utf-8");
    assert_eq!(postern(&["audit", "verify", "--checkpoint", cp_arg], Some(j.data_dir())).code, 0);
    tamper(&j.db(), &format!("DELETE FROM journal WHERE seq > {}", size - 2));
    let run = postern(&["audit", "verify", "--checkpoint", cp_arg], Some(j.data_dir()));
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(
        run.stdout
            .contains(&format!("journal truncated: it ends at row {} but the checkpoint covers {size} rows", size - 2)),
        "{}",
        run.stdout
    );

    std::fs::write(&cp, "{\"format\": \"something-else\"}").expect("write");
    let run = postern(&["audit", "verify", "--checkpoint", cp_arg], Some(j.data_dir()));
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("not a Postern checkpoint"), "{}", run.stderr);
    let run = postern(&["audit", "verify", "--checkpoint", "/nonexistent/cp.json"], Some(j.data_dir()));
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("cannot read checkpoint /nonexistent/cp.json"), "{}", run.stderr);
}
