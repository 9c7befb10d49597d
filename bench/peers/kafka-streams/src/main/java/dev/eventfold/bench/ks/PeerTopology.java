package dev.eventfold.bench.ks;

import java.util.function.LongSupplier;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.state.Stores;

/** The Processor API topology: commands -> order processor (+ 2 stores) -> events, results. */
final class PeerTopology {
    static final String STATE_STORE = "order-state";
    static final String DEDUP_STORE = "order-dedup";

    private PeerTopology() {}

    static String commandsTopic(String app) {
        return app + ".order.commands";
    }

    static String eventsTopic(String app) {
        return app + ".order.events";
    }

    static String resultsTopic(String app) {
        return app + ".order.results";
    }

    /**
     * @param partitions partition count of the commands topic (a record must sit on the
     *     partition murmur2 gives its key, as in eventfold)
     * @param clock wall clock in ms (event timestamps, record timestamps)
     */
    static Topology build(String app, int partitions, LongSupplier clock) {
        Topology t = new Topology();
        t.addSource("commands", new ByteArrayDeserializer(), new ByteArrayDeserializer(), commandsTopic(app));
        t.addProcessor("order", () -> new OrderProcessor(partitions, clock), "commands");
        // Both stores are RocksDB with a changelog topic (logging is on by default).
        // The state store caches (repeated updates of one order within a commit interval
        // reach the changelog once); dedup keys are written once, so no cache there.
        t.addStateStore(
                Stores.keyValueStoreBuilder(
                                Stores.persistentKeyValueStore(STATE_STORE), Serdes.String(), Serdes.String())
                        .withCachingEnabled(),
                "order");
        t.addStateStore(
                Stores.keyValueStoreBuilder(
                                Stores.persistentKeyValueStore(DEDUP_STORE), Serdes.String(), Serdes.String())
                        .withCachingDisabled(),
                "order");
        t.addSink(
                OrderProcessor.EVENTS_SINK,
                eventsTopic(app),
                new ByteArraySerializer(),
                new Out.ValueSerializer(),
                new Out.Partitioner(),
                "order");
        t.addSink(
                OrderProcessor.RESULTS_SINK,
                resultsTopic(app),
                new ByteArraySerializer(),
                new Out.ValueSerializer(),
                new Out.Partitioner(),
                "order");
        return t;
    }
}
