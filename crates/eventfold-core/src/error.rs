//! Errors raised while decoding user input or stored data.

/// Errors of eventfold-core. Each names what was wrong in a sentence a user can act on.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The body is not a JSON object with a string `"type"` field, or does not match the
    /// command's fields.
    #[error("malformed {what}: {reason}")]
    Malformed {
        /// What was malformed, e.g. `command`.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The `"type"` names no command of this aggregate type.
    #[error("unknown command type `{command_type}` for aggregate type `{aggregate_type}`")]
    UnknownCommand {
        /// The aggregate type addressed.
        aggregate_type: String,
        /// The `"type"` the body gave.
        command_type: String,
    },
    /// A position token that was not produced by eventfold.
    #[error("invalid position token: {0}")]
    InvalidPosition(String),
}

/// Result alias of eventfold-core.
pub type Result<T, E = Error> = std::result::Result<T, E>;
