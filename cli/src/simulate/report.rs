//! The text report, for people: what was read, then per policy its counts,
//! the requests whose key the log does not record (with what to do about
//! it, from the shapes that lacked it), each limit, and the busiest keys as
//! written (decoded from their Redis encoding).

use std::fmt::Write as _;

use sluice_policies::key::{self, ClientIp, KeySource};
use sluice_policies::replay::PolicyReport;

use super::shapes::Shape;

/// What the run read, besides the policies' reports.
pub(crate) struct Read {
    pub(crate) replayed: u64,
    /// Lines read, per shape, in [`Shape::ALL`]'s order.
    pub(crate) shapes: [u64; Shape::ALL.len()],
    pub(crate) bad: u64,
    pub(crate) late: u64,
    pub(crate) window: String,
    pub(crate) ip: ClientIp,
}

pub(crate) fn text(read: &Read, reports: &[PolicyReport]) -> String {
    let mut out = format!("{} requests replayed\n", read.replayed);
    let shapes: Vec<String> = (Shape::ALL.iter().zip(read.shapes))
        .filter(|(_, n)| *n > 0)
        .map(|(shape, n)| format!("{n} {}", shape.name()))
        .collect();
    if !shapes.is_empty() {
        let _ = writeln!(out, "lines read: {}", shapes.join(", "));
    }
    if read.bad > 0 {
        let _ = writeln!(out, "{} bad lines skipped", read.bad);
    }
    if read.late > 0 {
        let _ = writeln!(
            out,
            "{} lines skipped as late: each started before a line already replayed, by more than --reorder {}",
            read.late, read.window
        );
    }
    for r in reports {
        let shadow = if r.shadow { " (shadow)" } else { "" };
        let shadow = match r.face {
            "rls" => format!("{shadow} (RLS face)"),
            "rlqs" => format!("{shadow} (RLQS face)"),
            _ => shadow.to_string(),
        };
        let _ = writeln!(
            out,
            "\npolicy {}{shadow}: {} matched, {} admitted, {} denied, {} missing a key",
            r.policy, r.matched, r.admitted, r.denied, r.missing_key
        );
        for u in &r.unrecorded {
            let _ = writeln!(
                out,
                "  {} not decided: the log does not record their key source {}",
                u.requests, u.source
            );
            for hint in hints(read, &u.source) {
                let _ = writeln!(out, "    {hint}");
            }
        }
        for l in &r.limits {
            let _ = writeln!(out, "  {}: peak {} of {}, denied {}", l.limit, l.peak, l.capacity, l.denied);
        }
        if let Some(tokens) = &r.tokens {
            let _ = writeln!(out, "  LLM tokens charged to admitted requests: {}", tokens.charged);
            if tokens.unlogged > 0 {
                let _ = writeln!(
                    out,
                    "  {} requests without a logged token count were charged a bodiless reservation (default_max_tokens): log their usage as \"tokens\", or map it with --field tokens=FIELD",
                    tokens.unlogged
                );
            }
        }
        if !r.busiest_keys.is_empty() {
            let keys: Vec<String> =
                r.busiest_keys.iter().map(|(k, n)| format!("{} ({n})", key::display(k))).collect();
            let _ = writeln!(out, "  busiest keys: {}", keys.join(", "));
        }
    }
    out
}

/// What each shape read in this run says about a source it did not record.
fn hints(read: &Read, source: &str) -> Vec<String> {
    let Some(source) = KeySource::parse(source) else { return Vec::new() };
    (Shape::ALL.iter().zip(read.shapes))
        .filter(|(_, n)| *n > 0)
        .filter_map(|(shape, _)| shape.hint(source.reads(read.ip)))
        .collect()
}
