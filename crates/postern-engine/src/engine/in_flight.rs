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

/// Calls all agents together may have under way at once (an agent that starts its bridge under
/// ever new parents is ever new actors, each with its own bound).
pub const CALLS_IN_FLIGHT_IN_ALL: usize = 4096;

/// The calls under way, per actor.
#[derive(Debug)]
pub(super) struct CallsInFlight {
    per_actor: usize,
    in_all: usize,
    counts: Mutex<Counts>,
}

/// Calls under way per actor (an actor with none is not kept), and in all.
#[derive(Debug, Default)]
struct Counts {
    per_actor: HashMap<String, usize>,
    all: usize,
}

impl Default for CallsInFlight {
    fn default() -> Self {
        CallsInFlight::new(CALLS_IN_FLIGHT_PER_AGENT, CALLS_IN_FLIGHT_IN_ALL)
    }
}

/// One call's place, given up however the call ends (its future dropped included).
#[derive(Debug)]
pub(super) struct Place<'a> {
    calls: &'a CallsInFlight,
    actor: String,
}

impl CallsInFlight {
    pub(super) fn new(per_actor: usize, in_all: usize) -> Self {
        CallsInFlight { per_actor, in_all, counts: Mutex::default() }
    }

    /// A place for a call of `actor`, or the bound it is at: [`CALLS_IN_FLIGHT_PER_AGENT`] of
    /// its own, or [`CALLS_IN_FLIGHT_IN_ALL`] of all agents'.
    pub(super) fn enter(&self, actor: &str) -> Result<Place<'_>, usize> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.all >= self.in_all {
            return Err(self.in_all);
        }
        let actor = actor.to_owned();
        let count = counts.per_actor.entry(actor.clone()).or_default();
        if *count >= self.per_actor {
            return Err(self.per_actor);
        }
        *count += 1;
        counts.all += 1;
        Ok(Place { calls: self, actor })
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut counts = self.calls.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts.all -= 1;
        if let Some(count) = counts.per_actor.get_mut(&self.actor) {
            *count -= 1;
            if *count == 0 {
                counts.per_actor.remove(&self.actor);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_at_its_limit_is_refused_and_others_are_not() {
        let calls = CallsInFlight::new(2, 8);
        let a = calls.enter("agent:a").unwrap();
        let _a2 = calls.enter("agent:a").unwrap();
        assert_eq!(calls.enter("agent:a").err(), Some(2), "a third call of a is refused");
        let b = calls.enter("agent:b").expect("b is not held to a's calls");
        drop(a);
        let _a3 = calls.enter("agent:a").expect("a place is given back when a call ends");
        drop(b);
        assert!(
            !calls.counts.lock().unwrap().per_actor.contains_key("agent:b"),
            "an agent with nothing under way is forgotten"
        );
    }

    #[test]
    fn ever_new_actors_meet_the_bound_in_all() {
        let calls = CallsInFlight::new(2, 3);
        let held: Vec<_> = (0..3).map(|n| calls.enter(&format!("agent:{n}")).unwrap()).collect();
        assert_eq!(calls.enter("agent:new").err(), Some(3));
        drop(held);
        let counts = calls.counts.lock().unwrap();
        assert!(counts.per_actor.is_empty() && counts.all == 0, "nothing is left once every call ended");
    }
}
