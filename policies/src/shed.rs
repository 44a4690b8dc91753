//! The utilization shedder's controller (scenario S4d): when the upstream
//! has been busy for a while, drop the least important traffic with a rising
//! probability, then the next class, never the most critical one, and never
//! swing sharply. Plain Rust over an injected clock (`now_ms` arguments),
//! like the filter's breaker, so tests replay the scenario's timeline.
//!
//! **The level.** One number `level` from 0 to `classes - 1` says how much
//! is shed. Classes are ordered most important first; class `j` is shed with
//! probability `clamp(level - (classes - 1 - j), 0, 1)`. So the least
//! important class goes first, then the next; the most critical class
//! (`j = 0`) never goes, because `level` never exceeds `classes - 1`.
//!
//! **The signal.** Utilization from 0 to 1, observed whenever a report comes:
//! - above `high` (0.8): trouble. After `delay` (28 s) of trouble, `level`
//!   rises at a constant rate that sheds every class but the most critical
//!   `ramp` (92 s) after shedding starts: about 120 s after trouble began;
//! - from `low` to `high` (0.7 to 0.8): the dead zone, `level` holds;
//! - below `low`: `level` falls at the rate that takes `recovery` (180 s) to
//!   go from everything-but-critical to nothing, and the trouble clock resets.
//!
//! `level` only moves at these fixed rates, so a noisy signal at a boundary
//! cannot make it oscillate: near `high` it only ever holds or rises, near
//! `low` it only ever holds or falls.

use serde::Deserialize;

use crate::invalid::Invalid;
use crate::load::Signal;
use crate::units::Duration;

/// A policy's `shed` (scenario S4d): when `signal` says the service is
/// busy, the policy's requests are shed by class, least important first.
///
/// ```json
/// "shed": {"signal": {"orca": "cpu_utilization"}, "controller": {"delay": "28s"}}
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "Shed"))]
#[serde(deny_unknown_fields)]
pub struct ShedPolicy {
    /// Where utilization comes from: `"pool"`, `{"header": NAME}` or `{"orca": FIELD}`.
    #[cfg_attr(feature = "schema", schemars(with = "crate::load::RawSignal"))]
    pub signal: Signal,
    /// The controller's settings; the defaults are the scenario's numbers.
    #[serde(default)]
    pub controller: ShedSettings,
}

impl ShedSettings {
    /// `low <= high`, both from 0 to 1.
    pub fn validate(&self) -> Result<(), Invalid> {
        let unit = 0.0..=1.0;
        if !unit.contains(&self.high) || !unit.contains(&self.low) || self.low > self.high {
            return Err(Invalid::at(
                "controller",
                format!("high {} and low {} must lie from 0 to 1, low at most high", self.high, self.low),
            ));
        }
        Ok(())
    }
}

/// The controller's settings; the defaults are the scenario's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ShedSettings {
    /// Utilization above this is trouble.
    #[serde(default = "default_high")]
    pub high: f64,
    /// Utilization below this lets the shedding fall; between `low` and `high` it holds.
    #[serde(default = "default_low")]
    pub low: f64,
    /// How long trouble lasts before anything is shed.
    #[serde(default = "default_delay")]
    pub delay: Duration,
    /// From the first shedding to shedding every class but the most critical.
    #[serde(default = "default_ramp")]
    pub ramp: Duration,
    /// From shedding every class but the most critical back to nothing.
    #[serde(default = "default_recovery")]
    pub recovery: Duration,
}

fn default_high() -> f64 {
    0.8
}

fn default_low() -> f64 {
    0.7
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n).unwrap_or_else(|| unreachable!("{n} ms is a valid duration"))
}

fn default_delay() -> Duration {
    ms(28_000)
}

fn default_ramp() -> Duration {
    ms(92_000)
}

fn default_recovery() -> Duration {
    ms(180_000)
}

impl Default for ShedSettings {
    fn default() -> Self {
        ShedSettings {
            high: default_high(),
            low: default_low(),
            delay: default_delay(),
            ramp: default_ramp(),
            recovery: default_recovery(),
        }
    }
}

/// The controller's whole state, as `lua/scripts/shed.lua` stores it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ShedState {
    pub level: f64,
    pub trouble_since: Option<u64>,
    pub last_ms: Option<u64>,
}

