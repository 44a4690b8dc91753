//! `cargo xtask test`: what CI runs. Makes sure Redis, Envoy and the wasm
//! toolchain are there, builds `dist/` and Limitador's engine (the bench's
//! RLS peer, a reference for the RLS face's tests), then runs every test in
//! the workspace with the `SLUICE_*` variables pointing at what it found and
//! built.
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
//!
//! `cargo xtask test --fast` is the fast lane ([`FAST_LANE`]): the tests
//! that need no Envoy, Redis, built `dist/` or browser. The full run starts
//! with it, so a mistake there fails in seconds and the lane stays true.

use anyhow::{Context, Result};

use crate::{bench, browser, build, cmd, deps, limitador, paths, playground};

/// The fast lane: every crate's unit tests (the end-to-end crate has none)
/// and these integration tests, `(package, test targets)`, `None` for all
/// of a package's. A test that needs Redis, Envoy or `dist/` fails here (the
/// lane points their variables at nothing), so a test that comes to need one
/// moves out of this list.
pub(crate) const FAST_LANE: &[(&str, Option<&[&str]>)] = &[
    ("sluice-policies", None),
    ("sluice-core", None),
    ("sluice-shim", Some(&["import", "one_plan", "serve", "server", "simulate"])),
    ("xtask", Some(&["imports"])),
];

/// Where the lane points `SLUICE_REDIS_SERVER`, `SLUICE_ENVOY` and
/// `SLUICE_DIST`: nowhere, so that nothing in it finds the machine's.
const NOWHERE: &str = "/nonexistent/not-in-the-fast-lane";

/// `cargo xtask test --fast`.
pub(crate) fn fast(test_args: &[String]) -> Result<()> {
    let lane = |test: &mut std::process::Command| {
        test.env("SLUICE_ENVOY", NOWHERE).env("SLUICE_REDIS_SERVER", NOWHERE).env("SLUICE_DIST", NOWHERE);
        if !test_args.is_empty() {
            test.arg("--").args(test_args);
        }
        cmd::run(test)
    };
    lane(cmd::cargo().args(["test", "--workspace", "--exclude", "sluice-e2e", "--lib"]))?;
    for (package, targets) in FAST_LANE {
        let mut test = cmd::cargo();
        test.args(["test", "-p", package]);
        match targets {
            None => test.arg("--tests"),
            Some(targets) => targets.iter().fold(&mut test, |t, target| t.args(["--test", target])),
        };
        lane(&mut test)?;
    }
    Ok(())
}

/// `test_args` go to the test binaries (after `--`), e.g. `--nocapture`.
pub(crate) fn run(test_args: &[String]) -> Result<()> {
    eprintln!("xtask: the fast lane first (cargo xtask test --fast)");
    fast(test_args)?;
    let redis = deps::ensure_redis()?;
    let envoy = deps::ensure_envoy()?;
    // For the package test, which reads the images back with it.
    let skopeo = deps::ensure_skopeo()?;
    // For tests/e2e/tests/envoy_sdks.rs: the official SDKs through Envoy.
    deps::ensure_sdks()?;
    eprintln!("xtask: redis-server: {}", redis.display());
    eprintln!("xtask: skopeo: {}", skopeo.display());
    eprintln!("xtask: envoy: {}", envoy.display());
    build::build()?;
    // For host-shim/tests/rls_peers.rs: Limitador's engine as a reference.
    let limitador = limitador::build().context("building Limitador's engine (bench/limitador-peer)")?;

    let mut test = cmd::cargo();
    test.args(["test", "--workspace"])
        .env("SLUICE_ENVOY", &envoy)
        .env("SLUICE_REDIS_SERVER", &redis)
        .env("SLUICE_LIMITADOR", &limitador)
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
