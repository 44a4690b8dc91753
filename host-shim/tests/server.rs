//! The shim's accept loop, in process on a real socket: mutual TLS refuses
//! any client without a certificate from the configured CA, a connection
//! that sends nothing is closed at the header read timeout, and the cap
//! counts connections, not HTTP/2 streams. (The old `axum::serve` loop
//! served anyone, held a silent connection for ever and had no cap.)
//!
//! Only `/healthz` is asked, so no Redis is needed: the limiter connects
//! lazily.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use sluice_harness::tls::{Identity, Pki};
use sluice_shim::limiter::Limiter;
use sluice_shim::server::{run, Options};
use sluice_shim::store::Target;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

const GET_HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: shim\r\n\r\n";

/// Serves on a free port until the test ends; its port.
async fn serve(options: Options) -> u16 {
    let limiter = Limiter::new(&Target::Single("redis://127.0.0.1:1".into()), Duration::from_secs(1), false)
        .expect("limiter");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(run(listener, limiter, options, std::future::pending()));
    port
}

async fn connect(port: u16) -> TcpStream {
    TcpStream::connect(("127.0.0.1", port)).await.expect("connect")
}

/// What the server sends before it closes, or `None` if it sends nothing
/// within `within` and keeps the connection open.
async fn read_all(io: &mut (impl AsyncRead + Unpin), within: Duration) -> Option<String> {
    let mut got = Vec::new();
    match tokio::time::timeout(within, io.read_to_end(&mut got)).await {
        Ok(_) => Some(String::from_utf8_lossy(&got).into_owned()),
        Err(_) if got.is_empty() => None,
        Err(_) => Some(String::from_utf8_lossy(&got).into_owned()),
    }
}

/// An HTTP/1.1 `GET /healthz` on `io`; its status, or `None` without an answer.
async fn healthz_h1(io: &mut (impl AsyncRead + AsyncWrite + Unpin), within: Duration) -> Option<u16> {
    io.write_all(b"GET /healthz HTTP/1.1\r\nhost: shim\r\nconnection: close\r\n\r\n").await.ok()?;
    let answer = read_all(io, within).await?;
    answer.split(' ').nth(1)?.parse().ok()
}

fn mtls(pki: &Pki) -> Options {
    let config =
        sluice_shim::tls::server_config(&pki.server.cert, &pki.server.key, &pki.ca).expect("tls config");
    Options { tls: Some(config), ..Options::default() }
}

/// A TLS client that trusts the test CA, with `identity` as its certificate.
fn client(pki: &Pki, identity: Option<&Identity>) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(&pki.ca).expect("ca") {
        roots.add(ca.expect("ca pem")).expect("add ca");
    }
    let builder = ClientConfig::builder_with_provider(sluice_shim::tls::provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(id) => {
            let chain: Vec<CertificateDer<'static>> =
                CertificateDer::pem_file_iter(&id.cert).expect("cert").map(|c| c.expect("pem")).collect();
            let key = PrivateKeyDer::from_pem_file(&id.key).expect("key");
            builder.with_client_auth_cert(chain, key).expect("client auth")
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    TlsConnector::from(Arc::new(config))
}

fn localhost() -> ServerName<'static> {
    ServerName::try_from("localhost").expect("server name")
}

/// `requests` concurrent HTTP/2 `GET /healthz` over the one connection `io`;
/// their statuses.
async fn healthz_h2<I>(io: I, requests: usize) -> Vec<u16>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
        .await
        .expect("h2 handshake");
    tokio::spawn(conn);
    let calls = (0..requests).map(|_| {
        let mut sender = sender.clone();
        async move {
            let req =
                hyper::Request::get("http://shim/healthz").body(Empty::<Bytes>::new()).expect("request");
            let resp = sender.send_request(req).await.expect("h2 response");
            let status = resp.status().as_u16();
            resp.into_body().collect().await.expect("body");
            status
        }
    });
    let mut statuses = Vec::new();
    for call in calls.collect::<Vec<_>>() {
        statuses.push(tokio::spawn(call));
    }
    let mut out = Vec::new();
    for status in statuses {
        out.push(status.await.expect("task"));
    }
    out
}

