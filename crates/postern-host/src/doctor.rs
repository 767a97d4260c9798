//! `postern doctor`: what a newcomer (or a support thread) needs to know about this machine's
//! Postern — the keychain, the data directory, the journal, the sockets, the HTTP port, a running
//! gateway, the agent configs — each check with what it found and, when it is not fine, the fix.
//! It reads and probes; it changes nothing.

use crate::import;
use postern_gateway::door::control::{ControlReply, ControlRequest, GatewayInfo};
use postern_vault::{OsKeychain, SecretStore};
use serde::Serialize;
use std::path::Path;

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Ok,
    /// Works, but something deserves attention (e.g. an agent config that bypasses Postern).
    Warn,
    /// Postern cannot work like this.
    Fail,
}

/// One check: what was looked at, what was found, and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub verdict: Verdict,
    pub found: String,
    /// What to do; empty when there is nothing to do.
    pub fix: String,
}

impl Check {
    fn ok(name: &'static str, found: impl Into<String>) -> Check {
        Check { name, verdict: Verdict::Ok, found: found.into(), fix: String::new() }
    }

    fn warn(name: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { name, verdict: Verdict::Warn, found: found.into(), fix: fix.into() }
    }

    fn fail(name: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { name, verdict: Verdict::Fail, found: found.into(), fix: fix.into() }
    }
}

/// Every check, in the order a person would look: versions, the keychain, the data directory
/// and its journal, the sockets, a running gateway, the HTTP port, the agent configs.
pub fn run(data_dir: &Path, http_port: u16) -> Vec<Check> {
    let gateway = running_gateway(data_dir);
    vec![
        versions(),
        keychain(),
        data_directory(data_dir),
        journal(data_dir),
        socket_directory(data_dir),
        gateway_check(gateway.as_ref()),
        http(gateway.as_ref(), http_port),
        export(data_dir),
        agent_configs(),
    ]
}

/// The OpenTelemetry export, if one was ever set up: how far behind the journal it is and its
/// last error (what the exporter's bookmark in the journal says).
fn export(data_dir: &Path) -> Check {
    const NAME: &str = "export";
    let db = crate::database(data_dir);
    let read = postern_store::JournalView::open_read_only(&db)
        .and_then(|v| Ok((v.export_cursor(postern_otel::CURSOR)?, v.head()?.size)));
    let (cursor, size) = match read {
        Ok((Some(cursor), size)) => (cursor, size),
        Ok((None, _)) => {
            return Check::ok(NAME, "no OpenTelemetry export set up (`postern serve --otlp-endpoint URL`)");
        }
        Err(e) => {
            return Check::warn(
                NAME,
                format!("the export's bookmark cannot be read: {e}"),
                "see `postern doctor`'s journal check",
            );
        }
    };
    let lag = size.saturating_sub(cursor.seq);
    let target = postern_core::Outside::line(&cursor.target).to_string();
    if cursor.seq > size {
        return Check::warn(
            NAME,
            format!(
                "OpenTelemetry to {target}: the bookmark says row {} but the journal ends at row {size}",
                cursor.seq
            ),
            "the bookmark was edited; the next start of the gateway resets it to the journal's end",
        );
    }
    match &cursor.last_error {
        Some(error) => Check::warn(
            NAME,
            format!(
                "OpenTelemetry to {target}: {lag} row(s) behind; last error: {}",
                postern_core::Outside::line(error)
            ),
            "check the endpoint is up and reachable; the export resumes from the journal, nothing is lost",
        ),
        None => Check::ok(NAME, format!("OpenTelemetry to {target}: {lag} row(s) behind")),
    }
}

