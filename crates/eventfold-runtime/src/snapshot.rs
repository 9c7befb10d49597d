//! Aggregate state in the store: a stored state (a snapshot) plus the events after it.
//!
//! A commit writes an aggregate's state to the store only when its version crosses a
//! multiple of `RuntimeOptions::state_every` (8): most aggregates of a store that grows
//! by new ones (orders, payments) never get a state row, and a busy one gets a row every
//! few versions instead of every commit. The `state` table is where an LSM store spends
//! most of its compaction work (a row at a random key per command, rewritten level by
//! level), so this is most of what a sustained load costs besides the log itself.
//!
//! Reading a state ([`load`]) takes the stored one, or the default, and applies the events
//! after it, which the per-entity index finds: fewer than `state_every` of them. A point
//! read of the first version after the stored one comes first; the Bloom filters answer
//! it for the usual case, no events after it.
//!
//! In Kafka mode the state topic still gets every state: it is the restore changelog
//! (compacted, one record per aggregate) of an instance that takes a partition over, which
//! writes each state record it replays to its store. The local store (a cache) keeps its
//! events with their entity index, so the same fold applies there.

use eventfold_core::Aggregate;
use eventfold_store::{Error, Store};

/// Whether a commit that takes an aggregate from version `from` to version `to` writes its
/// state, storing one every `every` versions (every version for 0 and 1).
pub(crate) fn writes_state(every: u64, from: u64, to: u64) -> bool {
    every <= 1 || to / every > from / every
}

/// The state of aggregate `id` of `A` as the store holds it, with its version: the
/// stored state, or `A::default()` at version 0, with the events of `events_topic` after
/// it applied. `None` if the aggregate has no state and no events. A stored state or an
/// event that does not decode, or a gap in the versions, is [`Error::Corrupt`].
pub(crate) fn load<A: Aggregate>(store: &Store, events_topic: &str, id: &str) -> Result<Option<(u64, A)>, Error> {
    let stored = store
        .get_state(A::TYPE, id)?
        .map(|row| {
            serde_json::from_slice::<A>(&row.json)
                .map(|state| (row.version, state))
                .map_err(|e| Error::Corrupt {
                    table: "state",
                    key: format!("{}/{id}", A::TYPE),
                    reason: format!("state does not decode: {e}"),
                })
        })
        .transpose()?;
    let from = stored.as_ref().map_or(0, |(v, _)| *v) + 1;
    if !store.has_entity_version(events_topic, id.as_bytes(), from)? {
        return Ok(stored);
    }
    let (mut version, mut state) = stored.unwrap_or_default();
    for event in store.entity_events(events_topic, id.as_bytes(), from, usize::MAX)? {
        if event.version != version + 1 {
            return Err(Error::Corrupt {
                table: "entity",
                key: format!("{events_topic}/{id}"),
                reason: format!("version {} follows version {version}", event.version),
            });
        }
        let decoded = serde_json::from_slice::<A::Event>(&event.record.value).map_err(|e| Error::Corrupt {
            table: "log",
            key: format!("{events_topic}/{}@{}", event.partition, event.offset),
            reason: format!("event {} of {}/{id} does not decode: {e}", event.version, A::TYPE),
        })?;
        state.apply(&decoded);
        version = event.version;
    }
    Ok(Some((version, state)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_is_written_when_the_version_crosses_a_multiple() {
        // Every version without snapshots.
        assert!(writes_state(1, 0, 1) && writes_state(1, 5, 6) && writes_state(0, 3, 4));
        // Every 8: versions 1-7 are folded from events; a commit reaching 8 or jumping
        // past it writes.
        assert!(!writes_state(8, 0, 1) && !writes_state(8, 6, 7));
        assert!(writes_state(8, 7, 8) && writes_state(8, 6, 9) && writes_state(8, 15, 16));
        assert!(!writes_state(8, 8, 15) && writes_state(8, 1, 30));
    }
}
