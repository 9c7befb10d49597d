//! Positions: opaque, URL-safe tokens naming how far into which log partitions a write
//! went, so a reader can wait until it has seen that far (read-your-writes).

use crate::error::{Error, Result};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use std::collections::BTreeMap;

/// A set of `(topic, partition) -> end offset` marks (exclusive: every record below the
/// offset is included).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Position {
    marks: BTreeMap<(String, u32), u64>,
}

impl Position {
    /// A position covering `topic`/`partition` up to (excluding) `offset`.
    pub fn at(topic: &str, partition: u32, offset: u64) -> Self {
        let mut p = Self::default();
        p.advance(topic, partition, offset);
        p
    }

    /// Raises the mark for `(topic, partition)` to at least `offset`.
    pub fn advance(&mut self, topic: &str, partition: u32, offset: u64) {
        let e = self.marks.entry((topic.to_owned(), partition)).or_insert(0);
        *e = (*e).max(offset);
    }

    /// The marks, ordered by topic then partition.
    pub fn marks(&self) -> impl Iterator<Item = (&str, u32, u64)> {
        self.marks.iter().map(|((t, p), o)| (t.as_str(), *p, *o))
    }

    /// Encodes as an opaque URL-safe token.
    pub fn encode(&self) -> String {
        let mut s = String::from("v1");
        for ((t, p), o) in &self.marks {
            s.push(';');
            s.push_str(&format!("{t}:{p}:{o}"));
        }
        URL_SAFE_NO_PAD.encode(s)
    }

    /// Decodes a token produced by [`Position::encode`].
    pub fn decode(token: &str) -> Result<Self> {
        let bad = |why: &str| Error::InvalidPosition(format!("{why} (token {token:?})"));
        let raw = URL_SAFE_NO_PAD.decode(token).map_err(|_| bad("not base64url"))?;
        let s = String::from_utf8(raw).map_err(|_| bad("not UTF-8"))?;
        let mut parts = s.split(';');
        if parts.next() != Some("v1") {
            return Err(bad("unknown version"));
        }
        let mut p = Self::default();
        for mark in parts {
            let mut it = mark.rsplitn(3, ':');
            let (Some(o), Some(part), Some(topic)) = (it.next(), it.next(), it.next()) else {
                return Err(bad("malformed mark"));
            };
            let o = o.parse().map_err(|_| bad("offset is not a number"))?;
            let part = part.parse().map_err(|_| bad("partition is not a number"))?;
            p.advance(topic, part, o);
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_is_url_safe() {
        let mut p = Position::at("shop.order.events", 3, 1234);
        p.advance("shop.order.events", 0, 7);
        p.advance("shop.order.events", 3, 10); // lower: ignored
        let t = p.encode();
        assert!(
            t.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "{t}"
        );
        assert_eq!(Position::decode(&t).unwrap(), p);
        assert_eq!(
            p.marks().collect::<Vec<_>>(),
            vec![("shop.order.events", 0, 7), ("shop.order.events", 3, 1234)]
        );
    }

    #[test]
    fn rejects_garbage() {
        assert!(Position::decode("!!").is_err());
        assert!(Position::decode(&URL_SAFE_NO_PAD.encode("v2;a:1:2")).is_err());
        assert!(Position::decode(&URL_SAFE_NO_PAD.encode("v1;a:x:2")).is_err());
    }
}
