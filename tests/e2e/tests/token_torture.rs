//! The token torture (issue 33, item 10): two Envoys × 2 workers running
//! the real `sluice.wasm`, one shim, one Redis, and a mock LLM provider
//! (`harness::llm`) that records the true count of every request it served.
//! Hundreds of streamed OpenAI chat requests from many concurrent clients,
//! spread over both Envoys and four teams, each team on one token budget;
//! each stream ends one of four ways:
//!
//! - **whole**: read to its end, usage included;
//! - **closed**: the provider stops after a random number of tokens and
//!   waits; the client reads what came, then closes (FIN);
//! - **reset**: the same, then the client resets the connection (RST);
//! - **cut**: the provider closes its connection after a random number of
//!   tokens; the client reads to the end of the connection.
//!
//! The policy makes every ending exact: each request caps its output, the
//! prompt's estimate is the mock's own count (`bytes_per_token` 4, as the
//! mock counts a token per 4 bytes, rounded up), and the `content` fallback
//! charges a stream that ends without its usage what it delivered (its
//! input and a token per content event, the mock's `tok `). A client that
//! ends a stream early has read every event the provider wrote, so what the
//! filter saw is what the provider bills. Judged from the far side:
//!
//! - **overshoot 0**: no team's true counts exceed its budget;
//! - **exact**: once every stream has ended and settled, each team's bucket
//!   in Redis holds exactly its true counts (to the token: the refill over
//!   the run is under one token), and Envoy's `llm_tokens_charged` is the
//!   provider's total;
//! - **no refusal while room exists**: a 429 at a team is wrong if its
//!   reservation fit the budget less everything that could have been held
//!   then: each admitted request sent before the refusal was answered, at
//!   its true count if its client had read it whole before the refused one
//!   was sent (the last byte of a whole response waits for its settlement),
//!   else at its reservation. This uses only the order of events each
//!   client recorded, never a duration.
//!
//! Figures are printed (`--nocapture`); docs/token-budgets.md has a run's.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::Commands;
use sluice_harness::gateway::{eventually, prometheus, sample};
use sluice_harness::llm::{self, request_body, LlmUpstream, Served};
use sluice_harness::{Envoy, Redis, Shim};
use sluice_policies::llm::Api;

const TEAMS: [&str; 4] = ["red", "green", "blue", "gold"];
/// Each team's budget: about two thirds of what its requests reserve.
const CAPACITY: u64 = 14_000;
const REQUESTS: usize = 400;
const CLIENTS: usize = 48;
/// The refill period of the budget: over a run, under one token refills.
const REFILL_US: u64 = 365 * 86_400 * 1_000_000;

fn policy() -> String {
    format!(
        r#"{{"shim": {{"timeout_ms": 5000}}, "failure_mode": "deny", "policies": [{{
            "name": "budget", "match": {{"path_exact": "/v1/chat/completions"}}, "key": ["header:x-team"],
            "llm": {{"api": "openai_chat", "bytes_per_token": 4, "fallback": "content"}},
            "limits": [{{"type": "points", "capacity": {CAPACITY}, "refill": "365d", "cost": "llm_tokens"}}]}}]}}"#
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    Whole,
    Closed,
    Reset,
    Cut,
}

/// One request as planned: deterministic from its number.
#[derive(Clone, Debug)]
struct Plan {
    n: usize,
    team: &'static str,
    ending: Ending,
    body: Vec<u8>,
    /// Its `max_completion_tokens`.
    cap: u64,
    /// The output the provider is to generate (at most the cap).
    output: u64,
    /// For the early endings: the content events the provider writes
    /// before it stops (at most the output).
    tokens: u64,
}

/// A step of a 64-bit mix of `n`: the run's randomness, the same every run.
fn mix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Plan {
    fn of(n: usize) -> Plan {
        let r = |salt: u64| mix(n as u64 * 8 + salt);
        let ending = match r(0) % 10 {
            0..=3 => Ending::Whole,
            4 | 5 => Ending::Closed,
            6 | 7 => Ending::Reset,
            _ => Ending::Cut,
        };
        let cap = 40 + r(1) % 260;
        let output = (10 + r(2) % 300).min(cap);
        let tokens = r(3) % (output + 1);
        let prompt = "p".repeat(100 + (r(4) % 300) as usize);
        let body = request_body(Api::OpenaiChat, &prompt, Some(cap), true);
        Plan { n, team: TEAMS[n % TEAMS.len()], ending, body, cap, output, tokens }
    }

    fn id(&self) -> String {
        format!("t{}", self.n)
    }

    /// Its reservation: the prompt's estimate and the cap.
    fn reserved(&self) -> u64 {
        llm::input_tokens(&self.body) + self.cap
    }

    /// The events the provider writes: the role chunk and `tokens` content
    /// events, for the early endings.
    fn events(&self) -> usize {
        1 + self.tokens as usize
    }
}

