//! Leased mode per key on a Zipf key population, in the model: 100,000
//! keys, the top 1% carrying half the requests (exponent 0.92), 8,000
//! requests a second for 20 s spread over two gateways of two workers
//! each. Each worker learns its hot keys (`sluice_core::hot_keys`), spends
//! hot keys' pools (`sluice_core::leased`) and checks the rest exactly,
//! against the shim's model (`algorithm::lease`, `algorithm::check`); lease
//! calls are answered 1 ms after the 20 ms tick that asks. The same
//! requests are then checked exactly, and the two compared per key and
//! window. It asserts the bounds (no key's window over its limit; a key's
//! under-admission against exact at most `gateways × 1.5 × tokens` a
//! window) and prints the share served locally (`LEASED_ZIPF`); latency
//! is the bench's to measure, on real Envoys.

use std::collections::HashMap;

use sluice_core::hot_keys::{HotKeys, CAPACITY};
use sluice_core::leased::{Ask, Pool};
use sluice_core::testing::Zipf;
use sluice_policies::algorithm::{self, Algorithm, RedisTwin};
use sluice_policies::leased::Leased;
use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::LeaseResponse;

const KEYS: usize = 100_000;
const EXPONENT: f64 = 0.92;
const RATE: u64 = 8_000;
const SECONDS: u64 = 20;
/// Per key: 6,000 a minute (100 a second), above all but the top keys' rates.
const LIMIT: u64 = 6_000;
const WINDOW_MS: u64 = 60_000;
const GATEWAYS: usize = 2;
const WORKERS: usize = 2;
const TICK_MS: u64 = 20;

fn store_key(k: usize) -> String {
    format!("sluice:{{p:k{k}}}:fw")
}

/// Draws key ranks from the Zipf distribution.
struct Draws {
    zipf: Zipf,
    rng: fastrand::Rng,
}

impl Draws {
    fn new(seed: u64) -> Draws {
        Draws { zipf: Zipf::new(KEYS, EXPONENT), rng: fastrand::Rng::with_seed(seed) }
    }

    fn draw(&mut self) -> usize {
        self.zipf.rank(self.rng.f64())
    }
}

/// Two lease sizes: small leases lease more keys (a key is hot at about a
/// lease's worth of requests per `ttl` at one worker), large ones fewer.
/// With the filter's [`CAPACITY`] and the bench's lease (5 tokens, 5 s),
/// at least a quarter of the admissions are served from leases (with 64
/// counted keys, the capacity before, about a tenth).
#[test]
fn zipf_keys_served_locally_within_the_bounds() {
    let bench = simulate(Leased::new(5, 5_000).expect("valid"), CAPACITY);
    assert!(bench >= 0.25, "{:.1}% of admissions leased", bench * 100.0);
    for (tokens, ttl_ms, capacity) in [(20, 5_000, CAPACITY), (5, 5_000, 64)] {
        simulate(Leased::new(tokens, ttl_ms).expect("valid"), capacity);
    }
}

