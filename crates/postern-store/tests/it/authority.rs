//! The tables that grant authority, edited behind the journal's back by a process of the same
//! user with write access to the database file: `audit verify` names the table and row, the
//! gateway's store refuses to open, a running writer raises the alarm within its watch
//! interval, `rederive` rebuilds the tables from the verified journal; and deleting the
//! `.lock` file does not let a second writer in.

use crate::support::*;
use postern_core::Actor;
use postern_store::{CredentialRecord, Finding, SessionStart, Store, StoreError, audit::verify};
use serde_json::json;

/// A stdio agent run of `/usr/bin/agent`, started at `t`.
fn agent_run(id: postern_core::SessionId, t: i64) -> SessionStart {
    SessionStart {
        id,
        actor: Actor::process("/usr/bin/agent", "abc"),
        pid: Some(7),
        process_start: Some(1),
        transport: "stdio".into(),
        client: None,
        at: at(t),
    }
}

/// A bearer credential for `pay.example`.
fn pay_credential(approve_every_use: bool) -> CredentialRecord {
    CredentialRecord {
        name: "pay".into(),
        kind: "bearer".into(),
        spec: json!({ "idempotency_header": null }),
        bindings: json!([{ "host": "pay.example", "port": null, "path_prefix": "/" }]),
        approve_every_use,
        created_at: 1,
    }
}

/// A journal with one of everything that grants authority: a locked vault, a credential, an
/// agent token, an authorized agent run, an allowlisted actor.
fn granted() -> Fixture {
    let fx = Fixture::new();
    let store = fx.open();
    store.put_credential(pay_credential(true), at(1)).unwrap();
    store.add_agent("ci", &"ab".repeat(32), at(2)).unwrap();
    let s = session(3);
    store.start_session(agent_run(s, 3)).unwrap();
    store.set_session_standing(s, true, "reviewer", json!({}), at(4)).unwrap();
    store.set_allowlisted("process:/usr/bin/agent@sha256:abc", true, "reviewer", at(5)).unwrap();
    store.set_locked(true, json!({ "by": "reviewer" }), at(6)).unwrap();
    fx
}

/// Each edit an attacker would make, and the table it must be named by.
const EDITS: &[(&str, &str)] = &[
    ("UPDATE vault_state SET locked = 0", "vault_state"),
    (
        "UPDATE credentials SET bindings = '[{\"host\":\"evil.example\",\"port\":null,\"path_prefix\":\"/\"}]'",
        "credentials",
    ),
    ("UPDATE credentials SET approve_every_use = 0", "credentials"),
    ("INSERT INTO agents (name, token_sha256, created_at) VALUES ('mine', 'cd', 9)", "agents"),
    ("UPDATE agents SET revoked_at = NULL, token_sha256 = 'ef'", "agents"),
    ("UPDATE session_grants SET standing = 'authorized' WHERE 0; DELETE FROM session_grants", "session_grants"),
    ("INSERT INTO allowlist (actor, added_by, added_at) VALUES ('process:/tmp/evil@sha256:00', 'x', 9)", "allowlist"),
];

#[test]
fn every_authority_table_edited_behind_the_journal_is_named_and_refused_until_rederived() {
    for (sql, table) in EDITS {
        let fx = granted();
        assert!(verify(&fx.path, None, &mut |_, _| {}).unwrap().findings.is_empty(), "clean before {sql}");
        same_user(&fx.path).execute_batch(sql).unwrap();
        let found = verify(&fx.path, None, &mut |_, _| {}).unwrap().findings;
        assert!(
            found.iter().any(|f| matches!(f, Finding::AuthorityMismatch { table: t, .. } if t == table)),
            "{sql}: {found:?}"
        );
        let refused = Store::open(&fx.path, at(100)).map(drop).unwrap_err();
        assert!(
            matches!(&refused, StoreError::AuthorityTampered(m) if m.iter().any(|m| m.table == *table)),
            "{refused}"
        );
        assert!(refused.to_string().contains(&format!("table `{table}`")), "{refused}");
        let changed = Store::rederive_authority(&fx.path, at(200)).unwrap();
        assert!(changed.iter().any(|m| m.table == *table), "{sql}: {changed:?}");
        assert!(verify(&fx.path, None, &mut |_, _| {}).unwrap().findings.is_empty(), "{sql}: rebuilt");
        let (store, _) = Store::open(&fx.path, at(300)).expect("opens again");
        drop(store);
        assert_eq!(journaled(&fx.path, "authority_rederived"), 1, "the rebuild is journaled");
    }
}

