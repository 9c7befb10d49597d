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

/// Decodes a command body for `aggregate_type`, returning its type name and value.
pub fn decode_command<C: DeserializeOwned>(aggregate_type: &str, body: &[u8]) -> Result<(String, C)> {
    let command_type = type_of(body, "command")?;
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
    let ty = type_of(&json, "event").unwrap_or_else(|_| "unknown".to_owned());
    (ty, json)
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
    fn event_type_is_extracted() {
        let (ty, json) = encode_event(&Cmd::Reset);
        assert_eq!(ty, "Reset");
        assert_eq!(json, br#"{"type":"Reset"}"#);
    }
}
