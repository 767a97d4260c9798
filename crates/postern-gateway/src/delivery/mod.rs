//! Did the result reach the agent? A tool result is journaled `result_delivered` only on
//! evidence from the agent's side, and `completed_result_not_delivered` when the evidence cannot
//! come any more, so a later retry is answered from the record; whatever stays uncertain resolves
//! to "not delivered".
//!
//! A [`DeliveryTicket`] travels with one response. The MCP handler registers the executions
//! whose outcome it carries; the transport settles the ticket delivered or lost. Whichever of
//! the two happens second journals. Over Streamable HTTP delivery takes two steps: the client's
//! kernel acknowledged the response ([`DeliveryTicket::written`]), and then the agent called
//! another tool on the same MCP session ([`FollowUps`]) — a client library that loses its session
//! can drop a response its socket already received, so bytes alone are not evidence.

pub mod head;
pub mod pending;
pub mod result;
pub mod tasks;

use postern_core::ExecutionId;
use postern_engine::Engine;
use std::sync::{Arc, Mutex};

#[derive(Debug)]
enum Slot {
    /// The response is not written yet; these executions ride on it.
    Open(Vec<ExecutionId>),
    /// Written and acknowledged by the client's kernel; waiting for the agent's next call.
    Written(Vec<ExecutionId>),
    /// The agent called another tool after the response was handed to its connection; waiting
    /// for the client's kernel to acknowledge the bytes.
    FollowedUp(Vec<ExecutionId>),
    /// The transport settled before the handler registered: `true` if it was written.
    Settled(bool),
}

/// One response's delivery, shared by the handler (which knows the execution) and the
/// transport (which knows whether the bytes went out).
#[derive(Debug, Clone)]
pub struct DeliveryTicket {
    slot: Arc<Mutex<Slot>>,
    /// Where the verdict is journaled (`None` only in unit tests of the settlement logic).
    engine: Option<Arc<Engine>>,
}

impl DeliveryTicket {
    pub fn new(engine: Arc<Engine>) -> Self {
        DeliveryTicket { slot: Arc::new(Mutex::new(Slot::Open(Vec::new()))), engine: Some(engine) }
    }

    /// A ticket that journals nothing, to test how tickets are settled.
    #[cfg(test)]
    pub(crate) fn detached() -> Self {
        DeliveryTicket { slot: Arc::new(Mutex::new(Slot::Open(Vec::new()))), engine: None }
    }

    /// `Some(delivered)` once settled.
    #[cfg(test)]
    pub(crate) fn verdict(&self) -> Option<bool> {
        match self.slot.lock().as_deref() {
            Ok(Slot::Settled(delivered)) => Some(*delivered),
            _ => None,
        }
    }

    /// The handler's side: this response carries execution `id`'s outcome.
    pub fn carries(&self, id: ExecutionId) {
        let settled = match self.slot.lock() {
            Ok(mut slot) => match &mut *slot {
                Slot::Open(ids) | Slot::Written(ids) | Slot::FollowedUp(ids) => {
                    ids.push(id);
                    None
                }
                Slot::Settled(written) => Some(*written),
            },
            Err(_) => Some(false),
        };
        if let Some(written) = settled {
            self.record(vec![id], written);
        }
    }

    /// The agent asked for execution `id`'s result itself (a terminal task result it fetched
    /// with `tasks/get`): the request is the agent's own step of delivery, so the transport's
    /// confirmation that this response reached it (the bridge's acknowledgement, the client's
    /// kernel acknowledging the bytes) completes it. No session is needed to follow up on.
    pub fn fetched(&self, id: ExecutionId) {
        self.followed_up();
        self.carries(id);
    }

    /// Whether the agent's step of delivery is already taken ([`DeliveryTicket::fetched`]).
    pub fn is_followed_up(&self) -> bool {
        matches!(self.slot.lock().as_deref(), Ok(Slot::FollowedUp(_)))
    }

    /// The executions whose outcome rides on this response (so far).
    pub fn carried(&self) -> Vec<ExecutionId> {
        match self.slot.lock().as_deref() {
            Ok(Slot::Open(ids) | Slot::Written(ids) | Slot::FollowedUp(ids)) => ids.clone(),
            _ => Vec::new(),
        }
    }

    /// The transport's side: the response was handed to the connection (`true`) or could not be
    /// (`false`). Only the first settlement counts.
    pub fn settle(&self, written: bool) {
        let ids = match self.slot.lock() {
            Ok(mut slot) => match std::mem::replace(&mut *slot, Slot::Settled(written)) {
                Slot::Open(ids) | Slot::Written(ids) | Slot::FollowedUp(ids) => ids,
                first @ Slot::Settled(_) => {
                    *slot = first;
                    return;
                }
            },
            Err(_) => return,
        };
        if !ids.is_empty() {
            self.record(ids, written);
        }
    }

    /// One step of an HTTP delivery: the client's kernel acknowledged the response. Delivered
    /// once the agent has also called another tool after the response was handed out
    /// ([`DeliveryTicket::followed_up`]); nothing is journaled before both, or a loss.
    pub fn written(&self) {
        self.step(|slot| match slot {
            Slot::Open(ids) => Some(Slot::Written(std::mem::take(ids))),
            Slot::FollowedUp(_) => Some(Slot::Settled(true)),
            _ => None,
        });
    }

