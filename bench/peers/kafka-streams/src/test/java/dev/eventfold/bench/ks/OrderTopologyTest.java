package dev.eventfold.bench.ks;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.regex.Pattern;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.Utils;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.TestOutputTopic;
import org.apache.kafka.streams.TopologyTestDriver;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.test.TestRecord;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.junit.jupiter.params.provider.ValueSource;

class OrderTopologyTest {
    private static final String APP = "t";
    /** 2024-05-01T12:00:00.250Z */
    private static final long NOW = 1_714_564_800_250L;
    private static final Pattern UUID7 =
            Pattern.compile("[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}");
    private static final String PLACE =
            "{\"type\":\"PlaceOrder\",\"customer_id\":\"c1\",\"items\":[{\"sku\":\"s1\",\"qty\":2,\"price_cents\":150}]}";

    @TempDir
    Path stateDir;

    private TopologyTestDriver driver;
    private TestInputTopic<byte[], byte[]> commands;
    private TestOutputTopic<byte[], byte[]> events;
    private TestOutputTopic<byte[], byte[]> results;
    private int counter;

    @BeforeEach
    void start() {
        open(1);
    }

    @AfterEach
    void stop() {
        driver.close();
    }

    private void open(int partitions) {
        if (driver != null) {
            driver.close();
        }
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, "test");
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, "dummy:1234");
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.resolve("p" + partitions).toString());
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        driver = new TopologyTestDriver(PeerTopology.build(APP, partitions, () -> NOW), p);
        commands = driver.createInputTopic(
                PeerTopology.commandsTopic(APP), new ByteArraySerializer(), new ByteArraySerializer());
        events = driver.createOutputTopic(
                PeerTopology.eventsTopic(APP), new ByteArrayDeserializer(), new ByteArrayDeserializer());
        results = driver.createOutputTopic(
                PeerTopology.resultsTopic(APP), new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    // ------------------------------------------------------------------ helpers

    private static byte[] b(String s) {
        return s == null ? null : s.getBytes(StandardCharsets.UTF_8);
    }

    private static String s(byte[] b) {
        return new String(b, StandardCharsets.UTF_8);
    }

    private static String header(Headers h, String name) {
        Header x = h.lastHeader(name);
        return x == null ? null : s(x.value());
    }

    /** Sends one command with a fresh command id; returns its outcome JSON. */
    private JsonNode send(String orderId, String value, String... headers) {
        return sendAs("cmd-" + (++counter), orderId, value, headers);
    }

    private JsonNode sendAs(String commandId, String orderId, String value, String... headers) {
        TestRecord<byte[], byte[]> r = sendRaw(commandId, orderId, value, headers);
        assertEquals(commandId, s(r.key()));
        return parse(r.value());
    }

    /** Sends and returns the single result record it caused. */
    private TestRecord<byte[], byte[]> sendRaw(String commandId, String orderId, String value, String... headers) {
        RecordHeaders h = new RecordHeaders();
        if (commandId != null) {
            h.add("ef-command-id", b(commandId));
        }
        for (int i = 0; i < headers.length; i += 2) {
            h.add(headers[i], b(headers[i + 1]));
        }
        commands.pipeInput(new TestRecord<>(b(orderId), b(value), h, NOW));
        List<TestRecord<byte[], byte[]>> out = results.readRecordsToList();
        assertEquals(1, out.size(), "one result per command");
        TestRecord<byte[], byte[]> r = out.get(0);
        assertEquals(s(r.key()), header(r.headers(), "ef-command-id"));
        assertEquals("Outcome", header(r.headers(), "ef-type"));
        return r;
    }

    private static JsonNode parse(byte[] json) {
        try {
            return Json.parse(json);
        } catch (Exception e) {
            throw new AssertionError(e);
        }
    }

    private static void assertRejected(JsonNode outcome, String code) {
        assertEquals(code, outcome.path("rejected").path("error").asText(), outcome.toString());
        assertTrue(outcome.path("rejected").path("message").asText().length() > 0, outcome.toString());
        assertEquals(1, outcome.size());
    }

    private static long assertAccepted(JsonNode outcome) {
        assertTrue(outcome.has("accepted"), outcome.toString());
        return outcome.get("accepted").get("version").asLong();
    }

    private String stored(String orderId) {
        KeyValueStore<String, String> store = driver.getKeyValueStore(PeerTopology.STATE_STORE);
        return store.get(orderId);
    }

    private static String add(String sku, long qty, String price) {
        return "{\"type\":\"AddItem\",\"sku\":\"" + sku + "\",\"qty\":" + qty + ",\"price_cents\":" + price + "}";
    }

    /** Brings a fresh order `id` to `status`. */
    private void reach(String id, String status) {
        assertAccepted(send(id, PLACE));
        switch (status) {
            case "placed" -> {}
            case "confirmed" -> assertAccepted(send(id, "{\"type\":\"ConfirmOrder\"}"));
            case "cancelled" -> assertAccepted(send(id, "{\"type\":\"CancelOrder\",\"reason\":\"r\"}"));
            case "shipped" -> {
                assertAccepted(send(id, "{\"type\":\"ConfirmOrder\"}"));
                assertAccepted(send(id, "{\"type\":\"ShipOrder\"}"));
            }
            default -> throw new IllegalArgumentException(status);
        }
        events.readRecordsToList();
    }

    // ------------------------------------------------------------------ accepted

    @Test
    void place_order_writes_the_event_state_dedup_and_an_eventfold_shaped_outcome() {
        TestRecord<byte[], byte[]> r = sendRaw("c-1", "o1", PLACE);
        String payload =
                "{\"type\":\"OrderPlaced\",\"customer_id\":\"c1\",\"items\":[{\"sku\":\"s1\",\"qty\":2,\"price_cents\":150}],\"total_cents\":300}";
        // Byte shape of eventfold's Outcome::Accepted (serde_json, compact, declaration order).
        Pattern shape = Pattern.compile(Pattern.quote("{\"accepted\":{\"aggregate_id\":\"o1\",\"version\":1,\"events\":[{\"version\":1,\"type\":\"OrderPlaced\",\"id\":\"")
                + UUID7.pattern()
                + Pattern.quote("\",\"command_id\":\"c-1\",\"timestamp\":\"2024-05-01T12:00:00.250Z\",\"payload\":" + payload
                        + "}],\"position\":\"\"}}"));
        assertTrue(shape.matcher(s(r.value())).matches(), s(r.value()));
        assertEquals("application/json", header(r.headers(), "content-type"));
        assertEquals(NOW, r.timestamp());

        List<TestRecord<byte[], byte[]>> evs = events.readRecordsToList();
        assertEquals(1, evs.size());
        TestRecord<byte[], byte[]> e = evs.get(0);
        assertEquals("o1", s(e.key()));
        assertEquals(payload, s(e.value()));
        Headers h = e.headers();
        assertEquals("OrderPlaced", header(h, "ef-type"));
        assertEquals("1", header(h, "ef-version"));
        assertEquals("c-1", header(h, "ef-command-id"));
        assertEquals("o1", header(h, "ef-aggregate-id"));
        assertEquals("c-1", header(h, "ef-correlation-id"));
        assertEquals("c-1", header(h, "ef-causation-id"));
        assertEquals("application/json", header(h, "content-type"));
        String eventId = header(h, "ef-id");
        assertTrue(UUID7.matcher(eventId).matches(), eventId);
        assertEquals(eventId, parse(r.value()).get("accepted").get("events").get(0).get("id").asText());

        assertEquals(
                "{\"version\":1,\"state\":{\"status\":\"placed\",\"customer_id\":\"c1\",\"items\":[{\"sku\":\"s1\",\"qty\":2,\"price_cents\":150}],\"total_cents\":300}}",
                stored("o1"));
        KeyValueStore<String, String> dedup = driver.getKeyValueStore(PeerTopology.DEDUP_STORE);
        assertEquals(s(r.value()), dedup.get("c-1"));
    }

    @Test
    void the_type_comes_from_ef_type_when_the_value_lacks_it_and_the_values_own_type_wins() {
        JsonNode o = send("o1", "{\"customer_id\":\"c1\",\"items\":[{\"sku\":\"s\",\"qty\":1,\"price_cents\":10}]}",
                "ef-type", "PlaceOrder");
        assertEquals(1, assertAccepted(o));
        o = send("o1", "{\"type\":\"ConfirmOrder\"}", "ef-type", "ShipOrder");
        assertEquals("OrderConfirmed", o.get("accepted").get("events").get(0).get("type").asText());
    }

    @Test
    void a_full_lifecycle_has_contiguous_versions_and_state_is_the_fold_of_the_events() {
        assertEquals(1, assertAccepted(send("o1", PLACE)));
        assertEquals(2, assertAccepted(send("o1", add("s2", 3, "7"))));
        assertEquals(3, assertAccepted(send("o1", add("s3", 1, "0"))));
        assertEquals(4, assertAccepted(send("o1", "{\"type\":\"ConfirmOrder\"}")));
        assertEquals(5, assertAccepted(send("o1", "{\"type\":\"ShipOrder\"}")));
        // another order's versions start at 1 again
        assertEquals(1, assertAccepted(send("o2", PLACE)));

        List<TestRecord<byte[], byte[]>> evs = events.readRecordsToList();
        List<String> o1 = new ArrayList<>();
        long v = 0;
        for (TestRecord<byte[], byte[]> e : evs) {
            if (s(e.key()).equals("o1")) {
                assertEquals(Long.toString(++v), header(e.headers(), "ef-version"));
                o1.add(s(e.value()));
            }
        }
        assertEquals(List.of(
                        "{\"type\":\"OrderPlaced\",\"customer_id\":\"c1\",\"items\":[{\"sku\":\"s1\",\"qty\":2,\"price_cents\":150}],\"total_cents\":300}",
                        "{\"type\":\"ItemAdded\",\"sku\":\"s2\",\"qty\":3,\"price_cents\":7}",
                        "{\"type\":\"ItemAdded\",\"sku\":\"s3\",\"qty\":1,\"price_cents\":0}",
                        "{\"type\":\"OrderConfirmed\"}",
                        "{\"type\":\"OrderShipped\"}"),
                o1);
        assertEquals(
                "{\"version\":5,\"state\":{\"status\":\"shipped\",\"customer_id\":\"c1\",\"items\":["
                        + "{\"sku\":\"s1\",\"qty\":2,\"price_cents\":150},{\"sku\":\"s2\",\"qty\":3,\"price_cents\":7},"
                        + "{\"sku\":\"s3\",\"qty\":1,\"price_cents\":0}],\"total_cents\":321}}",
                stored("o1"));
    }

    @Test
    void cancel_carries_its_reason() {
        reach("o1", "confirmed");
        JsonNode o = send("o1", "{\"type\":\"CancelOrder\",\"reason\":\"changed my mind\"}");
        assertEquals(3, assertAccepted(o));
        assertEquals("{\"type\":\"OrderCancelled\",\"reason\":\"changed my mind\"}",
                o.get("accepted").get("events").get(0).get("payload").toString());
        assertTrue(stored("o1").contains("\"status\":\"cancelled\""));
    }

    // ------------------------------------------------------------------ lifecycle table

    @ParameterizedTest(name = "{1} on a {0} order -> {2}")
    @CsvSource({
        "placed,    ConfirmOrder, accepted",
        "placed,    CancelOrder,  accepted",
        "placed,    ShipOrder,    an order cannot go from placed to shipped",
        "confirmed, ConfirmOrder, an order cannot go from confirmed to confirmed",
        "confirmed, CancelOrder,  accepted",
        "confirmed, ShipOrder,    accepted",
        "cancelled, ConfirmOrder, an order cannot go from cancelled to confirmed",
        "cancelled, CancelOrder,  an order cannot go from cancelled to cancelled",
        "cancelled, ShipOrder,    an order cannot go from cancelled to shipped",
        "shipped,   ConfirmOrder, an order cannot go from shipped to confirmed",
        "shipped,   CancelOrder,  an order cannot go from shipped to cancelled",
        "shipped,   ShipOrder,    an order cannot go from shipped to shipped",
    })
    void lifecycle(String from, String command, String expected) {
        reach("o1", from);
        String before = stored("o1");
        String body = command.equals("CancelOrder")
                ? "{\"type\":\"CancelOrder\",\"reason\":\"x\"}"
                : "{\"type\":\"" + command + "\"}";
        JsonNode o = send("o1", body);
        if (expected.equals("accepted")) {
            assertAccepted(o);
            assertEquals(1, events.readRecordsToList().size());
        } else {
            assertRejected(o, "invalid_transition");
            assertEquals(expected, o.get("rejected").get("message").asText());
            assertTrue(events.isEmpty());
            assertEquals(before, stored("o1"), "a rejection changes nothing");
        }
    }

    // ------------------------------------------------------------------ rejections

    @Test
    void place_order_rejections() {
        reach("o1", "placed");
        JsonNode o = send("o1", PLACE);
        assertRejected(o, "already_placed");
        assertEquals("the order has already been placed", o.get("rejected").get("message").asText());

        o = send("o2", "{\"type\":\"PlaceOrder\",\"customer_id\":\"c\",\"items\":[]}");
        assertRejected(o, "no_items");
        assertEquals("an order needs at least one item", o.get("rejected").get("message").asText());

        o = send("o2", "{\"type\":\"PlaceOrder\",\"customer_id\":\"c\",\"items\":[{\"sku\":\"a\",\"qty\":1,\"price_cents\":1},"
                + "{\"sku\":\"b\\\"q\",\"qty\":0,\"price_cents\":1}]}");
        assertRejected(o, "invalid_quantity");
        assertEquals("the quantity of item \"b\\\"q\" must be above zero", o.get("rejected").get("message").asText());

        o = send("o2", "{\"type\":\"PlaceOrder\",\"customer_id\":\"c\",\"items\":[{\"sku\":\"a\",\"qty\":2,\"price_cents\":9223372036854775808}]}");
        assertRejected(o, "total_overflow");
        assertEquals("the order total is too large", o.get("rejected").get("message").asText());

        o = send("o2", "{\"type\":\"PlaceOrder\",\"customer_id\":\"c\",\"items\":[{\"sku\":\"a\",\"qty\":1,\"price_cents\":18446744073709551615},"
                + "{\"sku\":\"b\",\"qty\":1,\"price_cents\":1}]}");
        assertRejected(o, "total_overflow");

        assertTrue(events.isEmpty());
        assertNull(stored("o2"), "a rejected command on a new order leaves no state behind");
    }

    @Test
    void u64_money_round_trips_unsigned_and_overflow_is_refused() {
        JsonNode o = send("o1", "{\"type\":\"PlaceOrder\",\"customer_id\":\"c\",\"items\":[{\"sku\":\"a\",\"qty\":1,\"price_cents\":18446744073709551614}]}");
        assertAccepted(o);
        assertTrue(o.toString().contains("\"total_cents\":18446744073709551614"), o.toString());
        assertTrue(stored("o1").endsWith("\"total_cents\":18446744073709551614}}"), stored("o1"));
        assertEquals(2, assertAccepted(send("o1", add("b", 1, "1"))));
        assertTrue(stored("o1").endsWith("\"total_cents\":18446744073709551615}}"), stored("o1"));
        assertRejected(send("o1", add("c", 1, "1")), "total_overflow");
        assertRejected(send("o1", add("c", 4294967295L, "4294967297")), "total_overflow");
        assertEquals(3, assertAccepted(send("o1", add("free", 4294967295L, "0"))));
    }

    @Test
    void add_item_rejections() {
        JsonNode o = send("new", add("a", 1, "1"));
        assertRejected(o, "order_not_found");
        assertEquals("the order does not exist", o.get("rejected").get("message").asText());

        reach("o1", "placed");
        assertRejected(send("o1", add("zero", 0, "5")), "invalid_quantity");

        reach("o2", "confirmed");
        o = send("o2", add("a", 1, "1"));
        assertRejected(o, "not_placed");
        assertEquals("items can only be added while the order is placed, but it is confirmed",
                o.get("rejected").get("message").asText());
        reach("o3", "shipped");
        o = send("o3", add("a", 1, "1"));
        assertEquals("items can only be added while the order is placed, but it is shipped",
                o.get("rejected").get("message").asText());
        assertTrue(events.isEmpty());
    }

    @ParameterizedTest
    @ValueSource(strings = {"{\"type\":\"ConfirmOrder\"}", "{\"type\":\"CancelOrder\",\"reason\":\"r\"}", "{\"type\":\"ShipOrder\"}"})
    void lifecycle_commands_on_a_missing_order_are_not_found(String body) {
        assertRejected(send("nobody", body), "order_not_found");
        assertNull(stored("nobody"));
        assertTrue(events.isEmpty());
    }

    // ------------------------------------------------------------------ dedup

    @Test
    void the_same_command_id_twice_gets_the_same_outcome_and_runs_once() {
        JsonNode first = sendAs("k1", "o1", PLACE);
        assertEquals(1, events.readRecordsToList().size());
        JsonNode again = sendAs("k1", "o1", PLACE);
        assertEquals(first, again, "the stored outcome, byte for byte (same event id and timestamp)");
        assertTrue(events.isEmpty(), "no events for a duplicate");
        // A different command body under the same id is still the duplicate (eventfold: id wins).
        assertEquals(first, sendAs("k1", "o1", "{\"type\":\"ShipOrder\"}"));
        assertTrue(events.isEmpty());
        assertTrue(stored("o1").startsWith("{\"version\":1,"));

        // Rejections are remembered too.
        JsonNode rej = sendAs("k2", "o1", PLACE);
        assertRejected(rej, "already_placed");
        assertEquals(2, assertAccepted(sendAs("k3", "o1", "{\"type\":\"ConfirmOrder\"}")));
        events.readRecordsToList();
        assertEquals(rej, sendAs("k2", "o1", PLACE));
        // And malformed records.
        JsonNode bad = sendAs("k4", "o1", "not json");
        assertRejected(bad, "malformed_command");
        assertEquals(bad, sendAs("k4", "o1", PLACE));
        assertTrue(events.isEmpty());
    }

    @Test
    void a_missing_command_id_is_topic_partition_offset() {
        commands.pipeInput(new TestRecord<>(b("o1"), b(PLACE), new RecordHeaders(), NOW));
        TestRecord<byte[], byte[]> r = results.readRecord();
        assertEquals(APP + ".order.commands:0:0", s(r.key()));
        assertEquals(APP + ".order.commands:0:0", parse(r.value()).get("accepted").get("events").get(0).get("command_id").asText());
        assertEquals(APP + ".order.commands:0:0", header(events.readRecord().headers(), "ef-command-id"));
    }

    // ------------------------------------------------------------------ malformed

    @ParameterizedTest
    @ValueSource(strings = {
        "not json",
        "",
        "[1,2]",
        "42",
        "null",
        "{\"n\":1}",
        "{\"type\":7}",
        "{\"type\":null}",
        "{\"type\":\"PlaceOrder\"}",
        "{\"type\":\"PlaceOrder\",\"customer_id\":\"c\"}",
        "{\"type\":\"PlaceOrder\",\"customer_id\":1,\"items\":[]}",
        "{\"type\":\"PlaceOrder\",\"customer_id\":\"c\",\"items\":{}}",
        "{\"type\":\"PlaceOrder\",\"customer_id\":\"c\",\"items\":[],\"extra\":1}",
        "{\"type\":\"PlaceOrder\",\"customer_id\":\"c\",\"items\":[{\"sku\":\"a\",\"qty\":1}]}",
        "{\"type\":\"PlaceOrder\",\"customer_id\":\"c\",\"items\":[{\"sku\":\"a\",\"qty\":1,\"price_cents\":1,\"color\":\"red\"}]}",
        "{\"type\":\"PlaceOrder\",\"customer_id\":\"c\",\"items\":[1]}",
        "{\"type\":\"AddItem\",\"sku\":\"a\",\"qty\":\"five\",\"price_cents\":1}",
        "{\"type\":\"AddItem\",\"sku\":\"a\",\"qty\":-1,\"price_cents\":1}",
        "{\"type\":\"AddItem\",\"sku\":\"a\",\"qty\":4294967296,\"price_cents\":1}",
        "{\"type\":\"AddItem\",\"sku\":\"a\",\"qty\":1.0,\"price_cents\":1}",
        "{\"type\":\"AddItem\",\"sku\":\"a\",\"qty\":1,\"price_cents\":18446744073709551616}",
        "{\"type\":\"AddItem\",\"sku\":\"a\",\"qty\":1,\"price_cents\":-5}",
        "{\"type\":\"AddItem\",\"sku\":null,\"qty\":1,\"price_cents\":1}",
        "{\"type\":\"AddItem\",\"sku\":\"a\",\"sku\":\"b\",\"qty\":1,\"price_cents\":1}",
        "{\"type\":\"CancelOrder\"}",
        "{\"type\":\"CancelOrder\",\"reason\":\"r\"} trailing",
    })
    void malformed_commands_are_rejected_and_change_nothing(String value) {
        reach("o1", "placed");
        String before = stored("o1");
        JsonNode o = send("o1", value);
        assertRejected(o, "malformed_command");
        assertTrue(o.get("rejected").get("message").asText().startsWith("malformed command: "), o.toString());
        assertTrue(events.isEmpty());
        assertEquals(before, stored("o1"));
    }

    @Test
    void a_null_value_is_malformed() {
        Headers h = new RecordHeaders().add("ef-command-id", b("nul")).add("ef-type", b("ShipOrder"));
        commands.pipeInput(new TestRecord<>(b("o1"), null, h, NOW));
        assertRejected(parse(results.readRecord().value()), "malformed_command");
    }

    @Test
    void an_unknown_type_is_unknown_command_type() {
        JsonNode o = send("o1", "{\"type\":\"Explode\"}");
        assertRejected(o, "unknown_command_type");
        assertEquals("unknown command type `Explode` for aggregate type `order`", o.get("rejected").get("message").asText());
        assertRejected(send("o1", "{}", "ef-type", "Nope"), "unknown_command_type");
        assertTrue(events.isEmpty());
    }

    @Test
    void unit_variants_ignore_extra_fields_like_serde() {
        reach("o1", "placed");
        assertEquals(2, assertAccepted(send("o1", "{\"type\":\"ConfirmOrder\",\"whatever\":[1]}")));
    }

    // ------------------------------------------------------------------ expected version

    @Test
    void ef_expected_version_is_an_optimistic_check() {
        assertEquals(1, assertAccepted(send("o1", PLACE, "ef-expected-version", "0")));
        events.readRecordsToList();
        JsonNode o = sendAs("k1", "o1", "{\"type\":\"ConfirmOrder\"}", "ef-expected-version", "5");
        assertRejected(o, "version_mismatch");
        assertEquals("version mismatch: expected version 5, but aggregate is at version 1",
                o.get("rejected").get("message").asText());
        assertTrue(events.isEmpty());
        // A conflict is not remembered (as in eventfold): the retry with the right version runs.
        assertEquals(2, assertAccepted(sendAs("k1", "o1", "{\"type\":\"ConfirmOrder\"}", "ef-expected-version", "1")));
        assertRejected(send("o1", "{\"type\":\"ShipOrder\"}", "ef-expected-version", "abc"), "malformed_command");
        assertRejected(send("o1", "{\"type\":\"ShipOrder\"}", "ef-expected-version", "-1"), "malformed_command");
    }

    // ------------------------------------------------------------------ partitioning

    @Test
    void a_record_off_its_murmur2_partition_is_refused() {
        open(8);
        // The test driver feeds every record to partition 0.
        String home = null;
        String away = null;
        for (int i = 0; home == null || away == null; i++) {
            String k = "o" + i;
            int p = Utils.toPositive(Utils.murmur2(b(k))) % 8;
            if (p == 0 && home == null) {
                home = k;
            } else if (p != 0 && away == null) {
                away = k;
            }
        }
        assertAccepted(send(home, PLACE));
        JsonNode o = send(away, PLACE);
        assertRejected(o, "malformed_command");
        assertTrue(o.get("rejected").get("message").asText().contains("murmur2"), o.toString());
        assertNotEquals(null, stored(home));
        assertNull(stored(away));
    }

    @Test
    void event_ids_are_unique() {
        reach("o1", "placed");
        JsonNode a = send("o1", add("a", 1, "1"));
        JsonNode b2 = send("o1", add("b", 1, "1"));
        assertNotEquals(
                a.get("accepted").get("events").get(0).get("id"), b2.get("accepted").get("events").get(0).get("id"));
    }
}
