//! The versions of a view side by side: while a newer projection version builds, the
//! version stored as serving answers queries; when the newer one has caught up it is
//! recorded as serving, queries switch to it and the old version's data is removed.

use super::options::ViewOptions;
use super::service::ViewService;
use super::storage::{CLEAR_BATCH, serving_version_key, storage_name};
use crate::lookup::{LookupTable, Tables};
use crate::service::AggregateService;
use eventfold_log::Log;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Starts one version of a view over the services of the registered aggregate types.
pub(crate) type ViewStarter = Box<
    dyn FnOnce(&Arc<dyn Log>, &BTreeMap<String, Arc<dyn AggregateService>>, &ViewOptions) -> Arc<ViewService> + Send,
>;

/// The versions of one view: the one answering queries and, during a side-by-side
/// rebuild, the newer one being built.
pub(crate) struct ViewSlot {
    serving: RwLock<Arc<ViewService>>,
    building: RwLock<Option<Arc<ViewService>>>,
}

impl ViewSlot {
    pub(crate) fn serving(&self) -> Arc<ViewService> {
        self.serving.read().expect("not poisoned").clone()
    }

    pub(crate) fn building(&self) -> Option<Arc<ViewService>> {
        self.building.read().expect("not poisoned").clone()
    }
}

/// Starts the registered versions of every view (`registered`: name, version, starter)
/// and returns their slots by view name.
pub(crate) fn start_slots(
    log: &Arc<dyn Log>,
    services: &BTreeMap<String, Arc<dyn AggregateService>>,
    options: &ViewOptions,
    registered: Vec<(&'static str, u32, ViewStarter)>,
) -> BTreeMap<String, Arc<ViewSlot>> {
    // Per view: the newest registered version is the target; the version stored as
    // serving (1 when none is stored: views before versions) keeps answering while
    // the target builds, if its projection is registered too.
    let mut by_name: BTreeMap<&'static str, Vec<(u32, ViewStarter)>> = BTreeMap::new();
    for (name, version, starter) in registered {
        by_name.entry(name).or_default().push((version, starter));
    }
    let store = log.store().clone();
    let mut views = BTreeMap::new();
    for (name, mut versions) in by_name {
        versions.sort_by_key(|(v, _)| *v);
        let (target_version, target_starter) = versions.pop().expect("at least one version");
        let key = serving_version_key(name);
        let stored = store
            .get_meta(&key)
            .unwrap_or_else(|e| panic!("cannot read the serving version of view `{name}`: {e}"));
        let serving_version = stored.map_or(1, |v| v as u32);
        let target = target_starter(log, services, options);
        let old = versions.into_iter().find(|(v, _)| *v == serving_version);
        let slot = match old {
            Some((_, old_starter)) if serving_version != target_version => {
                tracing::info!(
                    view = name,
                    from = serving_version,
                    to = target_version,
                    "building a new view version side by side"
                );
                let old = old_starter(log, services, options);
                let slot = Arc::new(ViewSlot {
                    serving: RwLock::new(old.clone()),
                    building: RwLock::new(Some(target.clone())),
                });
                tokio::spawn(switch_when_caught_up(store.clone(), slot.clone(), old, target));
                slot
            }
            _ => {
                // The target serves at once (catching up if it is new). Data of the
                // serving version, if another, is no longer reachable: remove it.
                if serving_version != target_version {
                    tracing::info!(
                        view = name,
                        from = serving_version,
                        to = target_version,
                        "previous view version not registered; the new one serves while it catches up"
                    );
                    let old = storage_name(name, serving_version);
                    tokio::spawn(commit_serving(store.clone(), key, target_version, Some(old)));
                } else if stored.is_none() {
                    tokio::spawn(commit_serving(store.clone(), key, target_version, None));
                }
                Arc::new(ViewSlot {
                    serving: RwLock::new(target),
                    building: RwLock::new(None),
                })
            }
        };
        views.insert(name.to_owned(), slot);
    }
    views
}

/// Gives every view its lookup tables: the joins of every view read the views serving
/// now (a join of a table that is not a registered replicated view stops the build:
/// [`check_joins`]). Weak: the views hold the tables, and the runtime holds the views.
pub(crate) fn connect_lookups(slots: &Arc<BTreeMap<String, Arc<ViewSlot>>>, tables: &Tables) {
    tables.resolve_with({
        let slots = Arc::downgrade(slots);
        move |name| {
            let view = slots.upgrade()?.get(name)?.serving();
            Some(view as Arc<dyn LookupTable>)
        }
    });
    for (name, slot) in slots.iter() {
        for svc in std::iter::once(slot.serving()).chain(slot.building()) {
            check_joins(name, &svc, slots);
            svc.set_tables(tables.clone());
        }
    }
}

/// Records `version` as the serving version of a view (durably) and removes the data
/// stored under `remove`, if any.
async fn commit_serving(store: eventfold_store::Store, key: String, version: u32, remove: Option<String>) {
    let result = tokio::task::spawn_blocking(move || -> eventfold_store::Result<u64> {
        let mut b = eventfold_store::Batch::new();
        b.put_meta(&key, u64::from(version));
        store.commit(b, true)?;
        match remove {
            Some(storage) => store.clear_view(&storage, CLEAR_BATCH),
            None => Ok(0),
        }
    })
    .await;
    match result {
        Ok(Ok(n)) if n > 0 => tracing::info!(removed = n, "previous view version removed"),
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "cannot record the serving view version"),
        Err(e) => tracing::error!(error = %e, "serving-version task failed"),
    }
}

