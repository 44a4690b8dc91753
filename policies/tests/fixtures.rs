//! Every kind of mistake in a policy document, one fixture each in
//! `fixtures/`, refused with its exact message: the JSON path, the reason,
//! and the line and column.

use sluice_policies::parse;

fn error_of(text: &str) -> String {
    match parse(text) {
        Ok(doc) => panic!("expected an error, parsed {doc:?}"),
        Err(err) => err.to_string(),
    }
}

macro_rules! fixtures {
    ($($name:ident => $message:expr,)*) => {
        $(
            #[test]
            fn $name() {
                let text = include_str!(concat!("fixtures/", stringify!($name), ".json"));
                assert_eq!(error_of(text), $message);
            }
        )*

        /// Every file in `fixtures/` has its test above.
        #[test]
        fn every_fixture_has_a_test() {
            let tested = [$(stringify!($name)),*];
            let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
            for entry in std::fs::read_dir(dir).expect("fixtures dir") {
                let path = entry.expect("dir entry").path();
                let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
                assert!(tested.contains(&stem.as_str()), "fixture {} has no test", path.display());
            }
        }
    };
}

fixtures! {
    level_key_not_nested => r#"policies[0]: levels[0].key ["header:x-team"] does not begin with the policy's `key` ["header:x-org"]: a level is keyed within the level above it, so that every level's state shares the top level's Redis Cluster hash tag and one atomic call charges them all; begin it with those sources, or make it a policy of its own at 11:3"#,
    level_duplicate_name => r#"policies[0]: levels[1]: duplicate level name "team" at 12:3"#,
    level_without_limits => r#"policies[0]: levels[0]: a level needs at least one limit at 11:3"#,
    level_too_many_key_sources => r#"policies[0]: levels[0]: 9 key sources, more than the 8 a level may have at 12:3"#,
    leased_with_levels => r#"policies[0]: `leased` cannot be used with `levels`: a lease is taken from one window, and a hierarchy charges every level at once at 12:3"#,
    calendar_on_a_sliding_window => r#"policies[0].limits[0]: a sliding_window's `window` is a duration: calendar windows are for fixed_window and points limits at 7:7"#,
    calendar_unknown_zone => r#"policies[0].limits[0].window: unknown time zone "Europe/Atlantis" (expected an IANA name such as "UTC" or "Europe/Paris") at 6:104"#,
    calendar_anchor_on_a_day => r#"policies[0].limits[0].window: `anchor` is for a month calendar at 6:106"#,
    calendar_anchor_out_of_range => r#"policies[0].limits[0].refill: invalid anchor 32 (expected a day of the month, 1 to 31) at 6:119"#,
    calendar_starts_on_a_month => r#"policies[0].limits[0].refill: `starts` is for a week calendar at 6:125"#,
    calendar_bad_starts => r#"policies[0].limits[0].window: invalid starts "funday" (expected a day, "monday" to "sunday") at 6:113"#,
    calendar_with_wait => r#"policies[0]: `wait` cannot be used with a calendar window (limits[0]): a full calendar window opens again at its end, hours or days away at 10:3"#,
    leased_on_a_calendar_window => r#"policies[0]: `leased` needs a fixed_window with a duration `window`, not a calendar: a lease names its window by its index since the epoch at 8:3"#,
    llm_without_llm_tokens_limit => r#"policies[0]: `llm` needs a points limit with "cost": "llm_tokens" to charge at 8:3"#,
    llm_tokens_without_llm => r#"policies[0]: limits[0] costs llm_tokens: give the policy an `llm` that says where they are read at 7:3"#,
    llm_tokens_with_actual_cost_header => r#"policies[0].limits[0]: a limit that costs llm_tokens reads its true cost from the response's body: drop `actual_cost_header` at 6:126"#,
    llm_without_api_or_usage => r#"policies[0].llm: give `api` (a known API's shape) or `usage` (its JSON pointers) at 5:40"#,
    llm_usage_total_and_parts => r#"policies[0].llm: give `usage.total`, or both `usage.input` and `usage.output` at 5:89"#,
    llm_weights_with_total => r#"policies[0].llm: `weights` need input and output counts, not `usage.total` at 5:82"#,
    llm_weight_out_of_range => r#"policies[0].llm: weights.input -1 out of range (0 to 1000) at 5:68"#,
    llm_weights_zero => r#"policies[0].llm: weights.input and weights.output are both 0: nothing would be charged at 5:80"#,
    llm_setting_out_of_range => r#"policies[0].llm: bytes_per_token 0 out of range (1 to 1000000000) at 5:62"#,
    llm_end_stream_without_api => r#"policies[0].llm: `end_stream` needs `api`: the API's shape says what its content and its errors look like at 5:76"#,
    llm_usage_too_many_pointers => r#"policies[0].llm: a usage count sums 1 to 8 pointers at 5:105"#,
    llm_unknown_api => r#"policies[0].llm.api: unknown variant `gemini`, expected one of `openai_chat`, `openai_responses`, `anthropic_messages` at 5:29"#,
    bad_json_pointer => r#"policies[0].llm.usage.total: invalid JSON pointer "usage.total_tokens" (expected e.g. "/usage/total_tokens", at most 256 bytes) at 5:53"#,
    bad_body_key_source => r#"policies[0].key[0]: invalid key source "body:model" (expected "header:NAME", "ip", "path", "method", "host", "query:NAME", "entry:NAME", "bucket:NAME" or "body:/POINTER") at 5:27"#,
    max_request_body_too_large => r#"max_request_body_bytes: invalid max_request_body_bytes 100000000 (expected 1 to 16777216) at 2:37"#,
    grpc_face_body => r#"policies[0]: a `body` condition reads an HTTP request's body: a gRPC-face policy (its `match` names `domain`, `entries` or `bucket`) never sees one at 8:3"#,
    bad_entry_condition_key => r#"policies[0].match: invalid entry key "" (expected 1 to 128 bytes) at 4:67"#,
    bad_entry_key_source => r#"policies[0].key[0]: invalid key source "entry:" (expected "header:NAME", "ip", "path", "method", "host", "query:NAME", "entry:NAME", "bucket:NAME" or "body:/POINTER") at 5:21"#,
    entry_key_on_http_policy => r#"policies[0]: key source "entry:remote_address" reads a gRPC face's entries: only a policy whose `match` names `domain` or `entries` has them at 7:4"#,
    grpc_face_actual_cost => r#"policies[0]: a gRPC-face policy (its `match` names `domain` or `entries`) cannot read an `actual_cost_header` (limits[0]): its face never sees the response at 6:4"#,
    grpc_face_concurrency => r#"policies[0]: a gRPC-face policy (its `match` names `domain` or `entries`) cannot have a concurrency limit (limits[0]): its face answers once and never hears the request end, so a slot would never be released at 6:4"#,
    grpc_face_leased => r#"policies[0]: a gRPC-face policy (its `match` names `domain` or `entries`) cannot use `leased`: leases are spent inside the Sluice filter at 7:4"#,
    grpc_face_shed => r#"policies[0]: a gRPC-face policy (its `match` names `domain` or `entries`) cannot use `shed`: its face reads no utilization at 8:4"#,
    grpc_face_upstream => r#"policies[0]: a gRPC-face policy (its `match` names `domain` or `entries`) cannot use `upstream`: its face never sees the partner's answer at 7:4"#,
    grpc_face_wait => r#"policies[0]: a gRPC-face policy (its `match` names `domain` or `entries`) cannot use `wait`: its face answers at once and cannot hold a request at 7:4"#,
    bad_bucket_condition_key => r#"policies[0].match: invalid bucket key "" (expected 1 to 128 bytes) at 4:66"#,
    bucket_key_on_http_policy => r#"policies[0]: key source "bucket:client" reads an RLQS bucket id: only a policy whose `match` names `bucket` has one at 7:4"#,
    rlqs_bucket_and_entries => r#"policies[0].match: give `entries` (an RLS descriptor's) or `bucket` (an RLQS bucket id's), not both: a request comes through one face at 4:113"#,
    rlqs_face_actual_cost => r#"policies[0]: an RLQS-face policy (its `match` names `bucket`) cannot read an `actual_cost_header` (limits[0]): its face never sees the response at 6:4"#,
    rlqs_face_concurrency => r#"policies[0]: an RLQS-face policy (its `match` names `bucket`) cannot have a concurrency limit (limits[0]): its face answers once and never hears the request end, so a slot would never be released at 6:4"#,
    rlqs_face_http_condition => r#"policies[0]: an RLQS-face policy (its `match` names `bucket`) cannot read `headers` in its `match`: an RLQS bucket has only a domain and a bucket id (`bucket`) at 7:4"#,
    rlqs_face_key_source => r#"policies[0]: an RLQS-face policy (its `match` names `bucket`) takes its key from the bucket id ("bucket:NAME"), not from key source "header:x-api-key" at 8:4"#,
    rlqs_face_shadow => r#"policies[0]: an RLQS-face policy (its `match` names `bucket`) cannot be `shadow`: Envoy enforces its assignments itself and reports no would-deny (preview a bucket with the matcher's `keep_matching` instead) at 8:4"#,
    rlqs_face_shed => r#"policies[0]: an RLQS-face policy (its `match` names `bucket`) cannot use `shed`: its face reads no utilization at 8:4"#,
    rlqs_face_sliding_window => r#"policies[0]: an RLQS-face policy (its `match` names `bucket`) can enforce only a fixed_window limit (limits[0] is a sliding_window): Envoy spends an assignment's tokens anywhere in the window they were charged to at 7:4"#,
    rlqs_face_ttl_not_whole_seconds => r#"policies[0]: `leased.ttl` 1500ms of an RLQS-face policy (its `match` names `bucket`) is not a whole number of seconds: Envoy reads an assignment's time to live in whole seconds at 7:4"#,
    rlqs_face_two_limits => r#"policies[0]: an RLQS-face policy (its `match` names `bucket`) takes exactly one limit, a fixed_window (it has 2): Envoy enforces one token bucket per bucket at 10:4"#,
    rlqs_face_unlimited_leased => r#"policies[0]: an `unlimited` policy has no `leased`: it limits nothing at 7:4"#,
    rlqs_face_upstream => r#"policies[0]: an RLQS-face policy (its `match` names `bucket`) cannot use `upstream`: its face never sees the partner's answer at 7:4"#,
    rlqs_face_wait => r#"policies[0]: an RLQS-face policy (its `match` names `bucket`) cannot use `wait`: its face answers at once and cannot hold a request at 7:4"#,
    rlqs_face_window_too_long => r#"policies[0]: an RLQS-face policy (its `match` names `bucket`) needs a window shorter than 365d (limits[0] is 365d): Envoy refills a token bucket by at least one token a year at 7:4"#,
    rlqs_face_without_leased => r#"policies[0]: an RLQS-face policy (its `match` names `bucket`) needs `leased` (e.g. {"tokens": 100, "ttl": "5s"}): the tokens of each assignment Envoy spends locally, and how long it lives at 6:4"#,
    unlimited_http_policy => r#"policies[0]: `unlimited` is for gRPC-face policies (a `match` naming `domain` or `entries`): an HTTP policy that limits nothing is no policy at 6:4"#,
    unlimited_with_limits => r#"policies[0]: an `unlimited` policy has no `limits`: remove one or the other at 7:4"#,
    leased_on_a_sliding_window => r#"policies[0]: `leased` needs a fixed_window, token_bucket or leaky_bucket limit, not a sliding_window: only their tokens are spent one per request and charged before they are spent at 8:3"#,
    leased_bucket_ttl_too_long => r#"policies[0]: `leased.ttl` 2s is not under 1800ms, the time the bucket takes to refill beyond a lease (its burst less `leased.tokens`): a lease is charged as if spent at the end of its period, `ttl` long, and holds the bucket's other tokens back until then (a tenth of it under-admits 1 to 2%; leave `ttl` out for that) at 9:3"#,
    leased_bucket_without_room => r#"policies[0]: `leased.tokens` 200 leaves the bucket too little to refill beyond a lease (0µs, its burst less the lease) for a lease period of 1ms: lease fewer tokens at 8:3"#,
    leased_with_two_limits => r#"policies[0]: `leased` needs exactly one limit: a fixed_window, token_bucket or leaky_bucket at 11:3"#,
    leased_tokens_over_the_burst => r#"policies[0]: `leased.tokens` 500 is more than the bucket's burst 200: a lease is granted only while the bucket holds all its tokens at 8:3"#,
    leased_tokens_over_the_limit => r#"policies[0]: `leased.tokens` 500 is more than the window's limit 100: a lease is part of one window at 8:3"#,
    leased_ttl_too_long => r#"policies[0].leased: ttl 2h out of range (1ms to 1h) at 5:44"#,
    reserve_unknown_class => r#"policies[0].limits[0].reserve.for: no class named "vip" (classes: critical, normal) at 7:2"#,
    reserve_share_too_small => r#"policies[0].limits[0]: reserve.share 0.1 of a pool of 4 is 0 slots: it must hold back at least 1 and leave at least 1 at 5:113"#,
    reserve_with_wait => r#"policies[0]: `wait` cannot be used with a concurrency `reserve` (limits[0]): a freed slot goes to the oldest waiter, whatever its class; a reserve protects a service, refusing at once at 7:4"#,
    reserve_on_a_window => r#"policies[0].limits[0]: `reserve` is not a field of a sliding_window limit (expected `limit`, `window`, `approximate`) at 5:117"#,
    too_many_policies => r#"policies: 65 policies can apply to one request (for paths like "/v42/"), more than the 64 the shim checks at once: give them paths that exclude each other, or merge some at 68:3"#,
    too_many_limits => r#"policies[0]: 33 limits, more than the 32 a policy may have at 41:3"#,
    too_many_key_sources => r#"policies[0]: 9 key sources, more than the 8 a policy may have at 8:3"#,
    check_body_too_large => r#"policies: the policies that can apply to one request could need a 69992-byte call to the shim, more than the 65536 it takes: use fewer policies, limits or key sources at 35:3"#,
    limits_sharing_state => r#"policies[0]: limits[1] would share its state with limits[0]: give one a different window, period or lease at 10:3"#,
    bucket_refill_too_long => r#"policies[0].limits[0]: the bucket would take more than ten years to refill at 7:7"#,
    bad_duration => r#"policies[0].limits[0].window: invalid duration "5 sec" (expected e.g. "5s", "250ms"; from 1ms to 365d) at 6:66"#,
    bad_failure_mode => r#"failure_mode: unknown variant `open`, expected `allow` or `deny` at 2:24"#,
    bad_key_header_name => r#"policies[0].key[0]: invalid key source "header:x api key" (expected "header:NAME", "ip", "path", "method", "host", "query:NAME", "entry:NAME", "bucket:NAME" or "body:/POINTER") at 5:33"#,
    bad_key_source => r#"policies[0].key[0]: invalid key source "cookie:session" (expected "header:NAME", "ip", "path", "method", "host", "query:NAME", "entry:NAME", "bucket:NAME" or "body:/POINTER") at 5:31"#,
    bad_method => r#"policies[0].match.methods[0]: invalid method "get" (expected upper case, e.g. "GET") at 5:34"#,
    bad_on_missing_key => r#"policies[0].on_missing_key: unknown variant `ignore`, expected one of `shared`, `deny`, `skip` at 5:32"#,
    bad_path_regex => r#"policies[0].match.path_regex: invalid regex "^/users/([": found unclosed character class at 5:43"#,
    bad_policy_name => r#"policies[0].name: invalid policy name "partner api" (expected 1 to 64 of A-Z a-z 0-9 _ -) at 3:26"#,
    concurrency_missing_lease => r#"policies[0].limits[0]: missing field `lease` at 7:7"#,
    duplicate_names => r#"policies: duplicate policy name "a" at policies[1] at 5:3"#,
    duration_not_a_string => r#"policies[0].limits[0].window: invalid type: integer `5`, expected a string at 6:59"#,
    duration_too_long => r#"policies[0].limits[0].window: invalid duration "400d" (expected e.g. "5s", "250ms"; from 1ms to 365d) at 6:63"#,
    duration_unknown_unit => r#"policies[0].limits[0].window: invalid duration "5w" (expected e.g. "5s", "250ms"; from 1ms to 365d) at 6:63"#,
    duration_zero => r#"policies[0].limits[0].window: invalid duration "0s" (expected e.g. "5s", "250ms"; from 1ms to 365d) at 6:63"#,
    empty_document => r#"(document): EOF while parsing a value at 1:0"#,
    empty_limits => r#"policies[0]: a policy needs at least one limit at 7:3"#,
    field_of_another_type => r#"policies[0].limits[0]: `burst` is not a field of a sliding_window limit (expected `limit`, `window`, `approximate`) at 7:7"#,
    header_condition_two_forms => r#"policies[0].match.headers.x-tier: give exactly one of `present`, `equals`, `prefix` at 5:72"#,
    keys_condition_without_one_key_source => r#"policies[0]: a `keys` condition needs a policy with exactly one key source at 9:3"#,
    limit_as_string => r#"policies[0].limits[0].limit: invalid type: string "25", expected u64 at 6:48"#,
    limit_too_large => r#"policies[0].limits[0].limit: invalid count 1000000001 (expected 1 to 1000000000) at 6:52"#,
    missing_limit_type => r#"policies[0].limits[0]: missing field `type` at 6:37"#,
    missing_policies => r#"(document): missing field `policies` at 3:1"#,
    missing_window => r#"policies[0].limits[0]: missing field `window` at 7:7"#,
    negative_limit => r#"policies[0].limits[0].limit: invalid value: integer `-1`, expected u64 at 6:46"#,
    not_json => r#"policies[0]: trailing comma at 3:17"#,
    trailing_comma_at_line_end => r#"policies[0]: trailing comma at 6:71"#,
    points_cost_bad_shape => r#"policies[0].limits[0].cost: invalid value: string "ten", expected a cost: a number, {"header": NAME, "default": N}, or "llm_tokens" at 6:74"#,
    points_cost_exceeds_capacity => r#"policies[0].limits[0]: cost 101 exceeds the capacity 100: it could never pass at 7:7"#,
    points_cost_unknown_field => r#"policies[0].limits[0].cost.fallback: unknown field `fallback`, expected `header` or `default` at 6:100"#,
    policy_name_too_long => r#"policies[0].name: invalid policy name "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" (expected 1 to 64 of A-Z a-z 0-9 _ -) at 3:80"#,
    rate_too_fine => r#"policies[0].limits[0]: 1000000000 per 1ms is more than one per microsecond, the finest rate Sluice keeps at 7:7"#,
    timeout_zero => r#"shim.timeout_ms: invalid timeout 0 (expected 1 to 60000 ms) at 2:53"#,
    trailing_characters => r#"(document): trailing characters at 2:1"#,
    trusted_hops_too_large => r#"trusted_hops: invalid trusted_hops 17 (expected 0 to 16) at 2:20"#,
    two_path_conditions => r#"policies[0].match: give at most one of `path_prefix`, `path_exact`, `path_regex` at 5:65"#,
    unknown_limit_field => r#"policies[0].limits[0].brust: unknown field `brust`: did you mean `burst`? at 6:66"#,
    unknown_field_near_miss => r#"policies[0].limits[0].limt: unknown field `limt`: did you mean `limit`? at 7:48"#,
    unknown_limit_type => r#"policies[0].limits[0].type: unknown variant `sliding`, expected one of `fixed_window`, `sliding_window`, `token_bucket`, `leaky_bucket`, `interval`, `concurrency`, `points` at 6:26"#,
    unknown_policy_field => r#"policies[0].shadow_mode: unknown field `shadow_mode`, expected one of `name`, `match`, `bypass`, `key`, `on_missing_key`, `limits`, `levels`, `unlimited`, `blocked`, `limit_name`, `replaces`, `shadow`, `failure_mode`, `failure_status`, `response`, `wait`, `upstream`, `shed`, `leased`, `llm` at 5:19"#,
    unknown_top_level_field => r#"polices: unknown field `polices`: did you mean `policies`? at 2:11"#,
    bad_headers_mode => r#"headers: unknown variant `sometimes`, expected one of `off`, `on_deny`, `always` at 2:24"#,
    failure_status_not_an_error => r#"failure_status: invalid status 200 (expected 400 to 599) at 3:23"#,
    policy_failure_mode_unknown => r#"policies[0].failure_mode: unknown variant `closed`, expected `allow` or `deny` at 5:30"#,
    response_status_redirect => r#"policies[0].response.status: invalid status 302 (expected 400 to 599) at 5:33"#,
    response_pseudo_header => r#"policies[0].response.headers: ":status" is a pseudo-header; a policy cannot set it at 5:49"#,
    response_header_newline => r#"policies[0].response.headers: the value of "x-reason" has a control character (CR, LF or another) at 5:70"#,
    response_bad_header_name => r#"policies[0].response.headers.x reason: invalid header name "x reason" (expected e.g. "x-api-key") at 5:41"#,
    response_unknown_field => r#"policies[0].response.content_type: unknown field `content_type`, expected one of `status`, `body`, `headers` at 5:48"#,
    response_body_not_a_string => r#"policies[0].response.body: invalid type: map, expected a string at 5:27"#,
    shadow_not_a_bool => r#"policies[0].shadow: invalid type: string "yes", expected a boolean at 5:21"#,
    failure_threshold_too_large => r#"shim.failure_threshold: invalid failure_threshold 5000 (expected 0 to 1000) at 2:37"#,
    cooldown_zero => r#"shim.cooldown_ms: invalid cooldown_ms 0 (expected 1 to 600000) at 2:28"#,
    cache_slots_too_large => r#"over_limit_cache_slots: invalid over_limit_cache_slots 1000000 (expected 0 to 65536) at 2:35"#,
    wait_without_timeout => r#"policies[0].wait: missing field `timeout` at 5:31"#,
    wait_timeout_too_long => r#"policies[0].wait: wait timeout 10m is longer than 5m, the longest hold at 5:32"#,
    wait_margin_too_large => r#"policies[0].wait: wait margin 1m is larger than 10s at 5:48"#,
    wait_bad_margin => r#"policies[0].wait.margin: invalid margin "-5ms" (expected e.g. "0ms", "1ms", "20ms") at 5:50"#,
    wait_unknown_field => r#"policies[0].wait.max_queue: unknown field `max_queue`, expected `timeout` or `margin` at 5:44"#,
    upstream_on_shadow_policy => r#"policies[0]: `upstream` cannot be used on a shadow policy: a shadow policy never holds or refuses a request at 9:3"#,
    upstream_bad_status => r#"policies[0]: upstream.statuses: 1000 is not an HTTP status (100 to 599) at 8:3"#,
    upstream_max_pause_too_long => r#"policies[0]: upstream.max_pause: at most 1d, got 2d at 8:3"#,
    upstream_adapt_no_decrease => r#"policies[0]: upstream.adapt.decrease: above 0 and below 1, got 1 at 8:3"#,
    wait_on_shadow_policy => r#"policies[0]: `wait` cannot be used on a shadow policy: a shadow policy never holds or refuses a request at 9:3"#,
    wait_on_approximate_window => r#"policies[0]: `wait` cannot be used with an approximate sliding_window (limits[1]): its estimate cannot tell when a slot opens; use an exact one at 11:3"#,
    wait_two_concurrency_limits => r#"policies[0]: `wait` on two concurrency limits is not supported: the shim queues a request for one concurrency limit at 11:3"#,
    zero_limit => r#"policies[0].limits[0].limit: invalid count 0 (expected 1 to 1000000000) at 6:45"#,
}
