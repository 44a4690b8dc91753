//! The gateway setups of scenario 1 and the processes behind them, all
//! started once and left running side by side, so a round can visit every
//! setup in turn and drift on the machine hits them all alike.
//!
//! Every setup has the same upstream (the bench responder) and is loaded
//! with the same GET of a short path. Each setup's Envoy runs twice, once
//! with one worker and once with two ([`WORKERS`]): a [`Rig`] holds one
//! [`Envoys`] per worker count, and the shim, Redis, the responders and the
//! RLS servers are shared by both.
//!
//! The setups on Envoy's own rate-limit protocols need Sluice's gRPC face
//! (`sluice serve --grpc-listen`). When the shim in `dist/` has no such
//! flag, or the face cannot start, those setups are skipped and the report
//! says why; every other setup runs as before.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use sluice_harness::envoy::demo_template;
use sluice_harness::{dist, free_port, workspace_root, Envoy, Redis, Service, Shim};

use crate::tools::{probe, BenchArtifacts};

/// Envoy worker counts, each a full set of setups. The machine has two
/// cores: with one worker the other core is left to oha, the shim and
/// Redis; with two, Envoy competes with them.
pub(crate) const WORKERS: [u16; 2] = [1, 2];

/// One Envoy worker: scenario 7 (leased mode alone) runs with it.
pub(crate) const ENVOY_WORKERS: u16 = WORKERS[0];

/// A fixed window in each of three policies, as the peer has: `/allow` can
/// never be over its limit, `/leased` is the same window in leased mode,
/// `/deny` is over its limit after its first request for an hour.
/// `failure_mode: deny` makes a shim failure show up as 503s instead of a
/// fast allow.
const SLUICE_POLICY: &str = r#"{
  "shim": {"cluster": "sluice_shim", "timeout_ms": 1000},
  "failure_mode": "deny",
  "policies": [
    {"name": "bench-allow", "match": {"path_prefix": "/allow"}, "key": [],
     "limits": [{"type": "fixed_window", "limit": 1000000000, "window": "1h"}]},
    {"name": "bench-leased", "match": {"path_prefix": "/leased"}, "key": [],
     "leased": {"tokens": 1000, "ttl": "1h"},
     "limits": [{"type": "fixed_window", "limit": 1000000000, "window": "1h"}]},
    {"name": "bench-deny", "match": {"path_prefix": "/deny"}, "key": [],
     "limits": [{"type": "fixed_window", "limit": 1, "window": "1h"}]}
  ]
}"#;

/// How many check calls each Envoy worker keeps out in setup (d'), the
/// allow path with shared callouts (`shim.shared_calls`): checks that come
/// while they are out go together in the next call.
const SHARED_CALLS: u32 = 1;

/// The policies Sluice's gRPC faces serve (`sluice serve --policy`): the same
/// windows as the peer's, selected by the RLS descriptor `generic_key` and by
/// the RLQS bucket id `name` (`bench/envoy/rlqs.yaml`). The RLQS allow
/// bucket is leased the most tokens one assignment may carry, so that Envoy,
/// reporting every 5 s, spends a lease for longer than that at the bench's
/// rates; the deny bucket's window is spent after its first request. If
/// the face refuses the document, the setups are skipped with the shim's
/// message.
const FACE_POLICY: &str = r#"{
  "policies": [
    {"name": "bench-allow", "match": {"domain": "bench", "entries": {"generic_key": {"equals": "allow"}}}, "key": [],
     "limits": [{"type": "fixed_window", "limit": 1000000000, "window": "1h"}]},
    {"name": "bench-deny", "match": {"domain": "bench", "entries": {"generic_key": {"equals": "deny"}}}, "key": [],
     "limits": [{"type": "fixed_window", "limit": 1, "window": "1h"}]},
    {"name": "bench-allow-rlqs", "match": {"domain": "bench", "bucket": {"name": {"equals": "allow"}}},
     "leased": {"tokens": 100000, "ttl": "60s"},
     "limits": [{"type": "fixed_window", "limit": 1000000000, "window": "1h"}]},
    {"name": "bench-deny-rlqs", "match": {"domain": "bench", "bucket": {"name": {"equals": "deny"}}},
     "leased": {"tokens": 1, "ttl": "60s"},
     "limits": [{"type": "fixed_window", "limit": 1, "window": "1h"}]}
  ]
}"#;
/// The flag of `sluice serve` that starts the gRPC faces (RLS and RLQS).
const GRPC_FLAG: &str = "--grpc-listen";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Setup {
    Plain,
    NativeAllow,
    Floor,
    SluiceAllow,
    SluiceShared,
    SluiceLeased,
    RlsPeerAllow,
    RlsSluiceAllow,
    RlqsAllow,
    NativeDeny,
    DenyFloor,
    SluiceDeny,
    RlsPeerDeny,
    RlsSluiceDeny,
    RlqsDeny,
}

