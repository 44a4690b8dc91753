//! Envoy running `sluice.wasm`: renders the template `envoy/demo.yaml` with
//! free ports, the shim and upstream ports, the wasm path and a policy
//! document, then runs it. Ready once admin `GET /ready` answers `200 LIVE`
//! and the listener accepts connections.
//!
//! `--base-id` is the admin port, unique among running Envoys, so several can
//! run side by side (parallel tests).
//!
//! [`Envoy::start_template`] runs any other template the same way (the bench's
//! setups in `bench/envoy/`), with the worker count given.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use anyhow::{bail, Context};

use crate::paths::{binary, dist, free_port, workspace_root};
use crate::probe::{http_get, listening};
use crate::process::{retry_port_clash, scratch_dir, Proc};

/// Envoy compiles the wasm module once per worker, so give it time on a busy machine.
const STARTUP: Duration = Duration::from_secs(60);
/// Workers for `envoy/demo.yaml` as the tests and the demo run it.
const DEMO_CONCURRENCY: u16 = 2;

pub struct Envoy {
    /// The HTTP listener that runs the filter.
    pub port: u16,
    pub admin_port: u16,
    proc: Proc,
}

impl Envoy {
    /// Starts Envoy with `policy_json` as the plugin configuration and waits until it serves.
    pub fn start(policy_json: &str, shim_port: u16, upstream_port: u16) -> anyhow::Result<Envoy> {
        retry_port_clash(|| Envoy::start_once(policy_json, shim_port, upstream_port))
    }

    fn start_once(policy_json: &str, shim_port: u16, upstream_port: u16) -> anyhow::Result<Envoy> {
        let (proc, port, admin_port) = spawn(policy_json, shim_port, upstream_port)?;
        Envoy::serving(proc, port, admin_port)
    }

    /// As [`Envoy::start`], with more template values, e.g. the shim's
    /// `SHIM_TRANSPORT_SOCKET` for mutual TLS.
    pub fn start_with(
        policy_json: &str,
        shim_port: u16,
        upstream_port: u16,
        values: &[(&str, String)],
    ) -> anyhow::Result<Envoy> {
        let mut all = vec![
            ("UPSTREAM_PORT", upstream_port.to_string()),
            ("SHIM_PORT", shim_port.to_string()),
            ("WASM_PATH", dist("sluice.wasm")?.display().to_string()),
            ("POLICY_JSON", serde_json::to_string(policy_json)?),
        ];
        all.extend(values.iter().cloned());
        Envoy::start_template(&demo_template(), &all, DEMO_CONCURRENCY)
    }

    /// Starts Envoy from any config `template` with `concurrency` workers and
    /// waits until it serves. The template's `${LISTEN_PORT}` and
    /// `${ADMIN_PORT}` are filled here; `values` fill its other placeholders.
    pub fn start_template(
        template: &Path,
        values: &[(&str, String)],
        concurrency: u16,
    ) -> anyhow::Result<Envoy> {
        retry_port_clash(|| {
            let (port, admin_port) = (free_port()?, free_port()?);
            let proc = spawn_template(template, values, concurrency, port, admin_port)?;
            Envoy::serving(proc, port, admin_port)
        })
    }

    fn serving(mut proc: Proc, port: u16, admin_port: u16) -> anyhow::Result<Envoy> {
        proc.wait_ready(STARTUP, || {
            let live = matches!(http_get(admin_port, "/ready"), Some((200, body)) if body.contains("LIVE"));
            live && listening(port)
        })?;
        Ok(Envoy { port, admin_port, proc })
    }

    /// Starts Envoy with a configuration it should refuse, and waits for it to
    /// exit: its exit status and its whole log. An error if it serves instead,
    /// or is still running at the deadline.
    pub fn start_expect_exit(
        policy_json: &str,
        shim_port: u16,
        upstream_port: u16,
    ) -> anyhow::Result<(ExitStatus, String)> {
        let (mut proc, _, admin_port) = spawn(policy_json, shim_port, upstream_port)?;
        let outcome = proc.wait_ready(STARTUP, || matches!(http_get(admin_port, "/ready"), Some((200, _))));
        match (outcome, proc.wait_exit(Duration::ZERO)?) {
            (_, Some(status)) => Ok((status, proc.log())),
            (Ok(()), None) => bail!("envoy started although it should have refused\n{}", proc.log_tail()),
            (Err(err), None) => Err(err),
        }
    }

