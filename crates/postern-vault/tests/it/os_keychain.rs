//! The vault on the real Secret Service: secrets round-trip through the keychain, never reach
//! the database file, are namespaced per installation, and are gone after removal.

use postern_core::ErrorCode;
use postern_core::Timestamp;
use postern_store::Store;
use postern_vault::{
    Binding, Credential, CredentialKind, DEFAULT_MARKER_ROOT, HostKeyPolicy, OsKeychain, SecretStore, Sensitive,
    SshHost, Vault, VaultError,
};
use std::sync::Arc;

const CANARY: &str = "CANARY-vault-3b1f7e-never-on-disk";

fn keychain() -> Arc<OsKeychain> {
    Arc::new(
        OsKeychain::connect()
            .unwrap_or_else(|e| panic!("these tests need a Secret Service (run them through scripts/test.sh): {e}")),
    )
}

fn vault(dir: &std::path::Path, keychain: Arc<OsKeychain>) -> Vault {
    let (store, _) = Store::open(&dir.join("postern.db"), Timestamp::from_millis(1)).expect("store");
    Vault::open(Arc::new(store), keychain, Timestamp::from_millis(2)).expect("vault")
}

fn credential(name: &str) -> Credential {
    Credential {
        name: name.into(),
        kind: CredentialKind::Header { name: "X-Api-Key".into() },
        bindings: vec![Binding::new("127.0.0.1", Some("/v1")).expect("binding")],
        approve_every_use: false,
        idempotency_header: None,
        reads_have_effects: false,
    }
}

#[test]
fn a_secret_round_trips_through_the_keychain_and_never_reaches_the_database() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kc = keychain();
    let v = vault(dir.path(), Arc::clone(&kc));
    v.add_credential(&credential("api"), &Sensitive::new(CANARY.into()), Timestamp::from_millis(3)).expect("add");
    assert_eq!(v.secret("api").expect("secret").expose(), CANARY);
    // The keychain item is namespaced by this installation.
    let item = format!("{}/credential/api", v.installation_id());
    assert_eq!(kc.get(&item).expect("get").expect("present").expose().as_slice(), CANARY.as_bytes());
    for entry in std::fs::read_dir(dir.path()).expect("dir") {
        let path = entry.expect("entry").path();
        let bytes = std::fs::read(&path).expect("read");
        assert!(!bytes.windows(CANARY.len()).any(|w| w == CANARY.as_bytes()), "canary in {}", path.display());
    }
    assert!(!format!("{v:?}").contains(CANARY));
    v.remove_credential("api", Timestamp::from_millis(4)).expect("remove");
    assert!(kc.get(&item).expect("get").is_none(), "the keychain item is deleted with the credential");
    assert!(matches!(v.secret("api"), Err(VaultError::UnknownCredential(_))));
}

#[test]
fn two_installations_never_share_keys_or_secrets() {
    let (a, b) = (tempfile::tempdir().expect("a"), tempfile::tempdir().expect("b"));
    let (va, vb) = (vault(a.path(), keychain()), vault(b.path(), keychain()));
    assert_ne!(va.installation_id(), vb.installation_id());
    assert_ne!(va.journal_public_key().expect("pk a"), vb.journal_public_key().expect("pk b"));
    assert_ne!(va.fingerprint_key().expect("a").fingerprint(b"x"), vb.fingerprint_key().expect("b").fingerprint(b"x"));
    va.add_credential(&credential("shared-name"), &Sensitive::new("secret-a".into()), Timestamp::from_millis(3))
        .expect("add");
    assert!(matches!(vb.secret("shared-name"), Err(VaultError::UnknownCredential(_))));
    va.remove_credential("shared-name", Timestamp::from_millis(4)).expect("cleanup");
    // The same installation, reopened after it was closed, finds its keys again.
    let key = va.journal_public_key().expect("pk");
    drop(va);
    let again = vault(a.path(), keychain());
    assert_eq!(again.journal_public_key().expect("pk"), key);
}

