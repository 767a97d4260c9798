//! The scenarios of issue #3: a dropped connection after dispatch never becomes a second side
//! effect at a target that honours idempotency keys, and never a blind re-send elsewhere.
//! Each test counts what the target actually did.

use crate::support::*;
use postern_core::ExecutionState;
use serde_json::json;
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_after_forward_then_retry_recovers_with_the_same_key_and_one_side_effect() {
    let (target, addr) = start_target().await;
    let proxy = FaultProxy::start(addr).await;
    let rig = rig(manifest(&format!("http://{}", proxy.addr), &format!("http://{addr}")));

    proxy.next(Fault::CutAfterForward);
    let first = rig.engine.call(call("create_payment", json!({"amount": 1250}), 1, 1)).await.unwrap();
    assert_eq!(first.state, ExecutionState::OutcomeUnknown, "{first:?}");
    assert_eq!(target.payments(), 1, "the target executed the first request");

    // The agent reconnects and retries with a new JSON-RPC id.
    let retry = rig.engine.call(call("create_payment", json!({"amount": 1250}), 1, 2)).await.unwrap();
    assert_eq!(retry.execution_id, first.execution_id, "the retry is the first execution");
    assert!(retry.attached);
    assert_eq!(retry.decision, postern_engine::Decision::VerifyPrior);
    assert_eq!(retry.state, ExecutionState::Completed);
    let result = retry.http().cloned().unwrap();
    assert_eq!(result.status, 201);
    assert!(result.body.contains("pay_1"), "the replayed response of the first request: {}", result.body);
    assert_eq!(target.payments(), 1, "exactly one payment");
    let keys = target.seen_keys().clone();
    assert_eq!(keys, vec![first.execution_id.to_string(); 2], "same idempotency key = execution id, twice");
    // The credential was injected from the keychain, never chosen by the agent.
    assert_eq!(target.seen_credentials().as_slice(), [SECRET, SECRET]);

    let events: Vec<String> =
        rig.store.view().timeline(first.execution_id).unwrap().into_iter().map(|e| e.row.event.to_string()).collect();
    assert_eq!(
        events,
        ["accepted", "authorized", "dispatched", "outcome_unknown", "retry_received", "dispatched", "completed"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_before_forward_is_unknown_and_the_recovery_sends_it_once() {
    let (target, addr) = start_target().await;
    let proxy = FaultProxy::start(addr).await;
    let rig = rig(manifest(&format!("http://{}", proxy.addr), &format!("http://{addr}")));
    proxy.next(Fault::ResetBeforeForward);
    let first = rig.engine.call(call("create_payment", json!({"amount": 7}), 1, 1)).await.unwrap();
    // Postern cannot tell a reset before forwarding from one after: it must not assume either.
    assert_eq!(first.state, ExecutionState::OutcomeUnknown, "{first:?}");
    assert_eq!(target.payments(), 0);
    let retry = rig.engine.call(call("create_payment", json!({"amount": 7}), 1, 2)).await.unwrap();
    assert_eq!((retry.execution_id, retry.state), (first.execution_id, ExecutionState::Completed));
    assert_eq!(target.payments(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_cut_on_an_irreversible_tool_goes_to_review_and_sends_nothing_more() {
    let (target, addr) = start_target().await;
    let proxy = FaultProxy::start(addr).await;
    let rig = rig(manifest(&format!("http://{}", proxy.addr), &format!("http://{addr}")));
    proxy.next(Fault::CutAfterForward);
    let first = rig.engine.call(call("open_ticket", json!({}), 1, 1)).await.unwrap();
    assert_eq!(first.state, ExecutionState::OutcomeUnknown);
    let requests_before = target.requests();
    let retry = rig.engine.call(call("open_ticket", json!({}), 1, 2)).await.unwrap();
    assert_eq!(retry.execution_id, first.execution_id);
    assert_eq!(retry.state, ExecutionState::NeedsReview);
    assert!(retry.why().reason.clone().unwrap().contains("did not re-send"), "{:?}", retry.detail);
    assert_eq!(target.requests(), requests_before, "no request reached the target");
    assert_eq!(target.irreversible(), 1);
    // Asking again returns the same review, still without sending.
    let again = rig.engine.call(call("open_ticket", json!({}), 1, 3)).await.unwrap();
    assert_eq!((again.execution_id, again.state), (first.execution_id, ExecutionState::NeedsReview));
    assert_eq!(target.irreversible(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_refused_fails_before_dispatch_and_a_retry_dispatches() {
    // A port with nothing listening yet.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let rig = rig(manifest(&format!("http://{addr}"), &format!("http://{addr}")));
    let first = rig.engine.call(call("create_payment", json!({"amount": 3}), 1, 1)).await.unwrap();
    assert_eq!(first.state, ExecutionState::FailedBeforeDispatch, "{first:?}");
    assert!(first.why().reason.clone().unwrap().contains("could not connect"), "{:?}", first.detail);
    let target = Target::serve(std::net::TcpListener::bind(addr).unwrap());
    let retry = rig.engine.call(call("create_payment", json!({"amount": 3}), 1, 2)).await.unwrap();
    assert_ne!(retry.execution_id, first.execution_id, "nothing was sent, so the retry is a new execution");
    assert_eq!(retry.state, ExecutionState::Completed);
    assert_eq!(target.payments(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_calls_from_two_agent_runs_are_two_executions_with_two_keys() {
    let (target, addr) = start_target().await;
    let rig = rig(manifest(&format!("http://{addr}"), &format!("http://{addr}")));
    let a = rig.engine.call(call("create_payment", json!({"amount": 9}), 1, 1)).await.unwrap();
    let b = rig.engine.call(call("create_payment", json!({"amount": 9}), 2, 1)).await.unwrap();
    assert_ne!(a.execution_id, b.execution_id);
    assert_eq!((a.state, b.state), (ExecutionState::Completed, ExecutionState::Completed));
    assert_eq!(target.payments(), 2);
    let keys = target.seen_keys().clone();
    assert_eq!(keys.len(), 2);
    assert_ne!(keys[0], keys[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_vault_denies_and_nothing_is_sent() {
    let (target, addr) = start_target().await;
    let rig = rig(manifest(&format!("http://{addr}"), &format!("http://{addr}")));
    rig.vault.lock("test", postern_core::Timestamp::from_millis(10)).unwrap();
    let denied = rig.engine.call(call("create_payment", json!({"amount": 1}), 1, 1)).await.unwrap();
    assert_eq!(denied.state, ExecutionState::Denied);
    assert_eq!(denied.why().rung.as_deref(), Some("vault_locked"));
    assert_eq!(target.requests(), 0);
    // A retry returns the same denial, even once unlocked: no fresh approval path from a retry.
    rig.vault.unlock("test", postern_core::Timestamp::from_millis(11)).unwrap();
    let retry = rig.engine.call(call("create_payment", json!({"amount": 1}), 1, 2)).await.unwrap();
    assert_eq!((retry.execution_id, retry.state), (denied.execution_id, ExecutionState::Denied));
    assert_eq!(target.requests(), 0);
}

fn events(rig: &Rig, id: postern_core::ExecutionId) -> Vec<String> {
    rig.store.view().timeline(id).unwrap().into_iter().map(|e| e.row.event.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_query_settles_an_executed_request_without_resending_it() {
    let (target, addr) = start_target().await;
    let proxy = FaultProxy::start(addr).await;
    let rig = rig(manifest(&format!("http://{}", proxy.addr), &format!("http://{addr}")));
    proxy.next(Fault::CutAfterForward);
    let first = rig.engine.call(call("create_payment_checked", json!({"amount": 4}), 1, 1)).await.unwrap();
    assert_eq!(first.state, ExecutionState::OutcomeUnknown);
    assert_eq!(target.payments(), 1, "the target executed it");
    let retry = rig.engine.call(call("create_payment_checked", json!({"amount": 4}), 1, 2)).await.unwrap();
    assert_eq!((retry.execution_id, retry.state), (first.execution_id, ExecutionState::Completed));
    assert!(retry.http().cloned().unwrap().body.contains("pay_1"), "the status endpoint's record of the first request");
    assert_eq!(target.payments(), 1, "settled by asking, not by sending again");
    assert_eq!(
        events(&rig, first.execution_id),
        ["accepted", "authorized", "dispatched", "outcome_unknown", "retry_received", "completed"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_query_that_proves_nothing_ran_lets_the_same_execution_dispatch_once() {
    let (target, addr) = start_target().await;
    let proxy = FaultProxy::start(addr).await;
    let rig = rig(manifest(&format!("http://{}", proxy.addr), &format!("http://{addr}")));
    proxy.next(Fault::ResetBeforeForward);
    let first = rig.engine.call(call("create_payment_checked", json!({"amount": 5}), 1, 1)).await.unwrap();
    assert_eq!(first.state, ExecutionState::OutcomeUnknown);
    assert_eq!(target.payments(), 0);
    let retry = rig.engine.call(call("create_payment_checked", json!({"amount": 5}), 1, 2)).await.unwrap();
    assert_eq!((retry.execution_id, retry.state), (first.execution_id, ExecutionState::Completed));
    assert_eq!(target.payments(), 1);
    assert_eq!(
        events(&rig, first.execution_id),
        [
            "accepted",
            "authorized",
            "dispatched",
            "outcome_unknown",
            "retry_received",
            "not_executed",
            "dispatched",
            "completed"
        ]
    );
}

/// A payment tool whose status route is `status_path` and whose answers mean what `meanings`
/// (TOML keys of `status_query`) says.
fn checked_payment(base: &str, status_base: &str, status_path: &str, meanings: &str) -> postern_engine::Manifest {
    let text = format!(
        "[[tool]]\nname = \"pay_checked\"\nmethod = \"POST\"\nurl = \"{base}/v1/payments\"\ncredential = \"pay\"\n\
         timeout = \"3s\"\ncontract = {{ class = \"status_query\", idempotency_header = \"Idempotency-Key\", \
         status_query = {{ method = \"GET\", url_template = \"{status_base}{status_path}/{{execution_id}}\", {meanings} }} }}\n"
    );
    postern_engine::Manifest::parse(&text, std::path::Path::new("t.toml")).unwrap()
}

/// Regression (#27 finding 3): a 404 from the status route was read as "never executed" and the
/// payment was sent again (two payments: the route here is one that knows nothing), and any
/// 2xx counted as completed whatever its body said. Now an answer proves only what the
/// contract says it proves; anything else goes to a person, and nothing is sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_answer_proves_only_what_the_contract_says() {
    let (target, addr) = start_target().await;
    let proxy = FaultProxy::start(addr).await;
    let (base, status_base) = (format!("http://{}", proxy.addr), format!("http://{addr}"));
    // A route that answers 404 to everything: the contract does not say 404 means "never received".
    let rig = rig(checked_payment(&base, &status_base, "/v1/nowhere", "done = [200]"));
    proxy.next(Fault::CutAfterForward);
    let first = rig.engine.call(call("pay_checked", json!({"amount": 4}), 1, 1)).await.unwrap();
    assert_eq!(first.state, ExecutionState::OutcomeUnknown);
    let retry = rig.engine.call(call("pay_checked", json!({"amount": 4}), 1, 2)).await.unwrap();
    assert_eq!((retry.execution_id, retry.state), (first.execution_id, ExecutionState::NeedsReview));
    assert!(retry.why().to_value().to_string().contains("HTTP 404 is none of the answers"), "{:?}", retry.detail);
    assert_eq!(target.payments(), 1, "a 404 the contract does not vouch for sent nothing");

    // A 200 whose body says "pending": in flight by the contract, not completed.
    let meanings = r#"done = [{ status = 200, pointer = "/state", equals = "succeeded" }], in_flight = [{ status = 200, pointer = "/state", equals = "pending" }]"#;
    let rig = super::support::rig(checked_payment(&base, &status_base, "/v1/jobs", meanings));
    proxy.next(Fault::CutAfterForward);
    let first = rig.engine.call(call("pay_checked", json!({"amount": 6}), 1, 1)).await.unwrap();
    assert_eq!(first.state, ExecutionState::OutcomeUnknown);
    let retry = rig.engine.call(call("pay_checked", json!({"amount": 6}), 1, 2)).await.unwrap();
    assert_eq!((retry.execution_id, retry.state), (first.execution_id, ExecutionState::OutcomeUnknown));
    assert!(retry.why().to_value().to_string().contains("still working on it"), "{:?}", retry.detail);
    assert!(retry.http().is_none(), "a pending answer is not the payment's result");
    assert_eq!(target.payments(), 2, "one payment per intent");
    assert_eq!(events(&rig, first.execution_id).last().map(String::as_str), Some("retry_received"));

    // The status route is asked about the execution ID: a contract whose key never reaches the
    // target is refused when the manifest loads, and so is one that does not say what proves done.
    let keyless = format!(
        "[[tool]]\nname = \"p\"\nmethod = \"POST\"\nurl = \"{base}/v1/payments\"\ncontract = {{ class = \"status_query\", \
         status_query = {{ method = \"GET\", url_template = \"{status_base}/v1/status/{{execution_id}}\", done = [200] }} }}\n"
    );
    let errors = postern_engine::Manifest::parse(&keyless, std::path::Path::new("t.toml")).unwrap_err();
    assert!(errors[0].to_string().contains("needs `idempotency_header`"), "{}", errors[0]);
    let silent = keyless
        .replace("contract = { class", "contract = { idempotency_header = \"Idempotency-Key\", class")
        .replace(", done = [200]", "");
    let errors = postern_engine::Manifest::parse(&silent, std::path::Path::new("t.toml")).unwrap_err();
    assert!(errors[0].to_string().contains("must say what its answers mean"), "{}", errors[0]);
}

/// Regression (#27 finding 4): a same-key re-send made after the target forgot the key ran as a
/// new request (a second payment). Past the contract's `key_retention` an uncertain outcome goes
/// to review instead; within it, the same-key recovery still settles it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_the_target_has_forgotten_is_never_re_sent() {
    let (target, addr) = start_target().await;
    let proxy = FaultProxy::start(addr).await;
    let text = format!(
        "[[tool]]\nname = \"pay_briefly\"\nmethod = \"POST\"\nurl = \"http://{}/v1/payments\"\ncredential = \"pay\"\n\
         timeout = \"3s\"\ncontract = {{ class = \"idempotency_key\", idempotency_header = \"Idempotency-Key\", \
         key_retention = \"1s\" }}\n",
        proxy.addr
    );
    let rig = rig(postern_engine::Manifest::parse(&text, std::path::Path::new("t.toml")).unwrap());
    proxy.next(Fault::CutAfterForward);
    let first = rig.engine.call(call("pay_briefly", json!({"amount": 8}), 1, 1)).await.unwrap();
    assert_eq!(first.state, ExecutionState::OutcomeUnknown);
    // The target's retention passes: it forgets the key, and Postern's clock moves past it too.
    target.forget_keys();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let retry = rig.engine.call(call("pay_briefly", json!({"amount": 8}), 1, 2)).await.unwrap();
    assert_eq!((retry.execution_id, retry.state), (first.execution_id, ExecutionState::NeedsReview));
    assert!(
        retry.why().to_value().to_string().contains("longer ago than the target keeps idempotency keys (1s)"),
        "{:?}",
        retry.detail
    );
    assert_eq!(target.payments(), 1, "nothing re-sent under a forgotten key");

    // A contract keeps its own retention, and it applies only where a key is sent.
    let keyless = text
        .replace("class = \"idempotency_key\", idempotency_header = \"Idempotency-Key\"", "class = \"irreversible\"");
    let errors = postern_engine::Manifest::parse(&keyless, std::path::Path::new("t.toml")).unwrap_err();
    assert!(errors[0].to_string().contains("`key_retention` only applies"), "{}", errors[0]);
}

/// Regression (#27 finding 5): a recovery re-send was rendered from the retry's arguments and
/// today's tool, so an argument outside the fingerprint went out under the original's key as a
/// different request (the target saw a second, different payment attempt with the same key).
/// Only the exact request the first attempt sent is re-sent; anything else goes to a person.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_re_sends_the_original_request_or_nothing() {
    let (target, addr) = start_target().await;
    let proxy = FaultProxy::start(addr).await;
    let text = format!(
        "[[tool]]\nname = \"pay_with_memo\"\nmethod = \"POST\"\nurl = \"http://{}/v1/payments\"\ncredential = \"pay\"\n\
         timeout = \"3s\"\ncontract = {{ class = \"idempotency_key\", idempotency_header = \"Idempotency-Key\", \
         fingerprint_fields = [\"amount\"] }}\n",
        proxy.addr
    );
    let rig = rig(postern_engine::Manifest::parse(&text, std::path::Path::new("t.toml")).unwrap());
    let pay = |memo: &str, id| call("pay_with_memo", json!({"amount": 3, "memo": memo}), 1, id);
    proxy.next(Fault::CutAfterForward);
    let first = rig.engine.call(pay("rent", 1)).await.unwrap();
    assert_eq!(first.state, ExecutionState::OutcomeUnknown);
    assert_eq!(target.requests(), 1);

    // The memo is outside the fingerprint: the same intent, but not the same request.
    let changed = rig.engine.call(pay("groceries", 2)).await.unwrap();
    assert_eq!((changed.execution_id, changed.state), (first.execution_id, ExecutionState::NeedsReview));
    assert!(
        changed.why().to_value().to_string().contains("re-sends only the original request"),
        "{:?}",
        changed.detail
    );
    assert_eq!(target.requests(), 1, "nothing went out under the original's key");
    let timeline = rig.store.view().timeline(first.execution_id).unwrap();
    let refused = timeline.iter().find(|e| e.row.event == "recovery_refused").expect("journaled");
    assert_eq!(refused.row.detail["reason"], "request_changed");
}

/// The same recovery with the original request: re-sent, byte for byte, with the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_with_the_original_request_is_re_sent_with_its_key() {
    let (target, addr) = start_target().await;
    let proxy = FaultProxy::start(addr).await;
    let rig = rig(manifest(&format!("http://{}", proxy.addr), &format!("http://{addr}")));
    proxy.next(Fault::CutAfterForward);
    let first = rig.engine.call(call("create_payment", json!({"amount": 3}), 1, 1)).await.unwrap();
    assert_eq!(first.state, ExecutionState::OutcomeUnknown);
    let retry = rig.engine.call(call("create_payment", json!({"amount": 3}), 1, 2)).await.unwrap();
    assert_eq!((retry.execution_id, retry.state), (first.execution_id, ExecutionState::Completed));
    assert_eq!(target.payments(), 1);
    let keys = target.seen_keys().clone();
    assert_eq!(keys, [first.execution_id.to_string(), first.execution_id.to_string()]);
    let digests: Vec<serde_json::Value> = rig
        .store
        .view()
        .timeline(first.execution_id)
        .unwrap()
        .into_iter()
        .filter(|e| e.row.event == "dispatched")
        .map(|e| e.row.detail["request_digest"].clone())
        .collect();
    assert_eq!(digests.len(), 2);
    assert!(digests[0].as_str().unwrap().starts_with("hmac-sha256:") && digests[0] == digests[1], "{digests:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_credential_never_reaches_the_journal_and_an_echo_is_flagged_and_redacted() {
    let (_target, addr) = start_target().await;
    let rig = rig(manifest(&format!("http://{addr}"), &format!("http://{addr}")));
    let outcome = rig.engine.call(call("echo", json!({}), 1, 1)).await.unwrap();
    let result = outcome.http().cloned().unwrap();
    assert!(result.secret_echoed, "the target sent the credential back");
    assert_eq!(result.body, "you sent <redacted>");
    assert!(!format!("{outcome:?}").contains(SECRET));
    assert!(!format!("{:?}", rig.engine).contains(SECRET));
    // Error paths that carry the credential: a refused connection, a call refused outright.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let url = format!("http://{closed}/v1/echo");
    let failed = rig.engine.call(call("http_request", json!({"method": "POST", "url": url}), 1, 2)).await.unwrap();
    assert_eq!(failed.state, ExecutionState::FailedBeforeDispatch);
    assert!(!format!("{failed:?}").contains(SECRET), "{failed:?}");
    let refused = rig
        .engine
        .call(call("http_request", json!({"method": "GET", "url": "http://localhost:9/x", "credential": "pay"}), 1, 3))
        .await
        .unwrap_err();
    assert!(!refused.to_string().contains(SECRET) && !format!("{refused:?}").contains(SECRET));
    rig.store.flush().unwrap();
    for entry in std::fs::read_dir(rig.dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        assert!(!bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()), "secret in {}", path.display());
    }
}

/// A hostile target echoes the credential in every spelling (bare after the scheme, the basic
/// password decoded, JSON-escaped, percent-encoded, base64, in a `Location` header): none of
/// them reaches the result, the agent's answer or any file Postern writes, and the result is
/// flagged. (Before, only the whole header value was searched for: the bare token went through.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_an_echoed_credential_is_redacted() {
    use postern_vault::{Binding, Credential, CredentialKind, Sensitive};
    const HOSTILE_SECRET: &str = "CANARY-mirror \"s3cr/et\"+&=%\\";
    let (_target, addr) = start_target().await;
    let text = format!(
        "[[tool]]\nname = \"mirror_bearer\"\nmethod = \"GET\"\nurl = \"http://{addr}/v1/mirror\"\ncredential = \"bearer\"\n\n\
         [[tool]]\nname = \"mirror_basic\"\nmethod = \"GET\"\nurl = \"http://{addr}/v1/mirror\"\ncredential = \"basic\"\n"
    );
    let rig = rig(postern_engine::Manifest::parse(&text, std::path::Path::new("t.toml")).unwrap());
    for (name, kind) in
        [("bearer", CredentialKind::Bearer), ("basic", CredentialKind::Basic { username: "ops".into() })]
    {
        let credential = Credential {
            name: name.into(),
            kind,
            bindings: vec![Binding::new(&format!("127.0.0.1:{}", addr.port()), Some("/v1/mirror")).unwrap()],
            approve_every_use: false,
            idempotency_header: None,
            reads_have_effects: false,
        };
        let at = postern_core::Timestamp::from_millis(3);
        rig.vault.add_credential(&credential, &Sensitive::new(HOSTILE_SECRET.into()), at).unwrap();
    }
    let spellings = |secret: &str| -> Vec<String> {
        use base64::Engine as _;
        let percent: String = secret
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02x}") })
            .collect();
        let json = serde_json::to_string(secret).unwrap();
        let b64 = base64::engine::general_purpose::STANDARD_NO_PAD.encode(format!("ops:{secret}"));
        vec![secret.to_owned(), json[1..json.len() - 1].to_owned(), percent.clone(), percent.to_uppercase(), b64]
    };
    for (n, tool) in ["mirror_bearer", "mirror_basic"].into_iter().enumerate() {
        let outcome = rig.engine.call(call(tool, json!({}), 1, n as u64)).await.unwrap();
        let result = outcome.http().cloned().unwrap();
        assert_eq!(result.status, 200, "{result:?}");
        assert!(result.secret_echoed, "{tool}: the target sent the credential back: {result:?}");
        let shown = format!(
            "{}{:?}{}",
            result.body,
            result.headers,
            postern_gateway::door::mcp::outcome_result(&outcome).content[0].as_text().unwrap().text
        );
        for spelling in spellings(HOSTILE_SECRET) {
            assert!(!shown.contains(&spelling), "{tool}: {spelling:?} reached the result: {shown}");
        }
        assert!(
            result.body.contains("<redacted>")
                && result.headers.iter().any(|(k, v)| k == "location" && v.contains("<redacted>")),
            "{result:?}"
        );
    }
    rig.store.flush().unwrap();
    for entry in std::fs::read_dir(rig.dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        for spelling in spellings(HOSTILE_SECRET) {
            assert!(
                !bytes.windows(spelling.len()).any(|w| w == spelling.as_bytes()),
                "{spelling:?} in {}",
                path.display()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_calls_are_refused_before_they_become_executions() {
    let (target, addr) = start_target().await;
    let rig = rig(manifest(&format!("http://{addr}"), &format!("http://{addr}")));
    let err = rig.engine.call(call("nope", json!({}), 1, 1)).await.unwrap_err();
    assert_eq!(postern_core::ErrorCode::code(&err), "unknown_tool");
    let err = rig.engine.call(call("create_payment", json!({"amount": "lots"}), 1, 1)).await.unwrap_err();
    assert_eq!(postern_core::ErrorCode::code(&err), "invalid_arguments");
    assert!(err.to_string().contains("/amount"), "{err}");
    assert_eq!(target.requests(), 0);
    assert_eq!(rig.store.view().head().unwrap().size, 1, "only the credential_added row");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_dies_mid_dispatch_recovers_on_restart_with_one_side_effect() {
    let (target, addr) = start_target().await;
    target.delay_answers(600);
    let base = format!("http://{addr}");
    let rig = rig(manifest(&base, &base));
    let engine = Arc::new(rig.engine);
    let running = {
        let engine = Arc::clone(&engine);
        tokio::spawn(async move { engine.call(call("create_payment", json!({"amount": 42}), 1, 1)).await })
    };
    // Wait until the target has made the payment (its answer is delayed): the engine dies with
    // the request executed and no response seen. (`dispatched` alone is written before sending.)
    while target.payments() == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let id = loop {
        let rows =
            rig.store.view().activity(&postern_store::ActivityFilter { limit: 10, ..Default::default() }).unwrap();
        if let Some(row) = rows.iter().find(|r| r.row.event == "dispatched") {
            break row.row.execution_id.unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    // The gateway process dies: the call is abandoned and every handle dropped.
    running.abort();
    let _ = running.await;
    drop(engine);
    let dir = rig.dir;
    drop(rig.vault);
    drop(rig.store);
    // Let the target finish the request it received.
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    assert_eq!(target.payments(), 1);

    let restarted = open_rig(dir, manifest(&base, &base));
    assert_eq!(
        restarted.store.view().execution(id).unwrap().unwrap().state,
        postern_core::ExecutionState::OutcomeUnknown
    );
    let last = restarted.store.view().timeline(id).unwrap().pop().unwrap();
    assert_eq!(last.row.detail["reason"], "gateway_restarted_while_dispatched");
    let retry = restarted.engine.call(call("create_payment", json!({"amount": 42}), 1, 2)).await.unwrap();
    assert_eq!((retry.execution_id, retry.state), (id, ExecutionState::Completed));
    assert_eq!(target.payments(), 1, "recovered with the same key, not paid twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_connection_times_out_as_unknown_not_as_failed() {
    let (target, addr) = start_target().await;
    let proxy = FaultProxy::start(addr).await;
    let rig = rig(manifest(&format!("http://{}", proxy.addr), &format!("http://{addr}")));
    proxy.next(Fault::Stall);
    let first = rig.engine.call(call("slow_payment", json!({"amount": 8}), 1, 1)).await.unwrap();
    assert_eq!(first.state, ExecutionState::OutcomeUnknown, "{first:?}");
    assert!(first.why().reason.clone().unwrap().contains("timed out"), "{:?}", first.detail);
    let retry = rig.engine.call(call("slow_payment", json!({"amount": 8}), 1, 2)).await.unwrap();
    assert_eq!((retry.execution_id, retry.state), (first.execution_id, ExecutionState::Completed));
    assert_eq!(target.payments(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_never_followed_and_a_body_over_the_result_limit_is_not_kept() {
    let (target, addr) = start_target().await;
    let mut rig = rig(manifest(&format!("http://{addr}"), &format!("http://{addr}")));
    rig.max_result_bytes = 1_000;
    let engine = rig.engine_for(
        manifest(&format!("http://{addr}"), &format!("http://{addr}")),
        Arc::new(postern_engine::LockOnlyApprover),
    );
    let url = format!("http://{addr}/v1/redirect");
    let moved = engine.call(call("http_request", json!({"method": "GET", "url": url}), 1, 1)).await.unwrap();
    let result = moved.http().cloned().unwrap();
    assert_eq!(result.status, 302, "the redirect is the result; the credential never went to its location");
    assert!(result.headers.contains(&("location".to_string(), "http://127.0.0.2:9/steal".to_string())));
    assert_eq!(target.requests(), 1);
    let url = format!("http://{addr}/v1/large");
    let large = engine.call(call("http_request", json!({"method": "GET", "url": url}), 1, 2)).await.unwrap();
    let result = large.http().cloned().unwrap();
    assert_eq!((result.status, result.result_too_large, result.body.as_str()), (200, Some(1_000), ""), "{result:?}");
    let answer = postern_gateway::door::mcp::outcome_result(&large);
    assert_eq!(answer.is_error, Some(true), "the agent is told it cannot see the answer");
    let structured = answer.structured_content.unwrap();
    assert_eq!(structured["error"], json!({ "code": "result_too_large", "limit": 1_000 }), "{structured}");
    assert_eq!(structured["state"], "completed", "the execution's true state");
    rig.store.flush().unwrap();
    let stored = engine.view().result(large.execution_id).unwrap().unwrap();
    assert!(stored.body.len() < 1_000, "the journal keeps no more than the limit: {} bytes", stored.body.len());
}

/// A secret carried anywhere in a call — a manifest secret field placed in the URL, an agent's
/// `X-Api-Key` header or `?api_key=` on `http_request` — is written nowhere in clear: not in the
/// record, the `accepted` or `dispatched` rows, nor any file of the data directory (WAL
/// included); it is shown as `SECRET(name:digest)`. Two different keys are two executions, not a
/// retry of one. (Before, the URL and the agent's headers were journaled verbatim.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_in_a_url_or_header_is_journaled_nowhere() {
    const URL_SECRET: &str = "CANARY-url-secret-81f3";
    const HEADER_SECRETS: [&str; 2] = ["CANARY-header-secret-a1", "CANARY-header-secret-b2"];
    let (target, addr) = start_target().await;
    let text = format!(
        "[[tool]]\nname = \"signed_ticket\"\nmethod = \"POST\"\nurl = \"http://{addr}/v1/tickets?sig={{sig}}\"\n\
         input_schema = {{ type = \"object\", required = [\"sig\"], properties = {{ sig = {{ type = \"string\" }} }} }}\n\
         contract = {{ class = \"irreversible\", secret_fields = [\"sig\"] }}\n"
    );
    let rig = rig(postern_engine::Manifest::parse(&text, std::path::Path::new("t.toml")).unwrap());
    let signed = rig.engine.call(call("signed_ticket", json!({ "sig": URL_SECRET }), 1, 1)).await.unwrap();
    assert_eq!(signed.state, ExecutionState::Completed, "{signed:?}");
    let mut ids = vec![signed.execution_id];
    for (n, key) in HEADER_SECRETS.iter().enumerate() {
        let url = format!("http://{addr}/v1/tickets?api_key={key}&page=1");
        let arguments = json!({ "method": "POST", "url": url, "headers": { "X-Api-Key": key }, "body": {} });
        let out = rig.engine.call(call("http_request", arguments, 1, 2 + n as u64)).await.unwrap();
        assert_eq!(out.state, ExecutionState::Completed, "{out:?}");
        ids.push(out.execution_id);
    }
    assert_ne!(ids[1], ids[2], "two different keys are two intents");
    assert_eq!(target.irreversible(), 3);
    let view = rig.store.view();
    let record = view.execution(ids[0]).unwrap().unwrap().record;
    assert!(record["target"].as_str().unwrap().contains("sig=SECRET(sig:"), "{record}");
    let record = view.execution(ids[1]).unwrap().unwrap().record;
    assert!(record["target"].as_str().unwrap().contains("api_key=SECRET("), "{record}");
    // Header names are recorded in lower case (they are case-insensitive).
    assert!(record["arguments"]["headers"]["x-api-key"].as_str().unwrap().starts_with("SECRET(x-api-key:"), "{record}");
    rig.store.flush().unwrap();
    for entry in std::fs::read_dir(rig.dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        for secret in [URL_SECRET].iter().chain(HEADER_SECRETS.iter()) {
            assert!(!bytes.windows(secret.len()).any(|w| w == secret.as_bytes()), "{secret} in {}", path.display());
        }
    }
}

/// Arguments nested near JSON's parser limit would be journaled and then unreadable: they are
/// refused before they become an execution, naming the limit; 60 levels still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_arguments_are_refused_before_acceptance() {
    let (target, addr) = start_target().await;
    let rig = rig(manifest(&format!("http://{addr}"), &format!("http://{addr}")));
    let nested = |depth: usize| (0..depth).fold(json!(1), |inner, _| json!({ "n": inner }));
    let url = format!("http://{addr}/v1/tickets");
    let err = rig
        .engine
        .call(call("http_request", json!({ "method": "POST", "url": url, "body": nested(100) }), 1, 1))
        .await
        .unwrap_err();
    assert_eq!(postern_core::ErrorCode::code(&err), "invalid_arguments");
    assert!(err.to_string().contains("at most 64"), "{err}");
    assert_eq!(target.requests(), 0);
    let ok = rig
        .engine
        .call(call("http_request", json!({ "method": "POST", "url": url, "body": nested(60) }), 1, 2))
        .await
        .unwrap();
    assert_eq!(ok.state, ExecutionState::Completed);
    let record = rig.store.view().execution(ok.execution_id).unwrap().expect("readable");
    assert!(record.record["arguments"]["body"]["n"].is_object());
}

/// A header the HTTP stack would refuse is refused with the call, naming it, before the call
/// becomes an execution (before, it was journaled `dispatched` and then failed as unknown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_header_is_refused_before_dispatch() {
    let (target, addr) = start_target().await;
    let rig = rig(manifest(&format!("http://{addr}"), &format!("http://{addr}")));
    let url = format!("http://{addr}/v1/tickets");
    for (name, value) in [("X-Trace", "a\r\nInjected: 1"), ("Bad Name", "v"), ("X-Null", "a\u{0}b")] {
        let args = json!({ "method": "POST", "url": url, "headers": { name: value }, "body": {} });
        let err = rig.engine.call(call("http_request", args, 1, 1)).await.unwrap_err();
        assert_eq!(postern_core::ErrorCode::code(&err), "invalid_arguments", "{name}: {err}");
        assert!(err.to_string().contains(&format!("/headers/{name}")), "{err}");
    }
    assert_eq!(target.requests(), 0);
    assert!(rig.store.view().executions_page(&Default::default()).unwrap().is_empty(), "no execution");
}

/// A recovery is an action like any other: with the vault locked, a retry of an unknown outcome
/// re-sends nothing (not even with the same key) and says why, journaled as `recovery_refused`;
/// once unlocked, the same retry recovers it with one payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_vault_stops_a_recovery_from_sending_again() {
    let (target, addr) = start_target().await;
    let proxy = FaultProxy::start(addr).await;
    let rig = rig(manifest(&format!("http://{}", proxy.addr), &format!("http://{addr}")));
    proxy.next(Fault::CutAfterForward);
    let first = rig.engine.call(call("create_payment", json!({"amount": 77}), 1, 1)).await.unwrap();
    assert_eq!(first.state, ExecutionState::OutcomeUnknown, "{first:?}");
    let sent = target.requests();
    rig.vault.lock("test", postern_core::Timestamp::from_millis(10)).unwrap();
    let locked = rig.engine.call(call("create_payment", json!({"amount": 77}), 1, 2)).await.unwrap();
    assert_eq!((locked.execution_id, locked.state), (first.execution_id, ExecutionState::OutcomeUnknown));
    assert_eq!(locked.why().reason.as_deref(), Some("vault_locked"), "{locked:?}");
    assert_eq!(target.requests(), sent, "nothing re-sent while locked");
    assert!(events(&rig, first.execution_id).contains(&"recovery_refused".to_owned()));
    rig.vault.unlock("test", postern_core::Timestamp::from_millis(20)).unwrap();
    let recovered = rig.engine.call(call("create_payment", json!({"amount": 77}), 1, 3)).await.unwrap();
    assert_eq!((recovered.execution_id, recovered.state), (first.execution_id, ExecutionState::Completed));
    assert_eq!(target.payments(), 1, "one payment");
}
