//! What matching and key building read from a request. The filter implements
//! this over proxy-wasm host calls; tests implement it over plain values.

pub trait Request {
    /// The `:path` pseudo-header, query included; empty if absent.
    fn path(&self) -> &[u8];
    /// The `:method` pseudo-header; empty if absent.
    fn method(&self) -> &[u8];
    /// A request header's value, by lower-case name.
    fn header(&self, name: &str) -> Option<Vec<u8>>;
}
