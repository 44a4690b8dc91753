//! A private Redis Cluster on free loopback ports. [`RedisCluster::start`]
//! gives three masters, for the tests of cross-slot checks;
//! [`RedisCluster::start_with_replicas`] gives three masters with one replica
//! each and a short `cluster-node-timeout`, for failover tests: kill a master
//! ([`RedisCluster::kill`]) and wait for its replica to take over
//! ([`RedisCluster::wait_failover`]).
//!
//! Each node is a guarded `redis-server --cluster-enabled yes`; `redis-cli
//! --cluster create` joins them. Ready once every node reports
//! `cluster_state:ok` (and, with replicas, every replica's link to its master
//! is up).

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::paths::{binary, free_port};
use crate::probe::redis_ping;
use crate::process::{scratch_dir, Proc};

const STARTUP: Duration = Duration::from_secs(30);
const MASTERS: usize = 3;

pub struct RedisCluster {
    /// Every node's port, masters first as created (with replicas, `redis-cli`
    /// makes the first three masters and the rest their replicas).
    pub ports: Vec<u16>,
    cli: std::path::PathBuf,
    nodes: Vec<Proc>,
}

impl RedisCluster {
    /// Three masters, no replicas.
    pub fn start() -> anyhow::Result<RedisCluster> {
        RedisCluster::start_nodes(0, None)
    }

    /// Three masters with one replica each, and `cluster-node-timeout` of
    /// `node_timeout_ms`, after which a dead master's replica takes over.
    pub fn start_with_replicas(node_timeout_ms: u64) -> anyhow::Result<RedisCluster> {
        let cluster = RedisCluster::start_nodes(1, Some(node_timeout_ms))?;
        cluster.wait_replicas_linked()?;
        Ok(cluster)
    }

    fn start_nodes(replicas: usize, node_timeout_ms: Option<u64>) -> anyhow::Result<RedisCluster> {
        let server = binary("SLUICE_REDIS_SERVER", "redis-server")?;
        let cli = server.with_file_name("redis-cli");
        let cli = if cli.exists() { cli } else { binary("SLUICE_REDIS_CLI", "redis-cli")? };
        let mut ports = Vec::new();
        let mut nodes = Vec::new();
        while ports.len() < MASTERS * (1 + replicas) {
            // A node also listens on its port + 10000 for the cluster bus.
            let port = free_port()?;
            if port > 55_000 || std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_err() {
                continue;
            }
            let dir = scratch_dir("redis-cluster")?;
            let mut cmd = Command::new(&server);
            cmd.arg("--port").arg(port.to_string());
            cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--cluster-enabled", "yes"]);
            cmd.arg("--cluster-config-file").arg(dir.join("nodes.conf"));
            if let Some(ms) = node_timeout_ms {
                cmd.arg("--cluster-node-timeout").arg(ms.to_string());
            }
            cmd.arg("--dir").arg(&dir);
            let mut node = Proc::spawn("redis-cluster-node", cmd, dir)?;
            node.wait_ready(STARTUP, || redis_ping(port))?;
            nodes.push(node);
            ports.push(port);
        }
        let mut create = Command::new(&cli);
        create.arg("--cluster").arg("create");
        create.args(ports.iter().map(|p| format!("127.0.0.1:{p}")));
        create.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        let out = create.output().with_context(|| format!("running {}", cli.display()))?;
        if !out.status.success() {
            bail!("redis-cli --cluster create failed: {}", String::from_utf8_lossy(&out.stdout));
        }
        let cluster = RedisCluster { ports, cli, nodes };
        let all = cluster.ports.clone();
        cluster.wait_until("cluster_state:ok on every node", STARTUP, || cluster.all_ok(&all))?;
        Ok(cluster)
    }

    /// `redis://127.0.0.1:PORT` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.ports.iter().map(|p| format!("redis://127.0.0.1:{p}")).collect()
    }

    /// The port of the master that serves `key`'s slot now.
    pub fn master_of(&self, key: &str) -> anyhow::Result<u16> {
        let live = self.live_port().context("no live node")?;
        let slot: u16 = self.cli(live, &["cluster", "keyslot", key])?.trim().parse()?;
        self.slot_master(live, slot).with_context(|| format!("no master serves slot {slot}"))
    }

    /// Fault injection: SIGKILL the node on `port`, as a crash.
    pub fn kill(&mut self, port: u16) -> anyhow::Result<()> {
        let i = self.ports.iter().position(|&p| p == port).context("no such node")?;
        self.nodes[i].kill();
        Ok(())
    }

    /// Waits until the live nodes agree that `key`'s slot has a master other
    /// than `dead_port` and report `cluster_state:ok`: the failover is done.
    /// Returns the new master's port.
    pub fn wait_failover(&self, key: &str, dead_port: u16, within: Duration) -> anyhow::Result<u16> {
        let live: Vec<u16> = self.ports.iter().copied().filter(|&p| p != dead_port).collect();
        let slot: u16 = self.cli(live[0], &["cluster", "keyslot", key])?.trim().parse()?;
        let mut master = None;
        self.wait_until("a replica to take over", within, || {
            let masters: Vec<Option<u16>> = live.iter().map(|&p| self.slot_master(p, slot)).collect();
            let agreed = masters.windows(2).all(|w| w[0] == w[1]);
            master = masters[0].filter(|&m| agreed && m != dead_port);
            master.is_some() && self.all_ok(&live)
        })?;
        master.context("no new master")
    }

    fn live_port(&self) -> Option<u16> {
        self.ports.iter().copied().find(|&p| redis_ping(p))
    }

    /// The master serving `slot`, as the node on `port` sees it (`CLUSTER NODES`).
    fn slot_master(&self, port: u16, slot: u16) -> Option<u16> {
        let nodes = self.cli(port, &["cluster", "nodes"]).ok()?;
        nodes.lines().find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (addr, flags) = (fields.get(1)?, fields.get(2)?);
            if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                return None;
            }
            let serves = fields.iter().skip(8).any(|range| match range.split_once('-') {
                Some((a, b)) => {
                    a.parse().is_ok_and(|a: u16| a <= slot) && b.parse().is_ok_and(|b: u16| slot <= b)
                }
                None => range.parse() == Ok(slot),
            });
            let port = addr.split('@').next()?.rsplit(':').next()?.parse().ok()?;
            serves.then_some(port)
        })
    }

    fn all_ok(&self, ports: &[u16]) -> bool {
        ports.iter().all(|&p| self.cli(p, &["cluster", "info"]).is_ok_and(|o| o.contains("cluster_state:ok")))
    }

    fn wait_replicas_linked(&self) -> anyhow::Result<()> {
        self.wait_until("every replica linked to its master", STARTUP, || {
            self.ports.iter().all(|&p| {
                let info = self.cli(p, &["info", "replication"]).unwrap_or_default();
                info.contains("role:master") || info.contains("master_link_status:up")
            })
        })
    }

    /// `redis-cli -p PORT args...`, its stdout.
    fn cli(&self, port: u16, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(&self.cli).args(["-p", &port.to_string()]).args(args).output()?;
        if !out.status.success() {
            bail!("redis-cli -p {port} {args:?} failed");
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn wait_until(&self, what: &str, within: Duration, mut cond: impl FnMut() -> bool) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if cond() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("waited {within:?} for {what} on the cluster {:?}", self.ports);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
