//! The journal's own rules: append-only, chained, versioned, and refusing files it cannot own.

use crate::support::*;
use postern_core::{Actor, ErrorCode, ExecutionState};
use postern_store::{JournalView, SessionStart, Store, StoreError, Unusable, journal::chain_hash};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::sync::Arc;

#[test]
fn update_and_delete_on_the_journal_are_refused_by_the_database() {
    let fx = Fixture::new();
    let store = fx.open();
    populate(&store, 2);
    drop(store);
    let conn = rusqlite::Connection::open(&fx.path).expect("open");
    let err = conn.execute("UPDATE journal SET body = body || ' ' WHERE seq = 1", []).unwrap_err();
    assert!(err.to_string().contains("append-only; UPDATE refused"), "{err}");
    let err = conn.execute("DELETE FROM journal WHERE seq = 1", []).unwrap_err();
    assert!(err.to_string().contains("append-only; DELETE refused"), "{err}");
    let err = conn.execute("UPDATE results SET body = x'00'", []).unwrap_err();
    assert!(err.to_string().contains("immutable"), "{err}");
    let err = conn.execute("DELETE FROM results", []).unwrap_err();
    assert!(err.to_string().contains("immutable"), "{err}");
    let rows: i64 = conn.query_row("SELECT count(*) FROM journal", [], |r| r.get(0)).expect("count");
    assert_eq!(rows, 10);
}

#[test]
fn every_row_hash_is_sha256_of_previous_hash_and_canonical_body() {
    let fx = Fixture::new();
    let store = fx.open();
    populate(&store, 3);
    drop(store);
    let conn = rusqlite::Connection::open(&fx.path).expect("open");
    let mut stmt = conn.prepare("SELECT seq, body, row_hash FROM journal ORDER BY seq").expect("prepare");
    let rows: Vec<(i64, String, Vec<u8>)> =
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).expect("query").map(Result::unwrap).collect();
    let mut prev = [0u8; 32];
    for (seq, body, hash) in rows {
        // Independent recomputation with sha2 directly.
        let mut h = Sha256::new();
        h.update(prev);
        h.update(body.as_bytes());
        let expected: [u8; 32] = h.finalize().into();
        assert_eq!(hash, expected, "row {seq}");
        assert_eq!(chain_hash(&prev, body.as_bytes()), expected);
        // The body is canonical JSON of the row and carries its own position.
        let value: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(postern_core::canonical_bytes(&value).expect("canonical"), body.as_bytes());
        assert_eq!(value["head"]["seq"], json!(seq));
        assert!(body.starts_with("{\"head\":{"), "{body}");
        prev = expected;
    }
}

#[test]
fn sessions_are_journaled_and_end_once() {
    let fx = Fixture::new();
    let store = fx.open();
    let s = session(7);
    store
        .start_session(SessionStart {
            id: s,
            actor: Actor::process("/usr/bin/agent", "abc123"),
            pid: Some(4242),
            process_start: Some(987_654),
            transport: "stdio".into(),
            client: Some("claude-code 2.1".into()),
            at: at(0),
        })
        .expect("start");
    run_to_delivery(&store, payment(exec_id(1), 5, s, at(10)), 201);
    let err = store
        .start_session(SessionStart {
            id: s,
            actor: Actor::process("/usr/bin/agent", "abc123"),
            pid: None,
            process_start: None,
            transport: "stdio".into(),
            client: None,
            at: at(20),
        })
        .unwrap_err();
    assert_eq!(err.code(), "duplicate_session");
    store.end_session(s, "agent_exited", at(30)).expect("end");
    assert_eq!(store.end_session(s, "agent_exited", at(31)).unwrap_err().code(), "session_ended");
    assert_eq!(store.end_session(session(8), "x", at(31)).unwrap_err().code(), "unknown_session");
    let sessions = store.view().sessions().expect("sessions");
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0].executions, 1);
    assert_eq!(sessions[0].ended_at, Some(at(30).as_millis()));
    assert_eq!(sessions[0].end_reason.as_deref(), Some("agent_exited"));
    // Activity rows of the session's executions carry the session id, so they can be filtered.
    let rows = store
        .view()
        .activity(&postern_store::ActivityFilter { session: Some(s), limit: 100, ..Default::default() })
        .expect("activity");
    assert_eq!(rows.len(), 5);
}

