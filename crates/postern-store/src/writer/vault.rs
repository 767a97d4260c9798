//! The writer's SQL for what the vault stream records: credentials and SSH hosts, agent tokens,
//! the lock, the installation id — each change a journal row carrying the new value.

use super::*;
use crate::{SpecChange, event};

impl Writer {
    pub(crate) fn installation_id(&mut self, candidate: &str, at: Timestamp) -> Result<String, StoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO installation (singleton, id, created_at) VALUES (1, ?1, ?2) ON CONFLICT DO NOTHING",
            )?
            .execute(params![candidate, at.as_millis()])?;
        Ok(self.conn.prepare_cached("SELECT id FROM installation")?.query_row([], |r| r.get(0))?)
    }

    pub(crate) fn vault_row(
        &mut self,
        event: VaultEvent,
        detail: Value,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        self.append(Draft {
            at,
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
        let detail = detail_of(&event::CredentialAdded {
            name: c.name.clone(),
            kind: c.kind.clone(),
            spec: event::Spec(c.spec.clone()),
            bindings: event::Spec(c.bindings.clone()),
            approve_every_use: c.approve_every_use,
        });
        self.vault_row(VaultEvent::CredentialAdded, detail, at)
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
        let detail = detail_of(&event::ApproveEveryUseChanged { name: name.to_owned(), approve_every_use: on });
        self.vault_row(VaultEvent::ApproveEveryUseChanged, detail, at)
    }

    pub(crate) fn update_spec(
        &mut self,
        name: &str,
        spec: &Value,
        event: SpecChange,
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
        // The new spec goes on the row, so the credential can be re-derived from the journal;
        // the change's own facts sit beside it (a detail that is not an object, under `detail`).
        let changed = detail_of(&event::SpecChanged { name: name.to_owned(), spec: event::Spec(spec.clone()) });
        let mut row = match detail {
            Value::Object(map) => map,
            Value::Null => serde_json::Map::new(),
            other => serde_json::Map::from_iter([("detail".to_owned(), other)]),
        };
        if let Value::Object(typed) = changed {
            row.extend(typed);
        }
        self.vault_row(event.into(), Value::Object(row), at)
    }

    pub(crate) fn remove_credential(&mut self, name: &str, at: Timestamp) -> Result<JournalEntry, StoreError> {
        let removed = self.conn.prepare_cached("DELETE FROM credentials WHERE name = ?1")?.execute([name])?;
        if removed == 0 {
            return Err(StoreError::UnknownCredential(name.to_owned()));
        }
        self.vault_row(VaultEvent::CredentialRemoved, detail_of(&event::Named { name: name.to_owned() }), at)
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
        let detail = detail_of(&event::AgentAdded { name: name.to_owned(), token_sha256: token_sha256.to_owned() });
        self.vault_row(VaultEvent::AgentAdded, detail, at)
    }

    pub(crate) fn revoke_agent(&mut self, name: &str, at: Timestamp) -> Result<JournalEntry, StoreError> {
        let revoked = self
            .conn
            .prepare_cached("UPDATE agents SET revoked_at = ?2 WHERE name = ?1 AND revoked_at IS NULL")?
            .execute(params![name, at.as_millis()])?;
        if revoked == 0 {
            return Err(StoreError::UnknownAgent(name.to_owned()));
        }
        self.vault_row(VaultEvent::AgentRevoked, detail_of(&event::Named { name: name.to_owned() }), at)
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
        self.vault_row(if locked { VaultEvent::VaultLocked } else { VaultEvent::VaultUnlocked }, detail, at)
    }
}
