//! Tiny blocking readiness probes over loopback TCP, with short timeouts, so
//! startup waits need no async runtime.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(1);

fn connect(port: u16) -> Option<TcpStream> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let stream = TcpStream::connect_timeout(&addr, TIMEOUT).ok()?;
    stream.set_read_timeout(Some(TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(TIMEOUT)).ok()?;
    Some(stream)
}

/// True when something accepts TCP connections on the port.
pub(crate) fn listening(port: u16) -> bool {
    connect(port).is_some()
}

/// `GET path` over HTTP/1.1; the status code and body, or `None` on any failure.
pub(crate) fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = connect(port)?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    Some((status, body.to_string()))
}

/// `GET path` over HTTP/1.1 on a Unix socket, as [`http_get`].
pub(crate) fn unix_http_get(socket: &std::path::Path, path: &str) -> Option<(u16, String)> {
    let mut stream = std::os::unix::net::UnixStream::connect(socket).ok()?;
    stream.set_read_timeout(Some(TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(TIMEOUT)).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    Some((status, body.to_string()))
}

/// True when a Redis server answers `PING` with `+PONG`.
pub(crate) fn redis_ping(port: u16) -> bool {
    let Some(mut stream) = connect(port) else {
        return false;
    };
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_ok() && reply.starts_with(b"+PONG")
}
