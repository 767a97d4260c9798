//! How a server comes to run: a stdio child started with only its own environment and the
//! secrets put back where they go, or a remote endpoint reached with its credential; the session
//! opened (`server/discover`, else `initialize`) and what it offers listed, page by page, up to
//! a bound.

use super::*;

impl Upstreams {
    pub(super) async fn start(&self, server: &McpServer) -> Result<Running, String> {
        match &server.url {
            Some(url) => self.start_remote(server, url).await,
            None => self.start_stdio(server).await,
        }
    }

    /// A remote Streamable HTTP server, its credential (if any) injected as its header on every
    /// request; the URL must pass the same target rules as an HTTP tool's, and the credential's
    /// binding must allow it. Its answers are read up to the result limit.
    async fn start_remote(&self, server: &McpServer, url: &str) -> Result<Running, String> {
        use rmcp::transport::{
            StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
        };
        let name = &server.name;
        let parsed = url::Url::parse(url).map_err(|e| format!("{name:?}: its URL does not parse: {e}"))?;
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(format!("{name:?}: its URL carries a user name or password; give it a vault credential"));
        }
        crate::channel::http::check_target(&parsed).map_err(|e| format!("{name:?}: {e}"))?;
        let mut headers = HashMap::new();
        let mut secrets = CallSecrets::default();
        if let Some(credential) = &server.credential {
            let c = self.vault.credential(credential).map_err(|e| format!("{name:?} cannot start: {e}"))?;
            if !c.allows(&parsed) {
                return Err(format!("{name:?}: credential {credential:?} is not bound to {url}"));
            }
            let secret = self.vault.secret_of(&c).map_err(|e| format!("{name:?} cannot start: {e}"))?;
            let injected = crate::channel::http::InjectedCredential::new(&c.kind, secret);
            secrets.extend(injected.secrets());
            let header = http::HeaderName::from_bytes(injected.header.as_bytes())
                .map_err(|_| format!("{name:?}: {:?} is not a header name", injected.header))?;
            let mut value = http::HeaderValue::from_str(injected.value.expose())
                .map_err(|_| format!("{name:?}: credential {credential:?} cannot be a header value"))?;
            value.set_sensitive(true);
            headers.insert(header, value);
        }
        let config = StreamableHttpClientTransportConfig::with_uri(url)
            .custom_headers(headers)
            .max_json_response_size(self.message_limit())
            .max_sse_event_size(self.message_limit());
        if server.oauth.is_some() && self.vault.is_locked().unwrap_or(true) {
            return Err(format!("{name:?} cannot start: the vault is locked"));
        }
        let auth = match &server.oauth {
            Some(_) => Some(Arc::new(
                crate::channel::oauth::TokenSource::open(Arc::clone(&self.vault), server, Arc::clone(&self.clock))
                    .await
                    .map_err(|e| e.to_string())?,
            )),
            None => None,
        };
        if auth.is_some() {
            // The marker of the answers Postern makes up for requests it did not send never
            // leaves this process in a message (a start error, a status, a log).
            secrets.add_vault_secret(remote::not_sent_marker());
        }
        let transport = StreamableHttpClientTransport::with_client(
            remote::CappedHttp { http: crate::channel::http::client(), auth },
            config,
        );
        let service = self
            .client()
            .serve_with_lifecycle(transport, lifecycle())
            .await
            .map_err(|e| secrets.mask(&format!("{name:?} did not complete MCP initialization: {e}")))?;
        let running = Running { signs_in: server.oauth.is_some(), ..listed(service, None, name, secrets).await? };
        tracing::info!(server = %name, tools = running.tool_count(), %url, "remote upstream MCP server connected");
        Ok(running)
    }

    async fn start_stdio(&self, server: &McpServer) -> Result<Running, String> {
        let values = self
            .vault
            .mcp_server_secrets(server)
            .map_err(|e: VaultError| format!("{:?} cannot start: {e}", server.name))?;
        let mut secrets = CallSecrets::default();
        for (_, value) in &values {
            secrets.add_vault_secret(value.expose());
        }
        let mut command = child_command(server, &values);
        let mut child =
            command.spawn().map_err(|e| format!("{:?} could not be started ({}): {e}", server.name, server.command))?;
        drop(command);
        drop(values);
        let pid = child.id();
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err("the server's standard streams were not available".into());
        };
        if let Some(stderr) = child.stderr.take() {
            // What the server writes there is outside text, and may be its environment: the log
            // gets it masked and escaped, a line at a time, each at most a few KiB.
            let (name, secrets) = (server.name.clone(), secrets.clone());
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(frames::CappedLines::new(stderr, 8 * 1024)).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let line = secrets.mask(&line);
                    tracing::info!(server = %name, "upstream stderr: {}", Outside::line(&line));
                }
            });
        }
        let stdout = frames::CappedLines::new(stdout, self.message_limit());
        // The child is owned by a task that reaps it once the transport is gone (kill on drop).
        let service = self
            .client()
            .serve_with_lifecycle((stdout, stdin), lifecycle())
            .await
            .map_err(|e| secrets.mask(&format!("{:?} did not complete MCP initialization: {e}", server.name)))?;
        let running = listed(service, pid, &server.name, secrets).await?;
        let exited = Arc::clone(&running.exited);
        tokio::spawn(async move {
            let _ = child.wait().await;
            exited.store(true, std::sync::atomic::Ordering::Release);
        });
        tracing::info!(server = %server.name, tools = running.tool_count(), pid, "upstream MCP server started");
        Ok(running)
    }
}

