//! `postern doctor` on real parts: the OS keychain, a data directory, a running gateway, a port
//! another program holds, agent configs under a HOME — each check's verdict and fix, and the
//! exit status a script can use.

use super::gateway_support::Gateway;
use super::support::postern_with;
use serde_json::{Value, json};

fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap()
}

#[test]
fn doctor_explains_each_check_with_its_fix_and_fails_only_on_what_stops_postern() {
    let home = tempfile::tempdir().unwrap();
    let config = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join(".claude.json"),
        json!({ "mcpServers": { "postern": { "command": "/usr/bin/postern", "args": ["mcp"] } } }).to_string(),
    )
    .unwrap();
    std::fs::create_dir(home.path().join(".cursor")).unwrap();
    std::fs::write(
        home.path().join(".cursor/mcp.json"),
        json!({ "mcpServers": { "github": { "command": "npx", "args": ["gh"], "env": { "GITHUB_TOKEN": "x" } } } })
            .to_string(),
    )
    .unwrap();
    let env = [("HOME", home.path().to_str().unwrap()), ("XDG_CONFIG_HOME", config.path().to_str().unwrap())];

    // Beside a running gateway with no approver.
    let gw = Gateway::start_without_manifest(tempfile::tempdir().unwrap(), config.path());
    let run = postern_with(&["doctor", "--json"], Some(gw.path()), None, &env);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["ok"], true, "{report}");
    for name in ["versions", "keychain", "journal", "socket directory", "http"] {
        assert_eq!(check(&report, name)["verdict"], "ok", "{name}: {report}");
    }
    let gateway = check(&report, "gateway");
    assert_eq!(gateway["verdict"], "warn", "no approver: {gateway}");
    assert!(gateway["found"].as_str().unwrap().contains(&format!("pid {}", gw.child.id())), "{gateway}");
    assert!(gateway["fix"].as_str().unwrap().contains("--approver terminal"), "{gateway}");
    let configs = check(&report, "agent configs");
    assert_eq!(configs["verdict"], "warn", "{configs}");
    let found = configs["found"].as_str().unwrap();
    assert!(
        found.contains(".claude.json") && found.contains(".cursor/mcp.json (1 server(s) launched directly)"),
        "{found}"
    );
    assert!(configs["fix"].as_str().unwrap().contains("postern servers import"), "{configs}");
    let text = postern_with(&["doctor"], Some(gw.path()), None, &env);
    assert!(text.stdout.contains("warn  gateway") && text.stdout.contains("Postern can work here."), "{}", text.stdout);
    drop(gw);

    // No gateway, the HTTP port taken by another program, the journal opened to others.
    let data = tempfile::tempdir().unwrap();
    assert_eq!(postern_with(&["status"], Some(data.path()), None, &env).code, 0);
    use std::os::unix::fs::PermissionsExt;
    let db = data.path().join("postern.db");
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let run = postern_with(&["doctor", "--json", "--port", &port], Some(data.path()), None, &env);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(check(&report, "http")["verdict"], "fail", "{report}");
    assert!(check(&report, "http")["fix"].as_str().unwrap().contains("--port"), "{report}");
    let dir = check(&report, "data directory");
    assert_eq!(dir["verdict"], "fail", "{report}");
    assert!(dir["fix"].as_str().unwrap().starts_with(&format!("chmod 600 {}*", db.display())), "{dir}");
    assert_eq!(check(&report, "gateway")["verdict"], "warn");
    assert_eq!(check(&report, "journal")["verdict"], "ok", "{report}");
    let text = postern_with(&["doctor", "--port", &port], Some(data.path()), None, &env);
    assert!(text.stdout.contains("FAIL  http") && text.stdout.contains("fix: chmod 600"), "{}", text.stdout);
}
