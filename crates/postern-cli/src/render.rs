//! Human-readable rendering shared by the commands: times, tables, short ids — and the rule that
//! what came from outside (an agent, a target, an upstream server, a config file) reaches the
//! terminal only through [`postern_core::Outside`]: every table cell and every JSON document is
//! escaped here, by construction; single lines use `Outside::line` where they are written.

use comfy_table::presets;
use postern_core::Outside;
use std::time::{Duration, UNIX_EPOCH};

/// RFC 3339 UTC with milliseconds, e.g. `2025-11-29T19:36:40.000Z`.
pub fn time(ms: i64) -> String {
    match u64::try_from(ms) {
        Ok(ms) => humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string(),
        Err(_) => format!("{ms}ms"),
    }
}

/// A table whose every cell is shown through [`Outside::line`]: a value cannot add a line,
/// move the cursor or reorder the text around it.
pub struct Table(comfy_table::Table);

impl Table {
    pub fn add_row<S: AsRef<str>>(&mut self, cells: Vec<S>) -> &mut Self {
        self.0.add_row(cells.iter().map(|c| Outside::line(c.as_ref()).to_string()).collect::<Vec<_>>());
        self
    }

    pub fn trim_fmt(&self) -> String {
        self.0.trim_fmt()
    }
}

pub fn table(header: &[&str]) -> Table {
    let mut t = comfy_table::Table::new();
    t.load_style(presets::NOTHING);
    t.set_header(header.to_vec());
    Table(t)
}

/// A JSON document for the terminal (`--json` outputs): pretty, with every character a terminal
/// would act on escaped (`serde_json` leaves DEL, C1 and bidi controls as they are).
pub fn json(value: &impl serde::Serialize) -> Result<String, serde_json::Error> {
    Ok(postern_core::outside::json_for_terminal(&serde_json::to_string_pretty(value)?))
}

/// Prints [`json`] on stdout.
pub fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", json(value)?);
    Ok(())
}

/// A JSON value on one line, shortened for a table cell, safe for a terminal.
pub fn brief(value: &serde_json::Value, max: usize) -> String {
    let text = match value {
        serde_json::Value::Object(m) if m.is_empty() => String::new(),
        other => postern_core::outside::json_for_terminal(&other.to_string()),
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
