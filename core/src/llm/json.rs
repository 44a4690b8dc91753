//! An incremental JSON reader that watches a few paths: it takes a
//! document's bytes in chunks split anywhere, and records the whole numbers
//! found at its number paths and the length of the strings found at its
//! content paths. It keeps no document: its memory is its path stack
//! (at most [`MAX_DEPTH`] frames of at most [`MAX_KEY`] bytes of key), so it
//! is bounded whatever the document's size.
//!
//! It reads well-formed JSON; on a byte no JSON could hold there it stops,
//! keeping what it found before. A key with an escape in it matches no path
//! (no API's usage field has one), and values deeper than [`MAX_DEPTH`] are
//! skipped.

use sluice_policies::body::Pointer;

/// The deepest path watched; deeper values are skipped.
pub const MAX_DEPTH: usize = 16;
/// The longest key kept; a longer one matches no path.
pub const MAX_KEY: usize = 64;
/// The most paths one reader watches (a bit each).
pub const MAX_PATHS: usize = 64;

/// One segment of a watched path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    /// An object member by name, or (if it is a number) an array element.
    Key(Vec<u8>, Option<u32>),
    /// `*`: any member or element.
    Any,
}

impl Seg {
    fn key(name: &str) -> Seg {
        let index = name.parse().ok().filter(|_| name == "0" || !name.starts_with('0'));
        Seg::Key(name.as_bytes().to_vec(), index)
    }

    fn matches(&self, step: &Step<'_>) -> bool {
        match (self, step) {
            (Seg::Any, _) => true,
            (Seg::Key(name, _), Step::Key(key)) => name.as_slice() == *key,
            (Seg::Key(_, Some(i)), Step::Index(j)) => i == j,
            _ => false,
        }
    }
}

/// What one watched path collects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// The whole number there, into `Found::numbers[i]`; `final` if this
    /// place reports the final count (see [`Found::numbers`]).
    Number(usize, bool),
    /// The length of each string there, added to `Found::content`.
    Content,
}

/// The paths a reader watches, compiled once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Paths {
    paths: Vec<(Vec<Seg>, Watch)>,
    numbers: usize,
}

impl Paths {
    /// Watches `pointer` for a number, recorded as number `slot`, final or
    /// not. Paths past [`MAX_PATHS`] or [`MAX_DEPTH`] are not watched.
    pub fn number(&mut self, pointer: &Pointer, slot: usize, last: bool) {
        self.numbers = self.numbers.max(slot + 1);
        self.push(pointer.segments().map(|s| Seg::key(&s)).collect(), Watch::Number(slot, last));
    }

    /// Watches `pattern` (a pointer whose `*` segments match anything) for content.
    pub fn content(&mut self, pattern: &str) {
        let segs = pattern.split('/').skip(1).map(|s| if s == "*" { Seg::Any } else { Seg::key(s) });
        self.push(segs.collect(), Watch::Content);
    }

    fn push(&mut self, segs: Vec<Seg>, watch: Watch) {
        if self.paths.len() < MAX_PATHS && segs.len() <= MAX_DEPTH {
            self.paths.push((segs, watch));
        }
    }

    /// How many number slots [`Found::numbers`] has.
    pub fn slots(&self) -> usize {
        self.numbers
    }

    fn all(&self) -> u64 {
        if self.paths.len() == 64 {
            u64::MAX
        } else {
            (1u64 << self.paths.len()) - 1
        }
    }

    /// The paths of `mask` that go on through `step` at `depth`.
    fn through(&self, mask: u64, depth: usize, step: &Step<'_>) -> u64 {
        let mut out = 0;
        for (i, (segs, _)) in self.paths.iter().enumerate() {
            if mask & (1 << i) != 0 && segs.get(depth).is_some_and(|s| s.matches(step)) {
                out |= 1 << i;
            }
        }
        out
    }

    /// The watches of the paths of `mask` that end at `depth`.
    fn ending(&self, mask: u64, depth: usize) -> impl Iterator<Item = Watch> + '_ {
        self.paths
            .iter()
            .enumerate()
            .filter(move |(i, (segs, _))| mask & (1 << i) != 0 && segs.len() == depth)
            .map(|(_, (_, watch))| *watch)
    }
}

/// What a reader found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    /// The last whole number seen at each number slot's paths, and whether
    /// it was at a place that reports the final count.
    pub numbers: Vec<Option<(u64, bool)>>,
    /// The bytes of the strings seen at content paths (as written, escapes included).
    pub content: u64,
}

impl Found {
    pub fn new(paths: &Paths) -> Found {
        Found { numbers: vec![None; paths.slots()], content: 0 }
    }

    /// Nothing found, ready for the next document.
    pub fn clear(&mut self) {
        self.numbers.fill(None);
        self.content = 0;
    }
}

