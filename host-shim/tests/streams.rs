//! The shim's HTTP/2 server holds hundreds of waiting checks on ONE
//! connection, as Envoy sends them: every held check is an open stream, and
//! hyper's default limit (200 concurrent streams) would stall the rest.

use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use redis::Commands;
use sluice_harness::Redis;
use sluice_shim::limiter::Limiter;
use sluice_shim::store::Target;

const WAITERS: usize = 300;

/// 300 checks wait at once for one concurrency slot over a single h2
/// connection: all of them reach the queue, and all are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_held_checks_share_one_connection() {
    let redis = Redis::start().expect("redis");
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), false).expect("limiter");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let options = sluice_shim::server::Options::default();
    let server = tokio::spawn(sluice_shim::server::run(listener, limiter, options, async {
        let _ = stopped.await;
    }));

    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp)).await.expect("h2");
    tokio::spawn(conn);
    let body = |id: &str, wait_ms: u64| {
        format!(
            r#"{{"checks":[{{"policy":"p","key":"k","limits":[{{"type":"concurrency","limit":1,"lease_ms":10000}}]}}],"id":"{id}","wait_ms":{wait_ms}}}"#
        )
    };
    let send = |sender: hyper::client::conn::http2::SendRequest<Full<Bytes>>, body: String| async move {
        let mut sender = sender;
        let req = hyper::Request::post(format!("http://{addr}/v1/check"))
            .body(Full::new(Bytes::from(body)))
            .expect("request");
        let resp = sender.send_request(req).await.expect("response");
        let status = resp.status();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&bytes).to_string())
    };
    let (status, text) = send(sender.clone(), body("holder", 0)).await;
    assert!(status.is_success() && text.contains(r#""allowed":true"#), "{status} {text}");

    let waiters: Vec<_> =
        (0..WAITERS).map(|i| tokio::spawn(send(sender.clone(), body(&format!("w{i}"), 3_000)))).collect();
    let mut conn = redis.connection().expect("redis connection");
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut queued = 0;
    while Instant::now() < deadline {
        queued = conn.zcard("sluice:{p:k}:cc:10000:q").expect("ZCARD");
        if queued == WAITERS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(queued, WAITERS, "not every held check got a stream");
    for waiter in waiters {
        let (status, text) = waiter.await.expect("waiter");
        assert!(status.is_success(), "{status} {text}");
    }
    let _ = stop.send(());
    server.await.expect("server").expect("clean shutdown");
}
