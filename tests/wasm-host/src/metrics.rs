//! Metrics as Envoy keeps them for a Wasm filter: counters, gauges and
//! histograms, defined by name. Defining a name again returns a new id for
//! the same metric. Counters only grow (a negative increment is BadArgument);
//! a histogram can be recorded but not read or incremented.

use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
}

impl MetricType {
    pub(crate) fn from_abi(kind: i32) -> Option<MetricType> {
        match kind {
            0 => Some(MetricType::Counter),
            1 => Some(MetricType::Gauge),
            2 => Some(MetricType::Histogram),
            _ => None,
        }
    }
}

/// Why a metric call failed; the host maps these to proxy-wasm statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricError {
    NotFound,
    BadArgument,
}

#[derive(Debug, Default)]
pub struct Metrics {
    ids: Vec<(MetricType, String)>,
    values: HashMap<String, u64>,
    recorded: HashMap<String, Vec<u64>>,
}

impl Metrics {
    pub fn define(&mut self, kind: MetricType, name: &str) -> u32 {
        self.ids.push((kind, name.to_string()));
        self.values.entry(name.to_string()).or_default();
        u32::try_from(self.ids.len()).unwrap_or(u32::MAX)
    }

    fn lookup(&self, id: u32) -> Result<(MetricType, String), MetricError> {
        let index = usize::try_from(id).ok().and_then(|id| id.checked_sub(1));
        index.and_then(|i| self.ids.get(i)).cloned().ok_or(MetricError::NotFound)
    }

    /// The name of metric `id`, for effects.
    pub fn name(&self, id: u32) -> Option<String> {
        self.lookup(id).ok().map(|(_, name)| name)
    }

    pub fn increment(&mut self, id: u32, offset: i64) -> Result<(), MetricError> {
        let (kind, name) = self.lookup(id)?;
        let value = self.values.entry(name).or_default();
        match kind {
            MetricType::Counter if offset >= 0 => *value = value.saturating_add(offset.unsigned_abs()),
            MetricType::Gauge if offset >= 0 => *value = value.saturating_add(offset.unsigned_abs()),
            MetricType::Gauge => *value = value.saturating_sub(offset.unsigned_abs()),
            _ => return Err(MetricError::BadArgument),
        }
        Ok(())
    }

    pub fn record(&mut self, id: u32, value: u64) -> Result<(), MetricError> {
        let (kind, name) = self.lookup(id)?;
        match kind {
            MetricType::Counter => *self.values.entry(name).or_default() += value,
            MetricType::Gauge => *self.values.entry(name).or_default() = value,
            MetricType::Histogram => self.recorded.entry(name).or_default().push(value),
        }
        Ok(())
    }

    pub fn get(&self, id: u32) -> Result<u64, MetricError> {
        match self.lookup(id)? {
            (MetricType::Histogram, _) => Err(MetricError::BadArgument),
            (_, name) => Ok(self.values.get(&name).copied().unwrap_or_default()),
        }
    }

    /// The value of a counter or gauge by name, for assertions.
    pub fn value(&self, name: &str) -> Option<u64> {
        self.values.get(name).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_grow_gauges_move_histograms_record() {
        let mut m = Metrics::default();
        let c = m.define(MetricType::Counter, "c");
        let again = m.define(MetricType::Counter, "c");
        m.increment(c, 2).expect("counter +2");
        m.increment(again, 1).expect("counter +1 through the second id");
        assert_eq!(m.get(c), Ok(3));
        assert_eq!(m.increment(c, -1), Err(MetricError::BadArgument));
        let g = m.define(MetricType::Gauge, "g");
        m.record(g, 10).expect("gauge = 10");
        m.increment(g, -4).expect("gauge -4");
        assert_eq!(m.get(g), Ok(6));
        let h = m.define(MetricType::Histogram, "h");
        m.record(h, 7).expect("histogram");
        assert_eq!(m.get(h), Err(MetricError::BadArgument));
        assert_eq!(m.get(99), Err(MetricError::NotFound));
    }
}
