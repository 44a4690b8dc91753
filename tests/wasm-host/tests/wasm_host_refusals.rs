//! A host call the host refuses never traps the filter's VM. The SDK's
//! wrappers panic on a status they do not expect, and a trap stalls every
//! request of that worker and leaks every lease it holds; Envoy answers
//! BadArgument, for one, to a second local reply in a stream. Each story
//! refuses one host call (`HostConfig::refusing`), sees the refusal logged
//! where the filter warns of it, and then sees the same VM decide on.

use sluice_harness::Backend;
use sluice_wasm_host::{Answer, HostConfig, Plugin, Route, Stream};

const SHIM: &str = "sluice_shim";

/// One request an hour per key; the RateLimit headers on every response.
const DOCUMENT: &str = r#"{"shim": {"cluster": "sluice_shim", "timeout_ms": 2000}, "headers": "always",
    "policies": [{"name": "partner-api", "key": ["header:x-api-key"],
                  "limits": [{"type": "fixed_window", "limit": 1, "window": "1h"}]}]}"#;

fn headers(key: &str) -> [(&str, &[u8]); 4] {
    [(":method", b"GET"), (":path", b"/orders"), (":authority", b"api"), ("x-api-key", key.as_bytes())]
}

/// The filter on a host that refuses every call of `import`, scripted shim.
fn refusing(import: &'static str) -> Plugin {
    configured(HostConfig::new(DOCUMENT).cluster(SHIM, Route::Scripted).refusing(import))
}

fn configured(config: HostConfig) -> Plugin {
    let plugin = Plugin::boot_on(config, SHIM);
    plugin.configure().accepts_configuration().done();
    plugin
}

/// The VM still decides: a new key is checked and admitted, and a key over
/// its limit is refused (429) by the shim's answer.
fn decides_on(plugin: &Plugin, key: &str) {
    let admitted = plugin.stream();
    admitted.request_headers(&headers(key)).calls_the_shim().pauses().done();
    admitted.shim_replies(Answer::Allow).resumes().done();
    let refused = plugin.stream();
    refused.request_headers(&headers(&format!("{key}-2"))).calls_the_shim().pauses().done();
    refused.shim_replies(Answer::Deny { retry_after_ms: 60_000 }).sends(429).done();
}

#[test]
fn a_refused_local_reply_is_logged_and_the_vm_decides_on() {
    let plugin = refusing("proxy_send_local_response");
    let stream = plugin.stream();
    stream.request_headers(&headers("alice")).calls_the_shim().pauses().done();
    stream
        .shim_replies(Answer::Deny { retry_after_ms: 60_000 })
        .warns("cannot send the local response")
        .done();
    // From the over-limit cache: refused again, locally.
    let again = plugin.stream();
    again.request_headers(&headers("alice")).pauses().warns("cannot send the local response").done();
    let admitted = plugin.stream();
    admitted.request_headers(&headers("bob")).calls_the_shim().pauses().done();
    admitted.shim_replies(Answer::Allow).resumes().done();
}

#[test]
fn a_refused_resume_is_logged_and_the_vm_decides_on() {
    let plugin = refusing("proxy_continue_stream");
    let stream = plugin.stream();
    stream.request_headers(&headers("alice")).calls_the_shim().pauses().done();
    stream.shim_replies(Answer::Allow).warns("cannot resume the request").done();
    let refused = plugin.stream();
    refused.request_headers(&headers("bob")).calls_the_shim().pauses().done();
    refused.shim_replies(Answer::Deny { retry_after_ms: 60_000 }).sends(429).done();
}

#[test]
fn refused_response_headers_leave_the_response_and_the_vm_decides_on() {
    for import in ["proxy_add_header_map_value", "proxy_replace_header_map_value"] {
        let plugin = refusing(import);
        let stream = plugin.stream();
        stream.request_headers(&headers("alice")).calls_the_shim().pauses().done();
        stream.shim_replies(Answer::Allow).resumes().done();
        stream.upstream_responds(200).continues().done();
        stream.completes().done();
        decides_on(&plugin, "bob");
    }
}

/// Shared callouts: one call out, a second check queued behind it.
const SHARED: &str = r#"{"shim": {"cluster": "sluice_shim", "timeout_ms": 2000, "shared_calls": 1},
    "failure_mode": "deny",
    "policies": [{"name": "partner-api", "key": ["header:x-api-key"],
                  "limits": [{"type": "fixed_window", "limit": 5, "window": "1h"}]}]}"#;

/// With the VM's wake-up queue refused (registering it, ringing it, or
/// reading it), checks queued behind a lone call go out on the root's tick,
/// and their one answer resumes them.
#[test]
fn a_refused_wake_up_queue_leaves_queued_checks_to_the_tick() {
    let backend = Backend::start().expect("starting redis-server and the shim");
    for import in ["proxy_register_shared_queue", "proxy_enqueue_shared_queue", "proxy_dequeue_shared_queue"]
    {
        let config =
            HostConfig::new(SHARED).cluster(SHIM, Route::Shim { port: backend.shim.port }).refusing(import);
        let plugin = configured(config);
        let first = plugin.stream();
        first.request_headers(&headers(import)).calls_the_shim().pauses().done();
        let queued: Vec<Stream> = (0..2)
            .map(|_| {
                let stream = plugin.stream();
                stream.request_headers(&headers(import)).pauses().done();
                stream
            })
            .collect();
        if import == "proxy_dequeue_shared_queue" {
            // The ring goes out; the root's reading of it is what fails.
            first.shim_answers().resumes().wakes_the_root().done();
            plugin.root_wakes().calls_the_shim_with_a_batch().done();
        } else {
            first.shim_answers().resumes().done();
            plugin.tick().calls_the_shim_with_a_batch().done();
        }
        plugin.shim_answers_background_call(Answer::Real).resumes().resumes().done();
        for stream in &queued {
            assert!(!plugin.proxy().paused(stream.id()), "{import}: a queued request is still held");
        }
    }
}
