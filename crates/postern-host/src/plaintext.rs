//! Spotting secrets written in plain text where an MCP server is configured — an agent config's
//! environment values and arguments, or `postern servers add`'s command line — so that they go
//! to the keychain and never into a journal row, which can never be removed. Recognised: the
//! password of a URL or DSN (`postgresql://admin:PASSWORD@…`), secret query parameters
//! (`?api_key=…`), the value of a secret flag (`--access-token sbp_…`, `--password=…`), the
//! value of an `Authorization:`-style header argument, tokens with a well-known prefix (`ghp_`,
//! `github_pat_`, `glpat-`, `sk-`, `xoxb-`, `sbp_`, `AKIA`, …), and long high-entropy values.
//! Pure: property-tested with hostile values.

use postern_vault::{SecretArg, Sensitive};
use std::ops::Range;

/// Prefixes that start a token of a well-known service (GitHub, GitLab, OpenAI and Anthropic,
/// Stripe, Slack, Supabase, AWS, Google, npm, PyPI, DigitalOcean, Shopify, Hugging Face, Linear,
/// SendGrid, Square, JWTs).
const TOKEN_PREFIXES: &[&str] = &[
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "gldt-",
    "sk-",
    "sk_live_",
    "sk_test_",
    "rk_live_",
    "rk_test_",
    "xoxb-",
    "xoxp-",
    "xoxa-",
    "xoxs-",
    "xapp-",
    "sbp_",
    "AKIA",
    "ASIA",
    "AIza",
    "npm_",
    "pypi-",
    "dop_v1_",
    "shpat_",
    "shpss_",
    "hf_",
    "lin_api_",
    "SG.",
    "sq0atp-",
    "ya29.",
    "eyJ",
];

/// Parts of a name (a flag, a header, a query parameter) that say its value is a secret, beyond
/// those that make an upstream tool's argument one: `auth`, `bearer`, `signature`,
/// `passphrase`.
const MORE_SECRET_NAME_PARTS: &[&str] = &["auth", "bearer", "signature", "passphrase"];

/// Words of an environment name (split at `_`, upper-cased) that make its value a secret. Short
/// ones count only as whole words (`BYPASS_CACHE`, `KEYBOARD` are not secrets).
const SECRET_ENV_WORDS: &[&str] = &[
    "TOKEN",
    "TOKENS",
    "KEY",
    "KEYS",
    "SECRET",
    "SECRETS",
    "PASS",
    "PWD",
    "PAT",
    "CREDENTIAL",
    "CREDENTIALS",
    "CREDS",
    "AUTH",
    "COOKIE",
    "COOKIES",
];

/// Endings of a word that make it a secret's name even inside a longer word (`PGPASSWORD`,
/// `APIKEY`, `GHTOKEN`).
const SECRET_ENV_ENDINGS: &[&str] =
    &["PASSWORD", "PASSWD", "PASSPHRASE", "TOKEN", "SECRET", "APIKEY", "ACCESSKEY", "PRIVATEKEY", "CREDENTIALS"];

/// Last words that make a name about a secret rather than one (`KEY_PATH`, `AUTH_MODE`,
/// `TOKEN_URL`): its value is still checked for what it holds.
const NOT_SECRET_LAST_WORDS: &[&str] = &[
    "PATH",
    "FILE",
    "DIR",
    "NAME",
    "ID",
    "MODE",
    "TYPE",
    "URL",
    "URI",
    "HOST",
    "PORT",
    "ENDPOINT",
    "LENGTH",
    "SIZE",
    "TTL",
    "TIMEOUT",
    "EXPIRY",
    "ENABLED",
    "DISABLED",
    "FORMAT",
    "ALGORITHM",
    "ISSUER",
    "SCOPE",
    "SCOPES",
];

