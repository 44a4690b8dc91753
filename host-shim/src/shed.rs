//! The utilization shedder's shared state: every gateway reports the
//! utilization it sees, and `lua/scripts/shed.lua` runs the controller
//! (`sluice_policies::shed`, its Rust twin) on one hash per policy, so every
//! gateway and worker reads back the same level and sheds the same fraction.

use redis::Script;
use sluice_policies::shed::ShedSettings;
use sluice_policies::units::Millis;
use sluice_policies::PolicyName;

use crate::store::RedisClient;

/// Why a shed report or read failed.
#[derive(Debug, thiserror::Error)]
pub enum ShedError {
    #[error("invalid policy name {0:?}")]
    PolicyName(String),
    #[error("utilization {0} is not a number from 0 to 1")]
    Utilization(f64),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The script answered a level that is not a number.
    #[error("unexpected level {0:?}")]
    Level(String),
}

/// A report refused for what it says is the gateway's mistake (400); one
/// that Redis failed is the store's (503), which the gateway answers with
/// its failure mode, as for a check.
impl From<ShedError> for crate::decision::CheckError {
    fn from(err: ShedError) -> Self {
        match err {
            ShedError::PolicyName(_) | ShedError::Utilization(_) => Self::BadRequest(err.to_string()),
            ShedError::Redis(_) | ShedError::Level(_) => Self::Store(err.to_string()),
        }
    }
}

/// The level after a report, and when the current trouble began.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Level {
    pub level: f64,
    pub trouble_since_ms: Option<u64>,
}

pub struct ShedScript {
    script: Script,
}

impl Default for ShedScript {
    fn default() -> Self {
        ShedScript::new()
    }
}

impl ShedScript {
    pub fn new() -> ShedScript {
        ShedScript {
            script: Script::new(&crate::scripts::assemble(include_str!("../../lua/scripts/shed.lua"))),
        }
    }

    /// The level of `policy` now, changing nothing: a read never moves the
    /// controller's clock, which would lose the time a rise counts from.
    pub async fn read(&self, store: &RedisClient, policy: &str, classes: usize) -> Result<Level, ShedError> {
        if PolicyName::new(policy).is_none() {
            return Err(ShedError::PolicyName(policy.to_string()));
        }
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(key(policy)).arg("level").arg("since");
        let (level, since): (Option<String>, Option<u64>) = store.query(&cmd).await?;
        let top = classes.saturating_sub(1) as f64;
        let level = level.and_then(|l| l.parse::<f64>().ok()).unwrap_or(0.0).clamp(0.0, top);
        Ok(Level { level, trouble_since_ms: since })
    }

    /// Reports `utilization` (0 to 1) for `policy` and returns the level.
    /// `now_ms` is for the shim's test mode; `None` uses Redis TIME.
    pub async fn report(
        &self,
        store: &RedisClient,
        policy: &str,
        classes: usize,
        settings: &ShedSettings,
        utilization: f64,
        now_ms: Option<Millis>,
    ) -> Result<Level, ShedError> {
        if PolicyName::new(policy).is_none() {
            return Err(ShedError::PolicyName(policy.to_string()));
        }
        if !(0.0..=1.0).contains(&utilization) {
            return Err(ShedError::Utilization(utilization));
        }
        let mut call = self.script.prepare_invoke();
        call.key(key(policy))
            .arg(now_ms.map(|t| t.get().to_string()).unwrap_or_default())
            .arg(utilization.to_string())
            .arg(classes)
            .arg(settings.high.to_string())
            .arg(settings.low.to_string())
            .arg(settings.delay.as_millis())
            .arg(settings.ramp.as_millis())
            .arg(settings.recovery.as_millis());
        let (level, since): (String, i64) = store.invoke(&call).await?;
        let level = level.parse().map_err(|_| ShedError::Level(level))?;
        Ok(Level { level, trouble_since_ms: u64::try_from(since).ok() })
    }
}

/// The state hash of `policy`'s controller.
fn key(policy: &str) -> String {
    format!("sluice:{{shed:{policy}}}")
}
