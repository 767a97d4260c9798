//! The approval ladder through the engine: who is asked, how often, and what reaches the target.

use crate::support::{call, manifest, rig, start_target};
use postern_core::{Actor, ExecutionState, SessionId, Timestamp};
use postern_gateway::{Approver, Ask, Authorization, AuthorizationRequest, Engine, Grant, engine::system_clock};
use postern_store::SessionStart;
use serde_json::json;
use std::sync::{Arc, Mutex, atomic::Ordering};

/// Answers every question the same way, slowly, and remembers what it was asked.
#[derive(Debug)]
struct Reviewer {
    allow: bool,
    grant: Option<Grant>,
    asked: Mutex<Vec<AuthorizationRequest>>,
}

impl Reviewer {
    fn new(allow: bool, grant: Option<Grant>) -> Arc<Self> {
        Arc::new(Reviewer { allow, grant, asked: Mutex::new(Vec::new()) })
    }

    fn asked(&self) -> Vec<Ask> {
        self.asked.lock().unwrap().iter().map(|r| r.ask).collect()
    }
}

impl Approver for Reviewer {
    fn authorize(&self, request: &AuthorizationRequest) -> Authorization {
        self.asked.lock().unwrap().push(request.clone());
        std::thread::sleep(std::time::Duration::from_millis(150));
        Authorization {
            allowed: self.allow,
            rung: match request.ask {
                Ask::PerUse => "approve_every_use".into(),
                Ask::SessionAuthorization => "session_authorization".into(),
            },
            by: "reviewer:test".into(),
            reason: if self.allow { "approved" } else { "refused" }.into(),
            grant: self.grant,
            timed_out: false,
        }
    }
}

struct Ladder {
    rig: crate::support::Rig,
    engine: Arc<Engine>,
    target: Arc<crate::support::Target>,
    addr: std::net::SocketAddr,
}

async fn ladder(reviewer: Arc<Reviewer>) -> Ladder {
    ladder_with_timeout(reviewer, postern_gateway::engine::DEFAULT_APPROVAL_TIMEOUT).await
}

async fn ladder_with_timeout(reviewer: Arc<Reviewer>, timeout: std::time::Duration) -> Ladder {
    let (target, addr) = start_target().await;
    let base = format!("http://{addr}");
    let rig = rig(manifest(&base, &base));
    let engine = Engine::new(
        Arc::clone(&rig.store),
        Arc::clone(&rig.vault),
        Arc::new(manifest(&base, &base)),
        reviewer,
        system_clock(),
    )
    .unwrap()
    .with_approval_timeout(timeout);
    Ladder { rig, engine: Arc::new(engine), target, addr }
}

fn start_run(l: &Ladder, n: u128) -> SessionId {
    let id = SessionId::from_parts(Timestamp::from_millis(5), n);
    l.rig
        .store
        .start_session(SessionStart {
            id,
            actor: Actor::process("/usr/bin/test-agent", "abcd"),
            pid: None,
            process_start: None,
            transport: "stdio".into(),
            client: None,
            at: Timestamp::from_millis(6),
        })
        .unwrap();
    id
}