/// Does an environment variable with this name hold a secret, by its name alone?
pub fn env_name_is_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    let words: Vec<&str> = upper.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()).collect();
    // `PWD` alone (and `OLDPWD`) is the shell's working directory.
    if matches!(upper.as_str(), "PWD" | "OLDPWD") || words.last().is_some_and(|w| NOT_SECRET_LAST_WORDS.contains(w)) {
        return false;
    }
    words.iter().any(|w| SECRET_ENV_WORDS.contains(w) || SECRET_ENV_ENDINGS.iter().any(|e| w.ends_with(e)))
}

fn flat(name: &str) -> String {
    name.chars().filter(|c| c.is_ascii_alphanumeric()).collect::<String>().to_ascii_lowercase()
}

/// Does a flag, header or query parameter with this name carry a secret value?
pub fn secret_name(name: &str) -> bool {
    let flat = flat(name);
    !flat.is_empty()
        && (postern_engine::catalog::upstream_contract::SECRET_ARGUMENT_PARTS
            .iter()
            .chain(MORE_SECRET_NAME_PARTS)
            .any(|p| flat.contains(p))
            || matches!(flat.as_str(), "pat" | "key" | "sig" | "pass"))
}

/// Where the secret inside `value` is, if there is one (the byte range; the whole value for a
/// high-entropy one).
pub fn secret_in(value: &str) -> Option<Range<usize>> {
    secret_kind(value).map(|(range, _)| range)
}

/// The secret inside `value` and what it is (`PASSWORD`, `TOKEN`, `SECRET`, `AUTHORIZATION`),
/// for the name it is kept under.
fn secret_kind(value: &str) -> Option<(Range<usize>, &'static str)> {
    url_secret(value)
        .or_else(|| assignment_secret(value).map(|r| (r, "SECRET")))
        .or_else(|| header_secret(value).map(|r| (r, "AUTHORIZATION")))
        .or_else(|| prefixed_token(value).map(|r| (r, "TOKEN")))
        .or_else(|| high_entropy(value).then_some((0..value.len(), "TOKEN")))
}

/// From the first secret in `value` to the end of its last one (a URL with a password and an
/// `?api_key=`: one span, so what goes back at spawn is a single piece), and what the first is.
fn secrets_span(value: &str) -> Option<(Range<usize>, &'static str)> {
    let (first, kind) = secret_kind(value)?;
    let mut end = first.end;
    while end < value.len() {
        match secret_kind(&value[end..]) {
            Some((more, _)) if !more.is_empty() => end += more.end,
            _ => break,
        }
    }
    Some((first.start..end, kind))
}

/// Is this environment value a secret: by its name ([`env_name_is_secret`]), or because it
/// holds one (a URL with a password, a connection string's password, a token, a high-entropy
/// value)?
pub fn env_is_secret(name: &str, value: &str) -> bool {
    !value.is_empty() && (env_name_is_secret(name) || secret_in(value).is_some())
}

/// The secret value of an assignment: `PGPASSWORD=hunter2` (an environment-style name that
/// says secret, as `docker run -e` and `env` take it), or a connection string's secret field
/// (`Server=db;User Id=sa;Password=P@ss;`).
fn assignment_secret(value: &str) -> Option<Range<usize>> {
    if let Some((name, secret)) = value.split_once('=')
        && !secret.is_empty()
        && !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && env_name_is_secret(name)
    {
        let begin = name.len() + 1;
        let end = value[begin..].find(';').map_or(value.len(), |i| begin + i);
        if begin < end {
            return Some(begin..end);
        }
    }
    if !value.contains(';') {
        return None;
    }
    let mut at = 0;
    for field in value.split(';') {
        if let Some((name, secret)) = field.split_once('=')
            && secret_name(name.trim())
        {
            let lead = secret.len() - secret.trim_start().len();
            let begin = at + name.len() + 1 + lead;
            let end = at + field.trim_end().len();
            if begin < end {
                return Some(begin..end);
            }
        }
        at += field.len() + 1;
    }
    None
}

