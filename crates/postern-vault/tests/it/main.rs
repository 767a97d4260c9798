//! Integration tests of postern-vault against the real OS keychain (Secret Service via
//! gnome-keyring in CI: `scripts/test.sh` starts a dbus session with an unlocked keyring).

#![allow(clippy::unwrap_used)]

mod os_keychain;