#[test]
fn journal_payload_shape_is_pinned() {
    let fx = Fixture::new();
    let store = fx.open();
    let id = exec_id(1);
    store.admit(payment(id, 1250, session(1), at(0))).expect("admit");
    store
        .transition(id, ExecutionState::Authorized, json!({"rung": "session", "approved_by": "reviewer"}), at(1))
        .expect("auth");
    store.transition(id, ExecutionState::Dispatched, json!({"attempt": 1}), at(2)).expect("dispatch");
    store
        .transition(id, ExecutionState::OutcomeUnknown, json!({"reason": "reset_after_send"}), at(3))
        .expect("unknown");
    let bodies: Vec<serde_json::Value> = store
        .view()
        .timeline(id)
        .expect("timeline")
        .into_iter()
        .map(|e| serde_json::to_value(&e).expect("json"))
        .collect();
    insta::assert_json_snapshot!(bodies);
}

/// A read-only call's rows as stored: `accepted` with its steps up to the dispatch folded in
/// (each with its time and detail), then `completed` with the result's digest.
#[test]
fn a_read_only_calls_folded_rows_are_pinned() {
    let fx = Fixture::new();
    let store = fx.open();
    let id = exec_id(1);
    let mut read = payment(id, 7, session(1), at(0));
    read.contract = postern_core::ReplayContract::read_only();
    store
        .record_read_only_detached(
            read,
            vec![
                step(ExecutionState::Authorized, json!({"rung": "allowlist"}), at(1)),
                step(ExecutionState::Dispatched, json!({"method": "GET", "target": "http://127.0.0.1:9/items"}), at(2)),
            ],
            Some(postern_store::Completion { outcome: json!({"http_status": 200}), result: b"[]".to_vec(), at: at(4) }),
        )
        .expect("read");
    store.flush().expect("flush");
    let bodies: Vec<serde_json::Value> = store
        .view()
        .rows_after(0, 100)
        .expect("rows")
        .into_iter()
        .filter(|e| e.row.execution_id == Some(id))
        .map(|e| serde_json::to_value(&e).expect("json"))
        .collect();
    insta::assert_json_snapshot!(bodies);
}

/// A read-only lifecycle the state machine refuses anywhere (here: steps after a terminal
/// state) writes nothing at all, and the journal still verifies. It is checked whole before
/// the `executions` row is inserted where it ends, never step by step against that row.
#[test]
fn a_read_only_lifecycle_refused_anywhere_writes_nothing() {
    let fx = Fixture::new();
    let store = fx.open();
    let id = exec_id(1);
    let mut read = payment(id, 7, session(1), at(0));
    read.contract = postern_core::ReplayContract::read_only();
    let steps = [
        ExecutionState::Authorized,
        ExecutionState::Dispatched,
        ExecutionState::FailedBeforeDispatch,
        ExecutionState::Dispatched,
        ExecutionState::OutcomeUnknown,
    ];
    let steps = steps.iter().enumerate().map(|(i, state)| step(*state, json!({}), at(i as i64 + 1))).collect();
    store.record_read_only_detached(read, steps, None).expect("submitted");
    store.flush().expect("flush");
    let rows = store.view().rows_after(0, 100).expect("rows");
    assert!(rows.iter().all(|e| e.row.execution_id != Some(id)), "nothing journaled for it");
    assert!(postern_store::audit::verify(&fx.path, None, &mut |_, _| {}).expect("verify").intact());
}

/// Read-only calls' rows, which nobody waits for, share commits (a batch of them waits a moment
/// for company; how much that saves is measured by `mcp_hop`, in bytes written per call): a
/// burst of reads costs fewer transactions than reads, and every row is there, in the order
/// submitted, once the journal has caught up.
#[test]
fn read_only_calls_in_a_burst_share_commits() {
    let fx = Fixture::new();
    let store = fx.open();
    let before = (store.writer_stats().transactions(), store.writer_stats().operations());
    let ids: Vec<_> = (1..=20).map(exec_id).collect();
    for (i, id) in ids.iter().enumerate() {
        submit_read(&store, *id, 1, 10 * i as i64).expect("submitted");
    }
    store.flush().expect("flush");
    let transactions = store.writer_stats().transactions() - before.0;
    let operations = store.writer_stats().operations() - before.1;
    assert_eq!(operations, 21, "twenty reads and the flush");
    assert!(transactions < operations, "{transactions} commits for {operations} writes: none shared");
    let rows = store.view().rows_after(0, 1_000).expect("rows");
    let mut journaled: Vec<_> = rows.iter().filter_map(|e| e.row.execution_id).collect();
    journaled.dedup();
    assert_eq!(journaled, ids, "every read, in the order submitted");
    assert_eq!(rows.iter().filter(|e| e.row.execution_id.is_some()).count(), 40, "two rows a read");
}

