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

/// The secret values one call carries, each with the label it is shown under.
#[derive(Default)]
pub struct CallSecrets {
    /// Label (`name:digest`), and the value; longest value first.
    items: Vec<(String, Sensitive<String>)>,
}

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
        self.items.push((label.clone(), Sensitive::new(text.to_owned())));
        // As `sh` sees it inside single quotes (an SSH command quotes every argument).
        if text.contains('\'') {
            self.items.push((label, Sensitive::new(text.replace('\'', r"'\''"))));
        }
        self.items.sort_by_key(|(_, value)| std::cmp::Reverse(value.expose().len()));
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// `text` with every spelling of every secret replaced by its label.
    pub fn mask(&self, text: &str) -> String {
        let mut out = text.as_bytes().to_vec();
        for (label, value) in &self.items {
            let (masked, found) = replace_spellings(&out, value.expose(), label.as_bytes());
            if found {
                out = masked;
            }
        }
        String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
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

/// Where a spelling of `needle` that starts at `at` ends (the longest), if one does.
fn spelling_at(haystack: &[u8], at: usize, needle: &[char]) -> Option<usize> {
    // Depth-first over the spellings of each character; an explicit stack, as secrets are long.
    let mut stack = vec![(0usize, at)];
    let mut best = None;
    while let Some((i, pos)) = stack.pop() {
        if i == needle.len() {
            best = best.max(Some(pos));
            continue;
        }
        for end in spelled_at(haystack, pos, needle[i]) {
            stack.push((i + 1, end));
        }
    }
    best
}

/// `haystack` with every spelling of `needle` replaced by `with`, and whether there was one.
pub fn replace_spellings(haystack: &[u8], needle: &str, with: &[u8]) -> (Vec<u8>, bool) {
    let chars: Vec<char> = needle.chars().collect();
    let mut out = Vec::with_capacity(haystack.len());
    let (mut i, mut found) = (0, false);
    let Some(&first) = chars.first() else { return (haystack.to_vec(), false) };
    let mut utf8 = [0u8; 4];
    let lead = first.encode_utf8(&mut utf8).as_bytes()[0];
    while i < haystack.len() {
        // Most positions cannot start a spelling: skip them without looking further.
        if !matches!(haystack[i], b'%' | b'+' | b'\\') && haystack[i] != lead {
            out.push(haystack[i]);
            i += 1;
            continue;
        }
        match spelling_at(haystack, i, &chars) {
            Some(end) => {
                out.extend_from_slice(with);
                i = end;
                found = true;
            }
            _ => {
                out.push(haystack[i]);
                i += 1;
            }
        }
    }
    (out, found)
}
