#!/usr/bin/env python3
"""Transaction smoke test for the broker started by scripts/kafka/broker.sh.

Uses confluent-kafka (librdkafka), a client independent of eventfold:
  pip install confluent-kafka

Produces 3 records in a committed transaction and 2 in an aborted one, then asserts that a
read_committed consumer sees exactly the 3 committed records (in order, with headers) and a
read_uncommitted consumer sees all 5 (so the aborted ones really reached the log).
Exits 0 on success, 1 on any failure.

Bootstrap: --bootstrap, else $EVENTFOLD_KAFKA_BOOTSTRAP, else 127.0.0.1:${EVENTFOLD_KAFKA_PORT:-9092}.
"""

import argparse
import os
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def log(msg):
    print(f"[smoke] {msg}", file=sys.stderr, flush=True)


def fail(msg):
    print(f"\n[smoke] FAILED: {msg}\n", file=sys.stderr, flush=True)
    sys.exit(1)


def create_topic(bootstrap, topic):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    futures[topic].result(timeout=30)


def read_all(bootstrap, topic, isolation, expected_end, timeout_s=30.0):
    """Reads partition 0 of topic from the start until its position reaches expected_end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"smoke-{isolation}-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    tp = TopicPartition(topic, 0, 0)
    consumer.assign([tp])
    out = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                if msg.error():
                    raise KafkaException(msg.error())
                headers = {k: (v.decode() if v is not None else None) for k, v in (msg.headers() or [])}
                out.append((msg.offset(), msg.key().decode(), msg.value().decode(), headers))
            pos = consumer.position([TopicPartition(topic, 0)])[0].offset
            if pos >= expected_end:
                break
        else:
            fail(f"{isolation} consumer did not reach offset {expected_end} within {timeout_s}s (got {out})")
    finally:
        consumer.close()
    return out


def main():
    default_bootstrap = os.environ.get("EVENTFOLD_KAFKA_BOOTSTRAP") or (
        f"127.0.0.1:{os.environ.get('EVENTFOLD_KAFKA_PORT', '9092')}"
    )
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default=default_bootstrap)
    ap.add_argument("--init-timeout", type=float, default=60.0, help="init_transactions timeout (s)")
    args = ap.parse_args()

    run = uuid.uuid4().hex[:8]
    topic = f"smoke-txn-{run}"
    log(f"bootstrap={args.bootstrap} topic={topic}")
    create_topic(args.bootstrap, topic)

    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "transactional.id": f"smoke-txn-{run}",
            "enable.idempotence": True,
            "acks": "all",
        }
    )

    t0 = time.monotonic()
    producer.init_transactions(args.init_timeout)
    log(f"init_transactions took {time.monotonic() - t0:.1f}s")

    committed = [f"committed-{i}" for i in range(3)]
    aborted = [f"aborted-{i}" for i in range(2)]

    producer.begin_transaction()
    for i, v in enumerate(committed):
        producer.produce(topic, key=f"k{i}", value=v, headers=[("txn", "commit"), ("seq", str(i))])
    producer.commit_transaction(30)
    log("committed 3 records")

    producer.begin_transaction()
    for i, v in enumerate(aborted):
        producer.produce(topic, key=f"a{i}", value=v, headers=[("txn", "abort"), ("seq", str(i))])
    producer.flush(30)  # make sure the aborted records really reach the log before aborting
    producer.abort_transaction(30)
    log("aborted 2 records")

    # Log layout: 3 committed data + commit marker + 2 aborted data + abort marker = offsets 0..6.
    end = len(committed) + 1 + len(aborted) + 1

    seen = read_all(args.bootstrap, topic, "read_committed", end)
    for off, k, v, h in seen:
        log(f"read_committed   offset={off} key={k} value={v} headers={h}")
    values = [v for _, _, v, _ in seen]
    if values != committed:
        fail(f"read_committed saw {values}, expected exactly {committed}")
    if [h for _, _, _, h in seen] != [{"txn": "commit", "seq": str(i)} for i in range(3)]:
        fail(f"unexpected headers: {[h for _, _, _, h in seen]}")

    raw = [v for _, _, v, _ in read_all(args.bootstrap, topic, "read_uncommitted", end)]
    log(f"read_uncommitted values={raw}")
    if raw != committed + aborted:
        fail(f"read_uncommitted saw {raw}, expected {committed + aborted}")

    log("OK: read_committed saw exactly the 3 committed records; the 2 aborted ones are hidden")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KafkaException as e:
        fail(f"Kafka error: {e}")
