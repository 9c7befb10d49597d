//! Commands from the commands topics (Kafka mode): records produced to
//! `<app>.<type>.commands` by any Kafka client (a key, a JSON value, an `ef-type` header),
//! or by another instance on behalf of an HTTP caller, are decoded and handed to the
//! owning partition's processor, which commits their consumed offset in the same
//! transaction as their effects and writes their outcome to the results topic.
//! Retries are deduplicated by command id (`ef-command-id`, else
//! `<topic>:<partition>:<offset>`).
//!
//! Ownership is the consumer group's: one member per instance reads every aggregate
//! type's commands topic ([`Coordinated::join`](eventfold_log::Coordinated::join)); the dispatcher here
//! turns its assignments and revocations into processor [`Control`]s and its records
//! into jobs. Records go through one lane per partition (a task of its own), so a
//! processor that is not taking records (restoring, recovering) never holds up the
//! group's events: it once did, and a recovery waiting for a seek (served by the consumer
//! thread, itself waiting to hand over records) stalled the member until its session was
//! lost. A lane's backlog pauses that partition's fetching instead.

use crate::command::Job;
use crate::processor::{Control, PartitionShared};
use async_trait::async_trait;
use eventfold_core::envelope::headers;
use eventfold_core::partition::partition_for;
use eventfold_core::{Aggregate, Record, codec};
use eventfold_log::{GroupEvent, MemberControl, Membership};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// One aggregate type's processors, as the group dispatcher sees them.
#[async_trait]
pub(crate) trait GroupMember: Send + Sync {
    /// Partition `p` is ours from `epoch` on.
    fn assign(&self, p: u32, epoch: u64);
    /// Partition `p` goes away; resolves once its processor let it go.
    fn revoke(&self, p: u32) -> oneshot::Receiver<()>;
    /// Hands records to `p`'s processor (waits for room); false once the runtime stopped.
    async fn deliver(&self, p: u32, epoch: u64, records: Vec<(u64, Record)>) -> bool;
}

/// What the dispatcher holds of one partition's processor: its control channel, its job
/// queue and its shared status.
pub(crate) type PartitionHandles<A> = (
    mpsc::UnboundedSender<Control>,
    mpsc::Sender<Job<A>>,
    Arc<PartitionShared>,
);

/// The [`GroupMember`] of aggregate type `A`.
pub(crate) struct TypedMember<A: Aggregate> {
    pub topic: Arc<str>,
    pub partitions: Vec<PartitionHandles<A>>,
}

#[async_trait]
impl<A: Aggregate> GroupMember for TypedMember<A> {
    fn assign(&self, p: u32, epoch: u64) {
        if let Some((ctl, _, shared)) = self.partitions.get(p as usize) {
            // Restoring from now on (not once the processor got to it): readiness checks
            // made right after the assignment see the barrier.
            shared.restoring();
            let _ = ctl.send(Control::Assign { epoch });
        }
    }

    fn revoke(&self, p: u32) -> oneshot::Receiver<()> {
        let (done, rx) = oneshot::channel();
        if let Some((ctl, _, _)) = self.partitions.get(p as usize) {
            let _ = ctl.send(Control::Revoke { done });
        }
        rx
    }

    async fn deliver(&self, p: u32, epoch: u64, records: Vec<(u64, Record)>) -> bool {
        let Some((_, tx, _)) = self.partitions.get(p as usize) else {
            return true;
        };
        let n = self.partitions.len() as u32;
        for (offset, record) in records {
            // Backpressure: wait for room in the processor's queue.
            if tx
                .send(job::<A>(&self.topic, p, n, offset, epoch, &record))
                .await
                .is_err()
            {
                return false;
            }
        }
        true
    }
}

