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
    /// Where spans go (`…/v1/traces`).
    pub traces: url::Url,
    /// Where log records go (`…/v1/logs`).
    pub logs: url::Url,
    /// Sent with every request (an API key, a tenant); values are never shown.
    headers: Vec<(String, String)>,
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

/// A header name as HTTP allows it, and a value without line breaks or control characters.
fn header_ok(name: &str, value: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        && !value.chars().any(|c| c.is_control())
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
        // A per-signal endpoint is used as it is; the base gets the signal's path.
        let signal = |variable: &str, path: &str| -> Result<Option<url::Url>, SettingsError> {
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
        let traces = signal("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "/v1/traces")?;
        let logs = signal("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "/v1/logs")?;
        let (traces, logs) = match (traces, logs) {
            (None, None) => return Ok(None),
            (Some(t), Some(l)) => (t, l),
            (Some(t), None) => {
                let l = endpoint("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", t.as_str())?.join("/v1/logs").map_err(|e| {
                    invalid(
                        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
                        format!("cannot be made from the traces endpoint ({e})"),
                    )
                })?;
                (t, l)
            }
            (None, Some(l)) => {
                let t = l.join("/v1/traces").map_err(|e| {
                    invalid(
                        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                        format!("cannot be made from the logs endpoint ({e})"),
                    )
                })?;
                (t, l)
            }
        };
        let mut headers: Vec<(String, String)> = Vec::new();
        let mut set = |name: &str, value: String| {
            headers.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
            headers.push((name.to_ascii_lowercase(), value));
        };
        if let Some(list) = var("OTEL_EXPORTER_OTLP_HEADERS") {
            for pair in list.split(',').filter(|p| !p.trim().is_empty()) {
                let bad = || invalid("OTEL_EXPORTER_OTLP_HEADERS", "not a list of key=value pairs (values not shown)");
                let (k, v) = pair.split_once('=').ok_or_else(bad)?;
                let (k, v) = (percent_decoded(k.trim()).ok_or_else(bad)?, percent_decoded(v.trim()).ok_or_else(bad)?);
                if !header_ok(&k, &v) {
                    return Err(bad());
                }
                set(&k, v);
            }
        }
        for flag in flag_headers {
            let bad = || {
                invalid(
                    "--otlp-header",
                    "expected NAME=VALUE, a header name and a value without control characters (value not shown)",
                )
            };
            let (k, v) = flag.split_once('=').ok_or_else(bad)?;
            if !header_ok(k.trim(), v) {
                return Err(bad());
            }
            set(k.trim(), v.to_owned());
        }
        let timeout = match var("OTEL_EXPORTER_OTLP_TIMEOUT") {
            Some(ms) => Duration::from_millis(
                ms.trim().parse().map_err(|e| invalid("OTEL_EXPORTER_OTLP_TIMEOUT", format!("milliseconds: {e}")))?,
            ),
            None => DEFAULT_TIMEOUT,
        };
        Ok(Some(ExportSettings { traces, logs, headers, timeout, arguments_of: BTreeSet::new() }))
    }

    /// With the tools whose arguments the export carries.
    pub fn with_arguments_of(mut self, tools: BTreeSet<String>) -> Self {
        self.arguments_of = tools;
        self
    }

    pub(crate) fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// Where the export goes, as status shows it: the traces endpoint without its query.
    pub fn target(&self) -> String {
        let mut shown = self.traces.clone();
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

    #[test]
    fn the_base_endpoint_gets_each_signals_path_and_a_per_signal_one_is_used_as_given() {
        let s = ExportSettings::resolve(None, &[], env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/")]))
            .unwrap()
            .unwrap();
        assert_eq!(s.traces.as_str(), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(s.logs.as_str(), "http://127.0.0.1:4318/v1/logs");
        let s = ExportSettings::resolve(
            None,
            &[],
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://b/otlp/t"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.traces.as_str(), "https://b/otlp/t");
        assert_eq!(s.logs.as_str(), "http://a:4318/v1/logs");
        // The flag wins over the environment, and turns the export on even where the SDK is off.
        let s = ExportSettings::resolve(
            Some("http://flag:1"),
            &["X-Api-Key=abc".into()],
            env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://b/t"), ("OTEL_SDK_DISABLED", "true")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.traces.as_str(), "http://flag:1/v1/traces");
        assert_eq!(s.header_names(), ["x-api-key"]);
        assert!(!format!("{s:?}").contains("abc"), "a header's value is never shown");
    }

    #[test]
    fn nothing_set_or_disabled_is_no_export() {
        assert!(ExportSettings::resolve(None, &[], env(&[])).unwrap().is_none());
        let disabled = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"), ("OTEL_SDK_DISABLED", "TRUE")]);
        assert!(ExportSettings::resolve(None, &[], disabled).unwrap().is_none());
    }

    #[test]
    fn headers_are_percent_decoded_and_flags_override_the_environment() {
        let s = ExportSettings::resolve(
            None,
            &["authorization=Bearer flag".into()],
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20env,x-tenant=t%2C1"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            s.headers(),
            [("x-tenant".to_owned(), "t,1".to_owned()), ("authorization".to_owned(), "Bearer flag".to_owned())]
        );
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
