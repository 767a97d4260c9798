//! Postern's journal, exported to OpenTelemetry: the team reads what its agents did in the
//! observability stack it already runs (any OTLP endpoint: the OpenTelemetry Collector and what
//! stands behind it).
//!
//! The journal is the source: an [`Exporter`] follows it from a bookmark kept in the journal's
//! database, sends each execution as a span (from `accepted` to its outcome, an event per step)
//! and every row as a log record, with the MCP semantic conventions where they apply and
//! Postern's own attributes under `postern.*`. Nothing on the call path waits for it: an endpoint
//! that is away costs a call nothing, and once it is back the export resumes from the bookmark,
//! so an outage or a restart leaves no gap. No secret is in the journal, and of the journal only
//! fields on a fixed list leave (arguments only for the tools the owner names).

mod export;
mod mapping;
mod settings;

pub use export::{CURSOR, ExportError, Exporter, resource};
pub use settings::{DEFAULT_TIMEOUT, ExportSettings, SettingsError};
