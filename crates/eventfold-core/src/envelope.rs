//! The record envelope shared by every backend: header names (part of the contract),
//! the record itself, the event shape of the HTTP API and command outcomes.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;

/// Header names on every record (DESIGN §2). Changing one breaks compatibility.
pub mod headers {
    /// Command or event type name.
    pub const TYPE: &str = "ef-type";
    /// UUID v7 of the record.
    pub const ID: &str = "ef-id";
    /// Aggregate id.
    pub const AGGREGATE_ID: &str = "ef-aggregate-id";
    /// Event version, 1-based and contiguous per aggregate.
    pub const VERSION: &str = "ef-version";
    /// The command that caused the record.
    pub const COMMAND_ID: &str = "ef-command-id";
    /// Correlation id, carried from the first command of a flow.
    pub const CORRELATION_ID: &str = "ef-correlation-id";
    /// The id of the record that caused this one.
    pub const CAUSATION_ID: &str = "ef-causation-id";
    /// Partition of the results topic a gateway waits on.
    pub const REPLY_PARTITION: &str = "ef-reply-partition";
    /// MIME type of the value.
    pub const CONTENT_TYPE: &str = "content-type";
    /// On a command record: the version the aggregate must be at (`If-Match` of a command
    /// sent through another instance); a mismatch is answered with a `version_mismatch`
    /// rejection on the results topic, whose `ef-version` header holds the actual version.
    pub const EXPECTED_VERSION: &str = "ef-expected-version";

    /// Every name above. Stores keep a name's place here as its code: only ever append.
    pub const ALL: [&str; 10] = [
        TYPE,
        ID,
        AGGREGATE_ID,
        VERSION,
        COMMAND_ID,
        CORRELATION_ID,
        CAUSATION_ID,
        REPLY_PARTITION,
        CONTENT_TYPE,
        EXPECTED_VERSION,
    ];

    /// A header name as a record holds it: the names above without an allocation (a
    /// decoded record has about eight of them), any other one copied.
    pub fn name(name: &str) -> std::borrow::Cow<'static, str> {
        match standard(name.as_bytes()) {
            Some(n) => std::borrow::Cow::Borrowed(n),
            None => std::borrow::Cow::Owned(name.to_owned()),
        }
    }

    /// The name above spelled `name`, if any (matched as bytes: no UTF-8 check needed).
    pub fn standard(name: &[u8]) -> Option<&'static str> {
        index(name).map(|i| ALL[i])
    }

    /// The place in [`ALL`] of the name above spelled `name`, if any: a stable code
    /// (names are only ever added at the end).
    pub fn index(name: &[u8]) -> Option<usize> {
        ALL.iter().position(|n| n.as_bytes() == name)
    }
}

/// One record of a log: what Kafka calls a record and the embedded log stores verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    /// Partitioning key (the aggregate id for commands, events and state).
    pub key: Vec<u8>,
    /// The payload (JSON). Empty is a tombstone in Kafka (a null value, which a compacted
    /// topic's compaction removes; read back as empty).
    pub value: Vec<u8>,
    /// Headers in order; names from [`headers`] (borrowed: see [`headers::name`]).
    pub headers: Vec<(Cow<'static, str>, Vec<u8>)>,
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
}

impl Record {
    /// The first header named `name`, if any.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_slice())
    }

    /// The first header named `name` as UTF-8 text, if present and valid.
    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.header(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Appends a header.
    pub fn with_header(mut self, name: &str, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((headers::name(name), value.into()));
        self
    }

    /// This record as a [`RecordRef`].
    pub fn as_record_ref(&self) -> RecordRef<'_> {
        RecordRef {
            key: &self.key,
            value: &self.value,
            timestamp_ms: self.timestamp_ms,
            headers: HeadersRef::Owned(&self.headers),
        }
    }
}

/// A record as views into bytes held elsewhere: a [`Record`], or a record a backend keeps
/// encoded (the embedded log lends its stored bytes: reading one costs no copy and no
/// allocation, where a [`Record`] costs about eleven).
#[derive(Debug, Clone, Copy)]
pub struct RecordRef<'a> {
    /// As [`Record::key`].
    pub key: &'a [u8],
    /// As [`Record::value`].
    pub value: &'a [u8],
    /// As [`Record::timestamp_ms`].
    pub timestamp_ms: i64,
    headers: HeadersRef<'a>,
}

/// In the places [`RecordRef::encoded`] takes, a name start that means "the standard
/// name `headers::ALL[length]`" (an encoding that stores names as codes).
pub const STANDARD_NAME: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
enum HeadersRef<'a> {
    Owned(&'a [(Cow<'static, str>, Vec<u8>)]),
    /// Each header as `[name start, name length, value start, value length]` in `bytes`.
    Encoded {
        bytes: &'a [u8],
        at: &'a [[u32; 4]],
    },
}

