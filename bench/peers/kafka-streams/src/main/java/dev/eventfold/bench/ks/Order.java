package dev.eventfold.bench.ks;

import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Set;

/**
 * The {@code order} aggregate, a line-by-line mirror of eventfold's
 * {@code examples/shop/src/domain/order.rs}: the same commands, events, JSON field names,
 * lifecycle rules, rejection codes and messages.
 *
 * <p>Quantities are {@code u32} and money {@code u64} there: here both live in a Java
 * {@code long}, money read and written as unsigned, and every overflow the Rust code
 * refuses is refused here too.
 */
final class Order implements Aggregate.Instance<Order.Command> {
    /** The aggregate type name (eventfold's {@code Aggregate::TYPE}). */
    static final String TYPE = "order";

    /** The order aggregate type, for {@link CommandProcessor}. */
    static final Aggregate<Command> KIND = new Aggregate<>() {
        @Override
        public String name() {
            return TYPE;
        }

        @Override
        public Command decode(byte[] value, String efType) throws BadCommand {
            return Order.decode(value, efType);
        }

        @Override
        public Order load(String stored) {
            return stored == null ? new Order() : fromStored(stored);
        }
    };

    private static final long U32_MAX = 0xFFFF_FFFFL;

    // ------------------------------------------------------------------ commands

    /** A command addressed to an order ({@code OrderCommand}, internally tagged by "type"). */
    sealed interface Command permits PlaceOrder, AddItem, ConfirmOrder, CancelOrder, ShipOrder {}

    record PlaceOrder(String customerId, List<LineItem> items) implements Command {}

    record AddItem(String sku, long qty, long priceCents) implements Command {}

    record ConfirmOrder() implements Command {}

    record CancelOrder(String reason) implements Command {}

    record ShipOrder() implements Command {}

    /** One line of an order; {@code qty} is a u32, {@code priceCents} an unsigned u64. */
    record LineItem(String sku, long qty, long priceCents) {
        void write(JsonGenerator g) throws IOException {
            g.writeStartObject();
            g.writeStringField("sku", sku);
            g.writeNumberField("qty", qty);
            g.writeFieldName("price_cents");
            Json.writeU64(g, priceCents);
            g.writeEndObject();
        }
    }

    // ------------------------------------------------------------------ events

    /** A fact about an order ({@code OrderEvent}, internally tagged by "type"). */
    sealed interface Event extends Aggregate.Event
            permits OrderPlaced, ItemAdded, OrderConfirmed, OrderCancelled, OrderShipped {
        String type();

        /** The fields after "type". */
        default void writeFields(JsonGenerator g) throws IOException {}

        /** The event document as serde writes it: {@code {"type":"...",...}}. */
        default byte[] json() {
            return Json.bytes(g -> {
                g.writeStartObject();
                g.writeStringField("type", type());
                writeFields(g);
                g.writeEndObject();
            });
        }
    }

    record OrderPlaced(String customerId, List<LineItem> items, long totalCents) implements Event {
        public String type() {
            return "OrderPlaced";
        }

        public void writeFields(JsonGenerator g) throws IOException {
            g.writeStringField("customer_id", customerId);
            writeItems(g, items);
            g.writeFieldName("total_cents");
            Json.writeU64(g, totalCents);
        }
    }

    record ItemAdded(String sku, long qty, long priceCents) implements Event {
        public String type() {
            return "ItemAdded";
        }

        public void writeFields(JsonGenerator g) throws IOException {
            g.writeStringField("sku", sku);
            g.writeNumberField("qty", qty);
            g.writeFieldName("price_cents");
            Json.writeU64(g, priceCents);
        }
    }

    record OrderConfirmed() implements Event {
        public String type() {
            return "OrderConfirmed";
        }
    }

    record OrderCancelled(String reason) implements Event {
        public String type() {
            return "OrderCancelled";
        }

        public void writeFields(JsonGenerator g) throws IOException {
            g.writeStringField("reason", reason);
        }
    }

    record OrderShipped() implements Event {
        public String type() {
            return "OrderShipped";
        }
    }

    // ------------------------------------------------------------------ status

    /** Where an order is in its lifecycle ({@code OrderStatus}, snake_case in JSON). */
    enum Status {
        PLACED("placed"),
        CONFIRMED("confirmed"),
        CANCELLED("cancelled"),
        SHIPPED("shipped");

        final String json;

        Status(String json) {
            this.json = json;
        }

        static Status parse(String s) {
            for (Status st : values()) {
                if (st.json.equals(s)) {
                    return st;
                }
            }
            throw new IllegalArgumentException("unknown order status " + s);
        }

