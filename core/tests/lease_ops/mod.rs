//! The interleavings the leased-mode properties draw
//! (`leased_exact.rs`, `leased_bucket.rs`): requests at gateways, their
//! root contexts' ticks, and lease calls run, answered and failed, in any
//! order, with the clock moving on between them.
#![allow(dead_code)]

use proptest::prelude::*;

#[derive(Debug, Clone)]
pub enum Op {
    /// The true clock moves on by `dt` ms.
    Advance { dt: u64 },
    /// A request at gateway `g`; `refused`: another policy refuses it after its token was taken.
    Request { g: usize, refused: bool },
    /// Gateway `g`'s root context ticks.
    Tick { g: usize },
    /// The shim runs the `n`th call in flight now.
    Run { n: usize },
    /// The `n`th call the shim answered reaches its gateway now.
    Arrive { n: usize },
    /// The `n`th call in flight fails (each property says how: before or
    /// after the shim ran it, its answer lost or refused).
    Fail { n: usize },
}

pub fn op(gateways: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0u64..200).prop_map(|dt| Op::Advance { dt }),
        6 => (0..gateways, prop::bool::weighted(0.2)).prop_map(|(g, refused)| Op::Request { g, refused }),
        2 => (0..gateways).prop_map(|g| Op::Tick { g }),
        2 => any::<usize>().prop_map(|n| Op::Run { n }),
        2 => any::<usize>().prop_map(|n| Op::Arrive { n }),
        1 => any::<usize>().prop_map(|n| Op::Fail { n }),
    ]
}

/// `ops` drawn for four gateways, at `gateways` of them.
pub fn at_gateways(ops: Vec<Op>, gateways: usize) -> Vec<Op> {
    ops.into_iter()
        .map(|op| match op {
            Op::Request { g, refused } => Op::Request { g: g % gateways, refused },
            Op::Tick { g } => Op::Tick { g: g % gateways },
            other => other,
        })
        .collect()
}