    /// `http://127.0.0.1:PORT`, the listener.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Fault injection: SIGKILL, as a crash. The filter gets no stream ends,
    /// so the leases its requests hold are never released; their TTL frees them.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Envoy's log so far (the filter's log lines included).
    pub fn log(&self) -> String {
        self.proc.log()
    }
}

fn spawn(policy_json: &str, shim_port: u16, upstream_port: u16) -> anyhow::Result<(Proc, u16, u16)> {
    let wasm = dist("sluice.wasm")?;
    let (port, admin_port) = (free_port()?, free_port()?);
    let mut values = vec![
        ("UPSTREAM_PORT", upstream_port.to_string()),
        ("SHIM_PORT", shim_port.to_string()),
        ("WASM_PATH", wasm.display().to_string()),
        // A JSON string literal is also a valid YAML double-quoted scalar.
        ("POLICY_JSON", serde_json::to_string(policy_json)?),
    ];
    // The timeouts `sluice envoy-config` renders for the document's waits.
    let timeouts = sluice_envoy_config::timeout_values(policy_json);
    values.extend(timeouts.iter().map(|(name, value)| (name.as_str(), value.clone())));
    let proc = spawn_template(&demo_template(), &values, DEMO_CONCURRENCY, port, admin_port)?;
    Ok((proc, port, admin_port))
}

/// `envoy/demo.yaml`, the template the tests and the demo run.
pub fn demo_template() -> PathBuf {
    workspace_root().join("envoy/demo.yaml")
}

fn spawn_template(
    template: &Path,
    values: &[(&str, String)],
    concurrency: u16,
    port: u16,
    admin_port: u16,
) -> anyhow::Result<Proc> {
    let bin = binary("SLUICE_ENVOY", "envoy")?;
    let dir = scratch_dir("envoy")?;
    let text =
        std::fs::read_to_string(template).with_context(|| format!("reading {}", template.display()))?;
    let mut all = vec![("LISTEN_PORT", port.to_string()), ("ADMIN_PORT", admin_port.to_string())];
    // Everything the harness starts is on loopback.
    for host in ["LISTEN_HOST", "ADMIN_HOST", "UPSTREAM_HOST"] {
        all.push((host, "127.0.0.1".to_string()));
    }
    all.extend(values.iter().cloned());
    // The shim on loopback TCP at `SHIM_PORT`, unless `values` gave its
    // `SHIM_ADDRESS` (a Unix socket).
    if let Some((_, port)) = values.iter().find(|(name, _)| *name == "SHIM_PORT") {
        let port: u16 = port.parse().with_context(|| format!("SHIM_PORT {port}"))?;
        let shim = sluice_envoy_config::ShimAddress::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
        all.push(("SHIM_ADDRESS", shim.envoy_address()));
    }
    // The shim in cleartext, unless `values` gave its TLS (the first value
    // for a placeholder wins).
    all.push(("SHIM_TRANSPORT_SOCKET", String::new()));
    let config = sluice_envoy_config::render(&text, &all)
        .with_context(|| format!("rendering {}", template.display()))?;
    let config_path = dir.join("envoy.yaml");
    std::fs::write(&config_path, config)?;
    let cmd = command(&bin, &config_path, admin_port, concurrency);
    Proc::spawn("envoy", cmd, dir)
}

fn command(bin: &Path, config: &Path, base_id: u16, concurrency: u16) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg("-c").arg(config);
    cmd.args(["--base-id", &base_id.to_string(), "--concurrency", &concurrency.to_string()]);
    cmd.args(["--log-level", "info"]);
    cmd
}
