//! Starting Postern when the user logs in, opt-in: the desktop app as an XDG autostart entry
//! (`~/.config/autostart/postern.desktop`, so its dialogs can ask a reviewer), or `postern
//! serve` as a systemd user unit (headless, no approver). Only the files are written here; the
//! CLI and the app decide when.

use std::path::{Path, PathBuf};

/// The autostart entry's file name in `$XDG_CONFIG_HOME/autostart/`.
pub const AUTOSTART_FILE: &str = "postern.desktop";
/// The systemd user unit's file name in `$XDG_CONFIG_HOME/systemd/user/`.
pub const UNIT_FILE: &str = "postern.service";

/// `$XDG_CONFIG_HOME`, else `~/.config`.
pub fn config_home() -> Option<PathBuf> {
    match std::env::var_os("XDG_CONFIG_HOME") {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| PathBuf::from(h).join(".config")),
    }
}

/// A path as one argument of a generated `Exec=` / `ExecStart=` line, or why it cannot be one: a
/// line break or another control character would start a new key of the file (`ExecStartPre=…`),
/// and a path that is not UTF-8 would be written as another path.
fn line_safe(path: &Path) -> std::io::Result<&str> {
    let refused =
        |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{}: {why}", path.display()));
    let text = path.to_str().ok_or_else(|| refused("not UTF-8, so it cannot be written into a launcher file"))?;
    if text.chars().any(char::is_control) {
        return Err(refused("holds a control character (a line break would start a new key of the file)"));
    }
    Ok(text)
}

/// How a launcher file reads one quoted argument: the characters escaped with a backslash inside
/// double quotes, and those written twice (`%%`, systemd's `$$`).
struct Dialect {
    backslashed: &'static [char],
    doubled: &'static [char],
}

/// The Desktop Entry Specification's `Exec` quoting.
const DESKTOP_ENTRY: Dialect = Dialect { backslashed: &['"', '`', '$', '\\'], doubled: &['%'] };
/// systemd's `ExecStart` quoting (`$` would expand a variable, `%` a specifier).
const SYSTEMD: Dialect = Dialect { backslashed: &['"', '\\'], doubled: &['%', '$'] };

/// `arg` as one argument of `dialect`: as it is when it is plain, else quoted and escaped.
fn quote(arg: &str, dialect: &Dialect) -> String {
    if !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-+=:,@".contains(&b)) {
        return arg.to_owned();
    }
    let mut quoted = String::from("\"");
    for c in arg.chars() {
        if dialect.backslashed.contains(&c) {
            quoted.push('\\');
        }
        if dialect.doubled.contains(&c) {
            quoted.push(c);
        }
        quoted.push(c);
    }
    quoted.push('"');
    quoted
}

/// The XDG autostart entry that starts the desktop app `app` at login.
pub fn autostart_entry(app: &Path) -> std::io::Result<String> {
    Ok(format!(
        "[Desktop Entry]\n\
         Type=Application\n\
         Name=Postern\n\
         Comment=Credential vault and MCP gateway for AI agents\n\
         Exec={}\n\
         Icon=postern-app\n\
         Terminal=false\n\
         X-GNOME-Autostart-enabled=true\n",
        quote(line_safe(app)?, &DESKTOP_ENTRY)
    ))
}

/// Whether the app starts at login (its autostart entry exists).
pub fn autostart_enabled(config_home: &Path) -> bool {
    config_home.join("autostart").join(AUTOSTART_FILE).exists()
}

/// Writes (`Some(app)`) or removes (`None`) the autostart entry; returns its path.
pub fn set_autostart(config_home: &Path, app: Option<&Path>) -> std::io::Result<PathBuf> {
    let path = config_home.join("autostart").join(AUTOSTART_FILE);
    match app {
        Some(app) => {
            std::fs::create_dir_all(path.parent().unwrap_or(config_home))?;
            let entry = autostart_entry(app)?;
            std::fs::write(&path, entry)?;
        }
        None => match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        },
    }
    Ok(path)
}

