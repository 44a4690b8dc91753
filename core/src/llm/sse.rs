//! Server-sent events (`text/event-stream`), read incrementally: bytes in,
//! in chunks split anywhere (inside a line, between a CR and its LF), and
//! each event's `data` handed to a [`Reader`] as it comes, never buffered.
//! Its memory is a few flags and the reader's: bounded, whatever the
//! stream's or an event's length.
//!
//! The syntax is the WHATWG one: lines end in CRLF, LF or CR; a blank line
//! ends an event; `field: value` (one space after the colon dropped); a
//! line that starts with `:` is a comment; an event's `data` lines are
//! joined with LF. Only `data` is read: the APIs Sluice knows name the
//! event's type inside its data too.

use super::json::{Found, Paths, Reader};

/// The longest field name told apart; longer ones are some other field.
const MAX_FIELD: usize = 8;

/// Where the parser stands in a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// At the start of a line.
    Start,
    /// In a field's name (so far: `name[..len]`).
    Name,
    /// Right after `data:`: a space here is dropped.
    DataStart,
    /// In a `data` value.
    Data,
    /// In anything else: a comment, another field's value.
    Other,
}

/// The events of one stream.
#[derive(Debug, Clone)]
pub struct Events {
    line: Line,
    name: [u8; MAX_FIELD],
    name_len: usize,
    /// The last byte was a CR: an LF now is the same line end.
    after_cr: bool,
    /// The event being read has had a `data` line.
    has_data: bool,
    /// The event's data, read as JSON.
    reader: Reader,
    /// What the event being read has found so far.
    found: Found,
    /// Events dispatched so far.
    pub events: u64,
}

/// One event's end, as [`Events::feed`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatched<'f> {
    /// The offset in the chunk just past the blank line that ended it.
    pub end: usize,
    /// What its data held at the watched paths.
    pub found: &'f Found,
}

impl Events {
    pub fn new(paths: &Paths) -> Events {
        Events {
            line: Line::Start,
            name: [0; MAX_FIELD],
            name_len: 0,
            after_cr: false,
            has_data: false,
            reader: Reader::new(paths),
            found: Found::new(paths),
            events: 0,
        }
    }

    /// Reads a chunk; `on_event` gets each event that ends in it.
    pub fn feed(&mut self, chunk: &[u8], paths: &Paths, mut on_event: impl FnMut(Dispatched<'_>)) {
        // Data bytes go to the reader a run at a time, not byte by byte.
        let mut run: Option<usize> = None;
        let mut next = 0;
        while next < chunk.len() {
            let (i, b) = (next, chunk[next]);
            next += 1;
            if self.line == Line::Data && !self.after_cr && b != b'\n' && b != b'\r' {
                // The rest of the data line at once.
                let rest = &chunk[next..];
                next += rest.iter().position(|&b| b == b'\n' || b == b'\r').unwrap_or(rest.len());
                run.get_or_insert(i);
                continue;
            }
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            let eol = b == b'\n' || b == b'\r';
            if eol {
                self.after_cr = b == b'\r';
            }
            match self.line {
                Line::Data | Line::DataStart if !eol => {
                    if self.line == Line::DataStart {
                        self.line = Line::Data;
                        if b == b' ' {
                            continue;
                        }
                    }
                    run.get_or_insert(i);
                }
                Line::Data | Line::DataStart => {
                    if let Some(start) = run.take() {
                        self.reader.feed(&chunk[start..i], paths, &mut self.found);
                    }
                    self.line = Line::Start;
                }
                Line::Start if eol => {
                    if self.dispatch(paths) {
                        let end = i + 1 + usize::from(self.after_cr && chunk.get(i + 1) == Some(&b'\n'));
                        on_event(Dispatched { end, found: &self.found });
                        self.found.clear();
                    }
                }
                Line::Start if b == b':' => self.line = Line::Other,
                Line::Start => {
                    self.name_len = 0;
                    self.line = Line::Name;
                    self.name_byte(b, paths);
                }
                Line::Name if eol => {
                    // A field with no colon has an empty value.
                    if self.field_is_data() {
                        self.data_line(paths);
                    }
                    self.line = Line::Start;
                }
                Line::Name => self.name_byte(b, paths),
                Line::Other if eol => self.line = Line::Start,
                Line::Other => {}
            }
        }
        if let Some(start) = run {
            self.reader.feed(&chunk[start..], paths, &mut self.found);
        }
    }

    /// The heap it holds: its reader's, and one number per watched count.
    pub fn heap_bytes(&self) -> usize {
        self.reader.heap_bytes() + self.found.numbers.capacity() * std::mem::size_of::<Option<(u64, bool)>>()
    }

    fn name_byte(&mut self, b: u8, paths: &Paths) {
        if b == b':' {
            if self.field_is_data() {
                self.data_line(paths);
                self.line = Line::DataStart;
            } else {
                self.line = Line::Other;
            }
            return;
        }
        if self.name_len < MAX_FIELD {
            self.name[self.name_len] = b;
        }
        self.name_len += 1;
    }

    fn field_is_data(&self) -> bool {
        self.name_len == 4 && &self.name[..4] == b"data"
    }

    /// A `data` line starts: lines after the first are joined with LF.
    fn data_line(&mut self, paths: &Paths) {
        if self.has_data {
            self.reader.feed(b"\n", paths, &mut self.found);
        }
        self.has_data = true;
    }

    /// A blank line: the event is whole (`self.found` holds what it
    /// found). False if it had no data.
    fn dispatch(&mut self, paths: &Paths) -> bool {
        if !std::mem::take(&mut self.has_data) {
            return false;
        }
        self.events += 1;
        self.reader.finish(paths, &mut self.found);
        self.reader.reset(paths);
        true
    }
}
