//! What an approval window shows and answers: the view of one open question (exported to
//! TypeScript with the other IPC types) and the reply that comes back. Shared by the approver
//! (`dialogs`) and the commands (`ipc`), so neither depends on the other.

use serde::Serialize;
use ts_rs::TS;

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
    /// What the rows cut short (the whole request body), shown when the reviewer expands it.
    pub details: Option<String>,
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
    /// A permanent answer: the dialog asks for a second, deliberate step (no single key).
    pub needs_confirmation: bool,
}

/// An answer from an approval window.
#[derive(Debug, Clone)]
pub struct Reply {
    pub key: char,
    pub reason: Option<String>,
}
