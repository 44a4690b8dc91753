//! One response read for its token count under one policy's `llm`: its
//! JSON body or its events, chunk by chunk, to the usage it reports (or the
//! content it carries), and what its request is charged in the end.

use sluice_policies::llm::{Fallback, Field, Llm, Reservation, Usage};

use super::json::{Found, Paths, Reader};
use super::sse::{Dispatched, Events};

/// How the response's body is read.
#[derive(Debug, Clone)]
enum Body {
    /// Its headers have not come.
    Waiting,
    /// A JSON document.
    Json(Reader),
    /// Server-sent events, each event's data a JSON document.
    Events(Events),
    /// Compressed: it cannot be read (nothing is guessed from it).
    Unreadable,
}

/// How a response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Its last byte came.
    Whole,
    /// The stream ended first: a reset, an upstream error, a timeout.
    CutShort,
    /// The request never went upstream (another policy refused it).
    NeverSent,
}

/// Why a response was charged as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The usage it reported.
    Usage,
    /// The upstream refused the request (not 2xx) and reported no usage,
    /// or the request never went upstream: nothing was generated, nothing
    /// is charged.
    Refused,
    /// The policy's fallback: the stream ended without its usage.
    Fallback(Missing),
}

/// Why a response's usage is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// It ended (normally) without reporting usage.
    NoUsage,
    /// It ended early: a reset, an upstream error, a timeout.
    CutShort,
    /// Its body was compressed.
    Unreadable,
}

/// What a response is charged, in tokens (weighed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub tokens: u32,
    pub source: Source,
}

/// A response being metered.
#[derive(Debug, Clone)]
pub struct Meter {
    paths: Paths,
    /// For each number slot: whether it counts input (else output).
    input_slots: Vec<bool>,
    reservation: Reservation,
    body: Body,
    /// The latest value seen at each slot, and the content's bytes (of
    /// whole events, for a stream: what a client has received).
    found: Found,
    /// A stream's events that carried content.
    content_events: u64,
    /// The response's status is 2xx.
    ok: bool,
}

impl Meter {
    pub fn new(llm: &Llm, reservation: Reservation) -> Meter {
        let mut paths = Paths::default();
        let mut input_slots = Vec::new();
        let mut watch = |fields: &[Field], input: bool| {
            for field in fields {
                for pointer in &field.at {
                    paths.number(pointer, input_slots.len(), true);
                }
                for pointer in &field.provisional {
                    paths.number(pointer, input_slots.len(), false);
                }
                input_slots.push(input);
            }
        };
        match &llm.usage {
            Usage::Total(fields) => watch(fields, true),
            Usage::Parts { input, output } => {
                watch(input, true);
                watch(output, false);
            }
        }
        for pattern in llm.api.map_or(&[][..], |api| api.content()) {
            paths.content(pattern);
        }
        let found = Found::new(&paths);
        Meter { paths, input_slots, reservation, body: Body::Waiting, found, content_events: 0, ok: true }
    }

    /// The response's headers: its status, `content-type` and
    /// `content-encoding`. False if its body cannot be read.
    pub fn start(&mut self, status: Option<u16>, content_type: &[u8], encoding: &[u8]) -> bool {
        self.ok = status.is_none_or(|s| (200..300).contains(&s));
        let encoding = encoding.trim_ascii();
        if !encoding.is_empty() && !encoding.eq_ignore_ascii_case(b"identity") {
            self.body = Body::Unreadable;
            return false;
        }
        let media = content_type.split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
        self.body = if media.eq_ignore_ascii_case(b"text/event-stream") {
            Body::Events(Events::new(&self.paths))
        } else {
            Body::Json(Reader::new(&self.paths))
        };
        true
    }

    /// The heap it holds while reading, beside its compiled paths: bounded,
    /// whatever the response's length (see [`super::json`]).
    pub fn heap_bytes(&self) -> usize {
        let body = match &self.body {
            Body::Json(reader) => reader.heap_bytes(),
            Body::Events(events) => events.heap_bytes(),
            Body::Waiting | Body::Unreadable => 0,
        };
        body + self.found.numbers.capacity() * std::mem::size_of::<Option<(u64, bool)>>()
    }

    /// Reads a chunk of the body. For a stream, `on_event` gets the offset
    /// just past each event that ends in it, and the running count then.
    pub fn feed(&mut self, chunk: &[u8], llm: &Llm, mut on_event: impl FnMut(usize, u64)) {
        let (paths, found, slots, reservation, content_events) =
            (&self.paths, &mut self.found, &self.input_slots, self.reservation, &mut self.content_events);
        match &mut self.body {
            Body::Json(reader) => reader.feed(chunk, paths, found),
            Body::Events(events) => events.feed(chunk, paths, |Dispatched { end, found: event }| {
                *content_events += u64::from(event.content > 0);
                merge(found, event);
                on_event(end, running(found, *content_events, slots, reservation, llm));
            }),
            Body::Waiting | Body::Unreadable => {}
        }
    }

