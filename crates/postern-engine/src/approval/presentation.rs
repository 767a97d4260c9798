//! How a question looks to a reviewer, laid out once for every approver: the rows, the
//! timeline, the choices with their keys, what an agent controls made visible (control and
//! invisible characters escaped), bodies previewed with secrets masked and never cut silently.

use super::*;

/// What a reviewer is shown for one question, laid out once for every approver (the terminal
/// prints it, the desktop dialog renders it): the same rows, the same timeline, the same choices
/// with the same keys.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Presentation {
    pub title: String,
    pub intro: Option<String>,
    /// Label and value, in order.
    pub rows: Vec<(String, String)>,
    pub timeline: Vec<TimelineStep>,
    pub choices: Vec<PresentedChoice>,
    /// Everything the rows cut short (the whole body), for a reviewer who asks to see it.
    pub details: Option<String>,
}

impl Presentation {
    /// Every piece of text made safe to show: agent-controlled values may carry escape sequences,
    /// carriage returns, bidi overrides or long blank runs meant to rewrite what the reviewer sees.
    pub(super) fn visible(mut self) -> Presentation {
        self.intro = self.intro.as_deref().map(visible);
        for (_, value) in &mut self.rows {
            *value = visible(value);
        }
        for step in &mut self.timeline {
            step.event = visible(&step.event);
            step.summary = visible(&step.summary);
        }
        self.details = self.details.as_deref().map(visible);
        self
    }
}

/// `text` as a reviewer may safely see it: [`postern_core::Outside::line`] (control and
/// invisible formatting characters written as escapes, newlines included), and runs of 8 or
/// more spaces counted (a long blank run could push the rest of a line out of sight).
pub fn visible(text: &str) -> String {
    let escaped = postern_core::Outside::line(text).to_string();
    let mut out = String::with_capacity(escaped.len());
    let mut spaces = 0;
    let blanks = |out: &mut String, n: usize| {
        if n >= 8 {
            out.push_str(&format!("␠×{n}"));
        } else {
            out.extend(std::iter::repeat_n(' ', n));
        }
    };
    for c in escaped.chars() {
        if c == ' ' {
            spaces += 1;
            continue;
        }
        blanks(&mut out, std::mem::take(&mut spaces));
        out.push(c);
    }
    blanks(&mut out, spaces);
    out
}

/// One answer a reviewer can give, with its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PresentedChoice {
    pub key: char,
    pub label: String,
    /// "Dispatch anew" needs a typed reason.
    pub needs_reason: bool,
    /// A permanent answer ("always allow this agent"): never given by one key; the approver
    /// asks again, deliberately.
    pub needs_confirmation: bool,
}

pub(super) fn choice(key: char, label: &str) -> PresentedChoice {
    PresentedChoice { key, label: label.to_owned(), needs_reason: false, needs_confirmation: false }
}

/// The choice a typed line makes: only a line holding exactly one of `keys` (either case,
/// surrounding blanks ignored) answers; anything else — several lines read at once, a word that
/// starts with a key, a key among other characters — answers nothing.
pub fn pick<'k>(line: &str, keys: &'k [(char, &'k str)]) -> Option<(char, &'k str)> {
    let answer = line.trim().to_ascii_lowercase();
    let mut chars = answer.chars();
    let (first, rest) = (chars.next()?, chars.next());
    if rest.is_some() {
        return None;
    }
    keys.iter().find(|(k, _)| *k == first).map(|(k, label)| (*k, *label))
}

/// A time in ms since the epoch as RFC 3339 (UTC, milliseconds).
pub fn when(ms: i64) -> String {
    let at = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

/// Most bytes of a body a reviewer can expand to.
pub const BODY_FULL_BYTES: usize = 256 * 1024;

/// A request body for a reviewer (secrets masked, binary bodies described rather than shown):
/// whole if it fits in `limit` bytes, else its head and tail with the size of what is not shown
/// (a preview is never cut silently); and then the whole text for a reviewer who expands it.
pub fn body_preview(
    body: &[u8],
    secrets: &crate::catalog::redaction::CallSecrets,
    limit: usize,
) -> (String, Option<String>) {
    let text = match std::str::from_utf8(body) {
        Ok(text) => text,
        Err(_) => return (format!("({} bytes of binary data)", body.len()), None),
    };
    let text = secrets.mask(text);
    if text.len() <= limit {
        return (text, None);
    }
    let floor = |mut i: usize| {
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let head = floor(limit * 2 / 3);
    let tail = floor(text.len() - limit / 3);
    let preview = format!(
        "{} … [{} of {} bytes not shown: expand to see them] … {}",
        &text[..head],
        tail - head,
        text.len(),
        &text[tail..]
    );
    let full = if text.len() > BODY_FULL_BYTES {
        let cut = floor(BODY_FULL_BYTES);
        format!("{} … [the last {} of {} bytes are not shown]", &text[..cut], text.len() - cut, text.len())
    } else {
        text
    };
    (preview, Some(full))
}