/// A URL's (or DSN's) password, a token standing as its user name, or the value of a secret
/// query parameter.
fn url_secret(value: &str) -> Option<(Range<usize>, &'static str)> {
    let mut from = 0;
    while let Some(at) = value[from..].find("://") {
        let start = from + at + 3;
        let rest = &value[start..];
        let end = rest.find(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace()).unwrap_or(rest.len());
        let authority = &rest[..end];
        let mut user = None;
        if let Some(userinfo_end) = authority.rfind('@') {
            let userinfo = &authority[..userinfo_end];
            match userinfo.find(':') {
                Some(colon) if colon + 1 < userinfo.len() => {
                    user = Some((start + colon + 1..start + userinfo_end, "PASSWORD"));
                }
                None if userinfo.len() >= 16 && (prefixed_token(userinfo).is_some() || high_entropy(userinfo)) => {
                    user = Some((start..start + userinfo_end, "TOKEN"));
                }
                _ => {}
            }
        }
        // A password and a secret parameter in one URL: one span from the first to the last.
        let with_user = |query: Option<Range<usize>>| match (user.clone(), query) {
            (Some((u, kind)), Some(q)) => Some((u.start..q.end, kind)),
            (Some(u), None) => Some(u),
            (None, Some(q)) => Some((q, "SECRET")),
            (None, None) => None,
        };
        // `?name=value&…`: a secret parameter's value.
        let after = start + end;
        let path_end = value[after..].find(|c: char| c == '#' || c.is_whitespace()).map_or(value.len(), |i| after + i);
        if let Some(q) = value[after..path_end].find('?') {
            let query_start = after + q + 1;
            let query_end = value[query_start..]
                .find(|c: char| c == '#' || c.is_whitespace())
                .map_or(value.len(), |i| query_start + i);
            let mut at = query_start;
            for pair in value[query_start..query_end].split('&') {
                if let Some((name, secret)) = pair.split_once('=')
                    && secret_name(name)
                    && !secret.is_empty()
                {
                    let begin = at + name.len() + 1;
                    return with_user(Some(begin..begin + secret.len()));
                }
                at += pair.len() + 1;
            }
        }
        if user.is_some() {
            return with_user(None);
        }
        from = start;
    }
    None
}

/// `Authorization: Bearer …`, `X-Api-Key: …`: the value of a header whose name says it is secret.
fn header_secret(value: &str) -> Option<Range<usize>> {
    let colon = value.find(':')?;
    let name = value[..colon].trim();
    let rest = &value[colon + 1..];
    if name.is_empty() || name.contains(char::is_whitespace) || rest.starts_with("//") || !secret_name(name) {
        return None;
    }
    let begin = colon + 1 + (rest.len() - rest.trim_start().len());
    let end = value.trim_end().len();
    (begin < end).then_some(begin..end)
}

/// A token of a well-known service, starting at a word boundary: the prefix and at least eight
/// token characters after it.
fn prefixed_token(value: &str) -> Option<Range<usize>> {
    let token_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '=' | '+' | '/');
    for prefix in TOKEN_PREFIXES {
        let mut from = 0;
        while let Some(at) = value[from..].find(prefix) {
            let start = from + at;
            let boundary = value[..start].chars().next_back().is_none_or(|c| !c.is_ascii_alphanumeric());
            let len = value[start..].find(|c: char| !token_char(c)).unwrap_or(value.len() - start);
            if boundary && len >= prefix.len() + 8 {
                return Some(start..start + len);
            }
            from = start + prefix.len();
        }
    }
    None
}

/// Long, random-looking, and shaped like a key: only key characters (letters, digits, `_`, `-`,
/// and base64's `+/=`), letters and digits both, at least 24 characters and 3.5 bits of entropy
/// per character. Paths, package names, URLs, words and versions are not.
fn high_entropy(value: &str) -> bool {
    let key_chars = value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+' | '/' | '='));
    let looks_like_path = value.starts_with('/') || value.starts_with('.') || value.contains("//");
    value.len() >= 24
        && key_chars
        && !looks_like_path
        && value.chars().any(|c| c.is_ascii_digit())
        && value.chars().any(|c| c.is_ascii_alphabetic())
        && entropy_bits_per_char(value) >= 3.5
}

