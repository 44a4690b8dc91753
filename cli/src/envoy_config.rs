//! `sluice envoy-config`: a complete envoy.yaml that loads the filter with a
//! policy embedded, from the template `envoy/demo.yaml` that the tests and the
//! demo run too. The rendering (and why the timeouts are what they are) is
//! the crate `sluice-envoy-config`; this is the command line around it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use sluice_envoy_config::{render, timeout_values, ShimAddress, ShimTls, DEMO_TEMPLATE};

/// Which Envoy filter asks Sluice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Face {
    /// The Sluice filter (sluice.wasm) calling `sluice serve --listen`.
    Wasm,
    /// Envoy's native rate-limit filter calling `sluice serve --grpc-listen`
    /// (the RLS face), with the route's `rate_limits` from the document.
    Rls,
    /// Envoy's `rate_limit_quota` filter streaming to `sluice serve
    /// --grpc-listen` (the RLQS face), with its bucket matchers from the document.
    Rlqs,
}

#[derive(clap::Args)]
pub struct Args {
    /// Which filter: `wasm` (the Sluice filter), `rls` (Envoy's native
    /// rate-limit filter and the shim's RLS face) or `rlqs` (Envoy's
    /// rate_limit_quota filter and the shim's RLQS face).
    #[arg(long, value_enum, default_value = "wasm")]
    face: Face,
    /// The policy document to embed; it must validate.
    #[arg(long)]
    policy: PathBuf,
    /// The filter, sluice.wasm; made absolute, and it must exist. Default:
    /// the sluice.wasm beside this `sluice` binary (as `cargo xtask build`
    /// writes both to dist/).
    #[arg(long)]
    wasm: Option<PathBuf>,
    /// The shim: `sluice serve --listen` (wasm), or its `--grpc-listen`
    /// (rls, rlqs); `HOST:PORT`, or `unix:/PATH` for a shim on a Unix socket
    /// beside Envoy.
    #[arg(long, default_value = "127.0.0.1:8181")]
    shim: ShimAddress,
    /// Where Envoy accepts traffic.
    #[arg(long, default_value = "0.0.0.0:10000")]
    listen: SocketAddr,
    /// Where allowed requests go.
    #[arg(long, default_value = "127.0.0.1:8080")]
    upstream: SocketAddr,
    /// Envoy's admin interface.
    #[arg(long, default_value = "127.0.0.1:9901")]
    admin: SocketAddr,
    /// Mutual TLS to the shim: the CA (PEM) that signed the shim's
    /// certificate. Needs --shim-client-cert and --shim-client-key.
    #[arg(long, requires_all = ["shim_client_cert", "shim_client_key"])]
    shim_ca: Option<PathBuf>,
    /// Mutual TLS to the shim: Envoy's client certificate chain (PEM), signed
    /// by the CA the shim's --client-ca names.
    #[arg(long, requires_all = ["shim_ca", "shim_client_key"])]
    shim_client_cert: Option<PathBuf>,
    /// Mutual TLS to the shim: the client certificate's private key (PEM).
    #[arg(long, requires_all = ["shim_ca", "shim_client_cert"])]
    shim_client_key: Option<PathBuf>,
    /// Mutual TLS to the shim: the name to send as SNI and to require among
    /// the shim certificate's DNS names. Without it, any certificate the CA
    /// signed is accepted.
    #[arg(long, requires = "shim_ca")]
    shim_server_name: Option<String>,
}

