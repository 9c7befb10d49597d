//! Handing a process manager's commands to their targets, after the unit that wrote them
//! committed, and bringing each outcome back to the worker.
//!
//! A command goes to its [`Target`] (this service's aggregate, or another app's through
//! its commands topic) with its deterministic id as the idempotency key: handed over again (a retry, a restart after a crash), its target
//! answers with the original outcome instead of running it twice. Outcomes that say
//! nothing about the command (the target restoring, overloaded, away) are retried with a
//! growing pause; the others are the command's outcome.

use super::decide::Command;
use super::targets::Target;
use crate::command::CommandRequest;
use crate::error::Error;
use eventfold_core::Outcome;
use eventfold_core::process::Refusal;
use std::time::Duration;
use tokio::sync::mpsc;

/// An answered command: (outbox sequence, the command, its outcome).
pub(crate) type Answer = (u64, Command, Result<u64, Refusal>);

/// Encodes a command for its outbox entry.
pub(crate) fn encode(command: &Command) -> Vec<u8> {
    serde_json::to_vec(command).expect("commands encode")
}

/// Decodes an outbox entry.
pub(crate) fn decode(bytes: &[u8]) -> Result<Command, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("outbox entry does not decode: {e}"))
}

/// The pause before retry `attempt` (50 ms doubling, at most 2 s).
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(50)
        .saturating_mul(1 << attempt.min(6))
        .min(Duration::from_secs(2))
}

/// Hands `command` to `target` until it has an outcome, then sends it on `answers`.
pub(crate) async fn deliver(target: Target, seq: u64, command: Command, answers: mpsc::UnboundedSender<Answer>) {
    let mut attempt = 0u32;
    let result = loop {
        let request = CommandRequest {
            aggregate_id: command.aggregate_id.clone(),
            body: command.body.clone().into_bytes(),
            idempotency_key: Some(command.command_id.clone()),
            expected_version: None,
            correlation_id: Some(command.correlation_id.clone()),
            causation_id: command.causation_id.clone(),
        };
        match target.submit(&command.command_type, request).await {
            Ok(Outcome::Accepted(a)) => break Ok(a.version),
            Ok(Outcome::Rejected { error, message }) => break Err(Refusal { code: error, message }),
            Err(e @ (Error::BadCommand(_) | Error::BadRequest(_))) => {
                break Err(Refusal {
                    code: "invalid_command".into(),
                    message: e.to_string(),
                });
            }
            Err(Error::VersionMismatch { expected, actual }) => {
                break Err(Refusal {
                    code: "version_mismatch".into(),
                    message: format!("expected version {expected}, the aggregate is at {actual}"),
                });
            }
            Err(Error::ShuttingDown) => return,
            Err(e) => {
                attempt += 1;
                if attempt == 1 || attempt.is_multiple_of(20) {
                    tracing::warn!(
                        command_id = %command.command_id,
                        target = %match &command.app {
                            Some(app) => format!("{app}/{}/{}", command.aggregate_type, command.aggregate_id),
                            None => format!("{}/{}", command.aggregate_type, command.aggregate_id),
                        },
                        attempt,
                        error = %e,
                        "process manager command not delivered yet; retrying"
                    );
                }
                tokio::time::sleep(backoff(attempt)).await;
            }
        }
    };
    let _ = answers.send((seq, command, result));
}
