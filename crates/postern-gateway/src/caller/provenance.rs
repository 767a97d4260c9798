//! Who asked for a change over the control socket, as the kernel tells it: the peer process and
//! its ancestry up to init (past its session leader: `setsid` starts a new session but keeps
//! the parent), and whether any of them is the process of an agent run
//! Postern knows. Any process of the owner's user can reach the socket, agents included; the
//! owner's own commands and an agent's look alike except for where they come from, so a change
//! that weakens safety is refused when it comes from inside an agent run, and is put to the
//! approver's person otherwise (see `control::apply`). Both are journaled with the ancestry.
//!
//! What this cannot see: a process that left its agent's process tree (a double fork that
//! reparents it to init or a subreaper, a systemd unit it started), or an agent Postern has
//! never seen connect. With an approver attached, such a process still needs the person's
//! confirmation; without one, the ancestry in the journal is all there is.

use crate::caller::identity::{self, ProcessKey};
use serde::Serialize;
use serde_json::{Value, json};

/// The most ancestors recorded (init is usually a dozen levels up).
const MAX_DEPTH: usize = 64;

/// One process in the chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Ancestor {
    pub pid: u32,
    pub start_ticks: u64,
    pub executable: Option<String>,
}

/// The peer and its ancestry, and the agent run (by its session id) it descends from, if any.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Provenance {
    /// The peer first, then its parent, … up to the child of init.
    pub chain: Vec<Ancestor>,
    /// The agent run whose process is in the chain.
    pub agent_run: Option<String>,
}

impl Provenance {
    /// The ancestry of process `pid`; `run_of` names the agent run a process belongs to, if any.
    pub fn of(pid: Option<u32>, run_of: &dyn Fn(&ProcessKey) -> Option<String>) -> Provenance {
        let Some(mut pid) = pid else { return Provenance::default() };
        let mut chain = Vec::new();
        let mut agent_run = None;
        for _ in 0..MAX_DEPTH {
            let Some((key, parent)) = identity::process_lineage(pid) else { break };
            if agent_run.is_none() {
                agent_run = run_of(&key);
            }
            chain.push(Ancestor {
                pid,
                start_ticks: key.start_ticks,
                executable: std::fs::read_link(format!("/proc/{pid}/exe")).ok().map(|p| p.display().to_string()),
            });
            if parent <= 1 {
                break;
            }
            pid = parent;
        }
        Provenance { chain, agent_run }
    }

    /// The peer's own pid.
    pub fn pid(&self) -> Option<u32> {
        self.chain.first().map(|a| a.pid)
    }

    /// What the journal records.
    pub fn detail(&self) -> Value {
        json!({
            "pid": self.pid(),
            "executable": self.chain.first().and_then(|a| a.executable.clone()),
            "ancestry": self.chain,
            "agent_run": self.agent_run,
        })
    }

    /// The chain as a person reads it: `pid 4242 /usr/bin/python3` per line.
    pub fn lines(&self) -> Vec<String> {
        self.chain
            .iter()
            .map(|a| format!("pid {} {}", a.pid, a.executable.as_deref().unwrap_or("(executable unknown)")))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_traced_to_init_and_matched_to_a_run() {
        let me = std::process::id();
        let mine = identity::process_key(me).unwrap();
        let traced = Provenance::of(Some(me), &|_| None);
        assert_eq!(traced.pid(), Some(me));
        assert!(!traced.chain.is_empty() && traced.agent_run.is_none());
        // A run whose process is this one, or one of its ancestors, is found.
        // The walk goes past the session leader (a `setsid` child keeps its parent) to init's child.
        let last = traced.chain.last().unwrap();
        assert_eq!(identity::process_lineage(last.pid).map(|(_, parent)| parent <= 1), Some(true), "{traced:?}");
        let parent = traced.chain.get(1).map(|a| ProcessKey { pid: a.pid, start_ticks: a.start_ticks });
        let top = ProcessKey { pid: last.pid, start_ticks: last.start_ticks };
        for key in [Some(mine), parent, Some(top)].into_iter().flatten() {
            let found = Provenance::of(Some(me), &|k| (*k == key).then(|| "ses_run".to_owned()));
            assert_eq!(found.agent_run.as_deref(), Some("ses_run"));
        }
        assert_eq!(Provenance::of(None, &|_| None), Provenance::default());
    }
}
