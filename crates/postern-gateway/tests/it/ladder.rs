//! The approval ladder through the engine: who is asked, how often, and what reaches the target.

use crate::support::{call, manifest, rig, start_target};
use postern_core::{Actor, ExecutionState, SessionId, Timestamp};
use postern_engine::{
    Approver, Ask, Authorization, AuthorizationRequest, Engine, Grant, RetryReviewRequest, ReviewAnswer, ReviewChoice,
    ReviewVerdict,
};
use postern_store::SessionStart;
use serde_json::json;
use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, AtomicUsize, Ordering},
};

/// Answers every question the same way (after a pause, or once released), and remembers what it
/// was asked. Like a real dialog, it gives up when the engine withdraws the question.
#[derive(Debug)]
struct Reviewer {
    allow: bool,
    grant: Option<Grant>,
    /// Refuse per-use requests whose body preview contains this.
    refuse_body: Mutex<Option<String>>,
    /// Hold every answer until [`Reviewer::release`].
    held: AtomicBool,
    /// While held, ignore a withdrawal too (a dialog that does not close).
    deaf: AtomicBool,
    /// Questions being answered right now, and the most there ever were at once.
    open: AtomicUsize,
    most_open: AtomicUsize,
    review: Mutex<Option<ReviewAnswer>>,
    asked: Mutex<Vec<AuthorizationRequest>>,
    reviews: Mutex<Vec<RetryReviewRequest>>,
    saw_withdrawal: AtomicBool,
    /// A call's opening to look at whenever a question comes, and what was seen.
    opening: Mutex<Option<postern_engine::Opening>>,
    released_when_asked: Mutex<Vec<bool>>,
}

impl Reviewer {
    fn new(allow: bool, grant: Option<Grant>) -> Arc<Self> {
        Arc::new(Reviewer {
            allow,
            grant,
            refuse_body: Mutex::new(None),
            held: AtomicBool::new(false),
            deaf: AtomicBool::new(false),
            open: AtomicUsize::new(0),
            most_open: AtomicUsize::new(0),
            review: Mutex::new(None),
            asked: Mutex::new(Vec::new()),
            reviews: Mutex::new(Vec::new()),
            saw_withdrawal: AtomicBool::new(false),
            opening: Mutex::new(None),
            released_when_asked: Mutex::new(Vec::new()),
        })
    }

    fn holding(self: Arc<Self>) -> Arc<Self> {
        self.held.store(true, Ordering::SeqCst);
        self
    }

    fn release(&self) {
        self.held.store(false, Ordering::SeqCst);
    }

    fn reviewing(self: Arc<Self>, answer: ReviewAnswer) -> Arc<Self> {
        *self.review.lock().unwrap() = Some(answer);
        self
    }

    fn asked(&self) -> Vec<Ask> {
        self.asked.lock().unwrap().iter().map(|r| r.ask).collect()
    }

    fn reviews(&self) -> Vec<RetryReviewRequest> {
        self.reviews.lock().unwrap().clone()
    }

