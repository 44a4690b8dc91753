//! Reading a response for its token count, chunk by chunk: the JSON reader
//! and the server-sent events parser find the same counts and content
//! however the bytes are split (an event, a line, a number or a CRLF cut
//! anywhere), the same as a whole-document parse finds, and hold the same
//! bounded memory however long the stream runs.

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use sluice_core::llm::json::{Found, Paths, Reader};
use sluice_core::llm::sse::Events;
use sluice_policies::body::Pointer;

/// The number paths (slot, pointer) and the content patterns the tests watch.
const NUMBERS: &[(usize, &str)] = &[
    (0, "/usage/input_tokens"),
    (1, "/usage/output_tokens"),
    (0, "/message/usage/input_tokens"),
    (2, "/a/0/n"),
];
const CONTENT: &[&str] = &["/choices/*/delta/content", "/delta/text"];

fn paths() -> Paths {
    let mut paths = Paths::default();
    for (slot, p) in NUMBERS {
        paths.number(&Pointer::new(p).expect("a pointer"), *slot, true);
    }
    for p in CONTENT {
        paths.content(p);
    }
    paths
}

/// What a whole-document parse finds: the last number at each slot's
/// pointers (in document order, as serde_json keeps members), and the
/// escaped length of every string at a content pattern.
fn reference(value: &Value, found: &mut Found) {
    fn walk(value: &Value, path: &mut Vec<String>, found: &mut Found) {
        let at = |pattern: &str| {
            let segs: Vec<&str> = pattern.split('/').skip(1).collect();
            segs.len() == path.len() && segs.iter().zip(path.iter()).all(|(s, p)| *s == "*" || s == p)
        };
        match value {
            Value::Number(n) => {
                for (slot, p) in NUMBERS {
                    if let (true, Some(n)) = (at(p), n.as_u64()) {
                        found.numbers[*slot] = Some((n, true));
                    }
                }
            }
            Value::String(s) if CONTENT.iter().any(|p| at(p)) => {
                let written = serde_json::to_string(s).expect("a string serializes").len() - 2;
                found.content += written as u64;
            }
            Value::Object(members) => {
                for (k, v) in members {
                    path.push(k.clone());
                    walk(v, path, found);
                    path.pop();
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    path.push(i.to_string());
                    walk(v, path, found);
                    path.pop();
                }
            }
            _ => {}
        }
    }
    walk(value, &mut Vec::new(), found);
}

