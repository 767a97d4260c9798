//! A model of the retry protocol, small enough to check every interleaving: one agent repeating
//! one intent, the gateway with its journal, and the target, with lost and reordered messages,
//! agents that give up and re-issue, and gateway crashes at every step. The gateway's moves
//! are the engine's own: executions change state only through [`ExecutionState::transition`],
//! and a call that matches a prior is decided by [`postern_core::retry::decide_retry`], so the
//! model cannot drift from the lifecycle or the retry table.
//!
//! Properties (checked by `tests/it`): at most one effect per intent; every answer the agent
//! accepts agrees with the journal; `result_delivered` only for a result the agent has; no
//! illegal transition.
//!
//! What the model assumes, and the gateway relies on: a request the agent wrote reaches the
//! gateway or is lost with its connection before the agent writes the next one (loopback TCP;
//! requests do not linger in the network), and the agent carries on (calls another tool) only
//! after it has a result. Answers may be lost, delayed and reordered; a late answer to a request
//! the agent gave up on is ignored, as SDKs drop them.

use postern_core::{
    Actor, ExecutionId, ExecutionState, IntentScope, ReplayClass, ReplayContract, SessionId, Timestamp,
    fingerprint::FingerprintKey,
    retry::{IncomingIntent, PriorExecution, RetryDecision, Verification, decide_retry},
};
use stateright::{Model, Property};

/// The bounds of one check.
#[derive(Clone, Debug)]
pub struct Protocol {
    /// The tool's replay contract class (`irreversible` or `idempotency_key`).
    pub class: ReplayClass,
    /// Requests the agent may write for its one intent.
    pub attempts: u8,
    /// Gateway crashes (each followed by a restart and the journal's recovery).
    pub crashes: u8,
    /// A gateway that breaks a rule on purpose: the check must catch it, or it proves nothing.
    pub fault: Option<Fault>,
}

/// Rules a gateway could break, each of which must end in a property violated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A call matching an uncertain execution (outcome unknown, needs review) is a new one.
    BlindRetry,
    /// A result counts as delivered once it is written, without the agent's side.
    DeliveredOnWrite,
}

/// What the agent is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    /// The execution completed: its result.
    Result(u8),
    /// Nothing was sent (`failed_before_dispatch`); calling again is safe.
    NothingSent(u8),
    /// Not settled: in flight, outcome unknown, or waiting for a person.
    Unsettled(u8),
}

/// A request to the target: the execution it carries, the idempotency key (if the contract
/// sends one), and the gateway's incarnation that wrote it (a response to an earlier one goes
/// to a dead connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Send {
    pub exec: u8,
    pub key: Option<u8>,
    pub incarnation: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    // The agent.
    pub written: u8,
    pub waiting: bool,
    pub accepted: Option<Answer>,
    pub carried_on: bool,
    // The network.
    pub call_in_flight: Option<u8>,
    pub follow_up_in_flight: bool,
    pub answers: Vec<(u8, Answer)>,
    pub to_target: Vec<Send>,
    pub from_target: Vec<Send>,
    // The gateway: the journal (durable; index = execution) ...
    pub journal: Vec<ExecutionState>,
    // ... and what a crash loses: requests waiting on an execution, answers written and whether
    // the client's side acknowledged them (the first step of delivery).
    pub up: bool,
    pub incarnation: u8,
    pub waiters: Vec<(u8, u8)>,
    pub written_answers: Vec<(u8, bool)>,
    pub illegal: bool,
    // The target.
    pub effects: u8,
    pub keys_seen: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    AgentWrites,
    AgentGivesUp,
    AgentReads(usize),
    AgentCarriesOn,
    LoseCall,
    LoseAnswer(usize),
    GatewayReceives,
    GatewayDispatches(u8),
    GatewayTimesOut(u8),
    GatewayAnswersWaiter(usize),
    GatewayObserves(usize),
    GatewayReceivesFollowUp,
    TargetReceives(usize),
    Crash,
    Restart,
}

/// The one intent's identity, as the engine would see it (one agent run).
struct Intent {
    fingerprint: postern_core::Fingerprint,
    actor: Actor,
    scope: IntentScope,
}

