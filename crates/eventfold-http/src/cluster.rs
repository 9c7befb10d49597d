//! The body of `GET /v1/cluster` (DESIGN §6): the instances of the cluster and, for every
//! partition this instance knows of, who owns it and how it is doing here.

use eventfold_runtime::{InstanceInfo, PartitionReport, PartitionState, Registry};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The instance id shown in embedded mode (no registry: this process owns everything).
pub const LOCAL_INSTANCE: &str = "local";

/// The body of `GET /v1/cluster`:
///
/// ```json
/// {"instance_id": "a",
///  "instances": [{"instance_id", "http", "alive", "generation", "assigned_ms", "updated_ms", "partitions"}],
///  "partitions": [{"aggregate", "partition", "owner", "state", "restore_progress", "queued"}]}
/// ```
///
/// `partitions` lists every (aggregate, partition) of `local` (sorted). One this instance
/// owns shows its local state (`ready`, `restoring`, `failed`; plus `error` when failed)
/// with this instance as owner; one it does not own ([`PartitionState::Remote`]) is
/// `remote`, with the owner the registry names (`null` when no live instance claims it).
///
/// Without a registry (embedded mode) the only instance is `"local"` (no HTTP address or
/// timestamps) and it owns every partition.
pub fn cluster_json(registry: Option<&Registry>, local: &[PartitionReport]) -> Value {
    match registry {
        Some(r) => build(
            r.instance_id(),
            r.instances(),
            |a, p| r.owner(a, p).map(|i| i.instance_id),
            local,
        ),
        None => {
            let mut owned: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
            for p in local {
                owned.entry(&p.aggregate).or_default().push(p.partition);
            }
            for ps in owned.values_mut() {
                ps.sort_unstable();
                ps.dedup();
            }
            let instance = json!({
                "instance_id": LOCAL_INSTANCE,
                "http": null,
                "alive": true,
                "generation": 0,
                "assigned_ms": null,
                "updated_ms": null,
                "partitions": owned,
            });
            json!({
                "instance_id": LOCAL_INSTANCE,
                "instances": [instance],
                "partitions": partitions(LOCAL_INSTANCE, |_, _| None, local),
            })
        }
    }
}

/// The Kafka-mode body from what the registry knows (`owner` answers for remote partitions).
fn build(
    instance_id: &str,
    instances: Vec<(InstanceInfo, bool)>,
    owner: impl Fn(&str, u32) -> Option<String>,
    local: &[PartitionReport],
) -> Value {
    let instances: Vec<Value> = instances
        .into_iter()
        .map(|(i, alive)| {
            json!({
                "instance_id": i.instance_id,
                "http": i.http,
                "alive": alive,
                "generation": i.generation,
                "assigned_ms": i.assigned_ms,
                "updated_ms": i.updated_ms,
                "partitions": i.partitions,
            })
        })
        .collect();
    json!({
        "instance_id": instance_id,
        "instances": instances,
        "partitions": partitions(instance_id, owner, local),
    })
}

