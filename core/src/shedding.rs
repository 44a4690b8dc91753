//! Load shedding in one worker (scenario S4d). The fleet's shed level lives
//! in Redis: the shim runs the controller (`lua/scripts/shed.lua`) on every
//! gateway's reports. A worker averages the utilization its responses report
//! per policy, and once a report period it sends the average (or, with no
//! sample, asks only for the level) and keeps the level it gets back. Each
//! request then needs no shim call to know whether it is shed: its class's
//! fraction is known locally. Pure: the caller gives the time and the draw.

use sluice_policies::shed::shed_fraction;
use sluice_policies::Document;

/// How often a worker reports and learns the fleet's level.
pub const REPORT_MS: u64 = 1_000;

pub struct Shedding {
    /// By policy index: `None` for a policy that does not shed.
    policies: Vec<Option<Entry>>,
    classes: usize,
}

#[derive(Default)]
struct Entry {
    level: f64,
    sum: f64,
    samples: u32,
    due_ms: u64,
}

impl Shedding {
    pub fn new(doc: &Document, now_ms: u64) -> Shedding {
        let policies = doc
            .policies
            .iter()
            .map(|p| p.shed.as_ref().map(|_| Entry { due_ms: now_ms, ..Entry::default() }))
            .collect();
        Shedding { policies, classes: doc.classes.count() }
    }

    /// Whether any policy sheds.
    pub fn any(&self) -> bool {
        self.policies.iter().any(Option::is_some)
    }

    /// A response reported `utilization` for policy `index`.
    pub fn observe(&mut self, index: usize, utilization: f64) {
        if let Some(Some(e)) = self.policies.get_mut(index) {
            if (0.0..=1.0).contains(&utilization) {
                e.sum += utilization;
                e.samples += 1;
            }
        }
    }

    /// The reports due at `now_ms`: each shedding policy once a period, with
    /// the mean utilization seen since its last report (`None`: no sample,
    /// only read the level).
    pub fn due(&mut self, now_ms: u64) -> Vec<(usize, Option<f64>)> {
        let mut out = Vec::new();
        for (index, e) in self.policies.iter_mut().enumerate() {
            let Some(e) = e.as_mut().filter(|e| e.due_ms <= now_ms) else { continue };
            let mean = (e.samples > 0).then(|| e.sum / f64::from(e.samples));
            (e.sum, e.samples, e.due_ms) = (0.0, 0, now_ms + REPORT_MS);
            out.push((index, mean));
        }
        out
    }

    /// When the next report is due, if any policy sheds.
    pub fn next_due(&self) -> Option<u64> {
        self.policies.iter().flatten().map(|e| e.due_ms).min()
    }

    /// The fleet's level for policy `index`, as the shim answered.
    pub fn set_level(&mut self, index: usize, level: f64) {
        if let Some(Some(e)) = self.policies.get_mut(index) {
            e.level = level.clamp(0.0, self.classes.saturating_sub(1) as f64);
        }
    }

    /// The fraction of `class` that policy `index` sheds now.
    pub fn fraction(&self, index: usize, class: usize) -> f64 {
        match self.policies.get(index) {
            Some(Some(e)) => shed_fraction(e.level, self.classes, class),
            _ => 0.0,
        }
    }

    /// Whether policy `index` sheds a request of `class`, given a uniform
    /// `draw` from 0 to 1.
    pub fn sheds(&self, index: usize, class: usize, draw: f64) -> bool {
        draw < self.fraction(index, class)
    }

    /// The largest fraction of `class` any policy sheds now.
    pub fn class_fraction(&self, class: usize) -> f64 {
        (0..self.policies.len()).map(|i| self.fraction(i, class)).fold(0.0, f64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> Document {
        sluice_policies::parse(
            r#"{"classes": [{"name": "critical"}, {"name": "normal"}, {"name": "batch"}],
                "policies": [
                  {"name": "plain", "limits": [{"type": "interval", "every": "1s"}]},
                  {"name": "shed", "shed": {"signal": {"header": "x-load"}},
                   "limits": [{"type": "concurrency", "limit": 100, "lease": "30s"}]}]}"#,
        )
        .expect("doc")
    }

    #[test]
    fn each_shedding_policy_reports_its_mean_once_a_period() {
        let mut s = Shedding::new(&doc(), 0);
        assert!(s.any());
        assert_eq!(s.due(0), vec![(1, None)], "no sample yet: only read the level");
        s.observe(1, 0.9);
        s.observe(1, 0.7);
        s.observe(0, 0.9);
        assert!(s.due(REPORT_MS - 1).is_empty());
        let due = s.due(REPORT_MS);
        assert_eq!(due.len(), 1);
        assert!((due[0].1.expect("a mean") - 0.8).abs() < 1e-12);
        assert_eq!(s.due(2 * REPORT_MS), vec![(1, None)], "the samples went with the report");
    }

    #[test]
    fn out_of_range_samples_are_no_report() {
        let mut s = Shedding::new(&doc(), 0);
        s.observe(1, 1.5);
        s.observe(1, f64::NAN);
        assert_eq!(s.due(0), vec![(1, None)]);
    }

    #[test]
    fn the_level_sheds_the_least_important_class_first_never_the_most_critical() {
        let mut s = Shedding::new(&doc(), 0);
        s.set_level(1, 1.5);
        assert_eq!(s.fraction(1, 2), 1.0);
        assert_eq!(s.fraction(1, 1), 0.5);
        assert_eq!(s.fraction(1, 0), 0.0);
        assert_eq!(s.fraction(0, 2), 0.0, "a policy without shed sheds nothing");
        assert!(s.sheds(1, 1, 0.49) && !s.sheds(1, 1, 0.5));
        s.set_level(1, 99.0);
        assert_eq!(s.fraction(1, 0), 0.0, "a level beyond the top still spares the most critical");
        assert_eq!(s.class_fraction(1), 1.0);
    }
}
