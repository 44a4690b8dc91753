//! The load of scenario 6: an open-loop mix of priority classes. Requests
//! leave on a fixed schedule (phase by phase, each at its own rate), each
//! on its own task, whatever the answers to earlier ones: an overloaded
//! service does not slow its callers down. Each request's latency counts
//! from its scheduled time, so a generator that falls behind cannot hide
//! the wait (no coordinated omission).
//!
//! The class of the i-th request of every ten follows `PATTERN`, so each
//! class keeps its share at every moment: 1 critical, 3 interactive, 6 batch.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::overloaded::FULL_HEADER;

/// A priority class: its name in the document and Envoy's stats, the path
/// prefix that selects it, and its share of every ten requests.
pub(crate) struct Class {
    pub(crate) name: &'static str,
    pub(crate) path: &'static str,
    pub(crate) per_ten: u32,
}

/// Most important first, as the document lists them.
pub(crate) const CLASSES: [Class; 3] = [
    Class { name: "critical", path: "/pay/", per_ten: 1 },
    Class { name: "interactive", path: "/app/", per_ten: 3 },
    Class { name: "batch", path: "/batch/", per_ten: 6 },
];

/// The class of each request of every ten (indices into `CLASSES`), spread
/// out so that no class comes in a clump.
const PATTERN: [usize; 10] = [2, 1, 2, 0, 2, 1, 2, 2, 1, 2];

/// How long a request may take before it counts as failed.
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// 200 from the upstream.
    Served,
    /// Sluice's 503 with the problem type `temporary-reduced-capacity`.
    Shed,
    /// The upstream's own 503: its queue was full.
    Refused,
    /// Anything else: another status, a timeout, a broken connection.
    Failed,
}

/// One request: its class, when it was due (from the run's start), how long
/// it took from then, and what it got.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sent {
    pub(crate) class: usize,
    pub(crate) due: Duration,
    pub(crate) latency: Duration,
    pub(crate) answer: Answer,
}

/// Sends `phases` (requests a second, for how long) one after the other
/// through the gateway at `port`, the schedule counted from `start`, and
/// waits for every answer.
pub(crate) fn drive(port: u16, start: Instant, phases: &[(u32, Duration)]) -> Result<Vec<Sent>> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let http = reqwest::Client::builder().timeout(TIMEOUT).build()?;
        let mut tasks = Vec::new();
        let mut phase_start = Duration::ZERO;
        let mut i = 0usize;
        for &(rate, length) in phases {
            let every = Duration::from_secs(1) / rate.max(1);
            let mut due = phase_start;
            while due < phase_start + length {
                tokio::time::sleep_until((start + due).into()).await;
                let class = PATTERN[i % PATTERN.len()];
                let url = format!("http://127.0.0.1:{port}{}{i}", CLASSES[class].path);
                tasks.push(tokio::spawn(send(http.clone(), url, class, start, due)));
                i += 1;
                due += every;
            }
            phase_start += length;
        }
        let mut sent = Vec::with_capacity(tasks.len());
        for task in tasks {
            sent.push(task.await.context("a request's task panicked")?);
        }
        Ok(sent)
    })
}

async fn send(http: reqwest::Client, url: String, class: usize, start: Instant, due: Duration) -> Sent {
    let answer = match http.get(&url).send().await {
        Err(_) => Answer::Failed,
        Ok(response) => {
            let status = response.status().as_u16();
            let problem = response
                .headers()
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
            let full = response.headers().contains_key(FULL_HEADER);
            match (status, response.bytes().await.is_ok()) {
                (_, false) => Answer::Failed,
                (200, true) => Answer::Served,
                (503, true) if problem => Answer::Shed,
                (503, true) if full => Answer::Refused,
                _ => Answer::Failed,
            }
        }
    };
    Sent { class, due, latency: start.elapsed().saturating_sub(due), answer }
}
