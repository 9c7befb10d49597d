//! JSON codecs for commands and events: type extraction and typed decoding with errors
//! that tell a malformed body from an unknown command type.

use crate::error::{Error, Result};
use serde::Deserialize;
use serde::de::DeserializeOwned;

#[derive(Deserialize)]
struct Tag<'a> {
    #[serde(borrow, rename = "type")]
    ty: std::borrow::Cow<'a, str>,
}

/// Reads the `"type"` field of a JSON object without decoding the rest into values.
pub fn type_of(json: &[u8], what: &'static str) -> Result<String> {
    match serde_json::from_slice::<Tag<'_>>(json) {
        Ok(tag) => Ok(tag.ty.into_owned()),
        Err(e) => Err(Error::Malformed {
            what,
            reason: if e.is_data() {
                "expected a JSON object with a string field \"type\"".to_owned()
            } else {
                e.to_string()
            },
        }),
    }
}

/// The `"type"` field when it is the object's first field and its string has no escapes,
/// as serde writes internally tagged enums and as clients usually send them: read without
/// a JSON parse. `None` for anything else (the caller parses).
fn leading_type(json: &[u8]) -> Option<&str> {
    fn skip_ws(b: &[u8]) -> &[u8] {
        let n = b
            .iter()
            .take_while(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
            .count();
        &b[n..]
    }
    let rest = skip_ws(json).strip_prefix(b"{")?;
    let rest = skip_ws(rest).strip_prefix(b"\"type\"")?;
    let rest = skip_ws(rest).strip_prefix(b":")?;
    let rest = skip_ws(rest).strip_prefix(b"\"")?;
    let end = rest.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
    if rest[end] != b'"' {
        return None;
    }
    std::str::from_utf8(&rest[..end]).ok()
}

/// Decodes a command body for `aggregate_type`, returning its type name and value.
pub fn decode_command<C: DeserializeOwned>(aggregate_type: &str, body: &[u8]) -> Result<(String, C)> {
    // The typed decoding below checks the whole body: the type may be read the cheap way.
    let command_type = match leading_type(body) {
        Some(t) => t.to_owned(),
        None => type_of(body, "command")?,
    };
    match serde_json::from_slice::<C>(body) {
        Ok(c) => Ok((command_type, c)),
        Err(e) if e.to_string().starts_with("unknown variant") => Err(Error::UnknownCommand {
            aggregate_type: aggregate_type.to_owned(),
            command_type,
        }),
        Err(e) => Err(Error::Malformed {
            what: "command",
            reason: e.to_string(),
        }),
    }
}

/// Encodes a value as JSON. Serialization of the crate's own derive types cannot fail;
/// a user type that fails (e.g. a map with non-string keys) is a programming error.
pub fn to_json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("event, command and state types must serialize to JSON")
}

/// Encodes an event and returns `(type name, JSON bytes)`.
pub fn encode_event<E: serde::Serialize>(event: &E) -> (String, Vec<u8>) {
    let json = to_json(event);
    (event_type(&json), json)
}

/// Encodes an event as a JSON document and returns `(type name, document)`: for callers
/// that hand the document on as JSON (an outcome's events), without the parse that
/// validating the bytes of [`encode_event`] as a `RawValue` would take.
pub fn encode_event_raw<E: serde::Serialize>(event: &E) -> (String, Box<serde_json::value::RawValue>) {
    let raw = serde_json::value::to_raw_value(event).expect("event types must serialize to JSON");
    (event_type(raw.get().as_bytes()), raw)
}

/// The `type` of an encoded event, `unknown` if it has none.
fn event_type(json: &[u8]) -> String {
    match leading_type(json) {
        Some(t) => t.to_owned(),
        None => type_of(json, "event").unwrap_or_else(|_| "unknown".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    #[serde(tag = "type")]
    enum Cmd {
        Add { n: u32 },
        Reset,
    }

    #[test]
    fn decodes_known_command() {
        let (ty, c): (String, Cmd) = decode_command("counter", br#"{"type":"Add","n":3}"#).unwrap();
        assert_eq!(ty, "Add");
        assert_eq!(c, Cmd::Add { n: 3 });
    }

    #[test]
    fn tells_unknown_type_from_malformed() {
        let e = decode_command::<Cmd>("counter", br#"{"type":"Nope"}"#).unwrap_err();
        assert!(
            matches!(e, Error::UnknownCommand { ref command_type, .. } if command_type == "Nope"),
            "{e}"
        );
        let e = decode_command::<Cmd>("counter", br#"{"type":"Add","n":"x"}"#).unwrap_err();
        assert!(matches!(e, Error::Malformed { .. }), "{e}");
        let e = decode_command::<Cmd>("counter", b"{not json").unwrap_err();
        assert!(matches!(e, Error::Malformed { .. }), "{e}");
        let e = decode_command::<Cmd>("counter", br#"{"n":1}"#).unwrap_err();
        assert!(matches!(e, Error::Malformed { .. }), "{e}");
        let e = decode_command::<Cmd>("counter", br#"[1,2]"#).unwrap_err();
        assert!(matches!(e, Error::Malformed { .. }), "{e}");
    }

    #[test]
    fn the_leading_type_is_read_without_a_parse_and_anything_else_is_left_to_one() {
        assert_eq!(leading_type(br#"{"type":"Add","n":3}"#), Some("Add"));
        assert_eq!(leading_type(b" {\n  \"type\" : \"Add\" }"), Some("Add"));
        assert_eq!(leading_type(br#"{"type":"Ad\u0064"}"#), None, "escapes");
        assert_eq!(leading_type(br#"{"n":3,"type":"Add"}"#), None, "not first");
        assert_eq!(leading_type(br#"{"type":3}"#), None);
        assert_eq!(leading_type(br#"{"type":"Add"#), None, "unterminated");
        assert_eq!(leading_type(b"{\"type\":\"\xff\"}"), None, "not UTF-8");
        // Every such body decodes as the full parse does.
        let (ty, c): (String, Cmd) = decode_command("counter", br#"{"type":"Ad\u0064","n":3}"#).unwrap();
        assert_eq!((ty.as_str(), c), ("Add", Cmd::Add { n: 3 }));
        let (ty, c): (String, Cmd) = decode_command("counter", br#"{"n":3,"type":"Add"}"#).unwrap();
        assert_eq!((ty.as_str(), c), ("Add", Cmd::Add { n: 3 }));
        let e = decode_command::<Cmd>("counter", br#"{"type":"Add","n":3"#).unwrap_err();
        assert!(matches!(e, Error::Malformed { .. }), "{e}");
        let e = decode_command::<Cmd>("counter", br#"{"type":"Add","type":"Reset"}"#).unwrap_err();
        assert!(matches!(e, Error::Malformed { .. }), "{e}");
    }

    #[test]
    fn event_type_is_extracted() {
        let (ty, json) = encode_event(&Cmd::Reset);
        assert_eq!(ty, "Reset");
        assert_eq!(json, br#"{"type":"Reset"}"#);
        // The document form: the same type and bytes.
        for (event, bytes) in [(Cmd::Reset, &json[..]), (Cmd::Add { n: 3 }, br#"{"type":"Add","n":3}"#)] {
            let (ty, raw) = encode_event_raw(&event);
            assert_eq!(
                (ty.as_str(), raw.get().as_bytes()),
                (encode_event(&event).0.as_str(), bytes)
            );
        }
        // An event without a type field.
        let (ty, raw) = encode_event_raw(&std::collections::BTreeMap::from([("n", 1)]));
        assert_eq!((ty.as_str(), raw.get()), ("unknown", r#"{"n":1}"#));
    }
}
