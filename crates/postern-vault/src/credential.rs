//! Credentials: what kind of secret, and exactly where it may be sent. The agent never chooses
//! a key; a credential is injected only into requests whose URL matches one of its bindings.

use crate::VaultError;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CredentialKind {
    /// `Authorization: Bearer <secret>`
    Bearer,
    /// `Authorization: Basic base64(username:secret)`
    Basic { username: String },
    /// `<name>: <secret>` (e.g. `X-Api-Key`)
    Header { name: String },
}

impl CredentialKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            CredentialKind::Bearer => "bearer",
            CredentialKind::Basic { .. } => "basic",
            CredentialKind::Header { .. } => "header",
        }
    }
}

/// A host (with an optional port) and an optional path prefix a credential may be sent to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    /// Lower-case host name or IP literal; `host:port` pins the port too.
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
}

impl Binding {
    pub fn new(host: &str, path_prefix: Option<&str>) -> Result<Self, VaultError> {
        let host = host.trim().to_ascii_lowercase();
        let valid = !host.is_empty()
            && !host.contains(['/', '@', '?', '#', ' ', '*'])
            && url::Url::parse(&format!("https://{host}/")).is_ok_and(|u| u.host_str().is_some());
        if !valid {
            return Err(VaultError::InvalidCredential(format!(
                "{host:?} is not a host name (give the host, e.g. api.example.com or api.example.com:8443, no scheme or path)"
            )));
        }
        let path_prefix = match path_prefix {
            None => None,
            Some(p) if p.starts_with('/') && !p.contains("..") => Some(p.trim_end_matches('/').to_owned()),
            Some(p) => {
                return Err(VaultError::InvalidCredential(format!(
                    "path prefix {p:?} must start with '/' and not contain '..'"
                )));
            }
        };
        Ok(Binding { host, path_prefix })
    }

    /// A loopback host with no port: any program on this machine that listens on some other
    /// port of it would be sent the credential (`vault add` warns).
    pub fn loopback_without_port(&self) -> bool {
        let port_pinned =
            self.host.rsplit_once(':').is_some_and(|(_, p)| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
                && !self.host.ends_with(']');
        let name = self.host.trim_start_matches('[').split(']').next().unwrap_or(&self.host);
        let loopback = name == "localhost"
            || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
            || self.host.starts_with("127.");
        loopback && !port_pinned
    }

    /// Whether `url` is inside this binding: same host (and port, if pinned), and a path equal to
    /// the prefix or below it at a `/` boundary (`/v1` matches `/v1/x`, not `/v10`).
    pub fn allows(&self, url: &url::Url) -> bool {
        let Some(host) = url.host_str() else { return false };
        let host_matches = match self.host.rsplit_once(':').filter(|(_, p)| p.chars().all(|c| c.is_ascii_digit())) {
            Some((h, port)) => h == host && url.port_or_known_default().map(|p| p.to_string()).as_deref() == Some(port),
            None => self.host == host,
        };
        host_matches
            && match &self.path_prefix {
                None => true,
                Some(prefix) => {
                    let path = url.path();
                    path == prefix || path.strip_prefix(prefix.as_str()).is_some_and(|rest| rest.starts_with('/'))
                }
            }
    }
}

/// A credential's metadata (its secret is in the keychain).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credential {
    pub name: String,
    #[serde(flatten)]
    pub kind: CredentialKind,
    pub bindings: Vec<Binding>,
    /// Every use needs a reviewer's approval (ladder rung 2).
    pub approve_every_use: bool,
    /// The API behind this credential honours this idempotency header, so the generic
    /// `http_request` tool may treat its writes as `idempotency_key` rather than `irreversible`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_header: Option<String>,
    /// The owner's word that a GET or HEAD through this credential changes something (an export
    /// job, a one-time link, a metered call): `http_request` then treats those verbs like writes
    /// (`idempotency_key` with the header above, else `irreversible`), and a manifest tool whose
    /// contract came from its verb alone is refused until it declares one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reads_have_effects: bool,
}

