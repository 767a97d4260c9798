//! Sending: the wire request built (credential injected, marker wrapped), `dispatched` made
//! durable first, the outcome observed and classified, and journaled before the answer.

use super::*;
use crate::channel::upstream::UpstreamSent;

impl Engine {
    /// A read-only call: authorized in memory, sent, then journaled as a whole in one
    /// transaction that does not wait for the disk (a retry of a read is harmless).
    pub(super) async fn read_only(
        &self,
        p: &Prepared<'_>,
        call: &Call,
        new: NewExecution,
    ) -> Result<CallOutcome, EngineError> {
        let id = new.id;
        let verdict = self.authorize(p, call, id, false, None).await?;
        let auth = verdict_detail(&verdict);
        let step = |state, detail: StepDetail, at| postern_store::Step { state, detail: detail.into(), at };
        if !verdict.allowed {
            let denied = step(ExecutionState::Denied, auth.clone(), self.now());
            self.store.record_read_only_detached(new, vec![denied], None)?;
            return Ok(self.outcome(id, ExecutionState::Denied, Decision::NewExecution).because(auth));
        }
        let authorized = step(ExecutionState::Authorized, auth, self.now());
        let out = self.outgoing(p, id)?;
        let secrets = self.call_secrets(p, Some(&out));
        let dispatched =
            StepDetail { target: Some(p.shown_url.clone()), method: Some(p.method().to_owned()), ..Default::default() };
        let mut steps = vec![authorized, step(ExecutionState::Dispatched, dispatched, self.now())];
        let observed = self.send(p, out, Attempt::First).await?;
        let state = observed.state;
        let staged = self.stage(&secrets, observed)?;
        if staged.completion.is_none() {
            steps.push(step(state, staged.detail.clone(), self.now()));
        }
        self.store.record_read_only_detached(new, steps, staged.completion)?;
        Ok(CallOutcome {
            read_only: true,
            ..self.outcome(id, state, Decision::NewExecution).answered(staged.answer).because(staged.detail)
        })
    }

    /// What goes out for execution `id`: the HTTP request with its credential and idempotency
    /// key, or the SSH command (wrapped in the marker protocol for `ssh_marker` tools) with the
    /// host's key.
    pub(super) fn outgoing(&self, p: &Prepared<'_>, id: ExecutionId) -> Result<Wire, EngineError> {
        let plan = match &p.target {
            Target::Http(plan) => plan,
            Target::Ssh(plan) => return self.outgoing_ssh(p, plan, id),
            Target::Mcp(plan) => {
                let mut arguments = plan.arguments.clone();
                if let Some(argument) = &p.tool.contract.idempotency_argument {
                    arguments.insert(argument.clone(), json!(id.to_string()));
                }
                return Ok(Wire::Mcp(McpOutgoing {
                    server: plan.server.clone(),
                    tool: plan.tool.clone(),
                    operation: plan.operation,
                    arguments,
                    execution: id.to_string(),
                    timeout: p.tool.timeout,
                }));
            }
        };
        let credential = match &plan.credential {
            None => None,
            Some(c) => Some(http::InjectedCredential::new(&c.kind, self.vault.secret_of(c)?)),
        };
        Ok(Wire::Http(Outgoing {
            method: plan.method.clone(),
            url: plan.url.clone(),
            headers: plan.headers.clone(),
            body: plan.body.clone(),
            credential,
            idempotency: p.tool.contract.idempotency_header.clone().map(|h| (h, id.to_string())),
            timeout: p.tool.timeout,
        }))
    }

