//! Postern's gateway, laid out by role from the lowest: `catalog` (what tools exist and what
//! they send), `channel` (how a call reaches its target), `approval` (who decides), `engine`
//! (one call's execution: prepare → admit → authorize → dispatch → observe), `caller` (who is
//! calling), `delivery` (did the result reach the agent) and `door` (where agents and the owner
//! reach Postern). A module imports only from its own role or a lower one
//! (`scripts/module-graph.py` checks it in CI).

pub mod approval;
pub mod caller;
pub mod catalog;
pub mod channel;
pub mod delivery;
pub mod door;
pub mod engine;

pub use approval::{
    AgentRun, Approver, Ask, Authorization, AuthorizationRequest, ChangeRequest, Grant, LockOnlyApprover,
    RetryReviewRequest, ReviewAnswer, ReviewChoice, ReviewVerdict,
};
pub use catalog::manifest::{Manifest, ManifestError, Tool};
pub use engine::{Bound, Call, CallOutcome, CancelSignal, Decision, Engine, EngineError};
