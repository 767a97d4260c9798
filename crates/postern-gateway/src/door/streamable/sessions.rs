//! How many MCP sessions each agent token holds, and whose each session is. The cap lives here:
//! every way a session comes to count for a token (an `initialize`, a remembered session rmcp
//! restores, one used again after sitting idle long enough to stop counting) first takes a
//! place ([`AgentSessions::reserve`]), so concurrent requests cannot all pass a count taken
//! before any of them was answered.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// Most MCP sessions one agent token may hold open (a session idle for `SESSION_IDLE` no
/// longer counts: rmcp has closed it by then).
pub const MAX_SESSIONS_PER_AGENT: usize = 64;

/// How long a session counts without a request (rmcp's own idle timeout is 5 minutes).
const SESSION_IDLE: Duration = Duration::from_secs(330);

/// One agent token's sessions: when each was last used, and how many places are taken by
/// requests not answered yet.
#[derive(Debug, Default)]
struct Held {
    sessions: HashMap<String, Instant>,
    opening: usize,
}

/// The MCP sessions each agent token holds, with when each was last used, and whose each session
/// is: a session belongs to the token that opened it.
#[derive(Debug, Default)]
pub(super) struct AgentSessions {
    /// Per agent token, its sessions and the places taken.
    open: Mutex<HashMap<String, Held>>,
    /// Per session, the agent token that opened it.
    owners: Mutex<HashMap<String, String>>,
}

/// Who may use an MCP session.
pub(super) enum SessionOwner {
    /// This agent's token opened it.
    This,
    /// It was remembered without an owner (before sessions had one): it is this agent's now.
    NowThis,
    /// Another agent's.
    Other(String),
    /// Not a session Postern knows (rmcp answers for it).
    Unknown,
}

/// An agent token holds as many sessions as it may (its open ones and the places taken).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct AtCap;

/// A place under an agent token's cap, taken by a request that may make a session count
/// ([`AgentSessions::reserve`]). It becomes the session rmcp opened or kept ([`Place::settle`]),
/// or is given back when dropped.
#[derive(Debug)]
pub(super) struct Place {
    sessions: Arc<AgentSessions>,
    agent: String,
    settled: bool,
}

impl Place {
    /// The place is `session`'s, which counts from now: in one step, so no count in between sees
    /// both the place and the session.
    pub(super) fn settle(mut self, session: &str) {
        if let Ok(mut all) = self.sessions.open.lock() {
            let held = all.entry(self.agent.clone()).or_default();
            held.sessions.insert(session.to_owned(), Instant::now());
            held.opening = held.opening.saturating_sub(1);
            self.settled = true;
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if let Ok(mut all) = self.sessions.open.lock()
            && let Some(held) = all.get_mut(&self.agent)
        {
            held.opening = held.opening.saturating_sub(1);
        }
    }
}

impl AgentSessions {
    /// Whose session `session` is, for `agent` asking (from memory, else the remembered sessions).
    pub(super) fn owner(&self, agent: &str, session: &str, view: &postern_store::JournalView) -> SessionOwner {
        let known = self.owners.lock().ok().and_then(|o| o.get(session).cloned());
        let owner = match known {
            Some(owner) => Some(owner),
            None => match view.mcp_session_agent(session) {
                Ok(Some(Some(owner))) => Some(owner),
                // Remembered before sessions had owners: the first token to use it keeps it.
                Ok(Some(None)) => None,
                _ => return SessionOwner::Unknown,
            },
        };
        match owner {
            Some(owner) if owner != agent => SessionOwner::Other(owner),
            Some(owner) => {
                self.bind(session, &owner);
                SessionOwner::This
            }
            None => {
                self.bind(session, agent);
                SessionOwner::NowThis
            }
        }
    }

    /// `session` is `agent`'s from now on (in memory; the caller persists it).
    pub(super) fn bind(&self, session: &str, agent: &str) {
        if let Ok(mut owners) = self.owners.lock() {
            owners.entry(session.to_owned()).or_insert_with(|| agent.to_owned());
        }
    }

    /// Lets a request on `session` through the cap: one that counts for `agent` now is marked
    /// used at once (so it cannot stop counting, and free a place, while its request is under
    /// way); one that does not (remembered from before a restart, which rmcp restores, or idle
    /// long enough to stop counting) needs a place, as a new session does.
    pub(super) fn admit(self: &Arc<Self>, agent: &str, session: &str) -> Result<Option<Place>, AtCap> {
        let Ok(mut all) = self.open.lock() else { return Err(AtCap) };
        let held = all.entry(agent.to_owned()).or_default();
        if let Some(used) = held.sessions.get_mut(session)
            && used.elapsed() < SESSION_IDLE
        {
            *used = Instant::now();
            return Ok(None);
        }
        self.take_place(agent, held).map(Some)
    }

    /// A place for one more session of `agent`, if its open sessions and the places already
    /// taken leave room.
    pub(super) fn reserve(self: &Arc<Self>, agent: &str) -> Result<Place, AtCap> {
        let Ok(mut all) = self.open.lock() else { return Err(AtCap) };
        let held = all.entry(agent.to_owned()).or_default();
        self.take_place(agent, held)
    }

