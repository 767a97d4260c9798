//! What an agent is answered with: a tool result that carries the execution's identity and
//! state (in `structuredContent` and in words), the result on record, and the report
//! `execution_status` gives.

use postern_core::{ExecutionId, ExecutionState};
use postern_engine::{CallOutcome, Engine};
use rmcp::model::{CallToolResult, ContentBlock as Content};
use serde_json::{Value, json};

pub(crate) fn has_result(state: ExecutionState) -> bool {
    matches!(
        state,
        ExecutionState::Completed | ExecutionState::CompletedResultNotDelivered | ExecutionState::ResultDelivered
    )
}

/// What `execution_status` reports: the incident record (identity, fingerprint, target, times,
/// what the target answered, the result's reference, the calls and retries that reached it,
/// related executions), the timeline, and the result itself.
pub fn execution_report(
    engine: &Engine,
    id: ExecutionId,
    actor: &postern_core::Actor,
) -> Result<Option<Value>, postern_store::StoreError> {
    let view = engine.view();
    // Whose it is, first: another agent's execution costs one row read, as a missing one does,
    // not the incident record's queries (and takes no longer to be refused).
    if view.execution(id)?.is_none_or(|summary| summary.actor != actor.as_str()) {
        return Ok(None);
    }
    let Some(incident) = view.incident(id)? else { return Ok(None) };
    if incident.actor != actor.as_str() {
        return Ok(None);
    }
    let timeline: Vec<Value> = view
        .timeline(id)?
        .into_iter()
        .map(|e| json!({ "event": e.row.event, "state": e.row.state, "at": e.row.at, "detail": e.row.detail }))
        .collect();
    // Through the outcome stage, like every result an agent is answered with.
    let result = engine.result_on_record(id).unwrap_or(Value::Null);
    let mut report = serde_json::to_value(&incident).map_err(|e| postern_store::StoreError::Corrupt(e.to_string()))?;
    if let Value::Object(m) = &mut report {
        m.insert("timeline".into(), Value::Array(timeline));
        m.insert("result".into(), result);
    }
    Ok(Some(report))
}

pub(crate) fn error_result(code: &str, message: &str) -> CallToolResult {
    let body = json!({ "error": { "code": code, "message": message } });
    let mut r = CallToolResult::error(vec![Content::text(format!("{message} ({code})"))]);
    r.structured_content = Some(body);
    r
}

