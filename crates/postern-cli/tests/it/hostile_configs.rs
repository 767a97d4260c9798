//! The hostile-peer suite, agent configs: configs full of common secrets, symlinked configs and
//! edited or forged undo records, imported or refused on real processes, with every secret a
//! fresh canary searched for in every spelling in every file (see `hostile.rs`).

use super::hostile::{assert_nowhere, assert_terminal_safe, canary, files_under, python, serve_with_agent};
use super::support::postern_with;
use serde_json::json;
use std::path::PathBuf;

#[test]
fn an_agent_config_with_common_secrets_leaves_none_in_the_journal_and_its_plan_prints_nothing_raw() {
    let (dsn_password, access, db_password) = (canary("pg"), format!("sbp_{}", canary("supa")), canary("dburl"));
    // Found in the second review: `-e NAME=value` and `--env=NAME=value` arguments, a
    // connection string's `Password=`, names such as `PGPASSWORD` (one word).
    let (pg_env, api_key, connection) = (canary("pgenv"), canary("apikey"), canary("odbc"));
    let home = tempfile::tempdir().unwrap();
    let config = json!({ "mcpServers": {
        "postgres": { "command": "npx", "args": ["-y", "@modelcontextprotocol/server-postgres",
                      format!("postgresql://admin:{dsn_password}@localhost:5432/app")] },
        "supabase": { "command": "npx", "args": ["-y", "@supabase/mcp-server-supabase@latest", "--read-only",
                      "--access-token", access] },
        "db": { "command": "db-mcp", "env": { "DATABASE_URL": format!("postgres://app:{db_password}@db.internal/app"),
                                              "LOG_LEVEL": "info" } },
        "safe\u{1b}[2K\r  postgres  → Postern server \"safe\"": { "command": "echo\u{1b}]0;owned\u{7}", "args": ["\u{202e}txt"] },
        "docker": { "command": "docker", "args": ["run", "-i", "--rm", "-e", format!("PGPASSWORD={pg_env}"),
                    format!("--env=API_KEY={api_key}"), "mcp/postgres"] },
        "mssql": { "command": "mssql-mcp", "env": {
            "CONNECTION_STRING": format!("Server=db;User Id=sa;Password={connection};"),
            "BYPASS_CACHE": "true", "NODE_OPTIONS": "--require ./x.js" } },
    }});
    std::fs::create_dir(home.path().join(".cursor")).unwrap();
    std::fs::write(home.path().join(".cursor/mcp.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    let data = tempfile::tempdir().unwrap();
    let env = [("HOME", home.path().to_str().unwrap())];
    let plan = postern_with(&["servers", "import", "--from", "cursor", "--dry-run"], Some(data.path()), None, &env);
    assert_eq!(plan.code, 0, "{}", plan.stderr);
    assert_terminal_safe("the import plan", &plan.stdout);
    assert!(plan.stdout.contains("6 MCP server(s) with 6 plaintext secret(s)"), "{}", plan.stdout);
    for shown in [
        // What is not secret is shown with its value (`BYPASS_CACHE` is not a password), and a
        // variable that changes what code the program loads is called out.
        "BYPASS_CACHE=true".to_owned(),
        "NODE_OPTIONS=--require ./x.js".to_owned(),
        "WARNING: it sets NODE_OPTIONS".to_owned(),
        format!("CONNECTION_STRING ({} characters)", format!("Server=db;User Id=sa;Password={connection};").len()),
        format!("ARG2_PASSWORD ({} characters)", dsn_password.len()),
        format!("ACCESS_TOKEN ({} characters)", access.len()),
        "DATABASE_URL (".to_owned(),
        "postgresql://admin:<ARG2_PASSWORD>@localhost:5432/app".to_owned(),
    ] {
        assert!(plan.stdout.contains(&shown), "{shown:?} in {}", plan.stdout);
    }
    let done = postern_with(&["servers", "import", "--from", "cursor", "--yes"], Some(data.path()), None, &env);
    assert_eq!(done.code, 0, "{}", done.stderr);
    let list = postern_with(&["servers", "list"], Some(data.path()), None, &[]);
    assert_eq!(list.code, 0, "{}", list.stderr);
    assert_terminal_safe("servers list", &list.stdout);
    let listed = postern_with(&["servers", "list", "--json"], Some(data.path()), None, &[]);
    let activity = postern_with(&["activity", "--json", "--limit", "1000"], Some(data.path()), None, &[]);
    assert_nowhere(
        &[&dsn_password, &access, &db_password, &pg_env, &api_key, &connection],
        &[data.path(), home.path()],
        &[
            ("the plan", &plan.stdout),
            ("servers list", &list.stdout),
            ("its JSON", &listed.stdout),
            ("postern activity", &activity.stdout),
        ],
    );
}

/// `~/.cursor/mcp.json` as a link into a dotfiles repository: the file it points to is rewritten
/// (the link kept), the plan warns that the repository's history still holds the secrets, and
/// `--undo` restores that file byte for byte, leaving no second copy. (Before: the link was
/// replaced by a new 0644 file, the dotfile kept every secret, and `--undo` wrote a second copy.)
#[test]
fn a_symlinked_agent_config_is_rewritten_where_it_is_and_the_link_is_kept() {
    let token = canary("dotfile");
    let home = tempfile::tempdir().unwrap();
    let dotfiles = home.path().join("dotfiles");
    std::fs::create_dir_all(dotfiles.join(".git")).unwrap();
    std::fs::create_dir_all(dotfiles.join("cursor")).unwrap();
    let real = dotfiles.join("cursor/mcp.json");
    let original = serde_json::to_vec_pretty(&json!({ "mcpServers": {
        "gh": { "command": "gh-mcp", "env": { "GITHUB_TOKEN": token } } } }))
    .unwrap();
    std::fs::write(&real, &original).unwrap();
    std::fs::create_dir(home.path().join(".cursor")).unwrap();
    let link = home.path().join(".cursor/mcp.json");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let data = tempfile::tempdir().unwrap();
    let env = [("HOME", home.path().to_str().unwrap())];
    let done = postern_with(&["servers", "import", "--from", "cursor", "--yes"], Some(data.path()), None, &env);
    assert_eq!(done.code, 0, "{}", done.stderr);
    assert!(done.stdout.contains("a link to"), "{}", done.stdout);
    assert!(done.stdout.contains("its history still holds these secrets"), "{}", done.stdout);
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link is kept");
    let after = std::fs::read_to_string(&real).unwrap();
    assert!(after.contains("\"mcp\"") && !after.contains(&token), "the file it points to is rewritten: {after}");
    let undone = postern_with(&["servers", "import", "--undo"], Some(data.path()), None, &env);
    assert_eq!(undone.code, 0, "{}", undone.stderr);
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "still a link after --undo");
    assert_eq!(std::fs::read(&real).unwrap(), original, "the original bytes, where they were");
    let copies: Vec<PathBuf> = files_under(home.path())
        .into_iter()
        .filter(|f| std::fs::read(f).is_ok_and(|b| b.windows(token.len()).any(|w| w == token.as_bytes())))
        .collect();
    assert_eq!(copies, [real], "one copy of the secret, in the dotfile");
}

/// A home directory whose `~/.cursor/mcp.json` runs one server, `gh`, with `GITHUB_TOKEN=token`.
fn cursor_config_holding(token: &str) -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(home.path().join(".cursor")).unwrap();
    let config = json!({ "mcpServers": { "gh": { "command": "gh-mcp", "env": { "GITHUB_TOKEN": token } } } });
    std::fs::write(home.path().join(".cursor/mcp.json"), serde_json::to_vec(&config).unwrap()).unwrap();
    home
}