/// One step of the path to a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step<'k> {
    Key(&'k [u8]),
    Index(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    Object,
    Array,
}

/// An open object or array.
#[derive(Debug, Clone)]
struct Frame {
    container: Container,
    /// The paths that match up to this container.
    mask: u64,
    /// The paths that match the member or element being read.
    child: u64,
    /// Elements read so far (arrays).
    index: u32,
}

/// Where the reader stands between tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A value (the document's, an element's, or a member's after `:`).
    Value,
    /// An object's first key or `}`.
    FirstKey,
    /// A key after `,`.
    Key,
    /// `:` after a key.
    Colon,
    /// `,` or the container's end, after a value.
    Next,
    /// The document is whole; only whitespace may follow.
    End,
}

/// The token being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    None,
    /// A string; `key` when it names a member; `escape` after a backslash.
    Str {
        key: bool,
        escape: bool,
    },
    /// A number: its integer part so far, and whether it is still whole.
    Number {
        value: u64,
        whole: bool,
        negative: bool,
    },
    /// `true`, `false` or `null`, skipped.
    Literal,
}

/// The reader of one JSON document.
#[derive(Debug, Clone)]
pub struct Reader {
    frames: Vec<Frame>,
    /// Containers opened past [`MAX_DEPTH`], skipped.
    deep: u32,
    expect: Expect,
    token: Token,
    /// The key being read (kept up to [`MAX_KEY`] bytes).
    key: Vec<u8>,
    /// The key is unusable: too long or escaped.
    key_lost: bool,
    /// The paths matching the value being read.
    mask: u64,
    /// Bytes of the string being read, for content.
    len: u64,
    failed: bool,
}

impl Reader {
    pub fn new(paths: &Paths) -> Reader {
        Reader {
            frames: Vec::new(),
            deep: 0,
            expect: Expect::Value,
            token: Token::None,
            key: Vec::new(),
            key_lost: false,
            mask: paths.all(),
            len: 0,
            failed: false,
        }
    }

    /// Ready for a new document.
    pub fn reset(&mut self, paths: &Paths) {
        self.frames.clear();
        self.deep = 0;
        self.expect = Expect::Value;
        self.token = Token::None;
        self.key.clear();
        self.key_lost = false;
        self.mask = paths.all();
        self.len = 0;
        self.failed = false;
    }

    /// The heap it holds: its path stack and key buffer, at most
    /// [`MAX_DEPTH`] frames and [`MAX_KEY`] bytes whatever it reads.
    pub fn heap_bytes(&self) -> usize {
        self.frames.capacity() * std::mem::size_of::<Frame>() + self.key.capacity()
    }

    /// Whether it stopped on a byte that JSON cannot have there.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// Reads the next bytes of the document.
    pub fn feed(&mut self, bytes: &[u8], paths: &Paths, found: &mut Found) {
        let mut i = 0;
        while i < bytes.len() && !self.failed {
            if let Token::Str { key, escape: false } = self.token {
                // A string's plain run at once, up to its quote or escape.
                let rest = &bytes[i..];
                let run = rest.iter().position(|&b| b == b'"' || b == b'\\').unwrap_or(rest.len());
                if run > 0 {
                    if key {
                        let room = MAX_KEY - self.key.len().min(MAX_KEY);
                        self.key.extend_from_slice(&rest[..run.min(room)]);
                        self.key_lost |= run > room;
                    } else {
                        self.len += run as u64;
                    }
                    i += run;
                    continue;
                }
            }
            self.byte(bytes[i], paths, found);
            i += 1;
        }
    }

    /// The document's end: a number it ends with is complete.
    pub fn finish(&mut self, paths: &Paths, found: &mut Found) {
        if let Token::Number { .. } = self.token {
            self.end_number(paths, found);
        }
    }

    fn byte(&mut self, b: u8, paths: &Paths, found: &mut Found) {
        match self.token {
            Token::Str { key, escape } => return self.string_byte(b, key, escape, paths, found),
            Token::Number { value, whole, negative } => match b {
                b'0'..=b'9' => {
                    let value = if whole {
                        value.saturating_mul(10).saturating_add(u64::from(b - b'0'))
                    } else {
                        value
                    };
                    self.token = Token::Number { value, whole, negative };
                    return;
                }
                b'.' | b'e' | b'E' | b'+' | b'-' => {
                    self.token = Token::Number { value, whole: false, negative };
                    return;
                }
                _ => self.end_number(paths, found),
            },
            Token::Literal if b.is_ascii_alphabetic() => return,
            Token::Literal => {
                self.token = Token::None;
                self.expect = self.after_value();
            }
            Token::None => {}
        }
        if b.is_ascii_whitespace() {
            return;
        }
        match (self.expect, b) {
            (Expect::Value, _) => self.value(b, paths),
            (Expect::FirstKey | Expect::Key, b'"') => {
                self.token = Token::Str { key: true, escape: false };
                self.key.clear();
                self.key_lost = false;
            }
            (Expect::FirstKey, b'}') => self.close(Container::Object),
            (Expect::Colon, b':') => self.expect = Expect::Value,
            (Expect::Next, b',') => {
                let depth = self.frames.len().saturating_sub(1);
                match self.frames.last_mut() {
                    Some(f) if f.container == Container::Object => self.expect = Expect::Key,
                    Some(f) => {
                        f.index = f.index.saturating_add(1);
                        f.child = paths.through(f.mask, depth, &Step::Index(f.index));
                        self.expect = Expect::Value;
                    }
                    None => self.failed = true,
                }
            }
            (Expect::Next, b'}') => self.close(Container::Object),
            (Expect::Next, b']') => self.close(Container::Array),
            _ => self.failed = true,
        }
    }