/// What the agent should understand about a state, in words.
pub(crate) fn explain(o: &CallOutcome) -> (String, bool) {
    let id = o.execution_id;
    let attached = if o.attached {
        format!(" This call matched execution {id} already on record ({}); nothing was sent again.", o.decision)
    } else {
        String::new()
    };
    let why = o.why();
    let reason = why.reason.as_deref().unwrap_or("");
    if o.decision == postern_engine::engine::Decision::RetryDenied {
        return (
            format!(
                "RETRY REFUSED: this call repeats execution {id} ({}), which is on record; a reviewer was asked and \
                 the retry was refused ({reason}). Nothing was sent. Call execution_status with execution_id {id} \
                 to see what the original did.",
                o.state
            ),
            true,
        );
    }
    let too_large = o.result_too_large();
    match o.state {
        ExecutionState::Completed | ExecutionState::ResultDelivered | ExecutionState::CompletedResultNotDelivered
            if too_large.is_some() =>
        {
            let status = o.http().map_or_else(String::new, |r| format!(" (HTTP {})", r.status));
            (
                format!(
                    "RESULT TOO LARGE: the action COMPLETED{status}, but its answer was larger than the result limit of \
                     {} bytes (--max-result-bytes) and was not kept (result_too_large). Do not repeat the call to see \
                     it: that would perform the action again. Execution {id}.{attached}",
                    too_large.unwrap_or_default()
                ),
                true,
            )
        }
        ExecutionState::Completed | ExecutionState::ResultDelivered | ExecutionState::CompletedResultNotDelivered => {
            let status = match (o.http(), o.ssh()) {
                (Some(r), _) => format!(": HTTP {}", r.status),
                (None, Some(ssh)) => match (&ssh.exit_status, &ssh.exit_signal) {
                    (Some(code), _) => format!(": exit status {code}"),
                    (None, Some(sig)) => format!(": ended by signal {sig}"),
                    (None, None) => String::new(),
                },
                (None, None) => String::new(),
            };
            (format!("Completed{status}.{attached}"), false)
        }
        ExecutionState::Denied => {
            let rung = why.rung.as_deref().unwrap_or("policy");
            (format!("Denied ({rung}): {reason}. Nothing was sent.{attached}"), true)
        }
        ExecutionState::FailedBeforeDispatch => {
            (format!("Not sent: {reason}. Nothing reached the target; calling again is safe.{attached}"), true)
        }
        ExecutionState::OutcomeUnknown => (
            format!(
                "OUTCOME UNKNOWN: the request was sent but no complete response came back ({reason}). The action \
                 may have happened. Postern recorded it as execution {id} and will not send it again blindly: a \
                 retry of this call is answered from that record under the tool's replay contract. Safe next step: \
                 call execution_status with execution_id {id}.{attached}"
            ),
            false,
        ),
        ExecutionState::NeedsReview => (
            format!(
                "NEEDS REVIEW: execution {id} may have happened and a human must decide ({reason}). Postern did not \
                 re-send it. Call execution_status with execution_id {id} to follow it.{attached}"
            ),
            false,
        ),
        ExecutionState::Dispatched => (
            format!(
                "STILL IN FLIGHT: execution {id} was sent and has not finished. Do not repeat it; call \
                 execution_status with execution_id {id}.{attached}"
            ),
            false,
        ),
        other => (format!("Execution {id} is {other}.{attached}"), false),
    }
}

/// A tool result: the execution's identity and state in `structuredContent` and in words.
pub fn outcome_result(o: &CallOutcome) -> CallToolResult {
    let (message, is_error) = explain(o);
    let mut structured = json!({
        "execution_id": o.execution_id,
        "state": o.state,
        "attached": o.attached,
        "decision": o.decision,
        "message": message,
        "result": o.answer,
        "detail": o.detail,
    });
    if let Some(limit) = o.result_too_large() {
        structured["error"] = json!({ "code": "result_too_large", "limit": limit });
    }
    let mut text = message;
    if let Some(r) = o.http() {
        text.push_str(&format!("\n\n{}", r.body));
    }
    if let Some(r) = o.ssh() {
        if r.from_marker {
            text.push_str("\n\n(the output was lost with the connection; the exit status is from the host's marker)");
        }
        text.push_str(&format!("\n\nstdout:\n{}\nstderr:\n{}", r.stdout, r.stderr));
        if r.truncated {
            text.push_str("\n(output truncated at the cap)");
        }
        if let Some(t) = &r.timed_out {
            text.push_str(&format!("\n{t}"));
        }
    }
    text.push_str(&format!("\n\nexecution_id: {}\nstate: {}", o.execution_id, o.state));
    if let Some(u) = o.upstream() {
        // The upstream's own content, as it sent it, after Postern's account of the execution.
        let mut content = vec![Content::text(text)];
        if let Some(items) = u.upstream_result.get("content").and_then(Value::as_array) {
            content.extend(items.iter().filter_map(|c| serde_json::from_value::<Content>(c.clone()).ok()));
        } else if let Some(e) = u.upstream_result.get("error") {
            content.push(Content::text(format!("the MCP server {} answered with an error: {e}", u.server)));
        }
        let mut r =
            if is_error || u.is_error { CallToolResult::error(content) } else { CallToolResult::success(content) };
        r.structured_content = Some(structured);
        return r;
    }
    let mut r = if is_error {
        CallToolResult::error(vec![Content::text(text)])
    } else {
        CallToolResult::success(vec![Content::text(text)])
    };
    r.structured_content = Some(structured);
    r
}