/// Runs the consumer group membership until the runtime stops: assignments and
/// revocations go to the processors (a revocation is answered once every revoked
/// partition's processor let go, bounded by `revoke_timeout`), records to their
/// partition's processor. `joined` is set at the first assignment; `changed` runs after
/// every ownership change.
pub(crate) async fn run_group(
    mut membership: Membership,
    members: HashMap<Arc<str>, Arc<dyn GroupMember>>,
    joined: Arc<AtomicBool>,
    changed: Arc<dyn Fn() + Send + Sync>,
    revoke_timeout: Duration,
) {
    let control = membership.control();
    let mut lanes: HashMap<(Arc<str>, u32), Lane> = HashMap::new();
    while let Some(event) = membership.next().await {
        match event {
            GroupEvent::Assigned(list) => {
                for (topic, p, epoch) in list {
                    if let Some(m) = members.get(&topic) {
                        m.assign(p, epoch);
                    }
                    // A partition assigned (again) fetches: the lane's pause is over.
                    if let Some(lane) = lanes.get(&(topic, p)) {
                        lane.paused.store(false, Ordering::Release);
                    }
                }
                joined.store(true, Ordering::Release);
                changed();
            }
            GroupEvent::Revoked { partitions, lost, done } => {
                let waits: Vec<_> = partitions
                    .iter()
                    .filter_map(|(t, p)| members.get(t).map(|m| m.revoke(*p)))
                    .collect();
                let deadline = tokio::time::Instant::now() + revoke_timeout;
                tokio::spawn(async move {
                    for w in waits {
                        if tokio::time::timeout_at(deadline, w).await.is_err() {
                            tracing::warn!(lost, "a revoked partition did not finish its in-flight work in time");
                            break;
                        }
                    }
                    done.done();
                });
                changed();
            }
            GroupEvent::Records {
                topic,
                partition,
                epoch,
                records,
            } => {
                let Some(member) = members.get(&topic) else {
                    continue;
                };
                let lane = lanes
                    .entry((topic.clone(), partition))
                    .or_insert_with(|| Lane::start(member.clone(), control.clone(), topic.clone(), partition));
                lane.push(epoch, records, &*control, &topic, partition);
            }
            GroupEvent::Error(e) => tracing::warn!(error = %e, "consumer group"),
        }
    }
}

/// Records of one partition waiting for its processor beyond this many: its fetching is
/// paused until the backlog is down to [`LANE_RESUME`].
const LANE_PAUSE: usize = 4096;
/// See [`LANE_PAUSE`].
const LANE_RESUME: usize = 1024;

/// Hands one partition's records to its processor, in order, on a task of its own: a
/// processor that does not take records for a while (restoring, recovering) never holds
/// up the group's events, whose rebalances and the seeks its recovery asks for need the
/// consumer to go on polling. Its backlog pauses the partition's fetching instead.
struct Lane {
    tx: mpsc::UnboundedSender<(u64, Vec<(u64, Record)>)>,
    backlog: Arc<AtomicUsize>,
    paused: Arc<AtomicBool>,
}

impl Lane {
    fn start(member: Arc<dyn GroupMember>, control: Arc<dyn MemberControl>, topic: Arc<str>, p: u32) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<(u64, Vec<(u64, Record)>)>();
        let backlog = Arc::new(AtomicUsize::new(0));
        let paused = Arc::new(AtomicBool::new(false));
        let (b, paused2) = (backlog.clone(), paused.clone());
        tokio::spawn(async move {
            while let Some((epoch, records)) = rx.recv().await {
                let n = records.len();
                if !member.deliver(p, epoch, records).await {
                    return; // the runtime is shutting down
                }
                let left = b.fetch_sub(n, Ordering::AcqRel) - n;
                if left <= LANE_RESUME && paused2.swap(false, Ordering::AcqRel) {
                    control.resume(&topic, p);
                }
            }
        });
        Self { tx, backlog, paused }
    }

    fn push(&self, epoch: u64, records: Vec<(u64, Record)>, control: &dyn MemberControl, topic: &str, p: u32) {
        let n = records.len();
        let backlog = self.backlog.fetch_add(n, Ordering::AcqRel) + n;
        if self.tx.send((epoch, records)).is_err() {
            return;
        }
        if backlog > LANE_PAUSE && !self.paused.swap(true, Ordering::AcqRel) {
            tracing::debug!(
                topic,
                partition = p,
                backlog,
                "partition's processor is behind; fetching paused"
            );
            control.pause(topic, p);
        }
    }
}

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
        causation_id: r.header_str(headers::CAUSATION_ID).map(str::to_owned),
        command_id,
        command,
        expected_version: r.header_str(headers::EXPECTED_VERSION).and_then(|v| v.parse().ok()),
        consumed: Some(offset + 1),
        keyed: true,
        epoch,
        reply_partition: r
            .header_str(headers::REPLY_PARTITION)
            .and_then(|v| v.parse().ok())
            .filter(|r| *r < partitions),
        reply,
    }
}