fn entropy_bits_per_char(s: &str) -> f64 {
    let mut counts = std::collections::BTreeMap::<char, usize>::new();
    for c in s.chars() {
        *counts.entry(c).or_default() += 1;
    }
    let n = s.chars().count() as f64;
    counts.values().map(|&k| k as f64 / n).map(|p| -p * p.log2()).sum()
}

/// One secret found in a command line: which argument, where in it, and the name it is kept
/// under in the keychain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgSecret {
    pub index: usize,
    pub range: Range<usize>,
    pub name: String,
}

/// An environment-style name for a secret: from its flag (`--access-token` → `ACCESS_TOKEN`),
/// or from its argument's place (`ARG2_PASSWORD`).
fn secret_name_for(flag: Option<&str>, index: usize, kind: &str) -> String {
    match flag.map(|f| f.trim_start_matches('-').replace(|c: char| !c.is_ascii_alphanumeric(), "_")) {
        Some(f) if !f.is_empty() && !f.starts_with(|c: char| c.is_ascii_digit()) => f.to_ascii_uppercase(),
        _ => format!("ARG{index}_{kind}"),
    }
}

/// Every secret in a command line's arguments (`args` after the program).
pub fn args_secrets(args: &[String]) -> Vec<ArgSecret> {
    let mut found: Vec<ArgSecret> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        // `--token=VALUE`, `--token VALUE`.
        if arg.starts_with('-') {
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) => (flag, Some(value)),
                None => (arg.as_str(), None),
            };
            if secret_name(flag) {
                let name = secret_name_for(Some(flag), i, "SECRET");
                match inline {
                    Some(value) if !value.is_empty() => {
                        found.push(ArgSecret { index: i, range: flag.len() + 1..arg.len(), name });
                    }
                    Some(_) => {}
                    None => {
                        if let Some(next) = args.get(i + 1).filter(|n| !n.is_empty() && !n.starts_with('-')) {
                            let range = header_secret(next).unwrap_or(0..next.len());
                            found.push(ArgSecret { index: i + 1, range, name });
                            i += 2;
                            continue;
                        }
                    }
                }
                i += 1;
                continue;
            }
        }
        let value_start = if arg.starts_with('-') { arg.find('=').map_or(0, |e| e + 1) } else { 0 };
        if let Some((range, kind)) = secrets_span(&arg[value_start..]) {
            let range = range.start + value_start..range.end + value_start;
            found.push(ArgSecret { index: i, range, name: secret_name_for(None, i, kind) });
        }
        i += 1;
    }
    // Names are unique (two `--token` flags get ARGn names).
    let mut seen = std::collections::BTreeSet::new();
    for f in &mut found {
        if !seen.insert(f.name.clone()) {
            f.name = format!("ARG{}_SECRET", f.index);
            seen.insert(f.name.clone());
        }
    }
    found
}

/// A command line with its secrets taken out.
#[derive(Debug)]
pub struct SplitArgs {
    /// The arguments as lists show them (`prefix<NAME>suffix` where a secret was).
    pub shown: Vec<String>,
    /// Where each secret goes back at spawn.
    pub places: Vec<SecretArg>,
    /// The secrets themselves, by name, for the keychain.
    pub secrets: Vec<(String, Sensitive<String>)>,
}

