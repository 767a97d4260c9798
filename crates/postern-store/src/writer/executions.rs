//! The writer's SQL for executions: admission (retry lookup and acceptance in one transaction),
//! lifecycle transitions and results, read-only executions in one step, crash recovery.

use super::*;

impl Writer {
    /// Keeps the state of a live execution in memory; finished ones are dropped, and the cache is
    /// bounded (a miss only costs one read).
    pub(crate) fn remember(&mut self, id: ExecutionId, state: ExecutionState, session: Option<SessionId>) {
        // A cache marked stale is emptied before anything is put in it (what goes in is known
        // fresh; what was there is not).
        if self.cache_invalid {
            self.states.clear();
            self.cache_invalid = false;
        }
        if state.is_terminal() {
            self.states.remove(&id);
            return;
        }
        if self.states.len() >= 65_536 {
            self.states.clear();
        }
        self.states.insert(id, (state, session));
    }

    /// The prior execution a new one would be a retry of, read from the chain: the newest
    /// `accepted` row with the same fingerprint, actor and intent scope (its contract, when it was
    /// accepted), and that execution's last state row — never from the `executions` projection,
    /// which another process could edit.
    pub(crate) fn find_prior(&mut self, new: &NewExecution) -> Result<Option<PriorExecution>, StoreError> {
        let found = self
            .conn
            .prepare_cached(crate::view::PRIOR_ACCEPTED)?
            .query_row(params![new.fingerprint.to_string(), new.actor.as_str(), new.intent_scope.as_str()], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?))
            })
            .optional()?;
        let Some((id, accepted_at, contract)) = found else {
            return Ok(None);
        };
        let state: String = self
            .conn
            .prepare_cached(crate::view::LAST_STATE)?
            .query_row([&id], |r| r.get(0))
            .optional()?
            .ok_or_else(|| StoreError::Corrupt(format!("execution {id} has an accepted row and no state")))?;
        Ok(Some(PriorExecution {
            id: id.parse().map_err(|e| StoreError::Corrupt(format!("journal execution_id {id:?}: {e}")))?,
            fingerprint: new.fingerprint,
            actor: Actor::from_recorded(new.actor.as_str()),
            intent_scope: IntentScope::from_recorded(new.intent_scope.as_str()),
            state: state.parse().map_err(|e| StoreError::Corrupt(format!("execution {id}: {e}")))?,
            accepted_at: Timestamp::from_millis(accepted_at),
            contract: serde_json::from_str::<ReplayContract>(&contract)
                .map_err(|e| StoreError::Corrupt(format!("execution {id}: contract: {e}")))?,
        }))
    }

    /// The newest execution of the same effect by the same actor in another intent scope, as
    /// the accepted row names it: its id, scope, acceptance time and state now.
    fn earlier_effect(
        &mut self,
        effect: &postern_core::Fingerprint,
        actor: &Actor,
        scope: &IntentScope,
    ) -> Result<Option<Value>, StoreError> {
        let found = self
            .conn
            .prepare_cached(crate::view::EARLIER_EFFECT)?
            .query_row(params![effect.to_string(), actor.as_str(), scope.as_str()], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?))
            })
            .optional()?;
        let Some((id, at, earlier_scope)) = found else { return Ok(None) };
        let state: Option<String> =
            self.conn.prepare_cached(crate::view::LAST_STATE)?.query_row([&id], |r| r.get(0)).optional()?;
        Ok(Some(json!({ "execution_id": id, "intent_scope": earlier_scope, "accepted_at": at, "state": state })))
    }

    pub(crate) fn admit(&mut self, new: &NewExecution) -> Result<Admission, StoreError> {
        self.admit_with(new, None, &[], None)
    }

    /// Admission; with `anew` (a reviewer's "dispatch anew" for a retry), retry matching is
    /// skipped and `anew` is recorded on the `accepted` row. `folded` are steps taken at
    /// acceptance with nothing waiting between them (a read-only call's `authorized` and
    /// `dispatched`): each checked by the state machine and recorded on the `accepted` row itself
    /// ([`crate::journal::FOLDED_STEPS`]), whose state is then the last of them. `ends` is where
    /// the same transaction will take the execution next (a read-only lifecycle written at once):
    /// the `executions` row is inserted with that state and time, instead of updated after.
    pub(crate) fn admit_with(
        &mut self,
        new: &NewExecution,
        anew: Option<&Value>,
        folded: &[crate::Step],
        ends: Option<(ExecutionState, Timestamp)>,
    ) -> Result<Admission, StoreError> {
        // Nothing is decided while what grants authority differs from the journal.
        if let Some(found) = self.alarmed() {
            return Err(StoreError::AuthorityTampered(found));
        }
        // A read-only call is never a retry of anything (a retry of a read re-reads), so its
        // admission does not look for a prior: one index probe and, for a read repeated with the
        // same arguments, two row reads less per call on the single writer.
        let read_only = new.contract.class == postern_core::ReplayClass::ReadOnly;
        let prior = if anew.is_some() || read_only { None } else { self.find_prior(new)? };
        let incoming =
            IncomingIntent { fingerprint: &new.fingerprint, actor: &new.actor, intent_scope: &new.intent_scope };
        let decision = decide_retry(prior.as_ref(), &incoming, new.at);
        if let (Some(prior), false) = (prior.as_ref(), decision == RetryDecision::NewExecution) {
            let session_id = self.execution_session(prior.id)?;
            self.append(Draft {
                at: new.at,
                event: ActivityNote::RetryReceived.into(),
                execution_id: Some(prior.id),
                session_id,
                state: Some(prior.state),
                result_sha256: None,
                detail: json!({
                    "decision": decision,
                    "correlation": with_unsafe_integers_as_strings(&new.correlation),
                    "fingerprint": new.fingerprint,
                    "attempted_execution_id": new.id,
                }),
            })?;
            return Ok(Admission::Matched { prior: prior.clone(), decision });
        }
        let contract = serde_json::to_string(&new.contract).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let record = serde_json::to_string(&new.record).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let fingerprint = new.fingerprint.to_string();
        // The row says where the folded steps left the execution, as the journal row does: a
        // reader of the table (the state cache after a reset included) never sees `accepted`
        // for an execution whose journal already says `dispatched`.
        let state = ExecutionState::Accepted.walk(folded.iter().map(|step| step.state))?;
        let (row_state, updated_at) = ends.unwrap_or((state, folded.last().map_or(new.at, |step| step.at)));
        let dispatched_at = folded.iter().find(|step| step.state == ExecutionState::Dispatched).map(|step| step.at);
        let inserted = self
            .conn
            .prepare_cached(
                "INSERT INTO executions (id, fingerprint, actor, intent_scope, session_id, tool, channel, state,
                                         accepted_at, updated_at, first_dispatched_at, contract, record)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
                 ON CONFLICT (id) DO NOTHING",
            )?
            .execute(params![
                new.id.to_string(),
                &fingerprint,
                new.actor.as_str(),
                new.intent_scope.as_str(),
                new.session_id.map(|s| s.to_string()),
                new.tool,
                new.channel.as_str(),
                row_state.as_str(),
                new.at.as_millis(),
                updated_at.as_millis(),
                dispatched_at.map(Timestamp::as_millis),
                contract,
                record,
            ])?;
        if inserted == 0 {
            return Err(StoreError::DuplicateExecution(new.id));
        }
        self.remember(new.id, state, new.session_id);
        let mut detail = json!({
            "tool": new.tool,
            "channel": new.channel,
            "actor": new.actor,
            "intent_scope": new.intent_scope,
            "contract": new.contract,
        });
        // Values already in hand go in as they are: `json!` would copy each through serde again
        // (the record and the folded steps' details were ~5% of the writer's time per read).
        detail["fingerprint"] = Value::String(fingerprint);
        detail["record"] = new.record.clone();
        detail["correlation"] = with_unsafe_integers_as_strings(&new.correlation);
        if let Some(prior) = &prior {
            // A related execution exists but does not attach (outside its window, delivered, …):
            // say so, so a reviewer can see why this was treated as a new intent.
            detail["related_prior"] = json!({"execution_id": prior.id, "state": prior.state});
        }
        if let Some(effect) = &new.effect_fingerprint {
            detail["effect_fingerprint"] = json!(effect);
            // The same effect asked for in another run (a restarted agent's repeat): named, not
            // matched — a new run is a new intent, but a reviewer and the incident record see it.
            if let Some(earlier) = self.earlier_effect(effect, &new.actor, &new.intent_scope)? {
                detail["earlier_effect"] = earlier;
            }
        }
        if let Some(anew) = anew {
            detail["dispatched_anew"] = anew.clone();
        }
        if !folded.is_empty() {
            detail[crate::journal::FOLDED_STEPS] = folded
                .iter()
                .map(|step| {
                    let mut folded = json!({ "state": step.state, "at": step.at });
                    folded["detail"] = step.detail.clone();
                    folded
                })
                .collect();
        }
        self.append(Draft {
            at: new.at,
            event: ExecutionState::Accepted.into(),
            execution_id: Some(new.id),
            session_id: new.session_id,
            state: Some(state),
            result_sha256: None,
            detail,
        })?;
        Ok(Admission::Accepted { id: new.id })
    }

    pub(crate) fn execution_session(&mut self, id: ExecutionId) -> Result<Option<SessionId>, StoreError> {
        Ok(self.execution_state(id)?.1)
    }

    pub(crate) fn execution_state(
        &mut self,
        id: ExecutionId,
    ) -> Result<(ExecutionState, Option<SessionId>), StoreError> {
        if self.cache_invalid {
            self.states.clear();
            self.cache_invalid = false;
        }
        if let Some(cached) = self.states.get(&id) {
            return Ok(*cached);
        }
        let (state, session): (String, Option<String>) = self
            .conn
            .prepare_cached("SELECT state, session_id FROM executions WHERE id = ?1")?
            .query_row([id.to_string()], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?
            .ok_or(StoreError::UnknownExecution(id))?;
        let state = state.parse().map_err(|e| StoreError::Corrupt(format!("execution {id}: {e}")))?;
        let session = session
            .map(|s| s.parse().map_err(|e| StoreError::Corrupt(format!("execution {id}: session: {e}"))))
            .transpose()?;
        Ok((state, session))
    }

    pub(crate) fn transition(
        &mut self,
        id: ExecutionId,
        to: ExecutionState,
        detail: Value,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        self.transition_with_result(id, to, detail, at, None)
    }

    /// An event about an execution that does not change its state (e.g. `cancel_requested`
    /// after dispatch): evidence in the chain, the state column unchanged.
    pub(crate) fn note(
        &mut self,
        id: ExecutionId,
        event: ActivityNote,
        detail: Value,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        let (state, session_id) = self.execution_state(id)?;
        self.append(Draft {
            at,
            event: event.into(),
            execution_id: Some(id),
            session_id,
            state: Some(state),
            result_sha256: None,
            detail,
        })
    }

    pub(crate) fn transition_with_result(
        &mut self,
        id: ExecutionId,
        to: ExecutionState,
        detail: Value,
        at: Timestamp,
        result_sha256: Option<String>,
    ) -> Result<JournalEntry, StoreError> {
        let entry = self.journal_step(id, to, detail, at, result_sha256)?;
        self.conn
            .prepare_cached(
                "UPDATE executions SET state = ?2, updated_at = ?3,
                        first_dispatched_at = COALESCE(first_dispatched_at, CASE WHEN ?2 = 'dispatched' THEN ?3 END)
                 WHERE id = ?1",
            )?
            .execute(params![id.to_string(), to.as_str(), at.as_millis()])?;
        Ok(entry)
    }

    /// The journal row of a step the state machine allows, without touching the executions row
    /// (the caller stores the state: per step, or once for a whole read-only lifecycle).
    fn journal_step(
        &mut self,
        id: ExecutionId,
        to: ExecutionState,
        detail: Value,
        at: Timestamp,
        result_sha256: Option<String>,
    ) -> Result<JournalEntry, StoreError> {
        let (from, session_id) = self.execution_state(id)?;
        let next = from.transition(to)?;
        self.remember(id, next, session_id);
        self.append(Draft {
            at,
            event: next.into(),
            execution_id: Some(id),
            session_id,
            state: Some(next),
            result_sha256,
            detail,
        })
    }

    pub(crate) fn complete(&mut self, id: ExecutionId, completion: &Completion) -> Result<JournalEntry, StoreError> {
        let (sha, detail) = completion_row(completion);
        let entry =
            self.transition_with_result(id, ExecutionState::Completed, detail, completion.at, Some(sha.clone()))?;
        self.store_result(id, &entry, completion, sha)?;
        Ok(entry)
    }

    fn store_result(
        &mut self,
        id: ExecutionId,
        entry: &JournalEntry,
        completion: &Completion,
        sha: String,
    ) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO results (execution_id, journal_seq, recorded_at, sha256, body) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![id.to_string(), entry.row.seq as i64, completion.at.as_millis(), sha, completion.result])?;
        Ok(())
    }

    pub(crate) fn steps(
        &mut self,
        id: ExecutionId,
        steps: &[(ExecutionState, Value)],
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        let mut last = None;
        for (state, detail) in steps {
            last = Some(self.transition(id, *state, detail.clone(), at)?);
        }
        last.ok_or_else(|| StoreError::Corrupt("no steps to journal".into()))
    }

    pub(crate) fn admit_and_start(
        &mut self,
        new: &NewExecution,
        steps: &[(ExecutionState, Value)],
    ) -> Result<Admission, StoreError> {
        let admission = self.admit(new)?;
        if let Admission::Accepted { id } = admission
            && !steps.is_empty()
        {
            self.steps(id, steps, new.at)?;
        }
        Ok(admission)
    }

    pub(crate) fn admit_anew(
        &mut self,
        new: &NewExecution,
        anew: &Value,
        steps: &[(ExecutionState, Value)],
    ) -> Result<JournalEntry, StoreError> {
        let Admission::Accepted { id } = self.admit_with(new, Some(anew), &[], None)? else {
            return Err(StoreError::Corrupt("an admission without matching matched a prior".into()));
        };
        self.steps(id, steps, new.at)
    }

    /// A read-only execution's whole lifecycle in one operation, in as few rows as say it: the
    /// steps up to its dispatch folded into its `accepted` row, then its outcome (`completed` with
    /// the result, or another outcome) in a row of its own. A denial stays two rows (`accepted`,
    /// `denied`). Every step is checked by the state machine; the executions row is written once,
    /// inserted with where the lifecycle ended (a step the state machine refuses rolls the whole
    /// operation back).
    pub(crate) fn read_only(
        &mut self,
        new: &NewExecution,
        steps: &[crate::Step],
        completion: Option<&Completion>,
    ) -> Result<(), StoreError> {
        if steps.is_empty() && completion.is_none() {
            return Err(StoreError::Corrupt("no steps to journal".into()));
        }
        // The whole lifecycle is checked before anything is written: the row is inserted where
        // it ends, so a step after a terminal state must never be checked against the row.
        let completed = completion.map(|_| ExecutionState::Completed);
        let end = ExecutionState::Accepted.walk(steps.iter().map(|step| step.state).chain(completed))?;
        let ended_at = completion.map(|c| c.at).or(steps.last().map(|step| step.at)).unwrap_or(new.at);
        let sent = steps.iter().position(|step| step.state == ExecutionState::Dispatched).map_or(0, |i| i + 1);
        let (folded, after) = steps.split_at(sent);
        match self.admit_with(new, None, folded, Some((end, ended_at)))? {
            Admission::Accepted { .. } => {}
            Admission::Matched { .. } => {
                return Err(StoreError::Corrupt(
                    "a read-only execution matched a prior; read-only calls never attach".into(),
                ));
            }
        }
        for step in after {
            self.journal_step(new.id, step.state, step.detail.clone(), step.at, None)?;
        }
        if let Some(completion) = completion {
            let (sha, detail) = completion_row(completion);
            let entry =
                self.journal_step(new.id, ExecutionState::Completed, detail, completion.at, Some(sha.clone()))?;
            self.store_result(new.id, &entry, completion, sha)?;
        }
        Ok(())
    }

    /// What the last process left unsettled, in one pass over the executions: a dispatch with no
    /// observed outcome becomes `outcome_unknown`; a side-effecting result whose delivery was
    /// never confirmed becomes `completed_result_not_delivered` (whether the agent saw it is
    /// uncertain, and uncertain resolves to "not delivered"). Read-only executions are never
    /// tracked for delivery and are left as they are.
    pub(crate) fn recover(&mut self, now: Timestamp) -> Result<Recovery, StoreError> {
        let unsettled: Vec<(String, String, Option<i64>)> = self
            .conn
            .prepare_cached(
                "SELECT id, state, first_dispatched_at FROM executions
                 WHERE state = 'dispatched'
                    OR (state = 'completed' AND json_extract(contract, '$.class') <> 'read_only')
                 ORDER BY id",
            )?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<Result<_, _>>()?;
        let mut recovery = Recovery::default();
        for (id, state, dispatched_at) in unsettled {
            let id: ExecutionId = id.parse().map_err(|e| StoreError::Corrupt(format!("executions.id: {e}")))?;
            if state == "dispatched" {
                self.transition(
                    id,
                    ExecutionState::OutcomeUnknown,
                    json!({
                        "reason": "gateway_restarted_while_dispatched",
                        "explanation": "Postern stopped while this action was dispatched; bytes may have reached the target and no outcome was observed.",
                        "first_dispatched_at": dispatched_at,
                    }),
                    now,
                )?;
                recovery.outcome_unknown.push(id);
            } else {
                self.transition(
                    id,
                    ExecutionState::CompletedResultNotDelivered,
                    json!({
                        "reason": "gateway_restarted_before_delivery",
                        "explanation": "Postern stopped after this action completed and before the agent confirmed \
                                        receiving the result; a retry is answered with the stored result.",
                    }),
                    now,
                )?;
                recovery.undelivered.push(id);
            }
        }
        Ok(recovery)
    }
}

/// The digest and detail of a `completed` row.
fn completion_row(completion: &Completion) -> (String, Value) {
    let sha = hex::encode(Sha256::digest(&completion.result));
    (sha, json!({ "outcome": completion.outcome, "result_bytes": completion.result.len() }))
}