impl Credential {
    pub fn validate(&self) -> Result<(), VaultError> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !name_ok {
            return Err(VaultError::InvalidCredential(format!(
                "name {:?} must be 1–64 characters of letters, digits, '-', '_' or '.'",
                self.name
            )));
        }
        if self.bindings.is_empty() {
            return Err(VaultError::InvalidCredential(
                "a credential needs at least one --host it may be sent to".into(),
            ));
        }
        match &self.kind {
            CredentialKind::Basic { username } if username.is_empty() || username.contains(':') => {
                Err(VaultError::InvalidCredential("basic credentials need a --username without ':'".into()))
            }
            CredentialKind::Header { name }
                if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') =>
            {
                Err(VaultError::InvalidCredential(format!("{name:?} is not a header name")))
            }
            CredentialKind::Header { name }
                if ["authorization", "proxy-authorization", "cookie", "host"]
                    .contains(&name.to_ascii_lowercase().as_str()) =>
            {
                Err(VaultError::InvalidCredential(format!("use --kind bearer or basic instead of a raw {name} header")))
            }
            _ => Ok(()),
        }?;
        match &self.idempotency_header {
            Some(h) if h.is_empty() || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') => {
                Err(VaultError::InvalidCredential(format!("{h:?} is not a header name")))
            }
            _ => Ok(()),
        }
    }

    /// May this credential be sent to `url`?
    pub fn allows(&self, url: &url::Url) -> bool {
        self.bindings.iter().any(|b| b.allows(url))
    }

    pub(crate) fn to_record(&self, created_at: i64) -> postern_store::CredentialRecord {
        let mut spec = match &self.kind {
            CredentialKind::Bearer => json!({}),
            CredentialKind::Basic { username } => json!({ "username": username }),
            CredentialKind::Header { name } => json!({ "name": name }),
        };
        if let Some(h) = &self.idempotency_header {
            spec["idempotency_header"] = json!(h);
        }
        if self.reads_have_effects {
            spec["reads_have_effects"] = json!(true);
        }
        postern_store::CredentialRecord {
            name: self.name.clone(),
            kind: self.kind.as_str().into(),
            spec,
            bindings: serde_json::to_value(&self.bindings).unwrap_or(Value::Null),
            approve_every_use: self.approve_every_use,
            created_at,
        }
    }

    /// Read from a credentials-table row (readers without a vault use it on a read-only view).
    pub fn from_record(r: &postern_store::CredentialRecord) -> Result<Self, VaultError> {
        let corrupt = |what: &str| VaultError::InvalidCredential(format!("stored credential {:?}: {what}", r.name));
        let text = |key: &str| r.spec.get(key).and_then(Value::as_str).map(str::to_owned).ok_or_else(|| corrupt(key));
        let kind = match r.kind.as_str() {
            "bearer" => CredentialKind::Bearer,
            "basic" => CredentialKind::Basic { username: text("username")? },
            "header" => CredentialKind::Header { name: text("name")? },
            _ => return Err(corrupt("unknown kind")),
        };
        Ok(Credential {
            name: r.name.clone(),
            kind,
            bindings: serde_json::from_value(r.bindings.clone()).map_err(|_| corrupt("bindings"))?,
            approve_every_use: r.approve_every_use,
            idempotency_header: r.spec.get("idempotency_header").and_then(Value::as_str).map(str::to_owned),
            reads_have_effects: r.spec.get("reads_have_effects").and_then(Value::as_bool).unwrap_or(false),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> url::Url {
        url::Url::parse(s).expect("url")
    }

    #[test]
    fn bindings_match_host_port_and_path_at_segment_boundaries() {
        let b = Binding::new("API.example.com", Some("/v1/")).expect("binding");
        assert_eq!(b.host, "api.example.com");
        assert!(b.allows(&url("https://api.example.com/v1")));
        assert!(b.allows(&url("https://api.example.com/v1/payments?x=1")));
        assert!(!b.allows(&url("https://api.example.com/v10/payments")));
        assert!(!b.allows(&url("https://api.example.com/")));
        assert!(!b.allows(&url("https://api.example.com.evil.test/v1")));
        assert!(!b.allows(&url("https://evil.test/v1?api.example.com")));
        let pinned = Binding::new("127.0.0.1:8443", None).expect("binding");
        assert!(pinned.allows(&url("http://127.0.0.1:8443/x")));
        assert!(!pinned.allows(&url("http://127.0.0.1:8444/x")));
        let any_port = Binding::new("localhost", None).expect("binding");
        assert!(any_port.allows(&url("http://localhost:9000/")));
    }

    #[test]
    fn malformed_bindings_and_names_are_refused() {
        for bad in ["", "https://api.example.com", "api.example.com/v1", "*.example.com", "user@host"] {
            assert!(Binding::new(bad, None).is_err(), "{bad}");
        }
        assert!(Binding::new("api.example.com", Some("v1")).is_err());
        assert!(Binding::new("api.example.com", Some("/v1/../admin")).is_err());
        let mut c = Credential {
            name: "ok-name".into(),
            kind: CredentialKind::Header { name: "Authorization".into() },
            bindings: vec![Binding::new("a.example", None).expect("b")],
            approve_every_use: false,
            idempotency_header: None,
            reads_have_effects: false,
        };
        assert!(c.validate().is_err(), "raw Authorization header must use bearer/basic");
        c.kind = CredentialKind::Header { name: "X-Api-Key".into() };
        c.validate().expect("valid");
        c.name = "bad name".into();
        assert!(c.validate().is_err());
        c.name = "ok".into();
        c.bindings.clear();
        assert!(c.validate().is_err());
    }

    #[test]
    fn records_round_trip() {
        let c = Credential {
            name: "pay".into(),
            kind: CredentialKind::Basic { username: "svc".into() },
            bindings: vec![Binding::new("pay.example", Some("/v1")).expect("b")],
            approve_every_use: true,
            idempotency_header: Some("Idempotency-Key".into()),
            reads_have_effects: true,
        };
        assert_eq!(Credential::from_record(&c.to_record(5)).expect("parse"), c);
    }

    #[test]
    fn a_loopback_binding_without_a_port_is_flagged() {
        for (host, flagged) in [
            ("127.0.0.1", true),
            ("localhost", true),
            ("[::1]", true),
            ("127.0.0.2", true),
            ("127.0.0.1:8080", false),
            ("localhost:3000", false),
            ("[::1]:9", false),
            ("api.example", false),
        ] {
            assert_eq!(Binding::new(host, None).unwrap().loopback_without_port(), flagged, "{host}");
        }
    }
}