/// The undo record is owner-only and its digest is journaled: edited to write the original
/// config (secrets and all) somewhere else and to remove an unrelated server, `--undo` refuses,
/// writes nothing and removes nothing. (Before: it was 0644 and unjournaled, and `--undo` did
/// both.)
#[test]
fn an_edited_undo_record_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let token = canary("undo");
    let home = cursor_config_holding(&token);
    let data = tempfile::tempdir().unwrap();
    let bystander = postern_with(&["servers", "add", "bystander", "--", "true"], Some(data.path()), None, &[]);
    assert_eq!(bystander.code, 0, "{}", bystander.stderr);
    let env = [("HOME", home.path().to_str().unwrap())];
    let done = postern_with(&["servers", "import", "--from", "cursor", "--yes"], Some(data.path()), None, &env);
    assert_eq!(done.code, 0, "{}", done.stderr);
    let record = data.path().join("imports/last.json");
    assert_eq!(std::fs::metadata(&record).unwrap().permissions().mode() & 0o777, 0o600);
    let mut edited: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    let elsewhere = home.path().join("exfiltrated.json");
    edited["files"][0]["path"] = json!(elsewhere);
    edited["servers"] = json!(["gh", "bystander"]);
    std::fs::write(&record, serde_json::to_vec_pretty(&edited).unwrap()).unwrap();
    let undo = postern_with(&["servers", "import", "--undo"], Some(data.path()), None, &env);
    assert_eq!(undo.code, 1, "{}{}", undo.stdout, undo.stderr);
    assert!(undo.stderr.contains("does not match what the last import wrote"), "{}", undo.stderr);
    assert!(!elsewhere.exists(), "nothing was written elsewhere");
    let list = postern_with(&["servers", "list", "--json"], Some(data.path()), None, &[]);
    assert!(
        list.stdout.contains("bystander") && list.stdout.contains("\"gh\""),
        "nothing was removed: {}",
        list.stdout
    );
}

