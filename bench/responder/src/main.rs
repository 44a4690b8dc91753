//! The bench's trivial responder, for `cargo xtask bench` only: answers
//! `200 ok\n` to any request, over HTTP/1.1 or HTTP/2 cleartext (prior
//! knowledge) on one port, like the shim.
//!
//! It serves twice in the bench, each in its own process: as the upstream
//! behind every Envoy setup, and as the callout floor's far end. It is built in
//! release, so neither role costs more than the shim's own server stack.
//!
//! Every connection has TCP_NODELAY: without it, a response written in two
//! pieces (HTTP/2 HEADERS, then DATA) can wait on Nagle's algorithm for the
//! peer's delayed ACK, and the floor would not be a floor. `--nagle` leaves
//! it off, for the bench's setup that shows what that costs.
//!
//! Usage: `sluice-bench-responder 127.0.0.1:PORT [--nagle]`. SIGTERM ends it (the
//! default action: it holds no state worth a graceful stop).

use axum::serve::ListenerExt;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(addr), nagle) = (args.next(), args.next()) else {
        eprintln!("usage: sluice-bench-responder 127.0.0.1:PORT [--nagle]");
        std::process::exit(2);
    };
    let nodelay = nagle.as_deref() != Some("--nagle");
    let listener = match tokio::net::TcpListener::bind(&addr).await {
        Ok(listener) => listener.tap_io(move |tcp| {
            let _ = tcp.set_nodelay(nodelay);
        }),
        Err(err) => {
            eprintln!("cannot bind {addr}: {err}");
            std::process::exit(1);
        }
    };
    let app = axum::Router::new().fallback(|| async { "ok\n" });
    if let Err(err) = axum::serve(listener, app).await {
        eprintln!("responder stopped: {err}");
        std::process::exit(1);
    }
}
