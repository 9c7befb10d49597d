//! Lookup tables read from the contexts of pure code (issue 54, item 1), in process on the
//! embedded log: a replicated view `totals` (counter id -> its total) is read by an
//! aggregate's `handle` (a gate that opens only for a counter at 10 or more), by a process
//! manager's reaction (it copies the total it reads to another counter) and by a
//! projection's `apply` (it stores the total it reads with each passage).

use eventfold_core::projection::{Event, Index, Projection, ViewChanges};
use eventfold_core::testing::{Counter, CounterEvent};
use eventfold_core::{
    Actions, Aggregate, Context, EventMeta, Input, ProcessContext, ProcessManager, Reject, Subscription,
};
use eventfold_log::Log;
use eventfold_log::embedded::{EmbeddedLog, Options};
use eventfold_runtime::{CommandRequest, Runtime, RuntimeOptions};
use eventfold_store::{Store, StoreOptions};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `totals`: counter id -> `{total}`; replicated (the default), so a lookup table.
#[derive(Debug, Default)]
struct Totals;

impl Projection for Totals {
    const VIEW: &'static str = "totals";
    type Source = Counter;
    fn indexes(&self) -> Vec<Index> {
        Vec::new()
    }
    fn apply(&self, event: &Event<'_, CounterEvent>, view: &mut ViewChanges<'_>) {
        let CounterEvent::Added { n } = event.payload;
        let before = view
            .get(event.aggregate_id)
            .and_then(|r| r["total"].as_u64())
            .unwrap_or(0);
        view.upsert(event.aggregate_id, json!({"total": before + n}));
    }
}

/// A gate per counter: `Pass` is accepted only when `totals` shows the counter at 10 or more.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Gate {
    passes: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type")]
enum GateCommand {
    Pass,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type")]
enum GateEvent {
    Passed { total: u64 },
}

#[derive(Debug)]
struct TooLow(u64);

impl std::fmt::Display for TooLow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the counter is at {}, under 10", self.0)
    }
}

impl Reject for TooLow {
    fn code(&self) -> &'static str {
        "too_low"
    }
}

impl Aggregate for Gate {
    const TYPE: &'static str = "gate";
    type Command = GateCommand;
    type Event = GateEvent;
    type Rejection = TooLow;
    type Config = ();
    fn handle(&self, _: GateCommand, ctx: &Context<'_, ()>) -> Result<Vec<GateEvent>, TooLow> {
        let total = ctx
            .lookup("totals", ctx.aggregate_id)
            .and_then(|r| r["total"].as_u64())
            .unwrap_or(0);
        if total < 10 {
            return Err(TooLow(total));
        }
        Ok(vec![GateEvent::Passed { total }])
    }
    fn apply(&mut self, _: &GateEvent) {
        self.passes += 1;
    }
}

/// `passages`: gate id -> the counter's total as `totals` showed it when applied.
#[derive(Debug, Default)]
struct Passages;

impl Projection for Passages {
    const VIEW: &'static str = "passages";
    type Source = Gate;
    fn indexes(&self) -> Vec<Index> {
        Vec::new()
    }
    fn apply(&self, event: &Event<'_, GateEvent>, view: &mut ViewChanges<'_>) {
        let seen = event.lookup("totals", event.aggregate_id).map(|r| r["total"].clone());
        view.upsert(event.aggregate_id, json!({"seen": seen}));
    }
}

/// On a gate's `Passed`, adds the counter's total as `totals` shows it to `copy-<gate>`.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Copier;

impl ProcessManager for Copier {
    const NAME: &'static str = "copier";
    type Event = GateEvent;
    type Config = ();
    fn subscriptions(_: &()) -> Vec<Subscription<GateEvent>> {
        vec![Subscription::to::<Gate>(|e| e)]
    }
    fn correlate(_: &GateEvent, meta: &EventMeta<'_>) -> Option<String> {
        Some(meta.aggregate_id.to_owned())
    }
    fn react(&mut self, input: Input<'_, GateEvent>, ctx: &ProcessContext<'_, ()>, actions: &mut Actions) {
        if let Input::Event { .. } = input {
            let total = ctx
                .lookup("totals", ctx.key)
                .and_then(|r| r["total"].as_u64())
                .unwrap_or(0);
            actions.send_json(
                Counter::TYPE,
                format!("copy-{}", ctx.key),
                json!({"type": "Add", "n": total}),
            );
            actions.finish();
        }
    }
}

fn command(id: &str, body: serde_json::Value) -> CommandRequest {
    CommandRequest {
        aggregate_id: id.into(),
        body: body.to_string().into_bytes(),
        ..Default::default()
    }
}

async fn wait_until(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f().await {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handle_reactions_and_projections_read_lookup_tables() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let log: Arc<dyn Log> = Arc::new(
        EmbeddedLog::open(
            store,
            Options {
                partitions: 2,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let rt = Runtime::builder(RuntimeOptions::default())
        .aggregate::<Counter>(())
        .aggregate::<Gate>(())
        .view::<Totals>()
        .view::<Passages>()
        .process_manager::<Copier>(())
        .build(log);
    assert!(rt.wait_restored(Duration::from_secs(20)).await);
    let counters = rt.aggregate("counter").unwrap().clone();
    let gates = rt.aggregate("gate").unwrap().clone();
    let totals = rt.view("totals").unwrap();

    // handle: refused while the table shows under 10 (here: no row at all).
    match gates.submit(command("g", json!({"type": "Pass"}))).await.unwrap() {
        eventfold_core::Outcome::Rejected { error, message } => {
            assert_eq!(error, "too_low");
            assert!(message.contains("at 0"), "{message}");
        }
        other => panic!("expected a refusal: {other:?}"),
    }
    for n in [4, 8] {
        counters
            .submit(command("g", json!({"type": "Add", "n": n})))
            .await
            .unwrap();
    }
    wait_until("totals shows 12", async || {
        totals.get("g").unwrap().is_some_and(|r| r.get().contains("12"))
    })
    .await;
    // handle: accepted once the table shows 12, and the event records what it read.
    match gates.submit(command("g", json!({"type": "Pass"}))).await.unwrap() {
        eventfold_core::Outcome::Accepted(a) => {
            assert_eq!(a.events[0].payload.get(), r#"{"type":"Passed","total":12}"#);
        }
        other => panic!("expected the gate to open: {other:?}"),
    }
    // The process manager read 12 from the table and added it to `copy-g`.
    wait_until("the copier adds the total it read", async || {
        counters
            .state("copy-g")
            .await
            .unwrap()
            .is_some_and(|s| serde_json::from_str::<Counter>(s.state.get()).unwrap().total == 12)
    })
    .await;
    // The projection stored what the table showed when it applied the passage.
    let passages = rt.view("passages").unwrap();
    wait_until("the passage is applied", async || passages.get("g").unwrap().is_some()).await;
    let row: serde_json::Value = serde_json::from_str(passages.get("g").unwrap().unwrap().get()).unwrap();
    assert_eq!(row, json!({"seen": 12}));
}
