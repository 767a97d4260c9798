//! A remote MCP server that signs in with OAuth, end to end on real parts: the counting server
//! behind the official Python SDK's own authorization server and bearer middleware
//! (`tests/upstreams/oauth_provider.py`), `postern servers login` with the test playing the
//! browser, the gateway calling through the tokens, refreshing them, and refusing calls with
//! `oauth_login_required` once a refresh cannot work. Grants are counted at the server; every
//! token it issued is grepped for in every file Postern wrote and everything it printed.

use super::gateway_support::{Agent, Gateway, Sdk, repo_root};
use super::support::{Run, file_containing, postern_with};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn python() -> PathBuf {
    repo_root().join("tests/clients/python/.venv/bin/python")
}

/// The protected server on a free port, with access tokens living `ttl` seconds.
struct AuthServer {
    child: Child,
    dir: tempfile::TempDir,
    url: String,
}

impl AuthServer {
    fn start(ttl: u64) -> AuthServer {
        AuthServer::start_with(ttl, &[])
    }

    /// With more of the server's environment (`OAUTH_CIMD=1`: it takes Client ID Metadata
    /// Documents, served over HTTPS on a port of its own).
    fn start_with(ttl: u64, env: &[(&str, &str)]) -> AuthServer {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(python())
            .arg(repo_root().join("tests/upstreams/counting.py"))
            .args(["--oauth", &port.to_string()])
            .env("COUNTER_DIR", dir.path())
            .env("OAUTH_TTL", ttl.to_string())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        super::gateway_support::eventually("the OAuth server listening", Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        });
        AuthServer { child, dir, url: format!("http://127.0.0.1:{port}/mcp") }
    }

    /// The https URL of a Client ID Metadata Document the server's document host serves: the
    /// template the book ships, with its client ID set to that URL.
    fn host_client_document(&self) -> String {
        let port_file = self.dir.path().join("cimd_port");
        let port = super::gateway_support::eventually("the document host", Duration::from_secs(20), || {
            std::fs::read_to_string(&port_file).ok().filter(|p| !p.is_empty())
        });
        let url = format!("https://127.0.0.1:{port}/postern/client.json");
        let template = repo_root().join("docs/src/guide/oauth-client-metadata.json");
        let mut document: Value = serde_json::from_str(&std::fs::read_to_string(template).unwrap()).unwrap();
        document["client_id"] = json!(url);
        std::fs::create_dir_all(self.dir.path().join("documents/postern")).unwrap();
        std::fs::write(self.dir.path().join("documents/postern/client.json"), document.to_string()).unwrap();
        url
    }

    /// The records of one kind of grant.
    fn records(&self, grant: &str) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("oauth.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|r| r["grant"] == grant)
            .collect()
    }

    /// What the authorization server did, in order (`register`, `authorize`,
    /// `authorization_code`, `refresh_token`, `revoke`).
    fn grants(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("oauth.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["grant"].as_str().unwrap().to_owned())
            .collect()
    }

    fn count(&self, grant: &str) -> usize {
        self.grants().iter().filter(|g| *g == grant).count()
    }

    /// Every code and token the server issued.
    fn issued(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("issued_tokens.txt"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn effects(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("effects.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for AuthServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Plays the browser: fetches `url`, following redirects (the authorization server's, then
/// Postern's loopback listener), and returns the last page's status and text.
fn browse(url: &str) -> (u16, String) {
    let script = "import sys, urllib.request, urllib.error\n\
                  try:\n    r = urllib.request.urlopen(sys.argv[1], timeout=20); print(r.status); print(r.read().decode())\n\
                  except urllib.error.HTTPError as e:\n    print(e.code); print(e.read().decode())\n";
    let out = Command::new(python()).args(["-c", script, url]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (status, page) = text.split_once('\n').unwrap_or((&text, ""));
    (status.trim().parse().unwrap_or(0), page.to_owned())
}

/// `postern servers login NAME --no-browser`, the browser played by `visit` (given the
/// printed URL, before the real redirect is followed when it returns true).
fn login(data: &Path, name: &str, visit: impl FnOnce(&str) -> bool) -> Run {
    let mut child = Command::new(super::gateway_support::postern_bin())
        .args(["--data-dir", data.to_str().unwrap(), "servers", "login", name, "--no-browser", "--wait", "30"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut url = String::new();
    stdout.read_line(&mut url).unwrap();
    let url = url.trim().to_owned();
    if visit(&url) {
        let (status, page) = browse(&url);
        assert_eq!(status, 200, "the listener's page after the redirect: {page}");
        assert!(page.contains("Signed in"), "{page}");
    }
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: format!("{url}\n{rest}"),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The sign-in's redirect URI and state, read from the authorization URL.
fn redirect_of(url: &str) -> (String, String) {
    let parsed = url::Url::parse(url).unwrap();
    let get = |k: &str| parsed.query_pairs().find(|(q, _)| q == k).unwrap().1.into_owned();
    (get("redirect_uri"), get("state"))
}

/// The journal's vault rows of event `event`.
fn vault_rows(data: &Path, event: &str) -> Vec<Value> {
    let conn =
        rusqlite::Connection::open_with_flags(data.join("postern.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut stmt = conn.prepare("SELECT body FROM journal WHERE stream = 'vault' ORDER BY seq").unwrap();
    let rows: Vec<String> = stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect();
    rows.iter()
        .map(|b| serde_json::from_str::<Value>(b).unwrap())
        .filter(|b| b["head"]["event"] == event)
        .map(|b| b["payload"].clone())
        .collect()
}

fn sign_in_state(data: &Path, name: &str) -> Value {
    let listed = postern_with(&["servers", "list", "--json"], Some(data), None, &[]);
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let all: Vec<Value> = serde_json::from_str(&listed.stdout).unwrap();
    all.into_iter().find(|s| s["name"] == name).unwrap()["sign_in"]["state"].clone()
}

/// Every token and code the server issued is absent from every file under the data directory,
/// from the gateway's log and from what the commands printed.
fn no_token_leaked(server: &AuthServer, data: &Path, printed: &[&str]) {
    let issued = server.issued();
    assert!(!issued.is_empty(), "the server issued tokens");
    for token in &issued {
        assert_eq!(file_containing(data, token), None, "a token or code reached a file Postern wrote");
        for text in printed {
            assert!(!text.contains(token.as_str()), "a token or code was printed or logged");
        }
    }
}

#[test]
fn a_server_signed_in_with_oauth_is_called_refreshed_once_and_refused_when_the_grant_is_gone() {
    let server = AuthServer::start(2);
    let data = tempfile::tempdir().unwrap();
    let add =
        postern_with(&["servers", "add", "remote", "--url", &server.url, "--oauth"], Some(data.path()), None, &[]);
    assert_eq!(add.code, 0, "{}", add.stderr);
    assert!(add.stderr.contains("postern servers login remote"), "{}", add.stderr);
    assert_eq!(sign_in_state(data.path(), "remote"), "not_signed_in");
    let gw = Gateway::start_in(data, "");
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());

    // Before any sign-in: refused, nothing sent, and the agent is told what to run.
    let before = agent.call_and_wait("before", "remote__pay", json!({ "amount": 1 }));
    assert_eq!(before["structured"]["error"]["code"], "oauth_login_required", "{before}");
    assert!(before.to_string().contains("postern servers login remote"), "{before}");

    // A request to the listener with another state is refused with a page and journaled; the
    // sign-in goes on and completes with the real redirect.
    let signed = login(gw.path(), "remote", |url| {
        let (redirect, _) = redirect_of(url);
        let (status, page) = browse(&format!("{redirect}?code=forged&state=not-this-one"));
        assert_eq!(status, 400, "{page}");
        assert!(page.contains("state"), "{page}");
        true
    });
    assert_eq!(signed.code, 0, "{}", signed.stderr);
    assert!(signed.stderr.contains("signed in to \"remote\""), "{}", signed.stderr);
    let (redirect, state) = redirect_of(signed.stdout.lines().next().unwrap());
    let (status, _) = browse(&format!("{redirect}?code=again&state={state}"));
    assert_eq!(status, 0, "the listener closed after the one redirect it accepted");
    assert!(signed.stderr.contains(&server.url.replace("/mcp", "")), "the issuer is named: {}", signed.stderr);
    assert_eq!(server.count("authorization_code"), 1);
    let refused = vault_rows(gw.path(), "oauth_redirect_refused");
    assert_eq!(refused.len(), 1, "{refused:?}");
    let signed_in = vault_rows(gw.path(), "oauth_signed_in");
    assert_eq!(signed_in.len(), 1);
    assert_eq!(signed_in[0]["scopes"], json!(["mcp"]));
    assert_eq!(signed_in[0]["resource"], json!(server.url));
    assert_eq!(sign_in_state(gw.path(), "remote"), "signed_in");

    // The running gateway took the sign-in without a restart: the call goes through, once.
    let paid = agent.call_and_wait("pay", "remote__pay", json!({ "amount": 4 }));
    assert_eq!(paid["structured"]["state"], "completed", "{paid}");
    let pays: Vec<Value> = server.effects().into_iter().filter(|e| e["kind"] == "pay").collect();
    assert_eq!(pays.len(), 1, "{pays:?}");
    assert_eq!(pays[0]["execution_id"], paid["structured"]["execution_id"]);

    // A server that echoes the bearer token back: the agent and the journal see it masked.
    let echoed = agent.call_and_wait("echo", "remote__echo_authorization", json!({}));
    assert_eq!(echoed["structured"]["state"], "completed", "{echoed}");
    let text = echoed.to_string();
    assert!(text.contains("Bearer <redacted>") || text.contains("Bearer \\u003credacted"), "{echoed}");

    // The access token expires; concurrent calls share one refresh. (On a loaded machine the calls
    // above may have outlived the first token already: counted from here.)
    let before = server.count("refresh_token");
    std::thread::sleep(Duration::from_secs(3));
    for n in 0..4 {
        agent.call(&format!("after-{n}"), "remote__balance", json!({}));
    }
    for n in 0..4 {
        let out = agent.result(&format!("after-{n}"));
        assert_eq!(out["structured"]["state"], "completed", "{out}");
    }
    assert_eq!(server.count("refresh_token"), before + 1, "one refresh for concurrent calls: {:?}", server.grants());
    assert!(!vault_rows(gw.path(), "oauth_refreshed").is_empty());

    // The grant is revoked at the server: once the token expires, the call is refused without
    // being sent, and the server reads "sign-in needed".
    std::fs::write(server.dir.path().join("oauth_revoke_all"), "").unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let refused_call = agent.call_and_wait("revoked", "remote__pay", json!({ "amount": 9 }));
    assert_eq!(refused_call["structured"]["state"], "failed_before_dispatch", "{refused_call}");
    assert!(refused_call.to_string().contains("oauth_login_required"), "{refused_call}");
    assert!(refused_call.to_string().contains("postern servers login remote"), "{refused_call}");
    assert_eq!(server.effects().iter().filter(|e| e["kind"] == "pay").count(), 1, "nothing more was paid");
    assert_eq!(vault_rows(gw.path(), "oauth_refresh_failed").len(), 1);
    assert_eq!(sign_in_state(gw.path(), "remote"), "sign_in_needed");

    // Sign in again, then out: the tokens are revoked at the server and forgotten.
    std::fs::remove_file(server.dir.path().join("oauth_revoke_all")).unwrap();
    let again = login(gw.path(), "remote", |_| true);
    assert_eq!(again.code, 0, "{}", again.stderr);
    let logout = gw.postern(&["servers", "logout", "remote"]);
    assert_eq!(logout.code, 0, "{}", logout.stderr);
    assert!(logout.stderr.contains("revoked"), "{}", logout.stderr);
    assert_eq!(server.count("revoke"), 1, "{:?}", server.grants());
    assert_eq!(sign_in_state(gw.path(), "remote"), "signed_out");
    let after = agent.call_and_wait("after-logout", "remote__balance", json!({}));
    assert_eq!(after["structured"]["error"]["code"], "oauth_login_required", "{after}");

    drop(agent);
    let log = gw.stderr.lock().unwrap().clone();
    let printed = [signed.stdout.as_str(), signed.stderr.as_str(), again.stderr.as_str(), logout.stderr.as_str(), &log];
    no_token_leaked(&server, gw.path(), &printed);
}

#[test]
fn a_denied_or_unanswered_sign_in_exits_non_zero_with_the_reason() {
    let server = AuthServer::start(3600);
    let data = tempfile::tempdir().unwrap();
    let add =
        postern_with(&["servers", "add", "remote", "--url", &server.url, "--oauth"], Some(data.path()), None, &[]);
    assert_eq!(add.code, 0, "{}", add.stderr);
    std::fs::write(server.dir.path().join("oauth_deny"), "").unwrap();
    let denied = login(data.path(), "remote", |url| {
        let (status, page) = browse(url);
        assert_eq!(status, 400, "{page}");
        false
    });
    assert_eq!(denied.code, 1, "{}", denied.stderr);
    assert!(denied.stderr.contains("access_denied") && denied.stderr.contains("oauth_denied"), "{}", denied.stderr);
    assert_eq!(server.count("authorization_code"), 0);
    assert_eq!(sign_in_state(data.path(), "remote"), "not_signed_in");
    let stdio = postern_with(&["servers", "login", "nope"], Some(data.path()), None, &[]);
    assert_eq!(stdio.code, 2, "an unknown server is a usage error: {}", stdio.stderr);
}

#[test]
fn a_server_whose_metadata_names_another_resource_gets_no_sign_in() {
    let server = AuthServer::start(3600);
    let data = tempfile::tempdir().unwrap();
    // The same server under another name: its protected-resource metadata names
    // http://127.0.0.1:…/mcp, not the URL Postern was given, so its tokens are not for this URL.
    let elsewhere = server.url.replace("127.0.0.1", "localhost");
    let add = postern_with(&["servers", "add", "remote", "--url", &elsewhere, "--oauth"], Some(data.path()), None, &[]);
    assert_eq!(add.code, 0, "{}", add.stderr);
    let run = login(data.path(), "remote", |_| false);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("oauth_discovery_failed") && run.stderr.contains("resource mismatch"),
        "{}",
        run.stderr
    );
    assert_eq!(server.count("register"), 0, "no client was registered: {:?}", server.grants());
    assert_eq!(sign_in_state(data.path(), "remote"), "not_signed_in");
}

#[test]
fn a_client_metadata_document_names_postern_where_the_server_takes_one_and_nothing_is_registered() {
    let server = AuthServer::start_with(2, &[("OAUTH_CIMD", "1")]);
    let document = server.host_client_document();
    let data = tempfile::tempdir().unwrap();
    let add = postern_with(
        &["servers", "add", "remote", "--url", &server.url, "--oauth", "--client-metadata-url", &document],
        Some(data.path()),
        None,
        &[],
    );
    assert_eq!(add.code, 0, "{}", add.stderr);
    let gw = Gateway::start_in(data, "");
    let signed = login(gw.path(), "remote", |_| true);
    assert_eq!(signed.code, 0, "{}", signed.stderr);
    // The authorization URL names the document as the client; the server fetched it (over
    // HTTPS) and registered nothing.
    let authorize = url::Url::parse(signed.stdout.lines().next().unwrap()).unwrap();
    let client = authorize.query_pairs().find(|(k, _)| k == "client_id").unwrap().1.into_owned();
    assert_eq!(client, document);
    assert_eq!(server.count("register"), 0, "{:?}", server.grants());
    let fetched = server.records("cimd_fetch");
    assert!(!fetched.is_empty() && fetched.iter().all(|f| f["ok"] == true), "{fetched:?}");
    assert_eq!(server.records("authorization_code")[0]["client_id"], json!(document));
    let signed_in = vault_rows(gw.path(), "oauth_signed_in");
    assert_eq!(signed_in[0]["client_id"], json!(document), "{signed_in:?}");

    // A call, and after expiry a call that refreshes as that same client.
    let mut agent = Agent::start(Sdk::Python);
    agent.connect(gw.bridge_command());
    let paid = agent.call_and_wait("pay", "remote__pay", json!({ "amount": 2 }));
    assert_eq!(paid["structured"]["state"], "completed", "{paid}");
    // On a loaded machine the agent may start after the first token's two seconds: then `pay`
    // refreshed already. Whatever it did, every token is older than its lifetime after this.
    let before = server.records("refresh_token").len();
    std::thread::sleep(Duration::from_secs(3));
    let later = agent.call_and_wait("later", "remote__balance", json!({}));
    assert_eq!(later["structured"]["state"], "completed", "{later}");
    let refreshes = server.records("refresh_token");
    assert_eq!(refreshes.len(), before + 1, "one refresh for the later call: {:?}", server.grants());
    assert!(refreshes.iter().all(|r| r["client_id"] == json!(document)), "{refreshes:?}");
    drop(agent);
    let log = gw.stderr.lock().unwrap().clone();
    no_token_leaked(&server, gw.path(), &[signed.stdout.as_str(), signed.stderr.as_str(), &log]);
}

#[test]
fn a_client_metadata_document_is_not_used_where_the_server_does_not_take_one() {
    // The server takes no documents: Postern registers itself (RFC 7591) instead.
    let server = AuthServer::start(3600);
    let data = tempfile::tempdir().unwrap();
    let document = "https://postern.example/postern/client.json";
    let add = postern_with(
        &["servers", "add", "remote", "--url", &server.url, "--oauth", "--client-metadata-url", document],
        Some(data.path()),
        None,
        &[],
    );
    assert_eq!(add.code, 0, "{}", add.stderr);
    let signed = login(data.path(), "remote", |_| true);
    assert_eq!(signed.code, 0, "{}", signed.stderr);
    assert_eq!(server.count("register"), 1, "{:?}", server.grants());
    assert!(!signed.stdout.contains("postern.example"), "{}", signed.stdout);

    // A document URL that is not https with a path is refused when the server is added.
    for bad in ["http://postern.example/client.json", "https://postern.example/", "https://u:p@postern.example/c.json"]
    {
        let refused = postern_with(
            &["servers", "add", "other", "--url", &server.url, "--oauth", "--client-metadata-url", bad],
            Some(data.path()),
            None,
            &[],
        );
        assert_eq!(refused.code, 2, "{bad}: {}", refused.stderr);
        assert!(refused.stderr.contains("--client-metadata-url"), "{}", refused.stderr);
        assert!(!refused.stderr.contains("u:p@"), "a refused URL's password is not echoed: {}", refused.stderr);
    }
}
