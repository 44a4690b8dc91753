//! Why a log line could not be read. Only ever shown (on stderr, the first
//! few bad lines named), so the reason is its words.

/// Why a line could not be read, without its number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Unreadable(String);

impl Unreadable {
    pub(crate) fn new(reason: impl Into<String>) -> Unreadable {
        Unreadable(reason.into())
    }
}

impl From<serde_json::Error> for Unreadable {
    fn from(err: serde_json::Error) -> Unreadable {
        Unreadable(err.to_string())
    }
}

impl From<&str> for Unreadable {
    fn from(reason: &str) -> Unreadable {
        Unreadable::new(reason)
    }
}

/// A bad line: its number, from 1, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub(crate) struct BadLine {
    pub line: usize,
    pub reason: Unreadable,
}
