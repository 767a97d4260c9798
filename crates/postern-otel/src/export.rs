//! The exporter: a task that follows the journal from its bookmark and sends what it finds. The
//! journal is the queue: nothing is held for the export on the call path, an endpoint that is
//! away costs a call nothing, and after an outage or a restart the export resumes where its
//! bookmark stands (a row is sent at least once; a span sent twice has the same ids). A batch the
//! endpoint refuses for good (a 4xx other than 408/429) is halved until the one row it cannot
//! take is found, and that row is skipped with its reason kept: one row never stops the export.

use crate::ExportSettings;
use crate::mapping::{self, Ids, MAX_EVENTS, OUTCOMES};
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

/// The HTTP client both exporters send with: the workspace's reqwest (no redirects: headers may
/// carry an API key), and exactly the export's headers — the OTLP library adds the
/// `OTEL_EXPORTER_OTLP_*HEADERS` variables by itself, after Postern's, so they are set again
/// here (a flag wins) and the ones this export does not send are taken out.
#[derive(Debug, Clone)]
struct Headed {
    client: reqwest::Client,
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    unsent: Vec<http::HeaderName>,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Headed {
    async fn send_bytes(
        &self,
        mut request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        for name in &self.unsent {
            request.headers_mut().remove(name);
        }
        for (name, value) in &self.headers {
            request.headers_mut().insert(name.clone(), value.clone());
        }
        self.client.send_bytes(request).await
    }
}

/// A batch ready to send: its spans, its log records, the row it ends at and how many rows.
struct Batch {
    spans: Vec<SpanData>,
    logs: Vec<SdkLogRecord>,
    last: u64,
    rows: usize,
}

/// Why a batch was not sent.
enum Failed {
    /// Try again later (the endpoint is away, busy, or timed out).
    Retry(String),
    /// The endpoint refused it and will refuse it again (a 4xx other than 408 or 429).
    Refused(String),
}

/// Whether an exporter's error is a refusal that sending again cannot change.
fn permanent(error: &str) -> bool {
    error
        .split("status code: ")
        .nth(1)
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse::<u16>().ok())
        .is_some_and(|code| (400..500).contains(&code) && code != 408 && code != 429)
}