/// How Postern opens a session with an upstream: `server/discover` for protocol 2026-07-28
/// (where tool changes reach a client through `subscriptions/listen`), falling back to the
/// `initialize` handshake with a server that does not know it.
fn lifecycle() -> rmcp::ClientLifecycleMode {
    rmcp::ClientLifecycleMode::Auto {
        preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
        legacy_version: Some(rmcp::model::ProtocolVersion::V_2025_11_25),
    }
}

/// A server's tools, resources and prompts (the last two where it advertises them).
/// The most pages Postern follows in one list, and the most items it keeps from a server: a
/// server that pages on for ever, or offers more, is refused rather than followed.
const MAX_PAGES: usize = 100;
const MAX_ITEMS: usize = 10_000;

/// Follows a list's `nextCursor` from the first page, up to [`MAX_PAGES`] pages and
/// [`MAX_ITEMS`] items; `page` fetches one page and splits it into its items and the next cursor.
async fn pages<T, Fut>(name: &str, what: &str, mut page: impl FnMut(Option<String>) -> Fut) -> Result<Vec<T>, String>
where
    Fut: std::future::Future<Output = Result<(Vec<T>, Option<String>), rmcp::ServiceError>>,
{
    let mut items = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_PAGES {
        let (more, next) = page(cursor).await.map_err(|e| format!("{name:?} {what}: {e}"))?;
        items.extend(more);
        if items.len() > MAX_ITEMS {
            return Err(format!(
                "{name:?} {what}: it offers more than {MAX_ITEMS} items; Postern lists at most that many"
            ));
        }
        match next {
            Some(next) => cursor = Some(next),
            None => return Ok(items),
        }
    }
    Err(format!("{name:?} {what}: still more pages after {MAX_PAGES}; Postern follows at most that many"))
}

/// What the server offers, with every secret it was given masked (in the listing and in an
/// error about it).
pub(super) async fn listing(
    service: &RunningService<RoleClient, UpstreamClient>,
    name: &str,
    secrets: &CallSecrets,
) -> Result<Listing, String> {
    unmasked_listing(service, name).await.map(|l| l.masked(secrets)).map_err(|e| secrets.mask(&e))
}