#[test]
fn an_mcp_servers_secret_environment_lives_in_the_keychain_is_refused_while_locked_and_goes_with_the_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kc = keychain();
    let v = vault(dir.path(), Arc::clone(&kc));
    let server = postern_vault::McpServer {
        name: "github".into(),
        command: "github-mcp".into(),
        args: vec![],
        env: [("LOG".to_owned(), "info".to_owned())].into(),
        secret_env: vec!["GITHUB_TOKEN".into()],
        ..postern_vault::McpServer::default()
    };
    let secret = vec![("GITHUB_TOKEN".to_owned(), Sensitive::new(CANARY.to_owned()))];
    // The declared secret must be given, and nothing else.
    let err = v.add_mcp_server(&server, &[], Timestamp::from_millis(3)).unwrap_err();
    assert!(matches!(err, VaultError::InvalidCredential(_)), "{err}");
    v.add_mcp_server(&server, &secret, Timestamp::from_millis(3)).expect("add");
    assert_eq!(v.mcp_server("github").expect("listed"), server);
    assert!(v.credentials().expect("credentials").is_empty(), "a server is not an HTTP credential");
    let item = format!("{}/mcp/github/env/GITHUB_TOKEN", v.installation_id());
    assert_eq!(kc.get(&item).expect("get").expect("present").expose().as_slice(), CANARY.as_bytes());
    let env = v.mcp_server_secrets(&server).expect("secrets");
    assert_eq!((env[0].0.as_str(), env[0].1.expose().as_str()), ("GITHUB_TOKEN", CANARY));
    for entry in std::fs::read_dir(dir.path()).expect("dir") {
        let path = entry.expect("entry").path();
        let bytes = std::fs::read(&path).expect("read");
        assert!(!bytes.windows(CANARY.len()).any(|w| w == CANARY.as_bytes()), "canary in {}", path.display());
    }
    v.lock("test", Timestamp::from_millis(4)).expect("lock");
    assert!(matches!(v.mcp_server_secrets(&server), Err(VaultError::Locked)));
    v.unlock("test", Timestamp::from_millis(5)).expect("unlock");
    v.remove_mcp_server("github", Timestamp::from_millis(6)).expect("remove");
    assert!(kc.get(&item).expect("get").is_none(), "the keychain item goes with the server");
    assert!(matches!(v.mcp_server("github"), Err(VaultError::UnknownMcpServer(_))));
}

/// A first key is pinned only onto the host that was connected to: not onto a host of the
/// same name added again with another address meanwhile, and not over a key pinned since.
#[test]
fn a_first_key_is_pinned_only_onto_the_host_it_was_presented_by() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v = vault(dir.path(), keychain());
    let key = Sensitive::new("-----BEGIN OPENSSH PRIVATE KEY-----".to_owned());
    let host = |address: &str| SshHost {
        name: "deploy".into(),
        address: address.into(),
        port: 22,
        account: "ci".into(),
        policy: HostKeyPolicy::AcceptNew,
        host_key: None,
        host_key_fingerprint: None,
        marker_root: DEFAULT_MARKER_ROOT.into(),
        approve_every_use: false,
    };
    let at = Timestamp::from_millis;
    v.add_ssh_host(&host("10.0.0.1"), &key, None, at(2)).expect("add");
    let connected = v.ssh_host("deploy").expect("host");
    v.remove_ssh_host("deploy", at(3)).expect("remove");
    v.add_ssh_host(&host("10.0.0.2"), &key, None, at(4)).expect("add again");
    let refused = v.pin_host_key(&connected, "ssh-ed25519 AAAA", "SHA256:old", at(5)).unwrap_err();
    assert_eq!(refused.code(), "ssh_host_changed");
    assert_eq!(v.ssh_host("deploy").unwrap().host_key, None, "the new host's first key is still to come");

    let connected = v.ssh_host("deploy").expect("host");
    let pinned = v.pin_host_key(&connected, "ssh-ed25519 BBBB", "SHA256:new", at(6)).expect("pinned");
    assert_eq!(pinned.host_key.as_deref(), Some("ssh-ed25519 BBBB"));
    let again = v.pin_host_key(&connected, "ssh-ed25519 CCCC", "SHA256:other", at(7)).unwrap_err();
    assert_eq!(again.code(), "ssh_host_changed", "a pinned key is not replaced");
    assert_eq!(v.ssh_host("deploy").unwrap().host_key.as_deref(), Some("ssh-ed25519 BBBB"));
}