    /// [`Self::reserve`] with the agent's sessions in hand (the `open` lock held).
    fn take_place(self: &Arc<Self>, agent: &str, held: &mut Held) -> Result<Place, AtCap> {
        let mut idle = Vec::new();
        held.sessions.retain(|session, used| {
            let counts = used.elapsed() < SESSION_IDLE;
            if !counts {
                idle.push(session.clone());
            }
            counts
        });
        // Owners of sessions that went idle are forgotten in memory (the remembered sessions keep
        // them); an owner bound just now, of a session not counted yet, stays.
        if !idle.is_empty()
            && let Ok(mut owners) = self.owners.lock()
        {
            for session in &idle {
                if owners.get(session).is_some_and(|owner| owner == agent) {
                    owners.remove(session);
                }
            }
        }
        if held.sessions.len() + held.opening >= MAX_SESSIONS_PER_AGENT {
            return Err(AtCap);
        }
        held.opening += 1;
        Ok(Place { sessions: Arc::clone(self), agent: agent.to_owned(), settled: false })
    }

    /// `session` of `agent` was used now: it counts (again) from now.
    pub(super) fn used(&self, agent: &str, session: &str) {
        if let Ok(mut all) = self.open.lock() {
            all.entry(agent.to_owned()).or_default().sessions.insert(session.to_owned(), Instant::now());
        }
    }

    /// `session` of `agent` was used now: it counts (again) from now, in the place taken for it
    /// if there is one.
    pub(super) fn count(&self, place: &mut Option<Place>, agent: &str, session: &str) {
        match place.take() {
            Some(place) => place.settle(session),
            None => self.used(agent, session),
        }
    }

    /// rmcp does not know `session` (it answered 404): it no longer counts for `agent`.
    pub(super) fn unknown(&self, agent: &str, session: &str) {
        if let Ok(mut all) = self.open.lock()
            && let Some(held) = all.get_mut(agent)
        {
            held.sessions.remove(session);
        }
    }

    /// `session` of `agent` ended (rmcp accepted its DELETE).
    pub(super) fn ended(&self, agent: &str, session: &str) {
        if let Ok(mut all) = self.open.lock()
            && let Some(held) = all.get_mut(agent)
        {
            held.sessions.remove(session);
        }
        if let Ok(mut owners) = self.owners.lock()
            && owners.get(session).is_some_and(|owner| owner == agent)
        {
            owners.remove(session);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Places taken and not given back count like open sessions; a dropped place (the request
    /// answered, or abandoned) makes room again; a session counts once used, and only for its
    /// token; a request on a session that counts needs no place.
    #[test]
    fn places_taken_count_until_given_back() {
        let sessions = Arc::new(AgentSessions::default());
        let places: Vec<Place> = (0..MAX_SESSIONS_PER_AGENT).map(|_| sessions.reserve("a").expect("room")).collect();
        assert_eq!(sessions.reserve("a").err(), Some(AtCap), "every place is taken by a request not answered yet");
        assert!(sessions.reserve("b").is_ok(), "another token's cap is its own");
        drop(places);
        let place = sessions.reserve("a").expect("room again");
        sessions.used("a", "s1");
        drop(place);
        assert!(matches!(sessions.admit("b", "s1"), Ok(Some(_))), "s1 does not count for b");
        let rest: Vec<Place> = (1..MAX_SESSIONS_PER_AGENT).map(|_| sessions.reserve("a").expect("room")).collect();
        assert_eq!(sessions.reserve("a").err(), Some(AtCap), "one session and the rest of the places");
        assert!(matches!(sessions.admit("a", "s1"), Ok(None)), "a session that counts is served at the cap");
        assert_eq!(sessions.admit("a", "s2").err(), Some(AtCap), "one that does not is refused there");
        sessions.ended("a", "s1");
        assert!(sessions.reserve("a").is_ok(), "an ended session makes room");
        drop(rest);
    }

    /// A session admitted just before it would stop counting is marked used then: it cannot go
    /// idle, and free its place for a new session, while its request is under way.
    #[test]
    fn an_admitted_session_keeps_counting_while_its_request_runs() {
        let sessions = Arc::new(AgentSessions::default());
        let almost_idle = Instant::now().checked_sub(SESSION_IDLE - Duration::from_secs(10)).expect("uptime");
        sessions.open.lock().unwrap().entry("a".into()).or_default().sessions.insert("old".into(), almost_idle);
        assert!(matches!(sessions.admit("a", "old"), Ok(None)));
        let used = sessions.open.lock().unwrap()["a"].sessions["old"];
        assert!(used.elapsed() < Duration::from_secs(5), "marked used when admitted");
    }

    /// A place that becomes its session is counted once: the place and the session are never
    /// both counted, and the place is not given back a second time when dropped.
    #[test]
    fn a_settled_place_is_its_session() {
        let sessions = Arc::new(AgentSessions::default());
        let mut place = Some(sessions.reserve("a").expect("room"));
        sessions.count(&mut place, "a", "s1");
        assert!(place.is_none());
        let held = |sessions: &AgentSessions| {
            let all = sessions.open.lock().unwrap();
            (all["a"].sessions.len(), all["a"].opening)
        };
        assert_eq!(held(&sessions), (1, 0));
        let other = sessions.reserve("a").expect("room");
        assert_eq!(held(&sessions), (1, 1));
        drop(other);
        assert_eq!(held(&sessions), (1, 0));
        sessions.unknown("a", "s1");
        assert_eq!(held(&sessions), (0, 0), "a session rmcp does not know no longer counts");
    }
}
