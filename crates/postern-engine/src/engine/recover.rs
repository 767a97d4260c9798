//! A retry matched an earlier execution: attach to it, verify it through its replay contract
//! (same-key re-send, status query, SSH marker), or put it to a reviewer — never send blindly.

use super::*;
use postern_core::StatusMeaning;

impl Engine {
    /// A retry matched `prior`. If a call for it is already waiting for a person, this one joins
    /// it (one prompt, one decision for both). Otherwise, with a person reviewing retries, an
    /// uncertain or undelivered prior goes to them with its record; else the replay contract
    /// decides.
    pub(super) async fn on_match(
        &self,
        p: &Prepared<'_>,
        call: &Call,
        prior: postern_core::PriorExecution,
        decision: RetryDecision,
    ) -> Result<CallOutcome, EngineError> {
        let lead = match self.open_requests.turn(prior.id, &call.cancel) {
            Turn::Join(rx) => return Self::join(rx).await,
            Turn::Lead(lead) => lead,
        };
        let result = if self.approver.reviews_retries() && reviewed_by_a_person(prior.state) {
            self.retry_review(p, call, &prior, decision, &lead).await
        } else {
            // The prior answers it (the retry is journaled on it, durably: `retry_received`).
            if matches!(
                decision,
                RetryDecision::ContinuePrior { .. }
                    | RetryDecision::WaitForPrior { .. }
                    | RetryDecision::VerifyPrior { .. }
            ) {
                call.bound.bind(prior.id);
            }
            self.act_on(p, call, prior.id, prior.state, decision).await
        };
        lead.finish(&result);
        result
    }

    /// Waits for the call this one joined, and answers with its outcome.
    pub(super) async fn join(mut rx: tokio::sync::watch::Receiver<Shared>) -> Result<CallOutcome, EngineError> {
        let shared = match rx.wait_for(Option::is_some).await {
            Ok(value) => value.clone(),
            Err(_) => None,
        };
        match shared {
            Some(Ok(outcome)) => Ok(CallOutcome { attached: true, ..outcome }),
            Some(Err((code, message))) => Err(EngineError::Joined { code, message }),
            None => Err(EngineError::Joined {
                code: "internal_error",
                message: "the call this retry joined ended without an outcome".into(),
            }),
        }
    }

