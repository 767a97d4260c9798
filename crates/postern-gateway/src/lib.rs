//! Postern's engine: what tools exist (manifests with replay contracts) and, in later modules,
//! how one call travels accept → authorize → dispatch → observe → deliver.

pub mod control;
pub mod delivery;
pub mod engine;
pub mod http;
pub mod identity;
pub mod manifest;
pub mod mcp;
pub mod runs;
pub mod serve;
pub mod socket;
pub mod streamable;

pub use engine::{
    Approver, Ask, Authorization, AuthorizationRequest, Call, CallOutcome, CancelSignal, Engine, EngineError, Grant,
    LockOnlyApprover,
};
pub use manifest::{Manifest, ManifestError, Tool};
