//! The counters and histograms the flow keeps, named once here: the
//! adapter defines one host metric per name (Envoy keeps one stat per name
//! across all workers, so they are totals for the whole proxy) and the flow
//! names them in [`Effect`](crate::Effect)s.
//!
//! Per policy `P`: `sluice.P.<stat>` for each [`PolicyStat`] the policy has
//! ([`PolicyStat::applies`]). Per priority class `C`: `sluice.class.C.<stat>`
//! for each [`ClassStat`]. For the whole filter: [`FilterStat`].

use sluice_policies::Policy;

use crate::wait::holds_leases;

/// Whether a stat counts events or records values (milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Histogram,
    Gauge,
}

macro_rules! stats {
    ($(#[$meta:meta])* $name:ident { $($(#[$doc:meta])* $variant:ident = $text:literal $kind:ident,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$doc])* $variant,)* }

        impl $name {
            /// Every stat, in declaration order (`stat as usize` indexes it).
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The stat's name after its prefix.
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text,)* }
            }

            pub fn kind(self) -> Kind {
                match self { $($name::$variant => Kind::$kind,)* }
            }
        }
    };
}

stats! {
    /// One policy's stats.
    PolicyStat {
        Allowed = "allowed" Counter,
        Denied = "denied" Counter,
        ShadowDenied = "shadow_denied" Counter,
        CacheDenied = "cache_denied" Counter,
        FailureAllowed = "failure_allowed" Counter,
        FailureDenied = "failure_denied" Counter,
        Released = "released" Counter,
        ReleaseFailed = "release_failed" Counter,
        Reclaimed = "reclaimed" Counter,
        /// A policy with `wait`: admitted without being held.
        Immediate = "immediate" Counter,
        /// A policy with `wait`: admitted after being held.
        Waited = "waited" Counter,
        /// A policy with `wait`: how long each admitted request was held, 0 if not.
        WaitMs = "wait_ms" Histogram,
        /// A policy with `wait`: refused at once, its slot further away than the wait.
        WaitTimeout = "wait_timeout" Counter,
        /// A policy with `wait`: the stream ended while the request was held.
        WaitCancelled = "wait_cancelled" Counter,
        /// A policy with a concurrency limit: admission to release.
        HeldMs = "held_ms" Histogram,
        /// A policy with a concurrency limit: leases held longer than `lease`.
        Overages = "overages" Counter,
        /// A policy with `upstream`: the partner's answers that paused its key.
        UpstreamThrottled = "upstream_throttled" Counter,
        /// A policy with `upstream`: of those, hints cut to `max_pause` or ignored as broken.
        UpstreamClamped = "upstream_clamped" Counter,
        /// A policy with `upstream`: requests refused because the partner paused the key.
        PausedDenied = "paused_denied" Counter,
        /// A policy with `upstream` and `wait`: requests held until a pause ended.
        PausedWaited = "paused_waited" Counter,
        /// A policy with `shed`: requests shed.
        Shed = "shed" Counter,
        /// A leased policy: requests admitted from the lease, without a shim call.
        Leased = "leased" Counter,
        /// A leased policy: requests that found the lease empty and asked the shim.
        LeaseEmpty = "lease_empty" Counter,
        /// A leased policy: tokens the shim granted.
        LeaseGranted = "lease_granted" Counter,
        /// A leased policy: unused tokens given back.
        LeaseGivenBack = "lease_given_back" Counter,
        /// A leased policy: lease calls that failed.
        LeaseFailed = "lease_failed" Counter,
        /// A policy with `llm`: tokens reserved at admission.
        LlmTokensReserved = "llm_tokens_reserved" Counter,
        /// A policy with `llm`: tokens charged in the end, true counts and fallbacks.
        LlmTokensCharged = "llm_tokens_charged" Counter,
        /// A policy with `llm`: tokens reserved and not used, which its
        /// settlements asked back.
        LlmTokensRefundRequested = "llm_tokens_refund_requested" Counter,
        /// A policy with `llm`: of those charged, the tokens charged by the fallback.
        LlmTokensFallback = "llm_tokens_fallback" Counter,
        /// A policy with `llm`: responses charged by the fallback (no usage seen).
        LlmFallbacks = "llm_fallbacks" Counter,
        /// A policy with `llm`: responses whose body could not be read (compressed).
        LlmUnreadable = "llm_unreadable" Counter,
        /// A policy with `llm` and `end_stream`: streams ended past the budget.
        LlmStreamsEnded = "llm_streams_ended" Counter,
        /// A policy with `llm`: tokens the shim said it gave back, in its
        /// answers to the settlements sent from the stream.
        LlmTokensGivenBack = "llm_tokens_given_back" Counter,
    }
}

stats! {
    /// One priority class's stats: requests of the class, once each however
    /// many policies apply.
    ClassStat {
        Allowed = "allowed" Counter,
        Denied = "denied" Counter,
        Shed = "shed" Counter,
        /// The fraction of the class the shedder drops now, in thousandths,
        /// summed over the workers.
        ShedPermille = "shed_permille" Gauge,
    }
}

stats! {
    /// The filter's own stats, `sluice.<name>`.
    FilterStat {
        ShimLatencyMs = "shim_latency_ms" Histogram,
        BreakerOpened = "breaker.opened" Counter,
        BreakerClosed = "breaker.closed" Counter,
        /// Workers whose breaker is open right now.
        BreakerOpenWorkers = "breaker.open_workers" Gauge,
        /// Requests refused (413) for a body larger than `max_request_body_bytes`.
        RequestBodyTooLarge = "request_body_too_large" Counter,
    }
}

impl PolicyStat {
    /// Whether `policy` has this stat: the wait, concurrency, upstream, shed
    /// and lease stats only where the policy has that feature.
    pub fn applies(self, policy: &Policy) -> bool {
        use PolicyStat::*;
        let waits = policy.wait.is_some();
        let feedback = policy.upstream.is_some();
        match self {
            Immediate | Waited | WaitMs | WaitTimeout | WaitCancelled => waits,
            HeldMs | Overages => holds_leases(policy),
            UpstreamThrottled | UpstreamClamped | PausedDenied => feedback,
            PausedWaited => feedback && waits,
            Shed => policy.shed.is_some(),
            Leased | LeaseEmpty | LeaseGranted | LeaseGivenBack | LeaseFailed => policy.leased.is_some(),
            LlmTokensReserved
            | LlmTokensCharged
            | LlmTokensRefundRequested
            | LlmTokensGivenBack
            | LlmTokensFallback
            | LlmFallbacks
            | LlmUnreadable => policy.llm.is_some(),
            LlmStreamsEnded => policy.llm.as_ref().is_some_and(|l| l.end_stream),
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `stat as usize` indexes `ALL`: adapters keep one metric id per stat in that order.
    #[test]
    fn all_is_in_declaration_order() {
        for (i, stat) in PolicyStat::ALL.iter().enumerate() {
            assert_eq!(*stat as usize, i);
        }
        for (i, stat) in ClassStat::ALL.iter().enumerate() {
            assert_eq!(*stat as usize, i);
        }
        for (i, stat) in FilterStat::ALL.iter().enumerate() {
            assert_eq!(*stat as usize, i);
        }
    }
}
