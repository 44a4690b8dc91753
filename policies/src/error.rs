//! Parsing a policy document, with errors that say where.

use std::fmt;

use crate::bounds::MAX_DOCUMENT_BYTES;
use crate::limit::LimitType;
use crate::request::Face;
use crate::{Document, Limit};

/// Why a policy document was refused: the JSON path of the offending value,
/// the reason, and the line and column where the parser stood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub path: String,
    pub reason: String,
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} at {}:{}", self.path, self.reason, self.line, self.column)
    }
}

impl std::error::Error for ParseError {}

/// Parses and validates a policy document.
pub fn parse(text: &str) -> Result<Document, ParseError> {
    if text.len() > MAX_DOCUMENT_BYTES {
        return Err(ParseError {
            path: ".".to_string(),
            reason: format!(
                "the document is {} bytes, more than the {MAX_DOCUMENT_BYTES} accepted",
                text.len()
            ),
            line: 1,
            column: 1,
        });
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let doc: Document = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        from_json(&path, err.into_inner(), text)
    })?;
    // Trailing text after the document is an error too.
    de.end().map_err(|err| from_json(".", err, text))?;
    let doc = resolve_classes(doc, text)?;
    quota_charged_each(&doc).and_then(|()| counts_refused_in_windows(&doc)).map_err(|(path, reason)| {
        let (line, column) = end_of(text);
        ParseError { path, reason, line, column }
    })?;
    Ok(doc)
}

/// The document's last line and the column after its last character: where
/// an error known only once the whole document is read is placed.
fn end_of(text: &str) -> (usize, usize) {
    let line = text.lines().count().max(1);
    (line, text.lines().last().map_or(0, |l| l.chars().count()) + 1)
}

/// A `quota` policy's descriptor is answered on its own, the call refused
/// only when every quota descriptor is: its descriptors must be charged
/// each on its own. The offending policy's path and why.
fn quota_charged_each(doc: &Document) -> Result<(), (String, String)> {
    if doc.charge == crate::document::Charge::AllOrNone {
        if let Some(i) = doc.policies.iter().position(|p| p.quota) {
            return Err((
                format!("policies[{i}].quota"),
                "a `quota` policy's descriptor is charged on its own whatever the call's code: charge `each_descriptor` or `every_hit`, not `all_or_none`".to_string(),
            ));
        }
    }
    Ok(())
}

/// `charge: every_hit` counts a refused cost in each window an RLS-face
/// policy's descriptor reaches: every limit of those policies must be a
/// fixed window. The offending limit's path and why.
fn counts_refused_in_windows(doc: &Document) -> Result<(), (String, String)> {
    if !doc.charge.counts_refused() {
        return Ok(());
    }
    for (i, policy) in doc.policies.0.iter().enumerate() {
        if policy.matcher.face() != Face::Rls {
            continue;
        }
        // A hierarchy's levels' limits are in the policy's flat list.
        if let Some((j, limit)) =
            policy.limits.iter().enumerate().find(|(_, l)| l.kind() != LimitType::FixedWindow)
        {
            return Err((
                format!("policies[{i}].limits[{j}]"),
                format!(
                    "`charge: every_hit` counts a refused cost in the window it reaches, and a {} limit has no window to count it in: give the policy fixed_window limits, or charge `each_descriptor`",
                    limit.type_name()
                ),
            ));
        }
    }
    Ok(())
}

/// Resolves each concurrency `reserve.for` to its class's index, and makes
/// sure a shedding policy has classes to shed. Errors are placed at the
/// document's end: they are known only once the whole document is read.
fn resolve_classes(mut doc: Document, text: &str) -> Result<Document, ParseError> {
    let names: Vec<&str> = doc.classes.0.iter().map(|c| c.name.as_str()).collect();
    let known = if names.is_empty() {
        "the document has no `classes`".to_string()
    } else {
        format!("classes: {}", names.join(", "))
    };
    let end = || end_of(text);
    for (i, policy) in doc.policies.0.iter_mut().enumerate() {
        if policy.shed.is_some() && names.len() < 2 {
            let (line, column) = end();
            return Err(ParseError {
                path: format!("policies[{i}].shed"),
                reason: format!(
                    "shedding needs at least two `classes`: the most critical is never shed ({known})"
                ),
                line,
                column,
            });
        }
        for (j, limit) in policy.limits.iter_mut().enumerate() {
            let Limit::Concurrency { reserve: Some(reserve), .. } = limit else { continue };
            match doc.classes.index_of(reserve.for_class.as_str()) {
                Some(index) => reserve.for_index = index,
                None => {
                    let (line, column) = end();
                    return Err(ParseError {
                        path: format!("policies[{i}].limits[{j}].reserve.for"),
                        reason: format!("no class named \"{}\" ({known})", reserve.for_class),
                        line,
                        column,
                    });
                }
            }
        }
    }
    Ok(doc)
}

fn from_json(path: &str, inner: serde_json::Error, text: &str) -> ParseError {
    // The path library marks a map key it has not read yet as `?`.
    let path = path.strip_suffix(".?").unwrap_or(path);
    let path = if path == "." || path == "?" { "(document)" } else { path }.to_string();
    // serde_json appends " at line L column C" to its messages; we report the
    // position in our own format instead.
    let message = inner.to_string();
    let suffix = format!(" at line {} column {}", inner.line(), inner.column());
    let reason = message.strip_suffix(&suffix).unwrap_or(&message);
    let reason = did_you_mean(reason).unwrap_or_else(|| reason.to_string());
    let (line, column) = if reason == "trailing comma" {
        comma_before(text, inner.line(), inner.column())
    } else {
        (inner.line(), inner.column())
    };
    ParseError { path, reason, line, column }
}

/// serde's "unknown field `limt`, expected one of `type`, `limit`, …" as
/// "unknown field `limt`: did you mean `limit`?" when one expected name is
/// close to it (at most a third of its letters differ); `None` otherwise.
fn did_you_mean(reason: &str) -> Option<String> {
    let rest = reason.strip_prefix("unknown field `")?;
    let (unknown, expected) = rest.split_once('`')?;
    let best = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|name| (strsim::damerau_levenshtein(unknown, name), name))
        .min_by_key(|(distance, _)| *distance)?;
    (best.0 <= unknown.chars().count().div_ceil(3))
        .then(|| format!("unknown field `{unknown}`: did you mean `{}`?", best.1))
}

/// Where a trailing comma stands: serde_json stops at the bracket after it,
/// which may be lines further on. Steps back from (line, column), 1-based,
/// over white space to the comma.
fn comma_before(text: &str, line: usize, column: usize) -> (usize, usize) {
    let lines: Vec<&str> = text.split('\n').collect();
    let (mut l, mut c) = (line, column);
    loop {
        let Some(row) = lines.get(l.wrapping_sub(1)) else { return (line, column) };
        let before: Vec<char> = row.chars().take(c.saturating_sub(1)).collect();
        if let Some(at) = before.iter().rposition(|ch| !ch.is_whitespace()) {
            return if before[at] == ',' { (l, at + 1) } else { (line, column) };
        }
        if l <= 1 {
            return (line, column);
        }
        l -= 1;
        c = lines[l - 1].chars().count() + 1;
    }
}
