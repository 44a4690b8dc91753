//! Where things are: the workspace and `dist/`. At the bottom of xtask's
//! modules: it uses none of them, so every other module may use it.

use std::path::{Path, PathBuf};

/// The workspace root: the parent of this crate's directory.
pub(crate) fn workspace_root() -> PathBuf {
    let xtask = Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask.parent().unwrap_or(xtask).to_path_buf()
}

/// Where the build puts its artifacts.
pub(crate) fn dist_dir() -> PathBuf {
    workspace_root().join("dist")
}
