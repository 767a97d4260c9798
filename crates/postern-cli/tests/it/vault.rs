//! `postern vault …` and signed checkpoints, on the real Secret Service (scripts/test.sh).

use crate::support::*;
use serde_json::Value;

const CANARY: &str = "CANARY-cli-9d4e2a-never-on-disk";

#[test]
fn a_credential_is_added_from_stdin_listed_without_its_secret_and_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Some(dir.path());
    let add = [
        "vault",
        "add",
        "deploy",
        "--kind",
        "bearer",
        "--host",
        "Deploy.Example",
        "--path-prefix",
        "/v1",
        "--approve-every-use",
    ];
    let run = postern_with(&add, d, Some(&format!("{CANARY}\n")), &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let run = postern(&["vault", "list", "--json"], d);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let listed: Value = serde_json::from_str(&run.stdout).expect("json");
    assert_eq!(listed["locked"], false);
    assert_eq!(listed["credentials"][0]["name"], "deploy");
    assert_eq!(listed["credentials"][0]["kind"], "bearer");
    assert_eq!(listed["credentials"][0]["bindings"][0]["host"], "deploy.example");
    assert_eq!(listed["credentials"][0]["approve_every_use"], true);
    for out in [&run.stdout, &run.stderr] {
        assert!(!out.contains(CANARY));
    }
    assert_eq!(file_containing(dir.path(), CANARY), None, "the secret must live only in the keychain");
    // Every change is journaled and the journal verifies.
    assert_eq!(postern(&["audit", "verify"], d).code, 0);
    assert_eq!(postern(&["vault", "remove", "deploy"], d).code, 0);
    let run = postern(&["vault", "remove", "deploy"], d);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("no credential named \"deploy\""), "{}", run.stderr);
}

#[test]
fn bad_credential_definitions_are_refused_before_anything_is_stored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Some(dir.path());
    let cases: &[(&[&str], &str)] = &[
        (&["vault", "add", "x", "--kind", "basic", "--host", "h.example"], "--kind basic needs --username"),
        (&["vault", "add", "x", "--kind", "header", "--host", "h.example"], "--kind header needs --header-name"),
        (&["vault", "add", "x", "--kind", "bearer", "--host", "https://h.example/v1"], "is not a host name"),
        (&["vault", "add", "bad name", "--kind", "bearer", "--host", "h.example"], "must be 1–64 characters"),
        (
            &["vault", "add", "x", "--kind", "header", "--header-name", "Authorization", "--host", "h.example"],
            "instead of a raw Authorization header",
        ),
    ];
    for (args, message) in cases {
        let run = postern_with(args, d, Some("secret\n"), &[]);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(message), "{args:?}: {}", run.stderr);
    }
    let run = postern_with(&["vault", "add", "x", "--kind", "bearer", "--host", "h.example"], d, Some("\n"), &[]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("the secret is empty"), "{}", run.stderr);
    let listed: Value = serde_json::from_str(&postern(&["vault", "list", "--json"], d).stdout).expect("json");
    assert_eq!(listed["credentials"], serde_json::json!([]));
}

#[test]
fn without_a_secret_service_postern_says_how_to_get_one_and_stores_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let no_bus = [("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent/postern-test-bus")];
    let add = ["vault", "add", "api", "--kind", "bearer", "--host", "api.example"];
    let run = postern_with(&add, Some(dir.path()), Some(CANARY), &no_bus);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains("the OS keychain is not available"), "{}", run.stderr);
    assert!(run.stderr.contains("never falls back to a file"), "{}", run.stderr);
    assert!(run.stderr.contains("gnome-keyring-daemon --unlock"), "{}", run.stderr);
    assert_eq!(file_containing(dir.path(), CANARY), None);
}

#[test]
fn lock_and_unlock_are_journaled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Some(dir.path());
    assert_eq!(postern(&["vault", "lock"], d).code, 0);
    let listed: Value = serde_json::from_str(&postern(&["vault", "list", "--json"], d).stdout).expect("json");
    assert_eq!(listed["locked"], true);
    assert_eq!(postern(&["vault", "unlock"], d).code, 0);
    let conn = rusqlite::Connection::open(dir.path().join("postern.db")).expect("open");
    let events: Vec<String> = conn
        .prepare("SELECT event FROM journal WHERE stream = 'vault' ORDER BY seq")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .map(Result::unwrap)
        .collect();
    assert_eq!(events, ["vault_locked", "vault_unlocked"]);
}

#[test]
fn a_signed_checkpoint_is_checked_against_the_trusted_key_without_the_keychain() {
    let j = journal(2);
    let d = Some(j.data_dir());
    let cp = j.data_dir().join("cp.json");
    let cp_arg = cp.to_str().expect("utf-8");
    assert_eq!(postern(&["audit", "checkpoint", "--json", "--out", cp_arg], d).code, 0);
    let key = postern(&["audit", "pubkey"], d).stdout.trim().to_owned();
    assert_eq!(key.len(), 64);
    let key_file = j.data_dir().join("journal.pub");
    std::fs::write(&key_file, format!("{key}\n")).expect("write key");
    let no_bus = [("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent/postern-test-bus")];
    for trusted in [key.clone(), format!("@{}", key_file.display())] {
        let run = postern_with(&["audit", "verify", "--checkpoint", cp_arg, "--pubkey", &trusted], d, None, &no_bus);
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        assert!(run.stdout.contains("signature   valid, by the trusted key"), "{}", run.stdout);
    }
    // Someone else's key: refused as untrustworthy input.
    let other = tempfile::tempdir().expect("other");
    let other_key = postern(&["audit", "pubkey"], Some(other.path())).stdout.trim().to_owned();
    let run = postern(&["audit", "verify", "--checkpoint", cp_arg, "--pubkey", &other_key], d);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("not by the trusted key"), "{}", run.stderr);
    // A checkpoint edited after signing (say, to hide a truncation): refused.
    let mut edited: Value = serde_json::from_str(&std::fs::read_to_string(&cp).expect("read")).expect("json");
    edited["journal_size"] = Value::from(edited["journal_size"].as_u64().expect("size") - 1);
    std::fs::write(&cp, edited.to_string()).expect("write");
    let run = postern(&["audit", "verify", "--checkpoint", cp_arg, "--pubkey", &key], d);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("signature does not match the checkpoint's contents"), "{}", run.stderr);
}

/// A loopback binding without a port sends the credential to any local listener: `vault add`
/// says so and names the fix; with a port it is quiet.
#[test]
fn a_loopback_binding_without_a_port_is_warned_about() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Some(dir.path());
    let bare =
        postern_with(&["vault", "add", "local", "--kind", "bearer", "--host", "127.0.0.1"], d, Some("t0k\n"), &[]);
    assert_eq!(bare.code, 0, "{}", bare.stderr);
    assert!(bare.stderr.contains("warning: 127.0.0.1 is a loopback address bound without a port"), "{}", bare.stderr);
    let pinned = postern_with(
        &["vault", "add", "pinned", "--kind", "bearer", "--host", "127.0.0.1:8080"],
        d,
        Some("t0k\n"),
        &[],
    );
    assert_eq!(pinned.code, 0, "{}", pinned.stderr);
    assert!(!pinned.stderr.contains("warning"), "{}", pinned.stderr);
}