    /// The SSH command (wrapped in the marker protocol for `ssh_marker` tools) with the host's key.
    fn outgoing_ssh(&self, p: &Prepared<'_>, plan: &SshPlan, id: ExecutionId) -> Result<Wire, EngineError> {
        let (epoch, (key, passphrase)) =
            read_under_epoch(|| self.store.vault_epoch(), || self.vault.ssh_key_of(&plan.host))?;
        let marker = p.tool.contract.class == postern_core::ReplayClass::SshMarker;
        let command = if marker {
            crate::channel::ssh::marker_command(&plan.host.marker_root, id, plan.working_dir.as_deref(), &plan.command)
        } else {
            crate::channel::ssh::plain_command(id, plan.working_dir.as_deref(), &plan.command)
        };
        let kill = crate::channel::ssh::kill_command(marker.then_some(plan.host.marker_root.as_str()), id);
        Ok(Wire::Ssh(SshOutgoing {
            host: plan.host.clone(),
            key,
            passphrase,
            epoch,
            command,
            kill,
            timeout: p.tool.timeout,
            marker,
        }))
    }

    /// Runs an SSH command on a kept connection to its host, or a new one.
    async fn ssh_send(&self, out: SshOutgoing) -> crate::channel::ssh::SshSent {
        let job = crate::channel::ssh_pool::SshJob {
            host: &out.host,
            key: &out.key,
            passphrase: out.passphrase.as_ref(),
            command: &out.command,
            timeout: out.timeout,
            cap: self.max_result_bytes,
            kill: Some(&out.kill),
        };
        self.ssh.exec(job, out.epoch).await
    }

    /// Sends what `outgoing` built and maps what happened to a state (one mapping per channel).
    /// The SSH and upstream sends are boxed: each holds ~7 KB of state, which inline made every
    /// call's future that large, an HTTP read's included, and was copied whenever it moved.
    pub(super) async fn send(
        &self,
        p: &Prepared<'_>,
        wire: Wire,
        attempt: Attempt,
    ) -> Result<Observation, EngineError> {
        match wire {
            Wire::Http(out) => self.observe(p, http::send(&self.http, out, self.max_result_bytes).await, attempt),
            Wire::Ssh(out) => self.observe_ssh(p, Box::pin(self.ssh_send(out)).await),
            Wire::Mcp(out) => {
                let sent = match &self.upstreams {
                    Some(u) => {
                        Box::pin(u.call(
                            &out.server,
                            &out.tool,
                            out.operation,
                            out.arguments,
                            &out.execution,
                            out.timeout,
                        ))
                        .await
                    }
                    None => UpstreamSent::NotSent { reason: "this gateway runs no upstream MCP servers".into() },
                };
                self.observe_mcp(p, sent)
            }
        }
    }

    /// What a forwarded `tools/call` observed: never written → failed before dispatch; an
    /// answer (a tool result, even `isError`, or a JSON-RPC error) → completed; written and then
    /// lost → outcome unknown, recovered by the tool's contract.
    fn observe_mcp(&self, p: &Prepared<'_>, sent: UpstreamSent) -> Result<Observation, EngineError> {
        let over_limit = matches!(sent, UpstreamSent::TooLarge(_));
        Ok(match sent {
            UpstreamSent::NotSent { reason } => Observation::without_result(
                ExecutionState::FailedBeforeDispatch,
                StepDetail::because(reason).code("upstream_unavailable"),
            ),
            UpstreamSent::SignInNeeded { reason } => Observation::without_result(
                ExecutionState::FailedBeforeDispatch,
                StepDetail::because(reason).code("oauth_login_required"),
            ),
            UpstreamSent::Lost { reason } => Observation::without_result(
                ExecutionState::OutcomeUnknown,
                StepDetail::because(reason).recovery(p.tool.contract.class.as_str()),
            ),
            UpstreamSent::Answered(answer) | UpstreamSent::TooLarge(answer) => {
                let outcome = json!({ "server": answer.server, "tool": answer.tool, "is_error": answer.is_error });
                Observation { over_limit, ..Observation::completed(Raw::Upstream(answer), outcome) }
            }
        })
    }

