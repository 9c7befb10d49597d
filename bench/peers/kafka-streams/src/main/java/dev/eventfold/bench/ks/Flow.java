package dev.eventfold.bench.ks;

import java.util.List;

/**
 * The shop's order flow (eventfold's {@code order_flow} process manager,
 * {@code examples/shop/src/domain/flow.rs}), as reactions to events:
 *
 * <ul>
 *   <li>{@code OrderConfirmed} of order {@code o} → {@code AuthorizePayment {order_id: o,
 *       amount_cents: <order total>}} to payment {@code pay-<o>};
 *   <li>{@code PaymentAuthorized} → {@code ShipOrder} to {@code o};
 *   <li>{@code PaymentDeclined} → {@code CancelOrder {reason: "payment_declined"}} to {@code o}.
 * </ul>
 *
 * <p>eventfold's process manager keeps the order total in its own state, folded from the
 * order's events; here the reaction runs where the event is made, so it reads the total from
 * the event's order. The expiry timer of eventfold's flow is not modelled (an order of the
 * benchmark is confirmed right after it is placed).
 */
final class Flow {
    /** eventfold's process manager name: the prefix of the command ids. */
    static final String NAME = "order_flow";
    static final String PAYMENT_PREFIX = "pay-";
    static final String PAYMENT_DECLINED = "payment_declined";

    private Flow() {}

    /** A command to send: its target aggregate id, type, body, and its step in the reaction. */
    record Send(String aggregateId, String type, byte[] body, int step) {}

    /**
     * The commands {@code event} of {@code aggregateId} causes. Pure: the total comes with
     * the event's order ({@link Order#totalCents} after the event is applied).
     */
    static List<Send> react(String aggregateId, Aggregate.Event event, long orderTotalCents) {
        if (event instanceof Order.OrderConfirmed) {
            byte[] body = Json.bytes(g -> {
                g.writeStartObject();
                g.writeStringField("type", "AuthorizePayment");
                g.writeStringField("order_id", aggregateId);
                g.writeFieldName("amount_cents");
                Json.writeU64(g, orderTotalCents);
                g.writeEndObject();
            });
            return List.of(new Send(PAYMENT_PREFIX + aggregateId, "AuthorizePayment", body, 0));
        } else if (event instanceof Payment.PaymentAuthorized e) {
            return List.of(new Send(e.orderId(), "ShipOrder", Json.bytes(g -> {
                g.writeStartObject();
                g.writeStringField("type", "ShipOrder");
                g.writeEndObject();
            }), 0));
        } else if (event instanceof Payment.PaymentDeclined e) {
            return List.of(new Send(e.orderId(), "CancelOrder", Json.bytes(g -> {
                g.writeStartObject();
                g.writeStringField("type", "CancelOrder");
                g.writeStringField("reason", PAYMENT_DECLINED);
                g.writeEndObject();
            }), 0));
        }
        return List.of();
    }

    /**
     * The command id of a reaction, in eventfold's {@code <name>:<event>:<step>} shape. The
     * event is named by its aggregate id and version, not by its {@code ef-id}: a command
     * processed again after an aborted transaction makes a new event id, but the same
     * version, so the command sent again carries the same id and the target's dedup store
     * drops it.
     */
    static String commandId(String aggregateId, long version, int step) {
        return NAME + ":" + aggregateId + "/" + version + ":" + step;
    }
}