    /// The other step: the agent called another tool on its session after the response was
    /// handed to its connection ([`FollowUps`] registers the ticket only from then on).
    pub fn followed_up(&self) {
        self.step(|slot| match slot {
            Slot::Open(ids) => Some(Slot::FollowedUp(std::mem::take(ids))),
            Slot::Written(_) => Some(Slot::Settled(true)),
            _ => None,
        });
    }

    /// Moves an unsettled slot to `next`'s answer (`None`: unchanged); journals the carried
    /// executions as delivered when that answer is `Settled(true)`.
    fn step(&self, next: impl FnOnce(&mut Slot) -> Option<Slot>) {
        let delivered = match self.slot.lock() {
            Ok(mut slot) => {
                let ids = match &*slot {
                    Slot::Open(ids) | Slot::Written(ids) | Slot::FollowedUp(ids) => ids.clone(),
                    Slot::Settled(_) => return,
                };
                match next(&mut slot) {
                    Some(state) => {
                        let delivered = matches!(state, Slot::Settled(true));
                        *slot = state;
                        delivered.then_some(ids)
                    }
                    None => None,
                }
            }
            Err(_) => return,
        };
        if let Some(ids) = delivered.filter(|ids| !ids.is_empty()) {
            self.record(ids, true);
        }
    }

    fn record(&self, ids: Vec<ExecutionId>, written: bool) {
        let Some(engine) = self.engine.clone() else { return };
        let journal = async move {
            for id in ids {
                if let Err(e) = engine.delivered(id, written).await {
                    tracing::error!(execution = %id, error = %e, "could not journal delivery");
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(journal);
            }
            Err(_) => tracing::error!("delivery settled outside the runtime; not journaled"),
        }
    }
}

/// How long a result waits for the agent's next call of another tool before it counts as not
/// delivered.
pub const FOLLOW_UP_WINDOW: std::time::Duration = std::time::Duration::from_secs(600);

/// Most results one session keeps waiting (an agent that only ever calls one tool); beyond it
/// the oldest counts as not delivered.
const MAX_WAITING_PER_SESSION: usize = 4096;

/// Results handed to an agent's connection or MCP session, waiting for the agent's next call of
/// another tool there (the second step of delivery). A session that ends, a cancellation of the
/// request, or [`FOLLOW_UP_WINDOW`] without such a call settles them as not delivered.
#[derive(Debug, Default)]
pub struct FollowUps {
    inner: Mutex<Waitlists>,
}

#[derive(Debug, Default)]
struct Waitlists {
    /// Per session, oldest first.
    sessions: std::collections::HashMap<String, std::collections::VecDeque<Waiting>>,
    /// When expired results were last looked for (at most once a second, off the per-call path).
    swept: Option<std::time::Instant>,
}

/// Which request a response answers: its JSON-RPC id (as `mcp::request_key`) and, for a
/// `tools/call`, the tool.
#[derive(Debug, Default, Clone)]
pub struct Answers {
    pub request: Option<String>,
    pub tool: Option<String>,
}

#[derive(Debug)]
struct Waiting {
    answers: Answers,
    since: std::time::Instant,
    ticket: DeliveryTicket,
}

impl FollowUps {
    /// `ticket` (the response to `answers`) was handed to `session`.
    pub fn awaiting(&self, session: &str, answers: Answers, ticket: DeliveryTicket) {
        let now = std::time::Instant::now();
        let mut lost = Vec::new();
        if let Ok(mut lists) = self.inner.lock() {
            if lists.swept.is_none_or(|at| now.duration_since(at) >= std::time::Duration::from_secs(1)) {
                lists.swept = Some(now);
                lists.sessions.retain(|_, waiting| {
                    while waiting.front().is_some_and(|w| now.duration_since(w.since) >= FOLLOW_UP_WINDOW) {
                        lost.extend(waiting.pop_front());
                    }
                    !waiting.is_empty()
                });
            }
            let waiting = lists.sessions.entry(session.to_owned()).or_default();
            if waiting.len() >= MAX_WAITING_PER_SESSION {
                lost.extend(waiting.pop_front());
            }
            waiting.push_back(Waiting { answers, since: now, ticket });
        }
        for w in lost {
            w.ticket.settle(false);
        }
    }

    /// The agent called `tool` on `session`: every result of another tool written to the session
    /// before was delivered (the agent carried on). The results of that same tool keep waiting,
    /// because the call may repeat one whose answer the client lost (a client library that gives
    /// up on a request drops its late answer). A call of `execution_status` confirms nothing: an
    /// agent asking after an execution has not necessarily seen its result.
    pub fn tool_called(&self, session: &str, tool: &str) {
        if tool == postern_engine::catalog::manifest::EXECUTION_STATUS {
            return;
        }
        let confirmed = self.take_where(session, |w| w.answers.tool.as_deref() != Some(tool));
        for w in confirmed {
            w.ticket.followed_up();
        }
    }

