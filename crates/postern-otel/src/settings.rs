//! Where the export goes and what it may carry, settled once at start: `postern serve`'s flags
//! (`--otlp-endpoint`, `--otlp-header`), else the OpenTelemetry environment variables as the
//! OTLP exporter specification defines them (`OTEL_EXPORTER_OTLP_ENDPOINT` and its per-signal
//! forms, `…_HEADERS`, `…_TIMEOUT`, `…_PROTOCOL`, `OTEL_SDK_DISABLED`). A value that does not
//! parse is an error naming the setting, never a silent default; a header's value is never shown.

use std::{collections::BTreeSet, time::Duration};

/// Why the export's settings are not usable.
#[derive(Debug, thiserror::Error)]
#[error("{setting} is not valid: {problem}")]
pub struct SettingsError {
    pub setting: String,
    pub problem: String,
}

impl postern_core::ErrorCode for SettingsError {
    fn code(&self) -> &'static str {
        "invalid_setting"
    }
}

fn invalid(setting: &str, problem: impl Into<String>) -> SettingsError {
    SettingsError { setting: setting.to_owned(), problem: problem.into() }
}

/// The OTLP export of the journal.
#[derive(Clone)]
pub struct ExportSettings {
    /// Where spans go (`…/v1/traces`); `None`: spans are not exported.
    pub traces: Option<url::Url>,
    /// Where log records go (`…/v1/logs`); `None`: log records are not exported.
    pub logs: Option<url::Url>,
    /// Sent with every request (an API key, a tenant); values are never shown.
    headers: Vec<(String, String)>,
    /// Header names the OTLP library would take from the environment on its own but that this
    /// export does not send (the endpoint came from a flag): removed from every request.
    pub(crate) unsent: Vec<String>,
    pub timeout: Duration,
    /// The tools whose arguments (and result digest) the export carries (`[export] arguments` in
    /// tools.toml): none by default.
    pub arguments_of: BTreeSet<String>,
}

impl std::fmt::Debug for ExportSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportSettings")
            .field("traces", &self.target())
            .field("headers", &self.headers.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .field("arguments_of", &self.arguments_of)
            .finish()
    }
}