#[test]
fn a_running_writer_raises_the_alarm_when_another_process_edits_authority() {
    let fx = granted();
    let store = fx.open();
    assert!(store.authority_alarm().is_none());
    same_user(&fx.path).execute_batch("UPDATE vault_state SET locked = 0").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let alarm = loop {
        if let Some(alarm) = store.authority_alarm() {
            break alarm;
        }
        assert!(std::time::Instant::now() < deadline, "no alarm");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(alarm[0].table, "vault_state", "{alarm:?}");
    store.flush().unwrap();
    assert_eq!(journaled(&fx.path, "authority_tampered"), 1, "the alarm is journaled, once");
}

/// Another process's commit that changes no authority raises no alarm, but is counted once (and
/// logged): each one costs a comparison and every remembered secret, so a loop of them must be
/// visible.
#[test]
fn a_commit_by_another_process_that_grants_nothing_is_counted_not_alarmed() {
    let fx = granted();
    let store = fx.open();
    let counted = |n: u64| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while store.writer_stats().external_commits() < n {
            assert!(std::time::Instant::now() < deadline, "commit {n} was not seen");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    assert_eq!(store.writer_stats().external_commits(), 0);
    store.add_agent("own", &"cd".repeat(32), at(7)).unwrap();
    store.flush().unwrap();
    assert_eq!(store.writer_stats().external_commits(), 0, "the writer's own commits are not counted");
    same_user(&fx.path).execute_batch("CREATE TABLE scratch (x); INSERT INTO scratch VALUES (1)").unwrap();
    counted(1);
    // Looked at again by the idle writer (every 100 ms) and before each batch: counted once.
    std::thread::sleep(std::time::Duration::from_millis(300));
    store.add_agent("own2", &"ef".repeat(32), at(8)).unwrap();
    store.flush().unwrap();
    assert_eq!(store.writer_stats().external_commits(), 1, "one commit, counted once");
    same_user(&fx.path).execute_batch("INSERT INTO scratch VALUES (2)").unwrap();
    counted(2);
    assert!(store.authority_alarm().is_none());
}

/// An authority table another process drops: the comparison cannot run, and a comparison that
/// cannot run stops granting (before, it counted as no difference and the writer went on).
#[test]
fn a_running_writer_raises_the_alarm_when_the_comparison_cannot_run() {
    let fx = granted();
    let store = fx.open();
    same_user(&fx.path).execute_batch("DROP TABLE allowlist").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let alarm = loop {
        if let Some(alarm) = store.authority_alarm() {
            break alarm;
        }
        assert!(std::time::Instant::now() < deadline, "no alarm");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(alarm.iter().any(|m| m.table_value.contains("could not be compared")), "{alarm:?}");
}

/// The journal rows retry decisions read, edited or appended by another process (triggers
/// dropped first): the running writer walks the chain when it sees the commit and raises the
/// alarm, so no retry is decided from a forged row.
#[test]
fn a_running_writer_raises_the_alarm_when_another_process_edits_or_appends_journal_rows() {
    for sql in [
        "DROP TRIGGER journal_refuses_update; \
         UPDATE journal SET body = replace(body, '\"reviewer\"', '\"someone\"') WHERE seq = (SELECT max(seq) FROM journal)",
        "INSERT INTO journal (seq, body, row_hash) SELECT max(seq) + 1, body, row_hash FROM journal",
    ] {
        let fx = granted();
        let store = fx.open();
        assert!(store.authority_alarm().is_none());
        same_user(&fx.path).execute_batch(sql).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let alarm = loop {
            if let Some(alarm) = store.authority_alarm() {
                break alarm;
            }
            assert!(std::time::Instant::now() < deadline, "{sql}: no alarm");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert!(alarm.iter().any(|m| m.table == "journal" && m.key == "chain"), "{sql}: {alarm:?}");
    }
}

/// A journal row that grants authority but lacks a field it needs is a finding, never read
/// with a default: with `approve_every_use` dropped from `credential_added` (and the table
/// edited to match), a default of `false` would agree with the table and turn approval off
/// unnoticed. `rederive` refuses to rebuild from such a row.
#[test]
fn a_granting_row_missing_a_field_is_a_finding_not_a_default() {
    for (field, table_edit) in [
        ("approve_every_use", "UPDATE credentials SET approve_every_use = 0"),
        ("name", "DELETE FROM credentials"),
        ("token_sha256", "UPDATE agents SET token_sha256 = ''"),
    ] {
        let fx = granted();
        let event = if field == "token_sha256" { "agent_added" } else { "credential_added" };
        same_user(&fx.path)
            .execute_batch(&format!(
                "DROP TRIGGER journal_refuses_update; \
                 UPDATE journal SET body = json_remove(body, '$.payload.{field}') WHERE event = '{event}'; {table_edit}"
            ))
            .unwrap();
        rechain(&fx.path);
        let found = verify(&fx.path, None, &mut |_, _| {}).unwrap().findings;
        assert!(!found.iter().any(Finding::is_chain), "{field}: the chain was rewritten to hold: {found:?}");
        assert!(
            found.iter().any(|f| matches!(f, Finding::AuthorityMismatch { table, key, journal, .. }
                if table == "journal" && key.contains(event) && journal.contains(field))),
            "{field}: {found:?}"
        );
        let refused = Store::rederive_authority(&fx.path, at(200)).unwrap_err();
        assert!(refused.to_string().contains(field), "{field}: {refused}");
    }
}

/// A revoked agent token brought back: the table's revocation undone and the `agent_revoked`
/// row renamed to an event no stream has, the chain rewritten to hold. Before the journal's
/// events were typed, a row of an unknown event was read as granting nothing, so the journal
/// and the table agreed that the token was live and `audit verify` found nothing.
#[test]
fn a_granting_row_renamed_to_an_unknown_event_is_a_finding() {
    let fx = granted();
    let store = fx.open();
    store.revoke_agent("ci", at(50)).unwrap();
    store.flush().unwrap();
    drop(store);
    same_user(&fx.path)
        .execute_batch(
            "DROP TRIGGER journal_refuses_update; \
             UPDATE journal SET body = replace(body, '\"agent_revoked\"', '\"agent_rested\"') \
                 WHERE event = 'agent_revoked'; \
             UPDATE agents SET revoked_at = NULL;",
        )
        .unwrap();
    rechain(&fx.path);
    let found = verify(&fx.path, None, &mut |_, _| {}).unwrap().findings;
    assert!(!found.iter().any(Finding::is_chain), "the chain was rewritten to hold: {found:?}");
    assert!(
        found.iter().any(|f| matches!(f, Finding::UnknownEvent { stream, event, .. }
            if stream == "vault" && event == "agent_rested")),
        "{found:?}"
    );
    // The authority view, which the gateway runs when it starts and after every foreign commit,
    // finds it too, so rederive refuses to rebuild from it.
    let refused = Store::rederive_authority(&fx.path, at(60)).unwrap_err();
    assert!(refused.to_string().contains("agent_rested"), "{refused}");
}

/// The same revocation hidden by moving its row to the activity stream (which the authority
/// view does not read) instead of renaming it: `audit verify` reads every row's event.
#[test]
fn a_granting_row_moved_to_another_stream_is_a_finding() {
    for (from, to) in
        [("\"stream\":\"vault\"", "\"stream\":\"activity\""), ("\"stream\":\"vault\"", "\"stream\":\"Vault\"")]
    {
        let fx = granted();
        let store = fx.open();
        store.revoke_agent("ci", at(50)).unwrap();
        store.flush().unwrap();
        drop(store);
        same_user(&fx.path)
            .execute_batch(&format!(
                "DROP TRIGGER journal_refuses_update; \
                 UPDATE journal SET body = replace(body, '{from}', '{to}') WHERE event = 'agent_revoked'; \
                 UPDATE agents SET revoked_at = NULL;"
            ))
            .unwrap();
        rechain(&fx.path);
        let found = verify(&fx.path, None, &mut |_, _| {}).unwrap().findings;
        assert!(!found.iter().any(Finding::is_chain), "{to}: the chain was rewritten to hold: {found:?}");
        assert!(
            found.iter().any(|f| matches!(f, Finding::UnknownEvent { event, .. } if event == "agent_revoked")),
            "{to}: {found:?}"
        );
    }
}

/// Any process of the user can journal an import record over the control socket with a detail
/// it chose. One shaped like a spec change (a name and a spec: an SSH host's pinned key) must
/// re-derive nothing: before, the authority view read rows by shape, so the journal and the
/// table disagreed, the gateway refused to start, and `audit rederive` (what its error advises)
/// wrote the attacker's spec into the table.
#[test]
fn an_import_record_shaped_like_a_spec_change_re_derives_nothing() {
    let fx = granted();
    let store = fx.open();
    let forged = json!({ "name": "pay", "spec": { "idempotency_header": "X-Attacker" } });
    store.import_recorded(postern_store::ImportEvent::ImportApplied, forged, at(50)).unwrap();
    store.flush().unwrap();
    drop(store);
    let found = verify(&fx.path, None, &mut |_, _| {}).unwrap().findings;
    assert!(found.is_empty(), "an import record grants nothing and changes no credential: {found:?}");
    let changed = Store::rederive_authority(&fx.path, at(60)).unwrap();
    assert!(changed.is_empty(), "{changed:?}");
    let spec: String =
        same_user(&fx.path).query_row("SELECT spec FROM credentials WHERE name = 'pay'", [], |r| r.get(0)).unwrap();
    assert!(!spec.contains("X-Attacker"), "{spec}");
}

#[test]
fn deleting_the_lock_file_does_not_let_a_second_writer_in() {
    let fx = Fixture::new();
    let store = fx.open();
    let mut lock = fx.path.as_os_str().to_owned();
    lock.push(".lock");
    std::fs::remove_file(&lock).unwrap();
    let second = Store::open(&fx.path, at(1)).map(drop).unwrap_err();
    assert!(matches!(second, StoreError::InUse { .. }), "{second}");
    drop(store);
}

/// Recomputes every row's hash, as an attacker who edited a row would (the chain is unkeyed;
/// only an exported, signed checkpoint tells such a chain from the original).
fn rechain(path: &std::path::Path) {
    let conn = same_user(path);
    let rows: Vec<(i64, String)> = conn
        .prepare("SELECT seq, body FROM journal ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut prev = postern_store::journal::GENESIS;
    for (seq, body) in rows {
        prev = postern_store::journal::chain_hash(&prev, body.as_bytes());
        conn.execute("UPDATE journal SET row_hash = ?1 WHERE seq = ?2", rusqlite::params![prev.to_vec(), seq]).unwrap();
    }
}

/// A plain connection to the database file, as any process of the same user can open.
fn same_user(path: &std::path::Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    conn
}

fn journaled(path: &std::path::Path, event: &str) -> i64 {
    same_user(path).query_row("SELECT count(*) FROM journal WHERE event = ?1", [event], |r| r.get(0)).unwrap()
}

/// The gateway's view remembers a token's agent and a run's standing between commits; a commit
/// that revokes, decides or ends is seen by the very next lookup, before the call that made it
/// returns.
#[test]
fn the_gateway_view_forgets_a_revoked_token_and_a_changed_standing_at_once() {
    let fx = Fixture::new();
    let store = fx.open();
    let view = store.view();
    let digest = "cd".repeat(32);
    store.add_agent("ci", &digest, at(1)).unwrap();
    for _ in 0..2 {
        assert_eq!(view.active_agent_by_token(&digest).unwrap().map(|a| a.name).as_deref(), Some("ci"));
    }
    // A read-only call's rows in between change nothing the view remembers.
    submit_read(&store, exec_id(1), 1, 2).unwrap();
    store.flush().unwrap();
    store.revoke_agent("ci", at(3)).unwrap();
    assert_eq!(view.active_agent_by_token(&digest).unwrap(), None, "a revoked token is refused at once");

    for (n, revoke) in [(4u8, "a reviewer revokes"), (5, "the run ends")] {
        let t = i64::from(n) * 10;
        let s = session(n.into());
        store.start_session(agent_run(s, t)).unwrap();
        assert_eq!(view.session_standing(s).unwrap(), None, "not decided yet");
        store.set_session_standing(s, true, "reviewer", json!({}), at(t + 1)).unwrap();
        assert_eq!(view.session_standing(s).unwrap(), Some(true));
        assert_eq!(view.session_standing(s).unwrap(), Some(true));
        if n == 4 {
            store.set_session_standing(s, false, "reviewer", json!({}), at(t + 2)).unwrap();
        } else {
            store.end_session(s, "client_closed", at(t + 2)).unwrap();
        }
        assert_eq!(view.session_standing(s).unwrap(), Some(false), "{revoke}: refused at once");
    }
}

/// The vault epoch (what the vault's secret cache and the SSH pool keep their contents for)
/// moves for every change to the lock or a credential, before the call that made it returns,
/// and for another process's edit; an agent, a run or a call leaves it where it is.
#[test]
fn the_vault_epoch_moves_for_the_lock_and_every_credential_change_and_nothing_else() {
    let fx = Fixture::new();
    let store = fx.open();
    let mut seen = store.vault_epoch();
    let mut moved = |store: &Store, what: &str| {
        let now = store.vault_epoch();
        assert_ne!(now, seen, "{what} moves the vault epoch");
        seen = now;
    };
    store.put_credential(pay_credential(false), at(1)).unwrap();
    moved(&store, "a credential added");
    store.set_approve_every_use("pay", true, at(2)).unwrap();
    moved(&store, "approve every use");
    let spec = json!({ "idempotency_header": "Idempotency-Key" });
    store.update_credential_spec("pay", spec, postern_store::SpecChange::McpServerStartSet, json!({}), at(3)).unwrap();
    moved(&store, "a spec change");
    store.set_locked(true, json!({ "by": "reviewer" }), at(4)).unwrap();
    moved(&store, "the lock");
    store.set_locked(false, json!({ "by": "reviewer" }), at(5)).unwrap();
    moved(&store, "the unlock");
    store.remove_credential("pay", at(6)).unwrap();
    moved(&store, "a credential removed");

    let before = store.vault_epoch();
    store.add_agent("ci", &"ab".repeat(32), at(7)).unwrap();
    let s = session(8);
    store.start_session(agent_run(s, 8)).unwrap();
    store.set_session_standing(s, true, "reviewer", json!({}), at(9)).unwrap();
    submit_read(&store, exec_id(1), 1, 10).unwrap();
    store.flush().unwrap();
    assert_eq!(store.vault_epoch(), before, "agents, runs and calls leave the vault's memory alone");

    // Another process's edit is seen by the writer's next commit.
    same_user(&fx.path).execute("UPDATE vault_state SET locked = 1", []).unwrap();
    store.flush().unwrap();
    assert_ne!(store.vault_epoch(), before, "another process's edit moves it");
}
