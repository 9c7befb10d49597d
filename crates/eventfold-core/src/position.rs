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

    /// Merges `other` in: every mark becomes the higher of the two (positions are vectors
    /// of partition offsets; a session threads the merge of all its writes).
    pub fn merge(&mut self, other: &Position) {
        for (topic, partition, offset) in other.marks() {
            self.advance(topic, partition, offset);
        }
    }

    /// The marks, ordered by topic then partition.
    pub fn marks(&self) -> impl Iterator<Item = (&str, u32, u64)> {
        self.marks.iter().map(|((t, p), o)| (t.as_str(), *p, *o))
    }

    /// Encodes as an opaque URL-safe token.
    pub fn encode(&self) -> String {
        encode_marks(self.marks())
    }

    /// The token of [`Position::at`]`(topic, partition, offset)`, built without the
    /// position: every accepted command's outcome carries one, and the map, the owned
    /// topic name and the formatted marks showed in the command path's CPU profile.
    pub fn token_at(topic: &str, partition: u32, offset: u64) -> String {
        encode_marks(std::iter::once((topic, partition, offset)))
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

/// The token of `marks` (ordered by topic, then partition): `v1;topic:partition:offset...`
/// in base64url without padding.
fn encode_marks<'a>(marks: impl Iterator<Item = (&'a str, u32, u64)>) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(64);
    s.push_str("v1");
    for (t, p, o) in marks {
        // Writing to a String cannot fail.
        let _ = write!(s, ";{t}:{p}:{o}");
    }
    URL_SAFE_NO_PAD.encode(s)
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
    fn the_token_of_one_mark_is_that_of_its_position() {
        for (topic, partition, offset) in [("shop.order.events", 3, 1234), ("t", 0, 0), ("a:b", 7, u64::MAX)] {
            let token = Position::token_at(topic, partition, offset);
            assert_eq!(token, Position::at(topic, partition, offset).encode());
            assert_eq!(
                Position::decode(&token).unwrap(),
                Position::at(topic, partition, offset)
            );
        }
        let raw = URL_SAFE_NO_PAD.decode(Position::token_at("t", 2, 9)).unwrap();
        assert_eq!(raw, b"v1;t:2:9");
    }

    #[test]
    fn merging_keeps_the_higher_mark_of_every_partition() {
        let mut a = Position::at("shop.order.events", 0, 5);
        a.advance("shop.order.events", 1, 9);
        let mut b = Position::at("shop.order.events", 1, 3);
        b.advance("shop.customer.events", 2, 4);
        a.merge(&b);
        assert_eq!(
            a.marks().collect::<Vec<_>>(),
            vec![
                ("shop.customer.events", 2, 4),
                ("shop.order.events", 0, 5),
                ("shop.order.events", 1, 9)
            ]
        );
        let before = a.clone();
        a.merge(&Position::default());
        assert_eq!(a, before);
    }

    #[test]
    fn rejects_garbage() {
        assert!(Position::decode("!!").is_err());
        assert!(Position::decode(&URL_SAFE_NO_PAD.encode("v2;a:1:2")).is_err());
        assert!(Position::decode(&URL_SAFE_NO_PAD.encode("v1;a:x:2")).is_err());
    }
}
