//! The pure domain of Postern: what an action *is*, how it is named, and how a retry is decided.
//!
//! Nothing in this crate does I/O, reads a clock, or spawns a task: time and randomness are
//! parameters, so every decision here is a function of its inputs and can be tested exhaustively.
//! See `ARCHITECTURE.md` at the repository root for how the crates fit together.

pub mod canonical;
pub mod channel;
pub mod contract;
pub mod fingerprint;
pub mod id;
pub mod ladder;
pub mod lifecycle;
pub mod merkle;
pub mod outside;
pub mod record;
pub mod retry;
pub mod time;
pub mod trace;

pub use canonical::{CanonicalError, canonical_bytes};
pub use channel::Channel;
pub use contract::{
    AttachWindow, ContractError, ReplayClass, ReplayContract, ScopePolicy, StatusAnswer, StatusMeaning, StatusQuery,
    effective_contract,
};
pub use fingerprint::{Fingerprint, FingerprintKey, FingerprintParseError};
pub use id::{ExecutionId, IdError, SessionId};
pub use ladder::{LadderDecision, LadderInput, Rung, SessionStanding, decide_ladder};
pub use lifecycle::{ExecutionState, IllegalTransition};
pub use outside::Outside;
pub use record::{
    ActionRequest, ActionTarget, Actor, CanonicalAction, HttpAction, IntentScope, McpAction, McpOperation, RecordError,
    SshAction,
};
pub use retry::{
    IncomingIntent, PriorExecution, RetryDecision, ReviewReason, Verification, decide_retry, key_forgotten,
};
pub use time::{Clock, Timestamp};

/// Every error a library crate returns carries a stable, machine-readable code that the UI,
/// the CLI's JSON output and MCP error results can switch on.
pub trait ErrorCode {
    /// A short `snake_case` code, stable across releases (e.g. `illegal_transition`).
    fn code(&self) -> &'static str;
}
