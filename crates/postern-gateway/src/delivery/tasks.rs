//! MCP tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663): the durable handle an
//! agent follows instead of a response stream. A task *is* an execution: its ID is the execution
//! ID, its status is read from the journal at every `tasks/get` (so it survives a dropped
//! connection and a gateway restart), and only the agent that made it can read it. A task is
//! terminal only once its execution can change no more: a state a retry or a reviewer can still
//! move (outcome unknown, needs review, not executed, never sent before a restart) is `working`,
//! with what would move it, so a terminal answer is never taken back.

use postern_core::{Actor, ExecutionId, ExecutionState, Timestamp};
use postern_engine::{CallOutcome, Engine, EngineError, StepDetail, approval::when};
use postern_store::{ActivityNote, Event, StoreError};
use rmcp::model::{DetailedTask, JsonObject, Task, TaskPayload, TaskStatus};
use serde_json::Value;

/// How long a client is asked to wait between two `tasks/get`.
pub const POLL_INTERVAL_MS: u64 = 500;

/// Where an execution stands, as a task status and the words that go with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// Not finished: `working`, with what it is waiting for (and what would move it on).
    Working(&'static str),
    /// Withdrawn by the client before anything was sent.
    Cancelled,
    /// Finished for good: the terminal result is what the call itself would have been answered.
    Finished,
}

/// What an execution's journal says beside its state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Circumstances {
    /// A reviewer was asked and has not answered (the question is out of band, in Postern's
    /// approver, never in-protocol).
    pub approval_pending: bool,
    /// It ended `failed_before_dispatch` because the client withdrew it.
    pub cancelled: bool,
    /// Not sent, and left by an earlier run of the gateway: nothing is carrying it on.
    pub interrupted: bool,
}

/// What a task says about an execution in `state`.
pub fn standing(state: ExecutionState, c: Circumstances) -> Standing {
    use ExecutionState::*;
    match state {
        Accepted | Authorized if c.interrupted => Standing::Working(
            "interrupted: Postern restarted before this was sent, and nothing was sent; call the tool again with the \
             same arguments to carry it on (it is sent at most once)",
        ),
        Accepted if c.approval_pending => {
            Standing::Working("waiting for a reviewer's approval in Postern; nothing has been sent")
        }
        Accepted => Standing::Working("accepted; being authorized; nothing has been sent"),
        Authorized => Standing::Working("authorized; about to be sent"),
        Dispatched => Standing::Working("sent; waiting for the target's answer"),
        OutcomeUnknown => Standing::Working(
            "OUTCOME UNKNOWN: the request was sent and no complete answer came back; it may have happened. Postern \
             will not re-send it blindly: call the tool again with the same arguments to have it verified under its \
             replay contract (or put to a reviewer)",
        ),
        NeedsReview => Standing::Working("NEEDS REVIEW: it may have happened, and a person must decide in Postern"),
        NotExecuted => Standing::Working(
            "verified not executed: call the tool again with the same arguments to carry it on (it is sent at most \
             once)",
        ),
        FailedBeforeDispatch if c.cancelled => Standing::Cancelled,
        Completed | CompletedResultNotDelivered | ResultDelivered | Denied | FailedBeforeDispatch => Standing::Finished,
    }
}

/// A task read from the journal.
#[derive(Debug)]
pub struct TaskOnRecord {
    pub task: DetailedTask,
    /// The terminal result carries a side effect's result: fetching it is delivery evidence
    /// (from the execution's own run).
    pub delivers: Option<ExecutionId>,
    /// The agent run the execution belongs to.
    pub session: Option<String>,
}

