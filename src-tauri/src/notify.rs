//! Native notifications (notify-rust): a pending approval (clicking it opens the request), an
//! `outcome_unknown` that needs review, a vault lock, a remote server that needs a new sign-in. Failures are logged, never fatal: a desktop
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

/// A remote server's OAuth refresh failed: its calls are refused until someone signs in again.
pub fn sign_in_needed(new: u64) {
    let body = format!(
        "{new} remote MCP server(s) need a new sign-in; their calls are refused until then. Sign in from \
         Servers, or run `postern servers login NAME`."
    );
    let _ = show("Postern: sign-in needed", &body);
}

/// Pushes the journal's changes to the windows and notifies when executions become
/// `outcome_unknown` or `needs_review`, and when a remote server needs a new sign-in. It waits on the journal's size (never polls) and reads
/// only the rows appended since the last look; at most one `journal-changed` event per
/// `LIVE_INTERVAL`, so a burst of calls reloads a view once.
pub async fn watch_journal(app: AppHandle, store: std::sync::Arc<postern_store::Store>) {
    use tauri::Emitter;
    let mut size = store.journal_size();
    let mut seen = *size.borrow_and_update();
    while size.changed().await.is_ok() {
        let now = *size.borrow_and_update();
        if now > seen {
            let new = store.view().events_after(seen, &["outcome_unknown", "needs_review"]).unwrap_or(0);
            if new > 0 {
                needs_review(new);
            }
            let failed =
                store.view().vault_events_after(seen, &[postern_store::VaultEvent::OAuthRefreshFailed]).unwrap_or(0);
            if failed > 0 {
                sign_in_needed(failed);
            }
            let _ = app.emit("journal-changed", now);
            seen = now;
        }
        tokio::time::sleep(LIVE_INTERVAL).await;
    }
}

/// How often, at most, the windows are told the journal changed.
pub const LIVE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);