        /** The one place the lifecycle is written down (Rust: {@code can_become}). */
        boolean canBecome(Status to) {
            return (this == PLACED && (to == CONFIRMED || to == CANCELLED))
                    || (this == CONFIRMED && (to == CANCELLED || to == SHIPPED));
        }

        @Override
        public String toString() {
            return json;
        }
    }

    // ------------------------------------------------------------------ outcomes

    /** The aggregate refused the command: a stable code and a sentence ({@code Reject}). */
    static final class Rejected extends Exception {
        final String code;

        Rejected(String code, String message) {
            super(message, null, false, false);
            this.code = code;
        }
    }

    /** The record is not a valid command: {@code malformed_command} or {@code unknown_command_type}. */
    static final class BadCommand extends Exception {
        final String code;

        BadCommand(String code, String message) {
            super(message, null, false, false);
            this.code = code;
        }

        static BadCommand malformed(String what, String reason) {
            return new BadCommand("malformed_command", "malformed " + what + ": " + reason);
        }

        static BadCommand malformed(String reason) {
            return malformed("command", reason);
        }
    }

    // ------------------------------------------------------------------ state

    /** null until placed. */
    Status status;
    String customerId = "";
    final List<LineItem> items = new ArrayList<>();
    /** Unsigned. */
    long totalCents;
    /** Number of events applied (eventfold keeps it beside the state). */
    long version;

    @Override
    public long version() {
        return version;
    }

    @Override
    public void apply(Aggregate.Event event) {
        apply((Event) event);
    }

    /** Decides: the events for {@code command}, or why not (Rust: {@code handle}). */
    @Override
    public List<Event> handle(Command command) throws Rejected {
        if (command instanceof PlaceOrder c) {
            return List.of(place(c.customerId(), c.items()));
        } else if (command instanceof AddItem c) {
            return List.of(addItem(c.sku(), c.qty(), c.priceCents()));
        } else if (command instanceof ConfirmOrder) {
            transition(Status.CONFIRMED);
            return List.of(new OrderConfirmed());
        } else if (command instanceof CancelOrder c) {
            transition(Status.CANCELLED);
            return List.of(new OrderCancelled(c.reason()));
        } else if (command instanceof ShipOrder) {
            transition(Status.SHIPPED);
            return List.of(new OrderShipped());
        }
        throw new IllegalStateException("unhandled command " + command);
    }

    private Event place(String customerId, List<LineItem> items) throws Rejected {
        if (status != null) {
            throw new Rejected("already_placed", "the order has already been placed");
        }
        if (items.isEmpty()) {
            throw new Rejected("no_items", "an order needs at least one item");
        }
        long total = 0;
        for (LineItem item : items) {
            total = addLine(total, item.sku(), item.qty(), item.priceCents());
        }
        return new OrderPlaced(customerId, items, total);
    }

    private Event addItem(String sku, long qty, long priceCents) throws Rejected {
        if (status == null) {
            throw notFound();
        }
        if (status != Status.PLACED) {
            throw new Rejected(
                    "not_placed", "items can only be added while the order is placed, but it is " + status);
        }
        // Only checked here; apply then trusts the event.
        addLine(totalCents, sku, qty, priceCents);
        return new ItemAdded(sku, qty, priceCents);
    }

    private void transition(Status to) throws Rejected {
        if (status == null) {
            throw notFound();
        }
        if (!status.canBecome(to)) {
            throw new Rejected("invalid_transition", "an order cannot go from " + status + " to " + to);
        }
    }

    private static Rejected notFound() {
        return new Rejected("order_not_found", "the order does not exist");
    }

    /** Adds one line to a running total, refusing quantity zero and any u64 overflow. */
    static long addLine(long total, String sku, long qty, long priceCents) throws Rejected {
        if (qty == 0) {
            throw new Rejected(
                    "invalid_quantity", "the quantity of item " + Json.rustDebug(sku) + " must be above zero");
        }
        // qty is in 1..=u32::MAX: qty * price overflows u64 iff price > u64::MAX / qty.
        if (Long.compareUnsigned(priceCents, Long.divideUnsigned(-1L, qty)) > 0) {
            throw totalOverflow();
        }
        long line = qty * priceCents;
        long sum = total + line;
        if (Long.compareUnsigned(sum, total) < 0) {
            throw totalOverflow();
        }
        return sum;
    }

    private static Rejected totalOverflow() {
        return new Rejected("total_overflow", "the order total is too large");
    }

