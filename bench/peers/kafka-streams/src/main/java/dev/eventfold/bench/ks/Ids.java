package dev.eventfold.bench.ks;

import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.UUID;
import java.util.concurrent.ThreadLocalRandom;

/** Record ids and timestamps in eventfold's formats. */
final class Ids {
    private static final DateTimeFormatter RFC3339_MS =
            DateTimeFormatter.ofPattern("uuuu-MM-dd'T'HH:mm:ss.SSS'Z'").withZone(ZoneOffset.UTC);

    private Ids() {}

    /** A UUID v7 (RFC 9562): 48-bit Unix milliseconds, version 7, variant 10, random rest. */
    static String uuid7(long nowMs) {
        ThreadLocalRandom r = ThreadLocalRandom.current();
        long msb = (nowMs << 16) | 0x7000L | (r.nextLong() & 0x0FFFL);
        long lsb = (r.nextLong() & 0x3FFF_FFFF_FFFF_FFFFL) | 0x8000_0000_0000_0000L;
        return new UUID(msb, lsb).toString();
    }

    /** {@code YYYY-MM-DDTHH:MM:SS.mmmZ}, as eventfold's {@code rfc3339_ms}. */
    static String rfc3339Ms(long ms) {
        return RFC3339_MS.format(Instant.ofEpochMilli(ms));
    }
}
