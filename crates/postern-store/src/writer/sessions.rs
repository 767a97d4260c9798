//! The writer's SQL for agent runs and their standing, the allowlist, and the Streamable HTTP
//! sessions kept across a restart.

use super::*;

impl Writer {
    pub(crate) fn start_session(&mut self, s: &SessionStart) -> Result<JournalEntry, StoreError> {
        let inserted = self
            .conn
            .prepare_cached(
                "INSERT INTO agent_sessions (id, actor, pid, process_start, transport, client, started_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (id) DO NOTHING",
            )?
            .execute(params![
                s.id.to_string(),
                s.actor.as_str(),
                s.pid,
                s.process_start,
                s.transport,
                s.client,
                s.at.as_millis()
            ])?;
        if inserted == 0 {
            return Err(StoreError::DuplicateSession(s.id));
        }
        self.append(Draft {
            at: s.at,
            event: SessionEvent::SessionStarted.into(),
            execution_id: None,
            session_id: Some(s.id),
            state: None,
            result_sha256: None,
            detail: json!({
                "actor": s.actor, "pid": s.pid, "process_start": s.process_start,
                "transport": s.transport, "client": s.client,
            }),
        })
    }

    pub(crate) fn end_session(
        &mut self,
        id: SessionId,
        reason: &str,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        let ended: Option<Option<i64>> = self
            .conn
            .prepare_cached("SELECT ended_at FROM agent_sessions WHERE id = ?1")?
            .query_row([id.to_string()], |r| r.get(0))
            .optional()?;
        match ended {
            None => return Err(StoreError::UnknownSession(id)),
            Some(Some(_)) => return Err(StoreError::SessionEnded(id)),
            Some(None) => {}
        }
        self.conn
            .prepare_cached("UPDATE agent_sessions SET ended_at = ?2, end_reason = ?3 WHERE id = ?1")?
            .execute(params![id.to_string(), at.as_millis(), reason])?;
        self.append(Draft {
            at,
            event: SessionEvent::SessionEnded.into(),
            execution_id: None,
            session_id: Some(id),
            state: None,
            result_sha256: None,
            detail: json!({ "reason": reason }),
        })
    }

    /// A reviewer authorized or revoked an agent run. A revoked run stays revoked.
    pub(crate) fn session_standing(
        &mut self,
        id: SessionId,
        authorized: bool,
        by: &str,
        mut detail: Value,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        let current: Option<Option<String>> = self
            .conn
            .prepare_cached(
                "SELECT g.standing FROM agent_sessions s LEFT JOIN session_grants g ON g.session_id = s.id
                 WHERE s.id = ?1",
            )?
            .query_row([id.to_string()], |r| r.get(0))
            .optional()?;
        match current {
            None => return Err(StoreError::UnknownSession(id)),
            Some(Some(s)) if s == "revoked" => return Err(StoreError::SessionRevoked(id)),
            _ => {}
        }
        let standing = if authorized { "authorized" } else { "revoked" };
        self.conn
            .prepare_cached(
                "INSERT INTO session_grants (session_id, standing, decided_by, updated_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (session_id) DO UPDATE SET standing = excluded.standing,
                     decided_by = excluded.decided_by, updated_at = excluded.updated_at",
            )?
            .execute(params![id.to_string(), standing, by, at.as_millis()])?;
        if let Value::Object(map) = &mut detail {
            map.insert("by".into(), json!(by));
        }
        self.append(Draft {
            at,
            event: if authorized { SessionEvent::SessionAuthorized } else { SessionEvent::SessionRevoked }.into(),
            execution_id: None,
            session_id: Some(id),
            state: None,
            result_sha256: None,
            detail,
        })
    }

    pub(crate) fn allowlist(
        &mut self,
        actor: &str,
        add: bool,
        by: &str,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        let changed = if add {
            self.conn
                .prepare_cached(
                    "INSERT INTO allowlist (actor, added_by, added_at) VALUES (?1, ?2, ?3)
                     ON CONFLICT (actor) DO UPDATE SET added_by = excluded.added_by, added_at = excluded.added_at,
                         removed_at = NULL",
                )?
                .execute(params![actor, by, at.as_millis()])?
        } else {
            self.conn
                .prepare_cached("UPDATE allowlist SET removed_at = ?2 WHERE actor = ?1 AND removed_at IS NULL")?
                .execute(params![actor, at.as_millis()])?
        };
        if changed == 0 {
            return Err(StoreError::NotAllowlisted(actor.to_owned()));
        }
        self.append(Draft {
            at,
            event: if add { SessionEvent::AllowlistAdded } else { SessionEvent::AllowlistRemoved }.into(),
            execution_id: None,
            session_id: None,
            state: None,
            result_sha256: None,
            detail: detail_of(&crate::event::AllowlistChanged { actor: actor.to_owned(), by: by.to_owned() }),
        })
    }

    /// Keeps an MCP session's `initialize` parameters, and forgets sessions older than
    /// [`MCP_SESSION_LIFETIME_MS`] and all but the newest [`MCP_SESSIONS_KEPT`].
    pub(crate) fn remember_mcp_session(&mut self, id: &str, initialize: &str, at: Timestamp) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO mcp_sessions (id, initialize, created_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (id) DO UPDATE SET initialize = excluded.initialize",
            )?
            .execute(params![id, initialize, at.as_millis()])?;
        self.conn
            .prepare_cached(
                "DELETE FROM mcp_sessions WHERE created_at < ?1
                    OR id IN (SELECT id FROM mcp_sessions ORDER BY created_at DESC LIMIT -1 OFFSET ?2)",
            )?
            .execute(params![at.as_millis() - MCP_SESSION_LIFETIME_MS, MCP_SESSIONS_KEPT])?;
        Ok(())
    }

    /// Binds a remembered MCP session to the agent token that opened it (once: a bound session
    /// keeps its owner).
    pub(crate) fn bind_mcp_session(&mut self, id: &str, agent: &str) -> Result<(), StoreError> {
        self.conn
            .prepare_cached("UPDATE mcp_sessions SET agent = ?2 WHERE id = ?1 AND agent IS NULL")?
            .execute([id, agent])?;
        Ok(())
    }

    pub(crate) fn forget_mcp_session(&mut self, id: &str) -> Result<(), StoreError> {
        self.conn.prepare_cached("DELETE FROM mcp_sessions WHERE id = ?1")?.execute([id])?;
        Ok(())
    }
}
