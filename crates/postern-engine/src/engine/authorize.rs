//! The approval ladder in motion: the rungs decided by `postern-core`, the person asked when a
//! rung says so (one question per run, joined by concurrent calls), every question and answer
//! journaled.

use super::*;

impl Engine {
    /// The approval ladder (docs/src/design.md): the pure decision in `postern_core::decide_ladder`,
    /// the approver asked only where it says so, one session-authorization question per run.
    pub(super) async fn authorize(
        &self,
        p: &Prepared<'_>,
        call: &Call,
        id: ExecutionId,
        admitted: bool,
        lead: Option<&Lead<'_>>,
    ) -> Result<Authorization, EngineError> {
        let decided = |allowed: bool, rung: Rung, reason: &str| Authorization {
            allowed,
            rung,
            by: "postern".into(),
            reason: reason.into(),
            grant: None,
            timed_out: false,
        };
        let mut decision = decide_ladder(self.ladder_input(p, call)?);
        // A call that waits for a person (or at the gate, for another call's question) opens its
        // answer first. An approver that decides without a person answers at once.
        if self.approver.may_block()
            && matches!(decision, LadderDecision::AskPerUse | LadderDecision::AskSessionAuthorization)
        {
            call.opening.release();
        }
        // One question per run: calls of a new run wait for the first one's answer, then see it.
        let gate = match (decision, call.session) {
            (LadderDecision::AskSessionAuthorization, Some(session)) => {
                let mut gates = self.session_gates.lock().await;
                Some(Arc::clone(gates.entry(session).or_default()))
            }
            _ => None,
        };
        let _held = match &gate {
            Some(g) => {
                let held = g.lock().await;
                decision = decide_ladder(self.ladder_input(p, call)?);
                Some(held)
            }
            None => None,
        };
        let ask = match decision {
            LadderDecision::Deny { rung: rung @ Rung::VaultLocked } => {
                return Ok(decided(false, rung, "the vault is locked"));
            }
            LadderDecision::Deny { rung } => {
                return Ok(decided(
                    false,
                    rung,
                    "this agent run was revoked or has ended; a new run must be authorized",
                ));
            }
            LadderDecision::Run { rung: rung @ Rung::Allowlist } => {
                // Recorded on the run, so the journal shows why nobody was asked.
                if let Some(session) = call.session {
                    self.grant_session(session, "allowlist", json!({ "actor": call.actor.as_str() })).await?;
                }
                return Ok(decided(true, rung, "this agent is on the allowlist"));
            }
            LadderDecision::Run { rung } => return Ok(decided(true, rung, "allowed")),
            LadderDecision::AskPerUse => Ask::PerUse,
            LadderDecision::AskSessionAuthorization => Ask::SessionAuthorization,
        };
        let body = match &p.target {
            // For SSH the "body" is the command, where it runs, and as whom.
            Target::Ssh(plan) => {
                Some(crate::approval::body_preview(ssh_shown(p, plan).as_bytes(), &p.secrets, BODY_PREVIEW_BYTES))
            }
            Target::Http(plan) => {
                plan.body.as_deref().map(|b| crate::approval::body_preview(b, &p.secrets, BODY_PREVIEW_BYTES))
            }
            // For an upstream tool the "body" is its arguments.
            Target::Mcp(plan) => serde_json::to_vec_pretty(&plan.arguments)
                .ok()
                .map(|b| crate::approval::body_preview(&b, &p.secrets, BODY_PREVIEW_BYTES)),
        };
        let request = AuthorizationRequest {
            ask,
            execution_id: id,
            session: call.session,
            tool: p.tool.name.clone(),
            actor: call.actor.as_str().to_owned(),
            agent: self.agent_run(call)?,
            method: p.method().to_owned(),
            target: p.shown_url.clone(),
            credential: credential_shown(p),
            body_preview: body.as_ref().map(|(preview, _)| preview.clone()),
            body_full: body.and_then(|(_, full)| full),
            timeout_ms: self.approval_timeout.as_millis() as u64,
            earlier_run: if admitted { self.earlier_run(id)? } else { None },
            withdrawn: Withdrawal::default(),
        };
        let rung_asked = match ask {
            Ask::PerUse => Rung::ApproveEveryUse,
            Ask::SessionAuthorization => Rung::SessionAuthorization,
        };
        let verdict = if self.approver.may_block() {
            // A person is asked: the question and the answer are records of their own (when the
            // execution is already journaled; otherwise the `authorized`/`denied` row carries it),
            // the question once it has its place in line.
            let requested = async {
                if admitted {
                    let shown = json!({ "ask": ask, "rung": rung_asked.as_str(), "shown": &request });
                    self.note(id, ActivityNote::ApprovalRequested, shown).await?;
                }
                Ok(())
            };
            let approver = Arc::clone(&self.approver);
            let asked = request.clone();
            let answer = self
                .ask_person(asker(call), request.withdrawn.clone(), requested, move || approver.authorize(&asked))
                .await?;
            let put = answer.was_put();
            let (verdict, event) = match answer {
                Asked::Answered(v) if v.allowed => (v, ActivityNote::ApprovalGranted),
                // The approver's own clock ran out first.
                Asked::Answered(v) if v.timed_out => (v, ActivityNote::ApprovalTimedOut),
                Asked::Answered(v) => (v, ActivityNote::ApprovalDenied),
                Asked::TimedOut => (
                    Authorization {
                        allowed: false,
                        rung: rung_asked,
                        by: "timeout".into(),
                        reason: format!("no reviewer answered within {} s", self.approval_timeout.as_secs()),
                        grant: None,
                        timed_out: true,
                    },
                    ActivityNote::ApprovalTimedOut,
                ),
                // The time ran out in line: like an unanswered question, not a refusal.
                Asked::OutOfTurn => (
                    Authorization {
                        allowed: false,
                        rung: rung_asked,
                        by: "postern".into(),
                        reason: not_asked_reason(self.approval_timeout),
                        grant: None,
                        timed_out: true,
                    },
                    ActivityNote::ApprovalTimedOut,
                ),
                Asked::Locked | Asked::LockedInLine => (
                    Authorization {
                        allowed: false,
                        rung: Rung::VaultLocked,
                        by: "postern".into(),
                        reason: "the vault was locked while this request waited for a reviewer".into(),
                        grant: None,
                        timed_out: false,
                    },
                    ActivityNote::ApprovalWithdrawn,
                ),
            };
            // A question never put (its time ran out in line, or the vault was locked first) has
            // no record of being asked, nor of an answer: its `denied` row says why.
            if admitted && put {
                self.note(id, event, json!({ "ask": ask, "rung": rung_asked.as_str(), "decision": &verdict })).await?;
            }
            verdict
        } else {
            self.approver.authorize(&request)
        };
        if let Some(lead) = lead {
            // Answered: a later retry is decided from the journal, not joined to this question.
            lead.close();
        }
        // A refused run stays refused: its later calls are denied without asking again. (A
        // question nobody answered, or one withdrawn by the lock, is not a refusal.)
        let refused = !verdict.allowed && !verdict.timed_out && verdict.rung != Rung::VaultLocked;
        if let (Ask::SessionAuthorization, true, Some(session)) = (ask, refused, call.session) {
            let (by, at, detail) = (verdict.by.clone(), self.now(), json!({ "reason": verdict.reason }));
            self.on_store(move |store| store.set_session_standing(session, false, &by, detail, at)).await?;
        }
        if let (Ask::SessionAuthorization, true, Some(session)) = (ask, verdict.allowed, call.session) {
            self.grant_session(session, &verdict.by, json!({ "grant": verdict.grant, "reason": verdict.reason }))
                .await?;
            if verdict.grant == Some(Grant::Always) {
                let (actor, by, at) = (call.actor.as_str().to_owned(), verdict.by.clone(), self.now());
                self.on_store(move |store| store.set_allowlisted(&actor, true, &by, at)).await?;
            }
        }
        // The run's standing is on record now: later calls read it, and the gate is not kept
        // for the life of the gateway (waiters still hold their handle and re-read the standing).
        if let (Some(_), Some(session)) = (&gate, call.session) {
            self.session_gates.lock().await.remove(&session);
        }
        Ok(verdict)
    }

