//! Native notifications (notify-rust): a pending approval (clicking it opens the request), an
//! `outcome_unknown` that needs review, a vault lock. Failures are logged, never fatal: a desktop
//! without a notification daemon still gets the windows and the tray.

use tauri::AppHandle;

fn show(summary: &str, body: &str) -> Option<notify_rust::NotificationHandle> {
    let mut n = notify_rust::Notification::new();
    n.appname("Postern").summary(summary).body(body);
    n.action("default", "Open");
    match n.show() {
        Ok(handle) => Some(handle),
        Err(e) => {
            tracing::debug!(error = %e, "no notification shown");
            None
        }
    }
}

/// A question waits for the reviewer; clicking the notification brings its window forward.
pub fn approval_needed(app: &AppHandle, id: &str, title: &str) {
    let Some(handle) = show("Postern: approval needed", title) else { return };
    let (app, id, title) = (app.clone(), id.to_owned(), title.to_owned());
    std::thread::spawn(move || {
        handle.wait_for_action(|action| {
            if action == "default" {
                crate::windows::show_window(&app, &id, &title);
            }
        });
    });
}

pub fn vault_locked(_app: &AppHandle) {
    let _ = show("Postern: vault locked", "Every action is denied until you unlock it in Postern.");
}

/// New executions whose outcome is unknown (or that wait for review): a person should look.
pub fn needs_review(new: u64) {
    let body = format!(
        "{new} execution(s) may or may not have happened; see Activity (state outcome_unknown or needs_review)."
    );
    let _ = show("Postern: an outcome needs review", &body);
}

/// Notifies when executions become `outcome_unknown` or `needs_review`: every 2 s it reads only
/// the journal rows appended since the last look (never a scan of all executions).
pub async fn watch_uncertain(store: std::sync::Arc<postern_store::Store>) {
    let head = |store: &postern_store::Store| store.view().head().map_or(0, |h| h.size);
    let mut seen = head(&store);
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        let now = head(&store);
        if now > seen {
            let new = store.view().events_after(seen, &["outcome_unknown", "needs_review"]).unwrap_or(0);
            if new > 0 {
                needs_review(new);
            }
            seen = now;
        }
    }
}
