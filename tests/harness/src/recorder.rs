//! An upstream that keeps its own record of what reached it, for judging a
//! limiter from the far side: each request's `x-trace` id, path, and when it
//! arrived and when its answer left. `/slow` answers after 100 ms, `/hang`
//! holds the request until the peer closes the connection (or 60 s pass);
//! anything else answers `200 ok` at once. In the query, `slow` (any path)
//! also takes 100 ms, and `actual=N` adds the response header
//! `x-actual-cost: N` (a `points` limit's true cost, for refunds).
//!
//! One thread per connection, blocking I/O: the record is the point, not
//! the throughput.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long `/slow` takes.
pub const SLOW: Duration = Duration::from_millis(100);
/// The longest `/hang` holds a request whose peer stays.
const HANG_AT_MOST: Duration = Duration::from_secs(60);
const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n";

/// One request as the upstream saw it.
#[derive(Clone, Debug)]
pub struct Arrival {
    /// The `x-trace` header, if it was a number.
    pub trace: Option<u64>,
    pub path: String,
    pub arrived: Instant,
    /// When the answer was written, or the hanging request's peer went away;
    /// `None` while it is in flight.
    pub left: Option<Instant>,
}

pub struct RecordingUpstream {
    pub port: u16,
    record: Arc<Mutex<Vec<Arrival>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RecordingUpstream {
    pub fn start() -> anyhow::Result<RecordingUpstream> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let record = Arc::new(Mutex::new(Vec::new()));
        let (stopping, shared) = (stop.clone(), record.clone());
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                let (Ok(stream), record, stop) = (stream, shared.clone(), stopping.clone()) else { continue };
                std::thread::spawn(move || serve(stream, &record, &stop));
            }
        });
        Ok(RecordingUpstream { port, record, stop, thread: Some(thread) })
    }

    /// Everything that has arrived so far.
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.record.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// How many requests whose path starts with `prefix` are in flight now.
    pub fn in_flight(&self, prefix: &str) -> usize {
        self.arrivals().iter().filter(|a| a.left.is_none() && a.path.starts_with(prefix)).count()
    }
}

fn serve(stream: TcpStream, record: &Mutex<Vec<Arrival>>, stop: &AtomicBool) {
    let Ok(read_half) = stream.try_clone() else { return };
    let mut reader = BufReader::new(read_half);
    let mut stream = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let arrived = Instant::now();
        let mut trace = None;
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("x-trace") {
                    trace = value.trim().parse().ok();
                }
            }
            line.clear();
        }
        let path = request_line.split(' ').nth(1).unwrap_or("/").to_string();
        let index = {
            let Ok(mut r) = record.lock() else { return };
            r.push(Arrival { trace, path: path.clone(), arrived, left: None });
            r.len() - 1
        };
        let leave = |record: &Mutex<Vec<Arrival>>| {
            if let Ok(mut r) = record.lock() {
                r[index].left = Some(Instant::now());
            }
        };
        if path.starts_with("/hang") {
            hang_until_peer_leaves(&mut reader, stop);
            leave(record);
            return;
        }
        let query = path.split_once('?').map(|(_, q)| q).unwrap_or("");
        let param = |name: &str| query.split('&').find_map(|kv| kv.strip_prefix(name));
        if path.starts_with("/slow") || param("slow").is_some() {
            std::thread::sleep(SLOW);
        }
        let answer = match param("actual=").and_then(|n| n.parse::<u64>().ok()) {
            Some(cost) => {
                format!("HTTP/1.1 200 OK\r\nx-actual-cost: {cost}\r\ncontent-length: 3\r\n\r\nok\n")
                    .into_bytes()
            }
            None => OK.to_vec(),
        };
        // The answer has left once written: record it first, so the record
        // never shows a request ending later than the client saw it end.
        leave(record);
        if stream.write_all(&answer).is_err() {
            return;
        }
    }
}

/// Blocks until the peer closes the connection (a read gives 0 or fails),
/// the upstream stops, or [`HANG_AT_MOST`] passes.
fn hang_until_peer_leaves(reader: &mut BufReader<TcpStream>, stop: &AtomicBool) {
    let deadline = Instant::now() + HANG_AT_MOST;
    let _ = reader.get_ref().set_read_timeout(Some(Duration::from_millis(50)));
    let mut byte = [0u8; 1];
    while Instant::now() < deadline && !stop.load(Ordering::SeqCst) {
        match reader.get_mut().read(&mut byte) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

impl Drop for RecordingUpstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
