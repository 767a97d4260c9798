-- Postern schema v2: the vault's non-secret metadata. Secrets live only in the OS keychain.
-- Never edit this file once shipped; add 0003_*.sql instead.

-- One row: this installation's id, which namespaces its keychain items.
CREATE TABLE installation (
    singleton  INTEGER PRIMARY KEY CHECK (singleton = 1),
    id         TEXT NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;

-- Credentials: name, kind and where they may be sent. The secret itself is a keychain item.
CREATE TABLE credentials (
    name              TEXT PRIMARY KEY,
    kind              TEXT NOT NULL,
    spec              TEXT NOT NULL,
    bindings          TEXT NOT NULL,
    approve_every_use INTEGER NOT NULL,
    created_at        INTEGER NOT NULL
) STRICT;

-- One row: whether the vault is locked (a locked vault denies every action).
CREATE TABLE vault_state (
    singleton  INTEGER PRIMARY KEY CHECK (singleton = 1),
    locked     INTEGER NOT NULL,
    changed_at INTEGER NOT NULL
) STRICT;
