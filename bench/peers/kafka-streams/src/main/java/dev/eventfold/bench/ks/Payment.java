package dev.eventfold.bench.ks;

import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.util.List;
import java.util.Set;

/**
 * The {@code payment} aggregate, a mirror of eventfold's
 * {@code examples/shop/src/domain/payment.rs}: authorize (declined strictly above a
 * configured limit), then capture or void; the same commands, events, JSON field names,
 * rejection codes and messages. Money is a u64 held in a Java {@code long}, unsigned.
 */
final class Payment implements Aggregate.Instance<Payment.Command> {
    static final String TYPE = "payment";

    /** eventfold's default {@code decline_above_cents}: 10,000.00. */
    static final long DEFAULT_DECLINE_ABOVE_CENTS = 1_000_000L;

    /** The payment aggregate type with this decline limit (unsigned cents), for {@link CommandProcessor}. */
    static Aggregate<Command> kind(long declineAboveCents) {
        return new Aggregate<>() {
            @Override
            public String name() {
                return TYPE;
            }

            @Override
            public Command decode(byte[] value, String efType) throws Order.BadCommand {
                return Payment.decode(value, efType);
            }

            @Override
            public Payment load(String stored) {
                return stored == null ? new Payment(declineAboveCents) : fromStored(stored, declineAboveCents);
            }
        };
    }

    // ------------------------------------------------------------------ commands and events

    sealed interface Command permits AuthorizePayment, CapturePayment, VoidPayment {}

    record AuthorizePayment(String orderId, long amountCents) implements Command {}

    record CapturePayment() implements Command {}

    record VoidPayment() implements Command {}

    sealed interface Event extends Aggregate.Event
            permits PaymentAuthorized, PaymentDeclined, PaymentCaptured, PaymentVoided {
        default void writeFields(JsonGenerator g) throws IOException {}

        @Override
        default byte[] json() {
            return Json.bytes(g -> {
                g.writeStartObject();
                g.writeStringField("type", type());
                writeFields(g);
                g.writeEndObject();
            });
        }
    }

    record PaymentAuthorized(String orderId, long amountCents) implements Event {
        public String type() {
            return "PaymentAuthorized";
        }

        public void writeFields(JsonGenerator g) throws IOException {
            g.writeStringField("order_id", orderId);
            g.writeFieldName("amount_cents");
            Json.writeU64(g, amountCents);
        }
    }

    record PaymentDeclined(String orderId, long amountCents, String reason) implements Event {
        public String type() {
            return "PaymentDeclined";
        }

        public void writeFields(JsonGenerator g) throws IOException {
            g.writeStringField("order_id", orderId);
            g.writeFieldName("amount_cents");
            Json.writeU64(g, amountCents);
            g.writeStringField("reason", reason);
        }
    }

    record PaymentCaptured() implements Event {
        public String type() {
            return "PaymentCaptured";
        }
    }

    record PaymentVoided() implements Event {
        public String type() {
            return "PaymentVoided";
        }
    }

    // ------------------------------------------------------------------ state

    /** null before authorization; else authorized, declined, captured or voided. */
    String status;
    String orderId = "";
    long amountCents;
    String declineReason;
    long version;
    private final long declineAboveCents;

    Payment(long declineAboveCents) {
        this.declineAboveCents = declineAboveCents;
    }

    @Override
    public long version() {
        return version;
    }

    @Override
    public List<Event> handle(Command command) throws Order.Rejected {
        if (command instanceof AuthorizePayment c) {
            return List.of(authorize(c.orderId(), c.amountCents()));
        } else if (command instanceof CapturePayment) {
            leaveAuthorized("captured");
            return List.of(new PaymentCaptured());
        } else if (command instanceof VoidPayment) {
            leaveAuthorized("voided");
            return List.of(new PaymentVoided());
        }
        throw new IllegalStateException("unhandled command " + command);
    }