    /// Pauses like a person would; `false` if the question was withdrawn meanwhile.
    fn deliberate(&self, withdrawn: &postern_engine::approval::Withdrawal) -> bool {
        std::thread::sleep(std::time::Duration::from_millis(150));
        while self.held.load(Ordering::SeqCst) {
            if withdrawn.is_withdrawn() && !self.deaf.load(Ordering::SeqCst) {
                self.saw_withdrawal.store(true, Ordering::SeqCst);
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        true
    }
}

impl Approver for Reviewer {
    fn authorize(&self, request: &AuthorizationRequest) -> Authorization {
        self.asked.lock().unwrap().push(request.clone());
        let open = self.open.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_open.fetch_max(open, Ordering::SeqCst);
        if let Some(opening) = &*self.opening.lock().unwrap() {
            self.released_when_asked.lock().unwrap().push(opening.is_released());
        }
        let answered = self.deliberate(&request.withdrawn);
        let refused_body = match (&*self.refuse_body.lock().unwrap(), &request.body_preview) {
            (Some(needle), Some(body)) => body.contains(needle.as_str()),
            _ => false,
        };
        let allow = self.allow && answered && !refused_body;
        self.open.fetch_sub(1, Ordering::SeqCst);
        Authorization {
            allowed: allow,
            rung: match request.ask {
                Ask::PerUse => postern_core::Rung::ApproveEveryUse,
                Ask::SessionAuthorization => postern_core::Rung::SessionAuthorization,
            },
            by: "reviewer:test".into(),
            reason: if allow { "approved" } else { "refused" }.into(),
            grant: self.grant,
            timed_out: false,
        }
    }

    fn reviews_retries(&self) -> bool {
        self.review.lock().unwrap().is_some()
    }

    fn review_retry(&self, request: &RetryReviewRequest) -> Option<ReviewVerdict> {
        self.reviews.lock().unwrap().push(request.clone());
        if !self.deliberate(&request.withdrawn) {
            return None;
        }
        let answer = self.review.lock().unwrap().clone()?;
        Some(ReviewVerdict { answer, by: "reviewer:test".into() })
    }
}

/// Releases the reviewer when dropped, so a failing test ends instead of waiting forever for
/// the approver's threads.
struct ReleaseOnDrop(Arc<Reviewer>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.deaf.store(false, Ordering::SeqCst);
        self.0.release();
    }
}

struct Ladder {
    rig: crate::support::Rig,
    engine: Arc<Engine>,
    target: crate::support::Target,
    addr: std::net::SocketAddr,
}

async fn ladder(reviewer: Arc<Reviewer>) -> Ladder {
    ladder_with_timeout(reviewer, postern_engine::engine::DEFAULT_APPROVAL_TIMEOUT).await
}

async fn ladder_with_timeout(reviewer: Arc<Reviewer>, timeout: std::time::Duration) -> Ladder {
    let (target, addr) = start_target().await;
    ladder_at(reviewer, timeout, target, addr, addr)
}

/// A ladder whose tools reach the target at `via` (e.g. a fault proxy) and whose status queries
/// go to `direct`.
fn ladder_at(
    reviewer: Arc<Reviewer>,
    timeout: std::time::Duration,
    target: crate::support::Target,
    via: std::net::SocketAddr,
    direct: std::net::SocketAddr,
) -> Ladder {
    let (base, status_base) = (format!("http://{via}"), format!("http://{direct}"));
    let addr = direct;
    let mut rig = rig(manifest(&base, &status_base));
    rig.approval_timeout = timeout;
    let engine = rig.engine_for(manifest(&base, &status_base), reviewer);
    Ladder { rig, engine, target, addr }
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

fn in_run(tool: &str, amount: u64, session: SessionId) -> postern_engine::Call {
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
    assert_eq!(l.target.payments(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_run_sends_nothing() {
    let reviewer = Reviewer::new(false, None);
    let l = ladder(Arc::clone(&reviewer)).await;
    let run = start_run(&l, 1);
    let out = l.engine.call(in_run("create_payment", 1, run)).await.unwrap();
    assert_eq!(out.state, ExecutionState::Denied);
    assert_eq!(out.why().rung.as_deref(), Some("session_authorization"));
    assert_eq!(out.why().by.as_deref(), Some("reviewer:test"));
    assert_eq!(l.target.payments(), 0);
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
    assert_eq!(out.why().code.as_deref(), Some("approval_timed_out"));
    assert_eq!(l.target.payments(), 0);
    let events: Vec<String> =
        l.rig.store.view().timeline(out.execution_id).unwrap().into_iter().map(|e| e.row.event.to_string()).collect();
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
    assert_eq!(locked.why().rung.as_deref(), Some("vault_locked"));
    assert_eq!(reviewer.asked().len(), 2, "a locked vault asks no one");
}

/// Polls `condition` for up to 10 s (the tests wait for a person-shaped event, not a time).
async fn eventually(what: &str, condition: impl Fn() -> bool) {
    for _ in 0..1000 {
        if condition() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Marks the "pay" credential "approve every use" (journaled on the vault stream).
fn every_use(l: &Ladder) {
    l.rig.vault.set_approve_every_use("pay", true, Timestamp::from_millis(8)).unwrap();
    assert!(l.rig.vault.credential("pay").unwrap().approve_every_use);
}

/// A run already authorized (its calls are asked about only where a rung says every use).
fn authorized_run(l: &Ladder, n: u128) -> SessionId {
    let run = start_run(l, n);
    l.rig.store.set_session_standing(run, true, "test", json!({}), Timestamp::from_millis(9)).unwrap();
    run
}

/// A payment of `amount` in `run`, under way on its own task.
fn pay_in(l: &Ladder, amount: u64, run: SessionId) -> tokio::task::JoinHandle<postern_engine::CallOutcome> {
    let engine = Arc::clone(&l.engine);
    tokio::spawn(async move { engine.call(in_run("create_payment", amount, run)).await.unwrap() })
}

fn events(l: &Ladder, id: postern_core::ExecutionId) -> Vec<String> {
    l.rig.store.view().timeline(id).unwrap().into_iter().map(|e| e.row.event.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_use_approval_binds_to_one_call_and_its_retry_joins_the_open_question() {
    let reviewer = Reviewer::new(true, None).holding();
    *reviewer.refuse_body.lock().unwrap() = Some("\"amount\":2".into());
    let l = ladder(Arc::clone(&reviewer)).await;
    every_use(&l);
    let run = authorized_run(&l, 1);
    let spawn = |amount: u64| pay_in(&l, amount, run);
    let x = spawn(1);
    eventually("the question about call X", || reviewer.asked().len() == 1).await;
    let x_retry = spawn(1);
    let y = spawn(2);
    eventually("the question about call Y", || reviewer.asked().len() == 2).await;
    reviewer.release();
    let (x, x_retry, y) = (x.await.unwrap(), x_retry.await.unwrap(), y.await.unwrap());

    // X's retry joined X's question: no third question, one execution, one payment.
    assert_eq!(reviewer.asked(), vec![Ask::PerUse, Ask::PerUse]);
    assert_eq!(x.state, ExecutionState::Completed);
    assert_eq!(x_retry.execution_id, x.execution_id);
    assert!(x_retry.attached);
    assert_eq!(x_retry.http().unwrap().body, x.http().unwrap().body);
    // Approving X did not approve Y (different arguments): Y was its own question, refused.
    assert_eq!(y.state, ExecutionState::Denied);
    assert_ne!(y.execution_id, x.execution_id);
    assert_eq!(l.target.payments(), 1);
    // Nor did it turn into anything for the run: a later call with X's arguments is a new intent
    // after delivery, and is asked about again.
    l.engine.delivered(x.execution_id, true).await.unwrap();
    reviewer.release();
    let again = l.engine.call(in_run("create_payment", 1, run)).await.unwrap();
    assert_ne!(again.execution_id, x.execution_id);
    assert_eq!(reviewer.asked().len(), 3);
    // What the reviewer saw of X: target, method, credential name, body — never the secret.
    let shown = reviewer.asked.lock().unwrap()[0].clone();
    assert_eq!((shown.method.as_str(), shown.credential.as_deref()), ("POST", Some("pay")));
    assert_eq!(shown.target, format!("http://{}/v1/payments", l.addr));
    assert_eq!(shown.body_preview.as_deref(), Some(r#"{"amount":1}"#));
    // The retry is on X's record, between the question and its answer.
    assert_eq!(
        events(&l, x.execution_id)[..5],
        ["accepted", "approval_requested", "retry_received", "approval_granted", "authorized"]
    );
    let journal = serde_json::to_string(&l.rig.store.view().timeline(x.execution_id).unwrap()).unwrap();
    assert!(!journal.contains(crate::support::SECRET));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locking_the_vault_withdraws_an_open_question_and_leaves_dispatched_work_truthful() {
    let reviewer = Reviewer::new(true, None).holding();
    let l = ladder(Arc::clone(&reviewer)).await;
    let run = start_run(&l, 1);
    // A question that nobody will answer: the lock must end it, not the 120 s timeout.
    let engine = Arc::clone(&l.engine);
    let pending = tokio::spawn(async move { engine.call(in_run("create_payment", 1, run)).await.unwrap() });
    eventually("the session question", || reviewer.asked().len() == 1).await;
    l.rig.vault.lock("test", Timestamp::from_millis(10)).unwrap();
    let out = tokio::time::timeout(std::time::Duration::from_secs(10), pending).await.unwrap().unwrap();
    assert_eq!(out.state, ExecutionState::Denied);
    assert_eq!(out.why().rung.as_deref(), Some("vault_locked"));
    eventually("the approver to take the question down", || reviewer.saw_withdrawal.load(Ordering::SeqCst)).await;
    assert_eq!(events(&l, out.execution_id), ["accepted", "approval_requested", "approval_withdrawn", "denied"]);
    assert_eq!(l.rig.store.view().session_standing(run).unwrap(), None, "a withdrawn question revokes nothing");
    assert_eq!(l.target.payments(), 0);

    // Work already dispatched when the lock comes is journaled as what happened.
    l.rig.vault.unlock("test", Timestamp::from_millis(11)).unwrap();
    l.rig.store.set_session_standing(run, true, "test", json!({}), Timestamp::from_millis(12)).unwrap();
    l.target.delay_answers(600);
    let engine = Arc::clone(&l.engine);
    let running = tokio::spawn(async move { engine.call(in_run("create_payment", 2, run)).await.unwrap() });
    eventually("the payment to reach the target", || l.target.payments() == 1).await;
    l.rig.vault.lock("test", Timestamp::from_millis(13)).unwrap();
    let done = running.await.unwrap();
    assert_eq!(done.state, ExecutionState::Completed, "not 'denied': it was sent and answered");
    assert_eq!(events(&l, done.execution_id).last().unwrap(), "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_an_undelivered_result_shows_the_reviewer_the_original_and_returns_it() {
    let reviewer = Reviewer::new(true, Some(Grant::Session)).reviewing(ReviewAnswer::ReturnRecordedResult);
    let l = ladder(Arc::clone(&reviewer)).await;
    let run = start_run(&l, 1);
    let first = l.engine.call(in_run("open_ticket", 1, run)).await.unwrap();
    assert_eq!(first.state, ExecutionState::Completed);
    l.engine.delivered(first.execution_id, false).await.unwrap();

    // Two retries at once: one review, one decision for both.
    let retries: Vec<_> = (0..2)
        .map(|_| {
            let engine = Arc::clone(&l.engine);
            tokio::spawn(async move { engine.call(in_run("open_ticket", 1, run)).await.unwrap() })
        })
        .collect();
    for r in retries {
        let r = r.await.unwrap();
        assert_eq!((r.execution_id, r.attached), (first.execution_id, true));
        assert_eq!(r.http().unwrap().status, 201);
        assert_eq!(r.http().unwrap().body, first.http().unwrap().body);
    }
    assert_eq!(l.target.irreversible(), 1, "nothing was sent again");
    let reviews = reviewer.reviews();
    assert_eq!(reviews.len(), 1, "one prompt for both retries");
    let shown = &reviews[0];
    assert_eq!(shown.execution_id, first.execution_id);
    assert_eq!(shown.state, ExecutionState::CompletedResultNotDelivered);
    assert_eq!(shown.target, format!("http://{}/v1/tickets", l.addr));
    assert_eq!(shown.authorized_by.as_deref(), Some("reviewer:test"));
    assert!(shown.first_dispatched_at.is_some());
    assert!(shown.known_outcome.contains("HTTP 201"), "{}", shown.known_outcome);
    assert!(shown.known_outcome.contains("delivery could not be confirmed"), "{}", shown.known_outcome);
    assert!(shown.why_not_resent.contains("repeat the action"), "{}", shown.why_not_resent);
    assert_eq!(shown.choices, [ReviewChoice::ReturnRecordedResult, ReviewChoice::DispatchAnew, ReviewChoice::Deny]);
    let steps: Vec<&str> = shown.timeline.iter().map(|t| t.event.as_str()).collect();
    assert!(steps.starts_with(&["accepted", "approval_requested", "approval_granted", "authorized", "dispatched"]));
    // On the original's record: both retries arrived, one review was asked and answered.
    let journal = events(&l, first.execution_id);
    let count = |event: &str| journal.iter().filter(|e| *e == event).count();
    assert_eq!(
        (count("retry_received"), count("retry_review_requested"), count("retry_review_decided")),
        (2, 1, 1),
        "{journal:?}"
    );
}

/// Regression (#27 finding 9): a prior that is merely `completed` (its delivery not settled yet)
/// was described to the reviewer as a result that "did not reach the agent". Say what is known.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reviewer_is_told_only_what_is_known_of_a_results_delivery() {
    let reviewer = Reviewer::new(true, Some(Grant::Session)).reviewing(ReviewAnswer::ReturnRecordedResult);
    let l = ladder(Arc::clone(&reviewer)).await;
    let run = start_run(&l, 1);
    let first = l.engine.call(in_run("open_ticket", 1, run)).await.unwrap();
    assert_eq!(first.state, ExecutionState::Completed);
    let retry = l.engine.call(in_run("open_ticket", 1, run)).await.unwrap();
    assert_eq!(retry.execution_id, first.execution_id);
    let shown = &reviewer.reviews()[0];
    assert_eq!(shown.state, ExecutionState::Completed);
    assert!(!shown.known_outcome.contains("did not reach"), "{}", shown.known_outcome);
    assert!(shown.known_outcome.contains("delivery is not confirmed yet"), "{}", shown.known_outcome);
    assert_eq!(l.target.irreversible(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatch_anew_needs_a_reason_and_links_the_new_execution_to_the_original() {
    let reviewer =
        Reviewer::new(true, Some(Grant::Session)).reviewing(ReviewAnswer::DispatchAnew { reason: "  ".into() });
    let l = ladder(Arc::clone(&reviewer)).await;
    let run = start_run(&l, 1);
    let first = l.engine.call(in_run("open_ticket", 1, run)).await.unwrap();
    l.engine.delivered(first.execution_id, false).await.unwrap();

    let blank = l.engine.call(in_run("open_ticket", 1, run)).await.unwrap();
    assert_eq!((blank.decision.as_str(), blank.why().code.as_deref()), ("retry_denied", Some("reason_required")));
    assert_eq!(l.target.irreversible(), 1);

    *reviewer.review.lock().unwrap() =
        Some(ReviewAnswer::DispatchAnew { reason: "the customer asked for a second ticket".into() });
    let anew = l.engine.call(in_run("open_ticket", 1, run)).await.unwrap();
    assert_eq!(anew.state, ExecutionState::Completed);
    assert_ne!(anew.execution_id, first.execution_id);
    assert_eq!(l.target.irreversible(), 2, "sent again, as the reviewer chose");
    let timeline = l.rig.store.view().timeline(anew.execution_id).unwrap();
    assert_eq!(timeline[0].row.detail["dispatched_anew"]["prior"], first.execution_id.to_string());
    assert_eq!(timeline[0].row.detail["dispatched_anew"]["reason"], "the customer asked for a second ticket");
    assert_eq!(timeline[1].row.event, "authorized");
    assert_eq!(
        (timeline[1].row.detail["rung"].as_str(), timeline[1].row.detail["by"].as_str()),
        (Some("retry_review"), Some("reviewer:test"))
    );
    let decided = l.rig.store.view().timeline(first.execution_id).unwrap();
    let decided = decided.iter().rev().find(|e| e.row.event == "retry_review_decided").unwrap();
    assert_eq!(decided.row.detail["decision"]["choice"], "dispatch_anew");

    *reviewer.review.lock().unwrap() = Some(ReviewAnswer::Deny { reason: "enough tickets".into() });
    let denied = l.engine.call(in_run("open_ticket", 1, run)).await.unwrap();
    assert_eq!((denied.decision.as_str(), denied.execution_id), ("retry_denied", anew.execution_id));
    assert_eq!(l.target.irreversible(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_retry_review_sends_nothing() {
    let reviewer = Reviewer::new(true, Some(Grant::Session)).reviewing(ReviewAnswer::ReturnRecordedResult);
    let l = ladder_with_timeout(Arc::clone(&reviewer), std::time::Duration::from_millis(400)).await;
    let run = start_run(&l, 1);
    let first = l.engine.call(in_run("open_ticket", 1, run)).await.unwrap();
    l.engine.delivered(first.execution_id, false).await.unwrap();
    reviewer.held.store(true, Ordering::SeqCst);
    let out = l.engine.call(in_run("open_ticket", 1, run)).await.unwrap();
    assert_eq!((out.decision.as_str(), out.why().code.as_deref()), ("retry_denied", Some("approval_timed_out")));
    eventually("the approver to take the review down", || reviewer.saw_withdrawal.load(Ordering::SeqCst)).await;
    assert_eq!(events(&l, first.execution_id).last().unwrap(), "retry_review_timed_out");
    assert_eq!(l.target.irreversible(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_status_verifies_an_unknown_outcome_through_the_contract() {
    let reviewer = Reviewer::new(true, Some(Grant::Session)).reviewing(ReviewAnswer::CheckStatus);
    let (target, addr) = start_target().await;
    let proxy = crate::support::FaultProxy::start(addr).await;
    let l =
        ladder_at(Arc::clone(&reviewer), postern_engine::engine::DEFAULT_APPROVAL_TIMEOUT, target, proxy.addr, addr);
    let run = start_run(&l, 1);
    proxy.next(crate::support::Fault::CutAfterForward);
    let first = l.engine.call(in_run("create_payment_checked", 7, run)).await.unwrap();
    assert_eq!(first.state, ExecutionState::OutcomeUnknown);
    let retry = l.engine.call(in_run("create_payment_checked", 7, run)).await.unwrap();
    let shown = &reviewer.reviews()[0];
    assert_eq!(shown.state, ExecutionState::OutcomeUnknown);
    assert!(shown.choices.contains(&ReviewChoice::CheckStatus));
    assert!(shown.why_not_resent.contains("status_query"), "{}", shown.why_not_resent);
    assert!(shown.why_not_resent.contains("only an answer its contract says means"), "{}", shown.why_not_resent);
    assert_eq!((retry.execution_id, retry.state), (first.execution_id, ExecutionState::Completed));
    assert_eq!(l.target.payments(), 1, "verified, not re-sent");
}

/// Found by an attacker review of #27: past the key's retention a reviewer was still offered
/// "check status", and a target that had forgotten the key answered 404 — "never received" by
/// the contract — so the payment was sent again. Past the retention the route is not offered,
/// and its "never received" is not believed even when a reviewer asks anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_key_retention_a_status_route_cannot_send_it_again() {
    let reviewer = Reviewer::new(true, Some(Grant::Session)).reviewing(ReviewAnswer::CheckStatus);
    let (target, addr) = start_target().await;
    let proxy = crate::support::FaultProxy::start(addr).await;
    let l =
        ladder_at(Arc::clone(&reviewer), postern_engine::engine::DEFAULT_APPROVAL_TIMEOUT, target, proxy.addr, addr);
    let run = start_run(&l, 1);
    proxy.next(crate::support::Fault::CutAfterForward);
    let first = l.engine.call(in_run("create_payment_briefly_checked", 7, run)).await.unwrap();
    assert_eq!(first.state, ExecutionState::OutcomeUnknown);
    l.target.forget_keys();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let retry = l.engine.call(in_run("create_payment_briefly_checked", 7, run)).await.unwrap();
    assert_eq!(retry.execution_id, first.execution_id);
    let shown = reviewer.reviews();
    assert!(!shown.is_empty() && shown.iter().all(|r| !r.choices.contains(&ReviewChoice::CheckStatus)), "{shown:?}");
    assert_ne!(retry.state, ExecutionState::Completed, "{retry:?}");
    assert_eq!(l.target.payments(), 1, "never sent again under a forgotten key");
}

/// A read that waits for a reviewer (the first call of a new run) opens its answer before it
/// waits: the transport must not hold a stream's head for as long as a person takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_waits_for_a_reviewer_opens_its_answer_first() {
    let reviewer = Reviewer::new(true, Some(Grant::Session));
    let l = ladder(Arc::clone(&reviewer)).await;
    let run = start_run(&l, 1);
    let asked_first = in_run("echo", 1, run);
    *reviewer.opening.lock().unwrap() = Some(asked_first.opening.clone());
    let out = l.engine.call(asked_first).await.unwrap();
    assert_eq!(out.state, ExecutionState::Completed);
    assert_eq!(reviewer.asked(), vec![Ask::SessionAuthorization]);
    assert_eq!(*reviewer.released_when_asked.lock().unwrap(), vec![true], "released before the reviewer was asked");
    // The run is authorized now: its next read waits for nobody and keeps its answer held.
    let next = in_run("echo", 2, run);
    let opening = next.opening.clone();
    assert_eq!(l.engine.call(next).await.unwrap().state, ExecutionState::Completed);
    assert_eq!(reviewer.asked().len(), 1);
    assert!(!opening.is_released());
}

/// An agent's calls that each need a person wait in line a few at a time, over all its runs
/// (a run costs an agent nothing to start), holding no dialog and no thread meanwhile; another
/// agent's question is not stuck behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn questions_wait_in_line_a_few_per_agent_and_another_agent_is_still_asked() {
    use postern_engine::engine::QUESTIONS_PER_AGENT;
    let reviewer = Reviewer::new(true, None).holding();
    let _release = ReleaseOnDrop(Arc::clone(&reviewer));
    let l = ladder(Arc::clone(&reviewer)).await;
    every_use(&l);
    let runs = [authorized_run(&l, 1), authorized_run(&l, 2)];
    let n = QUESTIONS_PER_AGENT + 6;
    let flooding: Vec<_> = (1..=n as u64).map(|amount| pay_in(&l, amount, runs[amount as usize % 2])).collect();
    eventually("the agent's first questions", || reviewer.asked().len() == QUESTIONS_PER_AGENT).await;
    let other_run = authorized_run(&l, 3);
    let mut call = in_run("create_payment", 1_000, other_run);
    call.actor = Actor::process("/usr/bin/other-agent", "ef01");
    let quiet = tokio::spawn({
        let engine = Arc::clone(&l.engine);
        async move { engine.call(call).await.unwrap() }
    });
    eventually("the other agent's question", || reviewer.asked().len() == QUESTIONS_PER_AGENT + 1).await;
    assert_eq!(reviewer.asked.lock().unwrap().last().unwrap().session, Some(other_run));
    reviewer.release();
    for c in flooding {
        assert_eq!(c.await.unwrap().state, ExecutionState::Completed);
    }
    assert_eq!(quiet.await.unwrap().state, ExecutionState::Completed);
    assert_eq!(reviewer.asked().len(), n + 1, "every call was asked about, in its turn");
    assert_eq!(reviewer.most_open.load(Ordering::SeqCst), QUESTIONS_PER_AGENT + 1);
    assert_eq!(l.target.payments(), n as u64 + 1);
}

/// A call whose turn never comes within the approval timeout is denied without a question, and
/// says why; a place is held until the approver's thread returns, not merely until the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_turn_never_comes_is_denied_without_a_question() {
    use postern_engine::engine::QUESTIONS_PER_AGENT;
    let reviewer = Reviewer::new(true, None).holding();
    reviewer.deaf.store(true, Ordering::SeqCst);
    let _release = ReleaseOnDrop(Arc::clone(&reviewer));
    let l = ladder_with_timeout(Arc::clone(&reviewer), std::time::Duration::from_millis(300)).await;
    every_use(&l);
    let run = authorized_run(&l, 1);
    let spawn = |amount: u64| pay_in(&l, amount, run);
    let asked: Vec<_> = (1..=QUESTIONS_PER_AGENT as u64).map(spawn).collect();
    eventually("the run's questions", || reviewer.asked().len() == QUESTIONS_PER_AGENT).await;
    let last = spawn(99).await.unwrap();
    assert_eq!(last.state, ExecutionState::Denied);
    assert_eq!(last.why().code.as_deref(), Some("approval_timed_out"));
    assert!(last.why().reason.as_deref().unwrap_or_default().contains("not put to a reviewer"), "{:?}", last.why());
    assert_eq!(reviewer.asked().len(), QUESTIONS_PER_AGENT, "the last call was never put to the reviewer");
    assert_eq!(events(&l, last.execution_id), ["accepted", "denied"], "no record of a question never put");
    assert_eq!(l.rig.store.view().session_standing(run).unwrap(), Some(true), "nothing was refused");
    reviewer.release();
    for c in asked {
        assert_eq!(c.await.unwrap().state, ExecutionState::Denied, "their own time ran out");
    }
    assert_eq!(l.target.payments(), 0);
}

/// An agent with its limit of calls under way (here all waiting for a person) is refused one
/// more before it becomes an execution, with a code it can act on; another agent is not, and a
/// place is given back when a call ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_at_its_limit_of_calls_under_way_is_refused_one_more_before_it_is_an_execution() {
    use postern_engine::engine::CALLS_IN_FLIGHT_PER_AGENT;
    let reviewer = Reviewer::new(true, None).holding();
    let _release = ReleaseOnDrop(Arc::clone(&reviewer));
    let l = ladder_with_timeout(Arc::clone(&reviewer), std::time::Duration::from_millis(800)).await;
    every_use(&l);
    let run = authorized_run(&l, 1);
    let under_way: Vec<_> = (1..=CALLS_IN_FLIGHT_PER_AGENT as u64).map(|amount| pay_in(&l, amount, run)).collect();
    let requested = || l.rig.store.view().events_after(0, &["accepted"]).unwrap();
    eventually("every call waiting for a person", || requested() == CALLS_IN_FLIGHT_PER_AGENT as u64).await;
    let refused = l.engine.call(in_run("create_payment", 100_000, run)).await.unwrap_err();
    assert_eq!(postern_core::ErrorCode::code(&refused), "too_many_calls_in_flight", "{refused}");
    assert!(refused.to_string().contains("nothing was journaled"), "{refused}");
    assert_eq!(requested(), CALLS_IN_FLIGHT_PER_AGENT as u64, "the refused call never became an execution");
    // Another agent is not held to this one's calls.
    let mut other = in_run("create_payment", 100_001, authorized_run(&l, 2));
    other.actor = Actor::process("/usr/bin/other-agent", "ef01");
    let other = tokio::spawn({
        let engine = Arc::clone(&l.engine);
        async move { engine.call(other).await }
    });
    eventually("the other agent's call", || requested() == CALLS_IN_FLIGHT_PER_AGENT as u64 + 1).await;
    // Once the questions' time runs out, the calls end and give their places back.
    for c in under_way {
        assert_eq!(c.await.unwrap().state, ExecutionState::Denied);
    }
    assert_eq!(other.await.unwrap().unwrap().state, ExecutionState::Denied);
    let again = l.engine.call(in_run("create_payment", 100_002, run)).await.unwrap();
    assert_eq!(again.state, ExecutionState::Denied, "taken in again, and asked (nobody answered)");
    assert_eq!(l.target.payments(), 0);
}
