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
