//! What a call is and what becomes of it: the engine's vocabulary towards the transports (a
//! `Call` in; a `CallOutcome` with its `Decision`, or an `EngineError` with a machine-readable
//! code, out).

use super::{ChannelAnswer, Settled, StepDetail};
use crate::{catalog::manifest::ArgumentError, channel::http, channel::http::HttpResult};
use postern_core::{Actor, ErrorCode, ExecutionId, ExecutionState, IntentScope, RecordError, RetryDecision, SessionId};
use postern_store::StoreError;
use postern_vault::VaultError;
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;

/// How the engine decided a call: a fresh execution, one of the retry decisions (every retry is
/// decided from the record), or what a reviewer or the record settled for it. Journaled and
/// shown in its snake_case spelling; an unknown spelling is an error, never a default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    NewExecution,
    ContinuePrior,
    WaitForPrior,
    VerifyPrior,
    ReturnStoredResult,
    ReturnPriorDenial,
    NeedsReview,
    /// A reviewer refused a retry, or the recovery it needed was refused.
    RetryDenied,
    /// A reviewer had a retry sent anew, as a new execution.
    DispatchedAnew,
    /// A reviewer had the recorded result (or state) returned for a retry.
    ReturnRecordedResult,
    /// A reviewer had the target's status endpoint asked about a retry's prior.
    CheckStatus,
}

impl Decision {
    const ALL: [Decision; 11] = [
        Decision::NewExecution,
        Decision::ContinuePrior,
        Decision::WaitForPrior,
        Decision::VerifyPrior,
        Decision::ReturnStoredResult,
        Decision::ReturnPriorDenial,
        Decision::NeedsReview,
        Decision::RetryDenied,
        Decision::DispatchedAnew,
        Decision::ReturnRecordedResult,
        Decision::CheckStatus,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Decision::NewExecution => "new_execution",
            Decision::ContinuePrior => "continue_prior",
            Decision::WaitForPrior => "wait_for_prior",
            Decision::VerifyPrior => "verify_prior",
            Decision::ReturnStoredResult => "return_stored_result",
            Decision::ReturnPriorDenial => "return_prior_denial",
            Decision::NeedsReview => "needs_review",
            Decision::RetryDenied => "retry_denied",
            Decision::DispatchedAnew => "dispatched_anew",
            Decision::ReturnRecordedResult => "return_recorded_result",
            Decision::CheckStatus => "check_status",
        }
    }
}

impl From<&RetryDecision> for Decision {
    fn from(d: &RetryDecision) -> Decision {
        match d {
            RetryDecision::NewExecution => Decision::NewExecution,
            RetryDecision::ContinuePrior { .. } => Decision::ContinuePrior,
            RetryDecision::WaitForPrior { .. } => Decision::WaitForPrior,
            RetryDecision::VerifyPrior { .. } => Decision::VerifyPrior,
            RetryDecision::ReturnStoredResult { .. } => Decision::ReturnStoredResult,
            RetryDecision::ReturnPriorDenial { .. } => Decision::ReturnPriorDenial,
            RetryDecision::NeedsReview { .. } => Decision::NeedsReview,
        }
    }
}

impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A decision spelling Postern does not know (a journal written by a newer version, or edited).
#[derive(Debug, thiserror::Error)]
#[error("unknown decision {0:?}")]
pub struct UnknownDecision(pub String);

impl std::str::FromStr for Decision {
    type Err = UnknownDecision;
    fn from_str(s: &str) -> Result<Decision, UnknownDecision> {
        Decision::ALL.into_iter().find(|d| d.as_str() == s).ok_or_else(|| UnknownDecision(s.to_owned()))
    }
}

/// One tool call as the gateway hands it to the engine.
#[derive(Debug, Clone)]
pub struct Call {
    pub tool: String,
    pub arguments: Value,
    pub actor: Actor,
    pub intent_scope: IntentScope,
    pub session: Option<SessionId>,
    /// Protocol correlation (JSON-RPC id, MCP session): evidence only.
    pub correlation: Value,
    /// Raised by the client's `notifications/cancelled`.
    pub cancel: CancelSignal,
    /// Told which execution the call is bound to, once that is on record.
    pub bound: Bound,
    /// The upstream tool the door looked up for `tool`, carried so the call runs the tool the
    /// agent was told exists (`None`: the engine looks the name up itself). One lookup per call:
    /// two could disagree while a server's tools change.
    pub resolved: Option<crate::channel::upstream::UpstreamTool>,
    /// Released when the transport must open the call's answer now (see [`Opening`]).
    pub opening: Opening,
}