impl Setup {
    pub(crate) const ALL: [Setup; 15] = [
        Setup::Plain,
        Setup::NativeAllow,
        Setup::Floor,
        Setup::SluiceAllow,
        Setup::SluiceShared,
        Setup::SluiceLeased,
        Setup::RlsPeerAllow,
        Setup::RlsSluiceAllow,
        Setup::RlqsAllow,
        Setup::NativeDeny,
        Setup::DenyFloor,
        Setup::SluiceDeny,
        Setup::RlsPeerDeny,
        Setup::RlsSluiceDeny,
        Setup::RlqsDeny,
    ];

    /// The name in tables and the plot.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Setup::Plain => "(a) no filter",
            Setup::NativeAllow => "(b) native local_ratelimit, allow",
            Setup::Floor => "(c) callout floor",
            Setup::SluiceAllow => "(d) Sluice, allow",
            Setup::SluiceShared => "(d') Sluice, shared callouts, allow",
            Setup::SluiceLeased => "(d'') Sluice, leased, allow",
            Setup::RlsPeerAllow => "(g) ratelimit filter + Limitador peer, allow",
            Setup::RlsSluiceAllow => "(h) ratelimit filter + Sluice RLS, allow",
            Setup::RlqsAllow => "(j) rate_limit_quota + Sluice RLQS, allow",
            Setup::NativeDeny => "(b') native local_ratelimit, deny",
            Setup::DenyFloor => "(f) Wasm deny floor",
            Setup::SluiceDeny => "(e) Sluice, deny",
            Setup::RlsPeerDeny => "(g') ratelimit filter + Limitador peer, deny",
            Setup::RlsSluiceDeny => "(h') ratelimit filter + Sluice RLS, deny",
            Setup::RlqsDeny => "(k) rate_limit_quota + Sluice RLQS, deny",
        }
    }

    /// A short name for the plot's axis.
    pub(crate) fn short(self) -> &'static str {
        match self {
            Setup::Plain => "a none",
            Setup::NativeAllow => "b native",
            Setup::Floor => "c floor",
            Setup::SluiceAllow => "d sluice",
            Setup::SluiceShared => "d' shared",
            Setup::SluiceLeased => "d'' leased",
            Setup::RlsPeerAllow => "g limitador",
            Setup::RlsSluiceAllow => "h sluice rls",
            Setup::RlqsAllow => "j rlqs",
            Setup::NativeDeny => "b' native deny",
            Setup::DenyFloor => "f deny floor",
            Setup::SluiceDeny => "e sluice deny",
            Setup::RlsPeerDeny => "g' limitador deny",
            Setup::RlsSluiceDeny => "h' rls deny",
            Setup::RlqsDeny => "k rlqs deny",
        }
    }

    /// The status every measured request should get.
    pub(crate) fn expected_status(self) -> u16 {
        if self.denies() {
            429
        } else {
            200
        }
    }

    pub(crate) fn denies(self) -> bool {
        matches!(
            self,
            Setup::NativeDeny
                | Setup::DenyFloor
                | Setup::SluiceDeny
                | Setup::RlsPeerDeny
                | Setup::RlsSluiceDeny
                | Setup::RlqsDeny
        )
    }

    /// Needs Sluice's gRPC faces.
    fn face(self) -> bool {
        matches!(self, Setup::RlsSluiceAllow | Setup::RlsSluiceDeny | Setup::RlqsAllow | Setup::RlqsDeny)
    }

    fn path(self) -> &'static str {
        match self {
            Setup::SluiceDeny | Setup::RlsPeerDeny | Setup::RlsSluiceDeny | Setup::RlqsDeny => "/deny",
            Setup::SluiceLeased => "/leased",
            _ => "/allow",
        }
    }
}

/// One worker count's Envoys. Fields drop in order.
pub(crate) struct Envoys {
    pub(crate) workers: u16,
    plain: Envoy,
    native_allow: Envoy,
    native_deny: Envoy,
    floor: Envoy,
    deny_floor: Envoy,
    sluice: Envoy,
    /// The same policies with shared callouts on: setup (d').
    sluice_shared: Envoy,
    rls_peer: Envoy,
    /// Sluice's RLS and RLQS faces, if the shim has them.
    rls_sluice: Option<Envoy>,
    rlqs: Option<Envoy>,
}

