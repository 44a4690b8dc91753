//! Requests that meet an HTTP-face policy's every condition, for the
//! rendered wasm face's test (`envoy_rendered.rs`): a method and path (a
//! path a `path_regex` matches, sampled from the regex), the `host`, the
//! headers and query parameters, a JSON body for `body` conditions, `body:`
//! keys and `llm` policies (in the API's own shape, so the mock provider
//! answers it), and each value the key reads (a listed one under `keys`).
//! Each value the key reads carries a tag, so no two cases share a counter.

use regex_syntax::hir::{Class, Hir, HirKind};
use serde_json::{json, Value};
use sluice_harness::llm;
use sluice_policies::body::Pointer;
use sluice_policies::condition::{PathCondition, ValueCondition};
use sluice_policies::request::SimpleRequest;
use sluice_policies::{KeySource, Policy};

/// One request to send through Envoy.
#[derive(Debug, Clone)]
pub struct Built {
    pub method: String,
    /// With its query.
    pub path: String,
    /// `host` (the `:authority`) among them when the request names one.
    pub headers: Vec<(String, String)>,
    /// JSON.
    pub body: Option<String>,
}

impl Built {
    /// The request as the document's evaluation reads it.
    pub fn simple(&self) -> SimpleRequest {
        let mut req = SimpleRequest::new(&self.method, &self.path);
        for (k, v) in &self.headers {
            req = if k == "host" { req.authority(v) } else { req.header(k, v) };
        }
        if let Some(body) = &self.body {
            req = req.body(body);
        }
        req
    }
}

/// Misses one fixed condition (its first: the host, then a fixed header
/// value, then a fixed body field) when asked to, once.
struct Miss(bool);

impl Miss {
    fn take(&mut self) -> bool {
        std::mem::take(&mut self.0)
    }
}

/// A request that meets `policy` (`miss`: its first fixed condition
/// missed), with `tag` in every value its key reads.
pub fn wasm_request(policy: &Policy, miss: bool, tag: usize) -> Built {
    let m = &policy.matcher;
    let mut miss = Miss(miss);
    // Under `keys`, the policy's (single) key source takes a listed value.
    let key_value = |tagged: String| m.keys.as_ref().and_then(|k| k.first()).cloned().unwrap_or(tagged);
    let api_path = policy.llm.as_ref().and_then(|l| l.api).map(llm::path);
    let mut headers: Vec<(String, String)> = Vec::new();
    if let Some(host) = &m.host {
        let host = if miss.take() { format!("not-{host}") } else { host.clone() };
        headers.push(("host".to_string(), host));
    }
    let mut path = match &m.path {
        Some(PathCondition::Exact(p)) => p.clone(),
        Some(PathCondition::Prefix(p)) => match api_path {
            Some(api) if api.starts_with(p.as_str()) => api.to_string(),
            _ => format!("{}/t{tag}", p.trim_end_matches('/')),
        },
        Some(PathCondition::Regex(re)) => a_path_matching(re)
            .unwrap_or_else(|| panic!("{}: no path-safe sample of path_regex {re}", policy.name)),
        None => api_path.map_or_else(|| format!("/case/{tag}"), str::to_string),
    };
    for (name, cond) in &m.headers {
        let value = match cond {
            ValueCondition::Present(false) => continue,
            ValueCondition::Equals(v) if miss.take() => format!("not-{v}"),
            ValueCondition::Equals(v) => v.clone(),
            ValueCondition::Prefix(p) => format!("{p}{tag}"),
            ValueCondition::Present(true) => format!("v{tag}"),
        };
        headers.push((name.as_str().to_string(), value));
    }
    let mut query: Vec<String> = m
        .query
        .iter()
        .filter_map(|(name, cond)| match cond {
            ValueCondition::Present(false) => None,
            ValueCondition::Equals(v) => Some(format!("{name}={v}")),
            ValueCondition::Prefix(p) => Some(format!("{name}={p}{tag}")),
            ValueCondition::Present(true) => Some(format!("{name}=q{tag}")),
        })
        .collect();
    let reads_body = policy.llm.is_some()
        || !m.body.is_empty()
        || policy.key_sources().iter().any(|s| matches!(s, KeySource::Body(_)));
    let mut body = reads_body.then(|| match policy.llm.as_ref().and_then(|l| l.api) {
        Some(api) => serde_json::from_slice(&llm::request_body(api, &format!("case {tag}"), None, false))
            .unwrap_or_else(|_| json!({})),
        None => json!({}),
    });
    for (pointer, cond) in &m.body {
        let value = match cond {
            ValueCondition::Present(false) => continue,
            ValueCondition::Equals(v) if miss.take() => format!("not-{v}"),
            ValueCondition::Equals(v) => v.clone(),
            ValueCondition::Prefix(p) => format!("{p}{tag}"),
            ValueCondition::Present(true) => format!("b{tag}"),
        };
        if let Some(body) = &mut body {
            set(body, pointer, &value);
        }
    }
    for source in policy.key_sources() {
        match source {
            KeySource::Header(name) if !headers.iter().any(|(h, _)| h == name.as_str()) => {
                headers.push((name.as_str().to_string(), key_value(format!("k{tag}"))));
            }
            KeySource::Query(name) if !m.query.contains_key(name) => {
                query.push(format!("{name}={}", key_value(format!("k{tag}"))))
            }
            KeySource::Host if m.host.is_none() => {
                headers.push(("host".to_string(), key_value(format!("h{tag}.example"))))
            }
            KeySource::Body(pointer) if !m.body.contains_key(pointer) => {
                if let Some(body) = &mut body {
                    set(body, pointer, &key_value(format!("k{tag}")));
                }
            }
            _ => {}
        }
    }
    if !query.is_empty() {
        path = format!("{path}?{}", query.join("&"));
    }
    let method = m.methods.as_ref().and_then(|ms| ms.first().cloned());
    let method = method.unwrap_or_else(|| if body.is_some() { "POST" } else { "GET" }.to_string());
    let body = body.map(|b| b.to_string());
    Built { method, path, headers, body }
}

