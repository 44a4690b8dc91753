//! A private Redis behind Sentinel on free loopback ports: a master, one
//! replica and three sentinels (quorum 2) watching the master as
//! [`MASTER_NAME`]. Each is a guarded `redis-server` (a sentinel is
//! `redis-server sentinel.conf --sentinel`, what Debian's `redis-sentinel`
//! runs), persistence off. Ready once the replica's link is up and every
//! sentinel has found the replica and the two other sentinels.
//!
//! For failover tests: kill the master ([`RedisSentinel::kill_master`]) and
//! wait until the sentinels name the replica ([`RedisSentinel::wait_failover`]).

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::paths::{binary, free_port};
use crate::probe::redis_ping;
use crate::process::{scratch_dir, Proc};

const STARTUP: Duration = Duration::from_secs(30);
/// The name the sentinels know the master by (`sentinel monitor NAME ...`).
pub const MASTER_NAME: &str = "sluice";

pub struct RedisSentinel {
    /// The master's port at start (the replica's after a failover).
    pub master_port: u16,
    pub replica_port: u16,
    pub sentinel_ports: Vec<u16>,
    master: Proc,
    replica: Proc,
    sentinels: Vec<Proc>,
}

fn redis_node(server: &std::path::Path, port: u16, replica_of: Option<u16>) -> anyhow::Result<Proc> {
    let dir = scratch_dir("redis-sentinel-node")?;
    let mut cmd = Command::new(server);
    cmd.arg("--port").arg(port.to_string());
    cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]);
    if let Some(master) = replica_of {
        cmd.args(["--replicaof", "127.0.0.1", &master.to_string()]);
    }
    cmd.arg("--dir").arg(&dir);
    let mut node = Proc::spawn("redis-node", cmd, dir)?;
    node.wait_ready(STARTUP, || redis_ping(port))?;
    Ok(node)
}

impl RedisSentinel {
    /// Master, replica and three sentinels that consider the master down
    /// after `down_after_ms` without an answer, and then fail over.
    pub fn start(down_after_ms: u64) -> anyhow::Result<RedisSentinel> {
        let server = binary("SLUICE_REDIS_SERVER", "redis-server")?;
        let master_port = free_port()?;
        let master = redis_node(&server, master_port, None)?;
        let replica_port = free_port()?;
        let replica = redis_node(&server, replica_port, Some(master_port))?;
        let mut sentinels = Vec::new();
        let mut sentinel_ports = Vec::new();
        for _ in 0..3 {
            let port = free_port()?;
            let dir = scratch_dir("redis-sentinel")?;
            // Sentinel rewrites its config file as it learns: it must be writable.
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}\n\
                     sentinel failover-timeout {MASTER_NAME} 10000\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir = dir.display()
                ),
            )
            .with_context(|| format!("writing {}", conf.display()))?;
            let mut cmd = Command::new(&server);
            cmd.arg(&conf).arg("--sentinel");
            let mut sentinel = Proc::spawn("redis-sentinel", cmd, dir)?;
            sentinel.wait_ready(STARTUP, || redis_ping(port))?;
            sentinels.push(sentinel);
            sentinel_ports.push(port);
        }
        let set = RedisSentinel { master_port, replica_port, sentinel_ports, master, replica, sentinels };
        set.wait_ready()?;
        Ok(set)
    }

    /// The sentinels as `--redis-sentinel` takes them: `127.0.0.1:P,...`.
    pub fn sentinels(&self) -> String {
        let addrs: Vec<String> = self.sentinel_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        addrs.join(",")
    }

    fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + STARTUP;
        loop {
            let linked =
                info(self.replica_port, "replication").is_some_and(|i| i.contains("master_link_status:up"));
            let known = self.sentinel_ports.iter().all(|&p| {
                master_state(p).is_some_and(|m| {
                    field(&m, "num-slaves") == Some("1") && field(&m, "num-other-sentinels") == Some("2")
                })
            });
            if linked && known {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the sentinels did not find the replica and each other within {STARTUP:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The master's port as the sentinels name it now (the first that answers).
    pub fn current_master(&self) -> Option<u16> {
        self.sentinel_ports.iter().find_map(|&p| {
            let mut conn = connect(p)?;
            let addr: Vec<String> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(MASTER_NAME)
                .query(&mut conn)
                .ok()?;
            addr.get(1)?.parse().ok()
        })
    }

    /// Fault injection: SIGKILL the master, as a crash.
    pub fn kill_master(&mut self) {
        self.master.kill();
    }

    /// Waits until the sentinels name the replica as the master and it
    /// answers as one; how long that took from the call.
    pub fn wait_failover(&self, within: Duration) -> anyhow::Result<Duration> {
        let started = Instant::now();
        loop {
            let promoted = self.current_master() == Some(self.replica_port)
                && info(self.replica_port, "replication").is_some_and(|i| i.contains("role:master"));
            if promoted {
                return Ok(started.elapsed());
            }
            if started.elapsed() > within {
                bail!("no failover within {within:?}: the sentinels name {:?}", self.current_master());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A connection to the node on `port` (the master, the replica).
    pub fn connection(&self, port: u16) -> anyhow::Result<redis::Connection> {
        connect(port).with_context(|| format!("connecting to 127.0.0.1:{port}"))
    }

    /// The logs of every node, for a failing test.
    pub fn logs(&self) -> String {
        let mut out = vec![self.master.log_tail(), self.replica.log_tail()];
        out.extend(self.sentinels.iter().map(Proc::log_tail));
        out.join("\n")
    }
}

fn connect(port: u16) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    client.get_connection_with_timeout(Duration::from_secs(1)).ok()
}

fn info(port: u16, section: &str) -> Option<String> {
    redis::cmd("INFO").arg(section).query(&mut connect(port)?).ok()
}

/// `SENTINEL MASTER <name>` as flat `field value` pairs.
fn master_state(sentinel_port: u16) -> Option<Vec<String>> {
    redis::cmd("SENTINEL").arg("master").arg(MASTER_NAME).query(&mut connect(sentinel_port)?).ok()
}

fn field<'a>(pairs: &'a [String], name: &str) -> Option<&'a str> {
    pairs.chunks(2).find(|kv| kv[0] == name).and_then(|kv| kv.get(1)).map(String::as_str)
}