/// The template's `SHIM_TRANSPORT_SOCKET`: mutual TLS from Envoy to the shim
/// when `--shim-ca`, `--shim-client-cert` and `--shim-client-key` are given
/// (each must exist; Envoy gets absolute paths), else empty: cleartext. The
/// paths the filter matches are normalized by the template either way.
fn shim_transport_socket(args: &Args) -> anyhow::Result<String> {
    let (Some(ca), Some(cert), Some(key)) = (&args.shim_ca, &args.shim_client_cert, &args.shim_client_key)
    else {
        return Ok(String::new());
    };
    let readable = |flag: &str, path: &PathBuf| -> anyhow::Result<PathBuf> {
        std::fs::metadata(path).with_context(|| format!("{flag} {}", path.display()))?;
        std::path::absolute(path).with_context(|| format!("{flag} {}", path.display()))
    };
    let tls = ShimTls {
        ca: readable("--shim-ca", ca)?,
        client_cert: readable("--shim-client-cert", cert)?,
        client_key: readable("--shim-client-key", key)?,
        server_name: args.shim_server_name.clone(),
    };
    Ok(tls.transport_socket())
}

pub fn run(args: &Args) -> anyhow::Result<String> {
    let policy = std::fs::read_to_string(&args.policy)
        .with_context(|| format!("cannot read {}", args.policy.display()))?;
    let doc = match sluice_policies::parse(&policy) {
        Ok(doc) => doc,
        Err(err) => bail!("{}: {err}", args.policy.display()),
    };
    let transport_socket = shim_transport_socket(args)?;
    if args.face == Face::Rls {
        let mut values = sluice_envoy_config::rls::rls_values(&doc)
            .with_context(|| format!("{}", args.policy.display()))?;
        values.push(("SHIM_TRANSPORT_SOCKET".to_string(), transport_socket));
        values.extend(addresses(args));
        return render(sluice_envoy_config::rls::RLS_TEMPLATE, &values);
    }
    if args.face == Face::Rlqs {
        let mut values = sluice_envoy_config::rlqs::rlqs_values(&doc)
            .with_context(|| format!("{}", args.policy.display()))?;
        values.push(("SHIM_TRANSPORT_SOCKET".to_string(), transport_socket));
        values.extend(addresses(args));
        return render(sluice_envoy_config::rlqs::RLQS_TEMPLATE, &values);
    }
    let wasm = wasm_path(args.wasm.as_deref())?;
    let mut values = vec![
        ("WASM_PATH".to_string(), wasm.display().to_string()),
        // A JSON string literal is also a valid YAML double-quoted scalar.
        ("POLICY_JSON".to_string(), serde_json::to_string(&policy)?),
        ("SHIM_TRANSPORT_SOCKET".to_string(), transport_socket),
    ];
    values.extend(addresses(args));
    values.extend(timeout_values(&policy));
    render(DEMO_TEMPLATE, &values)
}

/// The filter Envoy is to load: `--wasm` or else the sluice.wasm beside
/// this binary, absolute (Envoy resolves a relative path from its own
/// directory) and checked, so a wrong path fails here and not in Envoy.
fn wasm_path(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match given {
        Some(path) => path.to_path_buf(),
        None => std::env::current_exe()
            .context("cannot find this binary's directory for the default --wasm")?
            .with_file_name("sluice.wasm"),
    };
    let path = std::path::absolute(&path).with_context(|| format!("bad --wasm {}", path.display()))?;
    if !path.is_file() {
        let hint = if given.is_some() { "" } else { " (the default: beside this binary)" };
        bail!(
            "--wasm {}: no such file{hint}; build it with `cargo xtask build` (dist/sluice.wasm) \
             or give --wasm PATH",
            path.display()
        );
    }
    Ok(path)
}

/// The templates' `*_HOST` and `*_PORT` values, and `SHIM_ADDRESS`.
fn addresses(args: &Args) -> Vec<(String, String)> {
    let mut values = Vec::new();
    for (name, addr) in [("LISTEN", args.listen), ("ADMIN", args.admin), ("UPSTREAM", args.upstream)] {
        values.push((format!("{name}_HOST"), addr.ip().to_string()));
        values.push((format!("{name}_PORT"), addr.port().to_string()));
    }
    values.push(("SHIM_ADDRESS".to_string(), args.shim.envoy_address()));
    values
}
