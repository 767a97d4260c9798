//! The lifecycle of an execution (docs/src/design.md) as a state type that only allows legal transitions.
//!
//! ```text
//! accepted ──▶ authorized ──▶ dispatched ──▶ completed ──▶ result_delivered
//!    │             │              │              └──────▶ completed_result_not_delivered ──▶ result_delivered
//!    ▼             ▼              ▼
//!  denied   failed_before_    outcome_unknown ──(verify)──▶ completed | not_executed | needs_review
//!           dispatch              │  ▲                         needs_review ──▶ completed | not_executed
//!                                 └──┘ re-send with the same idempotency key      not_executed ──▶ dispatched
//! ```
//!
//! Two refinements of the design's diagram, both forced by how channels work:
//! * `dispatched → failed_before_dispatch`: `dispatched` is written *before* the first byte
//!   leaves, so a connect-refused or DNS failure is only learnt afterwards. The state means
//!   "provably nothing reached the target", which is what the name promises.
//! * `outcome_unknown → dispatched` and `not_executed → dispatched`: recovery by re-sending the
//!   *same* execution (same idempotency key), journaled as a dispatch like the first one.

use crate::ErrorCode;
use serde::{Deserialize, Serialize};
use std::{fmt, str::FromStr};

/// An execution's lifecycle state, as the journal and the IPC spell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "ts", derive(ts_rs::TS), ts(export_to = "../../ui/src/lib/bindings/"))]
pub enum ExecutionState {
    Accepted,
    Authorized,
    Denied,
    FailedBeforeDispatch,
    Dispatched,
    Completed,
    OutcomeUnknown,
    NotExecuted,
    NeedsReview,
    ResultDelivered,
    CompletedResultNotDelivered,
}

use ExecutionState::*;

impl ExecutionState {
    pub const ALL: [ExecutionState; 11] = [
        Accepted,
        Authorized,
        Denied,
        FailedBeforeDispatch,
        Dispatched,
        Completed,
        OutcomeUnknown,
        NotExecuted,
        NeedsReview,
        ResultDelivered,
        CompletedResultNotDelivered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Accepted => "accepted",
            Authorized => "authorized",
            Denied => "denied",
            FailedBeforeDispatch => "failed_before_dispatch",
            Dispatched => "dispatched",
            Completed => "completed",
            OutcomeUnknown => "outcome_unknown",
            NotExecuted => "not_executed",
            NeedsReview => "needs_review",
            ResultDelivered => "result_delivered",
            CompletedResultNotDelivered => "completed_result_not_delivered",
        }
    }

    /// The states reachable from `self` in one step.
    pub fn successors(self) -> &'static [ExecutionState] {
        match self {
            Accepted => &[Authorized, Denied],
            Authorized => &[Dispatched, FailedBeforeDispatch],
            Dispatched => &[Completed, OutcomeUnknown, FailedBeforeDispatch],
            Completed => &[ResultDelivered, CompletedResultNotDelivered],
            CompletedResultNotDelivered => &[ResultDelivered],
            OutcomeUnknown => &[Completed, NotExecuted, NeedsReview, Dispatched],
            NeedsReview => &[Completed, NotExecuted],
            NotExecuted => &[Dispatched],
            Denied | FailedBeforeDispatch | ResultDelivered => &[],
        }
    }

    /// The one legal way to change state: `Ok(next)` or an error naming both states.
    pub fn transition(self, next: ExecutionState) -> Result<ExecutionState, IllegalTransition> {
        if self.successors().contains(&next) { Ok(next) } else { Err(IllegalTransition { from: self, to: next }) }
    }

    /// Where `steps` lead from `self`, each one checked: the first step the state machine does
    /// not allow is the error. (A read-only call's folded journal row is walked this way when it
    /// is written, read and audited.)
    pub fn walk(self, steps: impl IntoIterator<Item = ExecutionState>) -> Result<ExecutionState, IllegalTransition> {
        steps.into_iter().try_fold(self, ExecutionState::transition)
    }

    /// No further transition is possible.
    pub fn is_terminal(self) -> bool {
        self.successors().is_empty()
    }
}

impl fmt::Display for ExecutionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown execution state {0:?}")]
pub struct UnknownState(pub String);

impl FromStr for ExecutionState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ExecutionState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.chars().take(40).collect()))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("illegal lifecycle transition from {from} to {to}")]
pub struct IllegalTransition {
    pub from: ExecutionState,
    pub to: ExecutionState,
}