/// One request as its client saw it.
#[derive(Clone, Debug)]
struct Sent {
    plan: Plan,
    status: u16,
    /// Content events read (whole ones).
    read: u64,
    sent: Instant,
    done: Instant,
}

/// Sends `plan` through Envoy on `port` and ends it as planned.
fn send(port: u16, plan: &Plan) -> Sent {
    let id = plan.id();
    let output = plan.output.to_string();
    let stop = plan.events().to_string();
    let mut headers =
        vec![("x-team", plan.team), ("x-mock-id", id.as_str()), ("x-mock-output", output.as_str())];
    match plan.ending {
        Ending::Whole => {}
        Ending::Closed | Ending::Reset => headers.push(("x-mock-hold", stop.as_str())),
        Ending::Cut => headers.push(("x-mock-cut", stop.as_str())),
    }
    let sent = Instant::now();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let mut head = format!(
        "POST {} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        llm::path(Api::OpenaiChat),
        plan.body.len()
    );
    for (name, value) in &headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).expect("write");
    stream.write_all(&plan.body).expect("write");
    let early = matches!(plan.ending, Ending::Closed | Ending::Reset);
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    let (status, read) = loop {
        let n = stream.read(&mut buf).unwrap_or(0);
        raw.extend_from_slice(&buf[..n]);
        let (status, body, last) = parsed(&raw);
        let events = whole_events(&body);
        if status != 0 && status != 200 && (last || n == 0) {
            break (status, 0);
        }
        if status == 200 && early && events.len() >= plan.events() {
            break (200, content(&events));
        }
        if n == 0 || last {
            break (status, content(&events));
        }
    };
    match plan.ending {
        // Linger 0: close() sends RST.
        Ending::Reset => socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO)).expect("linger"),
        // FIN first, whatever is left unread.
        Ending::Closed => {
            let _ = stream.shutdown(std::net::Shutdown::Write);
        }
        Ending::Whole | Ending::Cut => {}
    }
    drop(stream);
    Sent { plan: plan.clone(), status, read, sent, done: Instant::now() }
}

/// A response read so far: its status, its body (dechunked, whole chunks
/// and the part of the last one that came) and whether its last chunk (or
/// all of its `content-length`) came.
fn parsed(raw: &[u8]) -> (u16, Vec<u8>, bool) {
    let text = String::from_utf8_lossy(raw);
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") else { return (status, Vec::new(), false) };
    let head = text[..at].to_ascii_lowercase();
    let mut rest = &raw[at + 4..];
    if let Some(len) = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        return (status, rest.to_vec(), rest.len() >= len);
    }
    let mut body = Vec::new();
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else { return (status, body, false) };
        let Some(size) =
            std::str::from_utf8(&rest[..eol]).ok().and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
        else {
            return (status, body, false);
        };
        let data = &rest[eol + 2..];
        if size == 0 {
            return (status, body, true);
        }
        body.extend_from_slice(&data[..size.min(data.len())]);
        if data.len() < size + 2 {
            return (status, body, false);
        }
        rest = &data[size + 2..];
    }
}

/// The whole events of a stream's body (each ended by its blank line).
fn whole_events(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(body);
    let mut events: Vec<String> = text.split("\n\n").map(str::to_string).collect();
    events.pop(); // What follows the last blank line: not yet whole.
    events
}