/// The controller of one policy's shedding. Every gateway must act on the
/// same `level`; see the README for how it is shared.
#[derive(Debug, Clone, PartialEq)]
pub struct Shedder {
    settings: ShedSettings,
    /// The highest level: every class but the most critical shed.
    top: f64,
    level: f64,
    /// When the current trouble began (utilization above `high`).
    trouble_since: Option<u64>,
    last_ms: Option<u64>,
}

impl Shedder {
    /// A controller for `classes` priority classes (at least 1).
    pub fn new(settings: ShedSettings, classes: usize) -> Shedder {
        let top = classes.saturating_sub(1) as f64;
        Shedder { settings, top, level: 0.0, trouble_since: None, last_ms: None }
    }

    /// A controller resumed at `level` (as shared state read back).
    pub fn resume(settings: ShedSettings, classes: usize, level: f64, trouble_since: Option<u64>) -> Shedder {
        let mut shedder = Shedder::new(settings, classes);
        shedder.level = level.clamp(0.0, shedder.top);
        shedder.trouble_since = trouble_since;
        shedder
    }

    /// A controller resumed from its whole [`ShedState`].
    pub fn from_state(settings: ShedSettings, classes: usize, state: ShedState) -> Shedder {
        let mut shedder = Shedder::resume(settings, classes, state.level, state.trouble_since);
        shedder.last_ms = state.last_ms;
        shedder
    }

    /// What `lua/scripts/shed.lua` keeps in Redis.
    pub fn state(&self) -> ShedState {
        ShedState { level: self.level, trouble_since: self.trouble_since, last_ms: self.last_ms }
    }

    /// Takes a utilization report at `now_ms`. Reports out of order (an
    /// earlier time than the last) change nothing.
    pub fn observe(&mut self, now_ms: u64, utilization: f64) {
        let last = match self.last_ms {
            Some(last) if now_ms < last => return,
            Some(last) => last,
            None => now_ms,
        };
        self.last_ms = Some(now_ms);
        if utilization.is_nan() {
            return;
        }
        let s = &self.settings;
        if utilization > s.high {
            let since = *self.trouble_since.get_or_insert(now_ms);
            // Rise only over the part of this interval after the delay.
            let from = last.max(since.saturating_add(s.delay.as_millis()));
            let rising_ms = now_ms.saturating_sub(from) as f64;
            self.level = (self.level + rising_ms * self.top / s.ramp.as_millis() as f64).min(self.top);
        } else if utilization < s.low {
            self.trouble_since = None;
            let falling_ms = now_ms.saturating_sub(last) as f64;
            self.level = (self.level - falling_ms * self.top / s.recovery.as_millis() as f64).max(0.0);
        }
    }

    /// From 0 (nothing shed) to `classes - 1` (all but the most critical).
    pub fn level(&self) -> f64 {
        self.level
    }

    /// When the current trouble began, if utilization is in trouble.
    pub fn trouble_since(&self) -> Option<u64> {
        self.trouble_since
    }

    /// The probability that a request of `class` (0 is the most critical)
    /// is shed now.
    pub fn shed_fraction(&self, class: usize) -> f64 {
        shed_fraction(self.level, self.top as usize + 1, class)
    }
}

