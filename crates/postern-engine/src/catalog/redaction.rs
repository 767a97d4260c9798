//! Keeping a secret out of everything Postern writes or shows: finding it in text whatever its
//! spelling (as itself, percent-, form- or JSON-escaped, single-quoted for `sh`), and the secret
//! values one call carries, masked as `SECRET(name:digest)` in its record, journal rows and
//! approval texts.

use postern_core::FingerprintKey;
use postern_vault::Sensitive;
use serde_json::Value;

/// Header and query-parameter names that carry secrets (matched case-insensitively, as parts of
/// the name: `X-Api-Key`, `access_token`, `client_secret`, `Cookie`, …).
const SENSITIVE_NAME_PARTS: &[&str] = &[
    "token",
    "key",
    "secret",
    "password",
    "passwd",
    "pwd",
    "auth",
    "cookie",
    "session",
    "signature",
    "sig",
    "credential",
    "private",
];

/// Does a header or query parameter with this name carry a secret?
pub fn sensitive_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SENSITIVE_NAME_PARTS.iter().any(|part| name.contains(part))
}

/// The secret values one call carries, each with the label it is shown under: the contract's
/// secret arguments (`SECRET(name:digest)`), and — added where the call is sent — the vault
/// credential it injects, an SSH host's key, an upstream server's secret environment and
/// arguments (`<redacted>`). The outcome stage searches what comes back for every one of them.
#[derive(Default, Clone)]
pub struct CallSecrets {
    /// Label (`name:digest`), and the value; longest value first.
    items: Vec<(String, SecretValue)>,
}

/// One value to search for (a `Sensitive` that can be copied into another call's set).
struct SecretValue(Sensitive<String>);

impl Clone for SecretValue {
    fn clone(&self) -> Self {
        SecretValue(Sensitive::new(self.0.expose().clone()))
    }
}

impl SecretValue {
    fn expose(&self) -> &str {
        self.0.expose()
    }
}

/// What a vault secret is replaced by wherever it comes back (a target's echo, an upstream's
/// answer, its stderr).
pub const REDACTED: &str = "<redacted>";

/// A secret shorter than this is not searched for in what comes back: it cannot be told apart
/// from ordinary text (a 2-character password would mask every occurrence of those letters).
pub const MIN_SEARCHED: usize = 4;

impl std::fmt::Debug for CallSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.items.iter().map(|(label, _)| label)).finish()
    }
}

impl CallSecrets {
    /// Every string and number inside `value` (an argument, a header, a query value) is a secret
    /// shown as `SECRET(name:digest)`: the digest is keyed (the installation's fingerprint key),
    /// so two different secrets give two different records, and nobody can test a guess offline.
    pub fn add(&mut self, name: &str, value: &Value, key: &FingerprintKey) {
        match value {
            Value::String(s) => self.add_text(name, s, key),
            Value::Number(n) => self.add_text(name, &n.to_string(), key),
            Value::Array(items) => items.iter().for_each(|v| self.add(name, v, key)),
            Value::Object(map) => map.values().for_each(|v| self.add(name, v, key)),
            Value::Bool(_) | Value::Null => {}
        }
    }

    fn add_text(&mut self, name: &str, text: &str, key: &FingerprintKey) {
        if text.is_empty() {
            return;
        }
        let digest = key.secret_digest(text.as_bytes());
        let short = digest.rsplit(':').next().unwrap_or(&digest).get(..12).unwrap_or_default().to_owned();
        let label = format!("SECRET({name}:{short})");
        self.push(&label, text);
        // As `sh` sees it inside single quotes (an SSH command quotes every argument).
        if text.contains('\'') {
            self.push(&label, &text.replace('\'', r"'\''"));
        }
        // As a target may send it back encoded.
        self.push_encodings(&label, text);
    }

    /// A vault secret (a credential's value, an upstream's secret environment value or
    /// argument, an SSH key's text), with the forms a target could send it back in: itself and
    /// its base64 (standard and URL-safe); each is also found percent-, form- or JSON-escaped.
    pub fn add_vault_secret(&mut self, secret: &str) {
        self.push(REDACTED, secret);
        self.push_encodings(REDACTED, secret);
    }