    private Event authorize(String orderId, long amountCents) throws Order.Rejected {
        if (status != null) {
            throw new Order.Rejected(
                    "already_authorized", "the payment was already submitted for authorization and is " + status);
        }
        if (amountCents == 0) {
            throw new Order.Rejected("invalid_amount", "the amount must be above zero");
        }
        if (Long.compareUnsigned(amountCents, declineAboveCents) > 0) {
            String reason = "amount of " + Long.toUnsignedString(amountCents) + " cents is above the limit of "
                    + Long.toUnsignedString(declineAboveCents) + " cents";
            return new PaymentDeclined(orderId, amountCents, reason);
        }
        return new PaymentAuthorized(orderId, amountCents);
    }

    /** Capture and void both leave {@code authorized} only; every other status is final. */
    private void leaveAuthorized(String to) throws Order.Rejected {
        if (status == null) {
            throw new Order.Rejected("payment_not_found", "the payment does not exist");
        }
        if (!status.equals("authorized")) {
            throw new Order.Rejected("invalid_transition", "a payment cannot go from " + status + " to " + to);
        }
    }

    @Override
    public void apply(Aggregate.Event event) {
        if (event instanceof PaymentAuthorized e) {
            status = "authorized";
            orderId = e.orderId();
            amountCents = e.amountCents();
        } else if (event instanceof PaymentDeclined e) {
            status = "declined";
            orderId = e.orderId();
            amountCents = e.amountCents();
            declineReason = e.reason();
        } else if (event instanceof PaymentCaptured) {
            status = "captured";
        } else if (event instanceof PaymentVoided) {
            status = "voided";
        }
        version++;
    }

    // ------------------------------------------------------------------ stored form

    /** {@code {"version":v,"state":{status, order_id, amount_cents, decline_reason}}}, as serde writes {@code Payment}. */
    @Override
    public String toStored() {
        return Json.string(g -> {
            g.writeStartObject();
            g.writeNumberField("version", version);
            g.writeObjectFieldStart("state");
            if (status == null) {
                g.writeNullField("status");
            } else {
                g.writeStringField("status", status);
            }
            g.writeStringField("order_id", orderId);
            g.writeFieldName("amount_cents");
            Json.writeU64(g, amountCents);
            if (declineReason == null) {
                g.writeNullField("decline_reason");
            } else {
                g.writeStringField("decline_reason", declineReason);
            }
            g.writeEndObject();
            g.writeEndObject();
        });
    }

    static Payment fromStored(String stored, long declineAboveCents) {
        try {
            JsonNode doc = Json.parse(stored);
            JsonNode st = doc.get("state");
            Payment p = new Payment(declineAboveCents);
            p.version = doc.get("version").longValue();
            p.status = st.get("status").isNull() ? null : st.get("status").textValue();
            p.orderId = st.get("order_id").textValue();
            p.amountCents = st.get("amount_cents").bigIntegerValue().longValue();
            p.declineReason = st.get("decline_reason").isNull() ? null : st.get("decline_reason").textValue();
            return p;
        } catch (IOException | RuntimeException e) {
            throw new IllegalStateException("corrupt record in store payment-state: " + e.getMessage(), e);
        }
    }

    // ------------------------------------------------------------------ decoding

    private static final Set<String> AUTHORIZE_FIELDS = Set.of("order_id", "amount_cents");

    /** As {@link Order#decode}: {@code deny_unknown_fields} on the struct variant, unit variants ignore extras. */
    static Command decode(byte[] value, String efType) throws Order.BadCommand {
        ObjectNode obj = Order.object(value);
        String type = Order.tag(obj, efType);
        switch (type) {
            case "AuthorizePayment":
                Order.onlyFields(obj, AUTHORIZE_FIELDS, true);
                return new AuthorizePayment(Order.string(obj, "order_id"), Order.u64(obj, "amount_cents"));
            case "CapturePayment":
                return new CapturePayment();
            case "VoidPayment":
                return new VoidPayment();
            default:
                throw new Order.BadCommand(
                        "unknown_command_type",
                        "unknown command type `" + type + "` for aggregate type `" + TYPE + "`");
        }
    }
}
