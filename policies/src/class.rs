//! Priority classes (scenarios S4c and S4d): the document names them, most
//! important first, so that when the service is short of capacity the least
//! important traffic goes first.
//!
//! ```json
//! "class_header": "x-priority",
//! "classes": [
//!   {"name": "critical", "match": {"path_prefix": "/payments/"}},
//!   {"name": "normal"},
//!   {"name": "batch", "match": {"headers": {"x-job": {"present": true}}}}
//! ]
//! ```
//!
//! A request's class is the one its `class_header` names, if it names one;
//! else the first class whose `match` holds; else the last class. A document
//! without classes has one, implicit.

use std::collections::BTreeSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, SeqAccess, Visitor};

#[cfg(feature = "schema")]
use crate::condition::RawCondition;
use crate::{Condition, HeaderName, PolicyName, Request};

/// At most this many classes.
pub const MAX_CLASSES: usize = 16;

#[derive(Debug, Clone, PartialEq)]
pub struct Class {
    pub name: PolicyName,
    pub matcher: Option<Condition>,
}

#[derive(serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawClass {
    /// 1 to 64 of `A-Z a-z 0-9 _ -`, unique among the classes.
    name: PolicyName,
    /// The requests of this class (unless the class header names another);
    /// without it, only the class header or being last gives the class.
    #[serde(rename = "match")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<RawCondition>"))]
    matcher: Option<Condition>,
}

/// The classes of a document, most important first, with unique names.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Classes(pub Vec<Class>);

impl Classes {
    /// The class of `req`, as an index from 0 (the most important); 0 when
    /// the document has no classes.
    pub fn classify(&self, req: &impl Request, header: Option<&HeaderName>) -> usize {
        let named = header
            .and_then(|h| req.header(h.as_str()))
            .and_then(|value| std::str::from_utf8(value.trim_ascii()).ok().and_then(|v| self.index_of(v)));
        named
            .or_else(|| self.0.iter().position(|c| c.matcher.as_ref().is_some_and(|m| m.holds(req, None))))
            .unwrap_or(self.0.len().saturating_sub(1))
    }

    /// The index of the class named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.0.iter().position(|c| c.name.as_str() == name)
    }

    /// The name of class `index`, or `default` for a document without classes.
    pub fn name(&self, index: usize) -> &str {
        self.0.get(index).map_or("default", |c| c.name.as_str())
    }

    /// How many classes a request can be in: at least 1.
    pub fn count(&self) -> usize {
        self.0.len().max(1)
    }
}

impl<'de> Deserialize<'de> for Classes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct UniqueNames;
        impl<'de> Visitor<'de> for UniqueNames {
            type Value = Classes;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of classes, most important first")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Classes, A::Error> {
                let mut classes = Vec::new();
                let mut names = BTreeSet::new();
                while let Some(raw) = seq.next_element::<RawClass>()? {
                    let at = classes.len();
                    if !names.insert(raw.name.clone()) {
                        return Err(de::Error::custom(format!(
                            "duplicate class name \"{}\" at classes[{at}]",
                            raw.name
                        )));
                    }
                    if raw.matcher.as_ref().is_some_and(Condition::needs_key) {
                        return Err(de::Error::custom(format!(
                            "classes[{at}].match: a class cannot match on `keys` (a class is not a policy's key)"
                        )));
                    }
                    if at == MAX_CLASSES {
                        return Err(de::Error::custom(format!("more than {MAX_CLASSES} classes")));
                    }
                    classes.push(Class { name: raw.name, matcher: raw.matcher });
                }
                Ok(Classes(classes))
            }
        }
        d.deserialize_seq(UniqueNames)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::SimpleRequest;

    fn classes() -> Classes {
        let json = r#"[
            {"name": "critical", "match": {"path_prefix": "/pay/"}},
            {"name": "normal"},
            {"name": "batch", "match": {"path_prefix": "/jobs/"}}
        ]"#;
        serde_json::from_str(json).expect("classes")
    }

    #[test]
    fn a_request_takes_the_first_class_that_matches_else_the_last() {
        let c = classes();
        assert_eq!(c.classify(&SimpleRequest::new("GET", "/pay/1"), None), 0);
        assert_eq!(c.classify(&SimpleRequest::new("GET", "/jobs/1"), None), 2);
        assert_eq!(c.classify(&SimpleRequest::new("GET", "/other"), None), 2, "matching none: the last");
    }

    #[test]
    fn the_class_header_names_the_class_when_it_names_one() {
        let c = classes();
        let header = HeaderName::new("x-priority");
        let req = SimpleRequest::new("GET", "/jobs/1").header("x-priority", "normal");
        assert_eq!(c.classify(&req, header.as_ref()), 1);
        let unknown = SimpleRequest::new("GET", "/pay/1").header("x-priority", "vip");
        assert_eq!(c.classify(&unknown, header.as_ref()), 0, "an unknown name: matched as usual");
    }

    #[test]
    fn no_classes_is_one_class() {
        let c = Classes::default();
        assert_eq!(c.classify(&SimpleRequest::new("GET", "/"), None), 0);
        assert_eq!(c.count(), 1);
        assert_eq!(c.name(0), "default");
    }

    #[test]
    fn bad_classes_are_refused() {
        let dup = r#"[{"name": "a"}, {"name": "a"}]"#;
        assert!(serde_json::from_str::<Classes>(dup).is_err());
        let keyed = r#"[{"name": "a", "match": {"keys": ["k"]}}]"#;
        assert!(serde_json::from_str::<Classes>(keyed).is_err());
    }
}
