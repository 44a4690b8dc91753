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
    /// With [`Envoy::start_dynamic`]: the listener file Envoy watches, and
    /// the values it was rendered with.
    lds: Option<Lds>,
}

struct Lds {
    path: PathBuf,
    values: Vec<(String, String)>,
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

    /// Starts Envoy with its native rate-limit filter (`envoy/rls.yaml`, as
    /// `sluice envoy-config --face rls` renders it for `policy_json`)
    /// asking the shim's gRPC listener on `grpc_port`.
    pub fn start_rls(policy_json: &str, grpc_port: u16, upstream_port: u16) -> anyhow::Result<Envoy> {
        let doc = sluice_policies::parse(policy_json).map_err(|e| anyhow::anyhow!("the policy: {e}"))?;
        let rls = sluice_envoy_config::rls::rls_values(&doc)?;
        let mut values: Vec<(&str, String)> = rls.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
        values.push(("UPSTREAM_PORT", upstream_port.to_string()));
        values.push(("SHIM_PORT", grpc_port.to_string()));
        let template = workspace_root().join("envoy/rls.yaml");
        Envoy::start_template(&template, &values, DEMO_CONCURRENCY)
    }

    /// Starts Envoy with its `rate_limit_quota` filter (`envoy/rlqs.yaml`, as
    /// `sluice envoy-config --face rlqs` renders it for `policy_json`)
    /// reporting to the shim's gRPC listener on `grpc_port`. `settings`'
    /// fields are set in every bucket's settings (e.g. an
    /// `expired_assignment_behavior`, a `reporting_interval`).
    pub fn start_rlqs(
        policy_json: &str,
        grpc_port: u16,
        upstream_port: u16,
        settings: serde_json::Value,
    ) -> anyhow::Result<Envoy> {
        let doc = sluice_policies::parse(policy_json).map_err(|e| anyhow::anyhow!("the policy: {e}"))?;
        let mut values: Vec<(&str, String)> = Vec::new();
        for (name, value) in sluice_envoy_config::rlqs::rlqs_values(&doc)? {
            match name.as_str() {
                "BUCKET_MATCHERS" => {
                    let mut matchers: serde_json::Value = serde_json::from_str(&value)?;
                    for matcher in matchers.as_array_mut().into_iter().flatten() {
                        let target = &mut matcher["on_match"]["action"]["typed_config"];
                        for (field, v) in settings.as_object().into_iter().flatten() {
                            target[field] = v.clone();
                        }
                    }
                    values.push(("BUCKET_MATCHERS", serde_json::to_string(&matchers)?));
                }
                _ => values.push(("DOMAIN", value)),
            }
        }
        values.push(("UPSTREAM_PORT", upstream_port.to_string()));
        values.push(("SHIM_PORT", grpc_port.to_string()));
        let template = workspace_root().join("envoy/rlqs.yaml");
        Envoy::start_template(&template, &values, DEMO_CONCURRENCY)
    }