impl<'a> RecordRef<'a> {
    /// A record whose headers are encoded in `bytes`: header i has its name at
    /// `bytes[at[i][0]..][..at[i][1]]`, or, when `at[i][0]` is [`STANDARD_NAME`], the name
    /// `headers::ALL[at[i][1]]`; its value is at `bytes[at[i][2]..][..at[i][3]]`.
    /// The ranges must lie in `bytes`, the indexes in `headers::ALL`, and the names be
    /// UTF-8 (the backend checked them when it parsed its encoding).
    pub fn encoded(key: &'a [u8], value: &'a [u8], timestamp_ms: i64, bytes: &'a [u8], at: &'a [[u32; 4]]) -> Self {
        Self {
            key,
            value,
            timestamp_ms,
            headers: HeadersRef::Encoded { bytes, at },
        }
    }

    /// The headers in order, as (name, value) bytes.
    fn each_header(&self, mut f: impl FnMut(&'a [u8], &'a [u8]) -> bool) {
        match self.headers {
            HeadersRef::Owned(h) => {
                for (k, v) in h {
                    if !f(k.as_bytes(), v) {
                        return;
                    }
                }
            }
            HeadersRef::Encoded { bytes, at } => {
                for &[ks, kl, vs, vl] in at {
                    let name = if ks == STANDARD_NAME {
                        headers::ALL[kl as usize].as_bytes()
                    } else {
                        &bytes[ks as usize..(ks + kl) as usize]
                    };
                    if !f(name, &bytes[vs as usize..(vs + vl) as usize]) {
                        return;
                    }
                }
            }
        }
    }

    /// The first header named `name`, if any.
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        let mut found = None;
        self.each_header(|k, v| {
            if k == name.as_bytes() {
                found = Some(v);
            }
            found.is_none()
        });
        found
    }

    /// The first header named `name` as UTF-8 text, if present and valid.
    pub fn header_str(&self, name: &str) -> Option<&'a str> {
        self.header(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// An owned copy.
    pub fn to_record(&self) -> Record {
        let mut headers = Vec::new();
        self.each_header(|k, v| {
            // Names are UTF-8 (`encoded` requires it): the lossy conversion loses nothing.
            let name = match headers::standard(k) {
                Some(n) => Cow::Borrowed(n),
                None => Cow::Owned(String::from_utf8_lossy(k).into_owned()),
            };
            headers.push((name, v.to_vec()));
            true
        });
        Record {
            key: self.key.to_vec(),
            value: self.value.to_vec(),
            headers,
            timestamp_ms: self.timestamp_ms,
        }
    }
}

/// An event as the HTTP API shows it: `{version, type, id, command_id, correlation_id,
/// causation_id, timestamp, payload}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EventView {
    /// 1-based version of the aggregate after this event.
    pub version: u64,
    /// Event type name.
    #[serde(rename = "type")]
    pub event_type: String,
    /// UUID v7 of the event record.
    pub id: String,
    /// The command that produced it.
    pub command_id: String,
    /// The correlation id it carries (`ef-correlation-id`): the same along a whole flow.
    #[serde(default)]
    pub correlation_id: String,
    /// What caused it (`ef-causation-id`): its command's id, or for a command a process
    /// manager sent, the id of the event it reacted to.
    #[serde(default)]
    pub causation_id: String,
    /// RFC 3339 timestamp of the command record.
    pub timestamp: String,
    /// The event document as the aggregate serialized it.
    pub payload: Box<RawValue>,
}

impl PartialEq for EventView {
    fn eq(&self, other: &Self) -> bool {
        self.version == other.version
            && self.event_type == other.event_type
            && self.id == other.id
            && self.command_id == other.command_id
            && self.timestamp == other.timestamp
            && self.payload.get() == other.payload.get()
    }
}

/// A successful command: the body of HTTP 200.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Accepted {
    /// Aggregate id.
    pub aggregate_id: String,
    /// The aggregate's version after the command.
    pub version: u64,
    /// The events the command wrote (possibly none).
    pub events: Vec<EventView>,
    /// Opaque token for read-your-writes (`min_position`).
    pub position: String,
}

/// The outcome of a command, stored for deduplication and returned to every retry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")] // externally tagged: internally tagged enums cannot hold RawValue
pub enum Outcome {
    /// Events were written.
    Accepted(Accepted),
    /// The aggregate refused the command (HTTP 422); nothing was written.
    Rejected {
        /// Stable code from [`crate::Reject::code`].
        error: String,
        /// Human sentence.
        message: String,
    },
}