    pub(super) async fn act_on(
        &self,
        p: &Prepared<'_>,
        call: &Call,
        id: ExecutionId,
        state: ExecutionState,
        decision: RetryDecision,
    ) -> Result<CallOutcome, EngineError> {
        let name = Decision::from(&decision);
        // A recovery that would send again (continue a prior that sent nothing, re-send with the
        // same key, ask the status endpoint, read the marker and run) is an action like any other:
        // a locked vault or a revoked run stops it, as the ladder stops a new call.
        let sends = matches!(decision, RetryDecision::VerifyPrior { .. })
            || (matches!(decision, RetryDecision::ContinuePrior { .. }) && state != ExecutionState::Accepted);
        // A withdrawn call (cancelled, its 2026-07-28 stream closed, `tasks/cancel`) sends
        // nothing either: the recovery waits for a call that still wants an answer.
        let refused = match sends {
            true if call.cancel.withdrawn() => Some(CANCELLED),
            true => self.ladder_denies(p, call)?,
            false => None,
        };
        if let Some(reason) = refused {
            let detail = StepDetail::because(reason).not_resent().with("decision", name);
            if state == ExecutionState::Authorized {
                // Nothing was ever sent for it: it ends here, as a new call would.
                self.transition(id, ExecutionState::FailedBeforeDispatch, detail.clone()).await?;
                return Ok(self.outcome(id, ExecutionState::FailedBeforeDispatch, name).attached().because(detail));
            }
            self.note(id, ActivityNote::RecoveryRefused, detail.to_value()).await?;
            return Ok(self.outcome(id, state, name).attached().because(detail));
        }
        match decision {
            RetryDecision::NewExecution => Err(EngineError::Internal("a match cannot decide new_execution".into())),
            RetryDecision::ContinuePrior { .. } => match state {
                ExecutionState::Accepted => self.authorize_and_run(p, call, id, name, true, None).await,
                // Authorized, or verified not executed: nothing was sent, carry on with this one.
                _ => self.dispatch(p, id, name, true).await,
            },
            RetryDecision::WaitForPrior { .. } => {
                let secrets = self.call_secrets(p, None);
                self.wait_for(id, p.tool.timeout + Duration::from_secs(5), name, &secrets).await
            }
            RetryDecision::VerifyPrior {
                verification:
                    Verification::ResendWithSameKey { .. }
                    | Verification::ResendWithSameArgument { .. }
                    | Verification::Resend,
                ..
            } => self.dispatch_after(p, id, name, true, vec![], Attempt::SameKeyResend).await,
            RetryDecision::VerifyPrior { verification: Verification::QueryStatus { query }, .. } => {
                // `decide_retry` chose this only inside the key's retention.
                self.query_status(p, id, &query, name, true, &call.cancel).await
            }
            RetryDecision::VerifyPrior { verification: Verification::ReadSshMarker, .. } => {
                self.read_marker(p, id, state, name, &call.cancel).await
            }
            RetryDecision::ReturnStoredResult { .. } => self.stored(id, state, name, &self.call_secrets(p, None)).await,
            RetryDecision::ReturnPriorDenial { .. } => {
                Ok(self.outcome(id, ExecutionState::Denied, name).attached().because(StepDetail::default()))
            }
            RetryDecision::NeedsReview { reason, .. } => {
                let why = match reason {
                    ReviewReason::OutcomeUnknownIrreversible => {
                        "the first attempt's outcome is unknown and this tool is irreversible; Postern did not re-send it"
                            .to_owned()
                    }
                    ReviewReason::AwaitingReview => "the first attempt is waiting for a reviewer".to_owned(),
                    ReviewReason::KeyRetentionPassed { retention_ms } => format!(
                        "the first attempt's outcome is unknown and it was accepted longer ago than the target keeps \
                         idempotency keys ({}): a re-send could run again, so Postern did not re-send it",
                        humantime::format_duration(Duration::from_millis(retention_ms))
                    ),
                };
                self.review(id, state, &why, name).await
            }
        }
    }