/// Task `id` as the agent `actor` may see it; `None` when there is no such execution *or* it is
/// another agent's (the two are answered alike). `not_running_since`: no call of this process,
/// which started then, is carrying the execution on.
pub async fn task_on_record(
    engine: &Engine,
    id: ExecutionId,
    actor: &Actor,
    not_running_since: Option<Timestamp>,
) -> Result<Option<TaskOnRecord>, EngineError> {
    let view = engine.view();
    let Some(summary) = view.execution(id)? else { return Ok(None) };
    if summary.actor != actor.as_str() {
        return Ok(None);
    }
    let state = summary.state;
    let rows = view.timeline(id)?;
    let circumstances = Circumstances {
        approval_pending: rows
            .iter()
            .rev()
            .find_map(|e| match e.row.event {
                Event::Note(note) if note.is_approval() => Some(note),
                _ => None,
            })
            .is_some_and(|note| note == ActivityNote::ApprovalRequested),
        cancelled: state == ExecutionState::FailedBeforeDispatch
            && rows
                .iter()
                .rev()
                .find(|e| e.row.event == Event::Step(state))
                .map(|e| StepDetail::read(&e.row.detail))
                .transpose()?
                .is_some_and(|d| d.is_cancelled()),
        interrupted: not_running_since.is_some_and(|since| summary.updated_at < since.as_millis()),
    };
    let read_only = summary.contract.get("class").and_then(Value::as_str) == Some("read_only");
    let base = Task::new(id.to_string(), TaskStatus::Working, when(summary.accepted_at), when(summary.updated_at))
        .with_poll_interval_ms(POLL_INTERVAL_MS);
    let (task, delivers) = match standing(state, circumstances) {
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
                .answer_on_record(id, postern_engine::Decision::NewExecution)
                .await?
                .ok_or(StoreError::UnknownExecution(id))?;
            let delivers = (super::result::has_result(state) && !read_only).then_some(id);
            let result = call_tool_result(&outcome)?;
            let message = format!("execution {id} is {state}");
            (DetailedTask::new(base.with_status_message(message), TaskPayload::Completed { result }), delivers)
        }
    };
    Ok(Some(TaskOnRecord { task, delivers, session: summary.session_id }))
}

/// The terminal result: exactly the tool result the call would have been answered with.
fn call_tool_result(outcome: &CallOutcome) -> Result<JsonObject, EngineError> {
    match serde_json::to_value(super::result::outcome_result(outcome)) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(EngineError::Internal("a tool result is not a JSON object".into())),
        Err(e) => Err(EngineError::Internal(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A terminal task is never taken back: it is terminal exactly where its execution can make
    /// no step that changes what the task reports, and every state that can still move is
    /// `working` (`completed` may still become delivered, which changes nothing reported).
    #[test]
    fn a_task_is_terminal_exactly_where_its_execution_can_move_no_more() {
        let settled = |s: ExecutionState| {
            s.is_terminal() || matches!(s, ExecutionState::Completed | ExecutionState::CompletedResultNotDelivered)
        };
        for state in ExecutionState::ALL {
            for c in [
                Circumstances::default(),
                Circumstances { approval_pending: true, ..Circumstances::default() },
                Circumstances { interrupted: true, ..Circumstances::default() },
            ] {
                let working = matches!(standing(state, c), Standing::Working(_));
                assert_eq!(working, !settled(state), "{state} {c:?}");
            }
        }
        let cancelled = Circumstances { cancelled: true, ..Circumstances::default() };
        assert_eq!(standing(ExecutionState::FailedBeforeDispatch, cancelled), Standing::Cancelled);
        let asked = Circumstances { approval_pending: true, ..Circumstances::default() };
        assert!(matches!(standing(ExecutionState::Accepted, asked), Standing::Working(m) if m.contains("approval")));
        let left = Circumstances { interrupted: true, ..Circumstances::default() };
        assert!(
            matches!(standing(ExecutionState::Authorized, left), Standing::Working(m) if m.contains("interrupted"))
        );
    }

    #[test]
    fn instants_are_iso_8601() {
        assert_eq!(when(1_764_547_200_123), "2025-12-01T00:00:00.123Z");
    }
}
