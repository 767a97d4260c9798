//! Shared fixtures: a store in a temp dir, deterministic ids and times, and an "attacker"
//! connection that edits the file the way someone with write access could.

use postern_core::{
    ActionRequest, ActionTarget, Actor, AttachWindow, CanonicalAction, Channel, ExecutionId, ExecutionState,
    FingerprintKey, HttpAction, IntentScope, ReplayClass, ReplayContract, SessionId, Timestamp,
};
use postern_store::{Completion, NewExecution, Store, journal::chain_hash};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

pub const T0: i64 = 1_764_445_000_000;

pub fn at(offset_ms: i64) -> Timestamp {
    Timestamp::from_millis(T0 + offset_ms)
}

pub struct Fixture {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl Fixture {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("data").join("postern.db");
        Fixture { _dir: dir, path }
    }

    pub fn open(&self) -> Store {
        Store::open(&self.path, at(0)).expect("open store").0
    }
}

pub fn key() -> FingerprintKey {
    FingerprintKey::from_bytes([0x42; 32])
}

pub fn session(n: u128) -> SessionId {
    SessionId::from_parts(at(0), n)
}

pub fn exec_id(n: u128) -> ExecutionId {
    ExecutionId::from_parts(at(n as i64), n)
}

pub fn keyed_contract() -> ReplayContract {
    ReplayContract {
        class: ReplayClass::IdempotencyKey,
        idempotency_header: Some("Idempotency-Key".into()),
        secret_fields: ["approval_code".to_string()].into(),
        attach_window: AttachWindow::Millis(600_000),
        ..ReplayContract::read_only()
    }
}

/// A canonicalised `POST /v1/payments` request as the engine would hand it to the store.
pub fn payment(id: ExecutionId, amount: u64, session: SessionId, at: Timestamp) -> NewExecution {
    payment_with(id, json!({"amount": amount, "currency": "EUR"}), session, at)
}

pub fn payment_with(id: ExecutionId, arguments: Value, session: SessionId, at: Timestamp) -> NewExecution {
    let contract = keyed_contract();
    let request = ActionRequest {
        actor: Actor::process("/usr/bin/agent", "abc123"),
        tool: "create_payment".into(),
        target: ActionTarget::Http(HttpAction {
            method: "POST".into(),
            url: "https://pay.example/v1/payments".into(),
            headers: vec![],
        }),
        credential_ref: Some("pay-api".into()),
        arguments,
        intent_scope: IntentScope::agent_run(session),
    };
    let action = CanonicalAction::build(&request, &contract, &key()).expect("canonical");
    NewExecution {
        id,
        fingerprint: action.fingerprint(&key()),
        effect_fingerprint: Some(action.effect_fingerprint(&key())),
        actor: request.actor.clone(),
        intent_scope: request.intent_scope.clone(),
        session_id: Some(session),
        tool: request.tool.clone(),
        channel: Channel::Http,
        contract,
        record: action.record().clone(),
        correlation: json!({"jsonrpc_id": 7}),
        at,
    }
}

/// Admits a new execution and takes it to `dispatched` (accepted → authorized → dispatched),
/// one millisecond per step from its acceptance time.
pub fn dispatch_new(store: &Store, new: NewExecution) -> ExecutionId {
    let id = new.id;
    let t = new.at;
    assert_eq!(store.admit(new).expect("admit"), postern_store::Admission::Accepted { id });
    store
        .transition(id, ExecutionState::Authorized, json!({"rung": "allowlisted"}), t.saturating_add_millis(1))
        .expect("authorize");
    store.transition(id, ExecutionState::Dispatched, json!({}), t.saturating_add_millis(2)).expect("dispatch");
    id
}

/// Drives a new execution through accepted → authorized → dispatched → completed → delivered.
pub fn run_to_delivery(store: &Store, new: NewExecution, status: u16) -> ExecutionId {
    let t = new.at;
    let id = dispatch_new(store, new);
    store
        .complete(
            id,
            Completion {
                outcome: json!({"http_status": status}),
                result: format!("{{\"status\":{status}}}").into_bytes(),
                at: t.saturating_add_millis(3),
            },
        )
        .expect("complete");
    store.transition(id, ExecutionState::ResultDelivered, json!({}), t.saturating_add_millis(4)).expect("deliver");
    id
}

/// Fills a store with `n` delivered executions (5 rows each) and returns the journal size.
pub fn populate(store: &Store, n: u128) -> u64 {
    let s = session(1);
    for i in 0..n {
        run_to_delivery(store, payment(exec_id(1000 + i), 100 + i as u64, s, at(i as i64 * 10)), 201);
    }
    store.view().head().expect("head").size
}

/// A read-write connection that behaves like someone editing the file directly: the
/// append-only triggers and the indexes over the journal's content are dropped first.
pub fn attacker(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("open for tampering");
    conn.execute_batch(
        "DROP TRIGGER IF EXISTS journal_refuses_update;
         DROP TRIGGER IF EXISTS journal_refuses_delete;
         DROP TRIGGER IF EXISTS results_refuse_update;
         DROP INDEX IF EXISTS journal_by_execution;
         DROP INDEX IF EXISTS journal_by_session;",
    )
    .expect("drop protections");
    conn
}

pub fn row(conn: &rusqlite::Connection, seq: i64) -> (String, Vec<u8>) {
    conn.query_row("SELECT body, row_hash FROM journal WHERE seq = ?1", [seq], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("row exists")
}

pub fn hash32(v: &[u8]) -> [u8; 32] {
    v.try_into().expect("32 bytes")
}

/// Rewrites every row from `from` onwards so the chain verifies again (what an attacker with
/// the file but without an off-machine checkpoint can always do).
pub fn rechain_from(conn: &rusqlite::Connection, from: i64) {
    let mut prev = if from == 1 { [0u8; 32] } else { hash32(&row(conn, from - 1).1) };
    let max: i64 = conn.query_row("SELECT max(seq) FROM journal", [], |r| r.get(0)).expect("max");
    for seq in from..=max {
        let (body, _) = row(conn, seq);
        let h = chain_hash(&prev, body.as_bytes());
        conn.execute("UPDATE journal SET row_hash = ?2 WHERE seq = ?1", rusqlite::params![seq, h.as_slice()])
            .expect("rechain");
        prev = h;
    }
}

/// A step of a read-only call, taken at `at`.
pub fn step(state: ExecutionState, detail: serde_json::Value, at: Timestamp) -> postern_store::Step {
    postern_store::Step { state, detail, at }
}

/// A read-only call of `payment`'s record for `amount`, submitted as the engine submits one:
/// detached (nobody waits, nothing is fsynced), accepted at `t`, then authorized, dispatched and
/// completed a millisecond apart.
pub fn submit_read(store: &Store, id: ExecutionId, amount: u64, t: i64) -> Result<(), postern_store::StoreError> {
    let mut read = payment(id, amount, session(1), at(t));
    read.contract = ReplayContract::read_only();
    let steps = vec![
        step(ExecutionState::Authorized, json!({}), at(t + 1)),
        step(ExecutionState::Dispatched, json!({}), at(t + 2)),
    ];
    let done = Completion { outcome: json!({"http_status": 200}), result: b"[]".to_vec(), at: at(t + 3) };
    store.record_read_only_detached(read, steps, Some(done))
}

/// Takes a journal back from schema v13 to v12 (migration 13 only added the request index).
pub const V13_UNDONE: &str = "DROP INDEX journal_request_lookup;
     DELETE FROM schema_migrations WHERE version = 13;
     PRAGMA user_version = 12;";