/// `capacity`: the keys each worker counts (the filter's is [`CAPACITY`]).
/// The share of admissions served from leases.
fn simulate(lease: Leased, capacity: usize) -> f64 {
    let mut zipf = Draws::new(7);
    let requests: Vec<(usize, usize, u64)> = (0..RATE * SECONDS)
        .map(|i| {
            (zipf.draw(), (i % (GATEWAYS * WORKERS as u64 as usize) as u64) as usize, i * 1_000_000 / RATE)
        })
        .collect();
    let exact_of = |k: usize| {
        [(
            store_key(k),
            Algorithm::FixedWindow { limit: LIMIT, window_us: Micros(WINDOW_MS * 1000), cost: 1 },
        )]
    };
    let t0 = 1_700_000_000_000_000u64 / (WINDOW_MS * 1000) * (WINDOW_MS * 1000);

    // Exact mode: every request checked by the shim.
    let mut store = RedisTwin::default();
    let mut exact: HashMap<(usize, u64), u64> = HashMap::new();
    for (i, &(k, _, at)) in requests.iter().enumerate() {
        let now = t0 + at;
        if algorithm::check(&mut store, now, &format!("e{i}"), &exact_of(k)).allowed {
            *exact.entry((k, now / 1000 / WINDOW_MS)).or_default() += 1;
        }
    }

    // Leased per key.
    let mut store = RedisTwin::default();
    let mut pools: Vec<HashMap<usize, Pool>> = vec![HashMap::new(); GATEWAYS];
    let mut hot: Vec<HotKeys> = (0..GATEWAYS * WORKERS)
        .map(|_| HotKeys::new(capacity, lease.ttl_ms(), lease.tokens().into()))
        .collect();
    let mut tracked: Vec<Vec<usize>> = vec![Vec::new(); GATEWAYS * WORKERS];
    let mut in_flight: Vec<(u64, usize, usize, Ask, u64)> = Vec::new();
    let mut leased: HashMap<(usize, u64), u64> = HashMap::new();
    let (mut local, mut calls) = (0u64, 0u64);
    let mut next_tick = 0u64;
    for (i, &(k, worker, at)) in requests.iter().enumerate() {
        let now = t0 + at;
        let ms = now / 1000;
        // The shim answers calls 1 ms after they were asked.
        let due: Vec<_> = in_flight.iter().filter(|c| c.0 < ms).cloned().collect();
        in_flight.retain(|c| c.0 + 1 > ms);
        for (asked, g, key, ask, _) in due {
            let back = ask.give_back.map(|b| (b.window, u64::from(b.tokens)));
            let grant = algorithm::lease(
                &mut store,
                asked * 1000,
                &store_key(key),
                LIMIT,
                WINDOW_MS * 1000,
                ask.want.into(),
                back,
            );
            let answer = LeaseResponse {
                granted: u32::try_from(grant.granted).expect("small"),
                window: grant.window,
                expires_in_ms: Millis(grant.expires_in_us / 1000),
                remaining: grant.remaining,
            };
            pools[g].entry(key).or_default().granted(lease, asked, ms, answer);
        }
        if ms >= next_tick {
            next_tick = ms + TICK_MS;
            for (w, keys) in tracked.iter().enumerate() {
                let g = w / WORKERS;
                for &key in keys {
                    if let Some(ask) = pools[g].entry(key).or_default().tick(lease, ms) {
                        calls += 1;
                        in_flight.push((ms, g, key, ask, 0));
                    }
                }
            }
        }
        let g = worker / WORKERS;
        let token = if hot[worker].observe(&k.to_string(), ms) {
            if !tracked[worker].contains(&k) && tracked[worker].len() < 2 * CAPACITY {
                tracked[worker].push(k);
            }
            pools[g].entry(k).or_default().spend(ms)
        } else {
            None
        };
        let window = ms / WINDOW_MS;
        if token.is_some() {
            local += 1;
            *leased.entry((k, window)).or_default() += 1;
        } else if algorithm::check(&mut store, now, &format!("l{i}"), &exact_of(k)).allowed {
            *leased.entry((k, window)).or_default() += 1;
        }
    }

    let bound = GATEWAYS as u64 * lease.held_at_most();
    let mut worst = 0u64;
    for (kw, &n) in &exact {
        let l = leased.get(kw).copied().unwrap_or(0);
        assert!(l <= LIMIT, "key {kw:?} admitted {l} over its limit");
        let under = n.saturating_sub(l);
        assert!(under <= bound, "key {kw:?}: {under} under-admitted, over the bound {bound}");
        worst = worst.max(under);
    }
    let all = requests.len() as u64;
    let admitted_exact: u64 = exact.values().sum();
    let admitted_leased: u64 = leased.values().sum();
    println!(
        "LEASED_ZIPF tokens {} ttl {} ms, {capacity} keys counted per worker: {KEYS} keys, top 1% carry {:.1}%; {all} requests at {RATE}/s over {GATEWAYS} gateways x {WORKERS} workers; \
         served locally {local} ({:.1}% of all, {:.1}% of admitted); lease calls {calls} ({:.2} per 100 requests); \
         admitted exact {admitted_exact}, leased {admitted_leased} (under-admitted {}, {:.3}%); worst key-window {worst} (bound {bound})",
        lease.tokens(),
        lease.ttl_ms(),
        zipf.zipf.top_share(KEYS / 100) * 100.0,
        local as f64 * 100.0 / all as f64,
        local as f64 * 100.0 / admitted_leased.max(1) as f64,
        calls as f64 * 100.0 / all as f64,
        admitted_exact.saturating_sub(admitted_leased),
        admitted_exact.saturating_sub(admitted_leased) as f64 * 100.0 / admitted_exact.max(1) as f64,
    );
    assert!(admitted_leased <= admitted_exact);
    local as f64 / admitted_leased.max(1) as f64
}
