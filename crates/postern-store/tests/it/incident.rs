//! The incident record: one execution with everything an investigator asks for.

use crate::support::*;
use postern_core::ExecutionState;
use postern_store::{Admission, Completion};
use serde_json::json;

#[test]
fn the_incident_record_names_every_call_that_reached_an_execution_and_its_relatives() {
    let fx = Fixture::new();
    let store = fx.open();
    let s = session(1);
    let first = dispatch_new(&store, payment(exec_id(1), 500, s, at(0)));
    store
        .complete(
            first,
            Completion { outcome: json!({"http_status": 201}), result: b"{\"id\":\"pay_1\"}".to_vec(), at: at(3) },
        )
        .expect("complete");
    store
        .transition(first, ExecutionState::CompletedResultNotDelivered, json!({"reason": "client_gone"}), at(4))
        .expect("not delivered");
    // The agent reconnects over HTTP and repeats the call: it is matched, not dispatched again.
    let mut retry = payment(exec_id(2), 500, s, at(5_000));
    retry.correlation = json!({
        "transport": "streamable_http", "agent_session": s.to_string(),
        "mcp_session_id": "mcp-7f3a", "jsonrpc_id": "retry-8",
    });
    assert!(matches!(store.admit(retry).expect("admit"), Admission::Matched { .. }));
    store.transition(first, ExecutionState::ResultDelivered, json!({}), at(5_001)).expect("deliver");
    // Once delivered, the same call is a new intent: a related execution.
    let again = dispatch_new(&store, payment(exec_id(3), 500, s, at(9_000)));

    let incident = store.view().incident(first).expect("query").expect("exists");
    assert_eq!(incident.calls.len(), 2, "{incident:#?}");
    assert_eq!(incident.calls[1].mcp_session_id, Some(json!("mcp-7f3a")));
    assert_eq!(incident.calls[1].jsonrpc_id, Some(json!("retry-8")));
    assert_eq!(incident.related.len(), 1);
    assert_eq!(incident.related[0].execution_id, again.to_string());
    assert_eq!(incident.result_ref.as_ref().expect("result").bytes, 14);
    assert_eq!(incident.times.result_delivered_at, Some(at(5_001).as_millis()));
    insta::assert_json_snapshot!(incident);

    assert!(store.view().incident(exec_id(99)).expect("query").is_none());
}

/// A client resuming a broken stream names its MCP session and JSON-RPC id: the journal finds
/// the execution that request reached (created by it, or matched to it as a retry), and the
/// decision taken; a request of another session, or with an id of another type, finds nothing.
#[test]
fn a_request_is_found_by_its_mcp_session_and_jsonrpc_id() {
    let fx = Fixture::new();
    let store = fx.open();
    let s = session(1);
    let correlated = |id: u128, amount: u64, jsonrpc_id: serde_json::Value, at_ms: i64| {
        let mut new = payment(exec_id(id), amount, s, at(at_ms));
        new.correlation =
            json!({ "transport": "streamable_http", "mcp_session_id": "mcp-1", "jsonrpc_id": jsonrpc_id });
        new
    };
    let first = dispatch_new(&store, correlated(1, 5, json!(7), 0));
    let big = 9_007_199_254_740_993_i64; // beyond 2^53: journaled as a string
    let other = dispatch_new(&store, correlated(2, 6, json!(big), 10));
    assert!(matches!(store.admit(correlated(3, 5, json!("r-8"), 20)).expect("admit"), Admission::Matched { .. }));

    let view = store.view();
    assert_eq!(view.execution_for_request("mcp-1", &json!(7)).unwrap(), Some((first, "new_execution".into())));
    let (matched, decision) = view.execution_for_request("mcp-1", &json!("r-8")).unwrap().expect("the retry");
    assert_eq!(matched, first);
    assert_ne!(decision, "new_execution");
    assert_eq!(view.execution_for_request("mcp-1", &json!(big)).unwrap(), Some((other, "new_execution".into())));
    assert_eq!(view.execution_for_request("mcp-1", &json!("7")).unwrap(), None, "a string id is another request");
    assert_eq!(view.execution_for_request("mcp-2", &json!(7)).unwrap(), None, "another session");
    assert_eq!(view.execution_for_request("mcp-1", &json!(null)).unwrap(), None);
}