/// The content events among `events`: a token each.
fn content(events: &[String]) -> u64 {
    events.iter().filter(|e| e.contains(r#""content":"tok ""#)).count() as u64
}

/// Redis, the shim, the provider and two Envoys; Envoys drop first.
struct Fleet {
    envoys: Vec<Envoy>,
    shim: Shim,
    llm: LlmUpstream,
    redis: Redis,
}

impl Fleet {
    fn stat(&self, name: &str) -> u64 {
        self.envoys
            .iter()
            .map(|e| {
                let page = prometheus(e).expect("Envoy's stats");
                sample(&page, &format!(r#"sluice_{name}{{policy="budget"}}"#)) as u64
            })
            .sum()
    }

    fn logs(&self) -> String {
        let tail = |log: String| {
            log.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
        };
        let mut all = format!("--- shim ---\n{}\n", tail(self.shim.log()));
        for (i, envoy) in self.envoys.iter().enumerate() {
            all.push_str(&format!("--- envoy {i} ---\n{}\n", tail(envoy.log())));
        }
        all
    }
}

/// The team's bucket key in Redis and the tokens it holds charged now
/// (its theoretical arrival time past Redis's clock, in units).
fn charged_in_redis(conn: &mut redis::Connection, team: &str) -> (String, f64) {
    let keys: Vec<String> = conn.keys(format!("sluice:*{team}*")).expect("KEYS");
    let key = keys
        .iter()
        .find(|k| !k.ends_with(":s") && !k.ends_with(":r") && !k.ends_with(":g"))
        .unwrap_or_else(|| panic!("{team}'s bucket among {keys:?}"))
        .clone();
    let tat: u64 = conn.get(&key).expect("GET tat");
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(conn).expect("TIME");
    let now = secs * 1_000_000 + micros;
    let interval = REFILL_US as f64 / CAPACITY as f64;
    (key, tat.saturating_sub(now) as f64 / interval)
}

/// The torture; see the module's doc.
#[test]
fn hundreds_of_streams_ending_every_way_keep_every_budget_exact() {
    let doc = policy();
    if let Err(err) = sluice_policies::parse(&doc) {
        panic!("the torture's document is refused: {err}\n{doc}");
    }
    let redis = Redis::start().expect("redis");
    let shim = Shim::start(&redis.url()).expect("shim");
    let llm = LlmUpstream::start().expect("the mock provider");
    let envoys = (0..2).map(|_| Envoy::start(&doc, shim.port, llm.port).expect("envoy")).collect();
    let fleet = Fleet { envoys, shim, llm, redis };
    let ports: Vec<u16> = fleet.envoys.iter().map(|e| e.port).collect();

    let started = Instant::now();
    let sent = Mutex::new(Vec::new());
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for c in 0..CLIENTS {
            let (sent, next, port) = (&sent, &next, ports[c % ports.len()]);
            scope.spawn(move || loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                if n >= REQUESTS {
                    return;
                }
                let s = send(port, &Plan::of(n));
                sent.lock().expect("lock").push(s);
            });
        }
    });
    let sent = sent.into_inner().expect("lock");
    let ran = started.elapsed();

    // Every answer is an admission or a 429; every admitted stream ended
    // as planned.
    let logs = || fleet.logs();
    let odd: Vec<&Sent> = sent.iter().filter(|s| s.status != 200 && s.status != 429).take(5).collect();
    assert!(odd.is_empty(), "answers neither 200 nor 429: {odd:?}\n{}", logs());
    let admitted: Vec<&Sent> = sent.iter().filter(|s| s.status == 200).collect();
    for s in &admitted {
        let want = match s.plan.ending {
            Ending::Whole => s.plan.output,
            _ => s.plan.tokens,
        };
        assert_eq!(s.read, want, "{:?}: the tokens its client read", s.plan);
    }

    // The provider has seen every stream end (a held one once Envoy closed
    // it), and every settlement has landed: each team's settled ids in
    // Redis are its admitted requests whose true count is not their
    // reservation.
    let ended = eventually(Duration::from_secs(30), || {
        let served = fleet.llm.served();
        served.len() == admitted.len() && served.iter().all(|s| s.ended.is_some())
    });
    assert!(ended, "{} of {} served; not all ended\n{}", fleet.llm.served().len(), admitted.len(), logs());
    let served: HashMap<String, Served> = fleet.llm.served().into_iter().map(|s| (s.id.clone(), s)).collect();
    let billed = |s: &Sent| served.get(&s.plan.id()).map_or(0, Served::billed);
    for s in &admitted {
        let written = served.get(&s.plan.id()).map_or(0, |v| v.written);
        assert_eq!(written, s.read, "{:?}: the provider wrote what its client read", s.plan);
    }
    let mut conn = fleet.redis.connection().expect("redis connection");
    for team in TEAMS {
        let adjusted =
            admitted.iter().filter(|s| s.plan.team == team && billed(s) != s.plan.reserved()).count();
        let settled = eventually(Duration::from_secs(30), || {
            let (key, _) = charged_in_redis(&mut conn, team);
            let n: usize = conn.zcard(format!("{key}:s")).unwrap_or(0);
            n == adjusted
        });
        assert!(settled, "{team}: not every settlement landed\n{}", logs());
    }

    let mut failures = Vec::new();
    println!(
        "{} requests ({} clients, 2 Envoys × 2 workers) in {ran:.1?}: {} admitted, {} refused",
        sent.len(),
        CLIENTS,
        admitted.len(),
        sent.len() - admitted.len()
    );
    for ending in [Ending::Whole, Ending::Closed, Ending::Reset, Ending::Cut] {
        let of: Vec<&&Sent> = admitted.iter().filter(|s| s.plan.ending == ending).collect();
        let tokens: u64 = of.iter().map(|s| billed(s)).sum();
        println!("  {ending:?}: {} admitted, {tokens} true tokens", of.len());
    }
    let mut slack_least = u64::MAX;
    for team in TEAMS {
        let of = |s: &&Sent| s.plan.team == team;
        let mine: Vec<&Sent> = admitted.iter().copied().filter(of).collect();
        let truth: u64 = mine.iter().map(|s| billed(s)).sum();
        let reserved: u64 = mine.iter().map(|s| s.plan.reserved()).sum();
        let (_, in_redis) = charged_in_redis(&mut conn, team);
        // Overshoot 0.
        if truth > CAPACITY {
            failures.push(format!("{team}: {truth} true tokens, over its budget of {CAPACITY}"));
        }
        // Exact: the bucket holds the true counts (the refill since is under a token).
        if !(in_redis <= truth as f64 + 1e-6 && in_redis > truth as f64 - 1.0) {
            failures.push(format!("{team}: the bucket holds {in_redis:.3} tokens, the true counts {truth}"));
        }
        // No refusal while room existed.
        let refused: Vec<&Sent> = sent.iter().filter(|s| s.status == 429 && s.plan.team == team).collect();
        for r in &refused {
            let held: u64 = mine
                .iter()
                .filter(|a| a.sent < r.done)
                .map(|a| {
                    if a.plan.ending == Ending::Whole && a.done < r.sent {
                        billed(a)
                    } else {
                        a.plan.reserved()
                    }
                })
                .sum();
            let slack = held + r.plan.reserved();
            if slack <= CAPACITY {
                failures.push(format!(
                    "{team}: request {} reserving {} refused while at most {held} of {CAPACITY} was held",
                    r.plan.n,
                    r.plan.reserved()
                ));
            } else {
                slack_least = slack_least.min(slack - CAPACITY);
            }
        }
        println!(
            "  {team}: {} admitted, {} refused; {truth} true tokens of {CAPACITY} (reserved {reserved}); the bucket holds {in_redis:.3}",
            mine.len(),
            refused.len()
        );
    }
    println!("  the closest refusal: its reservation was {slack_least} over what could have been held");
    let truth: u64 = admitted.iter().map(|s| billed(s)).sum();
    let charged = fleet.stat("llm_tokens_charged");
    if charged != truth {
        failures.push(format!("Envoy's llm_tokens_charged {charged}, the true counts {truth}"));
    }
    let early = admitted.iter().filter(|s| s.plan.ending != Ending::Whole).count() as u64;
    let fallbacks = fleet.stat("llm_fallbacks");
    if fallbacks != early {
        failures.push(format!("{fallbacks} fallbacks for {early} streams ended early"));
    }
    assert!(failures.is_empty(), "{}\n{}", failures.join("\n"), logs());

    // Once all has settled, what the true counts leave is exactly what a
    // team can reserve: a request of one token more is refused (through
    // one Envoy), one of exactly that admitted (through the other).
    for team in TEAMS {
        let truth: u64 = admitted.iter().filter(|s| s.plan.team == team).map(|s| billed(s)).sum();
        let room = CAPACITY - truth;
        let (Some(over), Some(fits)) = (probe(room + 1), probe(room)) else {
            // Less than the smallest request: that one is refused.
            let smallest = request_body(Api::OpenaiChat, "probe", Some(1), true);
            assert!(llm::input_tokens(&smallest) + 1 > room);
            assert_eq!(send_probe(ports[0], team, &smallest), 429, "{team}: {room} tokens left");
            println!("  {team}: {room} tokens left, less than the smallest request, which is refused");
            continue;
        };
        assert_eq!(
            send_probe(ports[0], team, &over),
            429,
            "{team}: {} tokens left, {} asked",
            room,
            room + 1
        );
        assert_eq!(send_probe(ports[1], team, &fits), 200, "{team}: {room} tokens left, {room} asked");
        println!("  {team}: {room} tokens left: a request of {} refused, one of {room} admitted", room + 1);
    }
}

/// A streamed chat body whose reservation is exactly `reserve` (its
/// prompt's estimate and its cap), if one that small can be written.
fn probe(reserve: u64) -> Option<Vec<u8>> {
    let mut cap = 1;
    for _ in 0..4 {
        let body = request_body(Api::OpenaiChat, "probe", Some(cap), true);
        cap = reserve.checked_sub(llm::input_tokens(&body)).filter(|c| *c > 0)?;
    }
    let body = request_body(Api::OpenaiChat, "probe", Some(cap), true);
    (llm::input_tokens(&body) + cap == reserve).then_some(body)
}

/// Sends a probe of `team` through Envoy on `port`, read whole; its status.
fn send_probe(port: u16, team: &str, body: &[u8]) -> u16 {
    let headers = [("x-team", team), ("x-mock-output", "1"), ("x-mock-id", "probe")];
    llm::post(port, llm::path(Api::OpenaiChat), &headers, body).expect("a probe through Envoy").status
}