    /// Retry review (docs/src/design.md, the approval ladder): the person behind the approver is shown the original record
    /// and chooses. Nothing is sent unless they choose "dispatch anew" with a reason, or "check
    /// status" where the contract has a safe route.
    pub(super) async fn retry_review(
        &self,
        p: &Prepared<'_>,
        call: &Call,
        prior: &postern_core::PriorExecution,
        decision: RetryDecision,
        lead: &Lead<'_>,
    ) -> Result<CallOutcome, EngineError> {
        let id = prior.id;
        let request = self.review_request(p, prior, &decision)?;
        // The review is on record once it has its place in line (one never put has none).
        let requested = self.note(id, ActivityNote::RetryReviewRequested, json!({ "shown": &request }));
        let approver = Arc::clone(&self.approver);
        let asked = request.clone();
        let answer = self
            .ask_person(super::authorize::asker(call), request.withdrawn.clone(), requested, move || {
                approver.review_retry(&asked)
            })
            .await?;
        let put = answer.was_put();
        lead.close();
        let denied =
            |code: &str, by: &str, reason: String| StepDetail::because(reason).code(code).decided("retry_review", by);
        let verdict = match answer {
            Asked::Answered(Some(v)) if request.choices.contains(&v.answer.choice()) => v,
            Asked::Answered(Some(v)) => ReviewVerdict {
                answer: ReviewAnswer::Deny {
                    reason: format!("{:?} was not one of the offered choices", v.answer.choice()),
                },
                by: v.by,
            },
            Asked::Answered(None) | Asked::TimedOut => {
                let reason = format!("no reviewer answered within {} s", self.approval_timeout.as_secs());
                let detail = denied("approval_timed_out", "timeout", reason);
                self.note(id, ActivityNote::RetryReviewTimedOut, detail.to_value()).await?;
                return Ok(self.outcome(id, prior.state, Decision::RetryDenied).attached().because(detail));
            }
            // Never put, so no record of a review: the answer says why.
            Asked::OutOfTurn => {
                let detail =
                    denied("approval_timed_out", "postern", super::authorize::not_asked_reason(self.approval_timeout));
                return Ok(self.outcome(id, prior.state, Decision::RetryDenied).attached().because(detail));
            }
            Asked::Locked | Asked::LockedInLine => {
                let reason = "the vault was locked while this retry waited for a reviewer".to_owned();
                let detail = denied("vault_locked", "postern", reason);
                if put {
                    self.note(id, ActivityNote::RetryReviewWithdrawn, detail.to_value()).await?;
                }
                return Ok(self.outcome(id, prior.state, Decision::RetryDenied).attached().because(detail));
            }
        };
        if let ReviewAnswer::DispatchAnew { reason } = &verdict.answer
            && reason.trim().is_empty()
        {
            let detail = denied("reason_required", &verdict.by, "dispatch anew needs a typed reason".into());
            self.note(id, ActivityNote::RetryReviewDecided, json!({ "decision": &verdict, "effect": detail })).await?;
            return Ok(self.outcome(id, prior.state, Decision::RetryDenied).attached().because(detail));
        }
        self.note(id, ActivityNote::RetryReviewDecided, json!({ "decision": &verdict })).await?;
        match verdict.answer {
            ReviewAnswer::ReturnRecordedResult => {
                let state = self.current_state(id)?;
                match state {
                    ExecutionState::Dispatched => {
                        let secrets = self.call_secrets(p, None);
                        let limit = p.tool.timeout + Duration::from_secs(5);
                        self.wait_for(id, limit, Decision::ReturnRecordedResult, &secrets).await
                    }
                    ExecutionState::Completed
                    | ExecutionState::CompletedResultNotDelivered
                    | ExecutionState::ResultDelivered => {
                        self.stored(id, state, Decision::ReturnRecordedResult, &self.call_secrets(p, None)).await
                    }
                    other => {
                        let detail = StepDetail::because(&request.known_outcome).with("returned", "recorded_state");
                        Ok(self.outcome(id, other, Decision::ReturnRecordedResult).attached().because(detail))
                    }
                }
            }
            ReviewAnswer::CheckStatus => match (&decision, &prior.contract.status_query) {
                (RetryDecision::VerifyPrior { .. }, _) => self.act_on(p, call, id, prior.state, decision).await,
                // Withdrawn while the reviewer decided: the status route (and the send it may
                // lead to) is not asked for a call nobody waits for.
                (_, Some(_)) if call.cancel.withdrawn() => {
                    self.refused_as_withdrawn(id, prior.state, Decision::CheckStatus).await
                }
                (_, Some(query)) => {
                    let remembered = !postern_core::key_forgotten(prior, self.now());
                    self.query_status(p, id, query, Decision::CheckStatus, remembered, &call.cancel).await
                }
                _ => Err(EngineError::Internal("check status was offered without a route".into())),
            },
            ReviewAnswer::DispatchAnew { reason } => self.dispatch_anew(p, call, id, &verdict.by, reason.trim()).await,
            ReviewAnswer::Deny { reason } => Ok(self
                .outcome(id, prior.state, Decision::RetryDenied)
                .attached()
                .because(denied("retry_denied", &verdict.by, reason))),
        }
    }