    /// The client withdrew `request` on `session` (`notifications/cancelled`): it discards that
    /// answer, whatever its socket received. Other results of the session keep waiting.
    pub fn cancelled(&self, session: &str, request: &str) {
        for w in self.take_where(session, |w| w.answers.request.as_deref() == Some(request)) {
            w.ticket.settle(false);
        }
    }

    /// The session ended (the client deleted it): nothing waiting on it can be confirmed.
    pub fn session_ended(&self, session: &str) {
        for w in self.take(session) {
            w.ticket.settle(false);
        }
    }

    fn take(&self, session: &str) -> Vec<Waiting> {
        self.take_where(session, |_| true)
    }

    /// Removes and returns the results waiting on `session` that `pick` selects.
    fn take_where(&self, session: &str, pick: impl Fn(&Waiting) -> bool) -> Vec<Waiting> {
        let Ok(mut lists) = self.inner.lock() else { return Vec::new() };
        let Some(waiting) = lists.sessions.get_mut(session) else { return Vec::new() };
        let (taken, kept): (std::collections::VecDeque<Waiting>, std::collections::VecDeque<Waiting>) =
            std::mem::take(waiting).into_iter().partition(pick);
        if kept.is_empty() {
            lists.sessions.remove(session);
        } else {
            *waiting = kept;
        }
        taken.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(follow_ups: &FollowUps, session: &str, request: &str, tool: &str) -> DeliveryTicket {
        let ticket = DeliveryTicket::detached();
        ticket.written();
        let answers = Answers { request: Some(request.into()), tool: Some(tool.into()) };
        follow_ups.awaiting(session, answers, ticket.clone());
        ticket
    }

    #[test]
    fn delivery_needs_the_kernel_and_a_later_call_in_either_order() {
        let ticket = DeliveryTicket::detached();
        ticket.written();
        assert_eq!(ticket.verdict(), None, "bytes alone are not delivery");
        ticket.followed_up();
        assert_eq!(ticket.verdict(), Some(true));
        ticket.settle(false);
        assert_eq!(ticket.verdict(), Some(true), "only the first settlement counts");

        let ticket = DeliveryTicket::detached();
        ticket.followed_up();
        assert_eq!(ticket.verdict(), None, "a call alone is not delivery");
        ticket.written();
        assert_eq!(ticket.verdict(), Some(true));

        let lost = DeliveryTicket::detached();
        lost.followed_up();
        lost.settle(false); // the client's end reset before acknowledging
        lost.written();
        assert_eq!(lost.verdict(), Some(false));
    }

    #[test]
    fn a_call_of_another_tool_on_the_session_confirms_the_results_before_it() {
        let f = FollowUps::default();
        let pay = written(&f, "s1", "n:1", "pay");
        let read = written(&f, "s1", "n:2", "balance");
        let elsewhere = written(&f, "s2", "n:1", "pay");
        // Asking after an execution is not evidence of having seen its result.
        f.tool_called("s1", postern_engine::catalog::manifest::EXECUTION_STATUS);
        assert_eq!((pay.verdict(), read.verdict()), (None, None));
        // A call of the same tool may be the repeat of a lost answer: it confirms the others.
        f.tool_called("s1", "pay");
        assert_eq!((pay.verdict(), read.verdict()), (None, Some(true)));
        // A call of another tool confirms what is left on that session, and nothing elsewhere.
        f.tool_called("s1", "wire");
        assert_eq!(pay.verdict(), Some(true));
        assert_eq!(elsewhere.verdict(), None);
    }

    #[test]
    fn a_cancellation_or_the_end_of_the_session_means_not_delivered() {
        let f = FollowUps::default();
        let withdrawn = written(&f, "s1", "n:1", "pay");
        let other = written(&f, "s1", "s:x", "wire");
        f.tool_called("s1", "pay"); // the repeat of the lost call: nothing for `pay`
        f.cancelled("s1", "n:1");
        assert_eq!(withdrawn.verdict(), Some(false));
        assert_eq!(other.verdict(), Some(true), "the repeat of `pay` confirmed the `wire` result");
        let left = written(&f, "s1", "n:3", "pay");
        f.session_ended("s1");
        assert_eq!(left.verdict(), Some(false));
        f.tool_called("s1", "wire");
        assert_eq!(left.verdict(), Some(false));
    }

    #[test]
    fn a_session_that_only_ever_calls_one_tool_keeps_a_bounded_waitlist() {
        let f = FollowUps::default();
        let oldest = written(&f, "s1", "n:0", "pay");
        let rest: Vec<DeliveryTicket> =
            (1..MAX_WAITING_PER_SESSION).map(|n| written(&f, "s1", &format!("n:{n}"), "pay")).collect();
        assert_eq!(oldest.verdict(), None);
        let newest = written(&f, "s1", "n:new", "pay");
        assert_eq!(oldest.verdict(), Some(false), "the oldest beyond the bound counts as not delivered");
        f.tool_called("s1", "balance");
        assert!(rest.iter().chain([&newest]).all(|t| t.verdict() == Some(true)));
    }
}
