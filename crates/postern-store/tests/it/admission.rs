//! Admission: retry lookup and acceptance are one atomic step, decided by the core.

use crate::support::*;
use postern_core::{ErrorCode, ExecutionState, RetryDecision, Verification};
use postern_store::{ActivityFilter, Admission, Completion, StoreError};
use serde_json::json;
use std::sync::{Arc, Barrier};

#[test]
fn a_retry_of_a_dispatched_call_waits_instead_of_dispatching_again() {
    let fx = Fixture::new();
    let store = fx.open();
    let s = session(1);
    let first = exec_id(1);
    assert_eq!(store.admit(payment(first, 500, s, at(0))).expect("admit"), Admission::Accepted { id: first });
    store.transition(first, ExecutionState::Authorized, json!({}), at(1)).expect("authorize");
    store.transition(first, ExecutionState::Dispatched, json!({}), at(2)).expect("dispatch");

    // Same effect, new JSON-RPC id, new attempted execution id: recognised as a retry.
    let mut retry = payment(exec_id(2), 500, s, at(5_000));
    retry.correlation = json!({"jsonrpc_id": "retry-8"});
    match store.admit(retry).expect("admit retry") {
        Admission::Matched { prior, decision } => {
            assert_eq!(prior.id, first);
            assert_eq!(decision, RetryDecision::WaitForPrior { prior: first });
        }
        other => panic!("expected a match, got {other:?}"),
    }
    // The retry left evidence on the prior, including its protocol correlation.
    let timeline = store.view().timeline(first).expect("timeline");
    let last = timeline.last().expect("rows");
    assert_eq!(last.row.event, "retry_received");
    assert_eq!(last.row.state, Some(ExecutionState::Dispatched));
    assert_eq!(last.row.detail["correlation"], json!({"jsonrpc_id": "retry-8"}));
    assert_eq!(last.row.detail["decision"]["decision"], "wait_for_prior");
    // And no second execution exists.
    assert!(store.view().execution(exec_id(2)).expect("query").is_none());
}

#[test]
fn outcome_unknown_is_verified_with_the_same_idempotency_key() {
    let fx = Fixture::new();
    let store = fx.open();
    let s = session(1);
    let first = exec_id(1);
    dispatch_new(&store, payment(first, 500, s, at(0)));
    store
        .transition(first, ExecutionState::OutcomeUnknown, json!({"reason": "connection_reset_after_send"}), at(3))
        .expect("unknown");
    let Admission::Matched { decision, .. } = store.admit(payment(exec_id(2), 500, s, at(10))).expect("admit") else {
        panic!("expected match")
    };
    assert_eq!(
        decision,
        RetryDecision::VerifyPrior {
            prior: first,
            verification: Verification::ResendWithSameKey { header: "Idempotency-Key".into(), key: first },
        }
    );
}

#[test]
fn a_completed_prior_returns_its_stored_result_and_a_delivered_one_starts_anew() {
    let fx = Fixture::new();
    let store = fx.open();
    let s = session(1);
    let first = exec_id(1);
    dispatch_new(&store, payment(first, 500, s, at(0)));
    store
        .complete(
            first,
            Completion { outcome: json!({"http_status": 201}), result: b"{\"id\":\"pay_1\"}".to_vec(), at: at(3) },
        )
        .expect("complete");
    store
        .transition(first, ExecutionState::CompletedResultNotDelivered, json!({"reason": "client_gone"}), at(4))
        .expect("not delivered");
    let Admission::Matched { decision, .. } = store.admit(payment(exec_id(2), 500, s, at(10))).expect("admit") else {
        panic!("expected match")
    };
    assert_eq!(decision, RetryDecision::ReturnStoredResult { prior: first });
    let result = store.view().result(first).expect("query").expect("stored");
    assert_eq!(result.body, b"{\"id\":\"pay_1\"}");

    store.transition(first, ExecutionState::ResultDelivered, json!({}), at(11)).expect("delivered");
    // The agent got its answer; the same call again is a deliberate second payment.
    let second = exec_id(3);
    assert_eq!(store.admit(payment(second, 500, s, at(20))).expect("admit"), Admission::Accepted { id: second });
    let accepted = &store.view().timeline(second).expect("timeline")[0];
    assert_eq!(accepted.row.detail["related_prior"]["execution_id"], json!(first.to_string()));
}