/// Which execution will answer a call, told as soon as that is certain and on record: a new
/// execution once its `accepted` row is durable (an MCP task handle names it, so for a task the
/// admission is fsynced), or the earlier execution a retry continues, waits for or verifies.
/// Never told where the answer could still come from another execution (a retry put to a
/// reviewer, who may dispatch it anew; a call joined to another's) or where there is nothing to
/// follow (a read-only call, a stored result): those are answered when they are done.
#[derive(Debug, Clone)]
pub struct Bound {
    tx: Arc<tokio::sync::watch::Sender<Option<ExecutionId>>>,
    /// Someone outside will hear of the binding before anything is dispatched.
    durable: bool,
}

impl Default for Bound {
    fn default() -> Self {
        Bound { tx: Arc::new(tokio::sync::watch::Sender::new(None)), durable: false }
    }
}

impl Bound {
    /// A binding an MCP task handle is made from: the admission is on disk before it is told.
    pub fn for_task() -> Self {
        Bound { durable: true, ..Bound::default() }
    }

    pub(super) fn durable(&self) -> bool {
        self.durable
    }

    pub(super) fn bind(&self, id: ExecutionId) {
        self.tx.send_replace(Some(id));
    }

    /// Waits until the call is bound; `None` if the call ended without being bound.
    pub fn watch(&self) -> tokio::sync::watch::Receiver<Option<ExecutionId>> {
        self.tx.subscribe()
    }
}

/// Whether the transport may still hold back what opens a call's answer (the priming event of a
/// Streamable HTTP stream, which names the request for resumption, and the response's head with
/// it) to send it with the answer in one write. Only a read-only call that waits for nobody may
/// be held: the engine releases every other call right after it is prepared, before anything of
/// it is made durable or sent (as early as the transport would have sent it unheld), and a read
/// before it waits for a reviewer or another call's question. A call whose transport holds
/// nothing ignores it.
#[derive(Debug, Clone, Default)]
pub struct Opening(tokio_util::sync::CancellationToken);

impl Opening {
    /// The transport must open the answer now.
    pub fn release(&self) {
        self.0.cancel();
    }

