package dev.eventfold.bench.ks;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.apache.kafka.streams.StreamsConfig;
import org.junit.jupiter.api.Test;

/** The command line as the benchmark suite passes it, down to the Kafka Streams config. */
class MainTest {
    @Test
    void cacheMaxBytesReachesTheStreamsConfig() throws Exception {
        Main.Options o = Main.parse(new String[] {"--bootstrap", "h:1", "--cache-max-bytes", "0"});
        assertEquals("0", Main.streamsConfig(o).get(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG));
    }

    @Test
    void cacheMaxBytesDefaultsToKafkaStreamsOwn() throws Exception {
        Main.Options o = Main.parse(new String[] {"--bootstrap", "h:1"});
        assertEquals(Long.toString(10L * 1024 * 1024),
                Main.streamsConfig(o).get(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG));
    }

    @Test
    void aNegativeCacheIsRefused() {
        Main.UsageError e = assertThrows(Main.UsageError.class,
                () -> Main.parse(new String[] {"--bootstrap", "h:1", "--cache-max-bytes", "-1"}));
        assertTrue(e.getMessage().contains("--cache-max-bytes"), e.getMessage());
    }
}