#[test]
fn different_scope_or_a_settled_prior_outside_the_window_is_a_new_execution() {
    let fx = Fixture::new();
    let store = fx.open();
    let first = exec_id(1);
    store.admit(payment(first, 500, session(1), at(0))).expect("admit");
    // Another agent run: not a retry.
    assert!(matches!(
        store.admit(payment(exec_id(2), 500, session(2), at(10))).expect("admit"),
        Admission::Accepted { .. }
    ));
    // Same run, after the 10-minute window of the contract, while the prior is unresolved: the
    // window never turns it into a new execution.
    match store.admit(payment(exec_id(3), 500, session(1), at(600_000))).expect("admit") {
        Admission::Matched { prior, decision } => {
            assert_eq!(prior.id, first);
            assert_eq!(decision, RetryDecision::ContinuePrior { prior: first });
        }
        other => panic!("an unresolved prior expired into a new execution: {other:?}"),
    }
    // Once the prior is settled for the agent (denied), the window ends matching.
    store.transition(first, ExecutionState::Denied, json!({"rung": "test"}), at(600_010)).expect("deny");
    assert!(matches!(
        store.admit(payment(exec_id(4), 500, session(1), at(600_020))).expect("admit"),
        Admission::Accepted { .. }
    ));
    // Same run, inside the window of the newest prior: continues that never-dispatched prior.
    match store.admit(payment(exec_id(5), 500, session(1), at(600_100))).expect("admit") {
        Admission::Matched { prior, decision } => {
            assert_eq!(prior.id, exec_id(4));
            assert_eq!(decision, RetryDecision::ContinuePrior { prior: exec_id(4) });
        }
        other => panic!("expected a match, got {other:?}"),
    }
}

#[test]
fn identical_concurrent_calls_are_accepted_exactly_once() {
    let fx = Fixture::new();
    let store = Arc::new(fx.open());
    let threads = 32;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let store = Arc::clone(&store);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                store.admit(payment(exec_id(100 + i as u128), 999, session(1), at(i as i64))).expect("admit")
            })
        })
        .collect();
    let outcomes: Vec<Admission> = handles.into_iter().map(|h| h.join().expect("thread")).collect();
    let accepted: Vec<_> = outcomes.iter().filter(|a| matches!(a, Admission::Accepted { .. })).collect();
    assert_eq!(accepted.len(), 1, "{outcomes:?}");
    let Admission::Accepted { id } = accepted[0] else { unreachable!() };
    for other in outcomes.iter().filter(|a| !matches!(a, Admission::Accepted { .. })) {
        assert_eq!(
            other,
            &Admission::Matched { prior: other_prior(other), decision: RetryDecision::ContinuePrior { prior: *id } }
        );
    }
    assert_eq!(store.view().state_counts().expect("counts"), vec![("accepted".to_string(), 1)]);
}

fn other_prior(a: &Admission) -> postern_core::PriorExecution {
    match a {
        Admission::Matched { prior, .. } => prior.clone(),
        Admission::Accepted { .. } => unreachable!(),
    }
}

#[test]
fn illegal_transitions_are_refused_and_leave_the_journal_untouched() {
    let fx = Fixture::new();
    let store = fx.open();
    let id = exec_id(1);
    store.admit(payment(id, 1, session(1), at(0))).expect("admit");
    let before = store.view().head().expect("head");
    let err = store.transition(id, ExecutionState::Completed, json!({}), at(1)).unwrap_err();
    assert_eq!(err.code(), "illegal_transition");
    assert_eq!(err.to_string(), "illegal lifecycle transition from accepted to completed");
    let err = store.complete(id, Completion { outcome: json!({}), result: vec![], at: at(2) }).unwrap_err();
    assert_eq!(err.code(), "illegal_transition");
    assert!(store.view().result(id).expect("query").is_none(), "no result stored without completion");
    let err = store.transition(exec_id(9), ExecutionState::Authorized, json!({}), at(1)).unwrap_err();
    assert!(matches!(err, StoreError::UnknownExecution(_)));
    assert_eq!(store.view().head().expect("head"), before);
    // A failed operation does not poison the batch: the next write succeeds and chains.
    store.transition(id, ExecutionState::Authorized, json!({}), at(3)).expect("authorize");
    assert_eq!(store.view().head().expect("head").size, before.size + 1);
    let report = postern_store::audit::verify(&fx.path, None, &mut |_, _| {}).expect("verify");
    assert!(report.intact(), "{:?}", report.findings);
}