/// With mTLS, a client without a certificate, one whose certificate another
/// CA signed, and a cleartext client all get no answer; a client with a
/// certificate from the configured CA negotiates HTTP/2 and is answered.
#[tokio::test]
async fn mutual_tls_refuses_clients_without_a_trusted_certificate() {
    let pki = Pki::generate().expect("certificates");
    let port = serve(mtls(&pki)).await;
    let within = Duration::from_secs(5);

    for (who, identity) in [("no certificate", None), ("another CA's certificate", Some(&pki.stranger))] {
        // TLS 1.3 finishes the client's side of the handshake before the
        // server judges its certificate; the refusal comes on the next read.
        match client(&pki, identity).connect(localhost(), connect(port).await).await {
            Err(_) => {}
            Ok(mut tls) => assert_eq!(healthz_h1(&mut tls, within).await, None, "{who} was answered"),
        }
    }
    let mut plain = connect(port).await;
    let answer = healthz_h1(&mut plain, within).await;
    assert_eq!(answer, None, "a cleartext client was answered");

    let tls =
        client(&pki, Some(&pki.client)).connect(localhost(), connect(port).await).await.expect("handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(healthz_h2(tls, 3).await, [200, 200, 200]);
    let mut tls =
        client(&pki, Some(&pki.client)).connect(localhost(), connect(port).await).await.expect("handshake");
    assert_eq!(healthz_h1(&mut tls, within).await, Some(200), "HTTP/1.1 over TLS");
}

/// A connection that sends nothing, or only part of its headers, is closed
/// at the header read timeout; so is a TLS connection that never starts
/// its handshake.
#[tokio::test]
async fn silent_connections_are_closed_at_the_header_read_timeout() {
    let options = Options { header_read_timeout: Duration::from_millis(300), ..Options::default() };
    let port = serve(options).await;
    let within = Duration::from_secs(5);

    let mut silent = connect(port).await;
    assert_eq!(read_all(&mut silent, within).await.as_deref(), Some(""), "a silent connection stayed open");
    let mut partial = connect(port).await;
    partial.write_all(b"GET /healthz HTTP/1.1\r\nhost: sh").await.expect("write");
    let answer = read_all(&mut partial, within).await.expect("a half-sent request's connection stayed open");
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 408"), "{answer}");
    // Still serving.
    assert_eq!(healthz_h1(&mut connect(port).await, within).await, Some(200));

    let pki = Pki::generate().expect("certificates");
    let port = serve(Options { header_read_timeout: Duration::from_millis(300), ..mtls(&pki) }).await;
    let mut silent = connect(port).await;
    assert_eq!(
        read_all(&mut silent, within).await.as_deref(),
        Some(""),
        "a silent TLS connection stayed open"
    );
}

/// At the cap, a further connection waits (unanswered) until one closes,
/// then it is served. The cap counts connections, not streams: one HTTP/2
/// connection carries 200 concurrent calls while the other slot is held.
#[tokio::test]
async fn the_cap_counts_connections_not_streams() {
    let port = serve(Options { max_connections: 2, ..Options::default() }).await;

    // Two connections hold both slots, each mid-request.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut conn = connect(port).await;
        conn.write_all(b"GET /healthz HTTP/1.1\r\n").await.expect("write");
        held.push(conn);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut waiting = connect(port).await;
    waiting.write_all(GET_HEALTHZ).await.expect("write");
    let mut first = [0u8; 12];
    let early = tokio::time::timeout(Duration::from_millis(500), waiting.read(&mut first)).await;
    assert!(early.is_err(), "a third connection was served beyond the cap of two");
    drop(held.pop());
    let n = tokio::time::timeout(Duration::from_secs(5), waiting.read_exact(&mut first)).await;
    assert!(n.is_ok(), "the waiting connection was not served once a slot freed");
    assert_eq!(&first, b"HTTP/1.1 200");
    drop(waiting);

    // One slot held, one HTTP/2 connection with many streams.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let statuses = healthz_h2(connect(port).await, 200).await;
    assert_eq!(statuses.len(), 200);
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
}

/// A call that names another version of the wire is refused with 400 and a
/// message naming both versions, before any Redis work; the same call with
/// this shim's version (or with no version, as `curl` sends it) reaches the
/// handler. A filter of another release is never misread.
#[tokio::test]
async fn a_call_of_another_protocol_version_is_refused_by_name() {
    use sluice_policies::wire::{CHECK_PATH, PROTOCOL_HEADER, PROTOCOL_VERSION};
    let port = serve(Options::default()).await;
    let call = |version: Option<&str>| {
        let header = version.map(|v| format!("{PROTOCOL_HEADER}: {v}\r\n")).unwrap_or_default();
        format!(
            "POST {CHECK_PATH} HTTP/1.1\r\nhost: shim\r\nconnection: close\r\ncontent-type: application/json\r\n\
             {header}content-length: 2\r\n\r\n{{}}"
        )
    };
    let send = |text: String| async move {
        let mut tcp = connect(port).await;
        tcp.write_all(text.as_bytes()).await.expect("write");
        read_all(&mut tcp, Duration::from_secs(5)).await.expect("an answer")
    };
    let refused = send(call(Some("999"))).await;
    assert!(refused.starts_with("HTTP/1.1 400"), "{refused}");
    assert!(
        refused.contains(&format!(
            "protocol version mismatch: the caller speaks \"999\", this shim speaks \"{PROTOCOL_VERSION}\""
        )),
        "{refused}"
    );
    for version in [Some(PROTOCOL_VERSION), None] {
        let served = send(call(version)).await;
        assert!(!served.contains("protocol version mismatch"), "{version:?}: {served}");
    }
}