/// Waits until `new` has caught up, then makes it the serving version: recorded durably
/// first (a restart serves it too), then queries switch; the old version's workers stop
/// and its data is removed. If `new` fails, the old one keeps serving.
async fn switch_when_caught_up(
    store: eventfold_store::Store,
    slot: Arc<ViewSlot>,
    old: Arc<ViewService>,
    new: Arc<ViewService>,
) {
    loop {
        if new.is_ready() {
            break;
        }
        if new.has_failed() {
            return tracing::error!(
                view = new.name(),
                version = new.version(),
                "the new view version failed while building; the previous one keeps serving"
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let key = serving_version_key(new.name());
    let version = new.version();
    let mut b = eventfold_store::Batch::new();
    b.put_meta(&key, u64::from(version));
    let s = store.clone();
    match tokio::task::spawn_blocking(move || s.commit(b, true)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return tracing::error!(view = new.name(), error = %e, "cannot switch view versions"),
        Err(e) => return tracing::error!(view = new.name(), error = %e, "switch task failed"),
    }
    *slot.serving.write().expect("not poisoned") = new.clone();
    *slot.building.write().expect("not poisoned") = None;
    tracing::info!(
        view = new.name(),
        from = old.version(),
        to = version,
        "view switched to the new version"
    );
    old.retire().await;
    let storage = old.storage().to_owned();
    match tokio::task::spawn_blocking(move || store.clear_view(&storage, CLEAR_BATCH)).await {
        Ok(Ok(n)) => tracing::info!(view = new.name(), removed = n, "previous view version removed"),
        Ok(Err(e)) => tracing::error!(view = new.name(), error = %e, "cannot remove the previous view version"),
        Err(e) => tracing::error!(view = new.name(), error = %e, "removal task failed"),
    }
}

/// Refuses, at build, a join of view `name` whose table is not a registered replicated
/// view (a partitioned one holds only some rows on each instance).
fn check_joins(name: &str, svc: &ViewService, slots: &BTreeMap<String, Arc<ViewSlot>>) {
    for join in svc.joins() {
        let table = slots.get(join.table).map(|s| s.serving()).unwrap_or_else(|| {
            panic!(
                "view `{name}` joins `{}` from table `{}`, which is not a registered view",
                join.field, join.table
            )
        });
        assert!(
            table.scope() == eventfold_core::Scope::Replicated,
            "view `{name}` joins `{}` from view `{}`, which is partitioned: a lookup table must be Scope::Replicated (every instance holds it whole)",
            join.field,
            join.table
        );
    }
}