    /** Folds one event in (Rust: {@code apply}); also counts the version. */
    void apply(Event event) {
        if (event instanceof OrderPlaced e) {
            status = Status.PLACED;
            customerId = e.customerId();
            items.clear();
            items.addAll(e.items());
            totalCents = e.totalCents();
        } else if (event instanceof ItemAdded e) {
            totalCents = saturatingAdd(totalCents, saturatingMul(e.qty(), e.priceCents()));
            items.add(new LineItem(e.sku(), e.qty(), e.priceCents()));
        } else if (event instanceof OrderConfirmed) {
            status = Status.CONFIRMED;
        } else if (event instanceof OrderCancelled) {
            status = Status.CANCELLED;
        } else if (event instanceof OrderShipped) {
            status = Status.SHIPPED;
        }
        version++;
    }

    private static long saturatingMul(long qty, long price) {
        return qty != 0 && Long.compareUnsigned(price, Long.divideUnsigned(-1L, qty)) > 0 ? -1L : qty * price;
    }

    private static long saturatingAdd(long a, long b) {
        long s = a + b;
        return Long.compareUnsigned(s, a) < 0 ? -1L : s;
    }

    // ------------------------------------------------------------------ stored form

    /** The state as serde writes {@code Order}: {@code {status, customer_id, items, total_cents}}. */
    void writeState(JsonGenerator g) throws IOException {
        g.writeStartObject();
        if (status == null) {
            g.writeNullField("status");
        } else {
            g.writeStringField("status", status.json);
        }
        g.writeStringField("customer_id", customerId);
        writeItems(g, items);
        g.writeFieldName("total_cents");
        Json.writeU64(g, totalCents);
        g.writeEndObject();
    }

    /** The state-store value, shaped like eventfold's state record: {@code {"version":v,"state":{...}}}. */
    @Override
    public String toStored() {
        return Json.string(g -> {
            g.writeStartObject();
            g.writeNumberField("version", version);
            g.writeFieldName("state");
            writeState(g);
            g.writeEndObject();
        });
    }

    /** Reads a state-store value written by {@link #toStored()}. */
    static Order fromStored(String stored) {
        try {
            JsonNode doc = Json.parse(stored);
            JsonNode st = doc.get("state");
            Order o = new Order();
            o.version = doc.get("version").longValue();
            JsonNode status = st.get("status");
            o.status = status == null || status.isNull() ? null : Status.parse(status.textValue());
            o.customerId = st.get("customer_id").textValue();
            for (JsonNode item : st.get("items")) {
                o.items.add(new LineItem(
                        item.get("sku").textValue(),
                        item.get("qty").longValue(),
                        item.get("price_cents").bigIntegerValue().longValue()));
            }
            o.totalCents = st.get("total_cents").bigIntegerValue().longValue();
            return o;
        } catch (IOException | RuntimeException e) {
            throw new IllegalStateException("corrupt record in store order-state: " + e.getMessage(), e);
        }
    }

    private static void writeItems(JsonGenerator g, List<LineItem> items) throws IOException {
        g.writeArrayFieldStart("items");
        for (LineItem item : items) {
            item.write(g);
        }
        g.writeEndArray();
    }

    // ------------------------------------------------------------------ decoding

    private static final Set<String> PLACE_FIELDS = Set.of("customer_id", "items");
    private static final Set<String> ADD_FIELDS = Set.of("sku", "qty", "price_cents");
    private static final Set<String> CANCEL_FIELDS = Set.of("reason");
    private static final Set<String> ITEM_FIELDS = Set.of("sku", "qty", "price_cents");

    /**
     * Decodes a commands-topic value the way eventfold does: a JSON object, its "type" from
     * the value or else from the {@code ef-type} header, then the variant's fields with
     * serde's rules ({@code deny_unknown_fields} on struct variants and line items, every
     * field required, integers only and in range).
     */
    static Command decode(byte[] value, String efType) throws BadCommand {
        ObjectNode obj = object(value);
        String type = tag(obj, efType);
        switch (type) {
            case "PlaceOrder": {
                onlyFields(obj, PLACE_FIELDS, true);
                String customerId = string(obj, "customer_id");
                JsonNode items = required(obj, "items");
                if (!items.isArray()) {
                    throw BadCommand.malformed("invalid type: " + kind(items) + ", expected a sequence");
                }
                List<LineItem> lines = new ArrayList<>(items.size());
                for (JsonNode item : items) {
                    if (!(item instanceof ObjectNode line)) {
                        throw BadCommand.malformed("invalid type: " + kind(item) + ", expected struct LineItem");
                    }
                    onlyFields(line, ITEM_FIELDS, false);
                    lines.add(new LineItem(string(line, "sku"), u32(line, "qty"), u64(line, "price_cents")));
                }
                return new PlaceOrder(customerId, List.copyOf(lines));
            }
            case "AddItem":
                onlyFields(obj, ADD_FIELDS, true);
                return new AddItem(string(obj, "sku"), u32(obj, "qty"), u64(obj, "price_cents"));
            case "ConfirmOrder":
                // Unit variants ignore extra fields, as serde does.
                return new ConfirmOrder();
            case "CancelOrder":
                onlyFields(obj, CANCEL_FIELDS, true);
                return new CancelOrder(string(obj, "reason"));
            case "ShipOrder":
                return new ShipOrder();
            default:
                throw new BadCommand(
                        "unknown_command_type",
                        "unknown command type `" + type + "` for aggregate type `" + TYPE + "`");
        }
    }

