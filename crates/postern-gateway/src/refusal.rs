//! Requests for something Postern does not offer where an agent can reach it — an approval,
//! an unlock, a session grant over the control socket, an MCP method or tool that does not
//! exist, an HTTP path other than `/mcp` — are refused, and each refusal is journaled
//! (`request_refused` on the vault stream) as evidence of a possible self-approval attempt.
//!
//! Journaling is budgeted per minute, so an agent cannot grow the journal without bound by
//! trying: beyond the budget refusals are counted, and the count goes into the next row.

use crate::engine::Clock;
use postern_store::Store;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

/// Rows journaled per minute at most; the rest are counted.
pub const REFUSALS_PER_MINUTE: u32 = 30;

/// Words that make a refused request look like an attempt to approve, authorize or unlock.
const APPROVAL_WORDS: [&str; 8] = ["approv", "authoriz", "unlock", "grant", "allow", "review", "consent", "confirm"];

/// Whether a refused request's name looks like an attempt at approval.
pub fn approval_shaped(attempted: &str) -> bool {
    let lower = attempted.to_ascii_lowercase();
    APPROVAL_WORDS.iter().any(|w| lower.contains(w))
}

/// One refused request.
#[derive(Debug, Clone)]
pub struct Refused {
    /// `control_socket`, `mcp:stdio`, `mcp:streamable_http`, `http`.
    pub interface: &'static str,
    /// What was asked for (an op, a method, a tool, a path), truncated.
    pub attempted: String,
    /// Who asked, as far as the kernel or the token says (pid, executable, actor).
    pub peer: Value,
}

#[derive(Debug, Default)]
struct Budget {
    minute: i64,
    used: u32,
    suppressed: u64,
}

pub struct Refusals {
    store: Arc<Store>,
    clock: Clock,
    budget: Mutex<Budget>,
}

impl std::fmt::Debug for Refusals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refusals").finish_non_exhaustive()
    }
}

impl Refusals {
    pub fn new(store: Arc<Store>, clock: Clock) -> Arc<Self> {
        Arc::new(Refusals { store, clock, budget: Mutex::new(Budget::default()) })
    }

    /// Journals `refused` (a synchronous store write: call it off the async workers), unless
    /// this minute's budget is spent.
    pub fn record(&self, refused: Refused) {
        let now = (self.clock)();
        let suppressed = {
            let mut b = self.budget.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let minute = now.as_millis().div_euclid(60_000);
            if b.minute != minute {
                b.minute = minute;
                b.used = 0;
            }
            if b.used >= REFUSALS_PER_MINUTE {
                b.suppressed += 1;
                return;
            }
            b.used += 1;
            std::mem::take(&mut b.suppressed)
        };
        let attempted: String = refused.attempted.chars().take(200).collect();
        let detail = json!({
            "interface": refused.interface,
            "attempted": attempted,
            "approval_shaped": approval_shaped(&attempted),
            "peer": refused.peer,
            "suppressed_before": suppressed,
            "reason": "not offered here: approvals, unlocking and session grants are only answered in the approver \
                       (the desktop app's dialogs or `postern serve --approver terminal`)",
        });
        if let Err(e) = self.store.refusal(detail, now) {
            tracing::warn!(error = %e, "could not journal a refused request");
        }
        tracing::warn!(interface = refused.interface, attempted = %attempted, "refused a request Postern does not offer");
    }

    /// [`Refusals::record`] from async code.
    pub async fn record_async(self: &Arc<Self>, refused: Refused) {
        let me = Arc::clone(self);
        let _ = tokio::task::spawn_blocking(move || me.record(refused)).await;
    }
}

/// What the kernel says about a local peer process.
pub fn local_peer(pid: Option<u32>) -> Value {
    match pid {
        Some(pid) => json!({
            "pid": pid,
            "executable": std::fs::read_link(format!("/proc/{pid}/exe")).ok().map(|p| p.display().to_string()),
        }),
        None => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approval_shaped_names_are_recognised() {
        for name in ["vault.unlock", "approvals/grant", "postern_approve", "sessions.authorize", "allowlist.add"] {
            assert!(approval_shaped(name), "{name}");
        }
        for name in ["tools/frobnicate", "agents.rename", "/metrics"] {
            assert!(!approval_shaped(name), "{name}");
        }
    }
}
