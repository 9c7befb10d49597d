package dev.eventfold.bench.ks;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.List;
import java.util.Properties;
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

/**
 * The two-step flow with --flows: order and payment processors and the repartitions
 * between them, each outcome, and the dedup of a command the flow sends again.
 * TopologyTestDriver feeds a sink's records back in when the sink topic is a source topic
 * of the topology, so one ConfirmOrder runs the whole flow.
 */
class FlowTopologyTest {
    private static final String APP = "t";
    private static final long NOW = 1_714_564_800_250L;
    private static final int PARTITIONS = 4;
    /** Orders of 3.00 are authorized, of 30.00 declined. */
    private static final long LIMIT = 1000;

    @TempDir
    Path stateDir;

    private TopologyTestDriver driver;
    private TestInputTopic<byte[], byte[]> orderCommands;
    private TestInputTopic<byte[], byte[]> paymentCommandsIn;
    private TestOutputTopic<byte[], byte[]> orderEvents;
    private TestOutputTopic<byte[], byte[]> paymentCommands;
    private TestOutputTopic<byte[], byte[]> paymentEvents;
    private TestOutputTopic<byte[], byte[]> paymentResults;
    private TestOutputTopic<byte[], byte[]> orderCommandsOut;

    @BeforeEach
    void start() {
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, "test");
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, "dummy:1234");
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        driver = new TopologyTestDriver(
                PeerTopology.build(APP, PARTITIONS, () -> NOW, new PeerTopology.Flows(LIMIT)), p);
        var ser = new ByteArraySerializer();
        var de = new ByteArrayDeserializer();
        orderCommands = driver.createInputTopic(PeerTopology.commandsTopic(APP, "order"), ser, ser);
        paymentCommandsIn = driver.createInputTopic(PeerTopology.commandsTopic(APP, "payment"), ser, ser);
        orderEvents = driver.createOutputTopic(PeerTopology.eventsTopic(APP, "order"), de, de);
        orderCommandsOut = driver.createOutputTopic(PeerTopology.commandsTopic(APP, "order"), de, de);
        paymentCommands = driver.createOutputTopic(PeerTopology.commandsTopic(APP, "payment"), de, de);
        paymentEvents = driver.createOutputTopic(PeerTopology.eventsTopic(APP, "payment"), de, de);
        paymentResults = driver.createOutputTopic(PeerTopology.resultsTopic(APP, "payment"), de, de);
    }

    @AfterEach
    void stop() {
        driver.close();
    }

    private static byte[] b(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    private static String s(byte[] b) {
        return new String(b, StandardCharsets.UTF_8);
    }

    private static String header(Headers h, String name) {
        Header x = h.lastHeader(name);
        return x == null ? null : s(x.value());
    }

    private static int home(String key) {
        return Utils.toPositive(Utils.murmur2(b(key))) % PARTITIONS;
    }

    private void command(String commandId, String orderId, String value) {
        RecordHeaders h = new RecordHeaders();
        h.add("ef-command-id", b(commandId));
        // The driver runs every record on partition 0: the tests use ids murmur2 puts there.
        orderCommands.pipeInput(new TestRecord<>(b(orderId), b(value), h, NOW));
    }

    /** An order of `priceCents` (qty 1), placed then confirmed. */
    private void placeAndConfirm(String orderId, long priceCents) {
        command("p-" + orderId, orderId, "{\"type\":\"PlaceOrder\",\"customer_id\":\"c1\",\"items\":[{\"sku\":\"s\","
                + "\"qty\":1,\"price_cents\":" + priceCents + "}]}");
        command("c-" + orderId, orderId, "{\"type\":\"ConfirmOrder\"}");
    }

    private List<String> orderEventTypes(String orderId) {
        return orderEvents.readRecordsToList().stream()
                .filter(r -> s(r.key()).equals(orderId))
                .map(r -> header(r.headers(), "ef-type"))
                .toList();
    }

    @Test
    void an_authorized_payment_ships_the_order() {
        // TopologyTestDriver runs every record on partition 0; pick an order whose own and
        // whose payment's partition is 0, so the partition check passes end to end.
        String o = firstIdOnPartitionZero();
        placeAndConfirm(o, 300);

        List<TestRecord<byte[], byte[]>> sent = paymentCommands.readRecordsToList();
        assertEquals(1, sent.size());
        TestRecord<byte[], byte[]> authorize = sent.get(0);
        assertEquals("pay-" + o, s(authorize.key()));
        assertEquals("{\"type\":\"AuthorizePayment\",\"order_id\":\"" + o + "\",\"amount_cents\":300}",
                s(authorize.value()));
        assertEquals("AuthorizePayment", header(authorize.headers(), "ef-type"));
        assertEquals("order_flow:" + o + "/2:0", header(authorize.headers(), "ef-command-id"));
        assertEquals("c-" + o, header(authorize.headers(), "ef-correlation-id"));

        List<TestRecord<byte[], byte[]>> pay = paymentEvents.readRecordsToList();
        assertEquals(1, pay.size());
        assertEquals("{\"type\":\"PaymentAuthorized\",\"order_id\":\"" + o + "\",\"amount_cents\":300}",
                s(pay.get(0).value()));
        assertEquals("pay-" + o, header(pay.get(0).headers(), "ef-aggregate-id"));

        List<TestRecord<byte[], byte[]>> back = orderCommandsOut.readRecordsToList();
        assertEquals(1, back.size());
        assertEquals(o, s(back.get(0).key()));
        assertEquals("ShipOrder", header(back.get(0).headers(), "ef-type"));
        assertEquals("order_flow:pay-" + o + "/1:0", header(back.get(0).headers(), "ef-command-id"));
        assertEquals(header(pay.get(0).headers(), "ef-id"), header(back.get(0).headers(), "ef-causation-id"));

        assertEquals(List.of("OrderPlaced", "OrderConfirmed", "OrderShipped"), orderEventTypes(o));
        KeyValueStore<String, String> states = driver.getKeyValueStore(PeerTopology.STATE_STORE);
        assertTrue(states.get(o).contains("\"status\":\"shipped\""), states.get(o));
        KeyValueStore<String, String> payments = driver.getKeyValueStore(PeerTopology.PAYMENT_STATE_STORE);
        assertEquals("{\"version\":1,\"state\":{\"status\":\"authorized\",\"order_id\":\"" + o
                + "\",\"amount_cents\":300,\"decline_reason\":null}}", payments.get("pay-" + o));
    }

    @Test
    void a_declined_payment_cancels_the_order() {
        String o = firstIdOnPartitionZero();
        placeAndConfirm(o, 3000);
        List<TestRecord<byte[], byte[]>> pay = paymentEvents.readRecordsToList();
        assertEquals(1, pay.size());
        assertEquals("{\"type\":\"PaymentDeclined\",\"order_id\":\"" + o + "\",\"amount_cents\":3000,"
                + "\"reason\":\"amount of 3000 cents is above the limit of 1000 cents\"}", s(pay.get(0).value()));
        List<TestRecord<byte[], byte[]>> back = orderCommandsOut.readRecordsToList();
        assertEquals(1, back.size());
        assertEquals("{\"type\":\"CancelOrder\",\"reason\":\"payment_declined\"}", s(back.get(0).value()));
        assertEquals(List.of("OrderPlaced", "OrderConfirmed", "OrderCancelled"), orderEventTypes(o));
    }

    @Test
    void a_command_the_flow_sends_again_runs_once() {
        String o = firstIdOnPartitionZero();
        placeAndConfirm(o, 300);
        TestRecord<byte[], byte[]> authorize = paymentCommands.readRecordsToList().get(0);
        String firstOutcome = s(paymentResults.readRecordsToList().get(0).value());
        assertEquals(List.of("OrderPlaced", "OrderConfirmed", "OrderShipped"), orderEventTypes(o));
        paymentEvents.readRecordsToList();
        orderCommandsOut.readRecordsToList();

        // The same AuthorizePayment again (a redelivery): its stored outcome, nothing re-runs,
        // so no second ShipOrder either.
        paymentCommandsIn.pipeInput(new TestRecord<>(authorize.key(), authorize.value(), authorize.headers(), NOW));
        assertEquals(firstOutcome, s(paymentResults.readRecordsToList().get(0).value()));
        assertTrue(paymentEvents.isEmpty());
        assertTrue(orderCommandsOut.isEmpty());
        assertTrue(orderEvents.isEmpty());

        // The ConfirmOrder again under its id: deduplicated, so the flow does not start again.
        command("c-" + o, o, "{\"type\":\"ConfirmOrder\"}");
        assertTrue(paymentCommands.isEmpty());
        assertTrue(orderEvents.isEmpty());
    }

    @Test
    void without_flows_a_confirmation_sends_nothing() {
        driver.close();
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, "test");
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, "dummy:1234");
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.resolve("plain").toString());
        driver = new TopologyTestDriver(PeerTopology.build(APP, PARTITIONS, () -> NOW), p);
        orderCommands = driver.createInputTopic(
                PeerTopology.commandsTopic(APP), new ByteArraySerializer(), new ByteArraySerializer());
        orderEvents = driver.createOutputTopic(
                PeerTopology.eventsTopic(APP), new ByteArrayDeserializer(), new ByteArrayDeserializer());
        paymentCommands = driver.createOutputTopic(PeerTopology.commandsTopic(APP, "payment"),
                new ByteArrayDeserializer(), new ByteArrayDeserializer());
        String o = firstIdOnPartitionZero();
        placeAndConfirm(o, 300);
        assertEquals(List.of("OrderPlaced", "OrderConfirmed"), orderEventTypes(o));
        assertTrue(paymentCommands.isEmpty());
        assertNull(driver.getKeyValueStore(PeerTopology.PAYMENT_STATE_STORE));
    }

    /** An order id that murmur2 puts on partition 0, and its payment id too. */
    private static String firstIdOnPartitionZero() {
        for (int i = 0; ; i++) {
            String o = "o" + i;
            if (home(o) == 0 && home("pay-" + o) == 0) {
                return o;
            }
        }
    }
}