fn intent() -> Intent {
    Intent {
        fingerprint: FingerprintKey::from_bytes([7; 32]).fingerprint(b"wire 5"),
        actor: Actor::token_agent("model"),
        scope: IntentScope::agent_run(SessionId::from_parts(Timestamp::from_millis(1), 1)),
    }
}

const ACCEPTED_AT: Timestamp = Timestamp::from_millis(1_000_000);

impl Protocol {
    fn contract(&self) -> ReplayContract {
        ReplayContract {
            class: self.class,
            idempotency_header: (self.class == ReplayClass::IdempotencyKey).then(|| "Idempotency-Key".to_owned()),
            ..ReplayContract::read_only()
        }
    }

    /// The engine's decision for a call of the intent, from the journal's newest execution.
    fn decide(&self, journal: &[ExecutionState]) -> RetryDecision {
        let intent = intent();
        let prior = journal.iter().enumerate().next_back().map(|(i, &state)| PriorExecution {
            id: exec_id(i as u8),
            fingerprint: intent.fingerprint,
            actor: intent.actor.clone(),
            intent_scope: intent.scope.clone(),
            state,
            accepted_at: ACCEPTED_AT,
            contract: self.contract(),
        });
        let incoming =
            IncomingIntent { fingerprint: &intent.fingerprint, actor: &intent.actor, intent_scope: &intent.scope };
        // A retry comes well inside every window and retention: time is not what is modelled.
        decide_retry(prior.as_ref(), &incoming, ACCEPTED_AT.saturating_add_millis(1))
    }
}

/// The execution IDs the model hands out, 0, 1, … in acceptance order.
pub fn exec_id(n: u8) -> ExecutionId {
    ExecutionId::from_parts(ACCEPTED_AT, u128::from(n))
}

fn index_of(id: ExecutionId) -> u8 {
    (0..=u8::MAX).find(|&n| exec_id(n) == id).unwrap_or(u8::MAX)
}

impl State {
    fn step(&mut self, exec: u8, to: ExecutionState) {
        let Some(state) = self.journal.get_mut(usize::from(exec)) else {
            self.illegal = true;
            return;
        };
        match state.transition(to) {
            Ok(next) => *state = next,
            Err(_) => self.illegal = true,
        }
    }

    fn state_of(&self, exec: u8) -> Option<ExecutionState> {
        self.journal.get(usize::from(exec)).copied()
    }

    /// Every request waiting on `exec` is answered now; a result is written for delivery.
    fn answer_waiters(&mut self, exec: u8, answer: Answer) {
        let (now, rest): (Vec<_>, Vec<_>) = self.waiters.iter().partition(|(e, _)| *e == exec);
        self.waiters = rest;
        for (_, req) in now {
            self.write_answer(req, answer);
        }
    }

    fn write_answer(&mut self, req: u8, answer: Answer) {
        if let Answer::Result(exec) = answer {
            self.written_answers.push((exec, false));
        }
        self.answers.push((req, answer));
    }

    fn send(&mut self, exec: u8, class: ReplayClass) {
        let key = (class == ReplayClass::IdempotencyKey).then_some(exec);
        self.to_target.push(Send { exec, key, incarnation: self.incarnation });
    }
}

