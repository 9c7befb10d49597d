package dev.eventfold.bench.ks;

import java.util.Optional;
import java.util.Set;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.streams.processor.StreamPartitioner;

/**
 * An output value with the partition it must go to. eventfold writes a command's events and
 * its result to the partition the command came from; Kafka Streams' sinks would otherwise
 * hash the key (the command id, for results) to another one.
 */
record Out(int partition, byte[] value) {
    /** Serializes only the value. */
    static final class ValueSerializer implements Serializer<Out> {
        @Override
        public byte[] serialize(String topic, Out data) {
            return data == null ? null : data.value();
        }
    }

    /** Sends each record to its {@link Out#partition()}. */
    static final class Partitioner implements StreamPartitioner<byte[], Out> {
        @Override
        public Optional<Set<Integer>> partitions(String topic, byte[] key, Out value, int numPartitions) {
            return Optional.of(Set.of(value.partition()));
        }

        @Override
        public Optional<Set<Integer>> partitions(
                String topic, byte[] key, Out value, Headers headers, int numPartitions) {
            return partitions(topic, key, value, numPartitions);
        }
    }
}
