//! Retry matching and recovery decisions (docs/src/design.md): given what the journal says about a prior
//! execution with the same fingerprint, decide what an incoming call does — never by guessing.
//!
//! Compared with the design's pseudocode, three more prior states attach instead of starting a
//! new execution, because starting anew there could duplicate a side effect or hide a decision:
//! `completed` (the result exists but delivery is unconfirmed), `denied` (the same denial is
//! returned; an ambiguous retry never opens a fresh approval path), `needs_review` and
//! `not_executed`. Read-only tools never attach: they are retried freely.
//!
//! The attach window only ends matching where the agent's outcome is settled (a denial, see
//! [`window_can_expire`]): an unresolved prior never expires into a new dispatch.

use crate::{
    contract::{ReplayClass, ReplayContract, StatusQuery},
    fingerprint::Fingerprint,
    id::ExecutionId,
    lifecycle::ExecutionState,
    record::{Actor, IntentScope},
    time::Timestamp,
};
use serde::{Deserialize, Serialize};

/// What the journal knows about the most recent execution with the incoming fingerprint.
#[derive(Clone, Debug, PartialEq)]
pub struct PriorExecution {
    pub id: ExecutionId,
    pub fingerprint: Fingerprint,
    pub actor: Actor,
    pub intent_scope: IntentScope,
    pub state: ExecutionState,
    pub accepted_at: Timestamp,
    /// The contract the prior was accepted under (its window and recovery route are the ones
    /// promised when it was accepted, even if the manifest has changed since).
    pub contract: ReplayContract,
}

/// The incoming call, reduced to what matching needs.
#[derive(Clone, Copy, Debug)]
pub struct IncomingIntent<'a> {
    pub fingerprint: &'a Fingerprint,
    pub actor: &'a Actor,
    pub intent_scope: &'a IntentScope,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "via")]