/// The systemd user unit that runs `postern serve` (the binary `postern`) on `data_dir`: started
/// with the user's session, restarted if it fails, stopped with SIGTERM (the gateway drains).
pub fn service_unit(postern: &Path, data_dir: &Path) -> std::io::Result<String> {
    Ok(format!(
        "[Unit]\n\
         Description=Postern gateway (credential vault and MCP gateway for AI agents)\n\
         After=dbus.socket\n\
         \n\
         [Service]\n\
         Type=simple\n\
         ExecStart={} --data-dir {} serve\n\
         Restart=on-failure\n\
         RestartSec=5\n\
         KillSignal=SIGTERM\n\
         TimeoutStopSec=45\n\
         \n\
         [Install]\n\
         WantedBy=default.target\n",
        quote(line_safe(postern)?, &SYSTEMD),
        quote(line_safe(data_dir)?, &SYSTEMD)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_autostart_entry_is_written_and_removed() {
        let home = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        assert!(!autostart_enabled(home.path()));
        let path =
            set_autostart(home.path(), Some(Path::new("/opt/Postern/postern-app"))).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(path, home.path().join("autostart/postern.desktop"));
        assert!(autostart_enabled(home.path()));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(text.starts_with("[Desktop Entry]\nType=Application\n"), "{text}");
        assert!(text.contains("\nExec=/opt/Postern/postern-app\n"), "{text}");
        set_autostart(home.path(), None).unwrap_or_else(|e| panic!("{e}"));
        assert!(!autostart_enabled(home.path()));
        set_autostart(home.path(), None).unwrap_or_else(|e| panic!("removing twice is fine: {e}"));
    }

    #[test]
    fn the_unit_runs_serve_on_the_data_directory_and_drains_on_stop() {
        let unit = service_unit(Path::new("/usr/bin/postern"), Path::new("/home/u/.local/share/postern"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            unit,
            "[Unit]\nDescription=Postern gateway (credential vault and MCP gateway for AI agents)\n\
             After=dbus.socket\n\n[Service]\nType=simple\n\
             ExecStart=/usr/bin/postern --data-dir /home/u/.local/share/postern serve\nRestart=on-failure\n\
             RestartSec=5\nKillSignal=SIGTERM\nTimeoutStopSec=45\n\n[Install]\nWantedBy=default.target\n"
        );
        let spaced = service_unit(Path::new("/opt/my apps/postern"), Path::new("/data/100%/$HOME"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            spaced.contains("ExecStart=\"/opt/my apps/postern\" --data-dir \"/data/100%%/$$HOME\" serve\n"),
            "{spaced}"
        );
    }

    /// A line break in a path would start a new key of the file (`ExecStartPre=` runs a command,
    /// a second `Exec=` replaces the app): such a path is refused, never written.
    #[test]
    fn a_path_that_would_add_a_line_is_refused() {
        let evil = Path::new("/tmp/x\nExecStartPre=/bin/sh -c evil");
        assert_eq!(
            service_unit(Path::new("/usr/bin/postern"), evil).map_err(|e| e.kind()),
            Err(std::io::ErrorKind::InvalidInput)
        );
        assert!(autostart_entry(Path::new("/opt/app\nExec=/bin/evil")).is_err());
        assert!(autostart_entry(Path::new("/opt/app\u{1b}[2J")).is_err());
        let home = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        assert!(set_autostart(home.path(), Some(Path::new("/a\nb"))).is_err());
        assert!(!autostart_enabled(home.path()), "nothing is written for a refused path");
    }

    proptest! {
        /// Whatever the app's path holds — spaces, quotes, `$(…)`, backticks, `%`, backslashes,
        /// escape sequences, line breaks — the entry either refuses it (control characters) or
        /// keeps it one `Exec` argument that a launcher reads back as exactly that path.
        #[test]
        fn a_hostile_path_stays_one_exec_argument(path in "/[a-zA-Z0-9 \"'$`%\\\\()._\n\t\x1b-]{1,40}") {
            match autostart_entry(Path::new(&path)) {
                Err(_) => prop_assert!(path.chars().any(char::is_control)),
                Ok(entry) => {
                    prop_assert_eq!(entry.lines().filter(|l| l.starts_with("Exec=")).count(), 1);
                    prop_assert_eq!(entry.lines().count(), 8);
                    let exec = entry.lines().find(|l| l.starts_with("Exec=")).unwrap_or_default();
                    prop_assert_eq!(unquote(&exec["Exec=".len()..], &DESKTOP_READER), Some(path));
                }
            }
        }

        /// The same for the unit's `ExecStart` (where `$` would expand a variable and `%` a
        /// specifier): one line, and the data directory read back exactly.
        #[test]
        fn a_hostile_data_directory_stays_one_execstart_argument(dir in "/[a-zA-Z0-9 \"'$`%\\\\()._\n\t\x1b-]{1,40}") {
            match service_unit(Path::new("/usr/bin/postern"), Path::new(&dir)) {
                Err(_) => prop_assert!(dir.chars().any(char::is_control)),
                Ok(unit) => {
                    prop_assert_eq!(unit.lines().filter(|l| l.starts_with("Exec")).count(), 1);
                    let line = unit.lines().find(|l| l.starts_with("ExecStart=")).unwrap_or_default();
                    let arg = line.trim_start_matches("ExecStart=/usr/bin/postern --data-dir ").trim_end_matches(" serve");
                    prop_assert_eq!(unquote(arg, &SYSTEMD_READER), Some(dir));
                }
            }
        }
    }

    /// The readers, written out here rather than taken from the writers' constants, so a writer
    /// that forgets a character is caught: the specification's characters that expand when single.
    const DESKTOP_READER: Dialect = Dialect { backslashed: &[], doubled: &['%'] };
    const SYSTEMD_READER: Dialect = Dialect { backslashed: &[], doubled: &['%', '$'] };

    /// How a launcher reads one argument back: inside double quotes a backslash escapes the next
    /// character, and a doubled special character (`%%`, systemd's `$$`) is one. A lone one would
    /// be expanded (a field code, a specifier, a variable): `None`, never the path.
    fn unquote(arg: &str, dialect: &Dialect) -> Option<String> {
        let inner = arg.strip_prefix('"').and_then(|a| a.strip_suffix('"'));
        let mut out = String::new();
        let mut chars = inner.unwrap_or(arg).chars().peekable();
        while let Some(c) = chars.next() {
            if inner.is_some() && c == '\\' {
                out.push(chars.next()?);
            } else if dialect.doubled.contains(&c) {
                (chars.next() == Some(c)).then_some(())?;
                out.push(c);
            } else {
                out.push(c);
            }
        }
        Some(out)
    }
}
