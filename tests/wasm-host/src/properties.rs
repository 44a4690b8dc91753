//! Properties, as Envoy's attribute paths (`source.address`, `request.path`,
//! `request.headers.<name>`, `plugin_root_id`, ...). String attributes are raw
//! bytes and integers little-endian i64, as Envoy serializes them. Paths the
//! filter set with `proxy_set_property` read back; anything else is NotFound.
//!
//! The `request.*` attributes come from the request headers the stream began
//! with, and stay readable after the request continued, as in Envoy.

use super::state::HostState;

/// The value at `path` (segments as the filter sent them, NUL-separated).
pub(crate) fn get(state: &HostState, path: &[u8]) -> Option<Vec<u8>> {
    let segments: Vec<String> =
        path.split(|b| *b == 0).map(|s| String::from_utf8_lossy(s).into_owned()).collect();
    let key = segments.join(".");
    let stream = state.streams.get(&state.effective);
    if let Some(value) = stream.and_then(|s| s.properties.get(&key)) {
        return Some(value.clone());
    }
    let text = |s: &str| Some(s.as_bytes().to_vec());
    match segments.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["plugin_root_id"] | ["plugin_name"] => text(&state.root_id),
        ["plugin_vm_id"] => text(""),
        ["source", "address"] => text(&state.source_address),
        ["source", "port"] => {
            let port = state.source_address.rsplit(':').next()?.parse::<i64>().ok()?;
            Some(port.to_le_bytes().to_vec())
        }
        ["destination", "address"] => text("127.0.0.1:10000"),
        ["request", "protocol"] => text("HTTP/1.1"),
        ["request", attribute] => {
            let headers = &stream?.request_headers;
            let header = match *attribute {
                "path" => ":path",
                "url_path" => {
                    let path = headers.get(":path")?;
                    let end = path.iter().position(|b| *b == b'?').unwrap_or(path.len());
                    return Some(path[..end].to_vec());
                }
                "host" => ":authority",
                "scheme" => ":scheme",
                "method" => ":method",
                "referer" => "referer",
                "useragent" => "user-agent",
                "id" => "x-request-id",
                _ => return None,
            };
            headers.get(header).map(<[u8]>::to_vec)
        }
        ["request", "headers", name] => stream?.request_headers.get(name).map(<[u8]>::to_vec),
        _ => None,
    }
}

/// Stores a property set by the filter, on the effective context.
pub(crate) fn set(state: &mut HostState, path: &[u8], value: Vec<u8>) -> bool {
    let key = path.split(|b| *b == 0).map(String::from_utf8_lossy).collect::<Vec<_>>().join(".");
    let Some(stream) = state.stream() else { return false };
    stream.properties.insert(key, value);
    true
}
