//! The I/O loop of one process manager: gather a batch of inputs (answers, due timers,
//! source events), prefetch the states and timers of their keys, [`decide`], commit the
//! plan as one unit, then hand the new commands over.
//!
//! Exactly once: the consumed positions (`pm/<name>/<topic>/<partition>` in meta), the
//! fired timers' removal and the answered outbox entries' removal commit in the same
//! batch as the reactions' effects, so after a crash every input is reacted to again
//! only if its reaction was lost with it. Commands are handed over only once durable, and
//! again (same ids) after a restart until answered.

use super::changelog;
use super::decide::{self, Command, Envelope, Plan, Prefetched, Step, Timers};
use super::feed::Feed;
use super::outbox::{self, Answer};
use super::shared::{ProcessOptions, Shared};
use super::sources::{self, Source, checkpoint_key, timers_key};
use super::targets::Targets;
use crate::clock::Clock;
use eventfold_core::envelope::headers;
use eventfold_core::process::Subscription;
use eventfold_core::{ProcessManager, RecordRef};
use eventfold_log::{Append, CommitUnit, Consumed, Log};
use eventfold_store::{Batch, Store, TimerRow};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::{Notify, broadcast, mpsc};

/// Decodes the event at `offset` of `topic`/`partition` for subscription `sub`.
fn decode_event<E: 'static>(
    sub: &Subscription<E>,
    topic: &str,
    partition: u32,
    offset: u64,
    r: RecordRef<'_>,
) -> Result<Step<E>, String> {
    let at = || format!("event {topic}/{partition}@{offset}");
    let event = sub.decode(r.value).map_err(|e| format!("{}: {e}", at()))?;
    let text = |h: &str| r.header_str(h).unwrap_or_default().to_owned();
    Ok(Step::Event {
        event,
        envelope: Envelope {
            aggregate_type: sub.aggregate_type(),
            aggregate_id: r
                .header_str(headers::AGGREGATE_ID)
                .or_else(|| std::str::from_utf8(r.key).ok())
                .ok_or_else(|| format!("{} has no aggregate id", at()))?
                .to_owned(),
            version: r.header_str(headers::VERSION).and_then(|v| v.parse().ok()).unwrap_or(0),
            // Without an id (a record from another writer), its position stands in.
            event_id: r
                .header_str(headers::ID)
                .map_or_else(|| format!("{topic}/{partition}@{offset}"), str::to_owned),
            event_type: text(headers::TYPE),
            timestamp_ms: r.timestamp_ms,
            correlation_id: text(headers::CORRELATION_ID),
        },
        key: None,
    })
}

/// Why a worker stopped.
#[derive(Debug)]
pub(crate) enum Stop {
    /// For good (until a restart after a fix): a reaction failed, a stored row is corrupt.
    Fatal(String),
    /// The log failed (Kafka: the broker is away, a transaction failed or was fenced):
    /// worth starting over from the committed state.
    Retry(String),
}

impl From<String> for Stop {
    fn from(e: String) -> Self {
        Stop::Fatal(e)
    }
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Fatal(e) | Stop::Retry(e) => f.write_str(e),
        }
    }
}

/// Kafka mode: where a worker's changes go besides the local store (see `changelog`).
#[derive(Debug, Clone)]
pub(crate) struct ChangelogTarget {
    pub topic: Arc<str>,
    pub group: String,
    pub lane: u32,
}

/// How often the lag gauge asks the log for the sources' ends.
const LAG_EVERY: Duration = Duration::from_secs(1);

/// The fallback poll doubles this many times at most while nothing arrives.
const IDLE_DOUBLINGS: u32 = 2;

pub(crate) struct Worker<P: ProcessManager> {
    log: Arc<dyn Log>,
    store: Store,
    clock: Arc<dyn Clock>,
    options: ProcessOptions,
    config: P::Config,
    shared: Arc<Shared>,
    subs: Vec<Subscription<P::Event>>,
    sources: Vec<Source>,
    targets: Arc<Targets>,
    wake: Vec<broadcast::Receiver<(Arc<str>, u64)>>,
    answers_tx: mpsc::UnboundedSender<Answer>,
    answers: mpsc::UnboundedReceiver<Answer>,
    next_seq: u64,
    timers_pending: u64,
    outstanding: u64,
    changelog: Option<ChangelogTarget>,
    /// No pending timer sorts before this position (due time, key, timer id): timers fire
    /// in that order, and one scheduled before it moves it back. Due scans start here
    /// (see `Store::due_timers_from`).
    due_floor: Option<(i64, String, String)>,
    /// Kafka mode: the sources' records, pushed (see `feed`); `None`: read by polling.
    feed: Option<Feed>,
}

