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
