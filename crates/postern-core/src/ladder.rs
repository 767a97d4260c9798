//! The approval ladder (docs/src/design.md) as a pure decision: the rungs are tried in a fixed order and
//! the first that applies decides. The engine asks the approver only what this says to ask.

use serde::{Deserialize, Serialize};

/// Where the agent run stands with its reviewer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionStanding {
    /// A reviewer allowed this run.
    Authorized,
    /// Not asked yet (a new run).
    New,
    /// A reviewer revoked this run, or it ended: it is never reused.
    Revoked,
}

/// Everything the ladder looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LadderInput {
    pub vault_locked: bool,
    /// The credential or the tool is marked "approve every use".
    pub approve_every_use: bool,
    pub session: SessionStanding,
    /// The actor (executable hash / token agent) is on the reviewer's allowlist.
    pub actor_allowlisted: bool,
}

/// The rung that decided, as journaled with `authorized` / `denied`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rung {
    VaultLocked,
    ApproveEveryUse,
    SessionAuthorization,
    Allowlist,
    Run,
}

impl Rung {
    pub fn as_str(self) -> &'static str {
        match self {
            Rung::VaultLocked => "vault_locked",
            Rung::ApproveEveryUse => "approve_every_use",
            Rung::SessionAuthorization => "session_authorization",
            Rung::Allowlist => "allowlist",
            Rung::Run => "run",
        }
    }
}

/// What to do with a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "ladder", rename_all = "snake_case")]
pub enum LadderDecision {
    /// Refuse without asking anyone.
    Deny { rung: Rung },
    /// Ask a reviewer about this exact call (bound to its fingerprint).
    AskPerUse,
    /// Ask a reviewer about the agent run (once per run).
    AskSessionAuthorization,
    /// Run it; `rung` says why no one was asked.
    Run { rung: Rung },
}

/// The ladder: (1) a locked vault denies; (2) "approve every use" asks about this call;
/// (3) a run not yet authorized asks about the run, unless its actor is allowlisted; (4)
/// otherwise run. A revoked or ended run is never reused: it is denied right after rung 1,
/// before anyone could be asked about one of its calls.
pub fn decide_ladder(input: LadderInput) -> LadderDecision {
    if input.vault_locked {
        return LadderDecision::Deny { rung: Rung::VaultLocked };
    }
    if input.session == SessionStanding::Revoked {
        return LadderDecision::Deny { rung: Rung::SessionAuthorization };
    }
    if input.approve_every_use {
        return LadderDecision::AskPerUse;
    }
    match input.session {
        SessionStanding::Revoked => LadderDecision::Deny { rung: Rung::SessionAuthorization },
        SessionStanding::Authorized => LadderDecision::Run { rung: Rung::SessionAuthorization },
        SessionStanding::New if input.actor_allowlisted => LadderDecision::Run { rung: Rung::Allowlist },
        SessionStanding::New => LadderDecision::AskSessionAuthorization,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn input(vault_locked: bool, every_use: bool, session: SessionStanding, allowlisted: bool) -> LadderInput {
        LadderInput { vault_locked, approve_every_use: every_use, session, actor_allowlisted: allowlisted }
    }

    #[test]
    fn each_rung_in_isolation() {
        use SessionStanding::*;
        assert_eq!(
            decide_ladder(input(true, false, Authorized, false)),
            LadderDecision::Deny { rung: Rung::VaultLocked }
        );
        assert_eq!(decide_ladder(input(false, true, Authorized, false)), LadderDecision::AskPerUse);
        assert_eq!(decide_ladder(input(false, false, New, false)), LadderDecision::AskSessionAuthorization);
        assert_eq!(decide_ladder(input(false, false, New, true)), LadderDecision::Run { rung: Rung::Allowlist });
        assert_eq!(
            decide_ladder(input(false, false, Authorized, false)),
            LadderDecision::Run { rung: Rung::SessionAuthorization }
        );
        assert_eq!(
            decide_ladder(input(false, false, Revoked, true)),
            LadderDecision::Deny { rung: Rung::SessionAuthorization },
            "a revoked run is never reused, allowlist or not"
        );
        assert_eq!(
            decide_ladder(input(false, true, Revoked, false)),
            LadderDecision::Deny { rung: Rung::SessionAuthorization },
            "nobody is asked about a call of a revoked run"
        );
    }

    #[test]
    fn the_order_between_rungs() {
        use SessionStanding::*;
        // A locked vault denies even an allowlisted agent in an authorized run.
        assert_eq!(
            decide_ladder(input(true, false, Authorized, true)),
            LadderDecision::Deny { rung: Rung::VaultLocked }
        );
        // Per-use approval wins over an authorized run and over the allowlist.
        assert_eq!(decide_ladder(input(false, true, Authorized, true)), LadderDecision::AskPerUse);
        assert_eq!(decide_ladder(input(false, true, New, false)), LadderDecision::AskPerUse);
    }

    fn any_input() -> impl Strategy<Value = LadderInput> {
        (
            any::<bool>(),
            any::<bool>(),
            prop_oneof![Just(SessionStanding::Authorized), Just(SessionStanding::New), Just(SessionStanding::Revoked)],
            any::<bool>(),
        )
            .prop_map(|(l, e, s, a)| input(l, e, s, a))
    }

    proptest! {
        /// Whatever else holds: locked ⇒ denied; per-use ⇒ never runs unasked; nothing runs in
        /// a run that was neither authorized nor allowlisted.
        #[test]
        fn nothing_runs_that_a_higher_rung_stops(i in any_input()) {
            let d = decide_ladder(i);
            if i.vault_locked {
                prop_assert_eq!(d, LadderDecision::Deny { rung: Rung::VaultLocked });
            } else if i.session == SessionStanding::Revoked {
                prop_assert_eq!(d, LadderDecision::Deny { rung: Rung::SessionAuthorization });
            }
            if let LadderDecision::Run { .. } = d {
                prop_assert!(!i.vault_locked && !i.approve_every_use);
                prop_assert!(i.session == SessionStanding::Authorized
                    || (i.session == SessionStanding::New && i.actor_allowlisted));
            }
        }
    }
}
