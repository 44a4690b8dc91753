//! Shared data with Envoy's semantics: one map per VM id, shared by every
//! worker's VM (share the `Arc` between two [`super::Proxy`]s to model two
//! workers). Every write gets a fresh, non-zero cas. A write with cas 0
//! overwrites; a write with a stale cas gets CasMismatch; a key that does not
//! exist accepts any cas, so two workers creating the same key can both win.
//! Entries never expire.

use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetResult {
    Ok,
    CasMismatch,
}

#[derive(Debug)]
pub struct SharedData {
    entries: HashMap<String, (Vec<u8>, u32)>,
    next_cas: u32,
}

impl Default for SharedData {
    fn default() -> SharedData {
        SharedData { entries: HashMap::new(), next_cas: 1 }
    }
}

impl SharedData {
    /// The value and its cas; `None` when the key was never set.
    pub fn get(&self, key: &str) -> Option<(&[u8], u32)> {
        self.entries.get(key).map(|(value, cas)| (value.as_slice(), *cas))
    }

    pub fn set(&mut self, key: &str, value: &[u8], cas: u32) -> SetResult {
        if let Some((_, current)) = self.entries.get(key) {
            if cas != 0 && cas != *current {
                return SetResult::CasMismatch;
            }
        }
        let cas = self.next_cas();
        self.entries.insert(key.to_string(), (value.to_vec(), cas));
        SetResult::Ok
    }

    fn next_cas(&mut self) -> u32 {
        let cas = self.next_cas;
        self.next_cas = self.next_cas.wrapping_add(1).max(1);
        cas
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_cas_is_refused_and_cas_zero_overwrites() {
        let mut data = SharedData::default();
        assert_eq!(data.set("k", b"a", 0), SetResult::Ok);
        let (_, cas) = data.get("k").expect("set");
        assert_eq!(data.set("k", b"b", cas), SetResult::Ok);
        assert_eq!(data.set("k", b"c", cas), SetResult::CasMismatch);
        assert_eq!(data.get("k").map(|(v, _)| v), Some(&b"b"[..]));
        assert_eq!(data.set("k", b"d", 0), SetResult::Ok);
        assert_eq!(data.get("k").map(|(v, _)| v), Some(&b"d"[..]));
    }

    #[test]
    fn a_missing_key_accepts_any_cas() {
        let mut data = SharedData::default();
        assert_eq!(data.get("new"), None);
        assert_eq!(data.set("new", b"x", 12345), SetResult::Ok);
        assert_ne!(data.get("new").map(|(_, cas)| cas), Some(0));
    }
}
