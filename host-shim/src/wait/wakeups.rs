//! ONE Redis pub/sub subscriber per shim, on two channels:
//!
//! - the shim's own `sluice:wake:<nonce>`, for requests waiting on a
//!   concurrency slot. A release or reclaim that hands a slot to a waiter
//!   PUBLISHes the waiter's id on its shim's channel in the same atomic call
//!   (`lua/lib/queue.lua`); the subscriber routes it to the waiting task by
//!   id. A waiter registers before it queues, so a wake-up that races its
//!   own queueing reply is not lost.
//! - the fleet's [`PUSHED_CHANNEL`], for requests held for a time slot: a
//!   late send that pushes held requests past their deadlines PUBLISHes
//!   each (`lua/scripts/confirm.lua`), whichever shim made it, and the shim
//!   that holds one refuses it at once ([`Held::push_out`]).
//!
//! The subscriber starts with the shim (the shim starts while Redis is
//! down) and reconnects by itself; a message lost while it reconnects is
//! covered all the same, later: a queued waiter's by its deadline
//! (`lua/scripts/leave.lua` passes the slot on), a pushed-out one's by its
//! confirm at its slot, which finds it no longer held.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use futures_util::StreamExt;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{oneshot, watch};

use sluice_core::log_throttle::LogThrottle;
use sluice_policies::algorithm::confirm::{Confirmed, PUSHED_CHANNEL};

use super::held::Held;
use crate::metrics::Metrics;

pub struct Wakeups {
    url: String,
    /// The CA that signs Redis's certificate, for `rediss://`.
    ca: Option<Vec<u8>>,
    channel: String,
    waiters: Mutex<HashMap<String, oneshot::Sender<String>>>,
    subscribed: watch::Sender<bool>,
    start: Once,
    /// Wake-ups delivered to a waiter (`sluice_handovers`).
    handovers: Counter,
    /// Under Sentinel, the store that names the master to subscribe on.
    sentinel: Option<Arc<crate::store::RedisClient>>,
    /// The requests this shim holds for a time slot: those another shim's
    /// send pushed out are refused at once.
    held: Arc<Held>,
}

/// A registered waiter: its wake-up (the message: `<id>` served, `<id> <t'>
/// <delay>` a mixed waiter's time slot reserved at t', `<id> -1` refused),
/// and its removal from the map when dropped.
pub struct Registration {
    wakeups: Arc<Wakeups>,
    id: String,
    pub woken: oneshot::Receiver<String>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut waiters) = self.wakeups.waiters.lock() {
            waiters.remove(&self.id);
        }
    }
}

impl Wakeups {
    /// `url`: the Redis (or one node of the cluster: PUBLISH reaches every
    /// node) to subscribe on.
    pub fn new(url: String, nonce: u64) -> Wakeups {
        Wakeups {
            url,
            ca: None,
            channel: format!("sluice:wake:{nonce:x}"),
            waiters: Mutex::new(HashMap::new()),
            subscribed: watch::channel(false).0,
            start: Once::new(),
            handovers: Counter::default(),
            sentinel: None,
            held: Arc::default(),
        }
    }

    /// Refuses the requests of `held` that a send pushed past their
    /// deadlines, whichever shim made it.
    pub fn refusing(mut self, held: Arc<Held>) -> Wakeups {
        self.held = held;
        self
    }

    /// Under Sentinel: subscribes on the master `store`'s sentinels name
    /// at each (re)connect, instead of a fixed URL.
    pub fn following(mut self, store: Option<Arc<crate::store::RedisClient>>) -> Wakeups {
        self.sentinel = store;
        self
    }

    /// Trusts `ca` (PEM) for a `rediss://` URL instead of the system's roots.
    pub fn with_ca(mut self, ca: Option<Vec<u8>>) -> Wakeups {
        self.ca = ca;
        self
    }

    /// Counts the wake-ups it delivers in `metrics`.
    pub fn counting(mut self, metrics: &Metrics) -> Wakeups {
        self.handovers = metrics.handovers.clone();
        self
    }

    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// Starts the subscriber, once; the shim does it as it starts, so the
    /// first waiting request finds it listening (a waiter may wait only a
    /// millisecond, less than it takes to connect).
    pub fn start(self: &Arc<Self>) {
        let me = self.clone();
        self.start.call_once(|| {
            tokio::spawn(me.subscribe_forever());
        });
    }

    /// Registers `id` for its wake-up; starts the subscriber if needed.
    pub fn register(self: &Arc<Self>, id: &str) -> Registration {
        self.start();
        let (tx, rx) = oneshot::channel();
        if let Ok(mut waiters) = self.waiters.lock() {
            waiters.insert(id.to_string(), tx);
        }
        Registration { wakeups: self.clone(), id: id.to_string(), woken: rx }
    }

    /// Waits until the subscriber listens, at most `limit`; false if it does not.
    pub async fn subscribed(&self, limit: Duration) -> bool {
        let mut rx = self.subscribed.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|up| *up)).await.is_ok_and(|r| r.is_ok())
    }

    /// Completes when the subscriber loses its connection.
    pub async fn lost(&self) {
        let mut rx = self.subscribed.subscribe();
        if rx.wait_for(|up| !*up).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    async fn subscribe_forever(self: Arc<Self>) {
        // A Redis that stays down would otherwise log ten lines a second.
        let mut log = LogThrottle::new(60_000);
        let started = std::time::Instant::now();
        loop {
            if let Err(err) = self.subscribe_once().await {
                let now_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                if let Some(suppressed) = log.admit(now_ms) {
                    tracing::warn!(%err, channel = %self.channel, suppressed, "wake-up subscriber lost; reconnecting");
                }
            }
            self.subscribed.send_replace(false);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn subscribe_once(&self) -> redis::RedisResult<()> {
        let master = match &self.sentinel {
            Some(store) => store.sentinel_master().await.transpose()?,
            None => None,
        };
        let client = match (master, &self.ca) {
            (Some(master), _) => master,
            (None, Some(ca)) => {
                let certs = redis::TlsCertificates { client_tls: None, root_cert: Some(ca.clone()) };
                redis::Client::build_with_tls(self.url.as_str(), certs)?
            }
            (None, None) => redis::Client::open(self.url.as_str())?,
        };
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(&self.channel).await?;
        pubsub.subscribe(PUSHED_CHANNEL).await?;
        self.subscribed.send_replace(true);
        let mut messages = pubsub.on_message();
        while let Some(msg) = messages.next().await {
            let Ok(message) = msg.get_payload::<String>() else { continue };
            if msg.get_channel_name() == PUSHED_CHANNEL {
                if let Some((id, wait_us)) = Confirmed::parse_pushed(&message) {
                    self.held.push_out(id, wait_us);
                }
                continue;
            }
            let id = message.split(' ').next().unwrap_or_default();
            let waiter = self.waiters.lock().ok().and_then(|mut w| w.remove(id));
            if let Some(tx) = waiter {
                self.handovers.inc();
                let _ = tx.send(message);
            }
        }
        Err(redis::RedisError::from((redis::ErrorKind::Io, "subscription ended")))
    }
}