    /// The first byte of a value.
    fn value(&mut self, b: u8, paths: &Paths) {
        // While skipping, keys are read as values of no path.
        let skipping = self.deep > 0;
        self.mask = if skipping { 0 } else { self.frames.last().map_or(self.mask, |f| f.child) };
        match b {
            b'{' | b'[' => {
                let container = if b == b'{' { Container::Object } else { Container::Array };
                if skipping || self.frames.len() == MAX_DEPTH {
                    // Inside a skipped container, tokens are read as values
                    // of no path, keys and separators alike.
                    self.deep += 1;
                    self.expect = Expect::Value;
                    return;
                }
                let depth = self.frames.len();
                let child = match container {
                    Container::Array => paths.through(self.mask, depth, &Step::Index(0)),
                    Container::Object => 0,
                };
                self.frames.push(Frame { container, mask: self.mask, child, index: 0 });
                self.expect = if container == Container::Object { Expect::FirstKey } else { Expect::Value };
            }
            b']' if self.frames.last().is_some_and(|f| f.container == Container::Array) && !skipping => {
                // An empty array.
                self.close(Container::Array);
            }
            b'}' | b']' if skipping => self.close_deep(),
            b'"' => {
                self.token = Token::Str { key: false, escape: false };
                self.len = 0;
            }
            b'-' => self.token = Token::Number { value: 0, whole: true, negative: true },
            b'0'..=b'9' => {
                self.token = Token::Number { value: u64::from(b - b'0'), whole: true, negative: false }
            }
            b't' | b'f' | b'n' => self.token = Token::Literal,
            b',' | b':' if skipping => {}
            _ => self.failed = true,
        }
    }

    fn string_byte(&mut self, b: u8, key: bool, escape: bool, paths: &Paths, found: &mut Found) {
        if escape {
            self.token = Token::Str { key, escape: false };
        } else if b == b'"' {
            self.token = Token::None;
            if key && self.deep == 0 {
                self.key_read(paths);
            } else if key {
                self.expect = Expect::Colon;
            } else {
                if self.deep == 0 {
                    let bytes = self.len;
                    for watch in paths.ending(self.mask, self.frames.len()) {
                        if watch == Watch::Content {
                            found.content = found.content.saturating_add(bytes);
                        }
                    }
                }
                self.expect = self.after_value();
            }
            return;
        } else if b == b'\\' {
            self.token = Token::Str { key, escape: true };
            self.key_lost = true;
        }
        if key {
            if self.key.len() < MAX_KEY {
                self.key.push(b);
            } else {
                self.key_lost = true;
            }
        } else {
            self.len += 1;
        }
    }

    /// A member's key is read: the paths that go on through it.
    fn key_read(&mut self, paths: &Paths) {
        let depth = self.frames.len() - 1;
        if let Some(f) = self.frames.last_mut() {
            f.child = if self.key_lost { 0 } else { paths.through(f.mask, depth, &Step::Key(&self.key)) };
        }
        self.key.clear();
        self.expect = Expect::Colon;
    }

    fn end_number(&mut self, paths: &Paths, found: &mut Found) {
        let Token::Number { value, whole, negative } = self.token else { return };
        self.token = Token::None;
        if self.deep == 0 && !negative {
            for watch in paths.ending(self.mask, self.frames.len()) {
                if let (Watch::Number(slot, last), true) = (watch, whole) {
                    if let Some(n) = found.numbers.get_mut(slot) {
                        *n = Some((value, last));
                    }
                }
            }
        }
        self.expect = self.after_value();
    }

    fn close(&mut self, container: Container) {
        if self.deep > 0 {
            return self.close_deep();
        }
        match self.frames.pop() {
            Some(f) if f.container == container => self.expect = self.after_value(),
            _ => self.failed = true,
        }
    }

    fn close_deep(&mut self) {
        self.deep -= 1;
        self.expect = self.after_value();
    }

    /// What follows a complete value.
    fn after_value(&self) -> Expect {
        if self.frames.is_empty() && self.deep == 0 {
            Expect::End
        } else if self.deep > 0 {
            // Inside a skipped container, anything may follow.
            Expect::Value
        } else {
            Expect::Next
        }
    }
}
