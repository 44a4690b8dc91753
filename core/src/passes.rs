//! What a worker decided without the shim, counted for the shim's
//! dashboard, which would never see it otherwise: failure-mode passes (a
//! request `failure_mode: allow` let through, the shim not answering in
//! time; what `sluice.<policy>.failure_allowed` counts) and denials
//! answered from the over-limit cache (`cache_denied`). One worker counts
//! them per policy and reports them on its tick (`POST /v1/report`), at
//! most once per [`REPORT_EVERY_MS`], only when there is something to
//! report.
//!
//! A report goes only while the shim is answering (its last call
//! succeeded, the breaker closed): passes happen while the shim fails, and
//! reporting them then would only add calls to a failing shim. The counts
//! keep, and go in the first report once it answers again.
//!
//! A report that cannot be sent is dropped: the counts it carried are not
//! kept for a retry, so a long outage costs no memory and no burst of
//! reports afterwards; Envoy's stat still has them. Plain Rust over an
//! injected clock (milliseconds), tested natively.

use sluice_policies::wire::{Passes, ReportRequest, MAX_REPORT_ENTRIES};
use sluice_policies::Document;

/// The shortest time between two reports of one worker.
pub const REPORT_EVERY_MS: u64 = 1_000;

/// Passes counted since the last report, one count per document policy.
#[derive(Debug)]
pub struct FailurePasses {
    counts: Vec<u64>,
    /// Denials answered from the over-limit cache, one count per policy.
    cache_denied: Vec<u64>,
    /// When the last report went, on the gateway's clock.
    reported_ms: Option<u64>,
    /// Whether any count is above 0 (read on every event, so kept).
    counted: bool,
}

impl FailurePasses {
    pub fn new(doc: &Document) -> FailurePasses {
        let counts = vec![0; doc.policies.len()];
        FailurePasses { cache_denied: counts.clone(), counts, reported_ms: None, counted: false }
    }

    /// A request policy `index` applied to was let through by `failure_mode`.
    pub fn add(&mut self, index: usize) {
        if let Some(count) = self.counts.get_mut(index) {
            *count = count.saturating_add(1);
            self.counted = true;
        }
    }

    /// Policy `index` denied a request from the over-limit cache.
    pub fn add_cache_denial(&mut self, index: usize) {
        if let Some(count) = self.cache_denied.get_mut(index) {
            *count = count.saturating_add(1);
            self.counted = true;
        }
    }

    /// When a report is due, if there is something to report.
    pub fn next_due(&self) -> Option<u64> {
        if !self.counted {
            return None;
        }
        Some(self.reported_ms.map_or(0, |at| at.saturating_add(REPORT_EVERY_MS)))
    }

    /// The report to send at `now_ms`, if one is due and there is something
    /// in it; what it carries is taken out of the counts. At most
    /// [`MAX_REPORT_ENTRIES`] policies go in one report; the others wait for
    /// the next. A clock that stepped back makes a report due at once,
    /// rather than none until it catches up.
    pub fn due(&mut self, now_ms: u64, doc: &Document) -> Option<ReportRequest> {
        let waited = self.reported_ms.is_none_or(|at| now_ms < at || now_ms - at >= REPORT_EVERY_MS);
        if !waited || !self.counted {
            return None;
        }
        // Both lists share a report's entries; what does not fit waits.
        let mut room = MAX_REPORT_ENTRIES;
        let mut take = |counts: &mut Vec<u64>| {
            let mut out = Vec::new();
            for (policy, count) in doc.policies.iter().zip(counts.iter_mut()) {
                if *count > 0 && room > 0 {
                    room -= 1;
                    out.push(Passes {
                        policy: policy.name.as_str().to_string(),
                        count: std::mem::take(count),
                    });
                }
            }
            out
        };
        let passes = take(&mut self.counts);
        let cache_denied = take(&mut self.cache_denied);
        self.counted = self.counts.iter().chain(&self.cache_denied).any(|&n| n > 0);
        self.reported_ms = Some(now_ms);
        Some(ReportRequest { passes, cache_denied })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(policies: usize) -> Document {
        let policies: Vec<String> = (0..policies)
            .map(|i| {
                format!(
                    r#"{{"name": "p{i}", "match": {{"path_prefix": "/{i}/"}},
                         "limits": [{{"type": "interval", "every": "1s"}}]}}"#
                )
            })
            .collect();
        let text = format!(r#"{{"policies": [{}]}}"#, policies.join(","));
        sluice_policies::parse(&text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn counts(report: &ReportRequest) -> Vec<(&str, u64)> {
        report.passes.iter().map(|p| (p.policy.as_str(), p.count)).collect()
    }

    /// Nothing is reported without passes; passes go once, then again only
    /// a second later, and each count goes in exactly one report.
    #[test]
    fn reports_at_most_once_a_second_and_only_with_passes() {
        let doc = doc(3);
        let mut passes = FailurePasses::new(&doc);
        assert_eq!(passes.due(1_000, &doc), None);
        passes.add(2);
        passes.add(2);
        passes.add(0);
        passes.add(99);
        let report = passes.due(1_000, &doc).expect("a report");
        assert_eq!(counts(&report), [("p0", 1), ("p2", 2)]);
        assert_eq!(passes.due(1_500, &doc), None, "nothing new");
        passes.add(1);
        assert_eq!(passes.due(1_999, &doc), None, "within a second of the last");
        assert_eq!(passes.due(2_000, &doc).map(|r| counts(&r).len()), Some(1));
        passes.add(1);
        // The gateway's clock stepped back: report now, not in an hour.
        assert_eq!(passes.due(500, &doc).map(|r| r.passes.len()), Some(1));
    }

    /// Denials answered from the over-limit cache go in the report too,
    /// beside the passes, and count once.
    #[test]
    fn cache_denials_are_reported_beside_the_passes() {
        let doc = doc(2);
        let mut passes = FailurePasses::new(&doc);
        passes.add_cache_denial(1);
        passes.add_cache_denial(1);
        let report = passes.due(1_000, &doc).expect("a report of cache denials alone");
        assert!(report.passes.is_empty());
        let denied: Vec<(&str, u64)> =
            report.cache_denied.iter().map(|p| (p.policy.as_str(), p.count)).collect();
        assert_eq!(denied, [("p1", 2)]);
        assert_eq!(report.validate(), Ok(()));
        assert_eq!(passes.due(2_000, &doc), None, "each count in one report");
    }

    /// A document with more policies than a report may carry sends the
    /// rest in the next report, losing none.
    #[test]
    fn the_policies_beyond_one_report_wait_for_the_next() {
        let doc = doc(MAX_REPORT_ENTRIES + 2);
        let mut passes = FailurePasses::new(&doc);
        for i in 0..MAX_REPORT_ENTRIES + 2 {
            passes.add(i);
        }
        let first = passes.due(0, &doc).expect("a report");
        assert_eq!(first.passes.len(), MAX_REPORT_ENTRIES);
        assert_eq!(first.validate(), Ok(()));
        let second = passes.due(REPORT_EVERY_MS, &doc).expect("the rest");
        assert_eq!(counts(&second), [("p256", 1), ("p257", 1)]);
    }
}