/// Sets the field at `pointer` of `doc` to the string `value`, making the
/// objects on the way.
fn set(doc: &mut Value, pointer: &Pointer, value: &str) {
    let mut at = doc;
    for segment in pointer.segments() {
        if !at.is_object() {
            *at = json!({});
        }
        let Value::Object(fields) = at else { return };
        at = fields.entry(segment).or_insert(Value::Null);
    }
    *at = json!(value);
}

/// The characters a sampled path is made of, preferred first.
const PATH_SAFE: &str = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ-_~./";

/// A path `re` matches that Envoy passes on as it is (normalized: no
/// empty, `.` or `..` segment; only unreserved characters): one sample of
/// the regex's language, each class its first path-safe character, each
/// repetition at least once, each alternation its first branch that can be
/// written; `None` when there is none such.
pub fn a_path_matching(re: &regex_lite::Regex) -> Option<String> {
    let hir = regex_syntax::Parser::new().parse(re.as_str()).ok()?;
    let mut sample = String::new();
    write_sample(&hir, &mut sample)?;
    [sample.clone(), format!("/{sample}")].into_iter().find(|p| re.is_match(p) && normalized(p))
}

fn normalized(path: &str) -> bool {
    path.starts_with('/')
        && path.chars().all(|c| PATH_SAFE.contains(c))
        && path.split('/').skip(1).all(|s| s != "." && s != "..")
        && !path[1..].split('/').any(str::is_empty)
}

fn write_sample(hir: &Hir, out: &mut String) -> Option<()> {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => {}
        HirKind::Literal(lit) => out.push_str(std::str::from_utf8(&lit.0).ok()?),
        HirKind::Class(Class::Unicode(class)) => out.push(
            PATH_SAFE.chars().find(|c| class.ranges().iter().any(|r| (r.start()..=r.end()).contains(c)))?,
        ),
        HirKind::Class(Class::Bytes(class)) => out.push(
            PATH_SAFE
                .bytes()
                .find(|b| class.ranges().iter().any(|r| (r.start()..=r.end()).contains(b)))
                .map(char::from)?,
        ),
        HirKind::Repetition(rep) => {
            let n = rep.max.map_or(rep.min.max(1), |max| rep.min.max(1).min(max));
            for _ in 0..n {
                write_sample(&rep.sub, out)?;
            }
        }
        HirKind::Capture(capture) => write_sample(&capture.sub, out)?,
        HirKind::Concat(parts) => {
            for part in parts {
                write_sample(part, out)?;
            }
        }
        HirKind::Alternation(branches) => out.push_str(&branches.iter().find_map(|b| {
            let mut s = String::new();
            write_sample(b, &mut s).map(|()| s)
        })?),
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every condition an example could name is met by the request built
    /// for it, and missed by the near miss: a `path_regex`, `body`
    /// conditions, a `keys` list, a `host`, `llm` (checked without Envoy).
    #[test]
    fn a_built_request_meets_each_kind_of_condition() {
        let doc = sluice_policies::parse(
            r#"{"policies": [
              {"name": "re", "match": {"path_regex": "^/v[0-9]+/(models|files)/[a-z]{2,}$"},
               "limits": [{"type": "interval", "every": "1s"}]},
              {"name": "body", "match": {"body": {"/model": {"equals": "m"}, "/meta/user": {"prefix": "u-"}}},
               "key": ["body:/meta/team"], "limits": [{"type": "interval", "every": "1s"}]},
              {"name": "listed", "match": {"keys": ["gold", "silver"]}, "key": ["header:x-plan"],
               "limits": [{"type": "interval", "every": "1s"}]},
              {"name": "host", "match": {"host": "api.example", "path_prefix": "/v2/"}, "key": ["query:k"],
               "limits": [{"type": "interval", "every": "1s"}]},
              {"name": "chat", "match": {"path_prefix": "/v1/chat", "methods": ["POST"]}, "key": ["header:x-team"],
               "llm": {"api": "openai_chat"},
               "limits": [{"type": "points", "capacity": 1000, "refill": "1d", "cost": "llm_tokens"}]}
            ]}"#,
        )
        .expect("a document");
        for policy in doc.policies.iter() {
            let applied = |built: &Built| -> bool {
                doc.evaluate(&built.simple())
                    .is_ok_and(|e| e.applied.iter().any(|a| a.policy.name == policy.name))
            };
            let meets = wasm_request(policy, false, 7);
            assert!(applied(&meets), "{}: {meets:?}", policy.name);
            let fixed = policy.matcher.host.is_some()
                || policy.matcher.body.values().any(|c| matches!(c, ValueCondition::Equals(_)));
            if fixed {
                let misses = wasm_request(policy, true, 8);
                assert!(!applied(&misses), "{}: {misses:?}", policy.name);
            }
        }
        let chat = wasm_request(&doc.policies[4], false, 1);
        assert_eq!((chat.method.as_str(), chat.path.as_str()), ("POST", "/v1/chat/completions"));
        let re = regex_lite::Regex::new("^/a/[^/]+/b$").expect("a regex");
        assert_eq!(a_path_matching(&re).as_deref(), Some("/a/a/b"));
        let never = regex_lite::Regex::new("^/a/[%]$").expect("a regex");
        assert_eq!(a_path_matching(&never), None, "no path-safe sample");
    }
}
