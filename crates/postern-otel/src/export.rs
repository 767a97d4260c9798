//! The exporter: a task that follows the journal from its bookmark and sends what it finds. The
//! journal is the queue: nothing is held for the export on the call path, an endpoint that is
//! away costs a call nothing, and after an outage or a restart the export resumes where its
//! bookmark stands (a row is sent at least once; a span sent twice has the same ids).

use crate::ExportSettings;
use crate::mapping::{self, Ids};
use opentelemetry::InstrumentationScope;
use opentelemetry::logs::{Logger as _, LoggerProvider as _};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::logs::{LogBatch, LogExporter as _, SdkLogRecord, SdkLoggerProvider};
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use postern_core::ExecutionId;
use postern_store::{JournalEntry, JournalView, Store, StoreError};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// The bookmark's name in the journal.
pub const CURSOR: &str = "otlp";

/// Rows read and sent at most at a time.
const BATCH_ROWS: usize = 512;

/// How long a few rows wait for more before they are sent (fewer, larger requests).
const LINGER: Duration = Duration::from_millis(200);

/// The longest wait between attempts while the endpoint is away.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Why the exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("the OTLP exporter could not be built: {0}")]
    Build(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl postern_core::ErrorCode for ExportError {
    fn code(&self) -> &'static str {
        match self {
            ExportError::Build(_) => "export_unavailable",
            ExportError::Store(e) => e.code(),
        }
    }
}

/// What the resource of every exported span and record says: this machine, this user, this
/// installation (and what `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES` add).
pub fn resource(installation: Option<&str>) -> Resource {
    use opentelemetry::KeyValue;
    let mut attributes = vec![KeyValue::new("service.version", env!("CARGO_PKG_VERSION"))];
    if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        attributes.push(KeyValue::new("host.name", host.trim().to_owned()));
    } else if let Ok(host) = std::env::var("HOSTNAME") {
        attributes.push(KeyValue::new("host.name", host));
    }
    if let Some(user) = std::env::var_os("USER").or_else(|| std::env::var_os("LOGNAME")) {
        attributes.push(KeyValue::new("user.name", user.to_string_lossy().into_owned()));
    }
    if let Some(id) = installation {
        attributes.push(KeyValue::new("postern.installation.id", id.to_owned()));
    }
    Resource::builder().with_service_name("postern").with_attributes(attributes).build()
}

/// A batch ready to send: its spans, its log records, and the row it ends at.
struct Batch {
    spans: Vec<SpanData>,
    logs: Vec<SdkLogRecord>,
    last: u64,
}

/// Follows one journal and sends it to one endpoint.
pub struct Exporter {
    settings: ExportSettings,
    store: Arc<Store>,
    view: Arc<JournalView>,
    spans: opentelemetry_otlp::SpanExporter,
    logs: opentelemetry_otlp::LogExporter,
    provider: SdkLoggerProvider,
    scope: InstrumentationScope,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// The wall clock, for the bookmark's times (the exporter is a shell-level task; the journal's
/// own times come from its rows).
fn now() -> postern_core::Timestamp {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
    postern_core::Timestamp::from_millis(i64::try_from(ms).unwrap_or(i64::MAX))
}

fn install_crypto() {
    static PROVIDER: std::sync::Once = std::sync::Once::new();
    // Fails only if another provider was installed first, which is just as good.
    PROVIDER.call_once(|| drop(rustls::crypto::ring::default_provider().install_default()));
}

impl Exporter {
    /// An exporter of the journal at `db` (read on a connection of its own) that `store` writes.
    pub fn new(settings: ExportSettings, store: Arc<Store>, db: &std::path::Path) -> Result<Exporter, ExportError> {
        install_crypto();
        let view = Arc::new(JournalView::open_read_only(db)?);
        let installation = view.installation_id()?;
        let resource = resource(installation.as_deref());
        let client = || {
            reqwest::Client::builder()
                .timeout(settings.timeout)
                // Headers may carry an API key: never replayed to wherever a redirect points.
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| ExportError::Build(e.to_string()))
        };
        let headers: HashMap<String, String> = settings.headers().iter().cloned().collect();
        let build = |e: opentelemetry_otlp::ExporterBuildError| ExportError::Build(e.to_string());
        let mut spans = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(settings.traces.as_str())
            .with_headers(headers.clone())
            .with_timeout(settings.timeout)
            .with_http_client(client()?)
            .build()
            .map_err(build)?;
        spans.set_resource(&resource);
        let mut logs = opentelemetry_otlp::LogExporter::builder()
            .with_http()
            .with_endpoint(settings.logs.as_str())
            .with_headers(headers)
            .with_timeout(settings.timeout)
            .with_http_client(client()?)
            .build()
            .map_err(build)?;
        logs.set_resource(&resource);
        let scope = InstrumentationScope::builder("postern").with_version(env!("CARGO_PKG_VERSION")).build();
        Ok(Exporter { settings, store, view, spans, logs, provider: SdkLoggerProvider::builder().build(), scope })
    }

