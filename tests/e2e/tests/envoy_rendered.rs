//! Rendered configurations are part of the face. The RLS face's and the
//! Sluice filter's (wasm) tests are at the end: every example each serves
//! (for RLS, also the imported peers' configurations; for wasm, every
//! example with HTTP-face policies, `sluice envoy-config --face wasm`'s
//! output run as printed), each request charged to the policies the
//! document names.
//!
//! RLQS: every example in
//! `policies/examples/` that the RLQS face can serve, rendered as `sluice
//! envoy-config --face rlqs` renders it (the harness renders through the
//! same crate), run through real Envoy's `rate_limit_quota` filter and the
//! shim: each request is charged to the policy the document names for it,
//! in document order, and a request no policy takes (no header, a near
//! miss) to none.
//!
//! The document's rule for a request: its bucket id holds, for each key a
//! policy reads, the request header of that name; the first RLQS-face
//! policy that applies to that id governs it (`sluice_policies::rlqs::govern`).
//! Envoy's reports tell which policy each request was charged to
//! (`sluice_decisions_total{policy, face="rlqs"}`: each request of a
//! leased window, each new bucket of an `unlimited` policy).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice_harness::gateway::{eventually, prometheus, sample, send, send_body};
use sluice_harness::llm::LlmUpstream;
use sluice_harness::shim::GrpcShim;
use sluice_harness::{Envoy, Redis, Shim, Upstream};
use sluice_policies::condition::ValueCondition;
use sluice_policies::plan::{plan, Descriptor};
use sluice_policies::request::SimpleRequest;
use sluice_policies::rlqs::{govern, Governed};
use sluice_policies::tree::StepValue;
use sluice_policies::{Document, Face, KeySource, Policy};

mod rendered;

use rendered::{wasm_request, Built};

const DEADLINE: Duration = Duration::from_secs(60);
/// How long a leased policy's requests may take to reach a lease: its key
/// turns hot after about `tokens` requests at one worker (`leased-per-key`:
/// 50), a request at a time.
const LEASE_DEADLINE: Duration = Duration::from_secs(300);
/// Requests sent per case.
const EACH: u64 = 3;

/// The examples the RLQS face can serve: those it renders.
fn rlqs_examples() -> Vec<(String, String, Document)> {
    let dir = sluice_harness::paths::workspace_root().join("policies/examples");
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir).expect("examples").flatten().map(|e| e.path()).collect();
    files.sort();
    for path in files.into_iter().filter(|p| p.extension().is_some_and(|e| e == "json")) {
        let json = std::fs::read_to_string(&path).expect("an example");
        let doc = sluice_policies::parse(&json).expect("a valid example");
        if sluice_envoy_config::rlqs::rlqs_values(&doc).is_ok() {
            let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            out.push((name, json, doc));
        }
    }
    out
}

fn rlqs_policies(doc: &Document) -> Vec<&Policy> {
    doc.policies.iter().filter(|p| p.matcher.face() == Face::Rlqs).collect()
}

/// Each bucket key `policy` reads, with its condition (none: a `bucket:NAME` key).
fn reads(policy: &Policy) -> Vec<(String, Option<ValueCondition>)> {
    let mut reads: Vec<(String, Option<ValueCondition>)> =
        policy.matcher.bucket.iter().map(|(k, c)| (k.clone(), Some(c.clone()))).collect();
    for key in &policy.key {
        if let KeySource::Bucket(name) = key {
            if !policy.matcher.bucket.contains_key(name.as_str()) {
                reads.push((name.as_str().to_string(), None));
            }
        }
    }
    reads
}

