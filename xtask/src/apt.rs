//! Installing Debian packages without a prompt.
//!
//! `apt-get update` runs at most once per xtask run. As root apt-get runs
//! directly; otherwise through `sudo -n`, which fails instead of asking for a
//! password, so nothing can hang waiting on a terminal.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Context, Result};

use crate::cmd;

static UPDATED: AtomicBool = AtomicBool::new(false);

/// Install `packages` with apt-get. `why` says what they are for, for the
/// error when apt-get is not usable here.
pub(crate) fn install(packages: &[&str], why: &str) -> Result<()> {
    let list = packages.join(" ");
    let by_hand = || format!("{why} needs the Debian packages: {list}");
    if cmd::which("apt-get").is_none() {
        bail!("{}; apt-get was not found, install them by hand", by_hand());
    }
    eprintln!("xtask: installing {list} ({why})");
    if !UPDATED.swap(true, Ordering::SeqCst) {
        // A stale or partly unreachable index can still serve the install.
        if let Err(err) = cmd::run(apt_get()?.arg("update")) {
            eprintln!("xtask: warning: {err:#}; trying the install anyway");
        }
    }
    cmd::run(apt_get()?.args(["install", "-y", "--no-install-recommends"]).args(packages))
        .with_context(by_hand)
}

/// `apt-get`, or `sudo -n apt-get` when we are not root.
fn apt_get() -> Result<Command> {
    let root = cmd::probe(Command::new("id").arg("-u")).as_deref() == Some("0");
    let mut c = if root {
        Command::new("apt-get")
    } else if cmd::which("sudo").is_some() {
        let mut c = Command::new("sudo");
        // sudo drops the environment, so hand it over on the command line.
        c.args(["-n", "env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]);
        c
    } else {
        bail!("not root and no sudo: cannot run apt-get");
    };
    c.env("DEBIAN_FRONTEND", "noninteractive").stdin(std::process::Stdio::null());
    Ok(c)
}
