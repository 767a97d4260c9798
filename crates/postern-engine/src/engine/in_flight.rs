//! How many calls one agent has under way at once, bounded: each holds memory, perhaps a
//! connection to its target and a file descriptor, until it ends, and a call keeps running when
//! its client hangs up. Without a bound an agent could send calls, drop each connection, and
//! leave the gateway without the descriptors every other agent's calls (and its journal) need.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
};

/// Calls one agent (actor) may have under way at once; one more is refused before it becomes
/// an execution.
pub const CALLS_IN_FLIGHT_PER_AGENT: usize = 256;

/// The calls under way, per actor.
#[derive(Debug)]
pub(super) struct CallsInFlight {
    per_actor: usize,
    counts: Mutex<HashMap<String, usize>>,
}

impl Default for CallsInFlight {
    fn default() -> Self {
        CallsInFlight::new(CALLS_IN_FLIGHT_PER_AGENT)
    }
}

/// One call's place, given up however the call ends (its future dropped included).
#[derive(Debug)]
pub(super) struct Place<'a> {
    calls: &'a CallsInFlight,
    actor: String,
}

impl CallsInFlight {
    pub(super) fn new(per_actor: usize) -> Self {
        CallsInFlight { per_actor, counts: Mutex::default() }
    }

    /// A place for a call of `actor`, or `None` when it has [`CALLS_IN_FLIGHT_PER_AGENT`] under way.
    pub(super) fn enter(&self, actor: &str) -> Option<Place<'_>> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let count = counts.entry(actor.to_owned()).or_default();
        if *count >= self.per_actor {
            return None;
        }
        *count += 1;
        Some(Place { calls: self, actor: actor.to_owned() })
    }

    pub(super) fn limit(&self) -> usize {
        self.per_actor
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut counts = self.calls.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = counts.get_mut(&self.actor) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.actor);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_at_its_limit_is_refused_and_others_are_not() {
        let calls = CallsInFlight::new(2);
        let a = calls.enter("agent:a").unwrap();
        let _a2 = calls.enter("agent:a").unwrap();
        assert!(calls.enter("agent:a").is_none(), "a third call of a is refused");
        let b = calls.enter("agent:b").expect("b is not held to a's calls");
        drop(a);
        let _a3 = calls.enter("agent:a").expect("a place is given back when a call ends");
        drop(b);
        assert!(!calls.counts.lock().unwrap().contains_key("agent:b"), "an agent with nothing under way is forgotten");
    }
}