/// One entry per local report, sorted by (aggregate, partition).
fn partitions(instance_id: &str, owner: impl Fn(&str, u32) -> Option<String>, local: &[PartitionReport]) -> Vec<Value> {
    let mut reports: Vec<&PartitionReport> = local.iter().collect();
    reports.sort_by(|a, b| (&a.aggregate, a.partition).cmp(&(&b.aggregate, b.partition)));
    reports
        .into_iter()
        .map(|p| {
            let (state, owner) = match p.state {
                PartitionState::Ready => ("ready", Some(instance_id.to_owned())),
                PartitionState::Restoring => ("restoring", Some(instance_id.to_owned())),
                PartitionState::Failed => ("failed", Some(instance_id.to_owned())),
                PartitionState::Remote => ("remote", owner(&p.aggregate, p.partition)),
            };
            let mut entry = json!({
                "aggregate": p.aggregate,
                "partition": p.partition,
                "owner": owner,
                "state": state,
                "restore_progress": p.restore_progress,
                "queued": p.queued,
            });
            if let (Some(error), Some(obj)) = (&p.error, entry.as_object_mut()) {
                obj.insert("error".into(), json!(error));
            }
            entry
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(aggregate: &str, partition: u32, state: PartitionState) -> PartitionReport {
        PartitionReport {
            aggregate: aggregate.into(),
            partition,
            state,
            restore_progress: if state == PartitionState::Restoring { 0.5 } else { 1.0 },
            queued: partition as usize,
            consumed_offset: None,
            error: (state == PartitionState::Failed).then(|| "disk on fire".into()),
            cached_aggregates: 0,
        }
    }

    #[test]
    fn embedded_mode_is_one_local_instance_owning_everything() {
        let local = vec![
            report("order", 1, PartitionState::Restoring),
            report("order", 0, PartitionState::Ready),
            report("payment", 0, PartitionState::Failed),
        ];
        let body = cluster_json(None, &local);
        assert_eq!(
            body,
            json!({
                "instance_id": "local",
                "instances": [{
                    "instance_id": "local", "http": null, "alive": true, "generation": 0,
                    "assigned_ms": null, "updated_ms": null,
                    "partitions": {"order": [0, 1], "payment": [0]},
                }],
                "partitions": [
                    {"aggregate": "order", "partition": 0, "owner": "local", "state": "ready",
                     "restore_progress": 1.0, "queued": 0},
                    {"aggregate": "order", "partition": 1, "owner": "local", "state": "restoring",
                     "restore_progress": 0.5, "queued": 1},
                    {"aggregate": "payment", "partition": 0, "owner": "local", "state": "failed",
                     "restore_progress": 1.0, "queued": 0, "error": "disk on fire"},
                ],
            })
        );
    }

    #[test]
    fn embedded_mode_with_no_partitions_still_shows_the_instance() {
        let body = cluster_json(None, &[]);
        assert_eq!(body["instances"][0]["instance_id"], "local");
        assert_eq!(body["instances"][0]["partitions"], json!({}));
        assert_eq!(body["partitions"], json!([]));
    }

    #[test]
    fn kafka_mode_names_remote_owners_from_the_registry() {
        let info = |id: &str, ps: &[u32], updated_ms| InstanceInfo {
            instance_id: id.into(),
            http: format!("http://{id}:8080"),
            partitions: BTreeMap::from([("order".to_owned(), ps.to_vec())]),
            generation: 3,
            assigned_ms: 10,
            updated_ms,
        };
        let instances = vec![(info("a", &[0], 100), true), (info("b", &[1], 50), false)];
        let owner = |aggregate: &str, p: u32| (aggregate == "order" && p == 2).then(|| "c".to_owned());
        let local = vec![
            report("order", 2, PartitionState::Remote),
            report("order", 0, PartitionState::Ready),
            report("order", 1, PartitionState::Remote),
        ];
        let body = build("a", instances, owner, &local);
        assert_eq!(body["instance_id"], "a");
        assert_eq!(
            body["instances"],
            json!([
                {"instance_id": "a", "http": "http://a:8080", "alive": true, "generation": 3,
                 "assigned_ms": 10, "updated_ms": 100, "partitions": {"order": [0]}},
                {"instance_id": "b", "http": "http://b:8080", "alive": false, "generation": 3,
                 "assigned_ms": 10, "updated_ms": 50, "partitions": {"order": [1]}},
            ])
        );
        let parts: Vec<(u64, Value, &str)> = body["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["partition"].as_u64().unwrap(),
                    p["owner"].clone(),
                    p["state"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            parts,
            vec![
                (0, json!("a"), "ready"),
                (1, Value::Null, "remote"), // b claims it but is not alive: nobody owns it
                (2, json!("c"), "remote"),
            ]
        );
    }
}
