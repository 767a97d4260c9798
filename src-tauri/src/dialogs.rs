//! The desktop approver: every question the ladder or a retry review raises becomes a separate,
//! focused, always-on-top window showing the same presentation as the terminal approver, with a
//! notification and the tray's count. The answer comes back over IPC from that window only.

use crate::views::{ApprovalView, ChoiceView, Reply, TimelineRow};
use crate::windows::{show_window, window_label};
use postern_engine::{
    Approver, Authorization, AuthorizationRequest, ChangeRequest, RetryReviewRequest, ReviewVerdict,
    approval::{Presentation, Withdrawal},
};
use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};
use tauri::{AppHandle, Emitter, Manager};

/// Who answered, as journaled.
const BY: &str = "desktop";

struct Question {
    view: ApprovalView,
    reply: mpsc::Sender<Reply>,
}

/// The questions open right now, by id.
#[derive(Default)]
pub struct Questions {
    next: AtomicU64,
    open: Mutex<BTreeMap<String, Question>>,
}

impl std::fmt::Debug for Questions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Questions").finish_non_exhaustive()
    }
}

impl Questions {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Question>> {
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Open questions, newest first.
    pub fn pending(&self) -> Vec<ApprovalView> {
        let mut all: Vec<ApprovalView> = self.lock().values().map(|q| q.view.clone()).collect();
        all.sort_by(|a, b| b.asked_at.total_cmp(&a.asked_at).then(b.id.cmp(&a.id)));
        all
    }

    pub fn get(&self, id: &str) -> Option<ApprovalView> {
        self.lock().get(id).map(|q| q.view.clone())
    }

    /// Hands a reviewer's answer to the waiting question; `false` if it is no longer open.
    pub fn answer(&self, id: &str, reply: Reply) -> bool {
        self.lock().get(id).is_some_and(|q| q.reply.send(reply).is_ok())
    }

    fn open(
        &self,
        kind: &str,
        execution_id: String,
        p: Presentation,
        timeout_ms: u64,
        now_ms: i64,
    ) -> (String, mpsc::Receiver<Reply>) {
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let id = format!("q{n}");
        let (tx, rx) = mpsc::channel();
        let view = ApprovalView {
            id: id.clone(),
            kind: kind.into(),
            execution_id,
            title: p.title,
            intro: p.intro,
            rows: p.rows.into_iter().map(|(l, v)| [l, v]).collect(),
            timeline: p
                .timeline
                .into_iter()
                .map(|t| TimelineRow { at: t.at as f64, event: t.event, summary: t.summary })
                .collect(),
            choices: p
                .choices
                .into_iter()
                .map(|c| ChoiceView {
                    key: c.key.to_string(),
                    label: c.label,
                    needs_reason: c.needs_reason,
                    needs_confirmation: c.needs_confirmation,
                })
                .collect(),
            details: p.details,
            asked_at: now_ms as f64,
            deadline: (now_ms + i64::try_from(timeout_ms).unwrap_or(i64::MAX / 2)) as f64,
        };
        self.lock().insert(id.clone(), Question { view, reply: tx });
        (id, rx)
    }

    fn close(&self, id: &str) {
        self.lock().remove(id);
    }
}

pub struct DialogApprover {
    app: AppHandle,
    questions: Arc<Questions>,
}

impl std::fmt::Debug for DialogApprover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DialogApprover").finish_non_exhaustive()
    }
}

impl DialogApprover {
    pub fn new(app: AppHandle, questions: Arc<Questions>) -> Self {
        DialogApprover { app, questions }
    }

    fn now_ms() -> i64 {
        postern_host::now().as_millis()
    }

    /// Opens the question's window, notifies, then waits for a reply (or the deadline, or the
    /// engine's withdrawal). `accept` turns a reply into the answer, or `None` to keep waiting.
    fn ask<T>(
        &self,
        kind: &str,
        execution_id: String,
        p: Presentation,
        timeout_ms: u64,
        withdrawn: &Withdrawal,
        mut accept: impl FnMut(Reply) -> Option<T>,
    ) -> Option<T> {
        let title = p.title.clone();
        let (id, rx) = self.questions.open(kind, execution_id, p, timeout_ms, Self::now_ms());
        let _ = self.app.emit("approvals-changed", ());
        crate::tray::refresh(&self.app);
        show_window(&self.app, &id, &title);
        crate::notify::approval_needed(&self.app, &id, &title);
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        let answer = loop {
            if withdrawn.is_withdrawn() || Instant::now() >= deadline {
                break None;
            }
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(reply) => {
                    if let Some(answer) = accept(reply) {
                        break Some(answer);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break None,
            }
        };
        self.questions.close(&id);
        if let Some(w) = self.app.get_webview_window(&window_label(&id)) {
            let _ = w.close();
        }
        let _ = self.app.emit("approvals-changed", ());
        crate::tray::refresh(&self.app);
        answer
    }
}

impl Approver for DialogApprover {
    fn kind(&self) -> &'static str {
        "desktop app"
    }

    fn where_to_unlock(&self) -> &'static str {
        "unlock it in the Postern desktop app (the Unlock button in its main window)"
    }

    fn authorize(&self, r: &AuthorizationRequest) -> Authorization {
        let kind = match r.ask {
            postern_engine::Ask::PerUse => "per_use",
            postern_engine::Ask::SessionAuthorization => "session_authorization",
        };
        let shown = r.presentation();
        let keys: Vec<char> = shown.choices.iter().map(|c| c.key).collect();
        let key = self.ask(kind, r.execution_id.to_string(), shown, r.timeout_ms, &r.withdrawn, |reply| {
            keys.contains(&reply.key).then_some(reply.key)
        });
        r.verdict(key, BY)
    }

    fn confirm_change(&self, r: &ChangeRequest) -> Option<bool> {
        let shown = r.presentation();
        let keys: Vec<char> = shown.choices.iter().map(|c| c.key).collect();
        let key = self.ask("owner_change", String::new(), shown, r.timeout_ms, &r.withdrawn, |reply| {
            keys.contains(&reply.key).then_some(reply.key)
        });
        Some(r.verdict(key))
    }

    fn reviews_retries(&self) -> bool {
        true
    }

    fn review_retry(&self, r: &RetryReviewRequest) -> Option<ReviewVerdict> {
        let answer = self.ask(
            "retry_review",
            r.execution_id.to_string(),
            r.presentation(),
            r.timeout_ms,
            &r.withdrawn,
            |reply| r.answer(reply.key, reply.reason.as_deref()),
        )?;
        Some(ReviewVerdict { answer, by: BY.into() })
    }
}