/// The default timeout of an export request (the OTLP specification's 10 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// `%XX` escapes decoded (OTEL_EXPORTER_OTLP_HEADERS values are percent-encoded).
fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A header name as HTTP allows it, and a value of visible ASCII (no line breaks, no control
/// characters, nothing an HTTP library would drop in silence).
fn header_ok(name: &str, value: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        && value.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// The environment variables the OTLP library reads headers from by itself.
const HEADER_VARIABLES: [&str; 3] =
    ["OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_LOGS_HEADERS"];

/// `k=v,…` (percent-encoded), as the OTLP exporter specification writes a header list.
fn header_list(setting: &str, list: &str) -> Result<Vec<(String, String)>, SettingsError> {
    let mut out = Vec::new();
    for pair in list.split(',').filter(|p| !p.trim().is_empty()) {
        let bad = || invalid(setting, "not a list of key=value pairs of visible ASCII (values not shown)");
        let (k, v) = pair.split_once('=').ok_or_else(bad)?;
        let (k, v) = (percent_decoded(k.trim()).ok_or_else(bad)?, percent_decoded(v.trim()).ok_or_else(bad)?);
        if !header_ok(&k, &v) {
            return Err(bad());
        }
        out.push((k.to_ascii_lowercase(), v));
    }
    Ok(out)
}

fn endpoint(setting: &str, text: &str) -> Result<url::Url, SettingsError> {
    let url = url::Url::parse(text.trim()).map_err(|e| invalid(setting, format!("not an absolute URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(invalid(setting, "an OTLP/HTTP endpoint is an http(s) URL"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid(setting, "it carries a user name or password: give credentials as a header instead"));
    }
    Ok(url)
}

impl ExportSettings {
    /// The settings from `postern serve`'s flags (`endpoint`, `headers` as `K=V`), else from
    /// the environment `lookup` reads; `None` when no endpoint is set (or the SDK is disabled
    /// and no flag asks for an export).
    pub fn resolve(
        flag_endpoint: Option<&str>,
        flag_headers: &[String],
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<ExportSettings>, SettingsError> {
        let var = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        if flag_endpoint.is_none() && var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        if let Some(protocol) = var("OTEL_EXPORTER_OTLP_PROTOCOL")
            && protocol.trim() != "http/protobuf"
        {
            return Err(invalid(
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                format!("{:?}: Postern exports over http/protobuf only", protocol.chars().take(40).collect::<String>()),
            ));
        }
        let base = match flag_endpoint {
            Some(flag) => Some(("--otlp-endpoint", flag.to_owned())),
            None => var("OTEL_EXPORTER_OTLP_ENDPOINT").map(|v| ("OTEL_EXPORTER_OTLP_ENDPOINT", v)),
        };
        // A per-signal endpoint is used as it is; the base gets the signal's path. A signal with
        // neither is off (never the specification's localhost default: a journal is not sent to
        // an address nobody named). `OTEL_{TRACES,LOGS}_EXPORTER=none` turns one off too.
        let signal = |variable: &str, exporter: &str, path: &str| -> Result<Option<url::Url>, SettingsError> {
            if flag_endpoint.is_none() && var(exporter).is_some_and(|v| v.trim().eq_ignore_ascii_case("none")) {
                return Ok(None);
            }
            if flag_endpoint.is_none()
                && let Some(own) = var(variable)
            {
                return endpoint(variable, &own).map(Some);
            }
            match &base {
                Some((setting, text)) => {
                    endpoint(setting, text)?;
                    endpoint(setting, &format!("{}{path}", text.trim().trim_end_matches('/'))).map(Some)
                }
                None => Ok(None),
            }
        };
        let traces = signal("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER", "/v1/traces")?;
        let logs = signal("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "OTEL_LOGS_EXPORTER", "/v1/logs")?;
        if traces.is_none() && logs.is_none() {
            return Ok(None);
        }
        // Headers: the environment's (general, then per signal), then the flags, each later one
        // replacing an earlier one of the same name. With the endpoint from a flag, only the
        // flags' headers go: an API key meant for another backend never follows the flag.
        let mut headers: Vec<(String, String)> = Vec::new();
        let mut set = |name: String, value: String| {
            headers.retain(|(k, _)| *k != name);
            headers.push((name, value));
        };
        let mut from_environment = Vec::new();
        for variable in HEADER_VARIABLES {
            if let Some(list) = var(variable) {
                for (k, v) in header_list(variable, &list)? {
                    from_environment.push(k.clone());
                    if flag_endpoint.is_none() {
                        set(k, v);
                    }
                }
            }
        }
        for flag in flag_headers {
            let bad = || {
                invalid(
                    "--otlp-header",
                    "expected NAME=VALUE, a header name and a value of visible ASCII (value not shown)",
                )
            };
            let (k, v) = flag.split_once('=').ok_or_else(bad)?;
            if !header_ok(k.trim(), v) {
                return Err(bad());
            }
            set(k.trim().to_ascii_lowercase(), v.to_owned());
        }
        let unsent: Vec<String> =
            from_environment.into_iter().filter(|k| !headers.iter().any(|(h, _)| h == k)).collect();
        // Headers carry credentials: never in clear beyond this machine.
        for url in traces.iter().chain(logs.iter()) {
            let loopback = match url.host() {
                Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
                None => false,
            };
            if !headers.is_empty() && url.scheme() == "http" && !loopback {
                return Err(invalid(
                    base.as_ref().map_or("OTEL_EXPORTER_OTLP_ENDPOINT", |(s, _)| s),
                    "headers (credentials) would travel in clear: use https beyond this machine",
                ));
            }
        }
        let timeout = match var("OTEL_EXPORTER_OTLP_TIMEOUT") {
            Some(ms) => match ms.trim().parse::<u64>() {
                Ok(0) => return Err(invalid("OTEL_EXPORTER_OTLP_TIMEOUT", "0 ms would fail every export")),
                Ok(ms) => Duration::from_millis(ms),
                Err(e) => return Err(invalid("OTEL_EXPORTER_OTLP_TIMEOUT", format!("milliseconds: {e}"))),
            },
            None => DEFAULT_TIMEOUT,
        };
        Ok(Some(ExportSettings { traces, logs, headers, unsent, timeout, arguments_of: BTreeSet::new() }))
    }

    /// With the tools whose arguments the export carries.
    pub fn with_arguments_of(mut self, tools: BTreeSet<String>) -> Self {
        self.arguments_of = tools;
        self
    }

    pub(crate) fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// Where the export goes, as status shows it: the traces endpoint (else the logs one)
    /// without its query.
    pub fn target(&self) -> String {
        let Some(mut shown) = self.traces.clone().or_else(|| self.logs.clone()) else { return String::new() };
        shown.set_query(None);
        shown.set_fragment(None);
        shown.to_string()
    }

    /// The header names (status and doctor show these, never the values).
    pub fn header_names(&self) -> Vec<&str> {
        self.headers.iter().map(|(k, _)| k.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the header list holds, reading it never panics, an accepted value holds no
        /// control character (no header injection), and a refusal never shows a value.
        #[test]
        fn hostile_header_lists_are_read_safely(list in "(?s).{0,120}", flag in "(?s).{0,60}") {
            let vars = [("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), "http://a:1".to_owned()),
                        ("OTEL_EXPORTER_OTLP_HEADERS".to_owned(), list.clone())];
            let lookup = |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
            match ExportSettings::resolve(None, std::slice::from_ref(&flag), lookup) {
                Ok(Some(s)) => {
                    for (k, v) in s.headers() {
                        prop_assert!(header_ok(k, v));
                    }
                }
                Ok(None) => prop_assert!(false, "an endpoint was set"),
                Err(e) => {
                    let said = e.to_string();
                    for value in list.split(',').filter_map(|p| p.split_once('=')).map(|(_, v)| v.trim()).chain(flag.split_once('=').map(|(_, v)| v)) {
                        if value.len() > 3 {
                            prop_assert!(!said.contains(value), "{said} shows {value:?}");
                        }
                    }
                }
            }
        }
    }

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned())
    }

    fn url(u: &Option<url::Url>) -> Option<&str> {
        u.as_ref().map(url::Url::as_str)
    }

    #[test]
    fn the_base_endpoint_gets_each_signals_path_and_a_per_signal_one_is_used_as_given() {
        let s = ExportSettings::resolve(None, &[], env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/")]))
            .unwrap()
            .unwrap();
        assert_eq!(url(&s.traces), Some("http://127.0.0.1:4318/v1/traces"));
        assert_eq!(url(&s.logs), Some("http://127.0.0.1:4318/v1/logs"));
        let s = ExportSettings::resolve(
            None,
            &[],
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://b/otlp/t"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(url(&s.traces), Some("https://b/otlp/t"));
        assert_eq!(url(&s.logs), Some("http://127.0.0.1:4318/v1/logs"));
        // A per-signal endpoint alone: the other signal is off, never sent to a made-up address.
        let s = ExportSettings::resolve(
            None,
            &[],
            env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://tempo/otlp/v1/traces")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!((url(&s.traces), url(&s.logs)), (Some("https://tempo/otlp/v1/traces"), None));
        // A traces-only backend: logs turned off as the SDK's variable says.
        let s = ExportSettings::resolve(
            None,
            &[],
            env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://jaeger:4318"), ("OTEL_LOGS_EXPORTER", "none")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(url(&s.logs), None);
        // The flag wins over the environment, and turns the export on even where the SDK is off.
        let s = ExportSettings::resolve(
            Some("http://127.0.0.1:1"),
            &["X-Api-Key=abc".into()],
            env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://b/t"), ("OTEL_SDK_DISABLED", "true")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(url(&s.traces), Some("http://127.0.0.1:1/v1/traces"));
        assert_eq!(s.header_names(), ["x-api-key"]);
        assert!(!format!("{s:?}").contains("abc"), "a header's value is never shown");
    }

    #[test]
    fn nothing_set_or_disabled_is_no_export() {
        assert!(ExportSettings::resolve(None, &[], env(&[])).unwrap().is_none());
        let disabled = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"), ("OTEL_SDK_DISABLED", "TRUE")]);
        assert!(ExportSettings::resolve(None, &[], disabled).unwrap().is_none());
        let both_off = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"),
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_LOGS_EXPORTER", "none"),
        ]);
        assert!(ExportSettings::resolve(None, &[], both_off).unwrap().is_none());
    }

    #[test]
    fn headers_are_percent_decoded_and_flags_override_the_environment() {
        let s = ExportSettings::resolve(
            None,
            &["authorization=Bearer flag".into()],
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://a:1"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20env,x-tenant=t%2C1"),
                ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-tenant=traces"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            s.headers(),
            [("x-tenant".to_owned(), "traces".to_owned()), ("authorization".to_owned(), "Bearer flag".to_owned())]
        );
        // With the endpoint from a flag, the environment's headers (another backend's key) stay
        // home, and are removed from what the OTLP library would add by itself.
        let s = ExportSettings::resolve(
            Some("https://other:1"),
            &[],
            env(&[("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=for-someone-else")]),
        )
        .unwrap()
        .unwrap();
        assert!(s.headers().is_empty());
        assert_eq!(s.unsent, ["x-api-key"]);
    }

    #[test]
    fn bad_values_name_the_setting_and_never_show_a_header_value() {
        for (flag, headers, vars, setting) in [
            (Some("ftp://a"), vec![], &[][..], "--otlp-endpoint"),
            (Some("http://u:secret-pw@a:1"), vec![], &[][..], "--otlp-endpoint"),
            (None, vec![], &[("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url")][..], "OTEL_EXPORTER_OTLP_ENDPOINT"),
            (Some("http://a:1"), vec!["no-equals-secret-v".to_owned()], &[][..], "--otlp-header"),
            (Some("http://a:1"), vec!["x=line\r\nInjected: secret-v".to_owned()], &[][..], "--otlp-header"),
            (
                None,
                vec![],
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"), ("OTEL_EXPORTER_OTLP_HEADERS", "k=%zzsecret-v")][..],
                "OTEL_EXPORTER_OTLP_HEADERS",
            ),
            (
                None,
                vec![],
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")][..],
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                None,
                vec![],
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"), ("OTEL_EXPORTER_OTLP_TIMEOUT", "5s")][..],
                "OTEL_EXPORTER_OTLP_TIMEOUT",
            ),
        ] {
            let vars: &'static [(&'static str, &'static str)] = Box::leak(vars.to_vec().into_boxed_slice());
            let err = ExportSettings::resolve(flag, &headers, env(vars)).unwrap_err();
            assert_eq!(err.setting, setting, "{err}");
            assert!(!err.to_string().contains("secret"), "{err}");
        }
    }
}
