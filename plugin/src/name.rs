//! A header's name as a request remembers it, in place: no allocation for
//! each header read. Plain bytes, tested natively.

/// The longest name kept; a longer one is not remembered, and the host is
/// asked for its header on each read (correct, only slower).
pub const NAME_MAX: usize = 48;

/// A name of at most [`NAME_MAX`] bytes.
pub struct Name {
    len: usize,
    bytes: [u8; NAME_MAX],
}

impl Name {
    /// `name`, kept; `None` when it is longer than [`NAME_MAX`].
    pub fn new(name: &str) -> Option<Name> {
        let mut bytes = [0; NAME_MAX];
        bytes.get_mut(..name.len())?.copy_from_slice(name.as_bytes());
        Some(Name { len: name.len(), bytes })
    }

    /// Whether it is `name`.
    pub fn is(&self, name: &str) -> bool {
        self.bytes.get(..self.len) == Some(name.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name is kept up to [`NAME_MAX`] bytes and matches only itself; a
    /// longer one is not kept.
    #[test]
    fn a_name_is_kept_up_to_its_longest_and_matches_only_itself() {
        let name = Name::new("x-api-key").expect("short");
        assert!(name.is("x-api-key"));
        assert!(!name.is("x-api-ke"), "a prefix");
        assert!(!name.is("x-api-keys"), "longer");
        assert!(!name.is(""));
        let longest = "a".repeat(NAME_MAX);
        assert!(Name::new(&longest).is_some_and(|n| n.is(&longest)));
        assert!(Name::new(&"a".repeat(NAME_MAX + 1)).is_none());
        assert!(Name::new("").is_some_and(|n| n.is("") && !n.is("a")));
    }
}