fn has_result(state: ExecutionState) -> bool {
    matches!(
        state,
        ExecutionState::Completed | ExecutionState::CompletedResultNotDelivered | ExecutionState::ResultDelivered
    )
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            written: 0,
            waiting: false,
            accepted: None,
            carried_on: false,
            call_in_flight: None,
            follow_up_in_flight: false,
            answers: Vec::new(),
            to_target: Vec::new(),
            from_target: Vec::new(),
            journal: Vec::new(),
            up: true,
            incarnation: 0,
            waiters: Vec::new(),
            written_answers: Vec::new(),
            illegal: false,
            effects: 0,
            keys_seen: Vec::new(),
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if !s.waiting && s.accepted.is_none() && s.written < self.attempts && s.call_in_flight.is_none() {
            actions.push(Action::AgentWrites);
        }
        if s.waiting {
            actions.push(Action::AgentGivesUp);
        }
        actions.extend((0..s.answers.len()).map(Action::AgentReads));
        if s.accepted.is_some() && !s.carried_on {
            actions.push(Action::AgentCarriesOn);
        }
        if s.call_in_flight.is_some() {
            actions.push(Action::LoseCall);
            if s.up {
                actions.push(Action::GatewayReceives);
            }
        }
        actions.extend((0..s.answers.len()).map(Action::LoseAnswer));
        actions.extend((0..s.to_target.len()).map(Action::TargetReceives));
        if s.up {
            for (i, state) in s.journal.iter().enumerate() {
                let exec = i as u8;
                let handled = s.waiters.iter().any(|(e, _)| *e == exec);
                if matches!(state, ExecutionState::Accepted | ExecutionState::NotExecuted) && handled {
                    actions.push(Action::GatewayDispatches(exec));
                }
                if *state == ExecutionState::Dispatched {
                    actions.push(Action::GatewayTimesOut(exec));
                }
            }
            actions.extend((0..s.waiters.len()).map(Action::GatewayAnswersWaiter));
            actions.extend((0..s.from_target.len()).map(Action::GatewayObserves));
            if s.follow_up_in_flight {
                actions.push(Action::GatewayReceivesFollowUp);
            }
            if s.incarnation < self.crashes {
                actions.push(Action::Crash);
            }
        } else {
            actions.push(Action::Restart);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::AgentWrites => {
                s.call_in_flight = Some(s.written);
                s.written += 1;
                s.waiting = true;
            }
            Action::AgentGivesUp => s.waiting = false,
            Action::AgentReads(i) => {
                let (req, answer) = s.answers.remove(i);
                // The client's side took the bytes: the first step of delivery.
                if let Answer::Result(exec) = answer
                    && let Some(w) = s.written_answers.iter_mut().find(|(e, acked)| *e == exec && !acked)
                {
                    w.1 = true;
                }
                // Only the answer to the request it waits on counts; a result is final, anything
                // else makes it ask again (a re-serializing agent retries whatever it is told).
                if s.waiting && req + 1 == s.written {
                    s.waiting = false;
                    if matches!(answer, Answer::Result(_)) {
                        s.accepted = Some(answer);
                    }
                }
            }
            Action::AgentCarriesOn => {
                s.carried_on = true;
                s.follow_up_in_flight = true;
            }
            Action::LoseCall => s.call_in_flight = None,
            Action::LoseAnswer(i) => {
                s.answers.remove(i);
            }
            Action::GatewayReceives => {
                let req = s.call_in_flight.take()?;
                let decision = match self.decide(&s.journal) {
                    RetryDecision::VerifyPrior { .. } | RetryDecision::NeedsReview { .. }
                        if self.fault == Some(Fault::BlindRetry) =>
                    {
                        RetryDecision::NewExecution
                    }
                    decision => decision,
                };
                match decision {
                    RetryDecision::NewExecution => {
                        s.journal.push(ExecutionState::Accepted);
                        let exec = (s.journal.len() - 1) as u8;
                        s.waiters.push((exec, req));
                    }
                    RetryDecision::ContinuePrior { prior } | RetryDecision::WaitForPrior { prior } => {
                        s.waiters.push((index_of(prior), req));
                    }
                    RetryDecision::VerifyPrior { prior, verification: Verification::ResendWithSameKey { .. } } => {
                        let exec = index_of(prior);
                        s.step(exec, ExecutionState::Dispatched);
                        s.send(exec, self.class);
                        s.waiters.push((exec, req));
                    }
                    RetryDecision::ReturnStoredResult { prior } => s.write_answer(req, Answer::Result(index_of(prior))),
                    RetryDecision::NeedsReview { prior, .. } => {
                        let exec = index_of(prior);
                        if s.state_of(exec) == Some(ExecutionState::OutcomeUnknown) {
                            s.step(exec, ExecutionState::NeedsReview);
                        }
                        s.write_answer(req, Answer::Unsettled(exec));
                    }
                    // Not reachable with these contracts (no denials, no other verification).
                    RetryDecision::ReturnPriorDenial { .. } | RetryDecision::VerifyPrior { .. } => {
                        s.illegal = true;
                    }
                }
            }
            Action::GatewayDispatches(exec) => {
                if s.state_of(exec) == Some(ExecutionState::Accepted) {
                    s.step(exec, ExecutionState::Authorized);
                }
                s.step(exec, ExecutionState::Dispatched);
                s.send(exec, self.class);
            }
            Action::GatewayTimesOut(exec) => {
                s.step(exec, ExecutionState::OutcomeUnknown);
                s.answer_waiters(exec, Answer::Unsettled(exec));
            }
            Action::GatewayAnswersWaiter(i) => {
                // The bounded wait of a joined retry ran out: it is told where the execution is.
                let (exec, req) = s.waiters.remove(i);
                let answer = match s.state_of(exec) {
                    Some(state) if has_result(state) => Answer::Result(exec),
                    Some(ExecutionState::FailedBeforeDispatch) => Answer::NothingSent(exec),
                    _ => Answer::Unsettled(exec),
                };
                s.write_answer(req, answer);
            }
            Action::GatewayObserves(i) => {
                let send = s.from_target.remove(i);
                if s.state_of(send.exec) == Some(ExecutionState::Dispatched) {
                    s.step(send.exec, ExecutionState::Completed);
                    s.answer_waiters(send.exec, Answer::Result(send.exec));
                }
            }
            Action::GatewayReceivesFollowUp => {
                s.follow_up_in_flight = false;
                // The agent carried on: every result it acknowledged was delivered.
                let acked: Vec<u8> = s.written_answers.iter().filter(|(_, acked)| *acked).map(|(e, _)| *e).collect();
                s.written_answers.retain(|(_, acked)| !acked);
                for exec in acked {
                    if matches!(
                        s.state_of(exec),
                        Some(ExecutionState::Completed | ExecutionState::CompletedResultNotDelivered)
                    ) {
                        s.step(exec, ExecutionState::ResultDelivered);
                    }
                }
            }
            Action::TargetReceives(i) => {
                let send = s.to_target.remove(i);
                let repeat = send.key.is_some_and(|k| s.keys_seen.contains(&k));
                if !repeat {
                    s.effects += 1;
                    s.keys_seen.extend(send.key);
                }
                s.from_target.push(send);
                s.from_target.retain(|f| f.incarnation == s.incarnation);
            }
            Action::Crash => {
                s.up = false;
                s.incarnation += 1;
                s.waiters.clear();
                s.written_answers.clear();
                // The connections to the target die with the process; what was sent may still
                // land there (`to_target` stays), but no answer comes back to this process.
                s.from_target.clear();
                s.call_in_flight = None;
                s.follow_up_in_flight = false;
            }
            Action::Restart => {
                s.up = true;
                // The journal's recovery (`Store::recover`).
                for exec in 0..s.journal.len() as u8 {
                    match s.state_of(exec) {
                        Some(ExecutionState::Dispatched) => s.step(exec, ExecutionState::OutcomeUnknown),
                        Some(ExecutionState::Completed) => s.step(exec, ExecutionState::CompletedResultNotDelivered),
                        _ => {}
                    }
                }
            }
        }
        if self.fault == Some(Fault::DeliveredOnWrite) {
            for exec in s.written_answers.iter().map(|(e, _)| *e).collect::<Vec<_>>() {
                if s.state_of(exec).is_some_and(|st| st != ExecutionState::ResultDelivered && has_result(st)) {
                    s.step(exec, ExecutionState::ResultDelivered);
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("at most one effect per intent", |_, s: &State| s.effects <= 1),
            Property::always("an accepted answer agrees with the journal", |_, s: &State| match s.accepted {
                Some(Answer::Result(exec)) => s.state_of(exec).is_some_and(has_result) && s.effects == 1,
                Some(Answer::NothingSent(_) | Answer::Unsettled(_)) => false,
                None => true,
            }),
            Property::always("delivered only to an agent that has the result", |_, s: &State| {
                s.journal.iter().enumerate().all(|(i, state)| {
                    *state != ExecutionState::ResultDelivered || s.accepted == Some(Answer::Result(i as u8))
                })
            }),
            Property::always("every state change is a lifecycle transition", |_, s: &State| !s.illegal),
            Property::sometimes("the agent gets its result", |_, s: &State| s.accepted.is_some()),
            Property::sometimes("the result is journaled as delivered", |_, s: &State| {
                s.journal.contains(&ExecutionState::ResultDelivered)
            }),
            Property::sometimes("a crash leaves an outcome unknown", |_, s: &State| {
                s.journal.iter().any(|st| matches!(st, ExecutionState::OutcomeUnknown | ExecutionState::NeedsReview))
            }),
        ]
    }
}
