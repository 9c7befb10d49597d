package dev.eventfold.bench.ks;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.core.StreamReadFeature;
import com.fasterxml.jackson.core.util.ByteArrayBuilder;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.json.JsonMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.StandardCharsets;

/**
 * JSON helpers. Output is compact, fields in declaration order, as serde_json writes it,
 * so the peer's records have the same shape as eventfold's.
 */
final class Json {
    /** Strict like serde_json: duplicate keys and trailing tokens are errors. */
    static final ObjectMapper MAPPER = JsonMapper.builder()
            .enable(StreamReadFeature.STRICT_DUPLICATE_DETECTION)
            .enable(DeserializationFeature.FAIL_ON_TRAILING_TOKENS)
            .build();

    private static final JsonFactory FACTORY = MAPPER.getFactory();

    private Json() {}

    /** Writes one JSON document. */
    interface Body {
        void write(JsonGenerator g) throws IOException;
    }

    static byte[] bytes(Body body) {
        ByteArrayBuilder out = new ByteArrayBuilder(256);
        try (JsonGenerator g = FACTORY.createGenerator(out)) {
            body.write(g);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        return out.toByteArray();
    }

    static String string(Body body) {
        return new String(bytes(body), StandardCharsets.UTF_8);
    }

    /** Parses a document; null for an empty input. */
    static JsonNode parse(byte[] json) throws IOException {
        return MAPPER.readTree(json);
    }

    static JsonNode parse(String json) throws IOException {
        return MAPPER.readTree(json);
    }

    /** Writes an unsigned 64-bit value. */
    static void writeU64(JsonGenerator g, long unsigned) throws IOException {
        if (unsigned >= 0) {
            g.writeNumber(unsigned);
        } else {
            g.writeNumber(Long.toUnsignedString(unsigned));
        }
    }

    /** The bytes as UTF-8 text, or null if they are not valid UTF-8 (like Rust's from_utf8). */
    static String utf8OrNull(byte[] bytes) {
        if (bytes == null) {
            return null;
        }
        boolean ascii = true;
        for (byte b : bytes) {
            if (b < 0) {
                ascii = false;
                break;
            }
        }
        if (ascii) {
            return new String(bytes, StandardCharsets.ISO_8859_1);
        }
        try {
            return StandardCharsets.UTF_8.newDecoder().decode(ByteBuffer.wrap(bytes)).toString();
        } catch (CharacterCodingException e) {
            return null;
        }
    }

    /** Rust's `{:?}` of a string: quoted, with Rust's escapes. */
    static String rustDebug(String s) {
        StringBuilder b = new StringBuilder(s.length() + 2).append('"');
        for (int i = 0; i < s.length(); ) {
            int c = s.codePointAt(i);
            i += Character.charCount(c);
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                case 0 -> b.append("\\0");
                default -> {
                    if (c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0)) {
                        b.append("\\u{").append(Integer.toHexString(c)).append('}');
                    } else {
                        b.appendCodePoint(c);
                    }
                }
            }
        }
        return b.append('"').toString();
    }
}
