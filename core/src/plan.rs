//! The one way to plan a request, for the filter's [`Flow`](crate::Flow):
//! `sluice_policies::plan`, where every face plans (the RLS and RLQS faces,
//! `sluice simulate` and the playground's replay, which sit below this
//! crate, too).

pub use sluice_policies::plan::*;