    pub fn is_released(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Resolves once [`Opening::release`] was called.
    pub async fn released(&self) {
        self.0.cancelled().await;
    }
}

/// A client's request to cancel a call. Honoured until the `dispatched` row is written; after
/// that the side effect may be under way, so the engine journals the request and carries on
/// (cancelling never pretends to undo).
///
/// A call that leads an execution (others joined it while it waited for a reviewer) carries
/// the joiners' signals too: the execution is withdrawn only once every call following it is
/// ([`CancelSignal::withdrawn`]). At 2026-07-28 a client whose stream broke re-issues its
/// request; the re-issue joins the open question and must not be told "cancelled".
#[derive(Debug, Clone, Default)]
pub struct CancelSignal(Arc<Followed>);

#[derive(Debug, Default)]
struct Followed {
    cancelled: std::sync::atomic::AtomicBool,
    /// The signals of calls that joined this one's execution and wait for its outcome.
    joined: std::sync::Mutex<Vec<CancelSignal>>,
}

impl CancelSignal {
    pub fn cancel(&self) {
        self.0.cancelled.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether this call itself was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether nobody wants this call's execution any more: this call was cancelled, and so
    /// was every call that joined it.
    pub fn withdrawn(&self) -> bool {
        self.is_cancelled()
            && self.0.joined.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().all(Self::is_cancelled)
    }

    /// Cancels this call and every call that joined it (`tasks/cancel`: the task is the
    /// execution, not one of the calls following it).
    pub fn withdraw_all(&self) {
        self.cancel();
        for joiner in self.0.joined.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter() {
            joiner.cancel();
        }
    }

    /// `joiner` waits for this call's execution now.
    pub(super) fn joined_by(&self, joiner: &CancelSignal) {
        if !self.is(joiner) {
            let mut joined = self.0.joined.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // Cancellation is one-way: a joiner already withdrawn never counts again.
            joined.retain(|j| !j.is_cancelled());
            joined.push(joiner.clone());
        }
    }

    /// Whether `other` is this very signal (not just in the same state).
    pub fn is(&self, other: &CancelSignal) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

pub(super) fn cancelled_detail() -> StepDetail {
    StepDetail::because(super::CANCELLED).message("the client cancelled the call before it was sent")
}

/// Where a call ended up.
#[derive(Debug, Clone, Serialize)]
pub struct CallOutcome {
    pub execution_id: ExecutionId,
    pub state: ExecutionState,
    /// The call was recognised as a retry of an earlier execution.
    pub attached: bool,
    /// A read-only execution: journaled without waiting for the disk, never attached to, so its
    /// delivery is not tracked (a retry sends it again anyway).
    #[serde(skip)]
    pub read_only: bool,
    /// How the call was decided (`new_execution` for a fresh call).
    pub decision: Decision,
    /// What the channel sent back, if anything. Every answer here went through the outcome
    /// stage (a [`Settled`] is made nowhere else): secrets masked, size within the limit.
    #[serde(rename = "result")]
    pub answer: Option<Settled<ChannelAnswer>>,
    /// Why, for states without a result (denied, failed_before_dispatch, outcome_unknown, …);
    /// `null` in the result when nothing says why.
    pub detail: Option<StepDetail>,
}

impl CallOutcome {
    /// The call matched an execution already on record.
    pub(super) fn attached(self) -> Self {
        CallOutcome { attached: true, ..self }
    }

    /// The call matched an execution on record when `matched` is true.
    pub(super) fn attached_if(self, matched: bool) -> Self {
        CallOutcome { attached: matched, ..self }
    }

    /// What the channel sent back (through the outcome stage), if anything.
    pub(super) fn answered(self, answer: Option<Settled<ChannelAnswer>>) -> Self {
        CallOutcome { answer, ..self }
    }

    /// Why it ended so (the detail an agent and the journal read).
    pub(super) fn because(self, detail: StepDetail) -> Self {
        CallOutcome { detail: Some(detail), ..self }
    }

    /// Why it ended so, as recorded (empty when nothing says why).
    pub fn why(&self) -> std::borrow::Cow<'_, StepDetail> {
        self.detail.as_ref().map_or_else(Default::default, std::borrow::Cow::Borrowed)
    }

    /// An HTTP execution's result.
    pub fn http(&self) -> Option<&HttpResult> {
        match self.answer.as_deref() {
            Some(ChannelAnswer::Http(r)) => Some(r),
            _ => None,
        }
    }

    /// An SSH execution's result (exit status, output).
    pub fn ssh(&self) -> Option<&crate::channel::ssh::SshResult> {
        match self.answer.as_deref() {
            Some(ChannelAnswer::Ssh(r)) => Some(r),
            _ => None,
        }
    }

    /// An upstream MCP server's answer.
    pub fn upstream(&self) -> Option<&crate::channel::upstream::UpstreamResult> {
        match self.answer.as_deref() {
            Some(ChannelAnswer::Upstream(r)) => Some(r),
            _ => None,
        }
    }

    /// The result limit, when the answer was larger (and not kept).
    pub fn result_too_large(&self) -> Option<u64> {
        match self.answer.as_deref()? {
            ChannelAnswer::Http(r) => r.result_too_large,
            ChannelAnswer::Ssh(r) => r.result_too_large,
            ChannelAnswer::Upstream(r) => r.result_too_large,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("unknown tool {0:?}")]
    UnknownTool(String),
    #[error(transparent)]
    Arguments(#[from] ArgumentError),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("credential {credential:?} may not be sent to {url} (see its --host bindings)")]
    CredentialNotBound { credential: String, url: String },
    #[error(transparent)]
    UnsafeTarget(#[from] http::UnsafeTarget),
    #[error(transparent)]
    Vault(#[from] VaultError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "Postern did not contact SSH host {host:?} (its key is not pinned yet, and pinning means logging in): {reason}; \
         nothing was sent. {}",
        match *reason {
            "vault_locked" => "Unlock the vault in the approver first.",
            "approve_every_use_needs_a_pinned_key" => "A host that needs approval for every use must have its key pinned \
                 before any call: add it again with `postern vault add-ssh --host-key-policy strict --host-key …`.",
            _ => "This agent run may not act any more.",
        }
    )]
    FirstContactRefused { host: String, reason: &'static str },
    #[error(transparent)]
    Ssh(#[from] crate::channel::ssh::SshError),
    #[error("the engine's worker failed: {0}")]
    Internal(String),
    /// A step row on record whose detail is not a step's (a journal edited by hand).
    #[error("{0}; run `postern audit verify`")]
    UnreadableDetail(#[from] super::UnreadableDetail),
    #[error("the request this call joined failed: {message}")]
    Joined { code: &'static str, message: String },
    /// The request was sent and answered, but the journal cannot record that yet.
    #[error(
        "execution {id} WAS SENT, but its outcome cannot be journaled yet: {source} Do not repeat \
         the call: Postern records the outcome as soon as the disk accepts writes; then execution_status \
         with execution_id {id} (or a repeat of this call, which is matched to it) returns the result"
    )]
    OutcomeNotJournaled { id: ExecutionId, source: StoreError },
    /// The agent (or all agents) already has as many calls under way as it may.
    #[error(
        "{limit} calls are already under way (this agent's, or all agents' together), waiting for a target, a person \
         or a join; this call was not run and nothing was journaled for it. If it repeats an earlier call, that call \
         may still be under way: repeat it unchanged once some have finished (a changed repeat is a new action)"
    )]
    TooManyInFlight { limit: usize },
    /// A tool read-only by its verb uses a credential whose reads have effects.
    #[error("{0} (its credential says reads through it have effects; add a contract in the tool manifest)")]
    Contract(#[from] postern_core::ContractError),
}

impl ErrorCode for EngineError {
    fn code(&self) -> &'static str {
        match self {
            EngineError::UnknownTool(_) => "unknown_tool",
            EngineError::Arguments(e) => e.code(),
            EngineError::Record(e) => e.code(),
            EngineError::CredentialNotBound { .. } => "credential_not_bound",
            EngineError::UnsafeTarget(_) => "unsafe_target",
            EngineError::Vault(e) => e.code(),
            EngineError::Store(e) => e.code(),
            EngineError::FirstContactRefused { .. } => "first_contact_refused",
            EngineError::Ssh(e) => e.code(),
            EngineError::Internal(_) => "internal_error",
            EngineError::UnreadableDetail(_) => "journal_unreadable",
            EngineError::Joined { code, .. } => code,
            EngineError::Contract(e) => e.code(),
            EngineError::OutcomeNotJournaled { .. } => "outcome_not_journaled",
            EngineError::TooManyInFlight { .. } => "too_many_calls_in_flight",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_decision_reads_back_and_matches_the_core_names() {
        for d in Decision::ALL {
            assert_eq!(d.as_str().parse::<Decision>().unwrap(), d);
            assert_eq!(serde_json::to_value(d).unwrap(), serde_json::json!(d.as_str()));
        }
        let prior = ExecutionId::from_parts(postern_core::Timestamp::from_millis(1), 1);
        for retry in [
            RetryDecision::NewExecution,
            RetryDecision::ContinuePrior { prior },
            RetryDecision::WaitForPrior { prior },
            RetryDecision::ReturnStoredResult { prior },
            RetryDecision::ReturnPriorDenial { prior },
        ] {
            assert_eq!(Decision::from(&retry).as_str(), retry.name());
        }
        assert!("retry".parse::<Decision>().is_err(), "an unknown spelling is an error");
    }

    #[test]
    fn an_execution_is_withdrawn_only_when_every_call_following_it_is() {
        let (lead, joiner) = (CancelSignal::default(), CancelSignal::default());
        lead.joined_by(&joiner);
        lead.joined_by(&lead);
        lead.cancel();
        assert!(lead.is_cancelled() && !lead.withdrawn(), "the joiner still waits for it");
        joiner.cancel();
        assert!(lead.withdrawn());
        let (task, joiner) = (CancelSignal::default(), CancelSignal::default());
        task.joined_by(&joiner);
        task.withdraw_all();
        assert!(joiner.is_cancelled() && task.withdrawn(), "cancelling a task withdraws its joiners too");
        let alone = CancelSignal::default();
        assert!(!alone.withdrawn());
        alone.cancel();
        assert!(alone.withdrawn());
    }
}
