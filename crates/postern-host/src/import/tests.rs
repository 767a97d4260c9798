//! Finding and rewriting agent configs, property-tested with hostile configs: no imported value
//! survives the rewrite or shows in `Debug`.

use super::*;
use proptest::prelude::*;
use serde_json::Map;

#[test]
fn claude_code_servers_are_found_at_the_top_and_per_project_and_replaced_by_postern() {
    let config = json!({
        "numStartups": 12,
        "mcpServers": {
            "github": { "command": "npx", "args": ["-y", "server-github"], "env": { "GITHUB_TOKEN": "ghp_abc" } },
            "remote": { "type": "http", "url": "https://mcp.example/mcp" },
        },
        "projects": { "/src/app": { "mcpServers": { "db": { "command": "db-mcp" } } } },
    });
    let (found, skipped) = find_servers(&config, Layout::ClaudeCode);
    assert_eq!(found.iter().map(|f| f.key.as_str()).collect::<Vec<_>>(), ["github", "db"]);
    assert_eq!(skipped.len(), 1);
    let after = rewrite(&config, &found, "/usr/bin/postern");
    assert_eq!(after["mcpServers"]["postern"], json!({ "command": "/usr/bin/postern", "args": ["mcp"] }));
    assert_eq!(after["mcpServers"]["remote"], config["mcpServers"]["remote"], "what is not imported stays");
    assert!(after["mcpServers"].get("github").is_none());
    assert_eq!(
        after["projects"]["/src/app"]["mcpServers"],
        json!({ "postern": { "command": "/usr/bin/postern", "args": ["mcp"] } })
    );
    assert_eq!(after["numStartups"], 12);
    // Importing again finds nothing new.
    assert!(find_servers(&after, Layout::ClaudeCode).0.is_empty());
}

#[test]
fn debug_output_never_shows_an_imported_value() {
    let config = json!({ "mcpServers": { "gh": { "command": "x", "env": { "GITHUB_TOKEN": "ghp_canary_debug" } } } });
    let (found, _) = find_servers(&config, Layout::McpServers);
    let shown = format!("{found:?}");
    assert!(shown.contains("GITHUB_TOKEN") && !shown.contains("ghp_canary_debug"), "{shown}");
}

#[test]
fn names_fit_the_vault() {
    let taken = BTreeSet::from(["github".to_owned()]);
    assert_eq!(server_name("github", &taken), "github-2");
    assert_eq!(server_name("my server__x", &taken), "my_server_x");
    assert_eq!(server_name("@scope/pkg", &taken), "scope_pkg");
    assert_eq!(server_name("___", &taken), "server");
    assert!(server_name(&"x".repeat(80), &taken).len() <= MAX_SERVER_NAME);
}

fn env_value() -> impl Strategy<Value = String> {
    prop_oneof!["[A-Za-z0-9_\\-]{0,40}", any::<String>(), "\\PC{20,40}"]
}

proptest! {
    /// Whatever a config holds, parsing never panics, every vault name is valid, and after
    /// the rewrite no value of an imported server's environment is left in the file.
    #[test]
    fn no_imported_value_survives_the_rewrite(
        entries in prop::collection::btree_map("\\PC{1,30}", (
            "[a-z]{1,10}",
            prop::collection::vec(any::<String>(), 0..3),
            prop::collection::btree_map("[A-Z_]{1,12}", env_value(), 0..4),
        ), 0..5),
        junk in any::<String>(),
    ) {
        let servers: Map<String, Value> = entries
            .iter()
            .map(|(k, (command, args, env))| (k.clone(), json!({ "command": command, "args": args, "env": env })))
            .collect();
        let config = json!({ "mcpServers": servers, "other": junk, "servers": [1, 2] });
        let (found, _) = find_servers(&config, Layout::McpServers);
        let mut taken = BTreeSet::new();
        for f in &found {
            let name = server_name(&f.key, &taken);
            let server = McpServer { name: name.clone(), command: "x".into(), ..McpServer::default() };
            prop_assert!(server.validate().is_ok(), "{name:?}");
            taken.insert(name);
        }
        let after = serde_json::to_string(&rewrite(&config, &found, "/usr/bin/postern")).unwrap();
        for f in &found {
            for v in f.env.values().filter(|v| v.len() >= 8 && !junk.contains(v.as_str())) {
                let encoded = serde_json::to_string(v).unwrap();
                prop_assert!(!after.contains(&encoded), "{v:?} left in {after}");
            }
        }
        // Idempotent: a rewritten file has nothing left to import.
        let again: Value = serde_json::from_str(&after).unwrap();
        prop_assert!(find_servers(&again, Layout::McpServers).0.is_empty());
    }
}