/// With a linger far longer than the test: reads submitted apart wait for each other in one
/// commit; a write somebody waits for ends the wait at once and shares that commit; and the
/// last handle going commits what is held, not dropped.
#[test]
fn a_linger_holds_reads_for_company_until_somebody_waits_or_the_store_closes() {
    let fx = Fixture::new();
    let options = postern_store::StoreOptions { linger: std::time::Duration::from_secs(600), ..Default::default() };
    let store = Arc::new(Store::open_with(&fx.path, at(0), options).expect("open").0);
    let before = store.writer_stats().transactions();
    submit_read(&store, exec_id(1), 1, 10).expect("submitted");
    // Long enough for an idle writer to have committed the first read on its own.
    std::thread::sleep(std::time::Duration::from_millis(50));
    submit_read(&store, exec_id(2), 1, 20).expect("submitted");
    let (done, flushed) = std::sync::mpsc::channel();
    let flushing = Arc::clone(&store);
    let flusher = std::thread::spawn(move || done.send(flushing.flush()));
    // A hang guard, not a timing claim: the flush returns in milliseconds unless it waits out
    // the ten-minute linger.
    let answer = flushed.recv_timeout(std::time::Duration::from_secs(60));
    answer.expect("an awaited write waited for the linger").expect("flush");
    flusher.join().expect("flusher").expect("sent");
    assert_eq!(store.writer_stats().transactions() - before, 1, "both reads and the flush in one commit");
    let completed = |store: &Store, id| {
        store.view().timeline(id).expect("timeline").last().and_then(|e| e.row.state) == Some(ExecutionState::Completed)
    };
    assert!(completed(&store, exec_id(1)) && completed(&store, exec_id(2)));

    submit_read(&store, exec_id(3), 1, 30).expect("submitted");
    drop(Arc::into_inner(store).expect("the only handle"));
    assert!(completed(&fx.open(), exec_id(3)), "held rows committed at close");
}

#[test]
fn files_postern_cannot_own_are_refused_without_being_changed() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Not SQLite.
    let text = dir.path().join("notes.db");
    std::fs::write(&text, b"this is a text file, not a database, but long enough to have a header").expect("write");
    let before = std::fs::read(&text).expect("read");
    let err = Store::open(&text, at(0)).unwrap_err();
    assert!(matches!(err, StoreError::Unusable { problem: Unusable::NotSqlite, .. }), "{err}");
    assert_eq!(std::fs::read(&text).expect("read"), before);
    // Someone else's SQLite database.
    let foreign = dir.path().join("foreign.db");
    rusqlite::Connection::open(&foreign).expect("create").execute_batch("CREATE TABLE t (x)").expect("table");
    let err = Store::open(&foreign, at(0)).unwrap_err();
    assert_eq!(err.code(), "not_postern_database");
    assert!(err.to_string().contains("not a Postern one"), "{err}");
    // An emptied file: refused, never silently restarted as a fresh journal.
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").expect("write");
    assert_eq!(Store::open(&empty, at(0)).unwrap_err().code(), "database_empty");
    // A missing file for a reader.
    assert_eq!(JournalView::open_read_only(&dir.path().join("nope.db")).unwrap_err().code(), "database_missing");
}

#[test]
fn a_newer_schema_or_an_edited_migration_is_refused() {
    let fx = Fixture::new();
    drop(fx.open());
    rusqlite::Connection::open(&fx.path).expect("open").pragma_update(None, "user_version", 99).expect("bump");
    let err = Store::open(&fx.path, at(0)).unwrap_err();
    assert_eq!(err.code(), "newer_schema");
    assert!(err.to_string().contains("schema version 99 is newer"), "{err}");
    assert_eq!(JournalView::open_read_only(&fx.path).unwrap_err().code(), "newer_schema");

    let fx = Fixture::new();
    drop(fx.open());
    rusqlite::Connection::open(&fx.path)
        .expect("open")
        .execute("UPDATE schema_migrations SET sha256 = 'edited' WHERE version = 1", [])
        .expect("edit");
    assert_eq!(Store::open(&fx.path, at(0)).unwrap_err().code(), "migration_mismatch");
}