    pub(super) fn observe_ssh(
        &self,
        p: &Prepared<'_>,
        sent: crate::channel::ssh::SshSent,
    ) -> Result<Observation, EngineError> {
        use crate::channel::ssh::SshSent;
        Ok(match sent {
            SshSent::Finished { result, .. }
                if result.exit_status == Some(125) && result.stderr.contains("postern-marker: exists") =>
            {
                // Someone already created this execution's marker: it ran (or runs) elsewhere.
                Observation::without_result(
                    ExecutionState::OutcomeUnknown,
                    StepDetail::because("the execution's marker already exists on the host").recovery("ssh_marker"),
                )
            }
            // Timed out, or the channel closed without an exit status: the command may have run
            // to any point. Unknown, not completed; the marker (or a reviewer) decides.
            SshSent::Finished { result, elapsed } if result.exit_status.is_none() && result.exit_signal.is_none() => {
                Observation::without_result(
                    ExecutionState::OutcomeUnknown,
                    StepDetail::because(if result.timed_out.is_some() {
                        "ssh_timed_out"
                    } else {
                        "ssh_no_exit_status"
                    })
                    .with("explanation", "the remote command gave no exit status; it may have run partly or entirely")
                    .with("exit_signal", &result.exit_signal)
                    .with("timed_out", result.timed_out)
                    .with("elapsed_ms", elapsed.as_millis() as u64)
                    .recovery(p.tool.contract.class.as_str()),
                )
            }
            SshSent::Finished { result, elapsed } => {
                let outcome = json!({ "exit_status": result.exit_status, "exit_signal": result.exit_signal,
                                      "timed_out": result.timed_out, "elapsed_ms": elapsed.as_millis() as u64 });
                Observation::completed(Raw::Ssh(result), outcome)
            }
            SshSent::NotSent { code, reason } => Observation::without_result(
                ExecutionState::FailedBeforeDispatch,
                StepDetail::because(reason).code(code),
            ),
            SshSent::Unknown { reason } => Observation::without_result(
                ExecutionState::OutcomeUnknown,
                StepDetail::because(reason).recovery(p.tool.contract.class.as_str()),
            ),
        })
    }

    pub(super) async fn dispatch(
        &self,
        p: &Prepared<'_>,
        id: ExecutionId,
        decision: Decision,
        attached: bool,
    ) -> Result<CallOutcome, EngineError> {
        self.dispatch_after(p, id, decision, attached, vec![], Attempt::First).await
    }

    /// Journals `before` and `dispatched` durably in one transaction, then sends, then journals
    /// what was observed.
    pub(super) async fn dispatch_after(
        &self,
        p: &Prepared<'_>,
        id: ExecutionId,
        decision: Decision,
        attached: bool,
        mut before: Vec<(ExecutionState, StepDetail)>,
        attempt: Attempt,
    ) -> Result<CallOutcome, EngineError> {
        let out = match self.outgoing(p, id) {
            Ok(out) => out,
            Err(EngineError::Vault(e @ VaultError::Locked)) if attempt == Attempt::SameKeyResend => {
                // Locked before a recovery re-send: nothing more was sent, the first attempt's
                // outcome is as unknown as before.
                let detail = StepDetail::because("vault_locked").message(e.to_string()).not_resent();
                self.note(id, ActivityNote::RecoveryRefused, detail.to_value()).await?;
                return Ok(self
                    .outcome(id, ExecutionState::OutcomeUnknown, decision)
                    .attached_if(attached)
                    .because(detail));
            }
            Err(EngineError::Vault(e @ VaultError::Locked)) => {
                // Locked between authorization and dispatch: nothing was sent.
                let detail = StepDetail::because("vault_locked").message(e.to_string());
                before.push((ExecutionState::FailedBeforeDispatch, detail.clone()));
                self.store.transition_steps_async(id, stored(before), self.now()).await?;
                return Ok(self
                    .outcome(id, ExecutionState::FailedBeforeDispatch, decision)
                    .attached_if(attached)
                    .because(detail));
            }
            Err(e) => return Err(e),
        };
        if attempt == Attempt::SameKeyResend
            && let Some(why) = self.not_the_original_request(id, &out)?
        {
            let detail = StepDetail::because("request_changed").with("explanation", why).not_resent();
            self.note(id, ActivityNote::RecoveryRefused, detail.into()).await?;
            return self.review(id, ExecutionState::OutcomeUnknown, why, decision).await;
        }
        before.push((ExecutionState::Dispatched, dispatched_detail(p, &out, &self.key)));
        self.store.transition_steps_async(id, stored(before), self.now()).await?;
        self.send_and_observe(p, id, out, decision, attached, attempt).await
    }

