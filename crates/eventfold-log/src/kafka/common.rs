//! What every rdkafka client of this backend shares: client configs, and the conversions
//! of errors, headers and records. Depends on nothing else of the backend but its options.

use super::options::KafkaOptions;
use crate::Error;
use eventfold_core::Record;
use eventfold_core::envelope::headers;
use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use std::sync::Arc;

/// A log error from an rdkafka error, with what was being done.
pub(super) fn kafka_error(what: &str, e: KafkaError) -> Error {
    Error::Kafka(format!("{what}: {e}"))
}

/// The settings every client shares: brokers, no topic auto-creation (topics are created
/// by the provisioner with the right partition count), then the user's extras.
pub(super) fn base_config(options: &KafkaOptions) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &options.bootstrap_servers)
        .set("allow.auto.create.topics", "false");
    for (k, v) in &options.client_config {
        c.set(k, v);
    }
    c
}

/// Whether the user's extra client config sets `key` (eventfold's own default for it then
/// gives way).
pub(super) fn user_sets(options: &KafkaOptions, key: &str) -> bool {
    options.client_config.iter().any(|(k, _)| k == key)
}

/// The settings of eventfold's producers (transactional and `Log::send`'s): the shared
/// ones, and batches compressed with LZ4 unless the user chose a compression
/// (`compression.type` or its alias `compression.codec`; `none` turns it off).
///
/// LZ4 is for the broker more than for the bytes. It validates an uncompressed batch
/// record by record, allocating every record's key, value and headers (an event carries
/// about eight), while a compressed batch that it keeps as it came is validated without
/// them, which shows in the broker's allocations and p99 (bench/FINDINGS.md, "Moved from
/// code comments"). A new instance's restore pays for it: librdkafka decompresses what
/// it fetches.
///
/// `linger.ms` is 1 unless the user sets it (or its alias `queue.buffering.max.ms`): a
/// transaction hands all its records over at once, and a request then waits at most a
/// millisecond for the rest of its batch.
pub(super) fn producer_config(options: &KafkaOptions) -> ClientConfig {
    let mut c = base_config(options);
    if !user_sets(options, "compression.type") && !user_sets(options, "compression.codec") {
        c.set("compression.type", "lz4");
    }
    if !user_sets(options, "linger.ms") && !user_sets(options, "queue.buffering.max.ms") {
        c.set("linger.ms", "1");
    }
    c
}

/// A `read_committed` consumer configuration (no group unless `group` is set).
pub(super) fn consumer_config(options: &KafkaOptions, group: Option<&str>) -> ClientConfig {
    let mut c = base_config(options);
    c.set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        // Reads stop at the end of the partition: do not let the broker park a fetch.
        .set("fetch.wait.max.ms", "20");
    if let Some(g) = group {
        c.set("group.id", g);
    }
    // The user's extras win over these defaults too.
    for (k, v) in &options.client_config {
        c.set(k, v);
    }
    c
}

/// The headers of `r` as Kafka headers.
pub(super) fn kafka_headers(r: &Record) -> rdkafka::message::OwnedHeaders {
    r.headers.iter().fold(
        rdkafka::message::OwnedHeaders::new_with_capacity(r.headers.len()),
        |h, (k, v)| h.insert(rdkafka::message::Header { key: k, value: Some(v) }),
    )
}

pub(super) fn to_record(m: &BorrowedMessage<'_>) -> Record {
    Record {
        key: m.key().unwrap_or_default().to_vec(),
        value: m.payload().unwrap_or_default().to_vec(),
        headers: m
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| (headers::name(h.key), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default(),
        timestamp_ms: m.timestamp().to_millis().unwrap_or(0),
    }
}

/// Runs `fut` to completion on the current thread. For rdkafka's admin futures, which
/// are completed by librdkafka's own threads and need no async runtime; used only on the
/// committer thread and in `spawn_blocking`.
pub(super) fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `producer_config` sets `default` for `keys[0]` unless the user's config sets either
    /// key (the other is its alias), which is then left as the user set it; consumers never
    /// get the producer property.
    fn default_gives_way(keys: [&str; 2], default: &str, user: &str) {
        let mut o = KafkaOptions::new("127.0.0.1:9", 1, "t");
        assert_eq!(producer_config(&o).get(keys[0]), Some(default));
        assert_eq!(consumer_config(&o, None).get(keys[0]), None);
        for (set, other) in [(keys[0], keys[1]), (keys[1], keys[0])] {
            o.client_config = vec![(set.to_owned(), user.to_owned())];
            let c = producer_config(&o);
            assert_eq!(c.get(set), Some(user), "{set}");
            assert_eq!(c.get(other), None, "{set} set: {other} is left alone");
        }
    }

    #[test]
    fn producers_compress_with_lz4_unless_the_user_chose_a_compression() {
        default_gives_way(["compression.type", "compression.codec"], "lz4", "none");
    }

    #[test]
    fn producers_linger_a_millisecond_unless_the_user_says_otherwise() {
        default_gives_way(["linger.ms", "queue.buffering.max.ms"], "1", "0");
    }
}
