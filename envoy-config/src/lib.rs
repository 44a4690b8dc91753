//! Renders the envoy.yaml that loads the Sluice filter with a policy
//! embedded, from the template `envoy/demo.yaml`. The shim's `sluice
//! envoy-config` command and the test harness both render through this crate,
//! so neither depends on the other for it.
//!
//! # Layout
//!
//! - [`DEMO_TEMPLATE`]: `envoy/demo.yaml`, built in.
//! - [`render`]: fills a template's `${NAME}` and `${NAME:-DEFAULT}` placeholders.
//! - [`timeout_values`]: the values that depend on the document's waits.
//! - [`ShimTls`]: mutual TLS from Envoy to the shim, as the template's
//!   `${SHIM_TRANSPORT_SOCKET}`.
//! - [`rls`]: the RLS face's template, `envoy/rls.yaml` (Envoy's native
//!   rate-limit filter), and its values from the document.
//! - [`rlqs`]: the RLQS face's template, `envoy/rlqs.yaml` (Envoy's
//!   `rate_limit_quota` filter), and its bucket matchers from the document.
//! - [`ShimAddress`]: where the shim listens, TCP or a Unix socket: one
//!   setting for `sluice serve --listen`, `sluice envoy-config --shim` and
//!   the template's `${SHIM_ADDRESS}`.
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
//! request, after the hold; but it also ends any answer still streaming 15 s
//! after the request (an LLM's answer often is), so the template sets it to
//! `0s` (none) and gives the route the stream idle timeout instead: a stream
//! lasts as long as it keeps moving.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::bail;

pub mod rlqs;
pub mod rls;
/// Where the shim listens: `HOST:PORT` (TCP, for a shim on another host),
/// or `unix:/PATH`, a Unix socket, for a shim beside Envoy (a sidecar):
/// no loopback TCP in the kernel per call (docs/performance.md). Written
/// the same way to `sluice serve --listen` and `sluice envoy-config --shim`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShimAddress {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// The prefix of a Unix socket's [`ShimAddress`].
pub const UNIX_PREFIX: &str = "unix:";

/// Why a text is not a [`ShimAddress`]; each variant holds the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("{0:?}: a Unix socket needs a path, as in unix:/run/sluice/shim.sock")]
    NoPath(String),
    #[error("{0:?}: a Unix socket's path must be absolute, as in unix:/run/sluice/shim.sock")]
    Relative(String),
    #[error("{0:?}: expected HOST:PORT (an IP address and a port) or unix:/PATH")]
    NotAnAddress(String),
}

impl std::str::FromStr for ShimAddress {
    type Err = AddressError;
    fn from_str(s: &str) -> Result<Self, AddressError> {
        match s.strip_prefix(UNIX_PREFIX) {
            Some("") => Err(AddressError::NoPath(s.to_string())),
            Some(path) if !path.starts_with('/') => Err(AddressError::Relative(s.to_string())),
            Some(path) => Ok(ShimAddress::Unix(PathBuf::from(path))),
            None => s.parse().map(ShimAddress::Tcp).map_err(|_| AddressError::NotAnAddress(s.to_string())),
        }
    }
}

impl std::fmt::Display for ShimAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShimAddress::Tcp(addr) => write!(f, "{addr}"),
            ShimAddress::Unix(path) => write!(f, "{UNIX_PREFIX}{}", path.display()),
        }
    }
}

impl ShimAddress {
    /// The shim endpoint's Envoy `address`, as one line of flow YAML (JSON),
    /// the value of the template's `${SHIM_ADDRESS}`: a `socket_address`, or
    /// a `pipe`.
    pub fn envoy_address(&self) -> String {
        let address = match self {
            ShimAddress::Tcp(addr) => serde_json::json!({
                "socket_address": {"address": addr.ip().to_string(), "port_value": addr.port()}
            }),
            ShimAddress::Unix(path) => serde_json::json!({"pipe": {"path": path.display().to_string()}}),
        };
        address.to_string()
    }
}

