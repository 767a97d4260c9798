//! Postern's engine: what tools exist (manifests with replay contracts) and, in later modules,
//! how one call travels accept → authorize → dispatch → observe → deliver.

pub mod engine;
pub mod http;
pub mod manifest;

pub use engine::{
    Approver, Authorization, AuthorizationRequest, Call, CallOutcome, Engine, EngineError, LockOnlyApprover,
};
pub use manifest::{Manifest, ManifestError, Tool};
