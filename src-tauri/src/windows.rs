//! The approval windows themselves: one per open question, labelled by its id, opened (or
//! brought forward) by the approver, a notification or the Approvals view.

use tauri::{AppHandle, Manager, WebviewUrl, WebviewWindowBuilder};

/// The window label of question `id`.
pub fn window_label(id: &str) -> String {
    format!("approval-{id}")
}

/// Opens (or focuses) the window of question `id`.
pub fn show_window(app: &AppHandle, id: &str, title: &str) {
    let label = window_label(id);
    if let Some(w) = app.get_webview_window(&label) {
        let _ = w.set_focus();
        return;
    }
    let url = WebviewUrl::App(format!("index.html#/approval/{id}").into());
    let built = WebviewWindowBuilder::new(app, &label, url)
        .title(format!("Postern — {title}"))
        .inner_size(680.0, 600.0)
        .always_on_top(true)
        .focused(true)
        .center()
        .build();
    if let Err(e) = built {
        tracing::warn!(error = %e, "could not open the approval window");
    }
}
