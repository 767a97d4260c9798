//! Human-readable rendering shared by the commands: times, tables, short ids.

use comfy_table::{Table, presets};
use std::time::{Duration, UNIX_EPOCH};

/// RFC 3339 UTC with milliseconds, e.g. `2025-11-29T19:36:40.000Z`.
pub fn time(ms: i64) -> String {
    match u64::try_from(ms) {
        Ok(ms) => humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string(),
        Err(_) => format!("{ms}ms"),
    }
}

pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    t.set_header(header.to_vec());
    t
}

/// A JSON value on one line, shortened for a table cell.
pub fn brief(value: &serde_json::Value, max: usize) -> String {
    let text = match value {
        serde_json::Value::Object(m) if m.is_empty() => String::new(),
        other => other.to_string(),
    };
    if text.chars().count() <= max {
        text
    } else {
        let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}
