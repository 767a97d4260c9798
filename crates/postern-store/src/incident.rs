//! The incident record: everything an investigator needs about one execution in one place,
//! built from the journal and its projections (read-only), for `execution_status`,
//! `postern execution show` and the app.

use crate::{
    StoreError,
    event::{ActivityNote, Event},
    view::{ExecutionSummary, JournalView, StoredResult},
};
use postern_core::{ExecutionId, ExecutionState};
use rusqlite::params;
use serde::Serialize;
use serde_json::Value;

/// One execution as an incident responder reads it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Incident {
    pub execution_id: String,
    pub state: ExecutionState,
    pub tool: String,
    pub channel: String,
    pub actor: String,
    pub intent_scope: String,
    /// The agent run that made the execution (`ses_…`).
    pub session_id: Option<String>,
    pub fingerprint: String,
    /// What the action was aimed at: `{method, url}` for HTTP, the host and command for SSH.
    pub target: Value,
    pub replay_contract: Value,
    /// The key sent with every attempt (the execution ID) when the contract is `idempotency_key`.
    pub idempotency_key: Option<IdempotencyKey>,
    pub times: Times,
    /// What the target answered: the latest outcome journaled (`http_status`, `exit_status`,
    /// `verified_by`, …) or the reason the outcome is unknown.
    pub target_outcome: Option<Value>,
    /// Where the result is kept: its SHA-256, size and the journal row that recorded it.
    pub result_ref: Option<ResultRef>,
    /// Every call that reached this execution: the first, then each retry matched to it, with the
    /// agent run, MCP session and JSON-RPC id it came with and what was decided.
    pub calls: Vec<CallRecord>,
    /// Other executions of the same intent by the same actor (another agent run, a dispatch anew).
    pub related: Vec<Related>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IdempotencyKey {
    pub header: String,
    pub value: String,
}

