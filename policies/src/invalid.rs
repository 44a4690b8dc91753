//! Why a value was refused: a part of a policy as the parser checks it, a
//! message to the shim as the shim checks it, or an RLS call as it is
//! planned. The path of the offending field within what was checked, and
//! why; the caller that knows where the part sits adds its own path
//! ([`Invalid::within`]). The parser hands the text to serde, which places
//! it in the document; the shim answers it with a 400 or `INVALID_ARGUMENT`.

use std::fmt;

/// A refused value: `path: reason`, or the reason alone when the whole of
/// what was checked is at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    path: String,
    reason: String,
}

impl Invalid {
    /// The whole of what was checked is at fault.
    pub fn new(reason: impl Into<String>) -> Invalid {
        Invalid { path: String::new(), reason: reason.into() }
    }

    /// The field at `path` is at fault.
    pub fn at(path: impl Into<String>, reason: impl Into<String>) -> Invalid {
        Invalid { path: path.into(), reason: reason.into() }
    }

    /// This error of a part that sits at `parent`: `parent.path`, or
    /// `parent` when the part as a whole was at fault. A `parent` ending in
    /// an index (`pauses[2]`) is followed by the field's path all the same.
    pub fn within(self, parent: &str) -> Invalid {
        let path = if self.path.is_empty() { parent.to_string() } else { format!("{parent}.{}", self.path) };
        Invalid { path, ..self }
    }

    /// The path of the offending field, empty when the whole is at fault.
    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.reason)
        } else {
            write!(f, "{}: {}", self.path, self.reason)
        }
    }
}

impl std::error::Error for Invalid {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text a caller reads is the path and the reason, nested paths
    /// joined by dots; `?` carries it into any `Box<dyn Error>` unchanged.
    #[test]
    fn reads_as_path_and_reason_through_a_boxed_error() {
        let nested = Invalid::at("decrease", "above 0 and below 1, got 1").within("adapt").within("upstream");
        assert_eq!(nested.to_string(), "upstream.adapt.decrease: above 0 and below 1, got 1");
        assert_eq!(
            Invalid::new("count 0 out of range").within("limit").to_string(),
            "limit: count 0 out of range"
        );
        let boxed = || -> Result<(), Box<dyn std::error::Error>> { Err(Invalid::new("why"))? };
        assert_eq!(boxed().map_err(|e| e.to_string()), Err("why".to_string()));
    }
}