/// Follows one journal and sends it to one endpoint.
pub struct Exporter {
    settings: ExportSettings,
    store: Arc<Store>,
    view: Arc<JournalView>,
    spans: Option<opentelemetry_otlp::SpanExporter>,
    logs: Option<opentelemetry_otlp::LogExporter>,
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
        let built = |e: String| ExportError::Build(e);
        let client = Headed {
            client: reqwest::Client::builder()
                .timeout(settings.timeout)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| built(e.to_string()))?,
            headers: settings
                .headers()
                .iter()
                .map(|(k, v)| {
                    let name = http::HeaderName::from_bytes(k.as_bytes()).map_err(|e| built(e.to_string()))?;
                    let value =
                        http::HeaderValue::from_str(v).map_err(|_| built(format!("header {k}: not a value")))?;
                    Ok((name, value))
                })
                .collect::<Result<_, ExportError>>()?,
            unsent: settings.unsent.iter().filter_map(|k| http::HeaderName::from_bytes(k.as_bytes()).ok()).collect(),
        };
        let build = |e: opentelemetry_otlp::ExporterBuildError| ExportError::Build(e.to_string());
        let spans = match &settings.traces {
            Some(url) => {
                let mut spans = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_endpoint(url.as_str())
                    .with_timeout(settings.timeout)
                    .with_http_client(client.clone())
                    .build()
                    .map_err(build)?;
                spans.set_resource(&resource);
                Some(spans)
            }
            None => None,
        };
        let logs = match &settings.logs {
            Some(url) => {
                let mut logs = opentelemetry_otlp::LogExporter::builder()
                    .with_http()
                    .with_endpoint(url.as_str())
                    .with_timeout(settings.timeout)
                    .with_http_client(client)
                    .build()
                    .map_err(build)?;
                logs.set_resource(&resource);
                Some(logs)
            }
            None => None,
        };
        let scope = InstrumentationScope::builder("postern").with_version(env!("CARGO_PKG_VERSION")).build();
        Ok(Exporter { settings, store, view, spans, logs, provider: SdkLoggerProvider::builder().build(), scope })
    }

    /// Sends the journal until `stop` resolves: from the bookmark, or, the first time (or for a
    /// new endpoint), from the journal's end as it is now.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        let target = self.settings.target();
        let mut cursor = match self.start(&target).await {
            Ok(seq) => seq,
            Err(e) => {
                tracing::error!(error = %e, "the OpenTelemetry export cannot read its bookmark; it is off");
                return;
            }
        };
        let mut committed = self.store.journal_size();
        let mut backoff = Duration::from_millis(500);
        let mut rows = BATCH_ROWS;
        loop {
            let size = *committed.borrow_and_update();
            if size <= cursor {
                tokio::select! {
                    changed = committed.changed() => if changed.is_err() { return },
                    () = &mut stop => return,
                }
                continue;
            }
            if size - cursor < rows as u64 && rows == BATCH_ROWS {
                // A few rows: wait a moment for more, so a burst goes in one request (not while a
                // refused batch is being halved).
                tokio::select! {
                    () = tokio::time::sleep(LINGER) => {}
                    () = &mut stop => return,
                }
            }
            // A stop in the middle of a send leaves the bookmark where it was: the batch goes again
            // at the next start.
            let work = async {
                match self.batch(cursor, rows).await {
                    Ok(batch) => {
                        let read = batch.rows;
                        (self.send(batch).await, read)
                    }
                    Err(e) => (Err(Failed::Retry(e.to_string())), rows),
                }
            };
            let (sent, read) = tokio::select! {
                sent = work => sent,
                () = &mut stop => return,
            };
            match sent {
                Ok(last) => {
                    cursor = last;
                    backoff = Duration::from_millis(500);
                    rows = (rows * 2).min(BATCH_ROWS);
                    if let Err(e) = self.store.export_progress(CURSOR, &target, cursor, now()).await {
                        tracing::warn!(error = %e, "the OpenTelemetry export's bookmark was not kept");
                    }
                }
                Err(Failed::Refused(why)) if read > 1 => {
                    // Refused for good: find the row it cannot take, halving the batch.
                    tracing::warn!(error = %why, rows = read, "OpenTelemetry export refused a batch; sending it in halves");
                    rows = read / 2;
                }
                Err(Failed::Refused(why)) => {
                    let skipped = cursor + 1;
                    let said = format!("row {skipped} was refused by the endpoint and skipped: {why}");
                    tracing::error!(error = %said, target = %target, "OpenTelemetry export skipped a row");
                    cursor = skipped;
                    rows = BATCH_ROWS;
                    let _ = self.store.export_progress(CURSOR, &target, cursor, now()).await;
                    let _ = self.store.export_failed(CURSOR, &target, cursor, &said, now()).await;
                }
                Err(Failed::Retry(why)) => {
                    tracing::warn!(error = %why, target = %target, "OpenTelemetry export failed; retrying from the journal");
                    let _ = self.store.export_failed(CURSOR, &target, cursor, &why, now()).await;
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = &mut stop => return,
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// The bookmark; a new one at the journal's end the first time, or when the endpoint changed
    /// (a new endpoint is not sent an old backlog), or when it is ahead of the journal (edited:
    /// said in its error). Kept at once, so a crash before the first send cannot move it past
    /// rows written meanwhile.
    async fn start(&self, target: &str) -> Result<u64, StoreError> {
        let view = Arc::clone(&self.view);
        let (found, head) = tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
            Ok((view.export_cursor(CURSOR)?, view.head()?.size))
        })
        .await
        .map_err(|e| StoreError::Corrupt(e.to_string()))??;
        match found {
            Some(cursor) if cursor.target == target && cursor.seq <= head => Ok(cursor.seq),
            found => {
                self.store.export_progress(CURSOR, target, head, now()).await?;
                if let Some(cursor) = found.filter(|c| c.seq > head) {
                    let said = format!(
                        "the bookmark said row {} but the journal ends at row {head} (edited?): restarted at the end",
                        cursor.seq
                    );
                    tracing::warn!(%said, "OpenTelemetry export");
                    self.store.export_failed(CURSOR, target, head, &said, now()).await?;
                }
                Ok(head)
            }
        }
    }

    /// The first `rows` rows after `cursor`, as spans and log records. What it reads of each
    /// execution is bounded: its `accepted` row, its first outcome's position, and, for the span,
    /// at most [`MAX_EVENTS`] rows.
    async fn batch(&self, cursor: u64, rows: usize) -> Result<Batch, StoreError> {
        let view = Arc::clone(&self.view);
        let arguments_of = self.settings.arguments_of.clone();
        let scope = self.scope.clone();
        let logger = self.provider.logger("postern");
        tokio::task::spawn_blocking(move || {
            let rows = view.rows_after(cursor, rows)?;
            let last = rows.last().map_or(cursor, |r| r.row.seq);
            let read = rows.len();
            // A log record per lifecycle step: a folded row (a read-only call's steps up to its
            // dispatch) is one record per step it holds, as the timeline reads it.
            let rows: Vec<JournalEntry> = rows.into_iter().flat_map(JournalEntry::unfold).collect();
            // Each execution's `accepted` row, ids and first outcome, read once per batch.
            struct Known {
                accepted: Option<JournalEntry>,
                ids: Ids,
                outcome: Option<u64>,
            }
            let mut known: HashMap<ExecutionId, Known> = HashMap::new();
            let observed = std::time::SystemTime::now();
            let mut spans = Vec::new();
            let mut logs = Vec::with_capacity(rows.len());
            for entry in &rows {
                let execution = match entry.row.execution_id {
                    Some(id) => {
                        if let std::collections::hash_map::Entry::Vacant(slot) = known.entry(id) {
                            let accepted = view.timeline_until(id, u64::MAX, 1)?.into_iter().next();
                            let ids = Ids::of(id, accepted.as_ref());
                            let outcome = view.first_state_row(id, &OUTCOMES)?;
                            slot.insert(Known { accepted, ids, outcome });
                        }
                        known.get(&id).map(|k| (id, k))
                    }
                    None => None,
                };
                let tool = execution.and_then(|(_, k)| k.accepted.as_ref()).and_then(|a| a.row.detail["tool"].as_str());
                let arguments = tool.is_some_and(|t| arguments_of.contains(t));
                logs.push(mapping::log_record(
                    logger.create_log_record(),
                    entry,
                    execution.map(|(_, k)| &k.ids),
                    arguments,
                    observed,
                ));
                if let Some((id, k)) = execution
                    && k.outcome == Some(entry.row.seq)
                {
                    let timeline = view.timeline_until(id, entry.row.seq, MAX_EVENTS)?;
                    spans.push(mapping::span(&timeline, entry, &k.ids, &arguments_of, &scope));
                }
            }
            Ok(Batch { spans, logs, last, rows: read })
        })
        .await
        .map_err(|e| StoreError::Corrupt(e.to_string()))?
    }

    /// Sends a batch: its spans, then its log records (each only where that signal is on). The
    /// error is the exporter's words (they never hold a header's value).
    async fn send(&self, batch: Batch) -> Result<u64, Failed> {
        let failed = |signal: &str, e: opentelemetry_sdk::error::OTelSdkError| {
            let said = format!("{signal}: {e}");
            if permanent(&said) { Failed::Refused(said) } else { Failed::Retry(said) }
        };
        if let Some(spans) = &self.spans
            && !batch.spans.is_empty()
        {
            spans.export(batch.spans).await.map_err(|e| failed("traces", e))?;
        }
        if let Some(logs) = &self.logs
            && !batch.logs.is_empty()
        {
            let pairs: Vec<(&SdkLogRecord, &InstrumentationScope)> =
                batch.logs.iter().map(|r| (r, &self.scope)).collect();
            logs.export(LogBatch::new(&pairs)).await.map_err(|e| failed("logs", e))?;
        }
        Ok(batch.last)
    }
}

#[cfg(test)]
mod tests {
    use super::permanent;

    #[test]
    fn only_a_refusal_that_will_repeat_is_permanent() {
        for (said, is) in [
            ("traces: InternalFailure(\"HTTP export failed with status code: 400\")", true),
            ("logs: HTTP export failed with status code: 413", true),
            ("logs: HTTP export failed with status code: 404", true),
            ("logs: HTTP export failed with status code: 429", false),
            ("logs: HTTP export failed with status code: 408", false),
            ("traces: HTTP export failed with status code: 503", false),
            ("traces: HTTP export failed: network error", false),
            ("traces: Timeout(10s)", false),
        ] {
            assert_eq!(permanent(said), is, "{said}");
        }
    }
}