    /// A vault credential as one request carries it: the secret, and the header value built from
    /// it (`Bearer …`, `Basic base64(user:secret)`), with their encodings.
    pub fn add_credential(&mut self, kind: &postern_vault::CredentialKind, secret: &str) {
        use base64::Engine as _;
        use base64::engine::general_purpose::STANDARD;
        self.add_vault_secret(secret);
        match kind {
            postern_vault::CredentialKind::Basic { username } => {
                let pair = format!("{username}:{secret}");
                self.push(REDACTED, &format!("Basic {}", STANDARD.encode(&pair)));
                self.push(REDACTED, &STANDARD.encode(&pair));
                self.push_encodings(REDACTED, &pair);
            }
            postern_vault::CredentialKind::Bearer => self.push(REDACTED, &format!("Bearer {secret}")),
            postern_vault::CredentialKind::Header { .. } => {}
        }
    }

    /// Everything `other` holds, too.
    pub fn extend(&mut self, other: &CallSecrets) {
        for (label, value) in &other.items {
            self.push(label, value.expose());
        }
    }

    fn push_encodings(&mut self, label: &str, text: &str) {
        use base64::Engine as _;
        use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
        if text.len() >= MIN_SEARCHED {
            self.push(label, &STANDARD_NO_PAD.encode(text));
            self.push(label, &URL_SAFE_NO_PAD.encode(text));
        }
    }

    fn push(&mut self, label: &str, value: &str) {
        if value.is_empty() || self.items.iter().any(|(l, v)| l == label && v.expose() == value) {
            return;
        }
        self.items.push((label.to_owned(), SecretValue(Sensitive::new(value.to_owned()))));
        self.items.sort_by_key(|(_, value)| std::cmp::Reverse(value.expose().len()));
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// `text` with every spelling of every secret replaced by its label.
    pub fn mask(&self, text: &str) -> String {
        self.mask_found(text).0
    }

    /// [`CallSecrets::mask`], and whether anything was replaced.
    pub fn mask_found(&self, text: &str) -> (String, bool) {
        let (out, found) = self.mask_bytes(text.as_bytes(), 0);
        (String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()), found)
    }

    /// `bytes` with every spelling of every secret at least `min` bytes long replaced by its
    /// label, and whether anything was replaced.
    pub fn mask_bytes(&self, bytes: &[u8], min: usize) -> (Vec<u8>, bool) {
        // Copied only when a secret is found: most answers hold none.
        let mut masked: Option<Vec<u8>> = None;
        for (label, value) in self.items.iter().filter(|(_, v)| v.expose().len() >= min) {
            let text = masked.as_deref().unwrap_or(bytes);
            if let Some(out) = spellings_replaced(text, value.expose(), label.as_bytes()) {
                masked = Some(out);
            }
        }
        match masked {
            Some(out) => (out, true),
            None => (bytes.to_vec(), false),
        }
    }

