//! The built-in `http_request` tool: the credential follows the URL's bindings, and a write is
//! recoverable only when the credential says its API honours an idempotency header.

use crate::support::*;
use postern_core::{ErrorCode, ExecutionState, Timestamp};
use postern_vault::{Binding, Credential, CredentialKind, Sensitive};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_is_read_only_and_carries_the_bound_credential() {
    let (target, addr) = start_target().await;
    let rig = rig(manifest(&format!("http://{addr}"), &format!("http://{addr}")));
    let url = format!("http://{addr}/v1/echo");
    let outcome = rig.engine.call(call("http_request", json!({"method": "GET", "url": url}), 1, 1)).await.unwrap();
    assert_eq!(outcome.state, ExecutionState::Completed);
    let result = outcome.http().cloned().unwrap();
    assert!(result.secret_echoed, "the credential bound to 127.0.0.1 was injected");
    assert_eq!(target.requests(), 1);
    rig.store.flush().unwrap(); // read-only executions are journaled without being waited for
    let record = rig.store.view().execution(outcome.execution_id).unwrap().unwrap();
    assert_eq!(record.contract["class"], "read_only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_is_irreversible_unless_the_credential_declares_an_idempotency_header() {
    let (target, addr) = start_target().await;
    let proxy = FaultProxy::start(addr).await;
    let rig = rig(manifest(&format!("http://{}", proxy.addr), &format!("http://{addr}")));
    let url = format!("http://{}/v1/payments", proxy.addr);
    let pay = |id| call("http_request", json!({"method": "POST", "url": url, "body": {"amount": 3}}), 1, id);

    proxy.next(Fault::CutAfterForward);
    let first = rig.engine.call(pay(1)).await.unwrap();
    assert_eq!(first.state, ExecutionState::OutcomeUnknown);
    let retry = rig.engine.call(pay(2)).await.unwrap();
    assert_eq!((retry.execution_id, retry.state), (first.execution_id, ExecutionState::NeedsReview));
    assert_eq!(target.payments(), 1, "irreversible: never re-sent");

    // A second credential for the same host whose API honours Idempotency-Key.
    let keyed = Credential {
        name: "pay-keyed".into(),
        kind: CredentialKind::Header { name: "X-Api-Key".into() },
        bindings: vec![Binding::new("127.0.0.1", None).unwrap()],
        approve_every_use: false,
        idempotency_header: Some("Idempotency-Key".into()),
        reads_have_effects: false,
    };
    rig.vault.add_credential(&keyed, &Sensitive::new(SECRET.into()), Timestamp::from_millis(20)).unwrap();
    // Two credentials are bound to the URL now: the call must say which.
    let err = rig.engine.call(pay(3)).await.unwrap_err();
    assert!(err.to_string().contains("several credentials are bound"), "{err}");
    let keyed_pay = |id| {
        call(
            "http_request",
            json!({"method": "POST", "url": url, "body": {"amount": 4}, "credential": "pay-keyed"}),
            1,
            id,
        )
    };
    proxy.next(Fault::CutAfterForward);
    let first = rig.engine.call(keyed_pay(4)).await.unwrap();
    assert_eq!(first.state, ExecutionState::OutcomeUnknown);
    let retry = rig.engine.call(keyed_pay(5)).await.unwrap();
    assert_eq!((retry.execution_id, retry.state), (first.execution_id, ExecutionState::Completed));
    assert_eq!(target.payments(), 2, "one more payment, recovered with the same key");
}

/// The verb is trusted by default; a credential whose reads have effects withdraws that trust:
/// an uncertain GET through it is never sent again, and a manifest tool that is read-only by
/// its verb alone is refused until it declares a contract.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_through_a_credential_whose_reads_have_effects_is_never_resent() {
    let (target, addr) = start_target().await;
    let proxy = FaultProxy::start(addr).await;
    let text = format!(
        "[[tool]]\nname = \"export\"\nmethod = \"GET\"\nurl = \"http://{}/v1/echo\"\ncredential = \"exports\"\n",
        proxy.addr
    );
    let manifest = postern_engine::Manifest::parse(&text, std::path::Path::new("t.toml")).unwrap();
    let rig = open_rig(tempfile::tempdir().unwrap(), manifest);
    let exports = Credential {
        name: "exports".into(),
        kind: CredentialKind::Header { name: "X-Api-Key".into() },
        bindings: vec![Binding::new("127.0.0.1", None).unwrap()],
        approve_every_use: false,
        idempotency_header: None,
        reads_have_effects: true,
    };
    rig.vault.add_credential(&exports, &Sensitive::new(SECRET.into()), Timestamp::from_millis(20)).unwrap();
    let url = format!("http://{}/v1/echo", proxy.addr);
    let get = |id| call("http_request", json!({"method": "GET", "url": url}), 1, id);

    proxy.next(Fault::CutAfterForward);
    let first = rig.engine.call(get(1)).await.unwrap();
    assert_eq!(first.state, ExecutionState::OutcomeUnknown, "a read with effects is tracked like a write");
    let retry = rig.engine.call(get(2)).await.unwrap();
    assert_eq!((retry.execution_id, retry.state), (first.execution_id, ExecutionState::NeedsReview));
    assert_eq!(target.requests(), 1, "the GET reached the target once");
    let record = rig.store.view().execution(first.execution_id).unwrap().unwrap();
    assert_eq!(record.contract["class"], "irreversible");

    let err = rig.engine.call(call("export", json!({}), 1, 3)).await.unwrap_err();
    assert_eq!(err.code(), "effectful_read_needs_contract");
    assert!(err.to_string().contains("export"), "{err}");
    assert_eq!(target.requests(), 1, "the refused tool sent nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_cannot_set_credentials_or_send_a_key_elsewhere() {
    let (target, addr) = start_target().await;
    let rig = rig(manifest(&format!("http://{addr}"), &format!("http://{addr}")));
    let url = format!("http://{addr}/v1/echo");
    let err = rig
        .engine
        .call(call(
            "http_request",
            json!({"method": "GET", "url": url, "headers": {"Authorization": "Bearer mine"}}),
            1,
            1,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "invalid_arguments");
    assert!(err.to_string().contains("/headers/Authorization"), "{err}");
    let err = rig
        .engine
        .call(call("http_request", json!({"method": "GET", "url": "http://localhost:9/x", "credential": "pay"}), 1, 2))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "credential_not_bound");
    let err = rig
        .engine
        .call(call("http_request", json!({"method": "POST", "url": "http://169.254.169.254/latest/meta-data"}), 1, 3))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "unsafe_target");
    assert_eq!(target.requests(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_names_go_through_the_guarded_resolver_and_still_connect() {
    let (target, addr) = start_target().await;
    let rig = rig(manifest(&format!("http://{addr}"), &format!("http://{addr}")));
    // `localhost` is resolved by Postern's resolver (IP literals are not), which drops only
    // link-local and metadata addresses.
    let url = format!("http://localhost:{}/v1/echo", addr.port());
    let outcome = rig.engine.call(call("http_request", json!({"method": "GET", "url": url}), 1, 1)).await.unwrap();
    assert_eq!(outcome.state, ExecutionState::Completed, "{outcome:?}");
    assert_eq!(outcome.http().cloned().unwrap().body, "you sent ", "no credential is bound to the name localhost");
    assert_eq!(target.requests(), 1);
}

/// A body as agents send it: an object or array goes as JSON; a string goes as its own bytes,
/// with the agent's `Content-Type`, else `application/json` when it is JSON, else `text/plain`.
/// The target checks what it received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_string_body_is_sent_as_its_bytes_and_an_object_as_json() {
    let (target, addr) = start_target().await;
    let rig = rig(manifest(&format!("http://{addr}"), &format!("http://{addr}")));
    let url = format!("http://{addr}/v1/inspect");
    let cases = [
        (json!({"amount": 5}), json!({}), "application/json", br#"{"amount":5}"#.to_vec()),
        (json!([1, 2]), json!({}), "application/json", b"[1,2]".to_vec()),
        (json!("{\"amount\": 7}"), json!({}), "application/json", br#"{"amount": 7}"#.to_vec()),
        (
            json!("a=1&b=caf%C3%A9"),
            json!({"Content-Type": "application/x-www-form-urlencoded"}),
            "application/x-www-form-urlencoded",
            b"a=1&b=caf%C3%A9".to_vec(),
        ),
        (json!("hello, target"), json!({}), "text/plain; charset=utf-8", b"hello, target".to_vec()),
    ];
    for (i, (body, headers, content_type, bytes)) in cases.into_iter().enumerate() {
        let args = json!({"method": "POST", "url": url, "headers": headers, "body": body});
        let outcome = rig.engine.call(call("http_request", args, 1, 10 + i as u64)).await.unwrap();
        assert_eq!(outcome.state, ExecutionState::Completed, "{body}");
        let received = target.received().last().cloned().unwrap();
        assert_eq!(
            (received.0.as_str(), String::from_utf8_lossy(&received.1).into_owned()),
            (content_type, String::from_utf8_lossy(&bytes).into_owned()),
            "{body}"
        );
    }
}

/// Models write a body out again when they retry: other spacing, other key order, a string
/// where the first call had an object. In one scope those are one intent, so an irreversible
/// POST goes out once; a body that differs in value, or a string that is not JSON, is a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_written_out_again_is_the_same_intent() {
    let (target, addr) = start_target().await;
    let rig = rig(manifest(&format!("http://{addr}"), &format!("http://{addr}")));
    let url = format!("http://{addr}/v1/tickets");
    let post = |body: serde_json::Value, headers: serde_json::Value, id| {
        call("http_request", json!({"method": "POST", "url": url, "headers": headers, "body": body}), 1, id)
    };
    let first = rig.engine.call(post(json!("{\"amount\": 5, \"to\": \"acct_1\"}"), json!({}), 1)).await.unwrap();
    assert_eq!(first.state, ExecutionState::Completed);
    let spellings = [
        (json!("{\"amount\":5,\"to\":\"acct_1\"}"), json!({})),
        (json!("{ \"to\" : \"acct_1\", \"amount\" : 5.0 }\n"), json!({})),
        (json!({"to": "acct_1", "amount": 5}), json!({})),
        // The header the gateway would have added anyway changes nothing that is sent.
        (json!({"amount": 5, "to": "acct_1"}), json!({"Content-Type": "application/json"})),
    ];
    let first_tagged = rig.engine.call(post(json!({"amount": 1}), json!({"X-Tag": "a"}), 7)).await.unwrap();
    let again = rig.engine.call(post(json!("{\"amount\":1}"), json!({"x-tag": "a"}), 8)).await.unwrap();
    assert_eq!(again.execution_id, first_tagged.execution_id, "header names are case-insensitive");
    for (i, (body, headers)) in spellings.into_iter().enumerate() {
        let again = rig.engine.call(post(body.clone(), headers, 2 + i as u64)).await.unwrap();
        assert_eq!(again.execution_id, first.execution_id, "{body} is the same intent");
    }
    assert_eq!(target.irreversible(), 2, "one POST for each intent");

    // A different value, the same text sent as plain text, and a JSON text whose value readers
    // disagree on (a repeated member) are each a new intent.
    let others = [
        (json!("{\"amount\": 6, \"to\": \"acct_1\"}"), json!({})),
        (json!("{\"amount\": 5, \"to\": \"acct_1\"}"), json!({"Content-Type": "text/plain"})),
        (json!("{\"amount\": 5, \"to\": \"acct_1\", \"amount\": 5}"), json!({})),
    ];
    for (i, (body, headers)) in others.into_iter().enumerate() {
        let other = rig.engine.call(post(body.clone(), headers, 10 + i as u64)).await.unwrap();
        assert_ne!(other.execution_id, first.execution_id, "{body}");
        assert_eq!(other.state, ExecutionState::Completed, "{body}");
    }
    assert_eq!(target.irreversible(), 5);

    // Two Content-Type headers differing only in case are not the default one: a new intent.
    let two_types = json!({"Content-Type": "application/json", "content-type": "text/xml"});
    let doubled = rig.engine.call(post(json!({"amount": 5, "to": "acct_1"}), two_types, 20)).await.unwrap();
    assert_ne!(doubled.execution_id, first.execution_id);
    assert_eq!(target.irreversible(), 6);

    // A body that spells a secret the call carries (here the agent's own API key in a header)
    // stays one masked string in the record: a number or a key would not be masked.
    let secret = "9081726354";
    let keyed = json!({"X-Api-Key": secret});
    let body = format!("{{\"pin\": {secret}, \"{secret}\": true}}");
    let masked = rig.engine.call(post(json!(body), keyed, 21)).await.unwrap();
    assert_eq!(masked.state, ExecutionState::Completed);
    rig.store.flush().unwrap();
    let record = rig.store.view().execution(masked.execution_id).unwrap().unwrap().record;
    assert!(record["arguments"]["body"].is_string(), "{record}");
    assert!(!record.to_string().contains(secret), "{record}");
}

/// The transport may hold what opens a call's answer (an HTTP stream's head and priming event)
/// to send it with the answer, only while the engine has not released it. A call with an effect
/// has it released before its request reaches the target: the event a client resumes with is
/// out before the effect can happen. A read that waits for nobody keeps it held while it is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_read_keeps_its_answer_unopened_while_it_is_sent() {
    let (target, addr) = start_target().await;
    let rig = rig(manifest(&format!("http://{addr}"), &format!("http://{addr}")));
    let current = std::sync::Arc::new(std::sync::Mutex::new(postern_engine::Opening::default()));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (probe_current, probe_seen) = (std::sync::Arc::clone(&current), std::sync::Arc::clone(&seen));
    target.on_arrival(move |path| {
        let released = probe_current.lock().unwrap().is_released();
        probe_seen.lock().unwrap().push((path.to_owned(), released));
    });
    let with_opening = |c: postern_engine::Call| {
        *current.lock().unwrap() = c.opening.clone();
        c
    };
    let pay = call(
        "http_request",
        json!({"method": "POST", "url": format!("http://{addr}/v1/payments"), "body": {"amount": 1}}),
        1,
        1,
    );
    let paid = rig.engine.call(with_opening(pay)).await.unwrap();
    assert_eq!(paid.state, ExecutionState::Completed);
    let read =
        with_opening(call("http_request", json!({"method": "GET", "url": format!("http://{addr}/v1/balance")}), 1, 2));
    let opening = read.opening.clone();
    let balance = rig.engine.call(read).await.unwrap();
    assert_eq!(balance.state, ExecutionState::Completed);
    assert!(!opening.is_released(), "nothing made the read open its answer early");
    assert_eq!(
        *seen.lock().unwrap(),
        vec![("/v1/payments".to_owned(), true), ("/v1/balance".to_owned(), false)],
        "at the moment each request reached the target"
    );
}
