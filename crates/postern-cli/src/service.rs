//! `postern service install|uninstall`: `postern serve` as a systemd user unit, started with the
//! user's session. Headless: no approver, so a call that needs a reviewer is denied — the desktop
//! app's "start at login" is the way to keep approvals.

use crate::Failure;
use anyhow::{Context, anyhow};
use postern_host::login;
use std::{path::Path, process::Command, process::ExitCode};

fn unit_path() -> Result<std::path::PathBuf, Failure> {
    let home = login::config_home().ok_or_else(|| anyhow!("cannot find the config directory: set HOME"))?;
    Ok(home.join("systemd/user").join(login::UNIT_FILE))
}

/// Runs `systemctl --user ARGS`; `false` (with what it said) when systemd is not reachable.
fn systemctl(args: &[&str]) -> bool {
    match Command::new("systemctl").arg("--user").args(args).output() {
        Ok(out) if out.status.success() => true,
        Ok(out) => {
            eprintln!("systemctl --user {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
            false
        }
        Err(e) => {
            eprintln!("systemctl --user {}: {e}", args.join(" "));
            false
        }
    }
}

pub fn install(data_dir: &Path, enable: bool) -> Result<ExitCode, Failure> {
    let postern = std::env::current_exe().context("find this postern binary")?;
    let path = unit_path()?;
    std::fs::create_dir_all(path.parent().unwrap_or(Path::new("."))).context("create the systemd user directory")?;
    let unit = login::service_unit(&postern, data_dir).context("write the unit")?;
    std::fs::write(&path, unit).with_context(|| format!("write {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    let started = enable && systemctl(&["daemon-reload"]) && systemctl(&["enable", "--now", login::UNIT_FILE]);
    if started {
        eprintln!("postern.service is enabled and running; `journalctl --user -u postern` shows its log");
    } else {
        eprintln!(
            "to start it now and at every login: systemctl --user daemon-reload && systemctl --user enable --now {}",
            login::UNIT_FILE
        );
    }
    eprintln!(
        "note: the service has no approver, so calls that need a reviewer are denied; for approvals run the desktop \
         app (its Settings can start it at login) instead"
    );
    Ok(ExitCode::SUCCESS)
}

pub fn uninstall() -> Result<ExitCode, Failure> {
    let path = unit_path()?;
    if !path.exists() {
        eprintln!("no {} (nothing to remove)", path.display());
        return Ok(ExitCode::SUCCESS);
    }
    // Stopped first (if systemd runs), so the gateway drains before its unit disappears.
    let _ = systemctl(&["disable", "--now", login::UNIT_FILE]);
    std::fs::remove_file(&path).with_context(|| format!("remove {}", path.display()))?;
    let _ = systemctl(&["daemon-reload"]);
    eprintln!("removed {}", path.display());
    Ok(ExitCode::SUCCESS)
}
