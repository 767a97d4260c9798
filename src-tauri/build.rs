//! Tauri's build step: the app manifest (its commands, as permissions the capabilities grant).
fn main() {
    tauri_build::try_build(tauri_build::Attributes::new().app_manifest(tauri_build::AppManifest::new().commands(&[
        "pending_approvals",
        "approval",
        "answer_approval",
        "open_approval",
        "executions",
        "execution_detail",
        "sessions",
        "revoke_session",
        "lock_vault",
        "unlock_vault",
        "tools",
        "vault",
        "add_credential",
        "add_ssh_host",
        "remove_credential",
        "set_approve_every_use",
        "audit_verify",
        "audit_checkpoint",
        "status",
        "servers",
        "restart_server",
        "add_server",
        "remove_server",
        "set_tool_contract",
        "set_server_start",
        "import_offer",
        "import_apply",
    ])))
    .expect("tauri build step");
}