/// JSON values around the watched paths: usage objects, content deltas,
/// and noise (strings with escapes, floats, negatives, nesting).
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(|n| json!(n)),
        any::<i64>().prop_map(|n| json!(n)),
        (-1e6f64..1e6).prop_map(|f| json!(f)),
        "[a-z \"\\\\/\\n\\té{}\\[\\]:,]{0,12}".prop_map(Value::String),
    ];
    let keys = prop_oneof![
        Just("usage".to_string()),
        Just("input_tokens".to_string()),
        Just("output_tokens".to_string()),
        Just("message".to_string()),
        Just("choices".to_string()),
        Just("delta".to_string()),
        Just("content".to_string()),
        Just("text".to_string()),
        Just("a".to_string()),
        Just("n".to_string()),
        "[a-z\"\\\\]{0,6}",
    ];
    leaf.prop_recursive(6, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((keys.clone(), inner), 0..5)
                .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Splits `bytes` at the given cut points (taken modulo its length).
fn split(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    at.sort_unstable();
    let mut out = Vec::new();
    let mut start = 0;
    for cut in at {
        out.push(bytes[start..cut].to_vec());
        start = cut;
    }
    out.push(bytes[start..].to_vec());
    out
}

fn read_json(chunks: &[Vec<u8>]) -> Found {
    let paths = paths();
    let mut reader = Reader::new(&paths);
    let mut found = Found::new(&paths);
    for chunk in chunks {
        reader.feed(chunk, &paths, &mut found);
    }
    reader.finish(&paths, &mut found);
    assert!(!reader.failed(), "well-formed JSON read as malformed");
    found
}

/// The SSE framing of `events`: each event's data pretty-printed or not
/// (so over one or many `data:` lines), `event:` fields and comments
/// between, lines ended by LF, CRLF or CR as `endings` picks.
fn frame(events: &[Value], endings: &[u8], pretty: &[bool]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut n = 0;
    let mut eol = |out: &mut Vec<u8>| {
        let e = endings.get(n % endings.len().max(1)).copied().unwrap_or(0);
        n += 1;
        // An LF right after a line's CR would be that line's CRLF.
        let after_cr = out.last() == Some(&b'\r');
        out.extend_from_slice(match e % 3 {
            0 if after_cr => b"\r",
            0 => b"\n",
            1 => b"\r\n",
            _ => b"\r",
        });
    };
    for (i, event) in events.iter().enumerate() {
        out.extend_from_slice(b": a comment");
        eol(&mut out);
        out.extend_from_slice(b"event: e");
        eol(&mut out);
        let text = if pretty.get(i).copied().unwrap_or(false) {
            serde_json::to_string_pretty(event)
        } else {
            serde_json::to_string(event)
        };
        for line in text.expect("serializes").split('\n') {
            out.extend_from_slice(b"data: ");
            out.extend_from_slice(line.as_bytes());
            eol(&mut out);
        }
        eol(&mut out);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// A JSON document read in chunks split anywhere finds what the whole
    /// document, parsed at once, holds at the watched paths.
    #[test]
    fn json_split_anywhere_finds_what_the_whole_holds(doc in value(), cuts in prop::collection::vec(any::<usize>(), 0..12)) {
        let bytes = serde_json::to_vec(&doc).expect("serializes");
        let whole = read_json(std::slice::from_ref(&bytes));
        let mut want = Found::new(&paths());
        reference(&doc, &mut want);
        prop_assert_eq!(&whole, &want);
        prop_assert_eq!(read_json(&split(&bytes, &cuts)), want);
    }

    /// A stream of events split anywhere (inside a line, between a CR and
    /// its LF) dispatches every event once, and finds in each what its data
    /// holds, with its memory the same as after its first event.
    #[test]
    fn events_split_anywhere_are_each_read_once(
        events in prop::collection::vec(value(), 1..8),
        endings in prop::collection::vec(any::<u8>(), 1..6),
        pretty in prop::collection::vec(any::<bool>(), 0..8),
        cuts in prop::collection::vec(any::<usize>(), 0..24),
    ) {
        let paths = paths();
        let stream = frame(&events, &endings, &pretty);
        let mut parsed = Events::new(&paths);
        let mut got = Vec::new();
        for chunk in split(&stream, &cuts) {
            let mut ends = Vec::new();
            parsed.feed(&chunk, &paths, |d| {
                ends.push(d.end);
                got.push(d.found.clone());
            });
            for end in ends {
                prop_assert!(end <= chunk.len());
            }
        }
        let want: Vec<Found> = events
            .iter()
            .map(|e| {
                let mut found = Found::new(&paths);
                reference(e, &mut found);
                found
            })
            .collect();
        prop_assert_eq!(got, want);
        prop_assert_eq!(parsed.events, events.len() as u64);
    }
}

/// An event's end offset is where the client has that event whole: cutting
/// the chunk there leaves complete events only, whatever the line endings.
#[test]
fn an_events_end_is_past_its_blank_line() {
    let paths = paths();
    for stream in
        [&b"data: 1\n\ndata: 2\n\n"[..], b"data: 1\r\n\r\ndata: 2\r\n\r\n", b"data: 1\r\rdata: 2\r\r"]
    {
        let mut ends = Vec::new();
        Events::new(&paths).feed(stream, &paths, |d| ends.push(d.end));
        assert_eq!(ends, [stream.len() / 2, stream.len()], "{:?}", String::from_utf8_lossy(stream));
    }
}

/// A long stream holds no more memory than a short one: nothing grows with
/// the events or their length (a 1 MB content string, 10,000 events).
#[test]
fn memory_is_bounded_whatever_the_stream() {
    let paths = paths();
    let event = |text: &str| {
        format!(
            "data: {}\n\n",
            json!({"choices": [{"delta": {"content": text}}], "usage": {"input_tokens": 3}})
        )
    };
    let mut short = Events::new(&paths);
    short.feed(event("hi").as_bytes(), &paths, |_| {});
    let mut long = Events::new(&paths);
    let big = "x".repeat(1_000_000);
    long.feed(event(&big).as_bytes(), &paths, |_| {});
    for _ in 0..10_000 {
        long.feed(event("token ").as_bytes(), &paths, |_| {});
    }
    assert!(
        long.heap_bytes() <= short.heap_bytes().max(1024),
        "{} > {}",
        long.heap_bytes(),
        short.heap_bytes()
    );
    // Deep nesting and long keys are skipped, not stored.
    let deep = format!("data: {}{}\n\n", "[".repeat(10_000), "]".repeat(10_000));
    let long_key = format!("data: {{\"{}\": 1}}\n\n", "k".repeat(100_000));
    long.feed(deep.as_bytes(), &paths, |_| {});
    long.feed(long_key.as_bytes(), &paths, |_| {});
    assert!(long.heap_bytes() <= 2048, "{}", long.heap_bytes());
}

/// OpenAI's `data: [DONE]` and other non-JSON data are read as nothing.
#[test]
fn non_json_data_finds_nothing() {
    let paths = paths();
    let mut found = Vec::new();
    let stream = b"data: {\"usage\": {\"input_tokens\": 5}}\n\ndata: [DONE]\n\ndata: hello\n\n";
    Events::new(&paths).feed(stream, &paths, |d| found.push(d.found.numbers[0]));
    assert_eq!(found, [Some((5, true)), None, None]);
}