fn versions() -> Check {
    Check::ok(
        "versions",
        format!(
            "postern {}, SQLite {} (bundled), MCP protocols {}",
            env!("CARGO_PKG_VERSION"),
            postern_store::sqlite_version(),
            postern_gateway::door::mcp::PROTOCOL_VERSIONS
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
}

/// The Secret Service answers and its collection is unlocked: a probe read of an item that does
/// not exist must come back "not there", not an error or a prompt.
fn keychain() -> Check {
    const NAME: &str = "keychain";
    let keychain = match OsKeychain::connect() {
        Ok(k) => k,
        Err(e) => {
            return Check::fail(NAME, format!("no Secret Service: {e}"), postern_vault::HEADLESS_RECIPE);
        }
    };
    match keychain.get("postern-doctor/probe") {
        Ok(_) => Check::ok(NAME, "the Secret Service answers and its default collection is unlocked"),
        Err(e) => Check::fail(
            NAME,
            format!("the Secret Service answered, but a read failed: {e}"),
            "unlock the login keyring (GNOME Keyring, KeePassXC, …) and run `postern doctor` again",
        ),
    }
}

/// The data directory exists, is this user's, and only this user can enter it.
fn data_directory(data_dir: &Path) -> Check {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    const NAME: &str = "data directory";
    let shown = data_dir.display();
    let Ok(meta) = std::fs::metadata(data_dir) else {
        return Check::warn(
            NAME,
            format!("{shown} does not exist yet"),
            "`postern status` (or the first `postern serve`) creates it, owner-only",
        );
    };
    let me = postern_gateway::caller::identity::current_uid().unwrap_or(u32::MAX);
    let mode = meta.permissions().mode() & 0o777;
    if meta.uid() != me {
        return Check::fail(
            NAME,
            format!("{shown} belongs to uid {}, not to you (uid {me})", meta.uid()),
            format!("use a data directory of your own (--data-dir, POSTERN_DATA_DIR), or `chown -R {me} {shown}`"),
        );
    }
    let db = crate::database(data_dir);
    if let Ok(m) = std::fs::metadata(&db)
        && m.permissions().mode() & 0o077 != 0
    {
        return Check::fail(
            NAME,
            format!("{} is mode {:o}: other users can read the journal", db.display(), m.permissions().mode() & 0o777),
            format!("chmod 600 {}*  (and chmod 700 {shown})", db.display()),
        );
    }
    if mode & 0o077 != 0 {
        // The journal itself is owner-only; what others see is which files exist.
        return Check::warn(
            NAME,
            format!("{shown} is mode {mode:o}: other users can list it (the journal inside is owner-only)"),
            format!("chmod 700 {shown}"),
        );
    }
    Check::ok(NAME, format!("{shown}, yours, mode {mode:o}"))
}

/// The journal verifies in full, as `postern audit verify` checks it: the hash chain, and the
/// projections decisions and views read (current states, stored results, the authority tables)
/// against it (≈0.7 s for a million rows).
fn journal(data_dir: &Path) -> Check {
    const NAME: &str = "journal";
    let db = crate::database(data_dir);
    if !db.exists() {
        return Check::warn(NAME, format!("no journal at {} yet", db.display()), "`postern status` creates one");
    }
    match postern_store::audit::verify_with(&db, None, postern_store::audit::VerifyScope::Full, &mut |_, _| {}) {
        Ok(report) if report.intact() => Check::ok(
            NAME,
            format!(
                "{} rows: the hash chain, the current states, the stored results and the authority tables verify \
                 (a wholesale rewrite needs an exported checkpoint to be caught: `postern audit checkpoint`)",
                report.rows
            ),
        ),
        Ok(report) => Check::fail(
            NAME,
            format!(
                "TAMPERING FOUND: {}",
                report.findings.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
            ),
            "keep a copy of the file, then `postern audit verify --checkpoint <your last checkpoint>` to see what \
             changed since it; see docs/src/guide/audit.md",
        ),
        Err(e) => Check::fail(NAME, format!("{} cannot be verified: {e}", db.display()), "see the message"),
    }
}

/// The sockets' directory is this user's and closed to others (or will be created so).
fn socket_directory(data_dir: &Path) -> Check {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    const NAME: &str = "socket directory";
    let dir = postern_gateway::door::socket::runtime_dir(data_dir);
    let Ok(meta) = std::fs::metadata(&dir) else {
        return Check::ok(NAME, format!("{} (created 0700 when a gateway starts)", dir.display()));
    };
    let me = postern_gateway::caller::identity::current_uid().unwrap_or(u32::MAX);
    let mode = meta.permissions().mode() & 0o777;
    if meta.uid() != me || mode & 0o077 != 0 {
        return Check::fail(
            NAME,
            format!("{} is uid {} mode {mode:o}: another user could reach the gateway", dir.display(), meta.uid()),
            format!("stop the gateway, remove {} and start it again (it is recreated 0700)", dir.display()),
        );
    }
    Check::ok(NAME, format!("{}, yours, mode {mode:o}", dir.display()))
}

fn running_gateway(data_dir: &Path) -> Option<GatewayInfo> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
    let asked = runtime.block_on(async {
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            postern_gateway::door::control::request(data_dir, &ControlRequest::GatewayStatus),
        )
        .await
    });
    match asked {
        Ok(Ok(ControlReply::Answer { answer })) => serde_json::from_value(answer).ok(),
        _ => None,
    }
}

