//! The writer's SQL for what the vault stream records: credentials and SSH hosts, agent tokens,
//! the lock, the installation id — each change a journal row carrying the new value.

use super::*;

impl Writer {
    pub(crate) fn installation_id(&mut self, candidate: &str, at: Timestamp) -> Result<String, StoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO installation (singleton, id, created_at) VALUES (1, ?1, ?2) ON CONFLICT DO NOTHING",
            )?
            .execute(params![candidate, at.as_millis()])?;
        Ok(self.conn.prepare_cached("SELECT id FROM installation")?.query_row([], |r| r.get(0))?)
    }

    pub(crate) fn vault_row(&mut self, event: &str, detail: Value, at: Timestamp) -> Result<JournalEntry, StoreError> {
        self.append(Draft {
            at,
            stream: Stream::Vault,
            event: event.into(),
            execution_id: None,
            session_id: None,
            state: None,
            result_sha256: None,
            detail,
        })
    }

    pub(crate) fn put_credential(&mut self, c: &CredentialRecord, at: Timestamp) -> Result<JournalEntry, StoreError> {
        let json = |v: &Value| serde_json::to_string(v).map_err(|e| StoreError::Corrupt(e.to_string()));
        let inserted = self
            .conn
            .prepare_cached(
                "INSERT INTO credentials (name, kind, spec, bindings, approve_every_use, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (name) DO NOTHING",
            )?
            .execute(params![c.name, c.kind, json(&c.spec)?, json(&c.bindings)?, c.approve_every_use, c.created_at])?;
        if inserted == 0 {
            return Err(StoreError::DuplicateCredential(c.name.clone()));
        }
        let detail = json!({
            "name": c.name, "kind": c.kind, "spec": c.spec, "bindings": c.bindings,
            "approve_every_use": c.approve_every_use,
        });
        self.vault_row("credential_added", detail, at)
    }

    pub(crate) fn set_approve_every_use(
        &mut self,
        name: &str,
        on: bool,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        let changed = self
            .conn
            .prepare_cached("UPDATE credentials SET approve_every_use = ?2 WHERE name = ?1")?
            .execute(params![name, on])?;
        if changed == 0 {
            return Err(StoreError::UnknownCredential(name.to_owned()));
        }
        self.vault_row("approve_every_use_changed", json!({ "name": name, "approve_every_use": on }), at)
    }

    pub(crate) fn update_spec(
        &mut self,
        name: &str,
        spec: &Value,
        event: &str,
        detail: Value,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        let text = serde_json::to_string(spec).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let changed = self
            .conn
            .prepare_cached("UPDATE credentials SET spec = ?2 WHERE name = ?1")?
            .execute(params![name, text])?;
        if changed == 0 {
            return Err(StoreError::UnknownCredential(name.to_owned()));
        }
        // The new spec goes on the row, so the credential can be re-derived from the journal.
        let mut detail = detail;
        if let Value::Object(map) = &mut detail {
            map.insert("name".into(), json!(name));
            map.insert("spec".into(), spec.clone());
        }
        self.vault_row(event, detail, at)
    }

    pub(crate) fn remove_credential(&mut self, name: &str, at: Timestamp) -> Result<JournalEntry, StoreError> {
        let removed = self.conn.prepare_cached("DELETE FROM credentials WHERE name = ?1")?.execute([name])?;
        if removed == 0 {
            return Err(StoreError::UnknownCredential(name.to_owned()));
        }
        self.vault_row("credential_removed", json!({ "name": name }), at)
    }

    pub(crate) fn add_agent(
        &mut self,
        name: &str,
        token_sha256: &str,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        let inserted = self
            .conn
            .prepare_cached(
                "INSERT INTO agents (name, token_sha256, created_at) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
            )?
            .execute(params![name, token_sha256, at.as_millis()])?;
        if inserted == 0 {
            return Err(StoreError::DuplicateAgent(name.to_owned()));
        }
        self.vault_row("agent_added", json!({ "name": name, "token_sha256": token_sha256 }), at)
    }

    pub(crate) fn revoke_agent(&mut self, name: &str, at: Timestamp) -> Result<JournalEntry, StoreError> {
        let revoked = self
            .conn
            .prepare_cached("UPDATE agents SET revoked_at = ?2 WHERE name = ?1 AND revoked_at IS NULL")?
            .execute(params![name, at.as_millis()])?;
        if revoked == 0 {
            return Err(StoreError::UnknownAgent(name.to_owned()));
        }
        self.vault_row("agent_revoked", json!({ "name": name }), at)
    }

    pub(crate) fn set_locked(
        &mut self,
        locked: bool,
        detail: Value,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO vault_state (singleton, locked, changed_at) VALUES (1, ?1, ?2)
                 ON CONFLICT (singleton) DO UPDATE SET locked = excluded.locked, changed_at = excluded.changed_at",
            )?
            .execute(params![locked, at.as_millis()])?;
        self.vault_row(if locked { "vault_locked" } else { "vault_unlocked" }, detail, at)
    }
}