#[cfg(unix)]
#[test]
fn the_data_directory_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let fx = Fixture::new();
    drop(fx.open());
    let mode = std::fs::metadata(fx.path.parent().expect("dir")).expect("meta").permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
}

#[test]
fn a_version_1_journal_is_upgraded_in_place_and_keeps_verifying() {
    let fx = Fixture::new();
    std::fs::create_dir_all(fx.path.parent().expect("dir")).expect("mkdir");
    {
        // A database exactly as schema v1 left it, with one execution in it.
        let conn = rusqlite::Connection::open(&fx.path).expect("create");
        let v1 = include_str!("../../src/migrations/0001_journal.sql");
        conn.execute_batch(v1).expect("v1 schema");
        conn.execute(
            "INSERT INTO schema_migrations (version, sha256, applied_at) VALUES (1, ?1, 0)",
            [hex::encode(Sha256::digest(v1.as_bytes()))],
        )
        .expect("record v1");
        conn.pragma_update(None, "user_version", 1).expect("version");
        conn.pragma_update(None, "application_id", postern_store::APPLICATION_ID).expect("app id");
    }
    let store = Store::open(&fx.path, at(0)).expect("upgrade").0;
    run_to_delivery(&store, payment(exec_id(1), 5, session(1), at(1)), 201);
    assert!(!store.view().locked().expect("lock state"), "a new vault starts unlocked");
    drop(store);
    let version: u32 = rusqlite::Connection::open(&fx.path)
        .expect("open")
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, postern_store::supported_version());
    assert!(postern_store::audit::verify(&fx.path, None, &mut |_, _| {}).expect("verify").intact());
}

/// A journal as schema v11 left it (its retry index holding reads' `accepted` rows too), with a
/// side-effecting call in flight and two newer reads of the same record: upgraded by migration
/// 12, the retry still finds the write, and the chain still verifies.
#[test]
fn a_version_11_journal_with_reads_is_upgraded_and_its_retry_still_finds_the_write() {
    let fx = Fixture::new();
    let write = exec_id(1);
    {
        let store = fx.open();
        dispatch_new(&store, payment(write, 7, session(1), at(0)));
        submit_read(&store, exec_id(2), 7, 10).expect("read");
        submit_read(&store, exec_id(3), 7, 20).expect("read");
        store.flush().expect("flush");
    }
    {
        // Back to v11: migration 13 only added the request lookup, and 12 only rebuilt this index.
        let conn = rusqlite::Connection::open(&fx.path).expect("open");
        conn.execute_batch(&format!(
            "{V13_UNDONE}
             DROP INDEX journal_retry_lookup;
             CREATE INDEX journal_retry_lookup ON journal (fingerprint, seq) WHERE event = 'accepted';
             DELETE FROM schema_migrations WHERE version = 12;
             PRAGMA user_version = 11;"
        ))
        .expect("downgrade to v11");
        let indexed: i64 = conn
            .query_row(
                "SELECT count(*) FROM journal INDEXED BY journal_retry_lookup WHERE event = 'accepted'",
                [],
                |r| r.get(0),
            )
            .expect("count");
        assert_eq!(indexed, 3, "v11 indexed the reads too");
    }
    let store = Store::open(&fx.path, at(40)).expect("upgrade").0;
    {
        let conn = rusqlite::Connection::open(&fx.path).expect("open");
        let version: u32 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).expect("version");
        assert_eq!(version, postern_store::supported_version());
        let index: String = conn
            .query_row("SELECT sql FROM sqlite_schema WHERE name = 'journal_retry_lookup'", [], |r| r.get(0))
            .expect("index");
        assert!(index.contains("IS NOT 'read_only'"), "the retry index was not rebuilt: {index}");
    }
    match store.admit(payment(exec_id(4), 7, session(1), at(50))).expect("admit") {
        postern_store::Admission::Matched { prior, decision } => {
            // Reopening recovered the write still in flight as outcome unknown: a retry verifies it.
            assert_eq!(prior.id, write);
            assert!(
                matches!(decision, postern_core::RetryDecision::VerifyPrior { prior: p, .. } if p == write),
                "{decision:?}"
            );
        }
        other => panic!("the upgraded journal lost the write in flight: {other:?}"),
    }
    drop(store);
    let report = postern_store::audit::verify(&fx.path, None, &mut |_, _| {}).expect("verify");
    assert!(report.intact(), "{:?}", report.findings);
}

