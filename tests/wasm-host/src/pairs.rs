//! Header maps as Envoy keeps them, and the proxy-wasm wire format for them.
//!
//! Keys are lower-cased on the way in (as Envoy's `LowerCaseString`), values are
//! raw bytes (a header value need not be UTF-8), and a key may repeat. A lookup
//! returns the first value, as Envoy does.
//!
//! The wire format (`proxy_get_header_map_pairs`, `proxy_send_local_response`,
//! `proxy_http_call`): a little-endian u32 count, then a u32 key length and a u32
//! value length per pair, then each key and each value followed by a NUL.

/// An ordered multimap of header names to raw values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderMap(Vec<(String, Vec<u8>)>);

impl HeaderMap {
    pub fn new() -> HeaderMap {
        HeaderMap(Vec::new())
    }

    /// The first value of `key`, compared case-insensitively.
    pub fn get(&self, key: &str) -> Option<&[u8]> {
        let key = key.to_ascii_lowercase();
        self.0.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_slice())
    }

    /// The first value of `key` as text, lossily.
    pub fn get_str(&self, key: &str) -> Option<String> {
        self.get(key).map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// Appends a pair; an existing key keeps its values.
    pub fn add(&mut self, key: &str, value: impl Into<Vec<u8>>) {
        self.0.push((key.to_ascii_lowercase(), value.into()));
    }

    /// Envoy's `setCopy`: the first value of `key` is replaced, or the pair added.
    pub fn replace(&mut self, key: &str, value: impl Into<Vec<u8>>) {
        let key = key.to_ascii_lowercase();
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value.into(),
            None => self.0.push((key, value.into())),
        }
    }

    /// Removes every value of `key`.
    pub fn remove(&mut self, key: &str) {
        let key = key.to_ascii_lowercase();
        self.0.retain(|(k, _)| *k != key);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn pairs(&self) -> &[(String, Vec<u8>)] {
        &self.0
    }

    /// The wire format of this map.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&wire_len(self.0.len()));
        for (k, v) in &self.0 {
            out.extend_from_slice(&wire_len(k.len()));
            out.extend_from_slice(&wire_len(v.len()));
        }
        for (k, v) in &self.0 {
            out.extend_from_slice(k.as_bytes());
            out.push(0);
            out.extend_from_slice(v);
            out.push(0);
        }
        out
    }

    /// Parses the wire format; `None` if it is malformed. An empty buffer is
    /// an empty map, as the SDK sends it.
    pub fn decode(bytes: &[u8]) -> Option<HeaderMap> {
        if bytes.is_empty() {
            return Some(HeaderMap::new());
        }
        let word = |at: usize| -> Option<usize> {
            let raw: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
            usize::try_from(u32::from_le_bytes(raw)).ok()
        };
        let count = word(0)?;
        let mut at = count.checked_mul(8)?.checked_add(4)?;
        let mut map = HeaderMap::new();
        for n in 0..count {
            let (klen, vlen) = (word(4 + n * 8)?, word(8 + n * 8)?);
            let key = bytes.get(at..at.checked_add(klen)?)?;
            at += klen + 1;
            let value = bytes.get(at..at.checked_add(vlen)?)?;
            at += vlen + 1;
            map.0.push((String::from_utf8_lossy(key).into_owned(), value.to_vec()));
        }
        Some(map)
    }
}

impl<K: AsRef<str>, V: AsRef<[u8]>> FromIterator<(K, V)> for HeaderMap {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in iter {
            map.add(k.as_ref(), v.as_ref());
        }
        map
    }
}

fn wire_len(n: usize) -> [u8; 4] {
    u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_then_decode_keeps_order_repeats_and_raw_bytes() {
        let map: HeaderMap =
            [(":path", &b"/a"[..]), ("X-Key", &[0xff, 0]), ("x-key", b"two")].into_iter().collect();
        assert_eq!(HeaderMap::decode(&map.encode()), Some(map.clone()));
        assert_eq!(map.get("x-KEY"), Some(&[0xff, 0][..]));
    }

    #[test]
    fn truncated_wire_data_is_refused() {
        let bytes = [(":path", "/a")].into_iter().collect::<HeaderMap>().encode();
        assert_eq!(HeaderMap::decode(&bytes[..bytes.len() - 3]), None);
        assert_eq!(HeaderMap::decode(&[9, 0, 0, 0]), None);
    }
}