    /// What the reviewer of a retry is shown: the original record, never the retry's guesses.
    pub(super) fn review_request(
        &self,
        p: &Prepared<'_>,
        prior: &postern_core::PriorExecution,
        decision: &RetryDecision,
    ) -> Result<RetryReviewRequest, EngineError> {
        let view = self.store.view();
        let id = prior.id;
        let summary = view.execution(id)?.ok_or(StoreError::UnknownExecution(id))?;
        let entries = view.timeline(id)?;
        // Every row read as a step's detail: one that does not read stops the review (a journal
        // edited by hand), rather than showing a reviewer less than the record says.
        let details = entries.iter().map(|e| StepDetail::read(&e.row.detail)).collect::<Result<Vec<_>, _>>()?;
        let authorized_by = entries
            .iter()
            .zip(&details)
            .rev()
            .find(|(e, _)| e.row.event == Event::Step(ExecutionState::Authorized))
            .and_then(|(_, d)| d.by.clone());
        let timeline = entries
            .iter()
            .zip(&details)
            .map(|(e, d)| {
                use {ActivityNote as N, ExecutionState as S};
                let shown = |v: Option<&String>| v.cloned().unwrap_or_default();
                let more = |key: &str| d.more.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
                let summary = match e.row.event {
                    Event::Step(S::Authorized | S::Denied) => {
                        format!("by {} ({})", shown(d.by.as_ref()), shown(d.rung.as_ref()))
                    }
                    Event::Step(S::Dispatched) => format!("{} {}", shown(d.method.as_ref()), shown(d.target.as_ref())),
                    Event::Step(S::Completed) => d
                        .more
                        .get("outcome")
                        .and_then(|o| o.get("http_status"))
                        .map_or_else(String::new, |s| format!("HTTP {s}")),
                    Event::Note(N::ApprovalRequested) => format!("asked: {}", more("ask")),
                    Event::Note(
                        N::ApprovalGranted | N::ApprovalDenied | N::ApprovalTimedOut | N::ApprovalWithdrawn,
                    ) => {
                        let by = d.more.get("decision").and_then(|v| v.get("by")).and_then(Value::as_str);
                        format!("by {}", by.unwrap_or_default())
                    }
                    _ => shown(d.reason.as_ref()),
                };
                TimelineStep { at: e.row.at.as_millis(), event: e.row.event.to_string(), summary }
            })
            .collect();
        let status =
            view.result(id)?.and_then(|r| serde_json::from_slice::<HttpResult>(&r.body).ok()).map(|r| r.status);
        let last_reason = details.iter().rev().find_map(|d| d.reason.clone());
        let class = prior.contract.class;
        // Past the key's retention the status route is not asked either: it may have forgotten.
        let verifiable = matches!(decision, RetryDecision::VerifyPrior { .. })
            || (prior.state == ExecutionState::NeedsReview
                && prior.contract.status_query.is_some()
                && !postern_core::key_forgotten(prior, self.now()));
        let (known_outcome, why_not_resent) = match prior.state {
            ExecutionState::Dispatched => (
                format!("sent; no response yet (the original may still be running at {})", p.shown_url),
                "the original is still in flight: sending again could perform the action twice".to_owned(),
            ),
            done @ (ExecutionState::Completed
            | ExecutionState::CompletedResultNotDelivered
            | ExecutionState::ResultDelivered) => (
                format!(
                    "completed{}; the result is on record and {}",
                    status.map_or_else(String::new, |s| format!(" with HTTP {s}")),
                    match done {
                        ExecutionState::ResultDelivered => "the agent's side confirmed receiving it",
                        ExecutionState::CompletedResultNotDelivered => {
                            "its delivery could not be confirmed (the connection ended first)"
                        }
                        _ => "its delivery is not confirmed yet",
                    }
                ),
                "the original completed: its result is on record, and sending again would repeat the action".to_owned(),
            ),
            state => (
                format!("unknown ({state}): {}", last_reason.unwrap_or_else(|| "no response was observed".into())),
                if verifiable {
                    let how = match &decision {
                        RetryDecision::VerifyPrior { verification: Verification::Resend, .. } => {
                            "by sending the same request again, which the contract says has no further effect"
                                .to_owned()
                        }
                        RetryDecision::VerifyPrior {
                            verification: Verification::ResendWithSameKey { header, .. },
                            ..
                        } => {
                            format!(
                                "by sending the original request again with its {header}, which the target answers with the \
                                 original's outcome as long as it still remembers the key"
                            )
                        }
                        RetryDecision::VerifyPrior { verification: Verification::ReadSshMarker, .. } => {
                            "by reading the marker the command leaves on the host, without running it again".to_owned()
                        }
                        _ => "by asking the target's status route; only an answer its contract says means \
                              \"never received\" lets the same request be sent"
                            .to_owned(),
                    };
                    format!(
                        "the outcome is unknown; the replay contract ({}) can verify it {how} — choose check status",
                        class.as_str()
                    )
                } else {
                    format!(
                        "the outcome is unknown and the replay contract ({}) offers no safe way to verify it: a second send could repeat the action",
                        class.as_str()
                    )
                },
            ),
        };
        let mut choices = vec![ReviewChoice::ReturnRecordedResult];
        if verifiable && matches!(prior.state, ExecutionState::OutcomeUnknown | ExecutionState::NeedsReview) {
            choices.push(ReviewChoice::CheckStatus);
        }
        choices.extend([ReviewChoice::DispatchAnew, ReviewChoice::Deny]);
        Ok(RetryReviewRequest {
            execution_id: id,
            session: summary.session_id.as_deref().and_then(|s| s.parse().ok()),
            tool: summary.tool,
            actor: summary.actor,
            method: p.method().to_owned(),
            target: p.shown_url.clone(),
            credential: credential_shown(p),
            replay_contract: class.as_str().to_owned(),
            state: prior.state,
            accepted_at: summary.accepted_at,
            authorized_by,
            first_dispatched_at: summary.first_dispatched_at,
            known_outcome,
            why_not_resent,
            timeline,
            choices,
            timeout_ms: self.approval_timeout.as_millis() as u64,
            withdrawn: Withdrawal::default(),
        })
    }

