//! What the gateway-behaviour tests need beyond the stack: a client that
//! keeps headers and body, Envoy's stats read from `/stats/prometheus`, an
//! Envoy whose route times out, and the faults a real part cannot produce on
//! demand: a shim port that accepts TCP and never answers ([`Blackhole`]), a
//! shim answering a fixed status and body ([`FakeShim`]), and an upstream
//! that answers 500, resets the connection or hangs ([`RoughUpstream`]).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::envoy::demo_template;
use crate::paths::dist;
use crate::probe::http_get;
use crate::Envoy;

/// One request may take this long at most.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A whole response: status, headers (lower-case names) and body.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// Sends one `method path` request with `headers` to `127.0.0.1:port`.
pub fn send(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> anyhow::Result<Response> {
    send_body(port, method, path, headers, None)
}

/// [`send`] with a request body, if given.
pub fn send_body(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> anyhow::Result<Response> {
    let method = reqwest::Method::from_bytes(method.as_bytes()).context("invalid HTTP method")?;
    let url = format!("http://127.0.0.1:{port}{path}");
    let headers: Vec<(String, String)> =
        headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
    let body = body.map(<[u8]>::to_vec);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        let client = reqwest::Client::builder().timeout(REQUEST_TIMEOUT).build()?;
        let mut request = client.request(method, &url);
        for (name, value) in &headers {
            request = request.header(name, value);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        let response = request.send().await.with_context(|| format!("request to {url}"))?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();
        let body = response.text().await?;
        Ok(Response { status, headers, body })
    })
}

/// Opens a raw HTTP/1.1 request and returns the connection without reading
/// the answer: dropping it is a client reset.
pub fn open_request(port: u16, path: &str, headers: &[(&str, &str)]) -> anyhow::Result<TcpStream> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    Ok(stream)
}

/// Envoy's `/stats/prometheus`.
pub fn prometheus(envoy: &Envoy) -> anyhow::Result<String> {
    match http_get(envoy.admin_port, "/stats/prometheus") {
        Some((200, body)) => Ok(body),
        other => anyhow::bail!("GET /stats/prometheus: {other:?}"),
    }
}

/// The value of the sample `name` (exactly, labels included if given; Envoy
/// writes an unlabelled one as `name{}`) in a Prometheus text page; 0 when absent.
pub fn sample(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .find(|(n, _)| *n == name || n.strip_suffix("{}") == Some(name))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0.0)
}

/// Polls `cond` every 50 ms until it holds; false after `within`.
pub fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Envoy from `envoy/demo.yaml`, with the route's timeout set to `route_timeout`
/// (the stream times out with 504 after it).
pub fn envoy_with_route_timeout(
    policy_json: &str,
    shim_port: u16,
    upstream_port: u16,
    route_timeout: &str,
) -> anyhow::Result<Envoy> {
    let text = std::fs::read_to_string(demo_template())?;
    let route = "route: {cluster: upstream, timeout: 0s,";
    anyhow::ensure!(text.contains(route), "envoy/demo.yaml has no `{route}`");
    let text = text.replace(route, &format!("route: {{cluster: upstream, timeout: {route_timeout},"));
    let dir = crate::process::scratch_dir("template")?;
    let template = dir.join(format!("route-timeout-{upstream_port}.yaml"));
    std::fs::write(&template, text)?;
    let values = [
        ("UPSTREAM_PORT", upstream_port.to_string()),
        ("SHIM_PORT", shim_port.to_string()),
        ("WASM_PATH", dist("sluice.wasm")?.display().to_string()),
        ("POLICY_JSON", serde_json::to_string(policy_json)?),
    ];
    let envoy = Envoy::start_template(&template, &values, 2);
    let _ = std::fs::remove_file(&template);
    envoy
}

/// A loopback port that accepts TCP connections and never answers on them:
/// a shim that hangs.
pub struct Blackhole {
    pub port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Blackhole {
    pub fn start() -> anyhow::Result<Blackhole> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    held.push(stream);
                }
            }
        });
        Ok(Blackhole { port, stop, thread: Some(thread) })
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A shim that answers every request with a fixed status and body, over
/// HTTP/1.1 and HTTP/2 cleartext like the real one.
pub struct FakeShim {
    pub port: u16,
    _server: crate::Upstream,
}

impl FakeShim {
    pub fn start(status: u16, body: &'static str) -> anyhow::Result<FakeShim> {
        let status = axum::http::StatusCode::from_u16(status)?;
        let server =
            crate::Upstream::serving(axum::Router::new().fallback(move || async move { (status, body) }))?;
        Ok(FakeShim { port: server.port, _server: server })
    }
}

/// An upstream by path: `/500` answers 500, `/reset` resets the
/// connection, `/hang` never answers; anything else answers `200 ok`. It
/// counts the requests it has received.
pub struct RoughUpstream {
    pub port: u16,
    pub received: Arc<Mutex<usize>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RoughUpstream {
    pub fn start() -> anyhow::Result<RoughUpstream> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(Mutex::new(0));
        let (stopping, counter) = (stop.clone(), received.clone());
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                let (Ok(stream), counter) = (stream, counter.clone()) else { continue };
                std::thread::spawn(move || serve_rough(stream, &counter));
            }
        });
        Ok(RoughUpstream { port, received, stop, thread: Some(thread) })
    }
}

fn serve_rough(stream: TcpStream, received: &Mutex<usize>) {
    let Ok(read_half) = stream.try_clone() else { return };
    let mut reader = BufReader::new(read_half);
    let mut stream = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
            line.clear();
        }
        if let Ok(mut n) = received.lock() {
            *n += 1;
        }
        let path = request_line.split(' ').nth(1).unwrap_or("/");
        let answer: &[u8] = match path {
            "/reset" => {
                let _ = socket_linger_zero(&stream);
                let _ = stream.shutdown(Shutdown::Both);
                return;
            }
            "/hang" => {
                std::thread::sleep(Duration::from_secs(120));
                return;
            }
            "/500" => b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 5\r\n\r\nboom\n",
            "/slow" => {
                std::thread::sleep(Duration::from_millis(200));
                b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n"
            }
            _ => b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n",
        };
        if stream.write_all(answer).is_err() {
            return;
        }
    }
}

/// SO_LINGER 0, so that closing sends a RST instead of a FIN.
fn socket_linger_zero(stream: &TcpStream) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: setsockopt on an open socket we own, with a correctly sized value.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Drop for RoughUpstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