    /** The value as a JSON object, or why it is not one. */
    static ObjectNode object(byte[] value) throws BadCommand {
        JsonNode doc;
        try {
            doc = Json.parse(value == null ? new byte[0] : value);
        } catch (JsonProcessingException e) {
            throw BadCommand.malformed(e.getOriginalMessage());
        } catch (IOException e) {
            throw BadCommand.malformed(String.valueOf(e.getMessage()));
        }
        if (doc == null || doc.isMissingNode()) {
            throw BadCommand.malformed("EOF while parsing a value");
        }
        if (!(doc instanceof ObjectNode obj)) {
            throw BadCommand.malformed("expected a JSON object");
        }
        return obj;
    }

    /** The command type: the object's "type", else the {@code ef-type} header. */
    static String tag(ObjectNode obj, String efType) throws BadCommand {
        JsonNode tag = obj.get("type");
        if (tag == null) {
            if (efType == null) {
                throw BadCommand.malformed("no \"type\" field and no ef-type header");
            }
            return efType;
        } else if (!tag.isTextual()) {
            throw BadCommand.malformed("expected a JSON object with a string field \"type\"");
        }
        return tag.textValue();
    }

    static void onlyFields(ObjectNode obj, Set<String> allowed, boolean tagged) throws BadCommand {
        for (Iterator<String> it = obj.fieldNames(); it.hasNext(); ) {
            String f = it.next();
            if (!(allowed.contains(f) || (tagged && f.equals("type")))) {
                throw BadCommand.malformed("unknown field `" + f + "`, expected one of " + allowed);
            }
        }
    }

    static JsonNode required(ObjectNode obj, String field) throws BadCommand {
        JsonNode n = obj.get(field);
        if (n == null) {
            throw BadCommand.malformed("missing field `" + field + "`");
        }
        return n;
    }

    static String string(ObjectNode obj, String field) throws BadCommand {
        JsonNode n = required(obj, field);
        if (!n.isTextual()) {
            throw BadCommand.malformed("invalid type: " + kind(n) + ", expected a string");
        }
        return n.textValue();
    }

    private static long u32(ObjectNode obj, String field) throws BadCommand {
        JsonNode n = required(obj, field);
        if (!n.isIntegralNumber()) {
            throw BadCommand.malformed("invalid type: " + kind(n) + ", expected u32");
        }
        if (!n.canConvertToLong() || n.longValue() < 0 || n.longValue() > U32_MAX) {
            throw BadCommand.malformed("invalid value: integer `" + n.asText() + "`, expected u32");
        }
        return n.longValue();
    }

    static long u64(ObjectNode obj, String field) throws BadCommand {
        JsonNode n = required(obj, field);
        if (!n.isIntegralNumber()) {
            throw BadCommand.malformed("invalid type: " + kind(n) + ", expected u64");
        }
        if (n.canConvertToLong()) {
            if (n.longValue() < 0) {
                throw BadCommand.malformed("invalid value: integer `" + n.asText() + "`, expected u64");
            }
            return n.longValue();
        }
        BigInteger big = n.bigIntegerValue();
        if (big.signum() < 0 || big.bitLength() > 64) {
            // serde_json reads integers beyond u64 as floating point.
            throw BadCommand.malformed("invalid type: floating point `" + n.asText() + "`, expected u64");
        }
        return big.longValue();
    }

    /** How serde names the type of an unexpected JSON value. */
    static String kind(JsonNode n) {
        if (n.isNull()) {
            return "null";
        } else if (n.isBoolean()) {
            return "boolean `" + n.asText() + "`";
        } else if (n.isTextual()) {
            return "string " + Json.rustDebug(n.textValue());
        } else if (n.isNumber()) {
            return (n.isIntegralNumber() ? "integer `" : "floating point `") + n.asText() + "`";
        } else if (n.isArray()) {
            return "sequence";
        }
        return "map";
    }
}
