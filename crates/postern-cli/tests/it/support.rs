//! Runs the real `postern` binary and builds journals for it with postern-store.

use postern_core::{
    ActionRequest, ActionTarget, Actor, AttachWindow, CanonicalAction, Channel, ExecutionId, ExecutionState,
    FingerprintKey, HttpAction, IntentScope, ReplayClass, ReplayContract, SessionId, Timestamp,
};
use postern_store::{Completion, NewExecution, SessionStart};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub use postern_testkit::file_containing;

pub const T0: i64 = 1_764_445_000_000;

pub fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(T0 + ms)
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn postern(args: &[&str], data_dir: Option<&Path>) -> Run {
    postern_with(args, data_dir, None, &[])
}

/// Runs `postern` with `stdin` piped in (or closed) and extra environment variables.
pub fn postern_with(args: &[&str], data_dir: Option<&Path>, stdin: Option<&str>, env: &[(&str, &str)]) -> Run {
    use std::io::Write;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_postern"));
    cmd.args(args).env_remove("POSTERN_DATA_DIR").envs(env.iter().copied());
    if let Some(dir) = data_dir {
        cmd.env("POSTERN_DATA_DIR", dir);
    }
    cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("run postern");
    let mut pipe = child.stdin.take().expect("stdin");
    // The child may refuse its arguments and exit before reading its input: that is not an error.
    match pipe.write_all(stdin.unwrap_or("").as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => panic!("write stdin: {e}"),
        _ => {}
    }
    drop(pipe);
    let Output { status, stdout, stderr } = child.wait_with_output().expect("wait");
    Run {
        code: status.code().expect("exit code"),
        stdout: String::from_utf8(stdout).expect("utf-8 stdout"),
        stderr: String::from_utf8(stderr).expect("utf-8 stderr"),
    }
}

pub struct Journal {
    pub dir: tempfile::TempDir,
}

impl Journal {
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn db(&self) -> PathBuf {
        self.dir.path().join("postern.db")
    }
}

pub fn session() -> SessionId {
    SessionId::from_parts(at(0), 1)
}

pub fn exec(n: u128) -> ExecutionId {
    ExecutionId::from_parts(at(n as i64), n)
}

fn new_execution(id: ExecutionId, amount: u64, t: Timestamp) -> NewExecution {
    let key = FingerprintKey::from_bytes([1; 32]);
    let contract = ReplayContract {
        class: ReplayClass::IdempotencyKey,
        idempotency_header: Some("Idempotency-Key".into()),
        attach_window: AttachWindow::Millis(600_000),
        ..ReplayContract::read_only()
    };
    let request = ActionRequest {
        actor: Actor::process("/usr/bin/agent", "abc123"),
        tool: "create_payment".into(),
        target: ActionTarget::Http(HttpAction {
            method: "POST".into(),
            url: "https://pay.example/v1/payments".into(),
            headers: vec![],
        }),
        credential_ref: Some("pay-api".into()),
        arguments: json!({"amount": amount}),
        intent_scope: IntentScope::agent_run(session()),
    };
    let action = CanonicalAction::build(&request, &contract, &key).expect("canonical");
    NewExecution {
        id,
        fingerprint: action.fingerprint(&key),
        effect_fingerprint: Some(action.effect_fingerprint(&key)),
        actor: request.actor,
        intent_scope: request.intent_scope,
        session_id: Some(session()),
        tool: request.tool,
        channel: Channel::Http,
        contract,
        record: action.record().clone(),
        correlation: json!({"jsonrpc_id": id.timestamp().as_millis() - T0}),
        at: t,
    }
}

/// A journal with one agent session, `n` delivered payments, and one payment left dispatched.
pub fn journal(n: u128) -> Journal {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = postern_host::open_journal(dir.path(), at(0)).expect("open");
    store
        .start_session(SessionStart {
            id: session(),
            actor: Actor::process("/usr/bin/agent", "abc123"),
            pid: Some(4242),
            process_start: Some(1_000),
            transport: "stdio".into(),
            client: Some("test-agent 1.0".into()),
            at: at(0),
        })
        .expect("session");
    deliver(&store, 1..=n);
    let pending = exec(999);
    store.admit(new_execution(pending, 999, at(99_900))).expect("admit");
    store.transition(pending, ExecutionState::Authorized, json!({"rung": "session"}), at(99_901)).expect("auth");
    store.transition(pending, ExecutionState::Dispatched, json!({}), at(99_902)).expect("dispatch");
    drop(store);
    Journal { dir }
}

/// Payments `range` (by number), each run to `result_delivered`.
pub fn deliver(store: &postern_store::Store, range: std::ops::RangeInclusive<u128>) {
    for i in range {
        let id = exec(i);
        let t = at(i as i64 * 100);
        store.admit(new_execution(id, i as u64 * 10, t)).expect("admit");
        store
            .transition(id, ExecutionState::Authorized, json!({"rung": "session"}), at(i as i64 * 100 + 1))
            .expect("auth");
        store.transition(id, ExecutionState::Dispatched, json!({}), at(i as i64 * 100 + 2)).expect("dispatch");
        store
            .complete(
                id,
                Completion {
                    outcome: json!({"http_status": 201}),
                    result: b"{\"ok\":true}".to_vec(),
                    at: at(i as i64 * 100 + 3),
                },
            )
            .expect("complete");
        store.transition(id, ExecutionState::ResultDelivered, json!({}), at(i as i64 * 100 + 4)).expect("deliver");
    }
}

/// The journal grown by the delivered payments `range` (no process may hold it).
pub fn grow(j: &Journal, range: std::ops::RangeInclusive<u128>) {
    let (store, _) = postern_host::open_journal(j.data_dir(), at(0)).expect("open");
    deliver(&store, range);
}

/// Edits the file like an attacker: protections dropped, then `sql` run.
pub fn tamper(db: &Path, sql: &str) {
    let conn = rusqlite::Connection::open(db).expect("open");
    conn.execute_batch("DROP TRIGGER journal_refuses_update; DROP TRIGGER journal_refuses_delete;").expect("drop");
    conn.execute_batch(sql).expect("tamper");
}
