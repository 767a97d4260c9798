//! Postern's gateway: the roles above the engine (`postern-engine`), lowest first: `caller`
//! (who is calling), `delivery` (did the result reach the agent) and `door` (where agents and
//! the owner reach Postern). A module imports only from its own role or a lower one
//! (`scripts/module-graph.py` checks it in CI); the engine cannot import from here at all.

pub mod caller;
pub mod delivery;
pub mod door;