    /// Masks, in place, every string inside `value` that comes back from outside (keys
    /// included), and inside the base64 payloads of MCP content (`data`, `blob`) as decoded
    /// bytes; whether anything was masked. Secrets shorter than [`MIN_SEARCHED`] are not looked
    /// for.
    pub fn mask_json(&self, value: &mut Value) -> bool {
        use base64::Engine as _;
        use base64::engine::general_purpose::STANDARD;
        if self.is_empty() {
            return false;
        }
        let text = |s: &str| {
            let (out, found) = self.mask_bytes(s.as_bytes(), MIN_SEARCHED);
            found.then(|| String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
        };
        match value {
            Value::String(s) => match text(s) {
                Some(masked) => {
                    *s = masked;
                    true
                }
                None => false,
            },
            Value::Array(items) => items.iter_mut().fold(false, |any, v| self.mask_json(v) | any),
            Value::Object(map) => {
                let mut any = false;
                let renamed: Vec<(String, String)> =
                    map.keys().filter_map(|k| text(k).map(|masked| (k.clone(), masked))).collect();
                for (old, new) in renamed {
                    if let Some(v) = map.remove(&old) {
                        map.insert(new, v);
                        any = true;
                    }
                }
                for (key, v) in map.iter_mut() {
                    if let (true, Value::String(encoded)) = (key == "data" || key == "blob", &*v)
                        && let Ok(decoded) = STANDARD.decode(encoded.as_bytes())
                    {
                        let (masked, found) = self.mask_bytes(&decoded, MIN_SEARCHED);
                        if found {
                            *v = Value::String(STANDARD.encode(masked));
                            any = true;
                            continue;
                        }
                    }
                    any |= self.mask_json(v);
                }
                any
            }
            // A numeric secret (a PIN, an account number) sent back as a JSON number.
            Value::Number(n) => match text(&n.to_string()) {
                Some(masked) => {
                    *value = Value::String(masked);
                    true
                }
                None => false,
            },
            Value::Bool(_) | Value::Null => false,
        }
    }
}

/// The ways one character of a secret can be spelled in text: as itself, percent-encoded
/// (each UTF-8 byte, either case), `+` for a space (forms), or JSON-escaped (`\"`, `\\`, `\/`,
/// `\uXXXX`).
fn spelled_at(haystack: &[u8], at: usize, c: char) -> Vec<usize> {
    let rest = &haystack[at..];
    let mut ends = Vec::new();
    let mut utf8 = [0u8; 4];
    let literal = c.encode_utf8(&mut utf8).as_bytes();
    if rest.starts_with(literal) {
        ends.push(at + literal.len());
    }
    // Percent-encoded, byte by byte (any byte may also appear literally: mixed encoders).
    let mut i = 0;
    let mut ok = true;
    for &b in literal {
        match rest.get(i..i + 3) {
            Some([b'%', h, l]) if hex_value(*h).zip(hex_value(*l)).is_some_and(|(h, l)| h * 16 + l == b) => i += 3,
            _ if rest.get(i) == Some(&b) => i += 1,
            _ => {
                ok = false;
                break;
            }
        }
    }
    if ok && i != literal.len() {
        ends.push(at + i);
    }
    if c == ' ' && rest.first() == Some(&b'+') {
        ends.push(at + 1);
    }
    let json: Option<&[u8]> = match c {
        '"' => Some(b"\\\""),
        '\\' => Some(b"\\\\"),
        '/' => Some(b"\\/"),
        _ => None,
    };
    if let Some(escaped) = json.filter(|e| rest.starts_with(e)) {
        ends.push(at + escaped.len());
    }
    if let Some([b'\\', b'u', h @ ..]) = rest.get(..6)
        && let Ok(text) = std::str::from_utf8(h)
        && u32::from_str_radix(text, 16).ok().and_then(char::from_u32) == Some(c)
    {
        ends.push(at + 6);
    }
    ends
}

fn hex_value(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Where a spelling of `needle` that starts at `at` ends (the longest), if one does. The search
/// keeps the set of positions each prefix of `needle` can end at (a character has several
/// spellings, so prefixes branch: `\\` is one backslash or two), never the paths to them, and
/// spends one unit of `budget` per position it looks at: `None` in the outer `Option` when the
/// budget ran out.
fn spelling_at(haystack: &[u8], at: usize, needle: &[char], budget: &mut usize) -> Option<Option<usize>> {
    let mut frontier = vec![at];
    for &c in needle {
        let mut next = Vec::new();
        for &pos in &frontier {
            *budget = budget.checked_sub(1)?;
            next.extend(spelled_at(haystack, pos, c));
        }
        next.sort_unstable();
        next.dedup();
        if next.is_empty() {
            return Some(None);
        }
        frontier = next;
    }
    Some(frontier.last().copied())
}

/// How many positions [`spellings_replaced`] may look at per byte of its haystack: ordinary text
/// needs one or two; only input built to make spellings branch (runs of `\`, `%`) needs more.
const STEPS_PER_BYTE: usize = 64;

/// `haystack` with every spelling of `needle` replaced by `with`, or `None` (and nothing
/// copied) when there was none. Input built to make the search branch beyond `STEPS_PER_BYTE` is not searched further: it
/// is replaced whole by `with` (and counts as found), so a hostile echo costs linear time and
/// gets nothing through.
fn spellings_replaced(haystack: &[u8], needle: &str, with: &[u8]) -> Option<Vec<u8>> {
    let chars: Vec<char> = needle.chars().collect();
    let &first = chars.first()?;
    let mut utf8 = [0u8; 4];
    let lead = first.encode_utf8(&mut utf8).as_bytes()[0];
    // Most positions cannot start a spelling: they are skipped, a run at a time, without looking
    // further, and copied only once a spelling was found.
    let may_start = |b: u8| matches!(b, b'%' | b'+' | b'\\') || b == lead;
    let mut budget = haystack.len().saturating_mul(STEPS_PER_BYTE).saturating_add(4096);
    let mut out: Option<Vec<u8>> = None;
    // `haystack[copied..i]` is not yet in `out`.
    let (mut i, mut copied) = (0, 0);
    while let Some(skip) = haystack[i..].iter().position(|&b| may_start(b)) {
        i += skip;
        match spelling_at(haystack, i, &chars, &mut budget) {
            Some(Some(end)) => {
                let out = out.get_or_insert_with(|| Vec::with_capacity(haystack.len()));
                out.extend_from_slice(&haystack[copied..i]);
                out.extend_from_slice(with);
                (i, copied) = (end, end);
            }
            Some(None) => i += 1,
            None => return Some(with.to_vec()),
        }
    }
    let mut out = out?;
    out.extend_from_slice(&haystack[copied..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use postern_vault::CredentialKind;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the secret and the text around it are made of (characters that have several
        /// spellings included), a secret echoed as itself never survives masking.
        #[test]
        fn an_echoed_secret_never_survives_hostile_surroundings(
            secret in "[\\\\%+ \"/a-c5C]{4,24}",
            before in "[\\\\%+ \"/a-c5Cu0]{0,200}",
            after in "[\\\\%+ \"/a-c5Cu0]{0,200}",
        ) {
            let mut c = CallSecrets::default();
            c.add_vault_secret(&secret);
            let (out, found) = c.mask_found(&format!("{before}{secret}{after}"));
            prop_assert!(found);
            prop_assert!(!out.contains(&secret), "{:?}", out);
        }
    }

    fn credential(kind: &CredentialKind, secret: &str) -> CallSecrets {
        let mut secrets = CallSecrets::default();
        secrets.add_credential(kind, secret);
        secrets
    }

    #[test]
    fn every_spelling_of_a_credential_is_redacted() {
        let c = credential(&CredentialKind::Basic { username: "ops".into() }, "p@ss w/\"d");
        for echo in [
            "p@ss w/\"d",
            "p%40ss%20w%2F%22d",
            "p%40ss+w%2f%22d",
            "p@ss w\\/\\\"d",
            "p\\u0040ss w/\\\"d",
            "b3BzOnBAc3Mgdy8iZA",
            "Basic b3BzOnBAc3Mgdy8iZA==",
        ] {
            let (out, found) = c.mask_found(&format!("before {echo} after"));
            assert!(found, "{echo}");
            assert!(!out.contains("p@ss") && !out.contains("b3BzOnBAc3Mgdy8iZA"), "{echo}: {out}");
            assert!(out.starts_with("before <redacted>") && out.ends_with(" after"), "{echo}: {out}");
        }
        let (out, found) = c.mask_found("p@ss w/ nothing else");
        assert!(!found);
        assert_eq!(out, "p@ss w/ nothing else");
        assert!(!format!("{c:?}").contains("p@ss"));
    }

    /// A secret and an echo built so that spellings branch at every character (`\\` is one
    /// backslash, JSON-escaped, or two): the search stays linear, and the secret does not get
    /// through.
    #[test]
    fn an_echo_built_to_make_the_search_branch_costs_linear_work_and_leaks_nothing() {
        let secret = format!("{}Z", "\\".repeat(60));
        let mut c = CallSecrets::default();
        c.add_vault_secret(&secret);
        for echo in [
            format!("{}{secret}{}", "\\".repeat(100), "\\".repeat(100)),
            format!("{}x", "\\".repeat(50_000)),
            "%5C%5c\\\\".repeat(10_000),
        ] {
            let (out, _) = c.mask_found(&echo);
            assert!(!out.contains(&secret), "the secret got through");
            // The search that skips runs spends its budget as the one that looks everywhere.
            let expected = one_position_at_a_time(echo.as_bytes(), &secret, b"<x>");
            assert_eq!(replace_spellings(echo.as_bytes(), &secret, b"<x>"), expected);
        }
    }

    #[test]
    fn json_is_masked_in_strings_keys_and_base64_payloads() {
        use base64::Engine as _;
        let c = credential(&CredentialKind::Bearer, "tok-CANARY-1234");
        let blob = base64::engine::general_purpose::STANDARD.encode("binary tok-CANARY-1234 inside");
        let mut value = serde_json::json!({
            "content": [{ "type": "text", "text": "your token is tok-CANARY-1234" },
                        { "type": "image", "data": blob, "mimeType": "image/png" }],
            "tok-CANARY-1234": 1,
            "n": 5,
        });
        assert!(c.mask_json(&mut value));
        let text = value.to_string();
        assert!(!text.contains("tok-CANARY-1234"), "{text}");
        let data = value["content"][1]["data"].as_str().unwrap();
        let decoded = base64::engine::general_purpose::STANDARD.decode(data).unwrap();
        assert_eq!(decoded, b"binary <redacted> inside");
        assert!(!c.mask_json(&mut serde_json::json!({ "plain": "nothing here" })));
        let mut pin = CallSecrets::default();
        pin.add_vault_secret("804213");
        let mut value = serde_json::json!({ "pin": 804213, "other": 5 });
        assert!(pin.mask_json(&mut value));
        assert_eq!(value, serde_json::json!({ "pin": REDACTED, "other": 5 }));
    }

    #[test]
    fn short_values_are_not_searched_for_in_what_comes_back() {
        let c = credential(&CredentialKind::Bearer, "ab");
        let mut value = serde_json::json!("a cab ride");
        assert!(!c.mask_json(&mut value), "two characters cannot be told apart from text");
    }

    /// One spelling of `secret`: each character as itself, percent-encoded (either case) or
    /// JSON-escaped, as `choices` says.
    fn spell(secret: &str, choices: &[u8]) -> String {
        secret
            .chars()
            .zip(choices.iter().cycle())
            .map(|(c, choice)| match choice % 4 {
                0 => c.to_string(),
                1 => c.to_string().bytes().map(|b| format!("%{b:02X}")).collect(),
                2 => c.to_string().bytes().map(|b| format!("%{b:02x}")).collect(),
                _ => match c {
                    '"' | '\\' | '/' => format!("\\{c}"),
                    c if (c as u32) < 0x10000 => format!("\\u{:04x}", c as u32),
                    c => c.to_string(),
                },
            })
            .collect()
    }

    /// [`spellings_replaced`] in the shape the oracle answers in: the text, and whether anything
    /// was replaced.
    fn replace_spellings(haystack: &[u8], needle: &str, with: &[u8]) -> (Vec<u8>, bool) {
        spellings_replaced(haystack, needle, with).map_or_else(|| (haystack.to_vec(), false), |out| (out, true))
    }

    /// The search one position at a time, as it was written first: what the search that skips
    /// runs of positions must answer, byte for byte.
    fn one_position_at_a_time(haystack: &[u8], needle: &str, with: &[u8]) -> (Vec<u8>, bool) {
        let chars: Vec<char> = needle.chars().collect();
        let Some(&first) = chars.first() else { return (haystack.to_vec(), false) };
        let lead = first.to_string().as_bytes()[0];
        let mut budget = haystack.len().saturating_mul(STEPS_PER_BYTE).saturating_add(4096);
        let (mut out, mut i, mut found) = (Vec::new(), 0, false);
        while i < haystack.len() {
            if !matches!(haystack[i], b'%' | b'+' | b'\\') && haystack[i] != lead {
                out.push(haystack[i]);
                i += 1;
                continue;
            }
            match spelling_at(haystack, i, &chars, &mut budget) {
                Some(Some(end)) => {
                    out.extend_from_slice(with);
                    (i, found) = (end, true);
                }
                Some(None) => {
                    out.push(haystack[i]);
                    i += 1;
                }
                None => return (with.to_vec(), true),
            }
        }
        (out, found)
    }

    proptest! {
        /// Hostile text around (and inside) spellings of a secret, branching runs included: the
        /// search that skips runs and copies only once it found something answers as the one
        /// that looks at every position, and finds nothing in text with no spelling.
        #[test]
        fn skipping_runs_finds_what_looking_everywhere_finds(
            secret in "[\\\\%+ \"/a-c5Cu]{1,12}",
            choices in proptest::collection::vec(any::<u8>(), 1..16),
            parts in proptest::collection::vec("[\\\\%+ \"/a-c5Cu0-9]{0,40}", 0..6),
        ) {
            let spelled = spell(&secret, &choices);
            let haystack = parts.join(&spelled);
            let expected = one_position_at_a_time(haystack.as_bytes(), &secret, b"<x>");
            prop_assert_eq!(&replace_spellings(haystack.as_bytes(), &secret, b"<x>"), &expected);
            prop_assert_eq!(spellings_replaced(haystack.as_bytes(), &secret, b"<x>").is_some(), expected.1);
        }

        /// The same on any bytes (a decoded `data` payload need not be text) and secrets that
        /// start with a character of several UTF-8 bytes.
        #[test]
        fn skipping_runs_agrees_on_any_bytes(
            secret in "[\\\\%+ a-cé€😀]{1,8}",
            choices in proptest::collection::vec(any::<u8>(), 1..16),
            parts in proptest::collection::vec(
                proptest::collection::vec(
                    prop_oneof![any::<u8>(), Just(b'%'), Just(b'\\'), Just(b'+'), Just(0xC3), Just(0xE2)],
                    0..40,
                ),
                0..6,
            ),
        ) {
            let spelled = spell(&secret, &choices).into_bytes();
            let haystack = parts.join(&spelled[..]);
            let expected = one_position_at_a_time(&haystack, &secret, b"<x>");
            prop_assert_eq!(&replace_spellings(&haystack, &secret, b"<x>"), &expected);
        }

        /// Several secrets, one inside another and a label that spells a later one: each is
        /// looked for in the text the ones before it masked, as one search after another.
        #[test]
        fn every_secret_is_looked_for_in_what_the_ones_before_left(
            secrets in proptest::collection::vec("[\\\\%+ a-c5]{1,10}", 1..4),
            text in "[\\\\%+ a-c5<>x]{0,120}",
        ) {
            let mut c = CallSecrets::default();
            for (n, secret) in secrets.iter().enumerate() {
                c.push(&format!("<{}{n}>", secrets[(n + 1) % secrets.len()]), secret);
            }
            let joined = format!("{text}{}", secrets.join(&text));
            let mut expected = (joined.clone().into_bytes(), false);
            for (label, value) in &c.items {
                let (out, found) = one_position_at_a_time(&expected.0, value.expose(), label.as_bytes());
                if found {
                    expected = (out, true);
                }
            }
            prop_assert_eq!(c.mask_bytes(joined.as_bytes(), 0), expected);
        }

        /// Whatever the secret and however a hostile target spells it back, the result keeps no
        /// spelling of it.
        #[test]
        fn a_secret_spelled_any_way_is_redacted(
            secret in "#[ -~]{5,40}",
            choices in proptest::collection::vec(any::<u8>(), 1..64),
            before in "[a-z ]{0,20}",
            after in "[a-z ]{0,20}",
        ) {
            let c = credential(&CredentialKind::Bearer, &secret);
            let spelled = spell(&secret, &choices);
            let (out, found) = c.mask_found(&format!("{before}{spelled}{after}"));
            prop_assert!(found);
            prop_assert!(!out.contains(&secret), "{out}");
            prop_assert!(!out.contains(&spelled), "{out}");
        }
    }
}