/// Everything scenario 1 runs, started. Fields drop in order: the Envoys
/// first, Redis last.
pub(crate) struct Rig {
    pub(crate) envoys: Vec<Envoys>,
    /// Why the setups on Sluice's gRPC faces are not measured, if they are not.
    pub(crate) skipped: Option<String>,
    /// Whether the shim serves the RLQS face: rows (j) and (k).
    rlqs: bool,
    pub(crate) shim: Shim,
    _face: Option<Service>,
    _peer: Service,
    pub(crate) upstream: Service,
    pub(crate) floor_responder: Service,
    pub(crate) redis: Redis,
}

impl Rig {
    pub(crate) fn start(built: &BenchArtifacts) -> Result<Rig> {
        let responder = &built.responder;
        let serve = |port: u16| vec![format!("127.0.0.1:{port}")];
        let redis = Redis::start()?;
        let shim = Shim::start(&redis.url())?;
        let upstream = Service::start("bench-upstream", responder, serve)?;
        let floor_responder = Service::start("bench-floor-responder", responder, serve)?;
        let redis_url = redis.url();
        let peer = Service::start("bench-limitador", &built.limitador, |port| {
            vec!["--listen".into(), format!("127.0.0.1:{port}"), "--redis".into(), redis_url.clone()]
        })?;
        let (face, skipped) = match start_face(&redis.url()) {
            Ok(face) => (Some(face), None),
            Err(why) => {
                let why = format!("{why:#}");
                eprintln!("bench: skipping the setups on Sluice's RLS and RLQS faces: {why}");
                (None, Some(why))
            }
        };
        let rlqs = face.is_some() && serves_rlqs();
        if face.is_some() && !rlqs {
            eprintln!("bench: skipping the setups on Sluice's RLQS face: `sluice serve` does not serve it");
        }
        let mut envoys = Vec::new();
        for workers in WORKERS {
            eprintln!("bench: starting the envoys with {workers} worker(s)");
            let started = Envoys::start(
                built,
                workers,
                Ports {
                    upstream: upstream.port,
                    floor: floor_responder.port,
                    shim: shim.port,
                    peer: peer.port,
                },
                face.as_ref().map(|f| (f.1, rlqs)),
            )?;
            envoys.push(started);
        }
        Ok(Rig {
            envoys,
            skipped,
            rlqs,
            shim,
            _face: face.map(|f| f.0),
            _peer: peer,
            upstream,
            floor_responder,
            redis,
        })
    }

    /// The setups this rig measures: all but the faces' when they are skipped.
    pub(crate) fn setups(&self) -> Vec<Setup> {
        let rlqs = |s: &Setup| matches!(s, Setup::RlqsAllow | Setup::RlqsDeny);
        Setup::ALL
            .into_iter()
            .filter(|s| !s.face() || self.skipped.is_none())
            .filter(|s| !rlqs(s) || self.rlqs)
            .collect()
    }

    /// The URL that loads `setup` with `workers` Envoy workers.
    pub(crate) fn url(&self, workers: u16, setup: Setup) -> Result<String> {
        Ok(format!("{}{}", self.envoy(workers, setup)?.url(), setup.path()))
    }

    /// The Envoy that runs `setup` with `workers` workers.
    pub(crate) fn envoy(&self, workers: u16, setup: Setup) -> Result<&Envoy> {
        let envoys = self.envoys.iter().find(|e| e.workers == workers).context("no such worker count")?;
        let envoy = match setup {
            Setup::Plain => &envoys.plain,
            Setup::NativeAllow => &envoys.native_allow,
            Setup::NativeDeny => &envoys.native_deny,
            Setup::Floor => &envoys.floor,
            Setup::DenyFloor => &envoys.deny_floor,
            Setup::SluiceAllow | Setup::SluiceLeased | Setup::SluiceDeny => &envoys.sluice,
            Setup::SluiceShared => &envoys.sluice_shared,
            Setup::RlsPeerAllow | Setup::RlsPeerDeny => &envoys.rls_peer,
            Setup::RlsSluiceAllow | Setup::RlsSluiceDeny => {
                envoys.rls_sluice.as_ref().context("Sluice's RLS face is not running")?
            }
            Setup::RlqsAllow | Setup::RlqsDeny => {
                envoys.rlqs.as_ref().context("Sluice's RLQS face is not running")?
            }
        };
        Ok(envoy)
    }
}

struct Ports {
    upstream: u16,
    floor: u16,
    shim: u16,
    peer: u16,
}

