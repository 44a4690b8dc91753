//! What one VM (one Envoy worker) shares between its requests: the
//! [`Worker`] and the stats. The root context makes it; each stream holds it.

use std::rc::Rc;

use sluice_core::Worker;

use crate::stats::Stats;

pub struct Vm {
    pub worker: Rc<Worker>,
    pub stats: Stats,
}
