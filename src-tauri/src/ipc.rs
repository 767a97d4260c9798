//! The typed IPC between the windows and the app: every command's argument and result type is
//! declared here once and exported to TypeScript (`ui/src/lib/bindings/`, by ts-rs, when the
//! tests run); every error crosses as an [`IpcError`] — a machine-readable code and a message.

use crate::{App, dialogs::Reply};
use postern_core::ErrorCode;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use ts_rs::TS;

/// An error as the UI receives it.
#[derive(Debug, Clone, Serialize, TS, thiserror::Error)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
#[error("{message} ({code})")]
pub struct IpcError {
    pub code: String,
    pub message: String,
}

impl IpcError {
    fn new(code: &str, message: impl Into<String>) -> Self {
        IpcError { code: code.into(), message: message.into() }
    }
}

impl<E: ErrorCode + std::fmt::Display> From<E> for IpcError {
    fn from(e: E) -> Self {
        IpcError { code: e.code().into(), message: e.to_string() }
    }
}

/// One open approval question, as its window shows it.
#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct ApprovalView {
    pub id: String,
    /// `session_authorization`, `per_use` or `retry_review`.
    pub kind: String,
    pub execution_id: String,
    pub title: String,
    pub intro: Option<String>,
    /// Label and value, in order (the same rows the terminal approver prints).
    pub rows: Vec<[String; 2]>,
    pub timeline: Vec<TimelineRow>,
    pub choices: Vec<ChoiceView>,
    /// ms since the epoch.
    pub asked_at: f64,
    pub deadline: f64,
}

#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct TimelineRow {
    pub at: f64,
    pub event: String,
    pub summary: String,
}

#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct ChoiceView {
    /// The keyboard shortcut, one letter.
    pub key: String,
    pub label: String,
    pub needs_reason: bool,
}

/// The Activity view's filters; absent fields mean "any".
#[derive(Debug, Clone, Default, Deserialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct ExecutionFilter {
    pub before: Option<String>,
    pub state: Option<String>,
    pub tool: Option<String>,
    pub actor: Option<String>,
    pub session: Option<String>,
    pub from: Option<f64>,
    pub until: Option<f64>,
    pub text: Option<String>,
    pub limit: Option<u32>,
}

/// One row of the Activity table.
#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct ExecutionRow {
    pub id: String,
    pub tool: String,
    pub state: String,
    pub actor: String,
    pub session: Option<String>,
    pub channel: String,
    pub contract: String,
    pub accepted_at: f64,
    pub updated_at: f64,
}

/// The Activity view's detail pane.
#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct ExecutionDetail {
    pub row: ExecutionRow,
    pub fingerprint: String,
    pub idempotency_key: Option<String>,
    pub timeline: Vec<TimelineRow>,
    /// The stored result as pretty JSON (`None` until there is one).
    pub result: Option<String>,
}

#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct SessionRow {
    pub id: String,
    pub actor: String,
    pub pid: Option<f64>,
    pub transport: String,
    pub client: Option<String>,
    pub started_at: f64,
    pub ended_at: Option<f64>,
    pub end_reason: Option<String>,
    pub calls: f64,
    pub authorization: Option<String>,
    pub authorized_by: Option<String>,
}

#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct StatusView {
    pub locked: bool,
    pub pending: u32,
    pub data_dir: String,
    pub socket: String,
    pub http: Option<String>,
}

type State<'a> = tauri::State<'a, Arc<App>>;

#[tauri::command]
pub fn pending_approvals(app: State<'_>) -> Vec<ApprovalView> {
    app.questions.pending()
}

#[tauri::command]
pub fn approval(app: State<'_>, id: String) -> Result<ApprovalView, IpcError> {
    app.questions.get(&id).ok_or_else(|| IpcError::new("approval_closed", "this question is no longer open"))
}

/// The only way an approval is given: from one of the app's own windows.
#[tauri::command]
pub fn answer_approval(app: State<'_>, id: String, key: String, reason: Option<String>) -> Result<(), IpcError> {
    let mut chars = key.chars();
    let (Some(key), None) = (chars.next(), chars.next()) else {
        return Err(IpcError::new("invalid_answer", format!("{key:?} is not one key")));
    };
    if app.questions.answer(&id, Reply { key, reason }) {
        Ok(())
    } else {
        Err(IpcError::new("approval_closed", "this question is no longer open (answered, timed out or withdrawn)"))
    }
}

