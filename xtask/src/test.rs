//! `cargo xtask test`: what CI runs. Makes sure Redis, Envoy and the wasm
//! toolchain are there, builds `dist/`, then runs every test in the workspace
//! with the three `SLUICE_*` variables pointing at what it found and built.
//!
//! Then it builds the playground and runs the page tests in headless
//! Chromium (`playground/tests/`, Node's test runner): the playground's, and
//! the Limits dashboard's against `dist/sluice` and a redis-server.
//!
//! Last, it runs `cargo xtask bench --quick` (the crate `sluice-bench`), only to prove that the bench
//! still runs end to end; its numbers are never judged (they go to
//! `target/bench-quick/`, not to the committed results). Then a 60-second
//! soak (`--soak-seconds 60 --quick`), which is judged: a leak's slope, a
//! key without a TTL, or a waiter or lease left behind fails it; its
//! latency is reported, not judged (its SOAK.md and soak.png go to
//! `target/bench-quick/`).

use anyhow::{Context, Result};

use crate::{bench, browser, build, cmd, deps, paths, playground};

/// `test_args` go to the test binaries (after `--`), e.g. `--nocapture`.
pub(crate) fn run(test_args: &[String]) -> Result<()> {
    let redis = deps::ensure_redis()?;
    let envoy = deps::ensure_envoy()?;
    // For the package test, which reads the images back with it.
    let skopeo = deps::ensure_skopeo()?;
    // For e2e/tests/envoy_sdks.rs: the official SDKs through Envoy.
    deps::ensure_sdks()?;
    eprintln!("xtask: redis-server: {}", redis.display());
    eprintln!("xtask: skopeo: {}", skopeo.display());
    eprintln!("xtask: envoy: {}", envoy.display());
    build::build()?;

    let mut test = cmd::cargo();
    test.args(["test", "--workspace"])
        .env("SLUICE_ENVOY", &envoy)
        .env("SLUICE_REDIS_SERVER", &redis)
        .env("SLUICE_DIST", paths::dist_dir());
    if !test_args.is_empty() {
        test.arg("--").args(test_args);
    }
    cmd::run(&mut test)?;

    let site = playground::build()?;
    browser::test(&site, &redis)?;

    eprintln!("xtask: bench --quick, to prove the bench runs (its timings are not checked)");
    bench::run(&["--quick".to_string()]).context("the bench smoke run (cargo xtask bench --quick) failed")?;

    eprintln!("xtask: a 60-second soak (judged; written to target/bench-quick/)");
    let soak = ["--quick", "--soak-seconds", "60"].map(String::from);
    bench::run(&soak).context("the 60-second soak failed (target/bench-quick/SOAK.md says why)")
}
