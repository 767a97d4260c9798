//! The model check: every interleaving within small bounds (CI), a larger bound on demand.

use postern_core::ReplayClass;
use postern_model::{Fault, Protocol};
use stateright::{Checker, Model};

fn check(class: ReplayClass, attempts: u8, crashes: u8) -> usize {
    let checker = Protocol { class, attempts, crashes, fault: None }.checker().spawn_bfs().join();
    checker.assert_properties();
    println!("{class:?}: {attempts} attempts, {crashes} crashes: {} states", checker.unique_state_count());
    checker.unique_state_count()
}

/// The bound CI checks: three attempts, two crashes, both contracts a retry must be safe under.
#[test]
fn at_most_one_effect_and_honest_answers_within_small_bounds() {
    for class in [ReplayClass::Irreversible, ReplayClass::IdempotencyKey] {
        assert!(check(class, 3, 2) > 1000, "the model explores something");
    }
}

/// The check has teeth: a gateway that breaks either rule is caught paying twice.
#[test]
fn a_gateway_that_breaks_a_rule_is_caught() {
    for fault in [Fault::BlindRetry, Fault::DeliveredOnWrite] {
        let model = Protocol { class: ReplayClass::Irreversible, attempts: 3, crashes: 1, fault: Some(fault) };
        let checker = model.checker().spawn_bfs().join();
        assert!(checker.discovery("at most one effect per intent").is_some(), "{fault:?} was not caught");
    }
}

/// The larger bound whose counts docs/src/testing.md gives (`cargo test -p postern-model --release --
/// --ignored --nocapture`).
#[test]
#[ignore = "the larger bound: seconds in a release build, long in a debug one; run by hand"]
fn within_the_larger_bound() {
    for class in [ReplayClass::Irreversible, ReplayClass::IdempotencyKey] {
        check(class, 5, 3);
    }
}
