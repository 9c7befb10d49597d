package dev.eventfold.bench.ks;

import java.util.function.LongSupplier;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.state.Stores;

/**
 * The Processor API topology: commands -> order processor (+ 2 stores) -> events, results.
 * With the flows, a second sub-topology for the payment aggregate, and the two repartitions
 * between them: the order processor writes {@code AuthorizePayment} to the payment commands
 * topic (keyed {@code pay-<o>}), the payment processor writes {@code ShipOrder} or
 * {@code CancelOrder} back to the order commands topic (keyed {@code o}).
 */
final class PeerTopology {
    static final String STATE_STORE = "order-state";
    static final String DEDUP_STORE = "order-dedup";
    static final String PAYMENT_STATE_STORE = "payment-state";
    static final String PAYMENT_DEDUP_STORE = "payment-dedup";

    /** The flows' settings: the payment aggregate's decline limit (unsigned cents). */
    record Flows(long declineAboveCents) {}

    private PeerTopology() {}

    static String commandsTopic(String app) {
        return commandsTopic(app, Order.TYPE);
    }

    static String eventsTopic(String app) {
        return eventsTopic(app, Order.TYPE);
    }

    static String resultsTopic(String app) {
        return resultsTopic(app, Order.TYPE);
    }

    static String commandsTopic(String app, String type) {
        return app + "." + type + ".commands";
    }

    static String eventsTopic(String app, String type) {
        return app + "." + type + ".events";
    }

    static String resultsTopic(String app, String type) {
        return app + "." + type + ".results";
    }

    /** The order aggregate alone (the single-aggregate benchmark). */
    static Topology build(String app, int partitions, LongSupplier clock) {
        return build(app, partitions, clock, null);
    }

    /**
     * @param partitions partition count of every topic (a command must sit on the partition
     *     murmur2 gives its key, as in eventfold)
     * @param clock wall clock in ms (event timestamps, record timestamps)
     * @param flows null: the order aggregate only; else the payment aggregate and the flow too
     */
    static Topology build(String app, int partitions, LongSupplier clock, Flows flows) {
        Topology t = new Topology();
        aggregate(t, app, Order.KIND, STATE_STORE, DEDUP_STORE, partitions, clock,
                flows == null ? null : commandsTopic(app, Payment.TYPE));
        if (flows != null) {
            aggregate(t, app, Payment.kind(flows.declineAboveCents()), PAYMENT_STATE_STORE, PAYMENT_DEDUP_STORE,
                    partitions, clock, commandsTopic(app, Order.TYPE));
        }
        return t;
    }

    /** One aggregate type's source, processor, stores and sinks; {@code flowTopic} where its reactions go. */
    private static <C> void aggregate(
            Topology t,
            String app,
            Aggregate<C> kind,
            String stateStore,
            String dedupStore,
            int partitions,
            LongSupplier clock,
            String flowTopic) {
        String type = kind.name();
        String source = type + "-commands";
        var names = new CommandProcessor.Names(
                stateStore, dedupStore, type + "-events", type + "-results", flowTopic == null ? null : type + "-flow");
        t.addSource(source, new ByteArrayDeserializer(), new ByteArrayDeserializer(), commandsTopic(app, type));
        t.addProcessor(type, () -> new CommandProcessor<>(kind, names, partitions, clock), source);
        // Both stores are RocksDB with a changelog topic (logging is on by default).
        // The state store caches (repeated updates of one aggregate within a commit
        // interval reach the changelog once); dedup keys are written once, so no cache there.
        t.addStateStore(
                Stores.keyValueStoreBuilder(
                                Stores.persistentKeyValueStore(stateStore), Serdes.String(), Serdes.String())
                        .withCachingEnabled(),
                type);
        t.addStateStore(
                Stores.keyValueStoreBuilder(
                                Stores.persistentKeyValueStore(dedupStore), Serdes.String(), Serdes.String())
                        .withCachingDisabled(),
                type);
        // Events and results go to the command's partition; a flow's command to the
        // partition murmur2 gives its target id (Out carries the partition either way).
        t.addSink(names.eventsSink(), eventsTopic(app, type), new ByteArraySerializer(), new Out.ValueSerializer(),
                new Out.Partitioner(), type);
        t.addSink(names.resultsSink(), resultsTopic(app, type), new ByteArraySerializer(), new Out.ValueSerializer(),
                new Out.Partitioner(), type);
        if (flowTopic != null) {
            t.addSink(names.flowSink(), flowTopic, new ByteArraySerializer(), new Out.ValueSerializer(),
                    new Out.Partitioner(), type);
        }
    }
}
