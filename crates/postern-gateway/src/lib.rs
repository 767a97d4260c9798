//! Postern's engine: what tools exist (manifests with replay contracts) and, in later modules,
//! how one call travels accept → authorize → dispatch → observe → deliver.

pub mod approval;
pub mod control;
pub mod delivery;
pub mod engine;
pub mod http;
pub mod identity;
pub mod manifest;
pub mod mcp;
pub mod provenance;
pub mod redaction;
pub mod refusal;
pub mod resumption;
pub mod runs;
pub mod serve;
pub mod sock_diag;
pub mod socket;
pub mod ssh;
pub mod ssh_pool;
pub mod streamable;
pub mod tasks;
pub mod template;
pub mod upstream;

pub use approval::{
    AgentRun, Approver, Ask, Authorization, AuthorizationRequest, ChangeRequest, Grant, LockOnlyApprover,
    RetryReviewRequest, ReviewAnswer, ReviewChoice, ReviewVerdict,
};
pub use engine::{Bound, Call, CallOutcome, CancelSignal, Decision, Engine, EngineError};
pub use manifest::{Manifest, ManifestError, Tool};