    /// The tokens the response has used so far (see [`running`]).
    pub fn running(&self, llm: &Llm) -> u64 {
        running(&self.found, self.content_events, &self.input_slots, self.reservation, llm)
    }

    /// The response has ended: what its request is charged.
    pub fn end(&mut self, end: End, llm: &Llm) -> Charge {
        let whole = match end {
            End::Whole => true,
            End::CutShort => false,
            End::NeverSent => return Charge { tokens: 0, source: Source::Refused },
        };
        if let Body::Json(reader) = &mut self.body {
            reader.finish(&self.paths, &mut self.found);
        }
        // The usage: the input wherever it was reported (a stream's first
        // event reports it whole), the output only where its final count
        // is. A stream whose output was reported only in its first event
        // (Anthropic's `message_start`, without its `message_delta`) has not
        // told its count: it is charged what it delivered.
        let (input, _) = self.sums(false);
        let (total, output) = self.sums(true);
        let usage = match llm.usage {
            Usage::Total(_) => total.map(|total| (total, 0)),
            Usage::Parts { .. } => input.zip(output),
        };
        if let Some((input, output)) = usage {
            return Charge { tokens: llm.cost(input, output), source: Source::Usage };
        }
        if whole && !self.ok {
            return Charge { tokens: 0, source: Source::Refused };
        }
        if let Body::Unreadable = self.body {
            return self.fallback(llm, Missing::Unreadable);
        }
        self.fallback(llm, if whole { Missing::NoUsage } else { Missing::CutShort })
    }

    /// The charge of a response whose usage is missing: at least what it
    /// delivered (its input, reported or reserved, and its content as
    /// [`Llm::delivered`] counts it); with the `reservation` fallback, at
    /// least the reservation too.
    fn fallback(&self, llm: &Llm, missing: Missing) -> Charge {
        let r = self.reservation;
        let delivered = llm.cost(self.sums(false).0.unwrap_or(r.input), self.delivered(llm));
        let tokens = match llm.fallback {
            Fallback::Reservation => llm.cost(r.input, r.output).max(delivered),
            Fallback::Content => delivered,
        };
        Charge { tokens, source: Source::Fallback(missing) }
    }

    /// The output tokens the content seen delivered, never past the
    /// request's cap (the provider stops there, whatever the content's
    /// bytes suggest).
    fn delivered(&self, llm: &Llm) -> u64 {
        delivered(&self.found, self.content_events, self.reservation, llm)
    }

    /// The input and output counts reported so far (a `usage.total` is
    /// the input); `None` for a part none of whose fields was seen (`last`:
    /// at a place that reports the final count).
    fn sums(&self, last: bool) -> (Option<u64>, Option<u64>) {
        sums(&self.found, &self.input_slots, last)
    }
}

/// The input and output counts `found` so far (see [`Meter::sums`]).
fn sums(found: &Found, input_slots: &[bool], last: bool) -> (Option<u64>, Option<u64>) {
    let mut sums = (None, None);
    for (n, &input) in found.numbers.iter().zip(input_slots) {
        let Some((n, at_last)) = n else { continue };
        if last && !at_last {
            continue;
        }
        let sum = if input { &mut sums.0 } else { &mut sums.1 };
        *sum = Some(sum.unwrap_or(0u64).saturating_add(*n));
    }
    sums
}

/// The output tokens `found`'s content delivered (see [`Llm::delivered`]),
/// never past the request's cap.
fn delivered(found: &Found, content_events: u64, reservation: Reservation, llm: &Llm) -> u64 {
    let delivered = llm.delivered(found.content, content_events);
    if reservation.capped {
        delivered.min(reservation.output)
    } else {
        delivered
    }
}

/// The tokens a response has used so far, as well as can be told
/// mid-stream: the input reported (or the reservation's), and the larger of
/// the output reported so far and the content delivered (never past the
/// request's cap).
fn running(
    found: &Found,
    content_events: u64,
    input_slots: &[bool],
    reservation: Reservation,
    llm: &Llm,
) -> u64 {
    let (input, output) = sums(found, input_slots, false);
    let input = input.unwrap_or(reservation.input);
    let mut output = output.unwrap_or(0).max(delivered(found, content_events, reservation, llm));
    if reservation.capped {
        output = output.min(reservation.output);
    }
    u64::from(llm.cost(input, output))
}

/// An event's findings over the stream's: each count it reports replaces
/// the last (the APIs report the count so far), content adds up.
fn merge(into: &mut Found, event: &Found) {
    for (slot, n) in into.numbers.iter_mut().zip(&event.numbers) {
        if n.is_some() {
            *slot = *n;
        }
    }
    into.content = into.content.saturating_add(event.content);
}