fn gateway_check(gateway: Option<&GatewayInfo>) -> Check {
    const NAME: &str = "gateway";
    match gateway {
        Some(g) => {
            let up = (crate::now().as_millis() - g.started_at).max(0) / 1000;
            let found = format!("running: pid {}, up {up} s, approver {}, socket {}", g.pid, g.approver, g.socket);
            if g.approver == "none" {
                Check::warn(
                    NAME,
                    found,
                    "no one can approve a call that needs a reviewer: run `postern serve --approver terminal`, or the \
                     desktop app",
                )
            } else {
                Check::ok(NAME, found)
            }
        }
        None => Check::warn(
            NAME,
            "not running",
            "agents reach Postern only while it runs: `postern serve --approver terminal`, or the desktop app",
        ),
    }
}

fn http(gateway: Option<&GatewayInfo>, port: u16) -> Check {
    const NAME: &str = "http";
    if let Some(g) = gateway {
        return match &g.http {
            Some(url) => Check::ok(NAME, format!("the gateway serves Streamable HTTP at {url}")),
            None => Check::ok(NAME, "the gateway runs without HTTP (--no-http)"),
        };
    }
    match std::net::TcpListener::bind(("127.0.0.1", port)) {
        Ok(_) => Check::ok(NAME, format!("127.0.0.1:{port} is free for the gateway")),
        Err(e) => Check::fail(
            NAME,
            format!("127.0.0.1:{port} is taken by another program ({e})"),
            format!("start the gateway with another port (`postern serve --port N`) or stop what listens on {port}"),
        ),
    }
}

/// The agent configs on this machine: which point at `postern mcp`, and which still launch MCP
/// servers themselves (their tokens in plaintext, their calls outside the journal).
fn agent_configs() -> Check {
    const NAME: &str = "agent configs";
    let Ok(sources) = import::sources(&[]) else {
        return Check::ok(NAME, "none found");
    };
    let (mut through, mut around) = (Vec::new(), Vec::new());
    for source in &sources {
        let Ok(bytes) = std::fs::read(&source.path) else { continue };
        let Ok(config) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
            around.push(format!("{} (not JSON)", source.path.display()));
            continue;
        };
        let (found, skipped) = import::find_servers(&config, source.layout);
        if skipped.iter().any(|s| s.reason == "already Postern") {
            through.push(source.path.display().to_string());
        }
        if !found.is_empty() {
            around.push(format!("{} ({} server(s) launched directly)", source.path.display(), found.len()));
        }
    }
    match (through.is_empty(), around.is_empty()) {
        (_, false) => Check::warn(
            NAME,
            format!(
                "{}bypassing it: {}",
                if through.is_empty() { String::new() } else { format!("through Postern: {}; ", through.join(", ")) },
                around.join(", ")
            ),
            "`postern servers import` moves those servers (and their secrets) behind Postern",
        ),
        (false, true) => Check::ok(NAME, format!("pointing at `postern mcp`: {}", through.join(", "))),
        (true, true) => Check::warn(
            NAME,
            "no agent config found that uses Postern",
            "connect an agent: `claude mcp add postern -- postern mcp` (or add `postern mcp` to its MCP config)",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A data directory others can list is a warning with the `chmod` that fixes it.
    #[test]
    fn an_open_data_directory_is_flagged_with_its_fix() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap_or_else(|e| panic!("{e}"));
        let check = data_directory(dir.path());
        assert_eq!(check.verdict, Verdict::Warn, "{check:?}");
        assert_eq!(check.fix, format!("chmod 700 {}", dir.path().display()));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(data_directory(dir.path()).verdict, Verdict::Ok);
    }

    #[test]
    fn a_taken_port_fails_and_names_the_way_out() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let port = taken.local_addr().unwrap_or_else(|e| panic!("{e}")).port();
        let check = http(None, port);
        assert_eq!(check.verdict, Verdict::Fail, "{check:?}");
        assert!(check.fix.contains("--port"), "{check:?}");
        drop(taken);
        assert_eq!(http(None, port).verdict, Verdict::Ok);
    }
}
