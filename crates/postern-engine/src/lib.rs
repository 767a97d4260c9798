//! Postern's engine, laid out by role from the lowest: `catalog` (what tools exist and what
//! they send), `channel` (how a call reaches its target), `approval` (who decides) and `engine`
//! (one call's execution: prepare → admit → authorize → dispatch → observe). A module imports
//! only from its own role or a lower one (`scripts/module-graph.py` checks it in CI); nothing
//! here knows who is calling or through which door: that is `postern-gateway`, above this crate.

pub mod approval;
pub mod catalog;
pub mod channel;
pub mod engine;

pub use approval::{
    AgentRun, Approver, Ask, Authorization, AuthorizationRequest, ChangeRequest, Grant, LockOnlyApprover,
    RetryReviewRequest, ReviewAnswer, ReviewChoice, ReviewVerdict,
};
pub use catalog::manifest::{Manifest, ManifestError, Tool};
pub use engine::{Bound, Call, CallOutcome, CancelSignal, Decision, Engine, EngineError, Opening, StepDetail};
