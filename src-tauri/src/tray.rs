//! The tray icon: how many approvals wait, and a quick lock.

use tauri::{
    AppHandle, Manager,
    menu::{Menu, MenuItem},
    tray::TrayIconBuilder,
};

const TRAY: &str = "postern-tray";

pub fn install(app: &AppHandle) -> tauri::Result<()> {
    let open = MenuItem::with_id(app, "open", "Open Postern", true, None::<&str>)?;
    let lock = MenuItem::with_id(app, "lock", "Lock vault", true, None::<&str>)?;
    let quit = MenuItem::with_id(app, "quit", "Quit", true, None::<&str>)?;
    let menu = Menu::with_items(app, &[&open, &lock, &quit])?;
    let mut tray = TrayIconBuilder::with_id(TRAY).menu(&menu).tooltip("Postern: no approvals waiting");
    if let Some(icon) = app.default_window_icon() {
        tray = tray.icon(icon.clone());
    }
    tray.on_menu_event(|app, event| match event.id().as_ref() {
        "open" => {
            if let Some(w) = app.get_webview_window("main") {
                let _ = w.show();
                let _ = w.set_focus();
            }
        }
        "lock" => {
            if let Some(state) = app.try_state::<std::sync::Arc<crate::App>>()
                && state.vault.lock("desktop:tray", crate::now()).is_ok()
            {
                crate::notify::vault_locked(app);
            }
        }
        "quit" => app.exit(0),
        _ => {}
    })
    .build(app)?;
    Ok(())
}

/// Shows the number of waiting approvals on the tray icon.
pub fn refresh(app: &AppHandle) {
    let Some(state) = app.try_state::<std::sync::Arc<crate::App>>() else { return };
    let n = state.questions.pending().len();
    if let Some(tray) = app.tray_by_id(TRAY) {
        let text = match n {
            0 => "Postern: no approvals waiting".to_owned(),
            1 => "Postern: 1 approval waiting".to_owned(),
            n => format!("Postern: {n} approvals waiting"),
        };
        let _ = tray.set_tooltip(Some(&text));
        let _ = tray.set_title(Some(if n == 0 { String::new() } else { n.to_string() }));
    }
}
