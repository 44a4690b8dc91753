//! `sluice envoy-config`: a complete envoy.yaml that loads the filter with a
//! policy embedded, from the template `envoy/demo.yaml` that the tests and the
//! demo run too.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};

const TEMPLATE: &str = include_str!("../../envoy/demo.yaml");

#[derive(clap::Args)]
pub struct Args {
    /// The policy document to embed; it must validate.
    #[arg(long)]
    policy: PathBuf,
    /// The filter; made absolute. Default: dist/sluice.wasm under the current directory.
    #[arg(long)]
    wasm: Option<PathBuf>,
    /// The shim, `sluice serve --listen`.
    #[arg(long, default_value = "127.0.0.1:8181")]
    shim: SocketAddr,
    /// Where Envoy accepts traffic.
    #[arg(long, default_value = "0.0.0.0:10000")]
    listen: SocketAddr,
    /// Where allowed requests go.
    #[arg(long, default_value = "127.0.0.1:8080")]
    upstream: SocketAddr,
    /// Envoy's admin interface.
    #[arg(long, default_value = "127.0.0.1:9901")]
    admin: SocketAddr,
}

pub fn run(args: &Args) -> anyhow::Result<String> {
    let policy = std::fs::read_to_string(&args.policy)
        .with_context(|| format!("cannot read {}", args.policy.display()))?;
    if let Err(err) = sluice_policies::parse(&policy) {
        bail!("{}: {err}", args.policy.display());
    }
    let wasm = args.wasm.clone().unwrap_or_else(|| PathBuf::from("dist/sluice.wasm"));
    let wasm = std::path::absolute(&wasm).with_context(|| format!("bad --wasm {}", wasm.display()))?;
    let mut values = vec![
        ("WASM_PATH".to_string(), wasm.display().to_string()),
        // A JSON string literal is also a valid YAML double-quoted scalar.
        ("POLICY_JSON".to_string(), serde_json::to_string(&policy)?),
    ];
    for (name, addr) in
        [("LISTEN", args.listen), ("ADMIN", args.admin), ("UPSTREAM", args.upstream), ("SHIM", args.shim)]
    {
        values.push((format!("{name}_HOST"), addr.ip().to_string()));
        values.push((format!("{name}_PORT"), addr.port().to_string()));
    }
    render(TEMPLATE, &values)
}

/// Replaces each `${NAME}` of `template`; fails if one is left over outside
/// a comment. The test harness renders its templates with it too.
pub fn render<K: AsRef<str>>(template: &str, values: &[(K, String)]) -> anyhow::Result<String> {
    let mut out = template.to_string();
    for (name, value) in values {
        out = out.replace(&format!("${{{}}}", name.as_ref()), value);
    }
    let mut body = out.lines().filter(|line| !line.trim_start().starts_with('#'));
    if let Some(line) = body.find(|line| line.contains("${")) {
        bail!("unknown placeholder left in the template: {line}");
    }
    Ok(out)
}
