//! Postern's engine: what tools exist (manifests with replay contracts) and, in later modules,
//! how one call travels accept → authorize → dispatch → observe → deliver.

pub mod manifest;

pub use manifest::{Manifest, ManifestError, Tool};
