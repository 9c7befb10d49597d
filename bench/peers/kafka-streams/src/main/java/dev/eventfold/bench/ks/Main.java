package dev.eventfold.bench.ks;

import java.io.PrintStream;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/** The Kafka Streams peer: provisions its topics, runs the topology, prints READY. */
public final class Main {
    private static final Logger LOG = LoggerFactory.getLogger(Main.class);

    private static final String USAGE = """
            Usage: ks-peer --bootstrap HOST:PORT [options]

            Kafka Streams 4.4.0 peer of eventfold's shop `order` aggregate (benchmark suite).
            Consumes <app>.order.commands, writes <app>.order.events and <app>.order.results
            with processing.guarantee=exactly_once_v2. With --flows also the `payment`
            aggregate (<app>.payment.commands, .events, .results) and the shop's order flow:
            OrderConfirmed -> AuthorizePayment to pay-<order>, PaymentAuthorized -> ShipOrder,
            PaymentDeclined -> CancelOrder. Prints one line READY on stdout once Kafka
            Streams reaches RUNNING; logs go to stderr. SIGTERM shuts down cleanly.

            Options:
              --bootstrap HOST:PORT     Kafka bootstrap servers (required).
              --app-id NAME             Topic prefix and Kafka Streams application.id
                                        (consumer group, transactional ids and internal
                                        topic prefix). Default: ks.
              --partitions N            Partitions of the three topics, created if missing
                                        (replication factor 1); an existing topic with
                                        another count is refused. Default: 8.
              --state-dir DIR           Kafka Streams state.dir (RocksDB stores live in
                                        DIR/<app-id>/). Default: /tmp/ks-peer-state/<app-id>.
              --threads N               num.stream.threads. Default: 2.
              --commit-interval-ms N    commit.interval.ms: how often a transaction commits,
                                        hence the floor of read_committed latency.
                                        Default: 100 (Kafka Streams' default under EOS).
              --cache-max-bytes N       statestore.cache.max.bytes: the record cache in
                                        front of the order-state store, shared by the
                                        threads; 0 turns it off. Default: 10485760
                                        (Kafka Streams' default, 10 MiB).
              --flows                   Run the payment aggregate and the order flow too
                                        (three more topics; the order topics are the same).
              --decline-above-cents N   With --flows: payments above N cents are declined
                                        (PaymentDeclined, then the order is cancelled).
                                        Default: 1000000, as the shop's.
              --reset                   Delete this app's local state (DIR/<app-id>) before
                                        start; the stores are then restored from their
                                        changelog topics. Does not reset offsets or topics:
                                        use a fresh --app-id for a fresh run.
              -h, --help                This text.

            Environment (read by run.sh): KS_PEER_JAVA_OPTS, extra JVM options.
            Log level: -Dorg.slf4j.simpleLogger.defaultLogLevel=info (default warn).
            """;

    /** Kafka Streams' own default for statestore.cache.max.bytes (10 MiB). */
    static final long DEFAULT_CACHE_MAX_BYTES = 10L * 1024 * 1024;

    private Main() {}

    /** Parsed command line. */
    record Options(
            String bootstrap,
            String appId,
            int partitions,
            String stateDir,
            int threads,
            long commitIntervalMs,
            long cacheMaxBytes,
            boolean reset,
            PeerTopology.Flows flows) {}

    /** A command-line error: printed with the usage, exit status 2. */
    static final class UsageError extends Exception {
        UsageError(String message) {
            super(message);
        }
    }