    /// "Dispatch anew": a new execution, linked to the original and carrying the reviewer's
    /// reason. The ladder's hard rungs still hold (a locked vault, a revoked run).
    pub(super) async fn dispatch_anew(
        &self,
        p: &Prepared<'_>,
        call: &Call,
        prior: ExecutionId,
        by: &str,
        reason: &str,
    ) -> Result<CallOutcome, EngineError> {
        let input = self.ladder_input(p, call)?;
        let refused = if input.vault_locked {
            Some((Rung::VaultLocked, "the vault is locked"))
        } else if call.cancel.withdrawn() {
            Some((Rung::SessionAuthorization, "the client withdrew the call while the reviewer decided"))
        } else if input.session == SessionStanding::Revoked {
            Some((Rung::SessionAuthorization, "this agent run was revoked or has ended"))
        } else {
            None
        };
        if let Some((rung, why)) = refused {
            let detail = StepDetail::because(why).decided(rung.as_str(), "postern");
            return Ok(self
                .outcome(prior, self.current_state(prior)?, Decision::RetryDenied)
                .attached()
                .because(detail));
        }
        let (_, arguments) = self.prepare(call, call.resolved.clone())?;
        let new = self.admission(p, call, arguments)?;
        let id = new.id;
        let out = self.outgoing(p, id)?;
        let anew = json!({ "prior": prior, "by": by, "reason": reason });
        let steps = vec![
            (
                ExecutionState::Authorized,
                StepDetail::because(reason).decided("retry_review", by).with("dispatched_anew_of", prior),
            ),
            (ExecutionState::Dispatched, dispatched_detail(p, &out, &self.key)),
        ];
        self.store.admit_anew_async(new, anew, stored(steps)).await?;
        self.send_and_observe(p, id, out, Decision::DispatchedAnew, false, Attempt::First).await
    }

    /// After a check proved the execution `not_executed`: sends it, unless every call following
    /// it was withdrawn meanwhile (the check took a round trip); then it stays `not_executed`,
    /// and a later retry continues it.
    async fn dispatch_unless_withdrawn(
        &self,
        p: &Prepared<'_>,
        id: ExecutionId,
        decision: Decision,
        cancel: &CancelSignal,
    ) -> Result<CallOutcome, EngineError> {
        if cancel.withdrawn() {
            return self.refused_as_withdrawn(id, ExecutionState::NotExecuted, decision).await;
        }
        self.dispatch(p, id, decision, true).await
    }

