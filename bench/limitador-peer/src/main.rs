//! The bench's RLS peer: Envoy's Rate Limit Service v3
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) served
//! by the `limitador` crate, the engine of Limitador, with its Redis
//! storage (`AsyncRedisStorage`: every check is one script call in Redis,
//! as Limitador's `redis` storage does it). Benchmark only.
//!
//! ```text
//! sluice-bench-limitador --listen 127.0.0.1:PORT --redis redis://127.0.0.1:PORT [--limits FILE]
//!                        [--rate-limit-headers DRAFT_VERSION_03]
//! ```
//!
//! With `--limits`, it serves the limits of a Limitador limits file (YAML,
//! read by the crate's own `Limit` deserializer): the RLS face's tests use
//! it as a reference for Limitador's rules. Without, it knows the bench's
//! two limits, in the domain `bench`: a fixed window
//! of 10^9 an hour for the descriptor `generic_key=allow` (never hit) and
//! one of 1 an hour for `generic_key=deny` (over it after the first
//! request), the same windows Sluice's setups use. A request's descriptors
//! are bound as Limitador's server binds them, `descriptors[i][key] =
//! value`; the answer is `OVER_LIMIT` when a limit that applies is over, else
//! `OK`, with one status per descriptor. With `--rate-limit-headers
//! DRAFT_VERSION_03`, as Limitador's server with that setting, every answer
//! carries the crate's draft-03 headers (`CheckResult::response_header`)
//! sorted by name.

use std::collections::HashMap;
use std::net::SocketAddr;

use anyhow::{bail, Context as _, Result};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use limitador::limit::{Context, Limit, Predicate};
use limitador::storage::redis::AsyncRedisStorage;
use limitador::AsyncRateLimiter;
use tonic::{Request, Response, Status};

const DOMAIN: &str = "bench";
const WINDOW_SECONDS: u64 = 3600;

struct Peer {
    limiter: AsyncRateLimiter,
    headers: bool,
}

#[tonic::async_trait]
impl RateLimitService for Peer {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        if request.domain.is_empty() {
            return Err(Status::invalid_argument("domain is empty"));
        }
        let descriptors: Vec<HashMap<String, String>> = request
            .descriptors
            .iter()
            .map(|d| d.entries.iter().map(|e| (e.key.clone(), e.value.clone())).collect())
            .collect();
        let count = descriptors.len();
        let mut ctx = Context::default();
        ctx.list_binding("descriptors".to_string(), descriptors);
        let hits = u64::from(request.hits_addend.max(1));
        let namespace = request.domain.as_str().into();
        let mut checked = self
            .limiter
            .check_rate_limited_and_update(&namespace, &ctx, hits)
            .await
            .map_err(|err| Status::unavailable(err.to_string()))?;
        let code = if checked.limited { Code::OverLimit } else { Code::Ok } as i32;
        let statuses = (0..count).map(|_| DescriptorStatus { code, ..Default::default() }).collect();
        let mut response_headers_to_add = Vec::new();
        if self.headers {
            response_headers_to_add = checked
                .response_header()
                .into_iter()
                .map(|(key, value)| HeaderValue { key, value, ..Default::default() })
                .collect();
            response_headers_to_add.sort_by(|a, b| a.key.cmp(&b.key));
        }
        Ok(Response::new(RateLimitResponse {
            overall_code: code,
            statuses,
            response_headers_to_add,
            ..Default::default()
        }))
    }
}

fn limit(value: &str, max: u64) -> Result<Limit> {
    let condition = Predicate::parse(format!("descriptors[0].generic_key == '{value}'"))
        .map_err(|err| anyhow::anyhow!("{err:?}"))?;
    Ok(Limit::new(DOMAIN, max, WINDOW_SECONDS, [condition], []))
}

struct Args {
    listen: SocketAddr,
    redis: String,
    limits: Option<String>,
    headers: bool,
}

fn args() -> Result<Args> {
    let mut args = std::env::args().skip(1);
    let (mut listen, mut redis, mut limits, mut headers) = (None, None, None, false);
    while let Some(flag) = args.next() {
        let value = args.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => listen = Some(value.parse().with_context(|| format!("--listen {value}"))?),
            "--redis" => redis = Some(value),
            "--limits" => limits = Some(value),
            "--rate-limit-headers" => {
                headers = match value.as_str() {
                    "NONE" => false,
                    "DRAFT_VERSION_03" => true,
                    _ => bail!("--rate-limit-headers {value}: NONE or DRAFT_VERSION_03"),
                }
            }
            _ => bail!(
                "unknown flag {flag}; usage: --listen ADDR --redis URL [--limits FILE] [--rate-limit-headers DRAFT_VERSION_03]"
            ),
        }
    }
    Ok(Args {
        listen: listen.context("--listen ADDR is required")?,
        redis: redis.context("--redis URL is required")?,
        limits,
        headers,
    })
}

/// The limits of a Limitador limits file.
fn limits_file(path: &str) -> Result<Vec<Limit>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    serde_norway::from_str(&text).with_context(|| format!("{path}: not a Limitador limits file"))
}

#[tokio::main]
async fn main() -> Result<()> {
    let Args { listen, redis, limits, headers } = args()?;
    let storage = AsyncRedisStorage::new(&redis).await.with_context(|| format!("connecting to {redis}"))?;
    let limiter = AsyncRateLimiter::new_with_storage(Box::new(storage));
    let limits = match &limits {
        Some(path) => limits_file(path)?,
        None => vec![limit("allow", 1_000_000_000)?, limit("deny", 1)?],
    };
    let count = limits.len();
    for limit in limits {
        limiter.add_limit(limit);
    }
    eprintln!("sluice-bench-limitador: serving RLS v3 on {listen} ({count} limits), Redis {redis}");
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(Peer { limiter, headers }))
        .serve(listen)
        .await
        .context("serving")?;
    Ok(())
}