#[test]
fn vault_changes_are_journaled_on_their_own_stream() {
    let fx = Fixture::new();
    let store = fx.open();
    let id = store.installation_id("inst_first", at(0)).expect("create id");
    assert_eq!(store.installation_id("inst_second", at(1)).expect("same id"), id, "created once");
    let record = postern_store::CredentialRecord {
        name: "deploy".into(),
        kind: "bearer".into(),
        spec: json!({}),
        bindings: json!([{"host": "deploy.example"}]),
        approve_every_use: true,
        created_at: at(2).as_millis(),
    };
    let added = store.put_credential(record.clone(), at(2)).expect("add");
    assert_eq!((added.row.stream(), added.row.event.as_str()), (postern_store::Stream::Vault, "credential_added"));
    assert_eq!(store.put_credential(record, at(3)).unwrap_err().code(), "duplicate_credential");
    assert_eq!(store.view().credentials().expect("list").len(), 1);
    store.set_locked(true, json!({"by": "cli"}), at(4)).expect("lock");
    assert!(store.view().locked().expect("state"));
    store.remove_credential("deploy", at(5)).expect("remove");
    assert_eq!(store.remove_credential("deploy", at(6)).unwrap_err().code(), "unknown_credential");
    drop(store);
    let report = postern_store::audit::verify(&fx.path, None, &mut |_, _| {}).expect("verify");
    assert!(report.intact(), "{:?}", report.findings);
    assert_eq!(report.rows, 3, "credential_added, vault_locked, credential_removed");
}

#[test]
fn only_one_process_writes_a_journal_and_a_crash_never_leaves_it_locked() {
    let fx = Fixture::new();
    let first = fx.open();
    let err = Store::open(&fx.path, at(1)).unwrap_err();
    assert_eq!(err.code(), "journal_in_use");
    assert!(err.to_string().contains(&format!("pid {}", std::process::id())), "{err}");
    // Readers are not affected.
    assert!(JournalView::open_read_only(&fx.path).is_ok());
    drop(first);
    let _second = Store::open(&fx.path, at(2)).expect("released when the holder is gone");
}

#[test]
fn an_agent_token_authenticates_until_revoked_and_names_are_never_reused() {
    let fx = Fixture::new();
    let store = fx.open();
    store.add_agent("ci", "ab12", at(0)).expect("add");
    assert_eq!(store.add_agent("ci", "cd34", at(1)).unwrap_err().code(), "duplicate_agent");
    assert_eq!(store.view().active_agent_by_token("ab12").expect("q").expect("found").name, "ci");
    assert!(store.view().active_agent_by_token("cd34").expect("q").is_none());
    store.revoke_agent("ci", at(2)).expect("revoke");
    assert!(store.view().active_agent_by_token("ab12").expect("q").is_none(), "a revoked token never authenticates");
    assert_eq!(store.revoke_agent("ci", at(3)).unwrap_err().code(), "unknown_agent");
    assert_eq!(store.add_agent("ci", "ef56", at(4)).unwrap_err().code(), "duplicate_agent");
    let events: Vec<String> = store.view().agents().expect("agents").iter().map(|a| a.name.clone()).collect();
    assert_eq!(events, ["ci"]);
}

