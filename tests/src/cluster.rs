//! A private Redis Cluster of three masters on free loopback ports, for the
//! tests of cross-slot checks. Each node is a guarded `redis-server
//! --cluster-enabled yes`; `redis-cli --cluster create` joins them. Ready
//! once every node reports `cluster_state:ok`.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::paths::{binary, free_port};
use crate::probe::redis_ping;
use crate::process::{scratch_dir, Proc};

const STARTUP: Duration = Duration::from_secs(30);
const NODES: usize = 3;

pub struct RedisCluster {
    pub ports: Vec<u16>,
    _nodes: Vec<Proc>,
}

impl RedisCluster {
    pub fn start() -> anyhow::Result<RedisCluster> {
        let server = binary("SLUICE_REDIS_SERVER", "redis-server")?;
        let cli = server.with_file_name("redis-cli");
        let cli = if cli.exists() { cli } else { binary("SLUICE_REDIS_CLI", "redis-cli")? };
        let mut ports = Vec::new();
        let mut nodes = Vec::new();
        while ports.len() < NODES {
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
            cmd.arg("--dir").arg(&dir);
            let mut node = Proc::spawn("redis-cluster-node", cmd, dir)?;
            node.wait_ready(STARTUP, || redis_ping(port))?;
            nodes.push(node);
            ports.push(port);
        }
        let mut create = Command::new(&cli);
        create.arg("--cluster").arg("create");
        create.args(ports.iter().map(|p| format!("127.0.0.1:{p}")));
        create.args(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = create.output().with_context(|| format!("running {}", cli.display()))?;
        if !out.status.success() {
            bail!("redis-cli --cluster create failed: {}", String::from_utf8_lossy(&out.stdout));
        }
        let cluster = RedisCluster { ports, _nodes: nodes };
        cluster.wait_ok(&cli)?;
        Ok(cluster)
    }

    /// `redis://127.0.0.1:PORT` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.ports.iter().map(|p| format!("redis://127.0.0.1:{p}")).collect()
    }

    fn wait_ok(&self, cli: &std::path::Path) -> anyhow::Result<()> {
        let deadline = Instant::now() + STARTUP;
        loop {
            let ok = self.ports.iter().all(|p| {
                let info = Command::new(cli).args(["-p", &p.to_string(), "cluster", "info"]).output();
                info.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"))
            });
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the cluster on {:?} did not reach cluster_state:ok", self.ports);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