    /// Nothing is sent for an execution every caller withdrew: `recovery_refused`, as `act_on`
    /// journals it, and the execution stays in `state`.
    async fn refused_as_withdrawn(
        &self,
        id: ExecutionId,
        state: ExecutionState,
        decision: Decision,
    ) -> Result<CallOutcome, EngineError> {
        let detail = StepDetail::because(CANCELLED).not_resent().with("decision", decision);
        self.note(id, ActivityNote::RecoveryRefused, detail.to_value()).await?;
        Ok(self.outcome(id, state, decision).attached().because(detail))
    }

    pub(super) async fn query_status(
        &self,
        p: &Prepared<'_>,
        id: ExecutionId,
        query: &postern_core::StatusQuery,
        decision: Decision,
        key_remembered: bool,
        cancel: &CancelSignal,
    ) -> Result<CallOutcome, EngineError> {
        let url = url::Url::parse(&query.url_template.replace("{execution_id}", &id.to_string()))
            .map_err(|e| RecordError::InvalidUrl { reason: e.to_string() })?;
        http::check_target(&url)?;
        let credential = match p.credential() {
            Some(c) if c.allows(&url) => Some(http::InjectedCredential::new(&c.kind, self.vault.secret_of(c)?)),
            _ => None,
        };
        let out = Outgoing {
            method: query.method.clone(),
            url,
            headers: vec![],
            body: None,
            credential,
            idempotency: None,
            timeout: p.tool.timeout,
        };
        let mut secrets = p.secrets.clone();
        if let Some(c) = &out.credential {
            secrets.extend(c.secrets());
        }
        match http::send(&self.http, out, self.max_result_bytes).await {
            Sent::Response { result, over_limit, .. } => {
                let body = serde_json::from_str::<Value>(&result.body).ok();
                let status = result.status;
                // Only what the contract says an answer proves; everything else is for a person.
                match query.meaning(status, body.as_ref()) {
                    StatusMeaning::Done if !over_limit => {
                        let outcome = json!({ "verified_by": "status_query", "http_status": status });
                        let staged = self.stage(&secrets, Observation::completed(Raw::Http(result), outcome))?;
                        if let Some(completion) = staged.completion {
                            self.store.complete_async(id, completion).await?;
                        }
                        Ok(self
                            .outcome(id, ExecutionState::Completed, decision)
                            .attached()
                            .answered(staged.answer)
                            .because(StepDetail::default()))
                    }
                    StatusMeaning::NeverReceived if !key_remembered => {
                        let why = format!(
                            "the status route answered \"never received\" (HTTP {status}), but the key is older than the \
                             target keeps keys: that may only mean it forgot, so Postern did not send it"
                        );
                        self.review(id, ExecutionState::OutcomeUnknown, &why, decision).await
                    }
                    StatusMeaning::NeverReceived => {
                        let detail =
                            StepDetail::default().with("verified_by", "status_query").with("http_status", status);
                        self.transition(id, ExecutionState::NotExecuted, detail).await?;
                        // Proven not received, by the contract's word: the same execution may be sent.
                        self.dispatch_unless_withdrawn(p, id, decision, cancel).await
                    }
                    StatusMeaning::InFlight => {
                        // The target has it: nothing to send and nothing for a person to decide yet.
                        let reason = format!(
                            "the target's status route says it is still working on it (HTTP {status}); ask again later"
                        );
                        Ok(self
                            .outcome(id, ExecutionState::OutcomeUnknown, decision)
                            .attached()
                            .because(StepDetail::because(reason)))
                    }
                    StatusMeaning::Done | StatusMeaning::Inconclusive => {
                        let why = if over_limit {
                            format!("the status route's answer (HTTP {status}) is larger than the result limit")
                        } else {
                            format!(
                                "the status query could not tell: HTTP {status} is none of the answers its contract \
                                 says prove something"
                            )
                        };
                        self.review(id, ExecutionState::OutcomeUnknown, &why, decision).await
                    }
                }
            }
            Sent::NotSent { reason } | Sent::Unknown { reason } => {
                let why = secrets.mask(&format!("the status query could not tell ({reason})"));
                self.review(id, ExecutionState::OutcomeUnknown, &why, decision).await
            }
        }
    }