impl<P: ProcessManager> Worker<P> {
    /// Reads where the process manager stopped; `Err` names what is wrong (a source that
    /// is not registered, an unreadable store).
    pub(crate) fn new(
        log: &Arc<dyn Log>,
        targets: &Arc<Targets>,
        clock: &Arc<dyn Clock>,
        options: &ProcessOptions,
        config: P::Config,
        shared: Arc<Shared>,
        changelog: Option<ChangelogTarget>,
    ) -> Result<Self, String> {
        let store = log.store().clone();
        let subs = P::subscriptions(&config);
        let (sources, wake) = sources::open::<P>(log, targets, &store, &subs)?;
        let next_seq = store
            .outbox(P::NAME)
            .map_err(|e| format!("cannot read the outbox of `{}`: {e}", P::NAME))?
            .last()
            .map_or(1, |o| o.seq + 1);
        let timers_pending = sources::timers_pending::<P>(&store)?;
        shared.timers_pending.store(timers_pending, Ordering::Relaxed);
        let (answers_tx, answers) = mpsc::unbounded_channel();
        Ok(Self {
            log: log.clone(),
            store,
            clock: clock.clone(),
            options: options.clone(),
            config,
            shared,
            subs,
            sources,
            targets: targets.clone(),
            wake,
            answers_tx,
            answers,
            next_seq,
            timers_pending,
            outstanding: 0,
            changelog,
            due_floor: None,
            feed: None,
        })
    }

