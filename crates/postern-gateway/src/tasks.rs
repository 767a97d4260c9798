//! MCP tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663): the durable handle an
//! agent follows instead of a response stream. A task *is* an execution: its ID is the execution
//! ID, its status is read from the journal at every `tasks/get` (so it survives a dropped
//! connection and a gateway restart), and only the agent that made it can read it.

use crate::{CallOutcome, Engine, EngineError};
use postern_core::{Actor, ExecutionId, ExecutionState};
use postern_store::StoreError;
use rmcp::model::{DetailedTask, JsonObject, Task, TaskPayload, TaskStatus};
use serde_json::Value;

/// How long a client is asked to wait between two `tasks/get`.
pub const POLL_INTERVAL_MS: u64 = 500;

/// Where an execution stands, as a task status and the words that go with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// Not finished: `working`, with what it is waiting for.
    Working(&'static str),
    /// Withdrawn by the client before anything was sent.
    Cancelled,
    /// Finished: the terminal result is what the call itself would have been answered.
    Finished,
}

/// What a task says about an execution in `state`. `approval_pending`: a reviewer was asked and
/// has not answered (the question is out of band, in Postern's approver, never in-protocol).
pub fn standing(state: ExecutionState, approval_pending: bool, cancelled: bool) -> Standing {
    match state {
        ExecutionState::Accepted if approval_pending => {
            Standing::Working("waiting for a reviewer's approval in Postern; nothing has been sent")
        }
        ExecutionState::Accepted => Standing::Working("accepted; being authorized; nothing has been sent"),
        ExecutionState::Authorized => Standing::Working("authorized; about to be sent"),
        ExecutionState::Dispatched => Standing::Working("sent; waiting for the target's answer"),
        ExecutionState::FailedBeforeDispatch if cancelled => Standing::Cancelled,
        ExecutionState::Completed
        | ExecutionState::CompletedResultNotDelivered
        | ExecutionState::ResultDelivered
        | ExecutionState::Denied
        | ExecutionState::FailedBeforeDispatch
        | ExecutionState::NotExecuted
        | ExecutionState::OutcomeUnknown
        | ExecutionState::NeedsReview => Standing::Finished,
    }
}

/// A task read from the journal.
#[derive(Debug)]
pub struct TaskOnRecord {
    pub task: DetailedTask,
    /// The terminal result carries a side effect's result: fetching it is delivery evidence.
    pub delivers: Option<ExecutionId>,
}

/// Task `id` as the agent `actor` may see it; `None` when there is no such execution *or* it is
/// another agent's (the two are answered alike).
pub async fn task_on_record(
    engine: &Engine,
    id: ExecutionId,
    actor: &Actor,
) -> Result<Option<TaskOnRecord>, EngineError> {
    let view = engine.view();
    let Some(summary) = view.execution(id)? else { return Ok(None) };
    if summary.actor != actor.as_str() {
        return Ok(None);
    }
    let state: ExecutionState = summary
        .state
        .parse()
        .map_err(|e: postern_core::lifecycle::UnknownState| EngineError::Internal(e.to_string()))?;
    let rows = view.timeline(id)?;
    let approval_pending = rows
        .iter()
        .rev()
        .find(|e| e.row.event.starts_with("approval_"))
        .is_some_and(|e| e.row.event == "approval_requested");
    let cancelled = state == ExecutionState::FailedBeforeDispatch
        && rows
            .iter()
            .rev()
            .find(|e| e.row.event == state.as_str())
            .is_some_and(|e| e.row.detail["reason"] == "cancelled");
    let read_only = summary.contract.get("class").and_then(Value::as_str) == Some("read_only");
    let base =
        Task::new(id.to_string(), TaskStatus::Working, rfc3339(summary.accepted_at), rfc3339(summary.updated_at))
            .with_poll_interval_ms(POLL_INTERVAL_MS);
    let (task, delivers) = match standing(state, approval_pending, cancelled) {
        Standing::Working(message) => {
            (DetailedTask::new(base.with_status_message(message), TaskPayload::Working), None)
        }
        Standing::Cancelled => (
            DetailedTask::new(
                base.with_status_message("cancelled by the client before it was sent; nothing was sent"),
                TaskPayload::Cancelled,
            ),
            None,
        ),
        Standing::Finished => {
            let outcome = engine
                .answer_on_record(id, crate::Decision::NewExecution)
                .await?
                .ok_or(StoreError::UnknownExecution(id))?;
            let delivers = (crate::mcp::has_result(state) && !read_only).then_some(id);
            let result = call_tool_result(&outcome)?;
            let message = format!("execution {id} is {state}");
            (DetailedTask::new(base.with_status_message(message), TaskPayload::Completed { result }), delivers)
        }
    };
    Ok(Some(TaskOnRecord { task, delivers }))
}

/// The terminal result: exactly the tool result the call would have been answered with.
fn call_tool_result(outcome: &CallOutcome) -> Result<JsonObject, EngineError> {
    match serde_json::to_value(crate::mcp::outcome_result(outcome)) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(EngineError::Internal("a tool result is not a JSON object".into())),
        Err(e) => Err(EngineError::Internal(e.to_string())),
    }
}

/// Milliseconds since the epoch as the ISO 8601 instant tasks carry.
pub(crate) fn rfc3339(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_works_while_the_engine_has_it_and_is_done_otherwise() {
        for state in ExecutionState::ALL {
            let s = standing(state, false, false);
            // `working` exactly while the engine has the execution in hand; every other state
            // is answered as the call itself would have been.
            let working =
                matches!(state, ExecutionState::Accepted | ExecutionState::Authorized | ExecutionState::Dispatched);
            assert_eq!(matches!(s, Standing::Working(_)), working, "{state}");
        }
        assert_eq!(standing(ExecutionState::FailedBeforeDispatch, false, true), Standing::Cancelled);
        assert!(
            matches!(standing(ExecutionState::Accepted, true, false), Standing::Working(m) if m.contains("approval"))
        );
    }

    #[test]
    fn instants_are_iso_8601() {
        assert_eq!(rfc3339(1_764_547_200_123), "2025-12-01T00:00:00.123Z");
    }
}