async fn unmasked_listing(service: &RunningService<RoleClient, UpstreamClient>, name: &str) -> Result<Listing, String> {
    use rmcp::model::PaginatedRequestParams as Params;
    let peer = service.peer();
    let at = |cursor: Option<String>| Some(Params::default().with_cursor(cursor));
    let tools =
        pages(name, "tools/list", |c| async move { peer.list_tools(at(c)).await.map(|r| (r.tools, r.next_cursor)) })
            .await?;
    let capabilities = peer.peer_info().map(|i| i.capabilities.clone()).unwrap_or_default();
    let resources = match capabilities.resources {
        Some(_) => {
            pages(name, "resources/list", |c| async move {
                peer.list_resources(at(c)).await.map(|r| (r.resources, r.next_cursor))
            })
            .await?
        }
        None => vec![],
    };
    // Templates are optional even for a server with resources: one that does not answer this
    // simply offers none.
    let resource_templates = match capabilities.resources {
        Some(_) => pages(name, "resources/templates/list", |c| async move {
            peer.list_resource_templates(at(c)).await.map(|r| (r.resource_templates, r.next_cursor))
        })
        .await
        .unwrap_or_else(|e| {
            tracing::debug!(server = %name, error = %Outside::line(&e), "no resource templates");
            vec![]
        }),
        None => vec![],
    };
    let prompts = match capabilities.prompts {
        Some(_) => {
            pages(name, "prompts/list", |c| async move {
                peer.list_prompts(at(c)).await.map(|r| (r.prompts, r.next_cursor))
            })
            .await?
        }
        None => vec![],
    };
    Ok(Listing { tools, resources, resource_templates, prompts })
}

/// A freshly initialized server, listed; on protocol 2026-07-28 (where a tools change reaches a
/// client only through `subscriptions/listen`) Postern listens for it.
async fn listed(
    service: RunningService<RoleClient, UpstreamClient>,
    pid: Option<u32>,
    name: &str,
    secrets: CallSecrets,
) -> Result<Running, String> {
    let listing = listing(&service, name, &secrets).await?;
    let client = service.service().clone();
    let announces = service
        .peer()
        .peer_info()
        .is_some_and(|i| i.capabilities.tools.as_ref().is_some_and(|t| t.list_changed == Some(true)));
    let modern =
        service.peer().peer_info().is_some_and(|i| i.protocol_version == rmcp::model::ProtocolVersion::V_2026_07_28);
    let version = service.peer().peer_info().map(|i| i.protocol_version.to_string()).unwrap_or_default();
    tracing::info!(server = %name, protocol = %version, tools_list_changed = announces, "upstream MCP session");
    if announces && modern {
        let filter = rmcp::model::SubscriptionFilter::builder().tools_list_changed().build();
        match service.peer().listen(filter).await {
            Ok(mut subscription) => {
                let client = client.clone();
                tokio::spawn(async move {
                    while let Ok(Some(notification)) = subscription.next().await {
                        if matches!(notification, rmcp::model::ServerNotification::ToolListChangedNotification(_)) {
                            client.changed();
                        }
                    }
                });
            }
            Err(e) => {
                tracing::warn!(server = %name, error = %Outside::line(&secrets.mask(&e.to_string())), "could not listen for the server's tool changes")
            }
        }
    }
    Ok(Running {
        service,
        listing: Mutex::new(listing),
        pid,
        exited: Arc::default(),
        stale: Arc::clone(&client.stale),
        secrets,
        signs_in: false,
    })
}

/// The child's command: only the declared environment and a minimal PATH/HOME/LANG, never
/// Postern's own environment, and the secrets (by name) put back where they go — an environment
/// value, or their place in an argument. stdout is the MCP stream, stderr goes to Postern's log.
fn child_command(server: &McpServer, secrets: &[(String, Sensitive<String>)]) -> tokio::process::Command {
    let secret = |name: &str| secrets.iter().find(|(k, _)| k == name).map_or("", |(_, v)| v.expose().as_str());
    let mut command = tokio::process::Command::new(&server.command);
    for (i, arg) in server.args.iter().enumerate() {
        match server.secret_args.iter().find(|a| a.index == i) {
            Some(a) => command.arg(format!("{}{}{}", a.prefix, secret(&a.name), a.suffix)),
            None => command.arg(arg),
        };
    }
    command.env_clear();
    for key in ["PATH", "HOME", "LANG"] {
        if let Some(v) = std::env::var_os(key) {
            command.env(key, v);
        }
    }
    command.envs(&server.env);
    for k in &server.secret_env {
        command.env(k, secret(k));
    }
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    command
}