    /// Runs until a failure: the reason, fatal or worth a retry.
    pub(crate) async fn run(mut self) -> Stop {
        // Every commit of a source wakes the worker (the poll interval bounds the rest).
        let news = Arc::new(Notify::new());
        for mut rx in self.wake.drain(..) {
            let news = Arc::downgrade(&news);
            tokio::spawn(async move {
                while let Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) = rx.recv().await {
                    match news.upgrade() {
                        Some(n) => n.notify_one(),
                        None => return,
                    }
                }
            });
        }
        if let Err(e) = self.start().await {
            return e;
        }
        if self.changelog.is_some() {
            let sources: Vec<_> = self
                .sources
                .iter()
                .map(|s| (s.topic.clone(), s.partition, s.next))
                .collect();
            match Feed::start(&self.log, &sources, &news).await {
                Ok(feed) => self.feed = Some(feed),
                Err(e) => return Stop::Retry(e),
            }
        }
        let mut lag_checked: Option<Instant> = None;
        // Reads in a row that found nothing: the fallback poll slows down (on Kafka each
        // read at a partition's end owned elsewhere asks the broker).
        let mut idle = 0u32;
        loop {
            let steps = match self.gather().await {
                Ok(s) => s,
                Err(e) => return e,
            };
            self.check_ready();
            if lag_checked.is_none_or(|t| t.elapsed() >= LAG_EVERY) {
                self.update_lag().await;
                lag_checked = Some(Instant::now());
            }
            if steps.is_empty() && !self.probe_ends().await {
                return Stop::Retry("cannot read the sources' ends".into());
            }
            if steps.is_empty() {
                idle = idle.saturating_add(1);
                self.wait(&news, idle).await;
                continue;
            }
            idle = 0;
            if let Err(e) = self.step(steps).await {
                return e;
            }
        }
    }

    /// Takes the sources' ends (the restore barrier's target) and hands over again what
    /// the outbox holds (commands written before a restart and never answered).
    async fn start(&mut self) -> Result<(), Stop> {
        for s in &mut self.sources {
            s.target = self
                .log
                .end_offset(&s.topic, s.partition)
                .await
                .map_err(|e| Stop::Retry(format!("cannot read the end of {}/{}: {e}", s.topic, s.partition)))?;
        }
        let pending = self
            .store
            .outbox(P::NAME)
            .map_err(|e| format!("cannot read the outbox of `{}`: {e}", P::NAME))?;
        if !pending.is_empty() {
            tracing::info!(
                process_manager = P::NAME,
                commands = pending.len(),
                "handing over the outbox again"
            );
        }
        for entry in pending {
            let command = outbox::decode(&entry.data).map_err(|e| format!("outbox entry {}: {e}", entry.seq))?;
            self.hand_over(entry.seq, command)?;
        }
        Ok(())
    }

    fn hand_over(&mut self, seq: u64, command: Command) -> Result<(), Stop> {
        let target = self
            .targets
            .get(command.app.as_deref(), &command.aggregate_type)
            .ok_or_else(|| {
                format!(
                    "outbox entry {seq} is for aggregate type `{}`{}, which is not registered",
                    command.aggregate_type,
                    command
                        .app
                        .as_deref()
                        .map(|a| format!(" of app `{a}`"))
                        .unwrap_or_default()
                )
            })?;
        self.outstanding += 1;
        self.shared.outstanding.store(self.outstanding, Ordering::Relaxed);
        tokio::spawn(outbox::deliver(target, seq, command, self.answers_tx.clone()));
        Ok(())
    }

    /// The next batch: answers first, then due timers, then source events.
    async fn gather(&mut self) -> Result<Vec<Step<P::Event>>, Stop> {
        let max = self.options.max_batch;
        let mut steps = Vec::new();
        let now = self.clock.now_ms();
        while steps.len() < max {
            match self.answers.try_recv() {
                Ok((seq, command, result)) => {
                    steps.push(Step::Outcome {
                        seq,
                        command,
                        result,
                        now_ms: now,
                    });
                }
                Err(_) => break,
            }
        }
        if steps.len() < max {
            let due = self
                .store
                .due_timers_from(P::NAME, self.floor(), now, max - steps.len())
                .map_err(|e| format!("cannot read the due timers: {e}"))?;
            // Fired by this batch, or by none (the batch failed: the worker stops).
            if let Some(last) = due.last() {
                self.due_floor = Some((last.due_ms, last.key.clone(), last.timer.clone()));
                *self.shared.due_floor.lock().expect("not poisoned") = self.due_floor.clone();
            }
            steps.extend(due.into_iter().map(|t| Step::Timer {
                key: t.key,
                timer: t.timer,
                due_ms: t.due_ms,
                correlation_id: t.correlation_id,
            }));
        }
        if self.outstanding as usize >= self.options.max_outstanding {
            return Ok(steps);
        }
        if let Some(feed) = self.feed.as_mut() {
            for (i, offset, record) in feed.take(max - steps.len()) {
                let s = &self.sources[i];
                if offset < s.next {
                    continue; // delivered again (a follower restarted): already consumed
                }
                let step = decode_event(&self.subs[s.sub], &s.topic, s.partition, offset, record.as_record_ref())
                    .map_err(Stop::Fatal)?;
                steps.push(step);
                self.sources[i].next = offset + 1;
            }
            return Ok(steps);
        }
        // Events: each partition in turn, a share of the batch each, so that a backlog on
        // one does not starve the others.
        let share = (max / self.sources.len().max(1)).max(16);
        for i in 0..self.sources.len() {
            if steps.len() >= max {
                break;
            }
            let budget = share.min(max - steps.len());
            let (topic, partition, from, sub) = {
                let s = &self.sources[i];
                (s.topic.clone(), s.partition, s.next, s.sub)
            };
            let (read, next) = self.read(&topic, partition, from, budget, sub).await?;
            steps.extend(read);
            self.sources[i].next = next;
        }
        Ok(steps)
    }

    /// Reads up to `max` events of one source partition; returns them and the next offset.
    async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
        sub: usize,
    ) -> Result<(Vec<Step<P::Event>>, u64), Stop> {
        let mut out = Vec::new();
        let mut next = from;
        let mut failed = None;
        let decode = |offset: u64, r: RecordRef<'_>| decode_event(&self.subs[sub], topic, partition, offset, r);
        self.log
            .read_with(
                topic,
                partition,
                from,
                max,
                &mut |offset, record| match decode(offset, record) {
                    Ok(step) => {
                        out.push(step);
                        next = offset + 1;
                        true
                    }
                    Err(e) => {
                        failed = Some(e);
                        false
                    }
                },
            )
            .await
            .map_err(|e| Stop::Retry(format!("cannot read {topic}/{partition}: {e}")))?;
        match failed {
            // An event that does not decode stops the process manager before it: nothing
            // after it is consumed, so it is read again once fixed.
            Some(e) => Err(Stop::Fatal(e)),
            None => Ok((out, next)),
        }
    }

    /// Prefetches, decides and commits one batch, then hands over its commands.
    async fn step(&mut self, mut steps: Vec<Step<P::Event>>) -> Result<(), Stop> {
        decide::correlate::<P>(&mut steps);
        let pre = self.prefetch(&steps)?;
        let targets = &self.targets;
        let plan = decide::decide::<P>(steps, pre, &self.config, targets.tables(), &|app, t| {
            targets.knows(app, t)
        })?;
        let (answered, reactions) = (plan.answered.len() as u64, plan.reactions);
        let mut batch = Batch::new();
        let mut records = changelog::Records::new(self.clock.now_ms());
        let (sends, timers_pending) = self.write_plan(plan, &mut batch, &mut records);
        self.commit(batch, records).await?;

        for s in &mut self.sources {
            s.written = s.next;
        }
        self.outstanding -= answered;
        self.timers_pending = timers_pending;
        self.shared.timers_pending.store(self.timers_pending, Ordering::Relaxed);
        self.shared.reactions.fetch_add(reactions, Ordering::Relaxed);
        for (seq, command) in sends {
            self.hand_over(seq, command)?;
        }
        self.shared.outstanding.store(self.outstanding, Ordering::Relaxed);
        Ok(())
    }

    /// The stored states and timers of the keys `steps` concern.
    fn prefetch(&self, steps: &[Step<P::Event>]) -> Result<Prefetched<P>, Stop> {
        let mut pre = Prefetched::<P>::default();
        for key in decide::keys(steps) {
            if let Some(json) = self
                .store
                .get_process_state(P::NAME, &key)
                .map_err(|e| format!("cannot read the state of key `{key}`: {e}"))?
            {
                let state = serde_json::from_slice(&json)
                    .map_err(|e| format!("the stored state of key `{key}` does not decode: {e}"))?;
                pre.states.insert(key.clone(), state);
            }
            let mut timers = Timers::new();
            for t in self
                .store
                .timers_of(P::NAME, &key)
                .map_err(|e| format!("cannot read the timers of key `{key}`: {e}"))?
            {
                timers.insert(t.timer, (t.due_ms, t.correlation_id));
            }
            pre.timers.insert(key, timers);
        }
        Ok(pre)
    }

    /// Writes `plan` into `batch` and the changelog `records` (states, timers, outbox
    /// entries with their sequence numbers, answered entries, moved positions, the timer
    /// count when it changed); returns the commands to hand over after the commit and the
    /// timers pending then.
    fn write_plan(
        &mut self,
        plan: Plan,
        batch: &mut Batch,
        records: &mut changelog::Records,
    ) -> (Vec<(u64, Command)>, u64) {
        for (key, state) in &plan.states {
            match state {
                Some(json) => batch.put_process_state(P::NAME, key, json),
                None => batch.delete_process_state(P::NAME, key),
            }
            records.state(key, state.as_deref());
        }
        for (key, timer, due) in &plan.timer_dels {
            batch.delete_timer(P::NAME, key, timer, *due);
            records.timer(key, timer, None);
        }
        for (key, timer, due_ms, correlation_id) in &plan.timer_puts {
            batch.put_timer(
                P::NAME,
                &TimerRow {
                    key: key.clone(),
                    timer: timer.clone(),
                    due_ms: *due_ms,
                    correlation_id: correlation_id.clone(),
                },
            );
            records.timer(key, timer, Some((*due_ms, correlation_id)));
        }
        let mut sends = Vec::with_capacity(plan.sends.len());
        for command in plan.sends {
            let seq = self.next_seq;
            self.next_seq += 1;
            let data = outbox::encode(&command);
            batch.put_outbox(P::NAME, seq, &data);
            records.outbox(seq, Some(&data));
            sends.push((seq, command));
        }
        for seq in &plan.answered {
            batch.delete_outbox(P::NAME, *seq);
            records.outbox(*seq, None);
        }
        for s in self.sources.iter().filter(|s| s.next != s.written) {
            batch.put_meta(&checkpoint_key(P::NAME, &s.topic, s.partition), s.next);
            records.position(&s.topic, s.partition, s.next);
        }
        let earliest = plan.timer_puts.iter().map(|(k, t, due, _)| (*due, k, t)).min();
        if let (Some((due, key, timer)), Some(floor)) = (earliest, &self.due_floor)
            && (due, key, timer) < (floor.0, &floor.1, &floor.2)
        {
            self.due_floor = Some((due, key.clone(), timer.clone()));
            *self.shared.due_floor.lock().expect("not poisoned") = self.due_floor.clone();
        }
        let timers_pending =
            (self.timers_pending + plan.timer_puts.len() as u64).saturating_sub(plan.timer_dels.len() as u64);
        if timers_pending != self.timers_pending {
            batch.put_meta(&timers_key(P::NAME), timers_pending);
            records.timers_pending(timers_pending);
        }
        (sends, timers_pending)
    }

    /// Commits `batch` (and in Kafka mode the changelog `records`) as one unit.
    async fn commit(&self, batch: Batch, records: changelog::Records) -> Result<(), Stop> {
        // Durable before any command is handed over (I4 for the outbox): one fsynced
        // batch, or in Kafka mode one transaction with the changelog records and the
        // group's generation (I1: a member the group moved on from cannot commit).
        let mut unit = CommitUnit {
            local: batch,
            ..CommitUnit::default()
        };
        if let Some(c) = &self.changelog {
            unit.lane = Some(c.lane);
            unit.appends = records
                .records
                .into_iter()
                .map(|record| Append {
                    topic: c.topic.clone(),
                    partition: 0,
                    record,
                    entity: None,
                })
                .collect();
            unit.consumed.push(Consumed {
                group: c.group.clone(),
                topic: c.topic.clone(),
                partition: 0,
                next_offset: 0,
            });
        }
        let receipt = self.log.commit(unit).await.map_err(|e| {
            let why = format!("cannot commit a batch: {e}");
            if self.changelog.is_some() {
                Stop::Retry(why)
            } else {
                Stop::Fatal(why)
            }
        })?;
        if self.changelog.is_some()
            && let Some(last) = receipt.offsets.iter().max()
        {
            // How far the local store has the changelog (a replay from an earlier point
            // leaves the same rows).
            let mut mark = Batch::new();
            mark.put_meta(&changelog::applied_key(P::NAME), last + 1);
            let _ = self.log.write_local(mark).await;
        }
        Ok(())
    }

    /// [`Worker::due_floor`] as the store takes it.
    fn floor(&self) -> Option<(i64, &str, &str)> {
        self.due_floor.as_ref().map(|(d, k, t)| (*d, k.as_str(), t.as_str()))
    }

    /// Ready (the restore barrier) once every source is read to the end it had at start.
    fn check_ready(&self) {
        if self.sources.iter().all(|s| s.next >= s.target) {
            self.shared.set_ready();
        }
    }

    /// With nothing to read: a source below the end it had at start whose next read finds
    /// nothing has reached it (on Kafka the offsets after the last record hold
    /// transaction markers, never read). Only until ready. False when the log failed.
    async fn probe_ends(&mut self) -> bool {
        for i in 0..self.sources.len() {
            let (topic, partition, next, target) = {
                let s = &self.sources[i];
                (s.topic.clone(), s.partition, s.next, s.target)
            };
            if next >= target {
                continue;
            }
            match self.log.read(&topic, partition, next, 1).await {
                Ok(records) if records.is_empty() => self.sources[i].target = next,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(process_manager = P::NAME, error = %e, "cannot read {topic}/{partition}");
                    return false;
                }
            }
        }
        true
    }

    /// Source events not read yet (asks the log for each source partition's end).
    async fn update_lag(&mut self) {
        let mut lag = 0;
        for s in &self.sources {
            if let Ok(end) = self.log.end_offset(&s.topic, s.partition).await {
                lag += end.saturating_sub(s.next);
            }
        }
        self.shared.lag.store(lag, Ordering::Relaxed);
    }

    /// Sleeps until a source has news, an answer arrives, the next timer is due, or the
    /// poll interval passes.
    async fn wait(&mut self, news: &Notify, idle: u32) {
        let mut sleep = self
            .options
            .poll_interval
            .saturating_mul(1 << idle.saturating_sub(1).min(IDLE_DOUBLINGS));
        if let Ok(Some(due)) = self.store.next_timer_due(P::NAME, self.floor()) {
            let until = due.saturating_sub(self.clock.now_ms()).max(0) as u64;
            sleep = sleep.min(Duration::from_millis(until));
        }
        tokio::select! {
            answer = self.answers.recv() => {
                // Put back: `gather` takes answers from the channel.
                if let Some(a) = answer {
                    let _ = self.answers_tx.send(a);
                }
            }
            () = news.notified() => {}
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}