/// The value with `"type"` taken from the `ef-type` header when the value lacks it.
///
/// The value is checked to be a JSON object and its top-level keys are skimmed, nothing
/// is built from it: a value with `"type"` (the common case) is returned as it is, and one
/// without gets the header's type spliced in after its `{`.
fn with_type(value: &[u8], ef_type: Option<&str>) -> Result<Vec<u8>, eventfold_core::Error> {
    /// Whether the object has a `"type"` key (of any value, `null` included).
    #[derive(serde::Deserialize)]
    struct Top {
        #[serde(rename = "type", default)]
        ty: Present,
    }
    #[derive(Default)]
    struct Present(bool);
    impl<'de> serde::Deserialize<'de> for Present {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            serde::de::IgnoredAny::deserialize(d).map(|_| Present(true))
        }
    }
    let malformed = |reason: String| eventfold_core::Error::Malformed {
        what: "command",
        reason,
    };
    // serde reads a struct from a JSON array too: only an object is a command.
    let Some(open) = value
        .iter()
        .position(|b| !b" \t\n\r".contains(b))
        .filter(|&at| value[at] == b'{')
    else {
        return Err(malformed("expected a JSON object".into()));
    };
    let top: Top = serde_json::from_slice(value).map_err(|e| malformed(e.to_string()))?;
    if top.ty.0 {
        return Ok(value.to_vec());
    }
    let ty = ef_type.ok_or_else(|| malformed("no \"type\" field and no ef-type header".into()))?;
    let members = &value[open + 1..];
    let empty = members.iter().find(|b| !b" \t\n\r".contains(b)) == Some(&b'}');
    let mut out = Vec::with_capacity(value.len() + ty.len() + 12);
    out.extend_from_slice(b"{\"type\":");
    serde_json::to_writer(&mut out, ty).expect("a string serializes");
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(members);
    Ok(out)
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
        assert!(with_type(br#"["Add"]"#, Some("Add")).is_err(), "an array is no object");
        assert!(with_type(br#"{"n":1"#, Some("Add")).is_err(), "truncated");
        assert!(with_type(br#"{"n":1} x"#, Some("Add")).is_err(), "trailing bytes");
        assert!(with_type(br#"{"type":"A","type":"B"}"#, None).is_err(), "two types");
        // Kept as sent when it has a type, even an escaped or null one.
        for kept in [
            &br#" {"type":"Add","n":1}"#[..],
            br#"{"\u0074ype":"Add"}"#,
            br#"{"type":null}"#,
        ] {
            assert_eq!(with_type(kept, Some("Other")).unwrap(), kept);
        }
        // Spliced in: empty objects, whitespace, a type that needs escaping.
        let json = |v: Vec<u8>| serde_json::from_slice::<serde_json::Value>(&v).unwrap();
        assert_eq!(
            json(with_type(b" { } ", Some("Add")).unwrap()),
            serde_json::json!({"type":"Add"})
        );
        assert_eq!(
            json(with_type(b"\n{\n \"n\" : [1, {\"type\": 2}] }", Some("A\"d\\d")).unwrap()),
            serde_json::json!({"type":"A\"d\\d","n":[1,{"type":2}]})
        );
    }
}