    /// Why a recovery re-send of execution `id` must not send `out`: `None` when `out` is
    /// exactly the request last sent under its key (its digest is the one journaled with the
    /// latest `dispatched`). A retry is rendered from its own arguments and today's tool: an
    /// argument outside the fingerprint, or a template edited since, would go out under the
    /// original's key as a different request.
    fn not_the_original_request(&self, id: ExecutionId, out: &Wire) -> Result<Option<&'static str>, EngineError> {
        // The latest request sent under the key (a status route's "never received" lets the same
        // execution be sent again, and that request is then the one the target may hold).
        let timeline = self.store.view().timeline(id)?;
        let last = timeline.iter().rev().find(|e| e.row.event == Event::Step(ExecutionState::Dispatched));
        let recorded = last.map(|e| StepDetail::read(&e.row.detail)).transpose()?.and_then(|d| d.request_digest);
        Ok(match recorded {
            Some(digest) if digest == out.digest(&self.key) => None,
            Some(_) => Some(
                "the request this retry would send is not the one the first attempt sent under this key (an \
                 argument outside the fingerprint, or the tool's template, changed since); Postern re-sends only \
                 the original request",
            ),
            None => Some("the first attempt's request is not on record, so Postern cannot re-send exactly it"),
        })
    }

    /// Sends a request whose `dispatched` row is already durable, and journals what happened.
    pub(super) async fn send_and_observe(
        &self,
        p: &Prepared<'_>,
        id: ExecutionId,
        out: Wire,
        decision: Decision,
        attached: bool,
        attempt: Attempt,
    ) -> Result<CallOutcome, EngineError> {
        postern_store::crash::point("engine::dispatched::before_send");
        let secrets = self.call_secrets(p, Some(&out));
        let mut observed = self.send(p, out, attempt).await?;
        if attempt == Attempt::SameKeyResend && observed.state == ExecutionState::FailedBeforeDispatch {
            // A recovery re-send that never left says nothing about the first attempt: its outcome
            // stays unknown. (Ending it as "never dispatched" would let the next matching call
            // become a new execution, with a new key: the duplicate this record exists to stop.)
            observed.state = ExecutionState::OutcomeUnknown;
            observed.detail = StepDetail::because("recovery_resend_not_sent")
                .with(
                    "explanation",
                    "the recovery re-send could not be sent; the first attempt's outcome is still unknown — retry later",
                )
                .with("resend", &observed.detail)
                .recovery(p.tool.contract.class.as_str());
        }
        let state = observed.state;
        let staged = self.stage(&secrets, observed)?;
        postern_store::crash::point("engine::observed::before_journal");
        self.journal_observation(id, state, staged.detail.clone(), staged.completion).await?;
        postern_store::crash::point("engine::journaled::before_answer");
        Ok(self.outcome(id, state, decision).attached_if(attached).answered(staged.answer).because(staged.detail))
    }

    /// Journals what a sent request's attempt observed. If the journal cannot be written right
    /// now (a full disk, an I/O error), the observation is kept and written as soon as the disk
    /// accepts it, by a task that retries with backoff; meanwhile the execution stays
    /// `dispatched` (a retry waits for it; a restart makes it `outcome_unknown`, verified through
    /// its contract), and the caller is told it was sent and must not be repeated.
    pub(super) async fn journal_observation(
        &self,
        id: ExecutionId,
        state: ExecutionState,
        detail: StepDetail,
        completion: Option<Completion>,
    ) -> Result<(), EngineError> {
        let detail = detail.to_value();
        let at = self.now();
        let write = move |store: Arc<Store>, detail: Value, completion: Option<Completion>| async move {
            match completion {
                Some(c) => store.complete_async(id, c).await.map(drop),
                None => store.transition_steps_async(id, vec![(state, detail)], at).await.map(drop),
            }
        };
        match write(Arc::clone(&self.store), detail.clone(), completion.clone()).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_unwritable() => {
                tracing::error!(execution = %id, error = %e, "the outcome of a sent request cannot be journaled yet; retrying");
                let store = Arc::clone(&self.store);
                tokio::spawn(async move {
                    let mut wait = Duration::from_millis(250);
                    loop {
                        tokio::time::sleep(wait).await;
                        match write(Arc::clone(&store), detail.clone(), completion.clone()).await {
                            Ok(()) => {
                                tracing::info!(execution = %id, "the outcome was journaled once the disk accepted it");
                                return;
                            }
                            Err(e) if e.is_unwritable() => wait = (wait * 2).min(Duration::from_secs(5)),
                            Err(e) => {
                                tracing::error!(execution = %id, error = %e, "the outcome could not be journaled");
                                return;
                            }
                        }
                    }
                });
                Err(EngineError::OutcomeNotJournaled { id, source: e })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// What a send phase observed, as the state it leads to (one mapping for every path).
    pub(super) fn observe(&self, p: &Prepared<'_>, sent: Sent, attempt: Attempt) -> Result<Observation, EngineError> {
        Ok(match sent {
            Sent::Response { result, .. }
                if attempt == Attempt::SameKeyResend && inconclusive_resend_status(result.status) =>
            {
                Observation::without_result(
                    ExecutionState::OutcomeUnknown,
                    StepDetail::because("same_key_resend_inconclusive")
                        .with("http_status", result.status)
                        .with(
                            "explanation",
                            "the target's answer to the re-send with the same idempotency key says nothing certain \
                             about the original request (in flight, key conflict, or a server error); the outcome \
                             stays unknown — retry later",
                        )
                        .recovery(p.tool.contract.class.as_str()),
                )
            }
            Sent::Response { result, elapsed, over_limit } => {
                let outcome = json!({ "http_status": result.status, "elapsed_ms": elapsed.as_millis() as u64,
                                      "truncated": result.truncated });
                Observation { over_limit, ..Observation::completed(Raw::Http(result), outcome) }
            }
            Sent::NotSent { reason } => {
                Observation::without_result(ExecutionState::FailedBeforeDispatch, StepDetail::because(reason))
            }
            Sent::Unknown { reason } => Observation::without_result(
                ExecutionState::OutcomeUnknown,
                StepDetail::because(reason).recovery(p.tool.contract.class.as_str()),
            ),
        })
    }
}

/// An answer to a same-key re-send that says nothing certain about the original request: still
/// in flight (409), key reused with another payload (422), too early or rate limited (425, 429),
/// request timeout (408), or a server error. Only a replayed or fresh 2xx/4xx settles it.
fn inconclusive_resend_status(status: u16) -> bool {
    matches!(status, 408 | 409 | 422 | 425 | 429) || status >= 500
}

/// `read` (a host's key) with the vault epoch read *before* it: what `read` returns is no newer
/// than the epoch it is kept under, so a change landing while it reads moves the epoch past it
/// and retires the connection made with it. (Read after, a key from before a rotation or a lock
/// would be pooled under the epoch after it, and kept.)
fn read_under_epoch<T, E>(epoch: impl FnOnce() -> u64, read: impl FnOnce() -> Result<T, E>) -> Result<(u64, T), E> {
    let epoch = epoch();
    read().map(|value| (epoch, value))
}

#[cfg(test)]
mod tests {
    /// A vault change landing while the key is read: the key is kept under the epoch before the
    /// change, which the change retires.
    #[test]
    fn a_key_is_kept_under_the_epoch_read_before_it() {
        let epoch = std::sync::atomic::AtomicU64::new(7);
        let now = || epoch.load(std::sync::atomic::Ordering::SeqCst);
        let read = super::read_under_epoch(now, || {
            epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, ()>("key from before the change")
        });
        assert_eq!(read, Ok((7, "key from before the change")));
        assert_ne!(now(), 7, "the change moved the epoch past it");
    }
}
