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

/// A duration for people: `42s`, `5m 3s`, `2h 10m`, `3d 4h`.
pub fn duration_secs(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

#[cfg(test)]
mod duration_tests {
    #[test]
    fn durations_read_at_a_glance() {
        let cases = [(0, "0s"), (42, "42s"), (303, "5m 3s"), (7_800, "2h 10m"), (273_600, "3d 4h")];
        for (secs, shown) in cases {
            assert_eq!(super::duration_secs(secs), shown);
        }
    }
}
