//! `sluice envoy-config`: a complete envoy.yaml that loads the filter with a
//! policy embedded, from the template `envoy/demo.yaml` that the tests and the
//! demo run too.
//!
//! **Timeouts and egress waiting.** The filter holds a waiting request
//! before the router, as one call to the shim. What could cut it short:
//!
//! - the HCM's `stream_idle_timeout` (default 5 min): a held stream is idle.
//!   Rendered as the longest hold (the longest `wait.timeout` plus
//!   `shim.timeout_ms`) plus [`IDLE_SLACK_MS`], and never below Envoy's 5 min;
//! - the HCM's `request_timeout` (default off), which would count the hold:
//!   left off;
//! - the shim cluster's circuit breakers: every held request is one request
//!   in flight to the shim, and Envoy's default `max_requests` of 1024 would
//!   refuse the 1025th held call (the filter then applies `failure_mode`).
//!   The template raises them for every document;
//! - the check call's own timeout: the filter sets it to `shim.timeout_ms`
//!   plus the request's wait.
//!
//! The route timeout (default 15 s) starts only when the router sees the
//! request, after the hold, so it needs no change.

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
    values.extend(timeout_values(&policy));
    render(TEMPLATE, &values)
}

/// Envoy's default `stream_idle_timeout`.
const DEFAULT_IDLE_MS: u64 = 300_000;
/// Room between the longest hold and the idle timeout.
pub const IDLE_SLACK_MS: u64 = 5_000;

/// The template's values that depend on the document's waits:
/// `STREAM_IDLE_TIMEOUT`. A document that does not parse gets the defaults
/// (the filter will refuse it anyway).
pub fn timeout_values(policy_json: &str) -> Vec<(String, String)> {
    let longest_hold_ms = sluice_policies::parse(policy_json).ok().map_or(0, |doc| {
        let wait = doc.policies.iter().filter_map(|p| p.wait).map(|w| w.timeout_ms()).max();
        wait.map_or(0, |ms| ms + u64::from(doc.shim.timeout_ms.get()))
    });
    let idle_ms = DEFAULT_IDLE_MS.max(longest_hold_ms + IDLE_SLACK_MS);
    vec![("STREAM_IDLE_TIMEOUT".to_string(), format!("{}s", idle_ms.div_ceil(1000)))]
}

/// Replaces each `${NAME}` of `template`, and each `${NAME:-DEFAULT}` with
/// its value or else `DEFAULT`; fails if one is left over outside a comment.
/// The test harness renders its templates with it too.
pub fn render<K: AsRef<str>>(template: &str, values: &[(K, String)]) -> anyhow::Result<String> {
    let mut out = template.to_string();
    for (name, value) in values {
        out = out.replace(&format!("${{{}}}", name.as_ref()), value);
        while let Some(start) = out.find(&format!("${{{}:-", name.as_ref())) {
            let Some(len) = out[start..].find('}') else { break };
            out.replace_range(start..=start + len, value);
        }
    }
    out = fill_defaults(&out);
    let mut body = out.lines().filter(|line| !line.trim_start().starts_with('#'));
    if let Some(line) = body.find(|line| line.contains("${")) {
        bail!("unknown placeholder left in the template: {line}");
    }
    Ok(out)
}

/// Replaces each `${NAME:-DEFAULT}` left with its `DEFAULT`.
fn fill_defaults(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        let Some(len) = rest[start..].find('}') else { break };
        let inner = &rest[start + 2..start + len];
        out.push_str(&rest[..start]);
        match inner.split_once(":-") {
            Some((name, default)) if !name.is_empty() && !name.contains(char::is_whitespace) => {
                out.push_str(default)
            }
            _ => out.push_str(&rest[start..=start + len]),
        }
        rest = &rest[start + len + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_take_their_value_or_their_default() {
        let template = "a: ${A}\nb: ${B:-300s}\nc: ${C:-1}\n# ${D}\n";
        let out = render(template, &[("A", "1".to_string()), ("B", "9s".to_string())]).expect("renders");
        assert_eq!(out, "a: 1\nb: 9s\nc: 1\n# ${D}\n");
        assert!(render("x: ${X}\n", &[("A", String::new())]).is_err());
    }

    #[test]
    fn the_idle_timeout_outlasts_the_longest_hold() {
        let doc = |wait: &str| {
            format!(
                r#"{{"shim": {{"timeout_ms": 100}}, "policies": [{{"name": "p", {wait} "limits": [{{"type": "interval", "every": "1s"}}]}}]}}"#
            )
        };
        let idle = |json: &str| timeout_values(json)[0].1.clone();
        assert_eq!(idle(&doc("")), "300s", "no wait: Envoy's default");
        assert_eq!(idle(&doc(r#""wait": {"timeout": "15s"},"#)), "300s");
        assert_eq!(idle(&doc(r#""wait": {"timeout": "5m"},"#)), "306s", "5 min + 100 ms + 5 s slack");
        assert_eq!(idle("not json"), "300s");
    }
}
