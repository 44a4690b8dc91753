//! Secure by default, end to end through real Envoy with the template that
//! `sluice envoy-config` renders:
//!
//! - paths are normalized before the filter matches them, so no spelling of
//!   a path (dot segments, doubled or escaped slashes, percent-encoded dots)
//!   steps around a `path_prefix` policy or into a `bypass`;
//! - Envoy reaches a shim that requires mutual TLS, over HTTP/2 (ALPN h2),
//!   and an Envoy without the right client certificate does not.

use sluice_envoy_config::ShimTls;
use sluice_harness::gateway::send;
use sluice_harness::tls::Pki;
use sluice_harness::{Envoy, Redis, Shim, Stack, Upstream};

/// One request per hour under `/v42/`, except under `/v42/public/`; and one
/// per hour for `/admin`, matched case-insensitively by a regex.
const POLICY: &str = r#"{"failure_mode": "deny", "policies": [
    {"name": "partner", "match": {"path_prefix": "/v42/"}, "bypass": [{"path_prefix": "/v42/public/"}],
     "limits": [{"type": "fixed_window", "limit": 1, "window": "1h"}]},
    {"name": "admin", "match": {"path_regex": "(?i)^/admin(/|$)"},
     "limits": [{"type": "fixed_window", "limit": 1, "window": "1h"}]}
]}"#;

/// The first request under `/v42/` uses the hour's one admission; every
/// other spelling of a path under it is then refused, whether it names a
/// path under `/v42/public/` that leaves it with `..` or reaches `/v42/`
/// from outside. Before `normalize_path` and `merge_slashes`, Envoy handed
/// the filter `/v42/public/../x` and `//v42/x` as they were: the first took
/// the bypass, the second matched no prefix, and both reached the upstream
/// unlimited. An escaped slash is redirected to its unescaped form, which
/// reqwest follows, so it too ends in 429.
#[test]
fn no_spelling_of_a_path_steps_around_a_prefix_or_into_a_bypass() {
    let stack = Stack::start(POLICY).expect("starting the stack");
    let port = stack.envoy.port;
    assert_eq!(send(port, "GET", "/v42/x", &[]).expect("first").status, 200);
    for path in [
        "/v42/x",
        "//v42/x",
        "/v42//x",
        "/./v42/x",
        "/v42/./x",
        "/x/../v42/x",
        "/v42/%2e%2e/v42/x",
        "/v42/%2E%2E/v42/x",
        "/%2e/v42/x",
        "/v42/public/../x",
        "/v42/public/%2e%2e/x",
        "/v42/public/..%2fx",
        "/v42/public%2F..%2Fx",
        "/v42%2fx",
        "/v42/public/./../x",
    ] {
        let reply = send(port, "GET", path, &[]).expect("request");
        assert_eq!(reply.status, 429, "{path} was not limited: {reply:?}");
    }
    // The bypass itself still works, in any spelling that means it. Envoy
    // removes dot segments before it merges slashes, so `public//../x` is
    // `public/x`: the path the upstream is sent, and the one judged.
    for path in ["/v42/public/doc", "/v42//public/doc", "/v42/x/../public/doc", "/v42/public//../x"] {
        assert_eq!(send(port, "GET", path, &[]).expect("request").status, 200, "{path}");
    }
    // Paths are case-sensitive, as Envoy routes them; a policy that must
    // hold for any case says so with a case-insensitive regex.
    assert_eq!(send(port, "GET", "/admin", &[]).expect("request").status, 200);
    for path in ["/ADMIN", "/Admin/", "//admin", "/x/../aDmin"] {
        assert_eq!(send(port, "GET", path, &[]).expect("request").status, 429, "{path}");
    }
}

/// Envoy with the rendered `transport_socket` reaches a shim that requires
/// a client certificate: decisions are real (two admitted, then 429; a
/// failed call would be `failure_mode: deny`'s 503).
#[test]
fn envoy_reaches_a_shim_that_requires_mutual_tls() {
    let pki = Pki::generate().expect("certificates");
    let redis = Redis::start().expect("redis");
    let shim = Shim::start_with_args(
        &redis.url(),
        &[
            "--tls-cert".as_ref(),
            pki.server.cert.as_os_str(),
            "--tls-key".as_ref(),
            pki.server.key.as_os_str(),
        ]
        .into_iter()
        .chain(["--client-ca".as_ref(), pki.ca.as_os_str()])
        .collect::<Vec<_>>(),
    )
    .expect("shim with mTLS");
    let upstream = Upstream::start().expect("upstream");
    let tls = ShimTls {
        ca: pki.ca.clone(),
        client_cert: pki.client.cert.clone(),
        client_key: pki.client.key.clone(),
        server_name: Some("localhost".into()),
    };
    let policy = r#"{"failure_mode": "deny", "policies": [{"name": "p", "key": ["header:x-api-key"],
        "limits": [{"type": "sliding_window", "limit": 2, "window": "1m"}]}]}"#;
    let envoy = Envoy::start_with(
        policy,
        shim.port,
        upstream.port,
        &[("SHIM_TRANSPORT_SOCKET", tls.transport_socket())],
    )
    .expect("envoy");
    let statuses: Vec<u16> = (0..3)
        .map(|_| send(envoy.port, "GET", "/", &[("x-api-key", "alice")]).expect("request").status)
        .collect();
    assert_eq!(statuses, [200, 200, 429], "shim log:\n{}\nenvoy log:\n{}", shim.log(), envoy.log());

    // The same Envoy in cleartext, or with a certificate another CA signed,
    // is refused by the shim: every check fails, and `failure_mode: deny` answers 503.
    let stranger =
        ShimTls { client_cert: pki.stranger.cert.clone(), client_key: pki.stranger.key.clone(), ..tls };
    for values in [vec![], vec![("SHIM_TRANSPORT_SOCKET", stranger.transport_socket())]] {
        let envoy = Envoy::start_with(policy, shim.port, upstream.port, &values).expect("envoy");
        let reply = send(envoy.port, "GET", "/", &[("x-api-key", "bob")]).expect("request");
        assert_eq!(reply.status, 503, "{reply:?}");
    }
}