    static Options parse(String[] args) throws UsageError {
        Map<String, String> values = new HashMap<>();
        boolean reset = false;
        boolean flows = false;
        List<String> known = List.of(
                "--bootstrap", "--app-id", "--partitions", "--state-dir", "--threads", "--commit-interval-ms",
                "--decline-above-cents", "--cache-max-bytes");
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (a.equals("--reset")) {
                reset = true;
                continue;
            }
            if (a.equals("--flows")) {
                flows = true;
                continue;
            }
            String name = a;
            String value = null;
            int eq = a.indexOf('=');
            if (a.startsWith("--") && eq > 0) {
                name = a.substring(0, eq);
                value = a.substring(eq + 1);
            }
            if (!known.contains(name)) {
                throw new UsageError("unknown argument `" + a + "`");
            }
            if (value == null) {
                if (i + 1 >= args.length) {
                    throw new UsageError(name + " needs a value");
                }
                value = args[++i];
            }
            values.put(name, value);
        }
        String bootstrap = values.get("--bootstrap");
        if (bootstrap == null || bootstrap.isBlank()) {
            throw new UsageError("--bootstrap HOST:PORT is required");
        }
        String appId = values.getOrDefault("--app-id", "ks");
        if (!appId.matches("[a-zA-Z0-9._-]{1,200}") || appId.equals(".") || appId.equals("..")) {
            throw new UsageError("--app-id must be 1 to 200 of a-z, A-Z, 0-9, '.', '_', '-'");
        }
        int partitions = (int) number(values, "--partitions", 8, 1, 10_000);
        int threads = (int) number(values, "--threads", 2, 1, 256);
        long commit = number(values, "--commit-interval-ms", 100, 1, 3_600_000);
        long cache = number(values, "--cache-max-bytes", DEFAULT_CACHE_MAX_BYTES, 0, Long.MAX_VALUE);
        String stateDir = values.getOrDefault("--state-dir", "/tmp/ks-peer-state/" + appId);
        long decline = number(values, "--decline-above-cents", Payment.DEFAULT_DECLINE_ABOVE_CENTS, 0, Long.MAX_VALUE);
        if (values.containsKey("--decline-above-cents") && !flows) {
            throw new UsageError("--decline-above-cents needs --flows");
        }
        return new Options(bootstrap, appId, partitions, stateDir, threads, commit, cache, reset,
                flows ? new PeerTopology.Flows(decline) : null);
    }

    private static long number(Map<String, String> values, String name, long dflt, long min, long max)
            throws UsageError {
        String v = values.get(name);
        if (v == null) {
            return dflt;
        }
        try {
            long n = Long.parseLong(v);
            if (n < min || n > max) {
                throw new UsageError(name + " must be between " + min + " and " + max + ", not " + v);
            }
            return n;
        } catch (NumberFormatException e) {
            throw new UsageError(name + " must be a number, not `" + v + "`");
        }
    }

    static Properties streamsConfig(Options o) {
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, o.appId());
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, o.bootstrap());
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.toString(o.threads()));
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Long.toString(o.commitIntervalMs()));
        p.put(StreamsConfig.STATE_DIR_CONFIG, o.stateDir());
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, Long.toString(o.cacheMaxBytes()));
        return p;
    }

    public static void main(String[] args) {
        for (String a : args) {
            if (a.equals("-h") || a.equals("--help")) {
                System.out.print(USAGE);
                System.out.flush();
                return;
            }
        }
        Options o;
        try {
            o = parse(args);
        } catch (UsageError e) {
            System.err.println("ks-peer: " + e.getMessage() + " (see --help)");
            System.exit(2);
            return;
        }
        try {
            ensureTopics(o);
        } catch (Exception e) {
            System.err.println("ks-peer: " + e.getMessage());
            System.exit(1);
            return;
        }
        System.exit(run(o));
    }

    private static int run(Options o) {
        KafkaStreams streams = new KafkaStreams(
                PeerTopology.build(o.appId(), o.partitions(), System::currentTimeMillis, o.flows()),
                streamsConfig(o));
        if (o.reset()) {
            streams.cleanUp();
            System.err.println("ks-peer: deleted local state " + Path.of(o.stateDir(), o.appId()));
        }
        CountDownLatch stopped = new CountDownLatch(1);
        AtomicBoolean ready = new AtomicBoolean();
        AtomicBoolean failed = new AtomicBoolean();
        PrintStream out = System.out;
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING && ready.compareAndSet(false, true)) {
                out.println("READY");
                out.flush();
            } else if (now == KafkaStreams.State.ERROR) {
                failed.set(true);
                stopped.countDown();
            } else if (now == KafkaStreams.State.NOT_RUNNING) {
                stopped.countDown();
            }
        });
        streams.setUncaughtExceptionHandler(e -> {
            LOG.error("stream thread failed; shutting down", e);
            System.err.println("ks-peer: stream thread failed: " + e);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        AtomicBoolean terminating = new AtomicBoolean();
        Thread hook = new Thread(() -> {
            terminating.set(true);
            streams.close(Duration.ofSeconds(30));
            stopped.countDown();
        }, "ks-peer-shutdown");
        Runtime.getRuntime().addShutdownHook(hook);
        streams.start();
        try {
            stopped.await();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        if (terminating.get()) {
            // The JVM is exiting (SIGTERM): the hook owns the close; wait for it briefly.
            try {
                hook.join(TimeUnit.SECONDS.toMillis(35));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            return 0;
        }
        streams.close(Duration.ofSeconds(30));
        return failed.get() ? 1 : 0;
    }

    /**
     * Creates the three topics of each aggregate type if missing; refuses an existing one with
     * another partition count.
     */
    static void ensureTopics(Options o) throws Exception {
        String app = o.appId();
        Map<String, Map<String, String>> wanted = new HashMap<>();
        for (String type : o.flows() == null ? List.of(Order.TYPE) : List.of(Order.TYPE, Payment.TYPE)) {
            wanted.put(PeerTopology.commandsTopic(app, type),
                    Map.of("cleanup.policy", "delete", "retention.ms", Long.toString(7L * 24 * 3600 * 1000)));
            wanted.put(PeerTopology.eventsTopic(app, type),
                    Map.of("cleanup.policy", "delete", "retention.ms", "-1", "retention.bytes", "-1"));
            wanted.put(PeerTopology.resultsTopic(app, type),
                    Map.of("cleanup.policy", "delete", "retention.ms", Long.toString(24L * 3600 * 1000)));
        }
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, o.bootstrap());
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "60000");
        try (Admin admin = Admin.create(p)) {
            List<NewTopic> missing = new ArrayList<>();
            for (var e : describe(admin, wanted.keySet()).entrySet()) {
                if (e.getValue() == null) {
                    missing.add(new NewTopic(e.getKey(), o.partitions(), (short) 1).configs(wanted.get(e.getKey())));
                }
            }
            for (NewTopic t : missing) {
                try {
                    admin.createTopics(List.of(t)).all().get(60, TimeUnit.SECONDS);
                    System.err.println("ks-peer: created topic " + t.name() + " (" + o.partitions() + " partitions)");
                } catch (ExecutionException e) {
                    if (!(e.getCause() instanceof TopicExistsException)) {
                        throw new Exception("cannot create topic " + t.name() + ": " + e.getCause().getMessage(), e);
                    }
                }
            }
            // A new topic's metadata takes a moment to show up: wait for all of them.
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            Map<String, TopicDescription> described = describe(admin, wanted.keySet());
            while (described.containsValue(null) && System.nanoTime() < deadline) {
                Thread.sleep(200);
                described = describe(admin, wanted.keySet());
            }
            for (var e : described.entrySet()) {
                TopicDescription d = e.getValue();
                if (d == null) {
                    throw new Exception("topic " + e.getKey() + " does not exist 60 s after creating it");
                }
                int n = d.partitions().size();
                if (n != o.partitions()) {
                    throw new Exception("topic " + e.getKey() + " exists with " + n + " partitions, but --partitions is "
                            + o.partitions() + ": the topics must be co-partitioned; pass --partitions " + n
                            + " or use another --app-id");
                }
            }
        }
    }

    /** Topic name -> description, or null if the topic does not exist. */
    private static Map<String, TopicDescription> describe(Admin admin, java.util.Collection<String> names)
            throws Exception {
        Map<String, TopicDescription> out = new HashMap<>();
        var futures = admin.describeTopics(names).topicNameValues();
        for (String name : names) {
            try {
                out.put(name, futures.get(name).get(60, TimeUnit.SECONDS));
            } catch (ExecutionException e) {
                if (e.getCause() instanceof UnknownTopicOrPartitionException) {
                    out.put(name, null);
                } else {
                    throw new Exception("cannot describe topic " + name + ": " + e.getCause().getMessage(), e);
                }
            }
        }
        return out;
    }
}