impl ErrorCode for IllegalTransition {
    fn code(&self) -> &'static str {
        "illegal_transition"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn walk(path: &[ExecutionState]) -> Result<ExecutionState, IllegalTransition> {
        path[0].walk(path[1..].iter().copied())
    }

    #[test]
    fn every_legal_path_of_the_design_succeeds() {
        let paths: &[&[ExecutionState]] = &[
            &[Accepted, Authorized, Dispatched, Completed, ResultDelivered],
            &[Accepted, Authorized, Dispatched, Completed, CompletedResultNotDelivered],
            &[Accepted, Authorized, Dispatched, Completed, CompletedResultNotDelivered, ResultDelivered],
            &[Accepted, Denied],
            &[Accepted, Authorized, FailedBeforeDispatch],
            &[Accepted, Authorized, Dispatched, FailedBeforeDispatch],
            &[Accepted, Authorized, Dispatched, OutcomeUnknown, Completed, ResultDelivered],
            &[Accepted, Authorized, Dispatched, OutcomeUnknown, NotExecuted],
            &[Accepted, Authorized, Dispatched, OutcomeUnknown, NotExecuted, Dispatched, Completed],
            &[Accepted, Authorized, Dispatched, OutcomeUnknown, NeedsReview, Completed],
            &[Accepted, Authorized, Dispatched, OutcomeUnknown, NeedsReview, NotExecuted],
            &[Accepted, Authorized, Dispatched, OutcomeUnknown, Dispatched, Completed],
        ];
        for path in paths {
            assert_eq!(walk(path), Ok(*path.last().expect("non-empty")), "{path:?}");
        }
    }

    #[test]
    fn illegal_transitions_fail_naming_both_states() {
        let illegal = [
            (Accepted, Dispatched),
            (Accepted, Completed),
            (Accepted, OutcomeUnknown),
            (Authorized, Completed),
            (Authorized, Accepted),
            (Dispatched, ResultDelivered),
            (Dispatched, Denied),
            (Dispatched, NotExecuted),
            (Completed, Dispatched),
            (Completed, OutcomeUnknown),
            (Denied, Authorized),
            (Denied, Dispatched),
            (FailedBeforeDispatch, Dispatched),
            (ResultDelivered, CompletedResultNotDelivered),
            (ResultDelivered, Dispatched),
            (OutcomeUnknown, ResultDelivered),
            (NeedsReview, Dispatched),
            (NotExecuted, Completed),
            (CompletedResultNotDelivered, Completed),
        ];
        for (from, to) in illegal {
            let err = from.transition(to).unwrap_err();
            assert_eq!(err, IllegalTransition { from, to });
            let msg = err.to_string();
            assert!(msg.contains(from.as_str()) && msg.contains(to.as_str()), "{msg}");
            assert_eq!(err.code(), "illegal_transition");
        }
    }

    #[test]
    fn no_state_transitions_to_itself_or_back_to_accepted() {
        for s in ExecutionState::ALL {
            assert!(s.transition(s).is_err(), "{s} -> {s}");
            assert!(s.transition(Accepted).is_err());
        }
        assert_eq!(
            ExecutionState::ALL.iter().filter(|s| s.is_terminal()).count(),
            3,
            "denied, failed_before_dispatch, result_delivered"
        );
    }

    #[test]
    fn names_round_trip() {
        for s in ExecutionState::ALL {
            assert_eq!(s.as_str().parse::<ExecutionState>(), Ok(s));
            assert_eq!(serde_json::to_value(s).expect("ser"), serde_json::json!(s.as_str()));
        }
        assert!("running".parse::<ExecutionState>().is_err());
    }

    proptest! {
        /// Any sequence of attempted transitions leaves the state somewhere reachable, and every
        /// accepted step is in the successor table: the type cannot be driven around the table.
        #[test]
        fn random_walks_only_take_table_edges(steps in prop::collection::vec(0usize..11, 0..40)) {
            let mut state = Accepted;
            let mut dispatched_before_outcome = false;
            for i in steps {
                let next = ExecutionState::ALL[i];
                match state.transition(next) {
                    Ok(s) => {
                        prop_assert!(state.successors().contains(&s));
                        if s == Dispatched { dispatched_before_outcome = true; }
                        if matches!(s, Completed | OutcomeUnknown) { prop_assert!(dispatched_before_outcome); }
                        state = s;
                    }
                    Err(e) => prop_assert_eq!(e, IllegalTransition { from: state, to: next }),
                }
            }
        }
    }
}
