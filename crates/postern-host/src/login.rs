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

/// A value for a desktop entry's `Exec` key: quoted when it needs to be, with the characters the
/// Desktop Entry Specification reserves inside quotes escaped.
fn exec_arg(arg: &str) -> String {
    let plain = !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-+=:,@".contains(&b));
    if plain {
        return arg.to_owned();
    }
    let mut quoted = String::from("\"");
    for c in arg.chars() {
        if matches!(c, '"' | '`' | '$' | '\\') {
            quoted.push('\\');
        }
        if c == '%' {
            quoted.push('%');
        }
        quoted.push(c);
    }
    quoted.push('"');
    quoted
}

/// The XDG autostart entry that starts the desktop app `app` at login.
pub fn autostart_entry(app: &Path) -> String {
    format!(
        "[Desktop Entry]\n\
         Type=Application\n\
         Name=Postern\n\
         Comment=Credential vault and MCP gateway for AI agents\n\
         Exec={}\n\
         Icon=postern-app\n\
         Terminal=false\n\
         X-GNOME-Autostart-enabled=true\n",
        exec_arg(&app.to_string_lossy())
    )
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
            std::fs::write(&path, autostart_entry(app))?;
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
pub fn service_unit(postern: &Path, data_dir: &Path) -> String {
    let quote = |p: &Path| {
        let s = p.to_string_lossy();
        if s.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-+=:,@".contains(&b)) {
            s.into_owned()
        } else {
            format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"").replace('%', "%%"))
        }
    };
    format!(
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
        quote(postern),
        quote(data_dir)
    )
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
        let unit = service_unit(Path::new("/usr/bin/postern"), Path::new("/home/u/.local/share/postern"));
        assert_eq!(
            unit,
            "[Unit]\nDescription=Postern gateway (credential vault and MCP gateway for AI agents)\n\
             After=dbus.socket\n\n[Service]\nType=simple\n\
             ExecStart=/usr/bin/postern --data-dir /home/u/.local/share/postern serve\nRestart=on-failure\n\
             RestartSec=5\nKillSignal=SIGTERM\nTimeoutStopSec=45\n\n[Install]\nWantedBy=default.target\n"
        );
        let spaced = service_unit(Path::new("/opt/my apps/postern"), Path::new("/data/100%"));
        assert!(spaced.contains("ExecStart=\"/opt/my apps/postern\" --data-dir \"/data/100%%\" serve\n"), "{spaced}");
    }

    proptest! {
        /// Whatever path the app lives at (spaces, quotes, `$`, `%`, newlines refused by the
        /// filesystem aside), the entry stays one `Exec` line a launcher splits back into it.
        #[test]
        fn a_hostile_path_stays_one_exec_argument(path in "/[a-zA-Z0-9 \"'$`%\\\\._-]{1,40}") {
            let entry = autostart_entry(Path::new(&path));
            let exec = entry.lines().find(|l| l.starts_with("Exec=")).unwrap_or_default();
            prop_assert_eq!(entry.lines().filter(|l| l.starts_with("Exec=")).count(), 1);
            prop_assert_eq!(unquote(&exec["Exec=".len()..]), path);
        }
    }

    /// How a launcher reads one quoted `Exec` argument back (the Desktop Entry Specification's
    /// rules: `%%` is `%`, a backslash escapes the next character inside quotes).
    fn unquote(arg: &str) -> String {
        let unpercent = |s: &str| s.replace("%%", "%");
        let Some(inner) = arg.strip_prefix('"').and_then(|a| a.strip_suffix('"')) else { return unpercent(arg) };
        let mut out = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            out.push(if c == '\\' { chars.next().unwrap_or('\\') } else { c });
        }
        unpercent(&out)
    }
}