/// Requests to try, as header sets: one that meets each policy, one that
/// just misses each (an `equals` or `prefix` key another value), one with
/// every header of every policy, and one with none.
fn cases(doc: &Document) -> Vec<Vec<(String, String)>> {
    let meets = |policy: &Policy, miss: bool| -> Vec<(String, String)> {
        let mut headers = Vec::new();
        let mut missed = false;
        for (key, condition) in reads(policy) {
            let value = match condition {
                Some(ValueCondition::Present(false)) => continue,
                Some(ValueCondition::Equals(v)) if miss && !missed => {
                    missed = true;
                    format!("not-{v}")
                }
                Some(ValueCondition::Equals(v)) => v,
                Some(ValueCondition::Prefix(p)) if miss && !missed && !p.is_empty() => {
                    missed = true;
                    format!("x{p}")
                }
                Some(ValueCondition::Prefix(p)) => format!("{p}-1"),
                _ => format!("{}-1", policy.name),
            };
            headers.push((key, value));
        }
        headers
    };
    let policies = rlqs_policies(doc);
    let mut cases: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for p in &policies {
        cases.push(meets(p, false));
        cases.push(meets(p, true));
    }
    let mut all: BTreeMap<String, String> = BTreeMap::new();
    for p in policies.iter().rev() {
        all.extend(meets(p, false));
    }
    cases.push(all.into_iter().collect());
    cases.dedup();
    cases
}

/// What the document does with a request with `headers` (its bucket id
/// holds each header a policy reads): the governing policy's name, and
/// how many the shim counts for it for `n` such requests. A leased
/// window counts each request Envoy reports; an `unlimited` policy each
/// new bucket once (`seen`: the buckets counted so far), a missing key
/// nothing.
fn governing(
    doc: &Document,
    domain: &str,
    headers: &[(String, String)],
    n: u64,
    seen: &mut Vec<(String, Vec<(String, String)>)>,
) -> Option<(String, u64)> {
    let mut req = SimpleRequest::default().domain(domain);
    for (k, v) in headers {
        req = req.bucket(k, v);
    }
    match govern(doc, &req).0 {
        Governed::Unmatched => None,
        Governed::MissingKey { policy } => Some((policy, 0)),
        Governed::Leased(window) => Some((window.policy, n)),
        Governed::Unlimited { policy } => {
            let reads =
                doc.policies.iter().find(|p| p.name.as_str() == policy).map(reads).unwrap_or_default();
            let id: Vec<(String, String)> =
                headers.iter().filter(|(k, _)| reads.iter().any(|(r, _)| r == k)).cloned().collect();
            let new = !seen.contains(&(policy.clone(), id.clone()));
            if new {
                seen.push((policy.clone(), id));
            }
            Some((policy, u64::from(new)))
        }
    }
}

