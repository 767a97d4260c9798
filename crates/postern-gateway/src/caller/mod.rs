//! Who is calling: the agent process behind a connection (its executable and hash, as the
//! kernel tells it over `SO_PEERCRED` or `sock_diag`), the runs that make its default intent
//! scope (the Sessions journal), and the provenance of a change asked over the control socket.

pub mod connection;
mod executable;
mod hash_cache;
pub mod identity;
pub mod provenance;
pub mod runs;
pub mod sock_diag;
