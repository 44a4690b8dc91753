//! `sluice simulate --policy FILE LOG`: what would this policy have done to
//! this traffic? Replays an access log through the matcher and the
//! reference model of the Redis scripts, and reports per policy: requests
//! matched, would-be denials, each limit's peak usage, and the busiest keys.
//! `--format json` gives the same as data.
//!
//! The log is streamed, line by line, whatever its size. Envoy writes a line
//! when a request ends, not when it starts, so lines pass through a bounded
//! reorder buffer (`--reorder`, 60 s by default) on their way to the replay.
//! A bad line is counted and skipped, the first few named on stderr.
//!
//! # Layout
//!
//! - `shapes`: the shapes of log a line may have, told apart by their
//!   fields, and what to do when one does not record a key's source.
//! - `log`: one line read into a request and what its record holds;
//!   Envoy's text format and Sluice's own JSON lines.
//! - `fields`: `--field` mappings, and Istio's and Envoy Gateway's JSON
//!   logs as built-in ones.
//! - `reorder`: the reorder buffer, a min-heap on start time.
//! - `progress`: lines per second on a terminal.
//! - `report`: the text report.
//! - `time`: a line's RFC 3339 time.

mod fields;
mod log;
mod progress;
mod reorder;
mod report;
mod shapes;
mod time;
mod unreadable;

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;

use sluice_policies::document::TrustedHops;
use sluice_policies::replay::Replay;

use self::fields::Mapping;
use self::reorder::Reorder;
use self::shapes::Shape;

#[derive(clap::Args)]
pub struct Args {
    /// The policy document.
    #[arg(long)]
    policy: PathBuf,
    /// `text` for people, `json` for tools.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// How many proxies append to x-forwarded-for in front of the gateway
    /// that wrote the log, 0 to 16: overrides the document's `trusted_hops`
    /// for the replay; 1 or more reads the client from x-forwarded-for.
    #[arg(long, value_name = "N")]
    trusted_hops: Option<u64>,
    /// How far out of start order lines may come (they are written when
    /// requests end); a line later than this is counted and skipped.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration)]
    reorder: std::time::Duration,
    /// Read JSON lines through a mapping, TARGET=FIELD: TARGET is time,
    /// time_ms, method, path, authority, source, duration_ms, tokens (a
    /// request's LLM token count) or header:NAME.
    /// Repeat it for each field; unmapped fields are ignored.
    #[arg(long = "field", value_name = "TARGET=FIELD")]
    fields: Vec<String>,
    /// The access log: Envoy's default text format, Istio's or Envoy
    /// Gateway's default JSON, Sluice's JSON lines, or JSON read with --field.
    log: PathBuf,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Format {
    Text,
    Json,
}

/// How many bad lines are named on stderr; the rest are only counted.
const SHOWN_ERRORS: u64 = 10;

/// A finished run: the report, and how many lines it had to skip.
pub struct Simulated {
    pub report: String,
    pub bad_lines: u64,
}

/// Runs the simulation; bad lines are named on `errors`. An error when
/// the policy or log cannot be read, or when no line of the log could be.
pub fn run(args: &Args, errors: &mut dyn Write) -> anyhow::Result<Simulated> {
    let text = std::fs::read_to_string(&args.policy)
        .with_context(|| format!("reading {}", args.policy.display()))?;
    let mut doc =
        sluice_policies::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", args.policy.display()))?;
    if let Some(n) = args.trusted_hops {
        doc.trusted_hops =
            TrustedHops::new(n).ok_or_else(|| anyhow::anyhow!("--trusted-hops {n}: expected 0 to 16"))?;
    }
    let reader = log::Reader::new(Mapping::parse(&args.fields)?);
    let file = File::open(&args.log).with_context(|| format!("reading {}", args.log.display()))?;
    let window_us = u64::try_from(args.reorder.as_micros()).unwrap_or(u64::MAX);

    let mut replay = Replay::new(&doc);
    let mut reorder = Reorder::new(window_us);
    let mut read = report::Read {
        replayed: 0,
        shapes: [0; Shape::ALL.len()],
        bad: 0,
        late: 0,
        window: humantime::format_duration(args.reorder).to_string(),
        ip: doc.trusted_hops.client_ip(),
    };
    let mut bad = |read: &mut report::Read, reason: String| {
        read.bad += 1;
        if read.bad <= SHOWN_ERRORS {
            let _ = writeln!(errors, "{}: {reason}", args.log.display());
        }
    };
    let mut progress = progress::Progress::new();
    let mut input = BufReader::with_capacity(1 << 16, file);
    let mut buf = Vec::new();
    let mut line = 0;
    loop {
        buf.clear();
        let n =
            input.read_until(b'\n', &mut buf).with_context(|| format!("reading {}", args.log.display()))?;
        if n == 0 {
            break;
        }
        line += 1;
        progress.line(line);
        let Ok(text) = std::str::from_utf8(&buf) else {
            bad(&mut read, format!("line {line}: not UTF-8"));
            continue;
        };
        if text.trim().is_empty() {
            continue;
        }
        match reader.read(text, line) {
            Ok((shape, logged)) => {
                read.shapes[shape as usize] += 1;
                if reorder.push(logged.at_us, logged).is_err() {
                    read.late += 1;
                }
                while let Some(logged) = reorder.pop_ready() {
                    replay.request(&logged);
                    read.replayed += 1;
                }
            }
            Err(reason) => bad(&mut read, reason.to_string()),
        }
    }
    while let Some(logged) = reorder.pop_any() {
        replay.request(&logged);
        read.replayed += 1;
    }
    progress.finish();
    summarize(errors, &args.log, &read);
    let lines_read: u64 = read.shapes.iter().sum();
    if lines_read == 0 && read.bad > 0 {
        anyhow::bail!("{}: no line could be read ({} bad lines)", args.log.display(), read.bad);
    }
    let reports = replay.finish();
    let report = match args.format {
        Format::Json => serde_json::to_string_pretty(&reports)? + "\n",
        Format::Text => report::text(&read, &reports),
    };
    Ok(Simulated { report, bad_lines: read.bad })
}

/// What was skipped, on stderr, whatever the report's format.
fn summarize(errors: &mut dyn Write, log: &Path, read: &report::Read) {
    if read.bad > SHOWN_ERRORS {
        let _ = writeln!(
            errors,
            "{}: {} bad lines skipped, the first {SHOWN_ERRORS} named",
            log.display(),
            read.bad
        );
    } else if read.bad > 0 {
        let _ = writeln!(errors, "{}: {} bad lines skipped", log.display(), read.bad);
    }
    if read.late > 0 {
        let _ = writeln!(
            errors,
            "{}: {} lines skipped as late, beyond --reorder {}",
            log.display(),
            read.late,
            read.window
        );
    }
}