/// `args` with their secrets taken out. `taken` are names already used by the server's secret
/// environment values.
pub fn split_args(args: &[String], taken: &[String]) -> SplitArgs {
    let mut shown = args.to_vec();
    let mut places = Vec::new();
    let mut values = Vec::new();
    for mut s in args_secrets(args) {
        while taken.contains(&s.name) || places.iter().any(|p: &SecretArg| p.name == s.name) {
            s.name = format!("{}_ARG", s.name);
        }
        let arg = &args[s.index];
        let place = SecretArg {
            index: s.index,
            name: s.name.clone(),
            prefix: arg[..s.range.start].to_owned(),
            suffix: arg[s.range.end..].to_owned(),
        };
        shown[s.index] = place.shown();
        values.push((s.name, Sensitive::new(arg[s.range.clone()].to_owned())));
        places.push(place);
    }
    SplitArgs { shown, places, secrets: values }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn secrets_in_command_lines_are_found_with_their_names() {
        let line = args(&[
            "-y",
            "@modelcontextprotocol/server-postgres",
            "postgresql://admin:hunter2-Pw@db.internal:5432/app",
            "--access-token",
            "sbp_0123456789abcdef0123456789abcdef01234567",
            "--api-key=sk-live-0123456789ABCDEFGH",
            "--header",
            "Authorization: Bearer abc.def.ghi-0123456789",
            "https://ghp_0123456789abcdefghij0123456789abcdef@github.com/org/repo.git",
            "--url=https://api.example/v1?team=core&api_key=k3y-v4lue-0123&x=1",
            "--log-level",
            "debug",
            "/home/me/projects/with-a-long-path-name",
        ]);
        let found = args_secrets(&line);
        let shown: Vec<(usize, &str, &str)> =
            found.iter().map(|f| (f.index, &line[f.index][f.range.clone()], f.name.as_str())).collect();
        assert_eq!(
            shown,
            vec![
                (2, "hunter2-Pw", "ARG2_PASSWORD"),
                (4, "sbp_0123456789abcdef0123456789abcdef01234567", "ACCESS_TOKEN"),
                (5, "sk-live-0123456789ABCDEFGH", "API_KEY"),
                (7, "Bearer abc.def.ghi-0123456789", "ARG7_AUTHORIZATION"),
                (8, "ghp_0123456789abcdefghij0123456789abcdef", "ARG8_TOKEN"),
                (9, "k3y-v4lue-0123", "ARG9_SECRET"),
            ]
        );
        let SplitArgs { shown, places, secrets: values } = split_args(&line, &[]);
        assert_eq!(shown[2], "postgresql://admin:<ARG2_PASSWORD>@db.internal:5432/app");
        assert_eq!(shown[5], "--api-key=<API_KEY>");
        assert_eq!(shown[7], "Authorization: <ARG7_AUTHORIZATION>");
        assert_eq!(shown[11], "debug");
        assert_eq!(places.len(), values.len());
        for (p, (name, value)) in places.iter().zip(&values) {
            assert_eq!(&p.name, name);
            assert_eq!(format!("{}{}{}", p.prefix, value.expose(), p.suffix), line[p.index], "rebuilt exactly");
        }
    }

    #[test]
    fn environment_values_are_secret_by_name_or_by_what_they_hold() {
        for (name, value) in [
            ("GITHUB_PERSONAL_ACCESS_TOKEN", "ghp_x"),
            ("OPENAI_API_KEY", "sk-1"),
            ("DB_PASSWORD", "hunter2"),
            ("DATABASE_URL", "postgres://u:s3cret-pw@localhost/db"),
            ("SUPABASE", "sbp_0123456789abcdef0123456789"),
            ("SOMETHING", "q8Zr3vN1xK0pL7wT5mB2cY9dF4hJ6gS"),
            ("AWS_ID", "AKIAIOSFODNN7EXAMPLE"),
        ] {
            assert!(env_is_secret(name, value), "{name}={value}");
        }
        for (name, value) in [
            ("LOG_LEVEL", "debug"),
            ("ROOT", "/home/me/projects/with-a-long-path-name"),
            ("BASE_URL", "https://api.example.com/v1/abcdefghijk"),
            ("MODE", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
            ("API_KEY", ""),
            ("PACKAGE", "@modelcontextprotocol/server-filesystem"),
            ("TASK", "task-sk-123"),
            ("ENDPOINT", "ssh://git@github.com/org/repo"),
        ] {
            assert!(!env_is_secret(name, value), "{name}={value}");
        }
    }

    #[test]
    fn assignments_connection_strings_and_several_secrets_in_one_argument_are_found() {
        let line = args(&[
            "-e",
            "PGPASSWORD=hunter2",
            "--env=API_KEY=abc123",
            "Server=db;User Id=sa;Password=P@ss;",
            "--pass",
            "hunter2x",
            "--passphrase=open sesame",
            "postgres://u:pw1@h/db?api_key=k2",
            "-e",
            "BYPASS_CACHE=true",
        ]);
        let found: Vec<(usize, String)> =
            args_secrets(&line).into_iter().map(|f| (f.index, line[f.index][f.range].to_owned())).collect();
        assert_eq!(
            found,
            vec![
                (1, "hunter2".to_owned()),
                (2, "abc123".to_owned()),
                (3, "P@ss".to_owned()),
                (5, "hunter2x".to_owned()),
                (6, "open sesame".to_owned()),
                (7, "pw1@h/db?api_key=k2".to_owned()),
            ]
        );
    }

    #[test]
    fn environment_names_are_read_as_words() {
        for name in ["PGPASSWORD", "MYSQL_PWD", "GH_TOKEN", "AWS_SECRET_ACCESS_KEY", "AUTH", "SESSION_COOKIE", "APIKEY"]
        {
            assert!(env_name_is_secret(name), "{name}");
        }
        for name in ["BYPASS_CACHE", "KEY_PATH", "AUTH_MODE", "TOKEN_URL", "KEYBOARD_LAYOUT", "PWD", "COMPASS"] {
            assert!(!env_name_is_secret(name), "{name}");
        }
        assert!(env_is_secret("CONNECTION_STRING", "Server=db;User Id=sa;Password=P@ss;"));
        assert!(!env_is_secret("KEY_PATH", "/home/alice/.ssh/id_ed25519"));
    }

    proptest! {
        /// Whatever a command line holds, splitting never panics, every secret is taken out of
        /// what is shown, and every argument is rebuilt exactly from what is shown and kept.
        #[test]
        fn a_split_command_line_rebuilds_exactly_and_shows_no_secret(
            line in proptest::collection::vec(
                prop_oneof![
                    any::<String>(),
                    "[a-z]{2,8}://[a-z]{1,6}:[A-Za-z0-9!#$%&*+,;=~-]{1,20}@[a-z.]{1,12}(/[a-z]{0,6})?",
                    "--(token|api-key|password|secret|auth)(=[ -~]{0,20})?",
                    "(ghp_|sk-|xoxb-|sbp_|AKIA|glpat-)[A-Za-z0-9]{8,40}",
                    "(Authorization|X-Api-Key|Cookie): ?[ -~]{0,30}",
                    "[A-Za-z0-9]{20,48}",
                ],
                0..8,
            ),
        ) {
            let SplitArgs { shown, places, secrets: values } = split_args(&line, &[]);
            prop_assert_eq!(shown.len(), line.len());
            prop_assert_eq!(places.len(), values.len());
            let names: std::collections::BTreeSet<&String> = places.iter().map(|p| &p.name).collect();
            prop_assert_eq!(names.len(), places.len(), "names are unique");
            for (i, arg) in line.iter().enumerate() {
                match places.iter().position(|p| p.index == i) {
                    Some(at) => {
                        let (p, value) = (&places[at], values[at].1.expose());
                        prop_assert_eq!(&format!("{}{}{}", p.prefix, value, p.suffix), arg);
                        prop_assert!(!value.is_empty());
                        prop_assert_eq!(&shown[i], &p.shown());
                    }
                    None => prop_assert_eq!(&shown[i], arg),
                }
            }
        }
    }
}
