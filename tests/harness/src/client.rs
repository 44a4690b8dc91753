//! A small HTTP client for driving Envoy: a burst of N concurrent requests,
//! each answer reduced to its status, `retry-after` and `x-sluice-verdict`
//! headers; and one raw
//! HTTP/1.1 request with a JSON body, for the shim's own endpoints.

use std::time::Duration;

use anyhow::Context;
use tokio::task::JoinSet;

/// One request may take this long at most, so a burst never hangs.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpReply {
    pub status: u16,
    /// The raw `retry-after` header, if any.
    pub retry_after: Option<String>,
    /// The `x-sluice-verdict` header (a document with `verdict_header`): what
    /// the filter did with the request.
    pub verdict: Option<String>,
}

impl HttpReply {
    /// `retry-after` as whole seconds, if present and an integer.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after.as_deref()?.trim().parse().ok()
    }
}

/// Sends `count` concurrent `method path` requests to `127.0.0.1:port`, each
/// with `header` if given, and returns their replies (in no particular order).
pub fn burst(
    port: u16,
    method: &str,
    path: &str,
    header: Option<(&str, &str)>,
    count: usize,
) -> anyhow::Result<Vec<HttpReply>> {
    let method = reqwest::Method::from_bytes(method.as_bytes()).context("invalid HTTP method")?;
    let url = format!("http://127.0.0.1:{port}{path}");
    let header = header.map(|(name, value)| (name.to_string(), value.to_string()));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let client = reqwest::Client::builder().timeout(REQUEST_TIMEOUT).build()?;
        let mut requests = JoinSet::new();
        for _ in 0..count {
            let mut request = client.request(method.clone(), &url);
            if let Some((name, value)) = &header {
                request = request.header(name, value);
            }
            requests.spawn(async move { request.send().await });
        }
        let mut replies = Vec::with_capacity(count);
        while let Some(joined) = requests.join_next().await {
            let response = joined?.with_context(|| format!("request to {url}"))?;
            let header = |name: &str| {
                let value = response.headers().get(name);
                value.map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
            };
            let (retry_after, verdict) = (header("retry-after"), header("x-sluice-verdict"));
            replies.push(HttpReply { status: response.status().as_u16(), retry_after, verdict });
        }
        Ok(replies)
    })
}

/// How many replies have this status.
pub fn count(replies: &[HttpReply], status: u16) -> usize {
    replies.iter().filter(|reply| reply.status == status).count()
}

/// One HTTP/1.1 request with a JSON `body` to `127.0.0.1:port`: the status
/// and the body of the answer (status 0 if it is not HTTP).
pub async fn http(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: shim\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.expect("write head");
    tcp.write_all(body.as_bytes()).await.expect("write body");
    let mut got = String::new();
    tcp.read_to_string(&mut got).await.expect("read answer");
    let (head, body) = got.split_once("\r\n\r\n").unwrap_or((&got, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, body.to_string())
}
