//! Commands from the commands topic (Kafka mode): records produced to
//! `<app>.<type>.commands` by any Kafka client (a key, a JSON value, an `ef-type` header)
//! are decoded and handed to the owning partition's processor, which commits their
//! consumed offset in the same transaction as their effects and writes their outcome to
//! the results topic. Nobody waits for them; retries are deduplicated by command id
//! (`ef-command-id`, else `<topic>:<partition>:<offset>`).
//!
//! This first version reads every partition of the topic itself (one instance owns all
//! partitions); ownership by consumer-group assignment comes with multi-instance mode.

use crate::processor::{Job, SourceControl};
use eventfold_core::envelope::headers;
use eventfold_core::partition::partition_for;
use eventfold_core::{Aggregate, Record, codec};
use eventfold_log::{Follower, Log};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Reads the commands topic of `A` from the group's committed offsets on, forever; after a
/// partition recovered from a failed commit (`ctl.rewind`), again from the committed
/// offsets, under a new epoch.
pub(crate) async fn run<A: Aggregate>(
    log: Arc<dyn Log>,
    topic: Arc<str>,
    group: String,
    senders: Vec<mpsc::Sender<Job<A>>>,
    ctl: Arc<SourceControl>,
) {
    loop {
        let epoch = ctl.epoch.load(Ordering::Acquire);
        let mut next = Vec::with_capacity(senders.len());
        for p in 0..senders.len() as u32 {
            let from = loop {
                match log.committed_offset(&group, &topic, p).await {
                    Ok(o) => break o.unwrap_or(0),
                    Err(e) => {
                        tracing::warn!(%topic, partition = p, error = %e, "cannot read the committed offset; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            };
            next.push(from);
        }
        tracing::info!(%topic, %group, epoch, "consuming commands from the topic");
        let starts: Vec<(u32, u64)> = next.iter().enumerate().map(|(p, o)| (p as u32, *o)).collect();
        match log.follow(&topic, &starts) {
            Ok(follower) => {
                if !follow(follower, &topic, &senders, epoch, &ctl).await {
                    return;
                }
                tracing::info!(%topic, "a partition recovered: following again from the committed offsets");
            }
            Err(e) => {
                tracing::info!(%topic, reason = %e, "polling the commands topic");
                return poll(log, &topic, next, &senders).await;
            }
        }
    }
}

/// Hands the records of a live follower to the processors until the runtime shuts down
/// (false) or a rewind is asked for (true).
async fn follow<A: Aggregate>(
    mut follower: Follower,
    topic: &str,
    senders: &[mpsc::Sender<Job<A>>],
    epoch: u64,
    ctl: &SourceControl,
) -> bool {
    let partitions = senders.len() as u32;
    loop {
        let batch = tokio::select! {
            batch = follower.next() => batch,
            () = ctl.rewind.notified() => return true,
        };
        let Some(batch) = batch else {
            return false;
        };
        let (p, records) = match batch {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(%topic, error = %e, "following the commands topic failed; it retries");
                continue;
            }
        };
        let Some(tx) = senders.get(p as usize) else {
            continue;
        };
        for (offset, record) in records {
            // Backpressure: wait for room in the processor's queue.
            if tx
                .send(job::<A>(topic, p, partitions, offset, epoch, &record))
                .await
                .is_err()
            {
                return false; // the runtime is shutting down
            }
        }
    }
}

/// Polls every partition with [`Log::read`], for logs that cannot follow.
async fn poll<A: Aggregate>(log: Arc<dyn Log>, topic: &str, mut next: Vec<u64>, senders: &[mpsc::Sender<Job<A>>]) {
    loop {
        let mut idle = true;
        for (p, tx) in senders.iter().enumerate() {
            let records = match log.read(topic, p as u32, next[p], 512).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(%topic, partition = p, error = %e, "reading commands failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            for (offset, record) in records {
                idle = false;
                next[p] = offset + 1;
                // Backpressure: wait for room in the processor's queue.
                let job = job::<A>(topic, p as u32, senders.len() as u32, offset, 0, &record);
                if tx.send(job).await.is_err() {
                    return; // the runtime is shutting down
                }
            }
        }
        if idle {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The job for one record; a record that is not a valid command becomes a job whose
/// command is the decoding error (refused, recorded and consumed by the processor).
fn job<A: Aggregate>(topic: &str, partition: u32, partitions: u32, offset: u64, epoch: u64, r: &Record) -> Job<A> {
    let command_id = r
        .header_str(headers::COMMAND_ID)
        .map(str::to_owned)
        .unwrap_or_else(|| format!("{topic}:{partition}:{offset}"));
    let aggregate_id = String::from_utf8_lossy(&r.key).into_owned();
    // One owner per aggregate: a record on another partition than murmur2(key) would give
    // the aggregate a second writer, so it is refused (librdkafka clients default to
    // another partitioner than Kafka's Java clients).
    let home = partition_for(&r.key, partitions);
    let command = if home != partition {
        Err(eventfold_core::Error::Malformed {
            what: "command record",
            reason: format!(
                "aggregate id {aggregate_id:?} belongs to partition {home} (murmur2), not {partition}: produce with Kafka's \
                 default partitioner (librdkafka/kcat: -X partitioner=murmur2_random)"
            ),
        })
    } else {
        with_type(&r.value, r.header_str(headers::TYPE))
            .and_then(|body| codec::decode_command::<A::Command>(A::TYPE, &body).map(|(_, c)| c))
    };
    let (reply, _) = oneshot::channel();
    Job {
        aggregate_id,
        correlation_id: r
            .header_str(headers::CORRELATION_ID)
            .map(str::to_owned)
            .unwrap_or_else(|| command_id.clone()),
        command_id,
        command,
        expected_version: None,
        consumed: Some(offset + 1),
        keyed: true,
        epoch,
        reply,
    }
}

/// The value with `"type"` taken from the `ef-type` header when the value lacks it.
fn with_type(value: &[u8], ef_type: Option<&str>) -> Result<Vec<u8>, eventfold_core::Error> {
    let malformed = |reason: String| eventfold_core::Error::Malformed {
        what: "command",
        reason,
    };
    let mut doc: serde_json::Value = serde_json::from_slice(value).map_err(|e| malformed(e.to_string()))?;
    let obj = doc
        .as_object_mut()
        .ok_or_else(|| malformed("expected a JSON object".into()))?;
    if !obj.contains_key("type") {
        let ty = ef_type.ok_or_else(|| malformed("no \"type\" field and no ef-type header".into()))?;
        obj.insert("type".into(), serde_json::Value::String(ty.to_owned()));
    }
    Ok(codec::to_json(&doc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_type_comes_from_the_header_when_the_value_lacks_it() {
        let v = with_type(br#"{"n":1}"#, Some("Add")).unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&v).unwrap(),
            serde_json::json!({"type":"Add","n":1})
        );
        let v = with_type(br#"{"type":"Add","n":1}"#, Some("Other")).unwrap();
        assert!(
            String::from_utf8(v).unwrap().contains("\"Add\""),
            "the value's own type wins"
        );
        assert!(with_type(b"not json", Some("Add")).is_err());
        assert!(with_type(br#"{"n":1}"#, None).is_err());
        assert!(with_type(b"[1]", Some("Add")).is_err());
    }
}