/// What the shim counted for each policy (every result), and the
/// buckets no policy matched.
fn charged(shim: &GrpcShim, names: &[String]) -> (BTreeMap<String, u64>, u64) {
    let page = shim.metrics().expect("metrics");
    let counts = names
        .iter()
        .map(|name| {
            let n: f64 = ["allowed", "denied", "unlimited"]
                .iter()
                .map(|r| {
                    sample(
                        &page,
                        &format!(r#"sluice_decisions_total{{policy="{name}",result="{r}",face="rlqs"}}"#),
                    )
                })
                .sum();
            (name.clone(), n as u64)
        })
        .collect();
    (counts, sample(&page, r#"sluice_unmatched_descriptors_total{face="rlqs"}"#) as u64)
}

/// Polls until `want` holds of the counts; the counts then.
fn until_charged(
    shim: &GrpcShim,
    names: &[String],
    want: impl Fn(&BTreeMap<String, u64>) -> bool,
) -> (BTreeMap<String, u64>, u64) {
    let start = Instant::now();
    loop {
        let now = charged(shim, names);
        if want(&now.0) {
            return now;
        }
        assert!(start.elapsed() < DEADLINE, "not charged as expected in {DEADLINE:?}: {now:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Regression: `--face rlqs` rendered a policy whose bucket keys are all
/// `equals` as a matcher of every request, so a request without the
/// example's `client` header was charged to its unlimited `internal` tier.
#[test]
fn each_examples_requests_are_charged_to_the_policy_the_document_names() {
    let examples = rlqs_examples();
    assert!(examples.iter().any(|(name, _, _)| name == "rlqs-quota"), "the RLQS example is served");
    for (name, json, doc) in &examples {
        let redis = Redis::start().expect("redis");
        let upstream = Upstream::start().expect("upstream");
        let shim = GrpcShim::start(&redis.url(), json).expect("shim");
        let envoy = Envoy::start_rlqs(json, shim.grpc_port, upstream.port, json!({})).expect("envoy");
        let domain = rlqs_policies(doc)
            .iter()
            .find_map(|p| p.matcher.domain.clone())
            .unwrap_or_else(|| sluice_envoy_config::rls::DEFAULT_DOMAIN.to_string());
        let names: Vec<String> = rlqs_policies(doc).iter().map(|p| p.name.as_str().to_string()).collect();
        let cases = cases(doc);
        // A request the document charges to a leased window, sent after
        // each case the shim counts nothing for: once its charge shows,
        // the case's would have.
        let probe = cases
            .iter()
            .find(|c| governing(doc, &domain, c, 1, &mut Vec::new()).is_some_and(|(_, n)| n == 1))
            .cloned()
            .expect("a case a leased policy takes");
        let send_all = |headers: &[(String, String)], n: u64| {
            let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            for _ in 0..n {
                let status = send(envoy.port, "GET", "/api", &headers).expect("request").status;
                assert_ne!(status, 500, "{name}: {headers:?}");
            }
        };
        let mut seen = Vec::new();
        let (mut before, unmatched) = charged(&shim, &names);
        for case in &cases {
            let expected = governing(doc, &domain, case, EACH, &mut seen);
            send_all(case, EACH);
            let mut expected_after = before.clone();
            if let Some((policy, n)) = &expected {
                *expected_after.entry(policy.clone()).or_default() += n;
            }
            if expected.as_ref().is_none_or(|(_, n)| *n == 0) {
                send_all(&probe, 1);
                let (policy, n) = governing(doc, &domain, &probe, 1, &mut seen).expect("the probe's policy");
                *expected_after.entry(policy).or_default() += n;
            }
            let (after, unmatched_now) = until_charged(&shim, &names, |c| {
                expected_after.iter().all(|(p, n)| c.get(p).copied().unwrap_or(0) >= *n)
            });
            assert_eq!(after, expected_after, "{name}: a request with {case:?} is charged to {expected:?}");
            assert_eq!(unmatched_now, unmatched, "{name}: no bucket Envoy builds is unmatched ({case:?})");
            eprintln!("{name}: {case:?} -> {expected:?}");
            before = after;
        }
    }
}

/// The RLS face's documents: the examples it renders, and the peers'
/// configurations as `sluice import` converts them (a team switching runs
/// `sluice envoy-config --face rls` on what it printed).
fn rls_documents() -> Vec<(String, String, Document)> {
    let root = sluice_harness::paths::workspace_root();
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(root.join("policies/examples"))
        .expect("examples")
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    for path in files.into_iter().filter(|p| p.extension().is_some_and(|e| e == "json")) {
        let json = std::fs::read_to_string(&path).expect("an example");
        let doc = sluice_policies::parse(&json).expect("a valid example");
        if sluice_envoy_config::rls::rls_values(&doc).is_ok() {
            let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            out.push((name, json, doc));
        }
    }
    let sluice = sluice_harness::paths::dist("sluice").expect("dist/sluice");
    for file in ["mixed.yaml", "limitador/examples.yaml"] {
        let path = root.join("host-shim/tests/fixtures/import").join(file);
        let out_ = std::process::Command::new(&sluice)
            .args(["import", "--accept-losses"])
            .arg(&path)
            .output()
            .expect("sluice import");
        assert!(out_.status.success(), "{file}: {}", String::from_utf8_lossy(&out_.stderr));
        let json = String::from_utf8(out_.stdout).expect("utf-8");
        let doc = sluice_policies::parse(&json).expect("an imported document");
        out.push((file.to_string(), json, doc));
    }
    out
}

fn rls_policies(doc: &Document) -> Vec<&Policy> {
    doc.policies.iter().filter(|p| p.matcher.face() == Face::Rls).collect()
}

/// The entries `policy` reads, in order (a tree node's path; else its
/// `entries`, then the entries only its key reads, which are optional),
/// each with the value a request must carry to meet it (`None`: any value)
/// and whether it is optional.
fn rls_reads(policy: &Policy) -> Vec<(String, Option<String>, bool)> {
    let mut reads: Vec<(String, Option<String>, bool)> = match &policy.matcher.descriptor_tree {
        Some(path) => path
            .iter()
            .map(|step| match &step.value {
                StepValue::Exact(v) => (step.key.clone(), Some(v.clone()), false),
                StepValue::Wildcard(w) => (step.key.clone(), Some(w.replace('*', "x")), false),
                StepValue::Any => (step.key.clone(), None, false),
            })
            .collect(),
        None => policy
            .matcher
            .entries
            .iter()
            .filter_map(|(k, c)| match c {
                ValueCondition::Present(false) => None,
                ValueCondition::Equals(v) => Some((k.clone(), Some(v.clone()), false)),
                ValueCondition::Prefix(p) => Some((k.clone(), Some(format!("{p}-1")), false)),
                _ => Some((k.clone(), None, false)),
            })
            .collect(),
    };
    for key in &policy.key {
        if let KeySource::Entry(name) = key {
            if !reads.iter().any(|(k, _, _)| k == name) && !policy.matcher.entries.contains_key(name) {
                reads.push((name.clone(), None, true));
            }
        }
    }
    reads
}

/// The descriptors the document asks Envoy for (docs/rls.md, "Pointing
/// Envoy at it"), each as the entries it reads (key, `generic_key`'s
/// value, optional): one shared by the policies of each
/// `descriptor_index` (every entry optional), then one per other policy in
/// document order; each distinct list once.
fn rls_descriptors(doc: &Document) -> Vec<Vec<(String, Option<String>, bool)>> {
    let generic = |(k, v, optional): (String, Option<String>, bool)| {
        let v = if k == "generic_key" { v } else { None };
        (k, v, optional)
    };
    let policies = rls_policies(doc);
    let mut indexes: Vec<usize> = policies.iter().filter_map(|p| p.matcher.descriptor_index).collect();
    indexes.sort_unstable();
    indexes.dedup();
    let mut out: Vec<Vec<(String, Option<String>, bool)>> = Vec::new();
    for n in indexes {
        let mut entries = Vec::new();
        for p in policies.iter().filter(|p| p.matcher.descriptor_index == Some(n)) {
            for (k, v, _) in rls_reads(p).into_iter().map(generic) {
                if !entries.iter().any(|(e, w, _): &(String, Option<String>, bool)| *e == k && *w == v) {
                    entries.push((k, v, true));
                }
            }
        }
        out.push(entries);
    }
    for p in policies.iter().filter(|p| p.matcher.descriptor_index.is_none()) {
        out.push(rls_reads(p).into_iter().map(generic).collect());
    }
    out.retain(|d| !d.is_empty());
    let mut seen = Vec::new();
    out.retain(|d| {
        let new = !seen.contains(d);
        seen.push(d.clone());
        new
    });
    out
}

/// Requests to try, as header sets: one that meets each policy, one that
/// just misses each (a fixed value another), one with every header, and
/// one with none. `generic_key` is Envoy's constant, never a header.
fn rls_cases(doc: &Document) -> Vec<Vec<(String, String)>> {
    let meets = |policy: &Policy, miss: bool| -> Vec<(String, String)> {
        let mut missed = false;
        rls_reads(policy)
            .into_iter()
            .filter(|(k, _, _)| k != "generic_key")
            .map(|(k, v, _)| match v {
                Some(v) if miss && !missed => {
                    missed = true;
                    (k, format!("not-{v}"))
                }
                Some(v) => (k, v),
                None => (k.clone(), format!("{}-1", policy.name)),
            })
            .collect()
    };
    let policies = rls_policies(doc);
    let mut cases: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for p in &policies {
        cases.push(meets(p, false));
        cases.push(meets(p, true));
    }
    let mut all: BTreeMap<String, String> = BTreeMap::new();
    for p in policies.iter().rev() {
        all.extend(meets(p, false));
    }
    cases.push(all.into_iter().collect());
    cases.dedup();
    cases
}

/// What the document charges for a request with `headers`: the
/// descriptors it names ([`rls_descriptors`], each from the request's
/// headers, sent when every entry not optional is there, empty when no
/// entry is), planned as the face plans them. The names of every policy
/// the plan decides (checked, shadow, `unlimited`, `blocked`).
fn rls_charged_by_document(doc: &Document, headers: &[(String, String)]) -> Vec<String> {
    let domain = rls_policies(doc)
        .iter()
        .find_map(|p| p.matcher.domain.clone())
        .unwrap_or_else(|| sluice_envoy_config::rls::DEFAULT_DOMAIN.to_string());
    let mut sent: Vec<Vec<(String, String)>> = Vec::new();
    for descriptor in rls_descriptors(doc) {
        let mut entries = Vec::new();
        let mut whole = true;
        for (k, generic, optional) in descriptor {
            match (generic, headers.iter().find(|(h, _)| *h == k)) {
                (Some(v), _) => entries.push((k, v)),
                (None, Some((_, value))) => entries.push((k, value.clone())),
                (None, None) => whole &= optional,
            }
        }
        // Envoy sends a descriptor whose every entry was skipped, empty.
        if whole {
            sent.push(entries);
        }
    }
    if sent.is_empty() {
        return Vec::new();
    }
    let descriptors: Vec<Descriptor> = sent
        .iter()
        .enumerate()
        .map(|(i, entries)| {
            let mut request = SimpleRequest::default().domain(&domain).index(i);
            for (k, v) in entries {
                request = request.entry(k, v);
            }
            Descriptor { request, hits: 1 }
        })
        .collect();
    let plan = plan(doc, &descriptors).expect("a plan");
    let mut names: Vec<String> = Vec::new();
    for d in &plan.descriptors {
        let checked = d
            .enforced
            .iter()
            .filter_map(|&i| plan.enforced.policies.get(i))
            .chain(d.shadow.iter().filter_map(|&i| plan.shadow.policies.get(i)));
        // A missing key refuses without a decision to count.
        for p in checked.chain(&d.unlimited).chain(&d.blocked) {
            names.push(p.name.as_str().to_string());
        }
    }
    names.sort();
    names.dedup();
    names
}

/// The policies whose RLS-face decisions moved between two metrics pages.
fn rls_moved(before: &str, after: &str, names: &[String]) -> Vec<String> {
    let count = |page: &str, name: &str| -> f64 {
        ["allowed", "denied", "unlimited", "error", "invalid"]
            .iter()
            .map(|r| {
                sample(page, &format!(r#"sluice_decisions_total{{policy="{name}",result="{r}",face="rls"}}"#))
            })
            .sum()
    };
    names.iter().filter(|n| count(after, n) > count(before, n)).cloned().collect()
}

/// `sluice envoy-config --face rls`, run as rendered (the harness renders
/// through the same crate) for every example the face serves and for the
/// peers' imported configurations: each request is charged to exactly the
/// policies the document names for it.
#[test]
fn each_rls_documents_requests_are_charged_to_the_policies_it_names() {
    let documents = rls_documents();
    for (name, json, doc) in &documents {
        let redis = Redis::start().expect("redis");
        let upstream = Upstream::start().expect("upstream");
        let shim = GrpcShim::start(&redis.url(), json).expect("shim");
        let envoy = Envoy::start_rls(json, shim.grpc_port, upstream.port).expect("envoy");
        let names: Vec<String> = rls_policies(doc).iter().map(|p| p.name.as_str().to_string()).collect();
        for case in rls_cases(doc) {
            let want = rls_charged_by_document(doc, &case);
            let before = shim.metrics().expect("metrics");
            let headers: Vec<(&str, &str)> = case.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let status = send(envoy.port, "GET", "/api", &headers).expect("request").status;
            assert_ne!(status, 500, "{name}: {headers:?}");
            let mut got = rls_moved(&before, &shim.metrics().expect("metrics"), &names);
            got.sort();
            assert_eq!(got, want, "{name}: a request with {case:?}");
            eprintln!("{name}: {case:?} -> {want:?}");
        }
    }
}

/// `sluice envoy-config --face wasm --policy EXAMPLE`: its output, run as
/// it is by Envoy.
fn rendered_wasm(example: &Path, shim_port: u16, upstream_port: u16) -> Envoy {
    let sluice = sluice_harness::dist("sluice").expect("dist/sluice");
    let wasm = sluice_harness::dist("sluice.wasm").expect("dist/sluice.wasm");
    let local = |port: u16| format!("127.0.0.1:{port}");
    Envoy::start_rendered(|port, admin_port| {
        let out = Command::new(&sluice)
            .args(["envoy-config", "--face", "wasm", "--policy"])
            .arg(example)
            .arg("--wasm")
            .arg(&wasm)
            .args(["--shim", &local(shim_port), "--listen", &local(port)])
            .args(["--upstream", &local(upstream_port), "--admin", &local(admin_port)])
            .output()?;
        anyhow::ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8(out.stdout)?)
    })
    .expect("envoy from the rendered configuration")
}

/// The shim's decisions for the checks named `name`, every result of the
/// filter's face.
fn shim_decisions(page: &str, name: &str) -> f64 {
    ["allowed", "waited", "denied", "error", "invalid"]
        .iter()
        .map(|r| {
            sample(page, &format!(r#"sluice_decisions_total{{policy="{name}",result="{r}",face="filter"}}"#))
        })
        .sum()
}

/// The filter's per-policy stat `stat` of `policy` in Envoy's page.
fn filter_stat(page: &str, stat: &str, policy: &str) -> f64 {
    sample(page, &format!(r#"sluice_{stat}{{policy="{policy}"}}"#))
}

/// The filter's stats that say a request was refused or let through
/// undecided.
const UNDECIDED: [&str; 6] =
    ["denied", "cache_denied", "shed", "paused_denied", "failure_allowed", "failure_denied"];

/// One example's gateway, and what its requests did.
struct Gateway<'a> {
    doc: &'a Document,
    http: Vec<&'a Policy>,
    shim: Shim,
    envoy: Envoy,
    /// The shim's and Envoy's metrics after the last request.
    pages: (String, String),
    tally: Tally,
}

#[derive(Default, Debug)]
struct Tally {
    compared: usize,
    /// Admitted requests whose charges were compared, per policy.
    charged: BTreeMap<String, usize>,
    /// Requests served from a lease, per policy.
    leased: BTreeMap<String, usize>,
    /// Responses whose LLM tokens were charged, per policy.
    settled: BTreeMap<String, usize>,
    /// Refused, or let through by `failure_mode` undecided: not compared.
    undecided: usize,
}

impl Gateway<'_> {
    fn pages(&self) -> (String, String) {
        (self.shim.metrics().expect("shim metrics"), prometheus(&self.envoy).expect("envoy stats"))
    }

    /// The policies whose `stat` moved between two Envoy pages.
    fn moved(&self, stat: &str, before: &str, after: &str) -> Vec<String> {
        let names = self.http.iter().map(|p| p.name.as_str().to_string());
        names.filter(|n| filter_stat(after, stat, n) > filter_stat(before, stat, n)).collect()
    }

    /// Sends `req` and compares where it was charged with what the document
    /// says: the filter's `allowed` of exactly the policies that apply to
    /// it, and the shim's decisions (a lease's token, for a request served
    /// from one) of exactly their checks' names (a shared budget's). An
    /// `llm` policy's response is then charged to that policy. Whether it
    /// was served from a lease.
    fn drive(&mut self, name: &str, req: &Built) -> bool {
        let applied: Vec<&Policy> = match self.doc.evaluate(&req.simple()) {
            Ok(e) => e.applied.iter().map(|a| a.policy).collect(),
            Err(_) => Vec::new(),
        };
        let mut want: Vec<String> = applied.iter().map(|p| p.name.as_str().to_string()).collect();
        let mut want_charged: Vec<String> = applied.iter().map(|p| p.state_name().to_string()).collect();
        let headers: Vec<(&str, &str)> = req.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let status = send_body(
            self.envoy.port,
            &req.method,
            &req.path,
            &headers,
            req.body.as_ref().map(String::as_bytes),
        )
        .expect("request")
        .status;
        let now = self.pages();
        let before = std::mem::replace(&mut self.pages, now);
        let after = &self.pages;
        let undecided = UNDECIDED.iter().any(|s| !self.moved(s, &before.1, &after.1).is_empty());
        if status == 429 || undecided {
            self.tally.undecided += 1;
            return false;
        }
        let got = self.moved("allowed", &before.1, &after.1);
        let leased = self.moved("leased", &before.1, &after.1);
        let mut got_charged: Vec<String> = self
            .http
            .iter()
            .map(|p| p.state_name().to_string())
            .filter(|n| shim_decisions(&after.0, n) > shim_decisions(&before.0, n))
            .chain(
                self.http
                    .iter()
                    .filter(|p| leased.iter().any(|l| l == p.name.as_str()))
                    .map(|p| p.state_name().to_string()),
            )
            .collect();
        for list in [&mut want, &mut want_charged, &mut got_charged] {
            list.sort();
            list.dedup();
        }
        assert_eq!(
            (&got, &got_charged),
            (&want, &want_charged),
            "{name}: {req:?} ({status}): (filter, shim)"
        );
        self.tally.compared += 1;
        for p in &want {
            *self.tally.charged.entry(p.clone()).or_default() += 1;
        }
        for p in &leased {
            *self.tally.leased.entry(p.clone()).or_default() += 1;
        }
        let llm: Vec<&str> = applied.iter().filter(|p| p.llm.is_some()).map(|p| p.name.as_str()).collect();
        if !llm.is_empty() && status == 200 {
            let before = before.1.clone();
            let charged = |page: &str| self.moved("llm_tokens_charged", &before, page);
            let settled =
                eventually(DEADLINE, || charged(&prometheus(&self.envoy).unwrap_or_default()) == llm);
            let page = prometheus(&self.envoy).expect("envoy stats");
            assert!(settled, "{name}: {req:?}: tokens charged to {:?}, not {llm:?}", charged(&page));
            for p in llm {
                *self.tally.settled.entry(p.to_string()).or_default() += 1;
            }
            self.pages = self.pages();
        }
        !leased.is_empty()
    }
}

/// `sluice envoy-config --face wasm`, its output run as it is, for every
/// example in `policies/examples/` with HTTP-face policies: for each policy
/// a request that meets it and one that just misses it (`rendered`), and
/// for a `leased` policy more of the first until one is served from a
/// lease. Each admitted request must be counted by the filter for exactly
/// the policies the document applies to it (`Document::evaluate`: Envoy's
/// `sluice_allowed{policy}`) and charged to exactly their checks' names (a
/// shared budget's): the shim's `sluice_decisions_total{policy,
/// face="filter"}`, or for a request served from a lease, the filter's
/// `sluice_leased{policy}`, whose token the shim charged to that policy's
/// window at the grant. An `llm` policy's answer (from the mock provider)
/// is then charged to that policy (`sluice_llm_tokens_charged{policy}`).
/// `shed` and `upstream` policies are decided per request by the shim like
/// any other; a request refused (429, or a shed, a pause, the over-limit
/// cache) or let through by `failure_mode` undecided is not compared, and
/// counted apart. Every HTTP-face policy of every example must be charged
/// at least once, every `leased` one from a lease, every `llm` one settled.
#[test]
fn each_wasm_examples_requests_are_charged_to_the_policies_it_names() {
    let dir = sluice_harness::paths::workspace_root().join("policies/examples");
    let mut files: Vec<_> = std::fs::read_dir(&dir).expect("examples").flatten().map(|e| e.path()).collect();
    files.sort();
    let mut served = Vec::new();
    let mut all = Tally::default();
    for path in files.into_iter().filter(|p| p.extension().is_some_and(|e| e == "json")) {
        let json = std::fs::read_to_string(&path).expect("an example");
        let doc = sluice_policies::parse(&json).expect("a valid example");
        let http: Vec<&Policy> = doc.policies.iter().filter(|p| p.matcher.face() == Face::Http).collect();
        if http.is_empty() {
            continue;
        }
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let redis = Redis::start().expect("redis");
        let shim = Shim::start(&redis.url()).expect("shim");
        // An LLM-shaped provider where a policy reads its answers.
        let (_plain, _llm, upstream_port) = if http.iter().any(|p| p.llm.is_some()) {
            let llm = LlmUpstream::start().expect("mock LLM provider");
            let port = llm.port;
            (None, Some(llm), port)
        } else {
            let upstream = Upstream::start().expect("upstream");
            let port = upstream.port;
            (Some(upstream), None, port)
        };
        let envoy = rendered_wasm(&path, shim.port, upstream_port);
        let mut gateway = Gateway {
            doc: &doc,
            http: http.clone(),
            shim,
            envoy,
            pages: Default::default(),
            tally: Tally::default(),
        };
        gateway.pages = gateway.pages();
        let mut tag = 0;
        for p in &http {
            for miss in [false, true] {
                tag += 1;
                let req = wasm_request(p, miss, tag);
                if !miss {
                    let applies = doc
                        .evaluate(&req.simple())
                        .is_ok_and(|e| e.applied.iter().any(|a| a.policy.name == p.name));
                    assert!(applies, "{name}: the request built for {} does not meet it: {req:?}", p.name);
                }
                gateway.drive(&name, &req);
            }
            if p.leased.is_some() {
                // Its key turns hot and a lease is granted: one of these is
                // served from the lease.
                tag += 1;
                let req = wasm_request(p, false, tag);
                let start = Instant::now();
                while !gateway.drive(&name, &req) {
                    assert!(
                        start.elapsed() < LEASE_DEADLINE,
                        "{name}: no request of {} served from a lease in {LEASE_DEADLINE:?}: {:?}",
                        p.name,
                        gateway.tally
                    );
                }
            }
        }
        eprintln!("{name}: {:?}", gateway.tally);
        for p in &http {
            let n = p.name.as_str();
            assert!(
                gateway.tally.charged.get(n).is_some_and(|&c| c > 0),
                "{name}: nothing charged to {n}: {:?}",
                gateway.tally
            );
            assert!(
                p.llm.is_none() || gateway.tally.settled.contains_key(n),
                "{name}: no answer of {n} settled"
            );
        }
        all.compared += gateway.tally.compared;
        all.undecided += gateway.tally.undecided;
        all.leased.extend(gateway.tally.leased.iter().map(|(k, v)| (format!("{name}/{k}"), *v)));
        served.push(name);
    }
    eprintln!(
        "served {} examples {served:?}: {} requests compared, {} refused or undecided; from leases {:?}",
        served.len(),
        all.compared,
        all.undecided,
        all.leased
    );
    assert!(served.len() >= 21, "every example with HTTP-face policies: {served:?}");
}