/// A forged undo record whose digest is journaled over the control socket (found in the second
/// review: `import.record` was open to any peer): from inside an agent run the socket refuses to
/// journal it; from a process Postern cannot tie to an agent, the digest is journaled, but the
/// record names a backup that is not its file's, and `--undo` refuses it, writing the original
/// (secrets and all) nowhere.
#[test]
fn a_forged_undo_record_is_refused_even_with_its_digest_journaled() {
    use sha2::Digest;
    let token = canary("forged");
    let home = cursor_config_holding(&token);
    let data = tempfile::tempdir().unwrap();
    let env = [("HOME", home.path().to_str().unwrap())];
    let done = postern_with(&["servers", "import", "--from", "cursor", "--yes"], Some(data.path()), None, &env);
    assert_eq!(done.code, 0, "{}", done.stderr);
    let record = data.path().join("imports/last.json");
    let real: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    // The forgery: the original's backup, written to a file of the attacker's choosing.
    let elsewhere = home.path().join("exfiltrated.json");
    std::fs::write(&elsewhere, b"bait").unwrap();
    let forged = json!({ "files": [{ "path": elsewhere, "backup": real["files"][0]["backup"],
                                     "written_sha256": hex::encode(sha2::Sha256::digest(b"bait")) }],
                         "servers": [] });
    let forged = serde_json::to_vec_pretty(&forged).unwrap();
    std::fs::write(&record, &forged).unwrap();
    let journal_it = json!({ "op": "import.record", "event": "import_applied",
                             "detail": { "record_sha256": hex::encode(sha2::Sha256::digest(&forged)) } });
    let (gw, mut agent) = serve_with_agent(data);
    let socket = postern_gateway::door::control::control_path(gw.path());
    let script = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n\
                  s.sendall(sys.argv[2].encode() + b'\\n')\nprint(s.makefile().readline())";
    agent.send(json!({ "op": "run", "tag": "forge", "argv": [python(), "-c", script, socket, journal_it.to_string()],
                       "env": {} }));
    let ran = agent.expect("the forgery to end", |e| e["event"] == "ran" && e["tag"] == "forge");
    assert!(ran["stdout"].as_str().unwrap().contains("inside agent run"), "{ran}");
    // Not from an agent run: journaled, and still refused by the record's own content.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let reply = runtime
        .block_on(postern_gateway::door::control::request_line(gw.path(), serde_json::to_vec(&journal_it).unwrap()))
        .unwrap();
    assert!(matches!(reply, postern_gateway::door::control::ControlReply::Done), "{reply:?}");
    let undo = gw.postern(&["servers", "import", "--undo"]);
    assert_eq!(undo.code, 1, "{}{}", undo.stdout, undo.stderr);
    assert!(
        undo.stderr.contains("import_record_tampered") || undo.stderr.contains("does not match"),
        "{}",
        undo.stderr
    );
    assert_eq!(std::fs::read(&elsewhere).unwrap(), b"bait", "nothing was written elsewhere");
    assert_nowhere(&[&token], &[home.path(), gw.path()], &[("the undo", &undo.stderr)]);
}

/// `servers add` keeps secrets out of the journal too: a secret-looking `--env` value is
/// refused (naming `--secret-env`), a `--url` with a password in it is refused (as
/// `http_request` refuses credentials in URLs), and a secret typed into the command line goes to
/// the keychain. (Before: all three were journaled, logged and listed.)
#[test]
fn servers_add_refuses_plaintext_secrets_or_keeps_them_in_the_keychain() {
    let (token, password, dsn) = (format!("ghp_{}", canary("env")), canary("url"), canary("argv"));
    let data = tempfile::tempdir().unwrap();
    let env = postern_with(
        &["servers", "add", "gh", "--env", &format!("GITHUB_TOKEN={token}"), "--", "gh-mcp"],
        Some(data.path()),
        None,
        &[],
    );
    assert_eq!(env.code, 2, "{}", env.stderr);
    assert!(env.stderr.contains("--secret-env GITHUB_TOKEN"), "{}", env.stderr);
    let url = postern_with(
        &["servers", "add", "remote", "--url", &format!("http://alice:{password}@127.0.0.1:9/mcp")],
        Some(data.path()),
        None,
        &[],
    );
    assert_eq!(url.code, 2, "{}", url.stderr);
    assert!(url.stderr.contains("vault credential"), "{}", url.stderr);
    let argv = postern_with(
        &["servers", "add", "pg", "--", "pg-mcp", &format!("postgresql://admin:{dsn}@localhost/app")],
        Some(data.path()),
        None,
        &[],
    );
    assert_eq!(argv.code, 0, "{}", argv.stderr);
    let list = postern_with(&["servers", "list"], Some(data.path()), None, &[]);
    assert!(list.stdout.contains("postgresql://admin:<ARG0_PASSWORD>@localhost/app"), "{}", list.stdout);
    assert_nowhere(
        &[&token, &password, &dsn],
        &[data.path()],
        &[("errors", &[env.stderr, url.stderr, argv.stderr].concat()), ("servers list", &list.stdout)],
    );
}