    /// Sends the journal until `stop` resolves: from the bookmark, or, the first time, from the
    /// journal's end as it is now (the export covers what happens once it is set up).
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        let target = self.settings.target();
        let mut cursor = match self.start().await {
            Ok(seq) => seq,
            Err(e) => {
                tracing::error!(error = %e, "the OpenTelemetry export cannot read its bookmark; it is off");
                return;
            }
        };
        let mut committed = self.store.journal_size();
        let mut backoff = Duration::from_millis(500);
        loop {
            let size = *committed.borrow_and_update();
            if size <= cursor {
                tokio::select! {
                    changed = committed.changed() => if changed.is_err() { return },
                    () = &mut stop => return,
                }
                continue;
            }
            if size - cursor < BATCH_ROWS as u64 {
                // A few rows: wait a moment for more, so a burst goes in one request.
                tokio::select! {
                    () = tokio::time::sleep(LINGER) => {}
                    () = &mut stop => return,
                }
            }
            // A stop in the middle of a send leaves the bookmark where it was: the batch goes again
            // at the next start.
            let work = async {
                match self.batch(cursor).await {
                    Ok(batch) => self.send(batch).await,
                    Err(e) => Err(e.to_string()),
                }
            };
            let sent = tokio::select! {
                sent = work => sent,
                () = &mut stop => return,
            };
            let now = now();
            match sent {
                Ok(last) => {
                    cursor = last;
                    backoff = Duration::from_millis(500);
                    if let Err(e) = self.store.export_progress(CURSOR, &target, cursor, now).await {
                        tracing::warn!(error = %e, "the OpenTelemetry export's bookmark was not kept");
                    }
                }
                Err(why) => {
                    tracing::warn!(error = %why, target = %target, "OpenTelemetry export failed; retrying from the journal");
                    let _ = self.store.export_failed(CURSOR, &target, cursor, &why, now).await;
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = &mut stop => return,
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// The bookmark, or a new one at the journal's end (kept at once, so a crash before the
    /// first send cannot move it past rows written meanwhile).
    async fn start(&self) -> Result<u64, StoreError> {
        let view = Arc::clone(&self.view);
        let found = tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
            Ok((view.export_cursor(CURSOR)?, view.head()?.size))
        })
        .await
        .map_err(|e| StoreError::Corrupt(e.to_string()))??;
        match found {
            (Some(cursor), _) => Ok(cursor.seq),
            (None, head) => {
                self.store.export_progress(CURSOR, &self.settings.target(), head, now()).await?;
                Ok(head)
            }
        }
    }

    /// The rows after `cursor`, as spans and log records.
    async fn batch(&self, cursor: u64) -> Result<Batch, StoreError> {
        let view = Arc::clone(&self.view);
        let arguments_of = self.settings.arguments_of.clone();
        let scope = self.scope.clone();
        let logger = self.provider.logger("postern");
        tokio::task::spawn_blocking(move || {
            let rows = view.rows_after(cursor, BATCH_ROWS)?;
            let last = rows.last().map_or(cursor, |r| r.row.seq);
            // Each execution's timeline, read once per batch.
            let mut timelines: HashMap<ExecutionId, (Vec<JournalEntry>, Ids)> = HashMap::new();
            let observed = std::time::SystemTime::now();
            let mut spans = Vec::new();
            let mut logs = Vec::with_capacity(rows.len());
            for entry in &rows {
                let execution = match entry.row.execution_id {
                    Some(id) => {
                        if let std::collections::hash_map::Entry::Vacant(slot) = timelines.entry(id) {
                            let timeline = view.timeline(id)?;
                            let ids = Ids::of(id, timeline.first());
                            slot.insert((timeline, ids));
                        }
                        timelines.get(&id)
                    }
                    None => None,
                };
                let tool = execution.and_then(|(t, _)| t.first()).and_then(|a| a.row.detail["tool"].as_str());
                let arguments = tool.is_some_and(|t| arguments_of.contains(t));
                logs.push(mapping::log_record(
                    logger.create_log_record(),
                    entry,
                    execution.map(|(_, ids)| ids),
                    arguments,
                    observed,
                ));
                if let Some((timeline, ids)) = execution
                    && mapping::ends_span(entry)
                    && !timeline.iter().any(|e| e.row.seq < entry.row.seq && mapping::ends_span(e))
                {
                    let upto: Vec<JournalEntry> =
                        timeline.iter().filter(|e| e.row.seq <= entry.row.seq).cloned().collect();
                    spans.push(mapping::span(&upto, entry, ids, &arguments_of, &scope));
                }
            }
            Ok(Batch { spans, logs, last })
        })
        .await
        .map_err(|e| StoreError::Corrupt(e.to_string()))?
    }

    /// Sends a batch: its spans, then its log records. The error is the exporter's words (they
    /// never hold a header's value).
    async fn send(&self, batch: Batch) -> Result<u64, String> {
        if !batch.spans.is_empty() {
            self.spans.export(batch.spans).await.map_err(|e| format!("traces: {e}"))?;
        }
        if !batch.logs.is_empty() {
            let pairs: Vec<(&SdkLogRecord, &InstrumentationScope)> =
                batch.logs.iter().map(|r| (r, &self.scope)).collect();
            self.logs.export(LogBatch::new(&pairs)).await.map_err(|e| format!("logs: {e}"))?;
        }
        Ok(batch.last)
    }
}