#[test]
fn sixty_four_concurrent_writers_produce_one_intact_chain() {
    let fx = Fixture::new();
    let store = Arc::new(fx.open());
    let writers = 64;
    let per_writer = 8;
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for i in 0..per_writer {
                    let n = (w * 1000 + i) as u128;
                    run_to_delivery(
                        &store,
                        payment(exec_id(10_000 + n), n as u64, session(w as u128 + 1), at(n as i64)),
                        200,
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("writer");
    }
    let head = store.view().head().expect("head");
    assert_eq!(head.size, (writers * per_writer * 5) as u64);
    let report = postern_store::audit::verify(&fx.path, None, &mut |_, _| {}).expect("verify");
    assert!(report.intact(), "{:?}", report.findings);
    assert_eq!(report.executions, (writers * per_writer) as u64);
    // Every execution's rows are in lifecycle order.
    let rows = store
        .view()
        .activity(&ActivityFilter { execution: Some(exec_id(10_000 + 63_007)), limit: 10, ..Default::default() })
        .expect("rows");
    let events: Vec<&str> = rows.iter().map(|r| r.row.event.as_str()).collect();
    assert_eq!(events, ["accepted", "authorized", "dispatched", "completed", "result_delivered"]);
}

#[test]
fn a_huge_json_rpc_id_is_recorded_as_evidence_not_refused() {
    let fx = Fixture::new();
    let store = fx.open();
    let mut new = payment(exec_id(1), 5, session(1), at(0));
    new.correlation = json!({"jsonrpc_id": 18446744073709551615u64});
    store.admit(new).expect("a legal JSON-RPC id must not make the call fail");
    let mut retry = payment(exec_id(2), 5, session(1), at(1));
    retry.correlation = json!({"jsonrpc_id": 9007199254740993u64});
    store.admit(retry).expect("retry");
    let rows = store.view().timeline(exec_id(1)).expect("timeline");
    assert_eq!(rows[0].row.detail["correlation"]["jsonrpc_id"], "18446744073709551615");
    assert_eq!(rows[1].row.detail["correlation"]["jsonrpc_id"], "9007199254740993");
}

/// The Activity view's query: newest first, paged by the last ID, filtered, never missing or
/// repeating a row across pages.
#[test]
fn executions_page_walks_newest_first_by_id_and_filters() {
    let fx = Fixture::new();
    let store = fx.open();
    populate(&store, 25);
    let open = exec_id(5000);
    store.admit(payment(open, 7, session(2), at(100_000))).expect("admit");
    let view = store.view();
    let page = |before: Option<String>, state: Option<&str>, limit: usize| {
        view.executions_page(&postern_store::ExecutionQuery {
            before,
            state: state.map(|s| s.parse().expect("a state")),
            limit,
            ..Default::default()
        })
        .expect("page")
    };
    let first = page(None, None, 10);
    assert_eq!(first.len(), 10);
    assert_eq!(first[0].id, open.to_string(), "the newest first");
    let mut seen: Vec<String> = first.iter().map(|e| e.id.clone()).collect();
    let mut before = first.last().map(|e| e.id.clone());
    while let Some(b) = before {
        let next = page(Some(b), None, 10);
        seen.extend(next.iter().map(|e| e.id.clone()));
        before = if next.len() == 10 { next.last().map(|e| e.id.clone()) } else { None };
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.reverse();
    sorted.dedup();
    assert_eq!(seen, sorted, "every execution once, in ID order");
    assert_eq!(seen.len(), 26);
    let accepted = page(None, Some("accepted"), 100);
    assert_eq!(accepted.iter().map(|e| e.id.clone()).collect::<Vec<_>>(), [open.to_string()]);
    let text = view
        .executions_page(&postern_store::ExecutionQuery {
            text: Some(open.to_string()),
            limit: 5,
            ..Default::default()
        })
        .expect("search");
    assert_eq!(text.len(), 1);
}

/// The desktop app's watcher reads only rows appended after the head it last saw.
#[test]
fn events_after_counts_only_rows_appended_since() {
    let fx = Fixture::new();
    let store = fx.open();
    populate(&store, 3);
    let seen = store.view().head().expect("head").size;
    let id = exec_id(9000);
    store.admit(payment(id, 1, session(3), at(50_000))).expect("admit");
    store.transition(id, ExecutionState::Authorized, json!({}), at(50_001)).expect("authorize");
    store.transition(id, ExecutionState::Dispatched, json!({}), at(50_002)).expect("dispatch");
    store.transition(id, ExecutionState::OutcomeUnknown, json!({}), at(50_003)).expect("unknown");
    let view = store.view();
    assert_eq!(view.events_after(seen, &["outcome_unknown", "needs_review"]).expect("count"), 1);
    assert_eq!(view.events_after(seen, &["accepted"]).expect("count"), 1);
    let now = view.head().expect("head").size;
    assert_eq!(view.events_after(now, &["outcome_unknown"]).expect("count"), 0);
    let failed = [postern_store::VaultEvent::OAuthRefreshFailed];
    assert_eq!(view.vault_events_after(seen, &failed).expect("count"), 0);
    // A vault row (a failed OAuth refresh) counts on its own stream, not on the activity one.
    let detail = json!({ "server": "tracker", "why": "refused" });
    store.oauth_recorded(postern_store::OAuthEvent::OAuthRefreshFailed, detail, at(50_004)).expect("journal");
    let view = store.view();
    assert_eq!(view.vault_events_after(now, &failed).expect("count"), 1);
    assert_eq!(view.events_after(now, &["oauth_refresh_failed"]).expect("count"), 0);
}

/// A read-only call is never a retry: the same read again is a new execution that names no
/// prior, and a read whose record matches a side-effecting call still in flight (its tool was
/// made read-only since) is journaled whole instead of being refused as a match. Nor is a read
/// ever a prior: it does not hide the side-effecting call from that call's retry.
#[test]
fn a_read_only_call_never_looks_for_a_prior() {
    let fx = Fixture::new();
    let store = fx.open();
    let s = session(1);
    let write = exec_id(1);
    dispatch_new(&store, payment(write, 7, s, at(0)));
    submit_read(&store, exec_id(2), 7, 10).expect("a read beside a dispatched write of the same record");
    submit_read(&store, exec_id(3), 7, 20).expect("the same read again");
    store.flush().expect("flush");
    for id in [exec_id(2), exec_id(3)] {
        let timeline = store.view().timeline(id).expect("timeline");
        assert_eq!(timeline.last().and_then(|e| e.row.state), Some(ExecutionState::Completed), "{id}");
        assert!(timeline.iter().all(|e| e.row.detail.get("related_prior").is_none()), "{id}: {timeline:?}");
    }
    // The write is untouched by the reads: no retry row was journaled on it.
    let write_rows = store.view().timeline(write).expect("timeline");
    assert_eq!(write_rows.last().and_then(|e| e.row.state), Some(ExecutionState::Dispatched));
    assert!(write_rows.iter().all(|e| e.row.event != "retry_received"), "{write_rows:?}");
    // Nor do the reads hide it: the tool side-effecting again, the same call is a retry of the
    // write still in flight, not a second dispatch after "a read-only prior".
    match store.admit(payment(exec_id(4), 7, s, at(30))).expect("admit") {
        Admission::Matched { prior, decision } => {
            assert_eq!(prior.id, write);
            assert_eq!(decision, RetryDecision::WaitForPrior { prior: write });
        }
        other => panic!("the newer reads hid the write in flight: {other:?}"),
    }
}