pub enum Verification {
    /// Re-send the same request with the same idempotency key (the prior's execution ID).
    ResendWithSameKey { header: String, key: ExecutionId },
    /// Re-send the same request with the same key in the argument the upstream tool names.
    ResendWithSameArgument { argument: String, key: ExecutionId },
    /// Re-send the same request: the tool promises a repeat has no additional effect.
    Resend,
    /// Ask the target's status endpoint; never re-send blindly.
    QueryStatus { query: StatusQuery },
    /// Read the SSH marker record for the execution over a fresh connection.
    ReadSshMarker,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReviewReason {
    /// The outcome is unknown and the contract offers no way to verify it.
    OutcomeUnknownIrreversible,
    /// The prior is already waiting for a human to review it.
    AwaitingReview,
    /// The outcome is unknown and the target has forgotten the key by now (the contract's key
    /// retention has passed since the prior was accepted): a re-send it does not recognise would
    /// run again, and its status route cannot be trusted to remember either.
    KeyRetentionPassed { retention_ms: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "decision")]
pub enum RetryDecision {
    /// No related prior: accept a new execution.
    NewExecution,
    /// The prior was never sent (or verification proved it never ran): carry on with it.
    ContinuePrior { prior: ExecutionId },
    /// The prior is dispatched and running: wait for its outcome, never dispatch again.
    WaitForPrior { prior: ExecutionId },
    /// The prior's outcome is unknown: verify it through its contract.
    VerifyPrior { prior: ExecutionId, verification: Verification },
    /// The prior completed: return its stored result.
    ReturnStoredResult { prior: ExecutionId },
    /// The prior was denied: return the same denial.
    ReturnPriorDenial { prior: ExecutionId },
    /// Only a human can decide; show them the prior's record.
    NeedsReview { prior: ExecutionId, reason: ReviewReason },
}

impl RetryDecision {
    pub fn prior(&self) -> Option<ExecutionId> {
        match self {
            RetryDecision::NewExecution => None,
            RetryDecision::ContinuePrior { prior }
            | RetryDecision::WaitForPrior { prior }
            | RetryDecision::VerifyPrior { prior, .. }
            | RetryDecision::ReturnStoredResult { prior }
            | RetryDecision::ReturnPriorDenial { prior }
            | RetryDecision::NeedsReview { prior, .. } => Some(*prior),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            RetryDecision::NewExecution => "new_execution",
            RetryDecision::ContinuePrior { .. } => "continue_prior",
            RetryDecision::WaitForPrior { .. } => "wait_for_prior",
            RetryDecision::VerifyPrior { .. } => "verify_prior",
            RetryDecision::ReturnStoredResult { .. } => "return_stored_result",
            RetryDecision::ReturnPriorDenial { .. } => "return_prior_denial",
            RetryDecision::NeedsReview { .. } => "needs_review",
        }
    }
}

/// Does the prior execution describe the same intent (fingerprint, actor, intent scope)?
pub fn same_intent(prior: &PriorExecution, incoming: &IncomingIntent<'_>) -> bool {
    prior.fingerprint == *incoming.fingerprint
        && prior.actor == *incoming.actor
        && prior.intent_scope == *incoming.intent_scope
}

/// Can the attach window end matching for a prior in `state`? Only where the outcome is settled
/// for the agent: a denial. Every other matching state is unresolved for the agent — never sent
/// yet (`accepted`, `authorized`, `not_executed`: continuing it sends at most once), in flight or
/// uncertain (`dispatched`, `outcome_unknown`, `needs_review`), or a result the agent may not
/// have seen (`completed`, `completed_result_not_delivered`) — and expiring it into a new
/// execution could be a second side effect after a long review or a slow agent.
pub fn window_can_expire(state: ExecutionState) -> bool {
    state == ExecutionState::Denied
}

/// Does the prior execution describe the same intent, and does it still attach at `now`?
pub fn matches(prior: &PriorExecution, incoming: &IncomingIntent<'_>, now: Timestamp) -> bool {
    same_intent(prior, incoming)
        && (!window_can_expire(prior.state)
            || prior.contract.attach_window.contains(now.millis_since(prior.accepted_at)))
}

/// The retry decision (docs/src/design.md), extended as described in the module docs.
pub fn decide_retry(prior: Option<&PriorExecution>, incoming: &IncomingIntent<'_>, now: Timestamp) -> RetryDecision {
    use ExecutionState::*;
    let Some(prior) = prior else {
        return RetryDecision::NewExecution;
    };
    if prior.contract.class == ReplayClass::ReadOnly || !matches(prior, incoming, now) {
        return RetryDecision::NewExecution;
    }
    let id = prior.id;
    match prior.state {
        Accepted | Authorized | NotExecuted => RetryDecision::ContinuePrior { prior: id },
        Dispatched => RetryDecision::WaitForPrior { prior: id },
        // Counted from acceptance, which is no later than the key first reached the target.
        OutcomeUnknown
            if matches!(prior.contract.class, ReplayClass::IdempotencyKey | ReplayClass::StatusQuery)
                && key_forgotten(prior, now) =>
        {
            let retention_ms = prior.contract.key_retention();
            RetryDecision::NeedsReview { prior: id, reason: ReviewReason::KeyRetentionPassed { retention_ms } }
        }
        OutcomeUnknown => verify_through_contract(id, &prior.contract),
        Completed | CompletedResultNotDelivered => RetryDecision::ReturnStoredResult { prior: id },
        Denied => RetryDecision::ReturnPriorDenial { prior: id },
        NeedsReview => RetryDecision::NeedsReview { prior: id, reason: ReviewReason::AwaitingReview },
        // Delivered results and provable non-dispatches are done: a matching call is a new intent.
        ResultDelivered | FailedBeforeDispatch => RetryDecision::NewExecution,
    }
}

/// Whether the target may have forgotten the prior's key at `now`: its contract's key retention
/// has passed since acceptance, or the clock reads earlier than the acceptance (a clock set back
/// cannot prove the key is fresh).
pub fn key_forgotten(prior: &PriorExecution, now: Timestamp) -> bool {
    now.as_millis() < prior.accepted_at.as_millis()
        || now.millis_since(prior.accepted_at) >= prior.contract.key_retention()
}

fn verify_through_contract(id: ExecutionId, contract: &ReplayContract) -> RetryDecision {
    let irreversible = RetryDecision::NeedsReview { prior: id, reason: ReviewReason::OutcomeUnknownIrreversible };
    let c = contract;
    let verification = match (c.class, &c.idempotency_header, &c.idempotency_argument, &c.status_query) {
        (ReplayClass::IdempotencyKey, Some(header), _, _) => {
            Verification::ResendWithSameKey { header: header.clone(), key: id }
        }
        (ReplayClass::IdempotencyKey, None, Some(argument), _) => {
            Verification::ResendWithSameArgument { argument: argument.clone(), key: id }
        }
        (ReplayClass::Idempotent, ..) => Verification::Resend,
        (ReplayClass::StatusQuery, _, _, Some(query)) => Verification::QueryStatus { query: query.clone() },
        (ReplayClass::SshMarker, ..) => Verification::ReadSshMarker,
        // Irreversible, or a contract that lost the field it needs: only a human can decide.
        _ => return irreversible,
    };
    RetryDecision::VerifyPrior { prior: id, verification }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{contract::AttachWindow, fingerprint::FingerprintKey, id::SessionId};
    use ExecutionState::*;

    const WINDOW_MS: u64 = 60_000;

    fn contract(class: ReplayClass) -> ReplayContract {
        ReplayContract {
            class,
            idempotency_header: (class == ReplayClass::IdempotencyKey).then(|| "Idempotency-Key".to_string()),
            status_query: (class == ReplayClass::StatusQuery).then(|| StatusQuery {
                method: "GET".into(),
                url_template: "https://pay.example/v1/status/{execution_id}".into(),
                done: vec![crate::contract::StatusAnswer::Status(200)],
                in_flight: vec![],
                never_received: vec![],
            }),
            attach_window: AttachWindow::Millis(WINDOW_MS),
            ..ReplayContract::read_only()
        }
    }

    /// The specification table: what a matching retry inside the window does, per contract
    /// class and prior state. Every (class, state) pair is listed explicitly.
    fn expected(class: ReplayClass, state: ExecutionState, id: ExecutionId) -> RetryDecision {
        use RetryDecision as D;
        if class == ReplayClass::ReadOnly {
            return D::NewExecution;
        }
        match state {
            Accepted | Authorized | NotExecuted => D::ContinuePrior { prior: id },
            Dispatched => D::WaitForPrior { prior: id },
            Completed | CompletedResultNotDelivered => D::ReturnStoredResult { prior: id },
            Denied => D::ReturnPriorDenial { prior: id },
            NeedsReview => D::NeedsReview { prior: id, reason: ReviewReason::AwaitingReview },
            ResultDelivered | FailedBeforeDispatch => D::NewExecution,
            OutcomeUnknown => match class {
                ReplayClass::IdempotencyKey => D::VerifyPrior {
                    prior: id,
                    verification: Verification::ResendWithSameKey { header: "Idempotency-Key".into(), key: id },
                },
                ReplayClass::StatusQuery => D::VerifyPrior {
                    prior: id,
                    verification: Verification::QueryStatus {
                        query: contract(ReplayClass::StatusQuery).status_query.expect("set"),
                    },
                },
                ReplayClass::SshMarker => D::VerifyPrior { prior: id, verification: Verification::ReadSshMarker },
                ReplayClass::Idempotent => D::VerifyPrior { prior: id, verification: Verification::Resend },
                ReplayClass::Irreversible => {
                    D::NeedsReview { prior: id, reason: ReviewReason::OutcomeUnknownIrreversible }
                }
                ReplayClass::ReadOnly => D::NewExecution,
            },
        }
    }

    #[test]
    fn table_every_state_by_actor_scope_fingerprint_and_window() {
        let key = FingerprintKey::from_bytes([3; 32]);
        let fp = key.fingerprint(b"deploy catalog");
        let other_fp = key.fingerprint(b"deploy search");
        let actor = Actor::process("/usr/bin/claude", "aa");
        let other_actor = Actor::process("/usr/bin/cursor", "bb");
        let run = IntentScope::agent_run(SessionId::from_parts(Timestamp::from_millis(1), 1));
        let other_run = IntentScope::agent_run(SessionId::from_parts(Timestamp::from_millis(1), 2));
        let accepted_at = Timestamp::from_millis(1_000_000);
        let id = ExecutionId::from_parts(accepted_at, 77);
        let classes = [
            ReplayClass::ReadOnly,
            ReplayClass::IdempotencyKey,
            ReplayClass::StatusQuery,
            ReplayClass::SshMarker,
            ReplayClass::Idempotent,
            ReplayClass::Irreversible,
        ];
        let mut checked = 0;
        for class in classes {
            for state in ExecutionState::ALL {
                let prior = PriorExecution {
                    id,
                    fingerprint: fp,
                    actor: actor.clone(),
                    intent_scope: run.clone(),
                    state,
                    accepted_at,
                    contract: contract(class),
                };
                for same_actor in [true, false] {
                    for same_scope in [true, false] {
                        for same_fp in [true, false] {
                            // just inside, exactly at the edge (outside), and far outside
                            for (elapsed, inside) in
                                [(0, true), (WINDOW_MS - 1, true), (WINDOW_MS, false), (WINDOW_MS * 50, false)]
                            {
                                let incoming = IncomingIntent {
                                    fingerprint: if same_fp { &fp } else { &other_fp },
                                    actor: if same_actor { &actor } else { &other_actor },
                                    intent_scope: if same_scope { &run } else { &other_run },
                                };
                                let now = accepted_at.saturating_add_millis(elapsed);
                                let got = decide_retry(Some(&prior), &incoming, now);
                                let want = if same_actor && same_scope && same_fp && (inside || state != Denied) {
                                    expected(class, state, id)
                                } else {
                                    RetryDecision::NewExecution
                                };
                                assert_eq!(
                                    got, want,
                                    "class={class:?} state={state} actor={same_actor} scope={same_scope} fp={same_fp} elapsed={elapsed}"
                                );
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 6 * 11 * 2 * 2 * 2 * 4);
    }

    #[test]
    fn no_prior_means_new_execution_and_windows_are_per_contract() {
        let key = FingerprintKey::from_bytes([3; 32]);
        let fp = key.fingerprint(b"x");
        let actor = Actor::token_agent("ci");
        let scope = IntentScope::durable();
        let incoming = IncomingIntent { fingerprint: &fp, actor: &actor, intent_scope: &scope };
        assert_eq!(decide_retry(None, &incoming, Timestamp::from_millis(0)), RetryDecision::NewExecution);

        let accepted_at = Timestamp::from_millis(0);
        let id = ExecutionId::from_parts(accepted_at, 1);
        let mut prior = PriorExecution {
            id,
            fingerprint: fp,
            actor: actor.clone(),
            intent_scope: scope.clone(),
            state: OutcomeUnknown,
            accepted_at,
            contract: ReplayContract {
                attach_window: AttachWindow::UntilResolved,
                ..contract(ReplayClass::Irreversible)
            },
        };
        let a_year = Timestamp::from_millis(365 * 24 * 3_600_000);
        assert_eq!(
            decide_retry(Some(&prior), &incoming, a_year),
            RetryDecision::NeedsReview { prior: id, reason: ReviewReason::OutcomeUnknownIrreversible }
        );
        prior.contract.attach_window = AttachWindow::Millis(5);
        // Past its window an unresolved prior still attaches (never a second dispatch) …
        assert_eq!(
            decide_retry(Some(&prior), &incoming, Timestamp::from_millis(5)),
            RetryDecision::NeedsReview { prior: id, reason: ReviewReason::OutcomeUnknownIrreversible }
        );
        // … and only a settled one (a denial) stops matching.
        prior.state = Denied;
        assert_eq!(decide_retry(Some(&prior), &incoming, Timestamp::from_millis(5)), RetryDecision::NewExecution);
        // A clock that went backwards still attaches (elapsed clamps to zero).
        assert!(decide_retry(Some(&prior), &incoming, Timestamp::from_millis(-10_000)).prior().is_some());
    }

    /// A key outlives the target's memory (#27 finding 4): past the contract's key retention an
    /// uncertain outcome is never re-sent with the key, nor verified by it; each contract keeps
    /// its own retention.
    #[test]
    fn past_the_key_retention_an_unknown_outcome_goes_to_review() {
        let key = FingerprintKey::from_bytes([3; 32]);
        let fp = key.fingerprint(b"x");
        let actor = Actor::token_agent("ci");
        let scope = IntentScope::durable();
        let incoming = IncomingIntent { fingerprint: &fp, actor: &actor, intent_scope: &scope };
        let accepted_at = Timestamp::from_millis(1_000);
        let id = ExecutionId::from_parts(accepted_at, 1);
        let prior = |class, retention| PriorExecution {
            id,
            fingerprint: fp,
            actor: actor.clone(),
            intent_scope: scope.clone(),
            state: OutcomeUnknown,
            accepted_at,
            contract: ReplayContract { key_retention_ms: retention, ..contract(class) },
        };
        let at = |ms: i64| Timestamp::from_millis(1_000 + ms);
        let day = crate::contract::DEFAULT_KEY_RETENTION_MS as i64;
        let forgotten = |retention_ms: u64| RetryDecision::NeedsReview {
            prior: id,
            reason: ReviewReason::KeyRetentionPassed { retention_ms },
        };
        for class in [ReplayClass::IdempotencyKey, ReplayClass::StatusQuery] {
            assert!(matches!(
                decide_retry(Some(&prior(class, None)), &incoming, at(day - 1)),
                RetryDecision::VerifyPrior { .. }
            ));
            assert_eq!(decide_retry(Some(&prior(class, None)), &incoming, at(day)), forgotten(day as u64));
            // Per action: a target that keeps keys for an hour.
            let hour = Some(3_600_000);
            assert!(matches!(
                decide_retry(Some(&prior(class, hour)), &incoming, at(3_599_999)),
                RetryDecision::VerifyPrior { .. }
            ));
            assert_eq!(decide_retry(Some(&prior(class, hour)), &incoming, at(3_600_000)), forgotten(3_600_000));
        }
        // Classes whose recovery does not rest on the target's memory of a key are unchanged.
        let idempotent = decide_retry(Some(&prior(ReplayClass::Idempotent, Some(1))), &incoming, at(day * 30));
        assert_eq!(idempotent, RetryDecision::VerifyPrior { prior: id, verification: Verification::Resend });
        let marker = decide_retry(Some(&prior(ReplayClass::SshMarker, Some(1))), &incoming, at(day * 30));
        assert_eq!(marker, RetryDecision::VerifyPrior { prior: id, verification: Verification::ReadSshMarker });
    }

    #[test]
    fn a_contract_missing_its_recovery_field_falls_back_to_review_not_resend() {
        let key = FingerprintKey::from_bytes([3; 32]);
        let fp = key.fingerprint(b"x");
        let actor = Actor::token_agent("ci");
        let scope = IntentScope::durable();
        let id = ExecutionId::from_parts(Timestamp::from_millis(0), 1);
        let prior = PriorExecution {
            id,
            fingerprint: fp,
            actor: actor.clone(),
            intent_scope: scope.clone(),
            state: OutcomeUnknown,
            accepted_at: Timestamp::from_millis(0),
            contract: ReplayContract { idempotency_header: None, ..contract(ReplayClass::IdempotencyKey) },
        };
        let incoming = IncomingIntent { fingerprint: &fp, actor: &actor, intent_scope: &scope };
        assert_eq!(
            decide_retry(Some(&prior), &incoming, Timestamp::from_millis(1)),
            RetryDecision::NeedsReview { prior: id, reason: ReviewReason::OutcomeUnknownIrreversible }
        );
    }

    #[test]
    fn an_upstream_tool_keyed_by_argument_is_re_sent_with_the_same_key_in_that_argument() {
        let id = ExecutionId::from_parts(Timestamp::from_millis(5), 5);
        let keyed = ReplayContract {
            class: ReplayClass::IdempotencyKey,
            idempotency_argument: Some("idempotencyKey".into()),
            ..ReplayContract::read_only()
        };
        assert_eq!(
            verify_through_contract(id, &keyed),
            RetryDecision::VerifyPrior {
                prior: id,
                verification: Verification::ResendWithSameArgument { argument: "idempotencyKey".into(), key: id },
            }
        );
        // A keyed contract that lost its key is for a person, never a blind re-send.
        let lost = ReplayContract { idempotency_argument: None, ..keyed };
        assert!(matches!(verify_through_contract(id, &lost), RetryDecision::NeedsReview { .. }));
    }

    proptest::proptest! {
        /// Whatever the time and the window, a same-intent retry of a side-effecting prior starts a
        /// new execution only when the agent's outcome is settled: delivered, provably never sent,
        /// or a denial past its window. An unresolved prior never expires into a second dispatch.
        #[test]
        fn an_unresolved_prior_never_becomes_a_new_execution(
            state in proptest::sample::select(ExecutionState::ALL.to_vec()),
            class in proptest::sample::select(vec![
                ReplayClass::IdempotencyKey, ReplayClass::StatusQuery, ReplayClass::SshMarker,
                ReplayClass::Idempotent, ReplayClass::Irreversible,
            ]),
            window in proptest::option::of(0u64..10_000_000),
            elapsed in -1_000_000i64..1_000_000_000_000,
        ) {
            let key = FingerprintKey::from_bytes([9; 32]);
            let fp = key.fingerprint(b"pay 42");
            let actor = Actor::process("/usr/bin/agent", "cc");
            let scope = IntentScope::agent_run(SessionId::from_parts(Timestamp::from_millis(1), 3));
            let accepted_at = Timestamp::from_millis(1_000_000_000);
            let id = ExecutionId::from_parts(accepted_at, 5);
            let prior = PriorExecution {
                id, fingerprint: fp, actor: actor.clone(), intent_scope: scope.clone(), state, accepted_at,
                contract: ReplayContract {
                    attach_window: window.map_or(AttachWindow::UntilResolved, AttachWindow::Millis),
                    ..contract(class)
                },
            };
            let incoming = IncomingIntent { fingerprint: &fp, actor: &actor, intent_scope: &scope };
            let now = Timestamp::from_millis(accepted_at.as_millis().saturating_add(elapsed));
            let decision = decide_retry(Some(&prior), &incoming, now);
            if decision == RetryDecision::NewExecution {
                proptest::prop_assert!(matches!(state, ResultDelivered | FailedBeforeDispatch | Denied), "{state}");
            } else {
                proptest::prop_assert_eq!(decision.prior(), Some(id));
            }
        }
    }
}
