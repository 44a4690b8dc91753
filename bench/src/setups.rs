//! The gateway setups of scenario 1 and the processes behind them, all
//! started once and left running side by side, so a round can visit every
//! setup in turn and drift on the machine hits them all alike.
//!
//! Every setup has the same upstream (the bench responder), the same Envoy
//! worker count, and is loaded with the same GET of a five-byte path.

use std::path::PathBuf;

use anyhow::{Context, Result};
use sluice_harness::envoy::demo_template;
use sluice_harness::{dist, workspace_root, Envoy, Redis, Service, Shim};

use crate::tools::BenchArtifacts;

/// Envoy workers in every setup: one, so each setup's filter work runs on one
/// core and the other core is left to the load tool, the shim and Redis.
pub(crate) const ENVOY_WORKERS: u16 = 1;

/// One limit in each of two policies: `/allow` can never be over its limit,
/// `/deny` is over it after its first request for an hour. `failure_mode:
/// deny` makes a shim failure show up as 503s instead of a fast allow.
const SLUICE_POLICY: &str = r#"{
  "shim": {"cluster": "sluice_shim", "timeout_ms": 1000},
  "failure_mode": "deny",
  "policies": [
    {"name": "bench-allow", "match": {"path_prefix": "/allow"}, "key": [],
     "limits": [{"type": "sliding_window", "limit": 1000000000, "window": "1s"}]},
    {"name": "bench-deny", "match": {"path_prefix": "/deny"}, "key": [],
     "limits": [{"type": "sliding_window", "limit": 1, "window": "1h"}]}
  ]
}"#;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Setup {
    Plain,
    NativeAllow,
    Floor,
    /// A diagnostic: the floor with its responder's TCP_NODELAY off, which
    /// is how `sluice serve` answers today.
    FloorNagle,
    SluiceAllow,
    NativeDeny,
    SluiceDeny,
}

impl Setup {
    pub(crate) const ALL: [Setup; 7] = [
        Setup::Plain,
        Setup::NativeAllow,
        Setup::Floor,
        Setup::FloorNagle,
        Setup::SluiceAllow,
        Setup::NativeDeny,
        Setup::SluiceDeny,
    ];

    /// The name in tables and the plot.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Setup::Plain => "(a) no filter",
            Setup::NativeAllow => "(b) native local_ratelimit, allow",
            Setup::Floor => "(c) callout floor",
            Setup::FloorNagle => "(c') callout floor, responder without TCP_NODELAY",
            Setup::SluiceAllow => "(d) Sluice, allow",
            Setup::NativeDeny => "(b') native local_ratelimit, deny",
            Setup::SluiceDeny => "(e) Sluice, deny",
        }
    }

    /// A short name for the plot's axis.
    pub(crate) fn short(self) -> &'static str {
        match self {
            Setup::Plain => "a none",
            Setup::NativeAllow => "b native",
            Setup::Floor => "c floor",
            Setup::FloorNagle => "c' floor nagle",
            Setup::SluiceAllow => "d sluice",
            Setup::NativeDeny => "b' native deny",
            Setup::SluiceDeny => "e sluice deny",
        }
    }

    /// The status every measured request should get.
    pub(crate) fn expected_status(self) -> u16 {
        match self {
            Setup::NativeDeny | Setup::SluiceDeny => 429,
            _ => 200,
        }
    }

    fn path(self) -> &'static str {
        match self {
            Setup::SluiceDeny => "/deny",
            _ => "/allow",
        }
    }
}

/// Everything scenario 1 runs, started. Fields drop in order: the Envoys
/// first, Redis last.
pub(crate) struct Rig {
    plain: Envoy,
    native_allow: Envoy,
    native_deny: Envoy,
    floor: Envoy,
    floor_nagle: Envoy,
    sluice: Envoy,
    pub(crate) shim: Shim,
    _upstream: Service,
    _floor_responder: Service,
    _nagle_responder: Service,
    pub(crate) redis: Redis,
}

impl Rig {
    pub(crate) fn start(built: &BenchArtifacts) -> Result<Rig> {
        let responder = &built.responder;
        let serve = |port: u16| vec![format!("127.0.0.1:{port}")];
        let serve_nagle = |port: u16| vec![format!("127.0.0.1:{port}"), "--nagle".to_string()];
        let redis = Redis::start()?;
        let shim = Shim::start(&redis.url())?;
        let upstream = Service::start("bench-upstream", responder, serve)?;
        let floor_responder = Service::start("bench-floor-responder", responder, serve)?;
        let nagle_responder = Service::start("bench-nagle-responder", responder, serve_nagle)?;
        let up = ("UPSTREAM_PORT", upstream.port.to_string());
        let bench_template = |name: &str| workspace_root().join("bench/envoy").join(name);
        let start = |template: PathBuf, values: &[(&str, String)]| {
            Envoy::start_template(&template, values, ENVOY_WORKERS)
                .with_context(|| format!("starting envoy with {}", template.display()))
        };
        eprintln!("bench: starting six envoys");
        let plain = start(bench_template("plain.yaml"), std::slice::from_ref(&up))?;
        let native = |tokens: &str, interval: &str| {
            let values =
                [up.clone(), ("MAX_TOKENS", tokens.to_string()), ("FILL_INTERVAL", interval.to_string())];
            start(bench_template("native.yaml"), &values)
        };
        let native_allow = native("1000000000", "1s")?;
        let native_deny = native("1", "3600s")?;
        let floor = |responder: &Service| {
            let values = [
                up.clone(),
                ("FLOOR_PORT", responder.port.to_string()),
                ("WASM_PATH", built.floor_wasm.display().to_string()),
            ];
            start(bench_template("floor.yaml"), &values)
        };
        let (floor_nagle, floor) = (floor(&nagle_responder)?, floor(&floor_responder)?);
        let sluice_values = [
            up.clone(),
            ("SHIM_PORT", shim.port.to_string()),
            ("WASM_PATH", dist("sluice.wasm")?.display().to_string()),
            ("POLICY_JSON", serde_json::to_string(SLUICE_POLICY)?),
        ];
        let sluice = start(demo_template(), &sluice_values)?;
        Ok(Rig {
            plain,
            native_allow,
            native_deny,
            floor,
            floor_nagle,
            sluice,
            shim,
            _upstream: upstream,
            _floor_responder: floor_responder,
            _nagle_responder: nagle_responder,
            redis,
        })
    }

    /// The URL that loads `setup`.
    pub(crate) fn url(&self, setup: Setup) -> String {
        let envoy = match setup {
            Setup::Plain => &self.plain,
            Setup::NativeAllow => &self.native_allow,
            Setup::NativeDeny => &self.native_deny,
            Setup::Floor => &self.floor,
            Setup::FloorNagle => &self.floor_nagle,
            Setup::SluiceAllow | Setup::SluiceDeny => &self.sluice,
        };
        format!("{}{}", envoy.url(), setup.path())
    }
}
