//! `sluice import FILE`: a peer's rate-limit configuration as a Sluice
//! policy document for the RLS face, deciding every descriptor as the peer
//! did: an envoyproxy/ratelimit configuration ([`ratelimit`]) or a
//! Limitador limits file ([`limitador`]), detected or named with `--from`.
//!
//! A construct is carried exactly or listed as a loss, with where it is
//! (its line and path) and why; `sluice import` prints no document while
//! there are losses unless `--accept-losses` accepts them. A configuration
//! the peer itself would refuse to load is refused.

pub mod limitador;
pub mod ratelimit;

use anyhow::Context;
use serde_json::Value;

/// A peer's configuration format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// envoyproxy/ratelimit's YAML: `domain` and a tree of `descriptors`.
    Ratelimit,
    /// Limitador's limits file: a list of limits.
    Limitador,
}

/// The converted document, and what it could not carry.
#[derive(Debug)]
pub struct Imported {
    pub format: Format,
    pub document: Value,
    pub losses: Vec<Loss>,
}

/// A construct that the document does not carry exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loss {
    /// Its line in the file (1 the first), when known.
    pub line: Option<usize>,
    /// Its path in the configuration, e.g. `descriptors[3].value_to_metric`.
    pub at: String,
    /// What is lost, and why.
    pub why: String,
}

impl std::fmt::Display for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}: {}", self.at, self.why),
            None => write!(f, "{}: {}", self.at, self.why),
        }
    }
}

/// Limitador's server setting `--rate-limit-headers`: which headers its
/// answers carry. Not in the limits file, so `sluice import` takes it as a
/// flag of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RateLimitHeaders {
    /// None (Limitador's default).
    #[default]
    #[value(name = "NONE")]
    None,
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset` on every answer.
    #[value(name = "DRAFT_VERSION_03")]
    DraftVersion03,
}

impl Imported {
    /// The document answers with the headers Limitador's server sends
    /// with `--rate-limit-headers`: with `DRAFT_VERSION_03`, draft 03's
    /// on every answer. A Limitador setting: an error for another format.
    pub fn with_rate_limit_headers(mut self, headers: RateLimitHeaders) -> anyhow::Result<Imported> {
        if headers == RateLimitHeaders::None {
            return Ok(self);
        }
        if self.format != Format::Limitador {
            anyhow::bail!("--rate-limit-headers is a setting of Limitador's server, not of an envoyproxy/ratelimit configuration");
        }
        self.document["headers"] = "always".into();
        self.document["header_format"] = "draft_version_03".into();
        Ok(self)
    }
}

pub fn run(path: &std::path::Path, format: Option<Format>) -> anyhow::Result<Imported> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    convert(&text, format).with_context(|| path.display().to_string())
}

/// Converts the YAML text of one configuration, of `format` or the one
/// detected: a list is Limitador's limits, a map envoyproxy/ratelimit's.
pub fn convert(text: &str, format: Option<Format>) -> anyhow::Result<Imported> {
    let format = match format {
        Some(f) => f,
        None => detect(text)?,
    };
    let (document, losses) = match format {
        Format::Ratelimit => ratelimit::convert(text)?,
        Format::Limitador => limitador::convert(text)?,
    };
    Ok(Imported { format, document, losses })
}

fn detect(text: &str) -> anyhow::Result<Format> {
    let value: serde_norway::Value = serde_norway::from_str(text).context("not YAML")?;
    match value {
        serde_norway::Value::Sequence(_) => Ok(Format::Limitador),
        serde_norway::Value::Mapping(_) => Ok(Format::Ratelimit),
        _ => anyhow::bail!(
            "not an envoyproxy/ratelimit configuration (a map with `domain`) nor a Limitador limits file (a list of limits)"
        ),
    }
}

/// The 1-based lines of `text` whose first key is `key` (`key:` or
/// `- key:`), in order: where each item of a list of such maps starts.
fn lines_of(text: &str, key: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            let t = line.trim_start().trim_start_matches("- ").trim_start();
            t.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map(|(i, _)| i + 1)
        .collect()
}
