package dev.eventfold.bench.ks;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.function.LongSupplier;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.utils.Utils;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.processor.api.RecordMetadata;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * The command path of one partition of one aggregate type: dedup by command id, decode,
 * optimistic version check, handle, then events + new state + dedup outcome + result, and
 * with the flows the commands the new events cause ({@link Flow}). Kafka Streams with
 * {@code exactly_once_v2} commits all of it (output records, changelog records of both
 * stores, consumed offsets) in one transaction per commit interval.
 */
final class CommandProcessor<C> implements Processor<byte[], byte[], byte[], Out> {
    static final String H_TYPE = "ef-type";
    static final String H_ID = "ef-id";
    static final String H_AGGREGATE_ID = "ef-aggregate-id";
    static final String H_VERSION = "ef-version";
    static final String H_COMMAND_ID = "ef-command-id";
    static final String H_CORRELATION_ID = "ef-correlation-id";
    static final String H_CAUSATION_ID = "ef-causation-id";
    static final String H_CONTENT_TYPE = "content-type";
    static final String H_EXPECTED_VERSION = "ef-expected-version";

    private static final byte[] JSON = "application/json".getBytes(StandardCharsets.UTF_8);
    private static final byte[] OUTCOME = "Outcome".getBytes(StandardCharsets.UTF_8);

    /** The stores and sinks of one aggregate type's processor; {@code flowSink} null without flows. */
    record Names(String stateStore, String dedupStore, String eventsSink, String resultsSink, String flowSink) {}

    private final Aggregate<C> kind;
    private final Names names;
    private final int partitions;
    private final LongSupplier clock;
    private ProcessorContext<byte[], Out> context;
    private KeyValueStore<String, String> states;
    private KeyValueStore<String, String> dedup;

    CommandProcessor(Aggregate<C> kind, Names names, int partitions, LongSupplier clock) {
        this.kind = kind;
        this.names = names;
        this.partitions = partitions;
        this.clock = clock;
    }

    @Override
    public void init(ProcessorContext<byte[], Out> context) {
        this.context = context;
        this.states = context.getStateStore(names.stateStore());
        this.dedup = context.getStateStore(names.dedupStore());
    }

    @Override
    public void process(Record<byte[], byte[]> record) {
        RecordMetadata meta = context.recordMetadata().orElseThrow();
        int partition = meta.partition();
        Headers in = record.headers();
        String commandId = header(in, H_COMMAND_ID);
        if (commandId == null) {
            commandId = meta.topic() + ":" + partition + ":" + meta.offset();
        }
        long now = clock.getAsLong();

        // 1. Dedup: a command id seen before gets its stored outcome again, nothing re-runs.
        String seen = dedup.get(commandId);
        if (seen != null) {
            result(partition, commandId, seen.getBytes(StandardCharsets.UTF_8), now);
            return;
        }

        byte[] keyBytes = record.key() == null ? new byte[0] : record.key();
        String aggregateId = new String(keyBytes, StandardCharsets.UTF_8);

        // 2. Decode (a record that is not a valid command is refused, recorded and consumed).
        C command;
        Long expected = null;
        try {
            int home = Utils.toPositive(Utils.murmur2(keyBytes)) % partitions;
            if (home != partition) {
                throw Order.BadCommand.malformed(
                        "command record",
                        "aggregate id " + Json.rustDebug(aggregateId) + " belongs to partition " + home
                                + " (murmur2), not " + partition
                                + ": produce with Kafka's default partitioner"
                                + " (librdkafka/kcat: -X partitioner=murmur2_random)");
            }
            command = kind.decode(record.value(), header(in, H_TYPE));
            String ev = header(in, H_EXPECTED_VERSION);
            if (ev != null) {
                expected = parseVersion(ev);
            }
        } catch (Order.BadCommand bad) {
            finish(partition, commandId, rejected(bad.code, bad.getMessage()), now, true);
            return;
        }

        Aggregate.Instance<C> order = kind.load(states.get(aggregateId));

        // 3. Optimistic check. Like eventfold's conflicts, not recorded for dedup.
        if (expected != null && expected.longValue() != order.version()) {
            String msg = "version mismatch: expected version " + Long.toUnsignedString(expected)
                    + ", but aggregate is at version " + order.version();
            finish(partition, commandId, rejected("version_mismatch", msg), now, false);
            return;
        }

        // 4. Handle and apply.
        List<? extends Aggregate.Event> events;
        try {
            events = order.handle(command);
        } catch (Order.Rejected r) {
            finish(partition, commandId, rejected(r.code, r.getMessage()), now, true);
            return;
        }
        String correlationId = header(in, H_CORRELATION_ID);
        if (correlationId == null) {
            correlationId = commandId;
        }
        byte[] aggregateIdBytes = aggregateId.getBytes(StandardCharsets.UTF_8);
        byte[] commandIdBytes = commandId.getBytes(StandardCharsets.UTF_8);
        byte[] correlationIdBytes = correlationId.getBytes(StandardCharsets.UTF_8);
        String timestamp = Ids.rfc3339Ms(now);
        List<EventView> views = new ArrayList<>(events.size());
        for (Aggregate.Event event : events) {
            order.apply(event);
            long version = order.version();
            byte[] payload = event.json();
            String eventId = Ids.uuid7(now);
            Headers h = new RecordHeaders()
                    .add(H_TYPE, event.type().getBytes(StandardCharsets.UTF_8))
                    .add(H_ID, eventId.getBytes(StandardCharsets.UTF_8))
                    .add(H_AGGREGATE_ID, aggregateIdBytes)
                    .add(H_VERSION, Long.toString(version).getBytes(StandardCharsets.UTF_8))
                    .add(H_COMMAND_ID, commandIdBytes)
                    .add(H_CORRELATION_ID, correlationIdBytes)
                    .add(H_CAUSATION_ID, commandIdBytes)
                    .add(H_CONTENT_TYPE, JSON);
            context.forward(new Record<>(keyBytes, new Out(partition, payload), now, h), names.eventsSink());
            views.add(new EventView(version, event.type(), eventId, payload));
            if (names.flowSink() != null) {
                react(aggregateId, version, eventId, event, order, correlationIdBytes, now);
            }
        }
        states.put(aggregateId, order.toStored());
        finish(partition, commandId, accepted(aggregateId, order.version(), views, commandId, timestamp), now, true);
    }