/// The probability that a request of `class` (0 is the most critical) of
/// `classes` is shed at `level`: `clamp(level - (classes - 1 - class), 0, 1)`.
/// The most critical class is never shed.
pub fn shed_fraction(level: f64, classes: usize, class: usize) -> f64 {
    if class == 0 {
        return 0.0;
    }
    let rank_from_least = classes.saturating_sub(1) as f64 - class as f64;
    (level - rank_from_least).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLASSES: usize = 4;

    /// Replays `utilization(t)` sampled every `step_ms` from 0 to `until_ms`;
    /// returns the level after each sample.
    fn replay(
        shedder: &mut Shedder,
        until_ms: u64,
        step_ms: u64,
        utilization: impl Fn(u64) -> f64,
    ) -> Vec<(u64, f64)> {
        (0..=until_ms / step_ms)
            .map(|i| {
                let t = i * step_ms;
                shedder.observe(t, utilization(t));
                (t, shedder.level())
            })
            .collect()
    }

    fn first_time(levels: &[(u64, f64)], cond: impl Fn(f64) -> bool) -> Option<u64> {
        levels.iter().find(|(_, l)| cond(*l)).map(|(t, _)| *t)
    }

    #[test]
    fn nothing_is_shed_until_trouble_has_lasted_28_s() {
        let mut s = Shedder::new(ShedSettings::default(), CLASSES);
        let levels = replay(&mut s, 60_000, 100, |_| 0.95);
        assert_eq!(first_time(&levels, |l| l > 0.0), Some(28_100));
    }

    #[test]
    fn every_class_but_the_most_critical_is_shed_about_120_s_in() {
        let mut s = Shedder::new(ShedSettings::default(), CLASSES);
        let levels = replay(&mut s, 200_000, 100, |_| 0.95);
        // Levels add up in floating point: "reached" within a millionth.
        assert_eq!(first_time(&levels, |l| l >= 3.0 - 1e-6), Some(120_000));
        // On the way: the least important class goes first, then the next.
        let at =
            |t: u64| Shedder::resume(ShedSettings::default(), CLASSES, levels[(t / 100) as usize].1, None);
        assert!(at(50_000).shed_fraction(3) > 0.0 && at(50_000).shed_fraction(2) == 0.0);
        assert!(at(80_000).shed_fraction(3) == 1.0 && at(80_000).shed_fraction(2) > 0.0);
        assert_eq!(at(200_000).shed_fraction(3), 1.0);
        assert_eq!(at(200_000).shed_fraction(1), 1.0);
        assert_eq!(at(200_000).shed_fraction(0), 0.0, "the most critical class is never shed");
    }

    #[test]
    fn the_dead_zone_holds_the_level() {
        let mut s = Shedder::new(ShedSettings::default(), CLASSES);
        replay(&mut s, 60_000, 100, |_| 0.95);
        let held = s.level();
        for t in (60_100..=300_000).step_by(100) {
            s.observe(t, 0.75);
            assert_eq!(s.level(), held, "moved in the dead zone at {t}");
        }
    }

    #[test]
    fn below_low_the_shedding_falls_slowly() {
        let mut s = Shedder::resume(ShedSettings::default(), CLASSES, 3.0, Some(0));
        let levels = replay(&mut s, 400_000, 100, |_| 0.5);
        assert_eq!(first_time(&levels, |l| l <= 1e-6), Some(180_000));
        // Slowly: a third of the way after a minute.
        assert!((levels[600].1 - 2.0).abs() < 1e-9, "{}", levels[600].1);
    }

    #[test]
    fn recovery_resets_the_trouble_clock() {
        let mut s = Shedder::new(ShedSettings::default(), CLASSES);
        replay(&mut s, 20_000, 100, |_| 0.95);
        s.observe(20_100, 0.5);
        assert_eq!(s.trouble_since(), None);
        for t in (20_200..=47_000).step_by(100) {
            s.observe(t, 0.95);
        }
        assert_eq!(s.level(), 0.0, "28 s counted from the new trouble, not the old");
    }

    #[test]
    fn a_noisy_signal_at_a_boundary_never_oscillates() {
        // Noise around 0.8: the level only rises or holds.
        let noise = |t: u64| if (t / 100).is_multiple_of(3) { 0.78 } else { 0.83 };
        let mut s = Shedder::new(ShedSettings::default(), CLASSES);
        let levels = replay(&mut s, 200_000, 100, noise);
        assert!(levels.windows(2).all(|w| w[1].1 >= w[0].1), "fell while the signal stayed near 0.8");
        // Noise around 0.7: the level only falls or holds.
        let mut s = Shedder::resume(ShedSettings::default(), CLASSES, 3.0, None);
        let levels = replay(&mut s, 200_000, 100, |t| if (t / 100) % 2 == 0 { 0.69 } else { 0.72 });
        assert!(levels.windows(2).all(|w| w[1].1 <= w[0].1), "rose while the signal stayed near 0.7");
    }

    #[test]
    fn one_class_is_never_shed() {
        let mut s = Shedder::new(ShedSettings::default(), 1);
        replay(&mut s, 300_000, 1_000, |_| 1.0);
        assert_eq!(s.shed_fraction(0), 0.0);
    }

    #[test]
    fn late_reports_and_nan_change_nothing() {
        let mut s = Shedder::new(ShedSettings::default(), CLASSES);
        replay(&mut s, 60_000, 100, |_| 0.95);
        let before = s.clone();
        s.observe(1_000, 0.0);
        s.observe(60_000, f64::NAN);
        assert_eq!(s.level(), before.level());
    }
}