    pub(super) fn ladder_input(&self, p: &Prepared<'_>, call: &Call) -> Result<LadderInput, EngineError> {
        let view = self.store.view();
        let session = match call.session {
            // A call without an agent run (`postern call`) comes from the person at the terminal.
            None => SessionStanding::Authorized,
            Some(s) => match view.session_standing(s)? {
                Some(true) => SessionStanding::Authorized,
                Some(false) => SessionStanding::Revoked,
                None => SessionStanding::New,
            },
        };
        let allowlisted = session == SessionStanding::New && view.allowlisted(call.actor.as_str())?;
        Ok(LadderInput {
            vault_locked: self.vault.is_locked()?,
            approve_every_use: p.approve_every_use(),
            session,
            actor_allowlisted: allowlisted,
        })
    }

    /// What the ladder's hard rungs say before something is sent without a question of its
    /// own (a recovery, the first contact with an unpinned host): `vault_locked`,
    /// `run_revoked_or_ended`, or nothing. The same `decide_ladder` as every call.
    pub(super) fn ladder_denies(&self, p: &Prepared<'_>, call: &Call) -> Result<Option<&'static str>, EngineError> {
        Ok(match decide_ladder(self.ladder_input(p, call)?) {
            LadderDecision::Deny { rung: Rung::VaultLocked } => Some("vault_locked"),
            LadderDecision::Deny { .. } => Some("run_revoked_or_ended"),
            _ => None,
        })
    }

    pub(super) async fn grant_session(&self, session: SessionId, by: &str, detail: Value) -> Result<(), EngineError> {
        let (by, at) = (by.to_owned(), self.now());
        self.on_store(move |store| store.set_session_standing(session, true, &by, detail, at)).await?;
        Ok(())
    }

    /// Puts a question to the person behind the approver: once `asker` has a place in line
    /// (waited for, holding no thread, for at most the approval timeout) and `before_asking`
    /// (the journal's record that it is asked) is done, on a blocking thread under the approval
    /// timeout, withdrawn at once if the vault is locked meanwhile or this future is dropped.
    /// The place is held until that thread returns, so the threads and dialogs agents can hold
    /// open are bounded ([`QUESTIONS_PER_AGENT`], [`QUESTIONS_IN_ALL`]).
    pub(super) async fn ask_person<T: Send + 'static>(
        &self,
        asker: questions::Asker,
        withdrawn: Withdrawal,
        before_asking: impl std::future::Future<Output = Result<(), EngineError>>,
        ask: impl FnOnce() -> T + Send + 'static,
    ) -> Result<Asked<T>, EngineError> {
        // However this ends (an answer aside), the question is withdrawn: a dialog does not
        // stay open, holding its place, for a call nobody waits for.
        let withdraw = WithdrawUnlessAnswered { withdrawn, answered: false };
        let turn = {
            let waiting = self.questions.turn(asker);
            tokio::pin!(waiting);
            let in_line = tokio::time::sleep(self.approval_timeout);
            tokio::pin!(in_line);
            let mut lock_check = tokio::time::interval(LOCK_CHECK_INTERVAL);
            loop {
                tokio::select! {
                    turn = &mut waiting => break turn,
                    () = &mut in_line => return Ok(Asked::OutOfTurn),
                    _ = lock_check.tick() => if self.vault.is_locked()? { return Ok(Asked::LockedInLine) },
                }
            }
        };
        before_asking.await?;
        let mut answer = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            ask()
        });
        let deadline = tokio::time::sleep(self.approval_timeout);
        tokio::pin!(deadline);
        let mut lock_check = tokio::time::interval(LOCK_CHECK_INTERVAL);
        let mut withdraw = withdraw;
        let asked = loop {
            tokio::select! {
                joined = &mut answer => {
                    withdraw.answered = true;
                    break Asked::Answered(joined.map_err(|e| EngineError::Internal(e.to_string()))?);
                }
                () = &mut deadline => break Asked::TimedOut,
                _ = lock_check.tick() => if self.vault.is_locked()? { break Asked::Locked },
            }
        };
        drop(withdraw);
        self.touch();
        Ok(asked)
    }

    /// The earlier execution of the same effect in another run that execution `id`'s `accepted`
    /// row names, if any.
    fn earlier_run(&self, id: ExecutionId) -> Result<Option<crate::approval::EarlierRun>, EngineError> {
        let timeline = self.store.view().timeline(id)?;
        let accepted = timeline.iter().find(|e| e.row.event == Event::Step(ExecutionState::Accepted));
        // An `earlier_effect` that does not read is an error, not "no earlier run": a reviewer
        // would otherwise be told less than the record says.
        let earlier = accepted.and_then(|e| e.row.detail.get("earlier_effect")).filter(|v| !v.is_null());
        Ok(earlier.map(|v| serde_json::from_value(v.clone()).map_err(super::UnreadableDetail::from)).transpose()?)
    }

    /// The agent run behind a call, as a reviewer is shown it.
    pub(super) fn agent_run(&self, call: &Call) -> Result<Option<AgentRun>, EngineError> {
        let Some(session) = call.session else { return Ok(None) };
        let Some(run) = self.store.view().session(session)? else { return Ok(None) };
        let actor = postern_core::Actor::from_recorded(run.actor.as_str());
        let (executable, sha256) = match actor.process_parts() {
            Some((exe, hash)) => (exe.to_owned(), hash.to_owned()),
            None => (run.actor.clone(), String::new()),
        };
        Ok(Some(AgentRun {
            executable,
            sha256,
            pid: run.pid,
            process_started_at: run
                .process_start
                .and_then(|t| u64::try_from(t).ok())
                .and_then(crate::approval::process_started_at_ms),
            transport: run.transport,
            client: run.client,
        }))
    }

    pub(super) async fn authorize_and_run(
        &self,
        p: &Prepared<'_>,
        call: &Call,
        id: ExecutionId,
        decision: Decision,
        attached: bool,
        lead: Option<&Lead<'_>>,
    ) -> Result<CallOutcome, EngineError> {
        let verdict = self.authorize(p, call, id, true, lead).await?;
        let detail = verdict_detail(&verdict);
        if !verdict.allowed {
            self.transition(id, ExecutionState::Denied, detail.clone()).await?;
            return Ok(self.outcome(id, ExecutionState::Denied, decision).attached_if(attached).because(detail));
        }
        if call.cancel.withdrawn() {
            let steps =
                vec![(ExecutionState::Authorized, detail), (ExecutionState::FailedBeforeDispatch, cancelled_detail())];
            self.store.transition_steps_async(id, stored(steps), self.now()).await?;
            return Ok(self
                .outcome(id, ExecutionState::FailedBeforeDispatch, decision)
                .attached_if(attached)
                .because(cancelled_detail()));
        }
        // `authorized` and `dispatched` are journaled together, in one fsync.
        self.dispatch_after(p, id, decision, attached, vec![(ExecutionState::Authorized, detail)], Attempt::First).await
    }
}