impl Envoys {
    fn start(
        built: &BenchArtifacts,
        workers: u16,
        ports: Ports,
        face: Option<(u16, bool)>,
    ) -> Result<Envoys> {
        let up = ("UPSTREAM_PORT", ports.upstream.to_string());
        let bench_template = |name: &str| workspace_root().join("bench/envoy").join(name);
        let start = |template: PathBuf, values: &[(&str, String)]| {
            Envoy::start_template(&template, values, workers)
                .with_context(|| format!("starting envoy with {}", template.display()))
        };
        let plain = start(bench_template("plain.yaml"), std::slice::from_ref(&up))?;
        let native = |tokens: &str, interval: &str| {
            let values =
                [up.clone(), ("MAX_TOKENS", tokens.to_string()), ("FILL_INTERVAL", interval.to_string())];
            start(bench_template("native.yaml"), &values)
        };
        let native_allow = native("1000000000", "1s")?;
        let native_deny = native("1", "3600s")?;
        let floor = start(
            bench_template("floor.yaml"),
            &[
                up.clone(),
                ("FLOOR_PORT", ports.floor.to_string()),
                ("WASM_PATH", built.floor_wasm.display().to_string()),
            ],
        )?;
        let deny_floor = start(
            bench_template("deny-floor.yaml"),
            &[up.clone(), ("WASM_PATH", built.deny_floor_wasm.display().to_string())],
        )?;
        let sluice_with = |policy: &str| -> Result<Envoy> {
            let values = [
                up.clone(),
                ("SHIM_PORT", ports.shim.to_string()),
                ("WASM_PATH", dist("sluice.wasm")?.display().to_string()),
                ("POLICY_JSON", serde_json::to_string(policy)?),
            ];
            start(demo_template(), &values)
        };
        let sluice = sluice_with(SLUICE_POLICY)?;
        let sluice_shared = sluice_with(&shared_policy()?)?;
        let rls = |port: u16, template: &str| {
            start(bench_template(template), &[up.clone(), ("RLS_PORT", port.to_string())])
        };
        let rls_peer = rls(ports.peer, "rls.yaml")?;
        let (rls_sluice, rlqs) = match face {
            Some((port, serves_rlqs)) => {
                let rlqs = if serves_rlqs { Some(rls(port, "rlqs.yaml")?) } else { None };
                (Some(rls(port, "rls.yaml")?), rlqs)
            }
            None => (None, None),
        };
        Ok(Envoys {
            workers,
            plain,
            native_allow,
            native_deny,
            floor,
            deny_floor,
            sluice,
            sluice_shared,
            rls_peer,
            rls_sluice,
            rlqs,
        })
    }
}

/// [`SLUICE_POLICY`] with `shim.shared_calls` set to [`SHARED_CALLS`].
fn shared_policy() -> Result<String> {
    let mut doc: serde_json::Value = serde_json::from_str(SLUICE_POLICY)?;
    doc["shim"]["shared_calls"] = SHARED_CALLS.into();
    Ok(doc.to_string())
}

/// Whether `dist/sluice` serves the RLQS face too (its `--grpc-listen`
/// names it); without it, rows (j) and (k) are skipped, not measured
/// against a server that answers UNIMPLEMENTED.
fn serves_rlqs() -> bool {
    let Ok(sluice) = dist("sluice") else { return false };
    probe(std::process::Command::new(&sluice).args(["serve", "--help"]))
        .is_some_and(|help| help.contains("RLQS"))
}

/// A second `sluice serve` with its gRPC faces on, serving [`FACE_POLICY`];
/// the process and its gRPC port. An error says why it could not start.
fn start_face(redis_url: &str) -> Result<(Service, u16)> {
    let sluice = dist("sluice")?;
    let help = probe(std::process::Command::new(&sluice).args(["serve", "--help"])).unwrap_or_default();
    if !help.contains(GRPC_FLAG) {
        bail!("`sluice serve` in dist/ has no {GRPC_FLAG} flag (Sluice's RLS and RLQS faces are not in this build)");
    }
    let dir = workspace_root().join("target/bench-face");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let policy = dir.join("policy.json");
    std::fs::write(&policy, FACE_POLICY).with_context(|| format!("writing {}", policy.display()))?;
    let grpc = free_port()?;
    let redis_url = redis_url.to_string();
    let face = Service::start("bench-sluice-face", &sluice, |port| {
        vec![
            "serve".into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--redis".into(),
            redis_url.clone(),
            GRPC_FLAG.into(),
            format!("127.0.0.1:{grpc}"),
            "--policy".into(),
            policy.display().to_string(),
        ]
    })
    .context("starting `sluice serve` with its gRPC faces and the bench's face policy")?;
    Ok((face, grpc))
}
