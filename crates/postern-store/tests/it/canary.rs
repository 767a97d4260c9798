//! Secrets never reach the database: a canary argument marked secret is grepped for in every
//! file SQLite writes.

use crate::support::*;
use postern_core::ExecutionState;
use serde_json::json;

const CANARY: &str = "CANARY-7f3a9c1e-do-not-store";

#[test]
fn a_secret_argument_never_reaches_any_database_file() {
    let fx = Fixture::new();
    let store = fx.open();
    let id = exec_id(1);
    let new = payment_with(id, json!({"amount": 10, "approval_code": CANARY}), session(1), at(0));
    assert!(!format!("{new:?}").contains(CANARY), "the record handed to the store is already digested");
    store.admit(new).expect("admit");
    store.transition(id, ExecutionState::Authorized, json!({}), at(1)).expect("auth");
    store.transition(id, ExecutionState::Dispatched, json!({}), at(2)).expect("dispatch");
    // Check while the WAL is live, and again after it has been folded into the main file.
    let scan = |when: &str| {
        for entry in std::fs::read_dir(fx.path.parent().expect("dir")).expect("dir") {
            let path = entry.expect("entry").path();
            let bytes = std::fs::read(&path).expect("read");
            assert!(
                !bytes.windows(CANARY.len()).any(|w| w == CANARY.as_bytes()),
                "{when}: canary found in {}",
                path.display()
            );
        }
    };
    scan("live");
    let rows = store.view().timeline(id).expect("timeline");
    assert!(rows[0].row.detail["record"]["arguments"]["approval_code"]["secret_digest"].is_string());
    drop(store);
    scan("closed");
}