fn in_run(tool: &str, amount: u64, session: SessionId) -> postern_gateway::Call {
    let mut c = call(tool, json!({ "amount": amount }), 0, amount);
    c.session = Some(session);
    c.intent_scope = postern_core::IntentScope::agent_run(session);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_run_is_asked_once_however_many_of_its_calls_race() {
    let reviewer = Reviewer::new(true, Some(Grant::Session));
    let l = ladder(Arc::clone(&reviewer)).await;
    let run = start_run(&l, 1);
    let calls: Vec<_> = (1..=5)
        .map(|n| {
            let engine = Arc::clone(&l.engine);
            tokio::spawn(async move { engine.call(in_run("create_payment", n, run)).await.unwrap() })
        })
        .collect();
    for c in calls {
        assert_eq!(c.await.unwrap().state, ExecutionState::Completed);
    }
    assert_eq!(reviewer.asked(), vec![Ask::SessionAuthorization], "one question for the run");
    assert_eq!(l.rig.store.view().session_standing(run).unwrap(), Some(true));
    assert_eq!(l.target.payments.load(Ordering::SeqCst), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_run_sends_nothing() {
    let reviewer = Reviewer::new(false, None);
    let l = ladder(Arc::clone(&reviewer)).await;
    let run = start_run(&l, 1);
    let out = l.engine.call(in_run("create_payment", 1, run)).await.unwrap();
    assert_eq!(out.state, ExecutionState::Denied);
    assert_eq!(out.detail["rung"], "session_authorization");
    assert_eq!(out.detail["by"], "reviewer:test");
    assert_eq!(l.target.payments.load(Ordering::SeqCst), 0);
    // The refusal stands for the run: the next call is denied without a second question.
    let again = l.engine.call(in_run("create_payment", 2, run)).await.unwrap();
    assert_eq!(again.state, ExecutionState::Denied);
    assert_eq!(reviewer.asked().len(), 1);
    assert_eq!(l.rig.store.view().session_standing(run).unwrap(), Some(false));
    // The question and the answer are records on the execution, with what the reviewer saw.
    let timeline = l.rig.store.view().timeline(out.execution_id).unwrap();
    let events: Vec<&str> = timeline.iter().map(|e| e.row.event.as_str()).collect();
    assert_eq!(events, ["accepted", "approval_requested", "approval_denied", "denied"]);
    assert_eq!(timeline[1].row.detail["shown"]["tool"], "create_payment");
    assert_eq!(timeline[1].row.detail["ask"], "session_authorization");
    assert_eq!(timeline[2].row.detail["decision"]["by"], "reviewer:test");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_nobody_answers_in_time_is_denied_and_journaled() {
    let reviewer = Reviewer::new(true, Some(Grant::Session));
    let l = ladder_with_timeout(Arc::clone(&reviewer), std::time::Duration::from_millis(40)).await;
    let run = start_run(&l, 1);
    let out = l.engine.call(in_run("create_payment", 1, run)).await.unwrap();
    assert_eq!(out.state, ExecutionState::Denied);
    assert_eq!(out.detail["code"], "approval_timed_out");
    assert_eq!(l.target.payments.load(Ordering::SeqCst), 0);
    let events: Vec<String> =
        l.rig.store.view().timeline(out.execution_id).unwrap().into_iter().map(|e| e.row.event).collect();
    assert_eq!(events, ["accepted", "approval_requested", "approval_timed_out", "denied"]);
    assert_eq!(l.rig.store.view().session_standing(run).unwrap(), None, "an unanswered question revokes nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_allow_covers_later_runs_of_the_same_executable_only() {
    let reviewer = Reviewer::new(true, Some(Grant::Always));
    let l = ladder(Arc::clone(&reviewer)).await;
    let first = start_run(&l, 1);
    l.engine.call(in_run("create_payment", 1, first)).await.unwrap();
    let second = start_run(&l, 2);
    let out = l.engine.call(in_run("create_payment", 2, second)).await.unwrap();
    assert_eq!(out.state, ExecutionState::Completed);
    assert_eq!(reviewer.asked().len(), 1, "the second run of the same actor was not asked");
    assert!(l.rig.store.view().allowlisted("process:/usr/bin/test-agent@sha256:abcd").unwrap());
    // A changed binary is a different actor: asked again.
    let third = start_run(&l, 3);
    let mut changed = in_run("create_payment", 3, third);
    changed.actor = Actor::process("/usr/bin/test-agent", "ef01");
    l.engine.call(changed).await.unwrap();
    assert_eq!(reviewer.asked().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_use_wins_over_an_authorized_run_and_a_locked_vault_wins_over_everything() {
    let reviewer = Reviewer::new(true, Some(Grant::Always));
    let l = ladder(Arc::clone(&reviewer)).await;
    let run = start_run(&l, 1);
    l.engine.call(in_run("create_payment", 1, run)).await.unwrap();
    let mut every_use = l.rig.vault.credential("pay").unwrap();
    every_use.name = "pay-each".into();
    every_use.approve_every_use = true;
    l.rig
        .vault
        .add_credential(&every_use, &postern_vault::Sensitive::new("x".into()), Timestamp::from_millis(9))
        .unwrap();
    // The built-in http_request picks the credential bound to the URL; name the per-use one.
    let url = format!("http://{}/v1/echo", l.addr);
    let mut c = call("http_request", json!({ "method": "GET", "url": url, "credential": "pay-each" }), 0, 9);
    c.session = Some(run);
    let out = l.engine.call(c.clone()).await.unwrap();
    assert_eq!(out.state, ExecutionState::Completed);
    assert_eq!(reviewer.asked(), vec![Ask::SessionAuthorization, Ask::PerUse], "asked about this very call");

    l.rig.vault.lock("test", Timestamp::from_millis(10)).unwrap();
    let locked = l.engine.call(in_run("create_payment", 2, run)).await.unwrap();
    assert_eq!(locked.state, ExecutionState::Denied);
    assert_eq!(locked.detail["rung"], "vault_locked");
    assert_eq!(reviewer.asked().len(), 2, "a locked vault asks no one");
}
