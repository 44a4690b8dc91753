//! What the filter did with a request, in one word: the value of the
//! `x-sluice-verdict` header that a document with `verdict_header` adds to
//! every response of a request a policy applies to. It tells a request the
//! shim admitted from one that `failure_mode` let through undecided, which a
//! status code alone cannot: both are the upstream's 200.

/// The header's name.
pub const VERDICT_HEADER: &str = "x-sluice-verdict";

/// The words are the names of the per-policy stats that count the same
/// requests (`sluice.P.allowed`, `sluice.P.failure_allowed`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted by the shim or from a lease, or with only shadow policies.
    Allowed,
    /// Refused by the shim.
    Denied,
    /// Refused from the over-limit cache, with no shim call.
    CacheDenied,
    /// Refused by the shedder, or held out of a pool by its reserve.
    Shed,
    /// Not decided: the shim gave no usable answer and `failure_mode: allow`
    /// let the request through. Nothing enforced it.
    FailureAllowed,
    /// Not decided: the shim gave no usable answer and `failure_mode: deny`
    /// refused the request.
    FailureDenied,
    /// Refused: the request lacks a key source its policy requires.
    MissingKey,
    /// Refused (413): its body is larger than the document reads.
    BodyTooLarge,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allowed => "allowed",
            Verdict::Denied => "denied",
            Verdict::CacheDenied => "cache_denied",
            Verdict::Shed => "shed",
            Verdict::FailureAllowed => "failure_allowed",
            Verdict::FailureDenied => "failure_denied",
            Verdict::MissingKey => "missing_key",
            Verdict::BodyTooLarge => "body_too_large",
        }
    }
}