/// Milliseconds since the Unix epoch; `None` where the execution never got there.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Times {
    pub accepted_at: i64,
    pub authorized_at: Option<i64>,
    pub first_dispatched_at: Option<i64>,
    /// When the outcome was settled (completed, not executed, denied, failed before dispatch).
    pub completed_at: Option<i64>,
    pub result_delivered_at: Option<i64>,
    pub updated_at: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResultRef {
    pub sha256: String,
    pub bytes: usize,
    pub journal_seq: i64,
    pub recorded_at: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CallRecord {
    pub seq: u64,
    pub at: i64,
    /// `accepted` for the call that created the execution, `retry_received` for each retry.
    pub event: String,
    /// How the retry was decided (`replay_stored_result`, `verify_prior`, …); `None` for the first.
    pub decision: Option<Value>,
    pub transport: Option<Value>,
    pub agent_session: Option<Value>,
    pub mcp_session_id: Option<Value>,
    pub jsonrpc_id: Option<Value>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Related {
    pub execution_id: String,
    pub state: ExecutionState,
    pub intent_scope: String,
    pub accepted_at: i64,
}

/// How many related executions an incident lists (newest first).
const RELATED_LIMIT: i64 = 20;

impl JournalView {
    /// The incident record of execution `id`, or `None` if there is no such execution.
    pub fn incident(&self, id: ExecutionId) -> Result<Option<Incident>, StoreError> {
        let Some(summary) = self.execution(id)? else { return Ok(None) };
        let timeline = self.timeline(id)?;
        let result = self.result(id)?;
        let effect = timeline
            .iter()
            .find(|e| e.row.event == Event::Step(ExecutionState::Accepted))
            .and_then(|e| e.row.detail.get("effect_fingerprint"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let mut related = self.related(&summary)?;
        if let Some(effect) = effect {
            // The same effect in other runs (a restarted agent's repeat), newest first with the rest.
            for r in self.same_effect(&effect, &summary)? {
                if !related.iter().any(|known| known.execution_id == r.execution_id) {
                    related.push(r);
                }
            }
            related.sort_by(|a, b| b.accepted_at.cmp(&a.accepted_at).then_with(|| b.execution_id.cmp(&a.execution_id)));
            related.truncate(RELATED_LIMIT as usize);
        }
        Ok(Some(assemble(summary, &timeline, result, related)))
    }

    /// Executions of the same effect by the same actor (any run), from their `accepted` rows.
    fn same_effect(&self, effect: &str, summary: &ExecutionSummary) -> Result<Vec<Related>, StoreError> {
        self.related_by(
            "SELECT j.execution_id, e.state, e.intent_scope, e.accepted_at FROM journal j
             JOIN executions e ON e.id = j.execution_id
             WHERE j.effect_fingerprint = ?1 AND j.event = 'accepted'
               AND json_extract(j.body, '$.payload.actor') = ?2 AND j.execution_id <> ?3
             ORDER BY j.seq DESC LIMIT ?4",
            effect,
            summary,
        )
    }

    /// Executions of the same intent (fingerprint) by the same actor.
    fn related(&self, summary: &ExecutionSummary) -> Result<Vec<Related>, StoreError> {
        self.related_by(
            "SELECT id, state, intent_scope, accepted_at FROM executions
             WHERE fingerprint = ?1 AND actor = ?2 AND id <> ?3
             ORDER BY accepted_at DESC, id DESC LIMIT ?4",
            &summary.fingerprint,
            summary,
        )
    }

    /// The rows `sql` selects (id, state, scope, accepted) for `key`, `summary`'s actor, other
    /// than `summary` itself, at most [`RELATED_LIMIT`].
    fn related_by(&self, sql: &str, key: &str, summary: &ExecutionSummary) -> Result<Vec<Related>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(sql)?;
            let rows = stmt.query_map(params![key, summary.actor, summary.id, RELATED_LIMIT], |r| {
                Ok(Related {
                    execution_id: r.get(0)?,
                    state: crate::view::state_at(r, 1)?,
                    intent_scope: r.get(2)?,
                    accepted_at: r.get(3)?,
                })
            })?;
            rows.collect::<Result<_, _>>().map_err(StoreError::from)
        })
    }
}

/// Settled outcomes: the state an execution reaches once its outcome is known (`needs_review`
/// is not one: a person has yet to decide, so it must not read as a settlement time).
const SETTLING: [ExecutionState; 4] = [
    ExecutionState::Completed,
    ExecutionState::NotExecuted,
    ExecutionState::Denied,
    ExecutionState::FailedBeforeDispatch,
];

fn assemble(
    summary: ExecutionSummary,
    timeline: &[crate::journal::JournalEntry],
    result: Option<StoredResult>,
    related: Vec<Related>,
) -> Incident {
    let first_at = |state: ExecutionState| {
        timeline.iter().find(|e| e.row.event == Event::Step(state)).map(|e| e.row.at.as_millis())
    };
    let completed_at = timeline
        .iter()
        .find(|e| e.row.event.step().is_some_and(|s| SETTLING.contains(&s)))
        .map(|e| e.row.at.as_millis());
    let target_outcome = timeline
        .iter()
        .rev()
        .find(|e| {
            use ExecutionState::*;
            matches!(e.row.event.step(), Some(Completed | OutcomeUnknown | NotExecuted | NeedsReview))
        })
        .map(|e| e.row.detail.get("outcome").cloned().unwrap_or_else(|| e.row.detail.clone()));
    let calls = timeline
        .iter()
        .filter(|e| {
            matches!(e.row.event, Event::Step(ExecutionState::Accepted) | Event::Note(ActivityNote::RetryReceived))
        })
        .map(|e| {
            let correlation = &e.row.detail["correlation"];
            let field = |k: &str| correlation.get(k).cloned();
            CallRecord {
                seq: e.row.seq,
                at: e.row.at.as_millis(),
                event: e.row.event.as_str().to_owned(),
                decision: e.row.detail.get("decision").cloned(),
                transport: field("transport"),
                // Rows written before the agent run was part of the correlation: the row's own.
                agent_session: field("agent_session").or_else(|| {
                    (e.row.event == Event::Step(ExecutionState::Accepted))
                        .then(|| e.row.session_id.map(|s| Value::String(s.to_string())))
                        .flatten()
                }),
                mcp_session_id: field("mcp_session_id"),
                jsonrpc_id: field("jsonrpc_id"),
            }
        })
        .collect();
    let record = &summary.record;
    let target = match record.get("target") {
        Some(Value::String(url)) => serde_json::json!({ "method": record.get("method"), "url": url }),
        Some(other) => other.clone(),
        None => Value::Null,
    };
    let idempotency_key = (summary.contract["class"] == "idempotency_key").then(|| IdempotencyKey {
        header: summary.contract["idempotency_header"].as_str().unwrap_or("Idempotency-Key").to_owned(),
        value: summary.id.clone(),
    });
    Incident {
        times: Times {
            accepted_at: summary.accepted_at,
            authorized_at: first_at(ExecutionState::Authorized),
            first_dispatched_at: summary.first_dispatched_at,
            completed_at,
            result_delivered_at: first_at(ExecutionState::ResultDelivered),
            updated_at: summary.updated_at,
        },
        result_ref: result.map(|r| ResultRef {
            bytes: r.body.len(),
            sha256: r.sha256,
            journal_seq: r.journal_seq,
            recorded_at: r.recorded_at,
        }),
        replay_contract: summary.contract.get("class").cloned().unwrap_or(Value::Null),
        execution_id: summary.id,
        state: summary.state,
        tool: summary.tool,
        channel: summary.channel,
        actor: summary.actor,
        intent_scope: summary.intent_scope,
        session_id: summary.session_id,
        fingerprint: summary.fingerprint,
        target,
        idempotency_key,
        target_outcome,
        calls,
        related,
    }
}
