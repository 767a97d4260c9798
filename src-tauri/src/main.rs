//! Postern's desktop app: the same gateway as `postern serve` (one engine, one journal), with the
//! reviewer's questions asked in native windows, a tray icon, notifications, and the journal views.
//! This file is the composition root; the UI lives in `ui/`.

#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

/// The allocator `postern serve` runs with, for the same gateway.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod dialogs;
mod ipc;
mod notify;
mod tray;
mod views;
mod windows;

use dialogs::{DialogApprover, Questions};
use postern_engine::Engine;
use postern_host::{Host, HostConfig};
use postern_store::Store;
use postern_vault::Vault;
use std::{path::PathBuf, sync::Arc, time::Duration};
use tauri::Manager;

/// What the commands share.
#[derive(Debug)]
pub struct App {
    pub engine: Arc<Engine>,
    pub manifest_path: String,
    pub manifest_errors: Vec<ipc::ManifestProblem>,
    pub store: Arc<Store>,
    pub vault: Arc<Vault>,
    pub questions: Arc<Questions>,
    pub data_dir: PathBuf,
    pub socket: String,
    pub http: Option<String>,
    /// OAuth sign-ins under way from the Servers view, by server name.
    pub sign_ins: std::sync::Mutex<std::collections::HashMap<String, postern_engine::channel::oauth::SignIn>>,
}

pub use postern_host::now;

fn fail(message: &str) -> ! {
    eprintln!("postern-app: {message}");
    std::process::exit(1);
}

fn main() {
    postern_host::init_logging();
    // The app's idle lock defaults to 900 s (it can unlock again); a bad POSTERN_* value stops it.
    let config = HostConfig::from_env(Some(Duration::from_secs(900))).unwrap_or_else(|e| fail(&e.to_string()));
    let (manifest, manifest_path, manifest_errors) = ipc::manifest(config.tools.as_deref());
    for e in &manifest_errors {
        tracing::error!(file = %e.file, line = e.line, "tool manifest: {}", e.message);
    }
    let host = Host::open(config).unwrap_or_else(|e| fail(&e.to_string()));
    let (store, vault, data_dir) = (Arc::clone(&host.store), Arc::clone(&host.vault), host.config.data_dir.clone());
    let questions = Arc::new(Questions::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut stop_tx = Some(stop_tx);
    let mut stop_rx = Some(stop_rx);
    let gateway_task: Arc<std::sync::Mutex<Option<tauri::async_runtime::JoinHandle<()>>>> = Arc::default();
    let task_slot = Arc::clone(&gateway_task);

    let app = tauri::Builder::default()
        .invoke_handler(ipc::handler())
        .setup(move |app| {
            let handle = app.handle().clone();
            let approver = Arc::new(DialogApprover::new(handle.clone(), Arc::clone(&questions)));
            let engine = host.engine(manifest, approver)?;
            let serving = tauri::async_runtime::block_on(host.bind(Arc::clone(&engine)))?;
            let endpoints = serving.endpoints.clone();
            tracing::info!(
                socket = %endpoints.socket.display(),
                http = %endpoints.http.map(|a| format!("http://{a}/mcp")).unwrap_or_else(|| "off".into()),
                recovered = host.recovery.outcome_unknown.len(),
                "postern app ready"
            );
            app.manage(Arc::new(App {
                engine: Arc::clone(&engine),
                manifest_path: manifest_path.clone(),
                manifest_errors: manifest_errors.clone(),
                store: Arc::clone(&store),
                vault: Arc::clone(&vault),
                questions: Arc::clone(&questions),
                data_dir: data_dir.clone(),
                socket: endpoints.socket.display().to_string(),
                http: endpoints.http.map(|a| format!("http://{a}/mcp")),
                sign_ins: Default::default(),
            }));
            let stop = stop_rx.take().ok_or("set up twice")?;
            // Serves with the idle lock; on exit drains executions in flight and flushes the journal.
            let task = tauri::async_runtime::spawn(async move {
                if let Err(e) = serving
                    .run(async move {
                        let _ = stop.await;
                    })
                    .await
                {
                    tracing::error!(error = %e, "the gateway stopped with an error");
                }
            });
            *task_slot.lock().map_err(|_| "poisoned")? = Some(task);
            let watched = Arc::clone(&store);
            let live = handle.clone();
            tauri::async_runtime::spawn(async move { notify::watch_journal(live, watched).await });
            if let Err(e) = tray::install(&handle) {
                tracing::warn!(error = %e, "no tray icon (is there a tray host?)");
            }
            Ok(())
        })
        .build(tauri::generate_context!())
        .unwrap_or_else(|e| fail(&format!("cannot start the app: {e}")));
    app.run(move |_, event| {
        if let tauri::RunEvent::Exit = event {
            // Stop accepting, let executions in flight finish and be journaled.
            if let Some(tx) = stop_tx.take() {
                let _ = tx.send(());
            }
            let task = gateway_task.lock().ok().and_then(|mut t| t.take());
            if let Some(task) = task {
                let _ =
                    tauri::async_runtime::block_on(async { tokio::time::timeout(Duration::from_secs(40), task).await });
            }
        }
    });
}
