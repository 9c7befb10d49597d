package dev.eventfold.bench.ks;

import java.util.List;

/**
 * What the command path needs of an aggregate type (eventfold's {@code Aggregate} trait):
 * decode a command, load an instance from its stored form, and for the flows the
 * reaction to its events. {@link CommandProcessor} runs any of them.
 *
 * @param <C> the command type
 */
interface Aggregate<C> {
    /** The aggregate type name ({@code Aggregate::TYPE}): "order", "payment". */
    String name();

    /** Decodes a commands-topic value with serde's rules; the type from the value, else {@code efType}. */
    C decode(byte[] value, String efType) throws Order.BadCommand;

    /** The instance stored as {@code stored}, or a new one for null. */
    Instance<C> load(String stored);

    /** A fact about an aggregate, as serde writes it. */
    interface Event {
        String type();

        /** The event document: {@code {"type":"...",...}}. */
        byte[] json();
    }

    /** One aggregate instance: its version, rules and stored form. */
    interface Instance<C> {
        /** Number of events applied. */
        long version();

        /** Decides: the events for {@code command}, or why not. */
        List<? extends Event> handle(C command) throws Order.Rejected;

        /** Folds one event in and counts the version. */
        void apply(Event event);

        /** The state-store value: {@code {"version":v,"state":{...}}}. */
        String toStored();
    }
}
