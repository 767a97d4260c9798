//! `postern agents …`: a token is shown once, only its hash is stored, and revocation sticks.

use crate::support::*;
use serde_json::Value;
use sha2::{Digest, Sha256};

#[test]
fn a_token_is_printed_once_stored_only_as_a_hash_and_revocable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Some(dir.path());
    let run = postern(&["agents", "add", "ci-bot"], d);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let token = run.stdout.trim().to_owned();
    assert!(token.starts_with("pst_") && token.len() == 68, "{token}");
    assert!(run.stderr.contains("Authorization: Bearer"), "{}", run.stderr);
    assert_eq!(file_containing(dir.path(), &token), None, "the token itself is never stored");

    let listed: Vec<Value> = serde_json::from_str(&postern(&["agents", "list", "--json"], d).stdout).expect("json");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["name"], "ci-bot");
    assert_eq!(listed[0]["token_sha256"], hex(Sha256::digest(token.as_bytes()).as_slice()));
    assert!(listed[0]["revoked_at"].is_null());
    let table = postern(&["agents", "list"], d).stdout;
    assert!(table.contains("ci-bot") && table.contains("active") && !table.contains(&token), "{table}");

    let run = postern(&["agents", "add", "ci-bot"], d);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("already exists"), "{}", run.stderr);
    let run = postern(&["agents", "add", "bad name"], d);
    assert_eq!(run.code, 2);

    assert_eq!(postern(&["agents", "revoke", "ci-bot"], d).code, 0);
    let listed: Vec<Value> = serde_json::from_str(&postern(&["agents", "list", "--json"], d).stdout).expect("json");
    assert!(listed[0]["revoked_at"].is_i64());
    let run = postern(&["agents", "revoke", "ci-bot"], d);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("no active agent named \"ci-bot\""), "{}", run.stderr);
    // Both changes are journaled and the journal verifies.
    assert_eq!(postern(&["audit", "verify"], d).code, 0);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