/// A journal written before the request lookup had its index (schema v12) is upgraded with its
/// past requests in it: a payment's stream broken just before the upgrade still resumes after it,
/// a read is not looked for (it is read again), and the chain still verifies.
#[test]
fn a_version_12_journal_finds_its_requests_once_upgraded() {
    let fx = Fixture::new();
    let correlated = |mut new: postern_store::NewExecution, jsonrpc_id: i64| {
        new.correlation =
            json!({ "transport": "streamable_http", "mcp_session_id": "mcp-1", "jsonrpc_id": jsonrpc_id });
        new
    };
    let (paid, read) = (exec_id(1), exec_id(2));
    {
        let store = fx.open();
        dispatch_new(&store, correlated(payment(paid, 5, session(1), at(0)), 1));
        let mut lookup = correlated(payment(read, 6, session(1), at(10)), 2);
        lookup.contract = postern_core::ReplayContract::read_only();
        let steps = vec![step(ExecutionState::Authorized, json!({}), at(11))];
        store.record_read_only_detached(lookup, steps, None).expect("read");
        store.flush().expect("flush");
    }
    rusqlite::Connection::open(&fx.path).expect("open").execute_batch(V13_UNDONE).expect("downgrade to v12");
    let store = fx.open();
    let view = store.view();
    assert_eq!(view.execution_for_request("mcp-1", &json!(1)).unwrap(), Some((paid, "new_execution".into())));
    assert_eq!(view.execution_for_request("mcp-1", &json!(2)).unwrap(), None, "the read {read} is not resumed");
    assert_eq!(view.execution_for_request("mcp-1", &json!(3)).unwrap(), None);
    drop(store);
    let report = postern_store::audit::verify(&fx.path, None, &mut |_, _| {}).expect("verify");
    assert!(report.intact(), "{:?}", report.findings);
}

/// The request index is not hash-chained: one rewritten to send a request to another row (here
/// two requests' entries swapped, the index's definition left as it was) must not resume the
/// other request's execution. The row's own correlation is checked, and the mismatch reported.
#[test]
fn a_request_index_pointing_at_another_row_is_refused() {
    let fx = Fixture::new();
    let correlated = |id: u128, jsonrpc_id: i64, at_ms: i64| {
        let mut new = payment(exec_id(id), 5 + id as u64, session(1), at(at_ms));
        new.correlation =
            json!({ "transport": "streamable_http", "mcp_session_id": "mcp-1", "jsonrpc_id": jsonrpc_id });
        new
    };
    {
        let store = fx.open();
        dispatch_new(&store, correlated(1, 1, 0));
        dispatch_new(&store, correlated(2, 2, 10));
        store.flush().expect("flush");
    }
    let real: String = {
        let conn = rusqlite::Connection::open(&fx.path).expect("open");
        conn.query_row("SELECT sql FROM sqlite_schema WHERE name = 'journal_request_lookup'", [], |r| r.get(0))
            .expect("index")
    };
    {
        // Entries built with ids 1 and 2 swapped, then the definition put back as it was.
        let conn = rusqlite::Connection::open(&fx.path).expect("open");
        let swapped = real.replace(
            "json_extract(body, '$.payload.correlation.jsonrpc_id'),",
            "3 - json_extract(body, '$.payload.correlation.jsonrpc_id'),",
        );
        assert_ne!(swapped, real);
        conn.execute_batch(&format!("DROP INDEX journal_request_lookup; {swapped};")).expect("swapped index");
        conn.execute_batch("PRAGMA writable_schema = ON;").expect("writable");
        conn.execute("UPDATE sqlite_schema SET sql = ?1 WHERE name = 'journal_request_lookup'", [&real])
            .expect("definition put back");
    }
    let store = fx.open();
    match store.view().execution_for_request("mcp-1", &json!(1)) {
        Err(postern_store::StoreError::Corrupt(why)) => assert!(why.contains("request index"), "{why}"),
        other => panic!("a swapped index entry was followed: {other:?}"),
    }
}

/// Streamable HTTP sessions are kept across a reopen (a restart) until their client ends them.
#[test]
fn mcp_sessions_are_remembered_until_forgotten() {
    let fx = Fixture::new();
    {
        let store = fx.open();
        store.remember_mcp_session("mcp-1", r#"{"initialize_params":{}}"#, at(0)).unwrap();
        store.remember_mcp_session("mcp-2", r#"{"initialize_params":{"x":1}}"#, at(1)).unwrap();
        store.forget_mcp_session("mcp-2").unwrap();
    }
    let store = fx.open();
    assert_eq!(store.view().mcp_session("mcp-1").unwrap().as_deref(), Some(r#"{"initialize_params":{}}"#));
    assert_eq!(store.view().mcp_session("mcp-2").unwrap(), None);
    // A week later, a new session prunes the old one.
    store.remember_mcp_session("mcp-3", "{}", at(postern_store::MCP_SESSION_LIFETIME_MS + 1)).unwrap();
    assert_eq!(store.view().mcp_session("mcp-1").unwrap(), None);
}