    /// Recovery through the marker protocol: a fresh connection reads what the host recorded
    /// for the execution. Finished → completed with its exit status; no directory → proven not
    /// executed, dispatched again (the same execution, the same marker); started and still
    /// running → unchanged, reported; started and the wrapper gone → a person must decide.
    pub(super) async fn read_marker(
        &self,
        p: &Prepared<'_>,
        id: ExecutionId,
        state: ExecutionState,
        decision: Decision,
        cancel: &CancelSignal,
    ) -> Result<CallOutcome, EngineError> {
        use crate::channel::ssh::Marker;
        let Target::Ssh(plan) = &p.target else {
            return self.review(id, state, "an ssh_marker contract on a tool that is not SSH", decision).await;
        };
        let unreadable =
            |why: String| StepDetail::because(format!("the marker could not be read: {why}")).recovery("ssh_marker");
        let (key, passphrase) = self.vault.ssh_key_of(&plan.host)?;
        let probe = crate::channel::ssh::marker_probe(&plan.host.marker_root, id);
        let answer = match crate::channel::ssh::connect(&plan.host, &key, passphrase.as_ref()).await {
            Ok(connection) => {
                let sent = connection.exec(&probe, Duration::from_secs(15), 4096, None).await;
                connection.close().await;
                sent
            }
            Err(e) => return Ok(self.outcome(id, state, decision).attached().because(unreadable(e.to_string()))),
        };
        let line = match answer {
            crate::channel::ssh::SshSent::Finished { result, .. } if result.exit_status == Some(0) => result.stdout,
            other => return Ok(self.outcome(id, state, decision).attached().because(unreadable(other.summary()))),
        };
        let Some(marker) = crate::channel::ssh::parse_marker(&line) else {
            return Ok(self
                .outcome(id, state, decision)
                .attached()
                .because(unreadable(format!("unexpected answer {line:?}"))));
        };
        match marker {
            Marker::Finished { exit_status, finished_at } => {
                let result = crate::channel::ssh::SshResult {
                    exit_status: Some(exit_status),
                    exit_signal: None,
                    stdout: String::new(),
                    stderr: String::new(),
                    truncated: false,
                    timed_out: None,
                    from_marker: true,
                    secret_echoed: false,
                    result_too_large: None,
                };
                let outcome = json!({ "verified_by": "ssh_marker", "exit_status": exit_status, "finished_at": finished_at,
                                      "output": "lost with the connection; the exit status is the marker's" });
                let staged = self.stage(&p.secrets, Observation::completed(Raw::Ssh(result), outcome))?;
                if let Some(completion) = staged.completion {
                    self.store.complete_async(id, completion).await?;
                }
                let detail = StepDetail::default().with("verified_by", "ssh_marker");
                Ok(self
                    .outcome(id, ExecutionState::Completed, decision)
                    .attached()
                    .answered(staged.answer)
                    .because(detail))
            }
            Marker::Absent => {
                let detail = StepDetail::default().with("verified_by", "ssh_marker").with("marker", "absent");
                self.transition(id, ExecutionState::NotExecuted, detail).await?;
                // Proven not started: the same execution may now be dispatched (its marker makes
                // a second start impossible).
                self.dispatch_unless_withdrawn(p, id, decision, cancel).await
            }
            Marker::Running { pid, started_at } => {
                let detail = StepDetail::because(format!("still running on the host (pid {pid}); ask again later"))
                    .with("verified_by", "ssh_marker")
                    .with("started_at", started_at);
                Ok(self.outcome(id, state, decision).attached().because(detail))
            }
            Marker::Died { pid, started_at } => {
                let why = format!(
                    "the command started (pid {pid}) and its wrapper died without recording an exit status; it may \
                     have done part of its work"
                );
                let mut out = self.review(id, state, &why, decision).await?;
                out.detail = out.detail.map(|d| d.with("started_at", started_at));
                Ok(out)
            }
            Marker::Created => {
                self.review(id, state, "the marker was created but the command's start was not recorded", decision)
                    .await
            }
        }
    }

