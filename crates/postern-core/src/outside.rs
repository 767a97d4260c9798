//! Text that came from outside Postern — an agent's arguments and client name, a target's or an
//! upstream server's answer, a config file in a cloned repository — on its way to a terminal or a
//! reviewer. [`Outside`] is the one type such text is printed through: its `Display` writes
//! control characters (C0, DEL, C1: escape sequences, carriage returns, backspaces) and invisible
//! formatting characters (bidi overrides and isolates, zero-width characters, line and paragraph
//! separators, the BOM) as visible escapes, so outside text can never move the cursor, rewrite a
//! line that is already on screen, or reorder what a person reads.

use std::fmt;

/// Outside text, shown safely. [`Outside::line`] keeps it on one line (a newline is written
/// `\n`); [`Outside::block`] keeps its newlines and tabs (a response body, command output).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outside<'a> {
    text: &'a str,
    keep_lines: bool,
}

impl<'a> Outside<'a> {
    /// A name, an id, a command, an argument: one line, every control character escaped.
    pub fn line(text: &'a str) -> Outside<'a> {
        Outside { text, keep_lines: false }
    }

    /// Multi-line text (a body, an output): newlines and tabs kept, every other control
    /// character escaped.
    pub fn block(text: &'a str) -> Outside<'a> {
        Outside { text, keep_lines: true }
    }
}

impl fmt::Display for Outside<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut start = 0;
        for (i, c) in self.text.char_indices() {
            let escape = match c {
                '\n' | '\t' if self.keep_lines => None,
                '\n' => Some("\\n".to_owned()),
                '\r' => Some("\\r".to_owned()),
                '\t' => Some("\\t".to_owned()),
                c if needs_escape(c) => Some(format!("\\u{{{:x}}}", c as u32)),
                _ => None,
            };
            if let Some(escape) = escape {
                f.write_str(&self.text[start..i])?;
                f.write_str(&escape)?;
                start = i + c.len_utf8();
            }
        }
        f.write_str(&self.text[start..])
    }
}

/// Characters a terminal acts on, or that change how the text around them reads, instead of
/// showing themselves: controls (C0, DEL, C1), bidi controls (embeddings, overrides, isolates,
/// marks), zero-width and invisible formatting characters, the line and paragraph separators,
/// interlinear annotation characters and the BOM.
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00ad}'
                | '\u{061c}'
                | '\u{115f}'
                | '\u{1160}'
                | '\u{17b4}'
                | '\u{17b5}'
                | '\u{180b}'..='\u{180f}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{3164}'
                | '\u{fe00}'..='\u{fe0f}'
                | '\u{feff}'
                | '\u{ffa0}'
                | '\u{fff9}'..='\u{fffb}'
                | '\u{e0000}'..='\u{e007f}'
        )
}

/// Serialized JSON (from `serde_json`) made safe for a terminal: `serde_json` escapes C0 controls
/// inside strings but writes DEL, C1 controls and bidi or invisible characters as they are. These
/// can only occur inside JSON strings, where `\uXXXX` means the same character, so the document
/// parses to the same value.
pub fn json_for_terminal(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if needs_escape(c) && !matches!(c, '\n' | '\t' | '\r' | ' ') {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether `text` can go to a terminal as it is: no character [`needs_escape`] but newline and
/// tab. What the tests check every command's output against.
pub fn terminal_safe(text: &str) -> bool {
    text.chars().all(|c| matches!(c, '\n' | '\t') || !needs_escape(c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn escapes_what_a_terminal_would_act_on() {
        let hostile = "ok\x1b[2J\rfake\u{202e}txt\u{200b}\x07\u{9b}31m\u{7f}";
        let shown = Outside::line(hostile).to_string();
        assert_eq!(shown, "ok\\u{1b}[2J\\rfake\\u{202e}txt\\u{200b}\\u{7}\\u{9b}31m\\u{7f}");
        assert!(terminal_safe(&shown));
        assert_eq!(Outside::line("two\nlines").to_string(), "two\\nlines");
        assert_eq!(Outside::block("two\nlines\tand\x1b[0m").to_string(), "two\nlines\tand\\u{1b}[0m");
        assert_eq!(Outside::line("plain — ünïcode 名前").to_string(), "plain — ünïcode 名前");
    }

    #[test]
    fn json_for_a_terminal_parses_to_the_same_value() {
        let value = serde_json::json!({ "name": "a\u{1b}[2J\u{9b}b\u{202e}c\u{e0001}", "n": 1 });
        let text = serde_json::to_string_pretty(&value).unwrap();
        let safe = json_for_terminal(&text);
        assert!(terminal_safe(&safe), "{safe}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&safe).unwrap(), value);
    }

    proptest! {
        /// Whatever the text, what is shown holds no character a terminal acts on, and plain
        /// text is shown as it is.
        #[test]
        fn shown_text_is_always_terminal_safe(text in any::<String>(), plain in "[a-zA-Z0-9 ._/:-]{0,40}") {
            prop_assert!(terminal_safe(&Outside::line(&text).to_string()));
            let block = Outside::block(&text).to_string();
            prop_assert!(terminal_safe(&block));
            prop_assert!(!Outside::line(&text).to_string().contains('\n'));
            prop_assert_eq!(Outside::line(&plain).to_string(), plain.clone());
            let value = serde_json::json!({ "t": text });
            let safe = json_for_terminal(&serde_json::to_string(&value).unwrap());
            prop_assert!(terminal_safe(&safe));
            prop_assert_eq!(serde_json::from_str::<serde_json::Value>(&safe).unwrap(), value);
        }
    }
}
