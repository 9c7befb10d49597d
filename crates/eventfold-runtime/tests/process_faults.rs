//! Process managers under faults (issue 53, point 7), in process on the embedded log: a
//! reaction that panics, or sends to an aggregate type that is not registered, stops the
//! process manager as `failed` with the reason, while commands go on; nothing it consumed
//! is lost: after the fix and a restart it reacts to the same events.

use eventfold_core::testing::{Counter, CounterEvent};
use eventfold_core::{Actions, Aggregate, EventMeta, Input, ProcessContext, ProcessManager, Subscription};
use eventfold_log::Log;
use eventfold_log::embedded::{EmbeddedLog, Options};
use eventfold_runtime::{CommandRequest, ProcessState, Runtime, RuntimeOptions};
use eventfold_store::{Store, StoreOptions};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn embedded(dir: &tempfile::TempDir) -> Arc<dyn Log> {
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    Arc::new(
        EmbeddedLog::open(
            store,
            Options {
                partitions: 2,
                ..Default::default()
            },
        )
        .unwrap(),
    )
}

fn add(id: &str, n: u64) -> CommandRequest {
    CommandRequest {
        aggregate_id: id.into(),
        body: format!(r#"{{"type":"Add","n":{n}}}"#).into_bytes(),
        ..Default::default()
    }
}

/// How a [`Mirror`] is broken.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Bug {
    #[default]
    None,
    /// Panics on an `Added { n: 13 }`.
    PanicOn13,
    /// Sends to aggregate type `nowhere` on an `Added { n: 13 }`.
    UnknownTargetOn13,
}

/// Mirrors every `Added` of counter `c` as an `Add` to counter `mirror-c`.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Mirror {
    seen: u64,
}

impl ProcessManager for Mirror {
    const NAME: &'static str = "mirror";
    type Event = CounterEvent;
    type Config = Bug;
    fn subscriptions(_: &Self::Config) -> Vec<Subscription<CounterEvent>> {
        vec![Subscription::to::<Counter>(|e| e)]
    }
    fn correlate(_: &CounterEvent, meta: &EventMeta<'_>) -> Option<String> {
        (!meta.aggregate_id.starts_with("mirror-")).then(|| meta.aggregate_id.to_owned())
    }
    fn react(&mut self, input: Input<'_, CounterEvent>, ctx: &ProcessContext<'_, Bug>, actions: &mut Actions) {
        if let Input::Event {
            event: CounterEvent::Added { n },
            ..
        } = input
        {
            match (n, ctx.config) {
                (13, Bug::PanicOn13) => panic!("thirteen"),
                (13, Bug::UnknownTargetOn13) => {
                    actions.send_json("nowhere", "x", serde_json::json!({"type": "Add", "n": 1}));
                }
                _ => {
                    self.seen += n;
                    let target = format!("mirror-{}", ctx.key);
                    actions.send_json(Counter::TYPE, target, serde_json::json!({"type": "Add", "n": n}));
                }
            }
        }
    }
}

async fn state_of(rt: &Runtime) -> ProcessState {
    rt.process_manager("mirror").unwrap().report().state
}

async fn total(rt: &Runtime, id: &str) -> u64 {
    match rt.aggregate("counter").unwrap().state(id).await.unwrap() {
        Some(s) => serde_json::from_str::<Counter>(s.state.get()).unwrap().total,
        None => 0,
    }
}

async fn wait_until(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f().await {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_broken_reaction_stops_only_the_process_manager(bug: Bug, reason: &str) {
    let dir = tempfile::tempdir().unwrap();
    {
        let rt = Runtime::builder(RuntimeOptions::default())
            .aggregate::<Counter>(())
            .process_manager::<Mirror>(bug)
            .build(embedded(&dir));
        let svc = rt.aggregate("counter").unwrap().clone();
        svc.submit(add("a", 2)).await.unwrap();
        wait_until("the first event is mirrored", async || {
            total(&rt, "mirror-a").await == 2
        })
        .await;
        svc.submit(add("a", 13)).await.unwrap();
        wait_until("the process manager fails", async || {
            state_of(&rt).await == ProcessState::Failed
        })
        .await;
        let report = rt.process_manager("mirror").unwrap().report();
        let error = report.error.unwrap_or_default();
        assert!(error.contains(reason) && error.contains("mirror"), "{error}");
        assert!(!rt.is_ready(), "a failed process manager makes the instance not ready");
        // The command path goes on.
        svc.submit(add("b", 5)).await.unwrap();
        svc.submit(add("a", 1)).await.unwrap();
        assert_eq!(total(&rt, "a").await, 16);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            total(&rt, "mirror-b").await,
            0,
            "a failed process manager reacts to nothing"
        );
    }
    // Fixed and restarted on the same store: it reacts to the 13 and everything after.
    let rt = Runtime::builder(RuntimeOptions::default())
        .aggregate::<Counter>(())
        .process_manager::<Mirror>(Bug::None)
        .build(embedded(&dir));
    wait_until("the fixed process manager catches up", async || {
        total(&rt, "mirror-a").await == 16 && total(&rt, "mirror-b").await == 5
    })
    .await;
    assert_eq!(state_of(&rt).await, ProcessState::Ready);
    // Exactly once: nothing more arrives.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!((total(&rt, "mirror-a").await, total(&rt, "mirror-b").await), (16, 5));
    let view = rt.process_manager("mirror").unwrap().get("a").unwrap().unwrap();
    assert_eq!(view.state.get(), r#"{"seen":16}"#);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_reaction_fails_the_process_manager_and_loses_nothing() {
    a_broken_reaction_stops_only_the_process_manager(Bug::PanicOn13, "panicked").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_for_an_unknown_aggregate_type_fails_the_process_manager_and_loses_nothing() {
    a_broken_reaction_stops_only_the_process_manager(Bug::UnknownTargetOn13, "`nowhere`").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_manager_reading_an_unregistered_type_fails_at_start() {
    let dir = tempfile::tempdir().unwrap();
    // Counter is not registered: the mirror's source is missing.
    let rt = Runtime::builder(RuntimeOptions::default())
        .process_manager::<Mirror>(Bug::None)
        .build(embedded(&dir));
    let report = rt.process_manager("mirror").unwrap().report();
    assert_eq!(report.state, ProcessState::Failed);
    assert!(report.error.unwrap().contains("`counter`, which is not registered"));
    assert!(rt.process_manager("nope").is_err());
}