    pub(super) async fn review(
        &self,
        id: ExecutionId,
        state: ExecutionState,
        why: &str,
        decision: Decision,
    ) -> Result<CallOutcome, EngineError> {
        let detail = StepDetail::because(why);
        if state == ExecutionState::OutcomeUnknown {
            self.transition(id, ExecutionState::NeedsReview, detail.clone()).await?;
        }
        Ok(self.outcome(id, ExecutionState::NeedsReview, decision).attached().because(detail))
    }

    /// The stored result of execution `id`, through the outcome stage with `secrets` (those of
    /// the call it answers).
    pub(super) async fn stored(
        &self,
        id: ExecutionId,
        state: ExecutionState,
        decision: Decision,
        secrets: &CallSecrets,
    ) -> Result<CallOutcome, EngineError> {
        let staged = match self.store.view().result(id)? {
            Some(r) => self.stage_stored(id, secrets, &r.body)?,
            None => outcome::Staged::default(),
        };
        Ok(self
            .outcome(id, state, decision)
            .attached()
            .answered(staged.answer)
            .because(StepDetail::default().with("returned", "stored_result")))
    }

    /// Waits (bounded) for a dispatched execution to leave `dispatched`, then reports it.
    pub(super) async fn wait_for(
        &self,
        id: ExecutionId,
        limit: Duration,
        decision: Decision,
        secrets: &CallSecrets,
    ) -> Result<CallOutcome, EngineError> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let current = self.store.view().execution(id)?.ok_or(StoreError::UnknownExecution(id))?;
            let state = current.state;
            if state != ExecutionState::Dispatched || tokio::time::Instant::now() >= deadline {
                return match state {
                    ExecutionState::Completed
                    | ExecutionState::CompletedResultNotDelivered
                    | ExecutionState::ResultDelivered => self.stored(id, state, decision, secrets).await,
                    other => Ok(self
                        .outcome(id, other, decision)
                        .attached()
                        .because(StepDetail::default().with("waited_for", id))),
                };
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What a call that reached execution `id` (with retry decision `decision`) is answered with,
    /// read from the journal: `None` while it is in flight (accepted, authorized, dispatched). A
    /// client resuming a broken stream gets this (`postern_gateway::door::resumption`), not a new execution.
    pub async fn answer_on_record(
        &self,
        id: ExecutionId,
        decision: Decision,
    ) -> Result<Option<CallOutcome>, EngineError> {
        let current = self.store.view().execution(id)?.ok_or(StoreError::UnknownExecution(id))?;
        let state = current.state;
        let attached = decision != Decision::NewExecution;
        let read_only = current.contract["class"] == "read_only";
        let outcome = match state {
            ExecutionState::Accepted | ExecutionState::Authorized | ExecutionState::Dispatched => return Ok(None),
            ExecutionState::Completed
            | ExecutionState::CompletedResultNotDelivered
            | ExecutionState::ResultDelivered => {
                let secrets = CallSecrets::default();
                CallOutcome {
                    detail: Some(StepDetail::default().with("returned", "on_record")),
                    ..self.stored(id, state, decision, &secrets).await?
                }
            }
            other => {
                // Why it is in this state: the row that put it there.
                let why = self
                    .store
                    .view()
                    .timeline(id)?
                    .into_iter()
                    .rev()
                    .find(|e| e.row.state == Some(other))
                    .map(|e| StepDetail::read(&e.row.detail))
                    .transpose()?;
                CallOutcome { detail: why, ..self.outcome(id, other, decision).attached_if(attached) }
            }
        };
        Ok(Some(CallOutcome { attached, read_only, ..outcome }))
    }
}

/// The prior states a person reviews when a retry matches them (docs/src/design.md, the approval ladder); `accepted` joins
/// the pending approval instead, `denied` returns the same denial.
fn reviewed_by_a_person(state: ExecutionState) -> bool {
    matches!(
        state,
        ExecutionState::Dispatched
            | ExecutionState::OutcomeUnknown
            | ExecutionState::NeedsReview
            | ExecutionState::Completed
            | ExecutionState::CompletedResultNotDelivered
    )
}
