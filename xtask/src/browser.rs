//! What the page tests need: Debian's Chromium, Node.js, and the npm
//! packages of `playground/package.json` (playwright-core, which drives the
//! browser; it never downloads one). Then the tests themselves, with Node's
//! test runner: the playground's, and the Limits dashboard's, which runs the
//! built shim (`dist/sluice`) and a redis-server.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::paths::workspace_root;
use crate::{apt, cmd};

const CHROMIUM: &str = "/usr/bin/chromium";

/// Installs what is missing; the Chromium binary.
fn ensure() -> Result<PathBuf> {
    if !Path::new(CHROMIUM).exists() {
        apt::install(&["chromium"], "the page tests (headless Chromium)")?;
    }
    if cmd::which("node").is_none() || cmd::which("npm").is_none() {
        apt::install(&["nodejs", "npm"], "the page tests (Node.js drives Chromium)")?;
    }
    let dir = workspace_root().join("playground");
    if !dir.join("node_modules/playwright-core").is_dir() {
        eprintln!("xtask: installing the page tests' npm packages (playground/package-lock.json)");
        cmd::run(cmd::clean("npm").args(["ci", "--no-audit", "--no-fund"]).current_dir(&dir))?;
    }
    Ok(PathBuf::from(CHROMIUM))
}

/// Runs every page test in `playground/tests/` against the built `site`;
/// the dashboard's test runs `dist/sluice` in front of `redis`. Screenshots
/// go to `target/screenshots/`.
pub fn test(site: &Path, redis: &Path) -> Result<()> {
    let chromium = ensure()?;
    cmd::run(
        cmd::clean("node")
            .args(["--test", "tests/"])
            .current_dir(workspace_root().join("playground"))
            .env("SLUICE_CHROMIUM", chromium)
            .env("SLUICE_PLAYGROUND", site)
            .env("SLUICE_DIST", crate::paths::dist_dir())
            .env("SLUICE_REDIS_SERVER", redis)
            .env("SLUICE_SCREENSHOTS", workspace_root().join("target/screenshots")),
    )
    .context("the page tests failed")
}
