//! The request as the policy model reads it, over proxy-wasm host calls.
//! A host call that fails reads as an absent value; nothing here panics.

use std::borrow::Cow;

use proxy_wasm::hostcalls::{get_map_value_bytes, get_property};
use proxy_wasm::types::MapType;
use sluice_policies::Request;

pub struct HostRequest {
    path: Vec<u8>,
    method: Vec<u8>,
    authority: Vec<u8>,
}

impl HostRequest {
    pub fn read() -> HostRequest {
        HostRequest {
            path: header(":path").unwrap_or_default(),
            method: header(":method").unwrap_or_default(),
            authority: header(":authority").unwrap_or_default(),
        }
    }
}

impl Request for HostRequest {
    fn path(&self) -> &[u8] {
        &self.path
    }

    fn method(&self) -> &[u8] {
        &self.method
    }

    fn authority(&self) -> &[u8] {
        &self.authority
    }

    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        header(name).map(Cow::Owned)
    }

    fn source_address(&self) -> Option<Cow<'_, [u8]>> {
        get_property(vec!["source", "address"]).ok().flatten().map(Cow::Owned)
    }
}

fn header(name: &str) -> Option<Vec<u8>> {
    get_map_value_bytes(MapType::HttpRequestHeaders, name).ok().flatten()
}