fn ssh_shown(p: &Prepared<'_>, plan: &SshPlan) -> String {
    let command = p.shown_command(plan);
    match &plan.working_dir {
        Some(dir) => format!("$ cd {dir} && {command}"),
        None => format!("$ {command}"),
    }
}

/// Withdraws a question when dropped, unless it was answered.
struct WithdrawUnlessAnswered {
    withdrawn: Withdrawal,
    answered: bool,
}

impl Drop for WithdrawUnlessAnswered {
    fn drop(&mut self) {
        if !self.answered {
            self.withdrawn.withdraw();
        }
    }
}

/// Whose line a call's question waits in: its agent's.
pub(super) fn asker(call: &Call) -> questions::Asker {
    questions::Asker(call.actor.as_str().to_owned())
}

/// Why a question that never reached a person was denied.
pub(super) fn not_asked_reason(timeout: Duration) -> String {
    format!(
        "not put to a reviewer: the places in line stayed taken for the whole approval timeout ({} s) by this \
         agent's other questions ({QUESTIONS_PER_AGENT} open at a time per agent) or by all agents' ({QUESTIONS_IN_ALL} in \
         all, or as many as the approver shows at once); nothing was shown and nothing was sent",
        timeout.as_secs()
    )
}

/// How often an open question checks whether the vault was locked (then it is withdrawn).
const LOCK_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// How much of a request body a reviewer is shown.
const BODY_PREVIEW_BYTES: usize = 2048;
