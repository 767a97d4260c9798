//! Requests for something Postern does not offer where an agent can reach it — an approval,
//! an unlock, a session grant over the control socket, an MCP method or tool that does not
//! exist, an HTTP path other than `/mcp` — are refused, and each refusal is journaled
//! (`request_refused` on the vault stream) as evidence of a possible self-approval attempt.
//!
//! Journaling is budgeted per minute and per peer by the store itself
//! ([`Store::refusal`]), so an agent cannot grow the journal without bound by trying, nor
//! spend another peer's budget: beyond its budget a peer's refusals are counted, and a minute's
//! counts go into one summary row.

use postern_engine::engine::Clock;
use postern_store::Store;
use serde_json::{Value, json};
use std::sync::Arc;

pub use postern_store::{REFUSALS_PER_MINUTE, REFUSALS_PER_MINUTE_IN_ALL};

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

pub struct Refusals {
    store: Arc<Store>,
    clock: Clock,
}

impl std::fmt::Debug for Refusals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refusals").finish_non_exhaustive()
    }
}

impl Refusals {
    pub fn new(store: Arc<Store>, clock: Clock) -> Arc<Self> {
        Arc::new(Refusals { store, clock })
    }

    /// Journals `refused` (a synchronous store write: call it off the async workers), unless
    /// its peer's budget for this minute is spent; the row written, if one was.
    pub fn record(&self, refused: Refused) -> Option<postern_store::JournalEntry> {
        let now = (self.clock)();
        let attempted: String = refused.attempted.chars().take(200).collect();
        let detail = json!({
            "interface": refused.interface,
            "attempted": attempted,
            "approval_shaped": approval_shaped(&attempted),
            "peer": refused.peer,
            "reason": "not offered here: approvals, unlocking and session grants are only answered in the approver \
                       (the desktop app's dialogs or `postern serve --approver terminal`)",
        });
        match self.store.refusal(detail, now) {
            Ok(entry) => {
                // What was asked for is the peer's text: escaped for the log like any outside
                // text, and logged only as often as it is journaled.
                if entry.is_some() {
                    tracing::warn!(
                        interface = refused.interface,
                        attempted = %postern_core::Outside::line(&attempted),
                        "refused a request Postern does not offer"
                    );
                }
                entry
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not journal a refused request");
                None
            }
        }
    }

    /// [`Refusals::record`] from async code.
    pub async fn record_async(self: &Arc<Self>, refused: Refused) {
        let me = Arc::clone(self);
        let _ = tokio::task::spawn_blocking(move || drop(me.record(refused))).await;
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

    /// One peer spamming refusals spends its own budget only: another peer's attempt in the same
    /// minute is still journaled, and the spammer's excess is summed up in one row with the
    /// first refusal of the next minute.
    #[test]
    fn the_refusal_budget_is_per_peer() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(&dir.path().join("postern.db"), postern_core::Timestamp::from_millis(1)).unwrap();
        let store = Arc::new(store);
        let minute = Arc::new(std::sync::atomic::AtomicI64::new(60_000));
        let clock: Clock = {
            let minute = Arc::clone(&minute);
            Arc::new(move || postern_core::Timestamp::from_millis(minute.load(std::sync::atomic::Ordering::SeqCst)))
        };
        let refusals = Refusals::new(Arc::clone(&store), clock);
        let refused = |actor: &str| Refused {
            interface: "control_socket",
            attempted: "approve".into(),
            peer: json!({ "actor": actor }),
        };
        for _ in 0..100 {
            refusals.record(refused("agent:spammer"));
        }
        refusals.record(refused("agent:quiet"));
        minute.store(120_000, std::sync::atomic::Ordering::SeqCst);
        refusals.record(refused("agent:spammer"));
        let rows: Vec<Value> = store
            .view()
            .rows_after(0, 1_000)
            .unwrap()
            .into_iter()
            .filter(|e| e.row.event.as_str() == "request_refused")
            .map(|e| e.row.detail)
            .collect();
        let by = |actor: &str| rows.iter().filter(|d| d["peer"]["actor"] == actor).count();
        assert_eq!(by("agent:spammer"), REFUSALS_PER_MINUTE as usize + 1, "{rows:?}");
        assert_eq!(by("agent:quiet"), 1, "the quiet peer's attempt is on record");
        let summary = rows.iter().find(|d| d["interface"] == "refusal_budget").expect("the excess is summed up");
        assert_eq!(summary["peers"], json!([{ "peer": "actor:\"agent:spammer\"", "counted": 70 }]));
        assert_eq!(rows.last().unwrap()["peer"]["actor"], "agent:spammer", "after the summary, the new minute's row");
    }

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