    /// Starts Envoy from a whole configuration: what `render(port,
    /// admin_port)` returns for two free ports (e.g. what `sluice
    /// envoy-config` prints for them), run as it is, with the demo's
    /// workers; waits until it serves.
    pub fn start_rendered(render: impl Fn(u16, u16) -> anyhow::Result<String>) -> anyhow::Result<Envoy> {
        retry_port_clash(|| {
            let (port, admin_port) = (free_port()?, free_port()?);
            let dir = scratch_dir("envoy")?;
            let config_path = dir.join("envoy.yaml");
            std::fs::write(&config_path, render(port, admin_port)?)?;
            let cmd = command(&binary("SLUICE_ENVOY", "envoy")?, &config_path, admin_port, DEMO_CONCURRENCY);
            Envoy::serving(Proc::spawn("envoy", cmd, dir)?, port, admin_port)
        })
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
        Ok(Envoy { port, admin_port, proc, lds: None })
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

    /// As [`Envoy::start`], with the listener (and so the filter's policy
    /// document) from a file Envoy watches (LDS from `path_config_source`),
    /// so that [`Envoy::update_policy`] can change it under traffic.
    pub fn start_dynamic(policy_json: &str, shim_port: u16, upstream_port: u16) -> anyhow::Result<Envoy> {
        retry_port_clash(|| {
            let (port, admin_port) = (free_port()?, free_port()?);
            let mut values: Vec<(String, String)> = vec![
                ("UPSTREAM_PORT".into(), upstream_port.to_string()),
                ("SHIM_PORT".into(), shim_port.to_string()),
                ("WASM_PATH".into(), dist("sluice.wasm")?.display().to_string()),
                ("LISTEN_PORT".into(), port.to_string()),
                ("ADMIN_PORT".into(), admin_port.to_string()),
                ("SHIM_TRANSPORT_SOCKET".into(), String::new()),
            ];
            for host in ["LISTEN_HOST", "ADMIN_HOST", "UPSTREAM_HOST"] {
                values.push((host.into(), "127.0.0.1".into()));
            }
            let shim = sluice_envoy_config::ShimAddress::Tcp(std::net::SocketAddr::from((
                [127, 0, 0, 1],
                shim_port,
            )));
            values.push(("SHIM_ADDRESS".into(), shim.envoy_address()));
            let dir = scratch_dir("envoy")?;
            let lds_dir = dir.join("lds");
            std::fs::create_dir_all(&lds_dir)?;
            let lds = Lds { path: lds_dir.join("listeners.yaml"), values };
            let (bootstrap, listeners) = lds.render(policy_json)?;
            std::fs::write(&lds.path, listeners)?;
            let bootstrap = format!(
                "{bootstrap}\nnode: {{id: sluice, cluster: sluice}}\ndynamic_resources:\n  lds_config:\n    \
                 resource_api_version: V3\n    path_config_source:\n      path: \"{}\"\n      \
                 watched_directory: {{path: \"{}\"}}\n",
                lds.path.display(),
                lds_dir.display()
            );
            let config_path = dir.join("envoy.yaml");
            std::fs::write(&config_path, bootstrap)?;
            let bin = binary("SLUICE_ENVOY", "envoy")?;
            let proc = Proc::spawn("envoy", command(&bin, &config_path, admin_port, DEMO_CONCURRENCY), dir)?;
            let mut envoy = Envoy::serving(proc, port, admin_port)?;
            envoy.lds = Some(lds);
            Ok(envoy)
        })
    }

    /// A listener update: the listener rendered with `policy_json` is
    /// renamed into place, and Envoy reloads it. Returns once Envoy counts
    /// the update and warms no listener: new connections run the new
    /// document; connections open before keep the old one until they close.
    pub fn update_policy(&self, policy_json: &str) -> anyhow::Result<()> {
        let Some(lds) = &self.lds else { bail!("not started with Envoy::start_dynamic") };
        let updates = || self.stat("listener_manager.lds.update_success");
        let before = updates();
        let (_, listeners) = lds.render(policy_json)?;
        let tmp = lds.path.with_extension("yaml.tmp");
        std::fs::write(&tmp, listeners)?;
        std::fs::rename(&tmp, &lds.path)?;
        let deadline = std::time::Instant::now() + STARTUP;
        while updates() <= before || self.stat("listener_manager.total_listeners_warming") != 0 {
            if std::time::Instant::now() > deadline {
                bail!("Envoy did not take the listener update within {STARTUP:?}\n{}", self.proc.log_tail());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// One counter or gauge of the admin's `/stats`, 0 if absent.
    pub fn stat(&self, name: &str) -> u64 {
        let Some((200, page)) = http_get(self.admin_port, &format!("/stats?filter=^{name}$")) else {
            return 0;
        };
        page.lines()
            .filter_map(|line| line.split_once(": "))
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// `http://127.0.0.1:PORT`, the listener.
    /// Envoy's process id, e.g. to read its CPU time in `/proc`.
    pub fn pid(&self) -> u32 {
        self.proc.id()
    }

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

impl Lds {
    /// `envoy/demo.yaml` rendered with `policy_json`, split in two: the
    /// bootstrap without its listeners, and the listeners as an LDS file.
    fn render(&self, policy_json: &str) -> anyhow::Result<(String, String)> {
        let mut values = self.values.clone();
        values.push(("POLICY_JSON".into(), serde_json::to_string(policy_json)?));
        values.extend(sluice_envoy_config::timeout_values(policy_json));
        let template = demo_template();
        let text =
            std::fs::read_to_string(&template).with_context(|| format!("reading {}", template.display()))?;
        let config = sluice_envoy_config::render(&text, &values)?;
        // The template's listeners: from `  listeners:` to `  clusters:`,
        // each item `  - name: ...` with its fields four deep.
        let (Some(start), Some(end)) = (config.find("\n  listeners:\n"), config.find("\n  clusters:\n"))
        else {
            bail!("{} has no static listeners before its clusters", template.display());
        };
        let items = &config[start + "\n  listeners:\n".len()..end];
        let listeners = format!(
            "resources:\n{}\n",
            items.replacen(
                "  - name:",
                "  - \"@type\": type.googleapis.com/envoy.config.listener.v3.Listener\n    name:",
                1
            )
        );
        let bootstrap = format!("{}{}", &config[..start], &config[end..]);
        Ok((bootstrap, listeners))
    }
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
    cmd.args(["--log-level", &std::env::var("SLUICE_ENVOY_LOG_LEVEL").unwrap_or_else(|_| "info".into())]);
    cmd
}