#[test]
fn session_standing_and_the_allowlist_are_journaled_and_a_revoked_run_stays_revoked() {
    let fx = Fixture::new();
    let store = fx.open();
    let start = |n: u128, t: i64| SessionStart {
        id: session(n),
        actor: Actor::process("/usr/bin/agent", "abc123"),
        pid: Some(4242),
        process_start: Some(987_654),
        transport: "stdio".into(),
        client: None,
        at: at(t),
    };
    let view = store.view();
    store.start_session(start(1, 0)).expect("start");
    assert_eq!(view.session_standing(session(1)).unwrap(), None, "a new run is undecided");
    store.set_session_standing(session(1), true, "reviewer", json!({ "choice": "allow_session" }), at(1)).unwrap();
    assert_eq!(view.session_standing(session(1)).unwrap(), Some(true));
    store.set_session_standing(session(1), false, "cli", json!({}), at(2)).unwrap();
    assert_eq!(view.session_standing(session(1)).unwrap(), Some(false));
    let again = store.set_session_standing(session(1), true, "reviewer", json!({}), at(3)).unwrap_err();
    assert_eq!(again.code(), "session_revoked", "a revoked run is never authorized again");
    assert_eq!(
        store.set_session_standing(session(9), true, "reviewer", json!({}), at(3)).unwrap_err().code(),
        "unknown_session"
    );
    // An ended run counts as revoked, whatever was granted.
    store.start_session(start(2, 4)).expect("start");
    store.set_session_standing(session(2), true, "reviewer", json!({}), at(5)).unwrap();
    store.end_session(session(2), "process_exited", at(6)).unwrap();
    assert_eq!(view.session_standing(session(2)).unwrap(), Some(false));

    let actor = "process:/usr/bin/agent@sha256:abc123";
    assert!(!view.allowlisted(actor).unwrap());
    store.set_allowlisted(actor, true, "reviewer", at(7)).unwrap();
    assert!(view.allowlisted(actor).unwrap());
    assert!(!view.allowlisted("process:/usr/bin/agent@sha256:changed").unwrap(), "a changed binary is not");
    store.set_allowlisted(actor, false, "cli", at(8)).unwrap();
    assert!(!view.allowlisted(actor).unwrap());
    assert_eq!(store.set_allowlisted(actor, false, "cli", at(9)).unwrap_err().code(), "not_allowlisted");

    let events: Vec<String> = rusqlite::Connection::open(&fx.path)
        .unwrap()
        .prepare("SELECT event FROM journal WHERE stream = 'session' ORDER BY seq")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for expected in ["session_authorized", "session_revoked", "allowlist_added", "allowlist_removed"] {
        assert!(events.iter().any(|e| e == expected), "{expected} in {events:?}");
    }
    drop(store);
    assert!(postern_store::audit::verify(&fx.path, None, &mut |_, _| {}).expect("verify").intact());
}

#[test]
fn the_prior_a_retry_would_match_can_be_looked_up_read_only() {
    let fx = Fixture::new();
    let store = fx.open();
    let new = payment(exec_id(1), 5, session(1), at(0));
    let (fp, actor, scope) = (new.fingerprint.to_string(), new.actor.clone(), new.intent_scope.clone());
    let view = store.view();
    assert_eq!(view.prior_execution(&fp, actor.as_str(), scope.as_str()).unwrap(), None);
    dispatch_new(&store, new);
    assert_eq!(view.prior_execution(&fp, actor.as_str(), scope.as_str()).unwrap(), Some(exec_id(1)));
    assert_eq!(view.prior_execution(&fp, "process:/other@sha256:00", scope.as_str()).unwrap(), None, "another actor");
    assert_eq!(view.prior_execution(&fp, actor.as_str(), "run:other").unwrap(), None, "another scope");
}

/// A live view (the app's Activity) waits on the journal's size instead of polling: it changes
/// after each commit that appended rows, reads the size the journal has, and a reader that was
/// away sees one change for many commits.
#[test]
fn a_live_view_is_told_the_journal_size_after_each_commit() {
    let fx = Fixture::new();
    let store = fx.open();
    let mut size = store.journal_size();
    let start = *size.borrow_and_update();
    assert_eq!(start, store.view().head().expect("head").size);
    assert!(!size.has_changed().expect("writer alive"), "nothing committed yet");
    let id = dispatch_new(&store, payment(exec_id(1), 5, session(1), at(0)));
    assert!(size.has_changed().expect("writer alive"));
    assert_eq!(*size.borrow_and_update(), start + 3, "accepted, authorized, dispatched");
    store.transition(id, ExecutionState::OutcomeUnknown, json!({}), at(10)).expect("unknown");
    populate(&store, 2);
    assert_eq!(*size.borrow_and_update(), store.view().head().expect("head").size);
    assert!(!size.has_changed().expect("writer alive"), "seen up to the head");
    // A write the journal refuses appends nothing, and tells nothing.
    assert!(store.transition(id, ExecutionState::Accepted, json!({}), at(20)).is_err());
    assert!(!size.has_changed().expect("writer alive"));
}
