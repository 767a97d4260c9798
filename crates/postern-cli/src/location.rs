//! Where Postern keeps its data: the OS convention (XDG on Linux), unless overridden — the same
//! places `postern-host` uses for the gateway and the desktop app.

use anyhow::Result;
use std::path::{Path, PathBuf};

pub fn data_dir(explicit: Option<PathBuf>) -> Result<PathBuf> {
    match explicit {
        Some(dir) => Ok(dir),
        None => Ok(postern_host::default_data_dir().map_err(|_| {
            anyhow::anyhow!("cannot determine a home directory; pass --data-dir or set POSTERN_DATA_DIR")
        })?),
    }
}

pub fn database(data_dir: &Path) -> PathBuf {
    postern_host::database(data_dir)
}
