//! `sluice simulate --policy FILE LOG`: what would this policy have done to
//! this traffic? Replays an access log (Envoy's default format or JSON
//! lines, see [`log`]) through the matcher and the reference model of the
//! Redis scripts, and reports per policy: requests matched, would-be
//! denials, each limit's peak usage, and the busiest keys. `--format json`
//! gives the same as data.
//!
//! The whole log is read and sorted by start time first (Envoy writes a line
//! when a request ends, not when it starts).

mod log;

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;

use sluice_policies::replay::{PolicyReport, Replay};

#[derive(clap::Args)]
pub struct Args {
    /// The policy document.
    #[arg(long)]
    policy: PathBuf,
    /// `text` for people, `json` for tools.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// The access log: Envoy's default format or JSON lines.
    log: PathBuf,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Format {
    Text,
    Json,
}

/// Runs the simulation; the report as text or JSON.
pub fn run(args: &Args) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(&args.policy)
        .with_context(|| format!("reading {}", args.policy.display()))?;
    let doc = sluice_policies::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", args.policy.display()))?;
    let log =
        std::fs::read_to_string(&args.log).with_context(|| format!("reading {}", args.log.display()))?;
    let mut requests = log
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| log::parse_line(line, i + 1))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.log.display()))?;
    requests.sort_by_key(|r| r.at_us);
    let mut replay = Replay::new(&doc);
    for request in &requests {
        replay.request(request);
    }
    let reports = replay.finish();
    Ok(match args.format {
        Format::Json => serde_json::to_string_pretty(&reports)? + "\n",
        Format::Text => text_report(requests.len(), &reports),
    })
}

fn text_report(requests: usize, reports: &[PolicyReport]) -> String {
    let mut out = format!("{requests} requests replayed\n");
    for r in reports {
        let shadow = if r.shadow { " (shadow)" } else { "" };
        let _ = writeln!(
            out,
            "\npolicy {}{shadow}: {} matched, {} admitted, {} denied, {} missing a key",
            r.policy, r.matched, r.admitted, r.denied, r.missing_key
        );
        for l in &r.limits {
            let _ = writeln!(out, "  {}: peak {} of {}, denied {}", l.limit, l.peak, l.capacity, l.denied);
        }
        if !r.busiest_keys.is_empty() {
            let keys: Vec<String> = r.busiest_keys.iter().map(|(k, n)| format!("{k} ({n})")).collect();
            let _ = writeln!(out, "  busiest keys: {}", keys.join(", "));
        }
    }
    out
}
