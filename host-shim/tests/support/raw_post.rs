//! One HTTP/1.1 `POST` to a shim on a fresh connection, as the filter's
//! wire carries it: its status, `content-type` and body.

use sluice_policies::wire::{Encoding, PROTOCOL_HEADER};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub async fn post(
    port: u16,
    path: &str,
    encoding: Encoding,
    version: &str,
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: shim\r\ncontent-type: {}\r\n{PROTOCOL_HEADER}: {version}\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        encoding.content_type(),
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("write head");
    stream.write_all(body).await.expect("write body");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read answer");
    let split = answer.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
    let head = String::from_utf8_lossy(&answer[..split]).to_lowercase();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let content_type =
        head.lines().find_map(|l| l.strip_prefix("content-type: ")).unwrap_or_default().trim().to_string();
    (status, content_type, answer[split..].to_vec())
}