    /**
     * The flow's reaction to one new event: the commands it causes, written in this
     * command's transaction to the target's commands topic (the repartition by the target's
     * id), with a command id derived from the event so a redelivery is deduplicated.
     */
    private void react(
            String aggregateId,
            long version,
            String eventId,
            Aggregate.Event event,
            Aggregate.Instance<C> state,
            byte[] correlationId,
            long now) {
        long total = state instanceof Order o ? o.totalCents : 0;
        for (Flow.Send send : Flow.react(aggregateId, event, total)) {
            byte[] key = send.aggregateId().getBytes(StandardCharsets.UTF_8);
            int target = Utils.toPositive(Utils.murmur2(key)) % partitions;
            Headers h = new RecordHeaders()
                    .add(H_TYPE, send.type().getBytes(StandardCharsets.UTF_8))
                    .add(H_COMMAND_ID, Flow.commandId(aggregateId, version, send.step()).getBytes(StandardCharsets.UTF_8))
                    .add(H_CORRELATION_ID, correlationId)
                    .add(H_CAUSATION_ID, eventId.getBytes(StandardCharsets.UTF_8))
                    .add(H_CONTENT_TYPE, JSON);
            context.forward(new Record<>(key, new Out(target, send.body()), now, h), names.flowSink());
        }
    }

    private record EventView(long version, String type, String id, byte[] payload) {}

    /** Records the outcome for dedup (unless a conflict) and writes the result. */
    private void finish(int partition, String commandId, byte[] outcome, long now, boolean remember) {
        if (remember) {
            dedup.put(commandId, new String(outcome, StandardCharsets.UTF_8));
        }
        result(partition, commandId, outcome, now);
    }

    private void result(int partition, String commandId, byte[] outcome, long now) {
        byte[] id = commandId.getBytes(StandardCharsets.UTF_8);
        Headers h = new RecordHeaders()
                .add(H_TYPE, OUTCOME)
                .add(H_CONTENT_TYPE, JSON)
                .add(H_COMMAND_ID, id);
        context.forward(new Record<>(id, new Out(partition, outcome), now, h), names.resultsSink());
    }

    /** {@code {"rejected":{"error":...,"message":...}}} */
    static byte[] rejected(String code, String message) {
        return Json.bytes(g -> {
            g.writeStartObject();
            g.writeObjectFieldStart("rejected");
            g.writeStringField("error", code);
            g.writeStringField("message", message);
            g.writeEndObject();
            g.writeEndObject();
        });
    }

    /** {@code {"accepted":{"aggregate_id":...,"version":...,"events":[...],"position":""}}} */
    private static byte[] accepted(
            String aggregateId, long version, List<EventView> events, String commandId, String timestamp) {
        return Json.bytes(g -> {
            g.writeStartObject();
            g.writeObjectFieldStart("accepted");
            g.writeStringField("aggregate_id", aggregateId);
            g.writeNumberField("version", version);
            g.writeArrayFieldStart("events");
            for (EventView e : events) {
                g.writeStartObject();
                g.writeNumberField("version", e.version());
                g.writeStringField("type", e.type());
                g.writeStringField("id", e.id());
                g.writeStringField("command_id", commandId);
                g.writeStringField("timestamp", timestamp);
                g.writeFieldName("payload");
                g.writeRawValue(new String(e.payload(), StandardCharsets.UTF_8));
                g.writeEndObject();
            }
            g.writeEndArray();
            // eventfold fills in a read-your-writes token for its HTTP API; the peer has none.
            g.writeStringField("position", "");
            g.writeEndObject();
            g.writeEndObject();
        });
    }

    /** A decimal u64, as Rust's {@code str::parse::<u64>} accepts it. */
    private static long parseVersion(String s) throws Order.BadCommand {
        String digits = s.startsWith("+") ? s.substring(1) : s;
        if (!digits.isEmpty() && digits.chars().allMatch(c -> c >= '0' && c <= '9')) {
            try {
                return Long.parseUnsignedLong(digits);
            } catch (NumberFormatException ignored) {
                // out of range: below
            }
        }
        throw Order.BadCommand.malformed(
                "command record", "header " + H_EXPECTED_VERSION + " is not a version number: " + Json.rustDebug(s));
    }

    /** The first header named {@code name} as UTF-8 text, if present and valid. */
    private static String header(Headers headers, String name) {
        Iterator<Header> it = headers.headers(name).iterator();
        return it.hasNext() ? Json.utf8OrNull(it.next().value()) : null;
    }
}