#[tauri::command]
pub fn open_approval(handle: tauri::AppHandle, app: State<'_>, id: String) -> Result<(), IpcError> {
    let view = app.questions.get(&id).ok_or_else(|| IpcError::new("approval_closed", "no longer open"))?;
    crate::dialogs::show_window(&handle, &id, &view.title);
    Ok(())
}

fn row(s: &postern_store::ExecutionSummary) -> ExecutionRow {
    ExecutionRow {
        id: s.id.clone(),
        tool: s.tool.clone(),
        state: s.state.clone(),
        actor: s.actor.clone(),
        session: s.session_id.clone(),
        channel: s.channel.clone(),
        contract: s.contract.get("class").and_then(|c| c.as_str()).unwrap_or("").to_owned(),
        accepted_at: s.accepted_at as f64,
        updated_at: s.updated_at as f64,
    }
}

#[tauri::command]
pub fn executions(app: State<'_>, filter: ExecutionFilter) -> Result<Vec<ExecutionRow>, IpcError> {
    let blank = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    let query = postern_store::ExecutionQuery {
        before: blank(filter.before),
        state: blank(filter.state),
        tool: blank(filter.tool),
        actor: blank(filter.actor),
        session: blank(filter.session),
        from: filter.from.map(|v| v as i64),
        until: filter.until.map(|v| v as i64),
        text: blank(filter.text),
        limit: filter.limit.unwrap_or(100) as usize,
    };
    Ok(app.store.view().executions_page(&query)?.iter().map(row).collect())
}

#[tauri::command]
pub fn execution_detail(app: State<'_>, id: String) -> Result<ExecutionDetail, IpcError> {
    let parsed: postern_core::ExecutionId = id.parse().map_err(|e: postern_core::IdError| IpcError::from(e))?;
    let view = app.store.view();
    let summary =
        view.execution(parsed)?.ok_or_else(|| IpcError::new("unknown_execution", format!("no execution {id}")))?;
    let timeline: Vec<TimelineRow> = view
        .timeline(parsed)?
        .into_iter()
        .map(|e| TimelineRow {
            at: e.row.at.as_millis() as f64,
            event: e.row.event.clone(),
            summary: serde_json::to_string(&e.row.detail).unwrap_or_default(),
        })
        .collect();
    let idempotency_key = summary.contract.get("idempotency_header").and_then(|h| h.as_str()).map(|_| id.clone());
    let result = view
        .result(parsed)?
        .and_then(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
        .map(|v| serde_json::to_string_pretty(&v).unwrap_or_default());
    Ok(ExecutionDetail {
        row: row(&summary),
        fingerprint: summary.fingerprint.clone(),
        idempotency_key,
        timeline,
        result,
    })
}

#[tauri::command]
pub fn sessions(app: State<'_>) -> Result<Vec<SessionRow>, IpcError> {
    Ok(app
        .store
        .view()
        .sessions()?
        .into_iter()
        .map(|s| SessionRow {
            id: s.id,
            actor: s.actor,
            pid: s.pid.map(|p| p as f64),
            transport: s.transport,
            client: s.client,
            started_at: s.started_at as f64,
            ended_at: s.ended_at.map(|t| t as f64),
            end_reason: s.end_reason,
            calls: s.executions as f64,
            authorization: s.authorization,
            authorized_by: s.authorized_by,
        })
        .collect())
}

#[tauri::command]
pub fn revoke_session(app: State<'_>, id: String) -> Result<(), IpcError> {
    let parsed: postern_core::SessionId = id.parse().map_err(|e: postern_core::IdError| IpcError::from(e))?;
    app.store.set_session_standing(parsed, false, "desktop", serde_json::json!({}), crate::now())?;
    Ok(())
}

#[tauri::command]
pub fn lock_vault(handle: tauri::AppHandle, app: State<'_>) -> Result<(), IpcError> {
    app.vault.lock("desktop", crate::now())?;
    crate::notify::vault_locked(&handle);
    Ok(())
}

/// Unlocking belongs to the approver's channel: the app's own windows (never the control socket).
#[tauri::command]
pub fn unlock_vault(app: State<'_>) -> Result<(), IpcError> {
    app.vault.unlock("desktop", crate::now())?;
    Ok(())
}

#[tauri::command]
pub fn status(app: State<'_>) -> Result<StatusView, IpcError> {
    Ok(StatusView {
        locked: app.vault.is_locked()?,
        pending: u32::try_from(app.questions.pending().len()).unwrap_or(u32::MAX),
        data_dir: app.data_dir.display().to_string(),
        socket: app.socket.clone(),
        http: app.http.clone(),
    })
}
