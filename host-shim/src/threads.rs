//! `--listeners per-thread`: each of the shim's threads accepts on a
//! listener of its own, all bound to the same address with `SO_REUSEPORT`
//! (the kernel spreads new connections among them), runs a current-thread
//! runtime, and sends its checks to Redis on a connection of its own. A
//! decision then stays on the thread that read it, where the shared mode's
//! threads hand connections, tasks and Redis replies to each other. What
//! the threads share (the waiting, the metrics, the dashboard, the drain)
//! is shared through the [`Limiter`] as in the shared mode.
//!
//! The first listener is served by the caller, with everything else the
//! shim runs (the gRPC faces, signals); [`spawn`] starts a thread for each
//! further one.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use socket2::{Domain, Protocol, Socket, Type};

use crate::limiter::Limiter;
use crate::server::Options;
use crate::store::{Connect, Target};

/// The listen backlog, as `tokio::net::TcpListener::bind` sets it.
const BACKLOG: i32 = 1024;

/// `count` listeners on `addr`, sharing it by `SO_REUSEPORT`. Port 0 binds
/// the first to a free port and the others to the same.
pub fn bind(addr: SocketAddr, count: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    let first = bind_one(addr)?;
    let addr = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..count {
        listeners.push(bind_one(addr)?);
    }
    Ok(listeners)
}

fn bind_one(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// How a thread reaches Redis: [`Connect`], owned.
#[derive(Clone)]
pub struct Redis {
    pub target: Target,
    pub timeout: std::time::Duration,
    pub ca: Option<Vec<u8>>,
}

/// Starts a thread for each listener, serving it with `limiter` on a Redis
/// connection of the thread's own until `shutdown()` completes, then
/// draining as [`crate::server::run_shared`] does.
pub fn spawn<F, S>(
    listeners: Vec<std::net::TcpListener>,
    limiter: &Arc<Limiter>,
    redis: &Redis,
    options: &Options,
    shutdown: S,
) -> std::io::Result<Vec<JoinHandle<anyhow::Result<()>>>>
where
    S: Fn() -> F + Clone + Send + 'static,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let mut threads = Vec::with_capacity(listeners.len());
    for (i, listener) in listeners.into_iter().enumerate() {
        let (limiter, redis, options, shutdown) =
            (limiter.clone(), redis.clone(), options.clone(), shutdown.clone());
        let thread =
            std::thread::Builder::new().name(format!("sluice-listener-{}", i + 1)).spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                runtime.block_on(async move {
                    let how = Connect { target: &redis.target, timeout: redis.timeout, ca: redis.ca };
                    let limiter = Arc::new(limiter.on_own_connection(&how)?);
                    let listener = tokio::net::TcpListener::from_std(listener)?;
                    crate::server::run_another(listener, limiter, options, shutdown()).await
                })
            })?;
        threads.push(thread);
    }
    Ok(threads)
}

/// Waits for the threads [`spawn`] started; the first error, if any.
pub fn join(threads: Vec<JoinHandle<anyhow::Result<()>>>) -> anyhow::Result<()> {
    let mut result = Ok(());
    for thread in threads {
        let ended = thread.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a listener's thread panicked")));
        if result.is_ok() {
            result = ended;
        }
    }
    result
}