/// `envoy/demo.yaml`: the template `sluice envoy-config`, the tests and the
/// demo render.
pub const DEMO_TEMPLATE: &str = include_str!("../../envoy/demo.yaml");

/// Mutual TLS from Envoy to the shim: files Envoy reads at startup.
#[derive(Debug, Clone)]
pub struct ShimTls {
    pub ca: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub server_name: Option<String>,
}

impl ShimTls {
    /// The shim cluster's `transport_socket`, as one line of flow YAML (JSON),
    /// the value of the template's `${SHIM_TRANSPORT_SOCKET}`. ALPN `h2`
    /// keeps the cluster on HTTP/2.
    pub fn transport_socket(&self) -> String {
        let file = |path: &PathBuf| serde_json::json!({"filename": path.display().to_string()});
        let mut validation = serde_json::json!({"trusted_ca": file(&self.ca)});
        let mut context = serde_json::json!({
            "common_tls_context": {
                "alpn_protocols": ["h2"],
                "tls_certificates": [{
                    "certificate_chain": file(&self.client_cert),
                    "private_key": file(&self.client_key),
                }],
            }
        });
        if let Some(name) = &self.server_name {
            validation["match_typed_subject_alt_names"] =
                serde_json::json!([{"san_type": "DNS", "matcher": {"exact": name}}]);
            context["sni"] = serde_json::json!(name);
        }
        context["common_tls_context"]["validation_context"] = validation;
        context["@type"] = serde_json::json!(
            "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
        );
        let socket = serde_json::json!({"name": "envoy.transport_sockets.tls", "typed_config": context});
        format!("transport_socket: {socket}")
    }
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
/// its value or else `DEFAULT`; fails if one is left over. Comment lines are
/// the template's own notes (they name the placeholders) and stay as written.
/// The test harness renders its templates with it too.
pub fn render<K: AsRef<str>>(template: &str, values: &[(K, String)]) -> anyhow::Result<String> {
    let mut out = String::with_capacity(template.len());
    for line in template.split_inclusive('\n') {
        if line.trim_start().starts_with('#') {
            out.push_str(line);
            continue;
        }
        let mut line = line.to_string();
        for (name, value) in values {
            line = line.replace(&format!("${{{}}}", name.as_ref()), value);
            while let Some(start) = line.find(&format!("${{{}:-", name.as_ref())) {
                let Some(len) = line[start..].find('}') else { break };
                line.replace_range(start..=start + len, value);
            }
        }
        let line = fill_defaults(&line);
        if line.contains("${") {
            bail!("unknown placeholder left in the template: {}", line.trim_end());
        }
        out.push_str(&line);
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
    fn a_shim_address_is_tcp_or_a_unix_socket_and_renders_as_envoy_reads_it() {
        let tcp: ShimAddress = "127.0.0.1:8181".parse().expect("tcp");
        assert_eq!(tcp.to_string(), "127.0.0.1:8181");
        assert_eq!(tcp.envoy_address(), r#"{"socket_address":{"address":"127.0.0.1","port_value":8181}}"#);
        let unix: ShimAddress = "unix:/run/sluice/shim.sock".parse().expect("unix");
        assert_eq!(unix, ShimAddress::Unix(PathBuf::from("/run/sluice/shim.sock")));
        assert_eq!(unix.to_string(), "unix:/run/sluice/shim.sock");
        assert_eq!(unix.envoy_address(), r#"{"pipe":{"path":"/run/sluice/shim.sock"}}"#);
        for (bad, says) in [
            ("unix:", "needs a path"),
            ("unix:shim.sock", "must be absolute"),
            ("localhost:8181", "expected HOST:PORT"),
            ("8181", "expected HOST:PORT"),
        ] {
            let err = bad.parse::<ShimAddress>().expect_err(bad).to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn the_template_takes_the_shim_address_as_one_value() {
        let unix = ShimAddress::Unix(PathBuf::from("/run/sluice/shim.sock"));
        assert!(DEMO_TEMPLATE.contains("address: ${SHIM_ADDRESS}"));
        assert!(!DEMO_TEMPLATE
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .any(|l| l.contains("SHIM_HOST")));
        let line = format!("address: {}", unix.envoy_address());
        let rendered =
            render("            address: ${SHIM_ADDRESS}\n", &[("SHIM_ADDRESS", unix.envoy_address())])
                .expect("renders");
        assert_eq!(rendered.trim(), line);
    }

    #[test]
    fn placeholders_take_their_value_or_their_default() {
        let template = "a: ${A}\nb: ${B:-300s}\nc: ${C:-1}\n# ${D}\n";
        let out = render(template, &[("A", "1".to_string()), ("B", "9s".to_string())]).expect("renders");
        assert_eq!(out, "a: 1\nb: 9s\nc: 1\n# ${D}\n");
        let noted = render("# ${A} is the listener\na: ${A}\n", &[("A", "1".to_string())]).expect("render");
        assert_eq!(noted, "# ${A} is the listener\na: 1\n", "a comment keeps its placeholder as written");
        assert!(render("x: ${X}\n", &[("A", String::new())]).is_err());
    }

    /// Every per-policy stat the filter defines is named in the template's
    /// `policy` tag regex: one missing would stay unlabelled, as
    /// `sluice_<policy>_<stat>`.
    #[test]
    fn the_policy_tag_covers_every_per_policy_stat() {
        use sluice_core::stats::PolicyStat;
        let regex = DEMO_TEMPLATE
            .lines()
            .find_map(|line| line.trim().strip_prefix("regex: \"^wasmcustom"))
            .expect("the policy tag's regex");
        let named: Vec<&str> = regex
            .split_once("(?:")
            .and_then(|(_, rest)| rest.split_once(")$"))
            .map(|(names, _)| names.split('|').collect())
            .expect("the stat names");
        let defined: Vec<&str> = PolicyStat::ALL.iter().map(|s| s.name()).collect();
        assert!(defined.len() >= 20, "found {defined:?}");
        for stat in defined {
            assert!(named.contains(&stat), "sluice.<policy>.{stat} is not in the policy tag's regex");
        }
    }

    /// A streamed answer outlives Envoy's default route timeout of 15 s:
    /// the route has none, and ends only a stream idle for the idle timeout.
    #[test]
    fn routes_let_a_long_stream_through_and_end_an_idle_one() {
        let doc = r#"{"policies": [{"name": "p", "limits": [{"type": "interval", "every": "1s"}]}]}"#;
        let mut values = timeout_values(doc);
        values.push(("SHIM_ADDRESS".into(), ShimAddress::Unix(PathBuf::from("/s")).envoy_address()));
        for name in ["LISTEN_HOST", "ADMIN_HOST", "UPSTREAM_HOST"] {
            values.push((name.into(), "127.0.0.1".into()));
        }
        for name in ["LISTEN_PORT", "ADMIN_PORT", "UPSTREAM_PORT"] {
            values.push((name.into(), "1".into()));
        }
        for name in ["WASM_PATH", "POLICY_JSON", "SHIM_TRANSPORT_SOCKET"] {
            values.push((name.into(), String::new()));
        }
        let rendered = render(DEMO_TEMPLATE, &values).expect("renders");
        let routes: Vec<&str> = rendered.lines().filter(|l| l.trim_start().starts_with("route:")).collect();
        assert!(!routes.is_empty());
        for route in routes {
            assert!(route.contains("timeout: 0s"), "no route timeout: {route}");
            assert!(route.contains("idle_timeout: 300s"), "the stream idle timeout: {route}");
        }
        assert!(rendered.contains("allow_on_headers_stop_iteration: true"), "headers held for the body");
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
