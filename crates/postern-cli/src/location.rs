//! Where Postern keeps its data: the OS convention (XDG on Linux), unless overridden.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

pub fn data_dir(explicit: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(dir) = explicit {
        return Ok(dir);
    }
    let dirs = directories::ProjectDirs::from("", "", "postern")
        .context("cannot determine a home directory; pass --data-dir or set POSTERN_DATA_DIR")?;
    Ok(dirs.data_dir().to_path_buf())
}

pub fn database(data_dir: &Path) -> PathBuf {
    data_dir.join("postern.db")
}

/// The default tool manifest: `tools.toml` in the OS config directory (XDG on Linux).
pub fn tools_file() -> Result<PathBuf> {
    let dirs = directories::ProjectDirs::from("", "", "postern")
        .context("cannot determine a home directory; pass --tools FILE or set POSTERN_TOOLS")?;
    Ok(dirs.config_dir().join("tools.toml"))
}
