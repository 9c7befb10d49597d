#!/usr/bin/env bash
# Runs a real single-node Apache Kafka 4.x broker (KRaft, broker+controller in one JVM)
# for eventfold development and tests, from jars resolved by Maven (scripts/kafka/pom.xml).
# See usage() below or scripts/kafka/README.md.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
POM="$SCRIPT_DIR/pom.xml"

log() { printf '[kafka] %s\n' "$*" >&2; }
die() {
  printf '\n[kafka] ERROR: %s\n\n' "$*" >&2
  exit 1
}

usage() {
  cat >&2 <<EOF
Usage: scripts/kafka/broker.sh <command>

Runs a single-node Apache Kafka broker (KRaft, from Maven-resolved jars) for tests.

Commands:
  fetch     Resolve the broker jars with Maven into the cache (skipped when already complete).
  start     Fetch if needed, write config, format storage (fresh unless KEEP_DATA=1), start the
            broker in the background and wait until its client port accepts connections.
            Does nothing if the broker of this state dir already runs.
  stop      SIGTERM the broker, wait up to EVENTFOLD_KAFKA_STOP_TIMEOUT s, then SIGKILL.
            Idempotent.
  restart   stop, then start keeping the data (KEEP_DATA=1).
  stop-broker
            With EVENTFOLD_KAFKA_CONTROLLER=separate: stop only the broker process; the
            controller keeps running (a later start starts the broker again).
  status    Print whether the broker runs and its bootstrap address (exit 0 running, 3 stopped).
  logs      Print the last EVENTFOLD_KAFKA_LOG_TAIL lines of the broker log.
  acl ARGS  Run Kafka's AclCommand against the PLAINTEXT listener (a super user there), e.g.
            acl --add --allow-principal User:app --operation Read --topic shop. \
                --resource-pattern-type prefixed
            (all its options: acl --help).

Security listener (on by default, for the Kafka security tests):
  Beside PLAINTEXT the broker listens with SASL_SSL on EVENTFOLD_KAFKA_SASL_SSL_PORT
  (default EVENTFOLD_KAFKA_PORT+2; 0 turns it off): TLS with a certificate of a CA generated
  into <state dir>/ssl (clients trust <state dir>/ssl/ca.pem; it holds IP 127.0.0.1 and DNS
  localhost), SASL/SCRAM-SHA-256 with the users admin (password admin-secret, a super user)
  and app (password app-secret, only what ACLs grant it). ACLs are enforced
  (StandardAuthorizer); PLAINTEXT clients are User:ANONYMOUS, a super user, so tests on
  the plain listener need no ACLs. Test credentials only: never expose this broker.

Environment:
  EVENTFOLD_CACHE               Cache root for the jars (default: \$HOME/.cache/eventfold);
                                jars go to \$EVENTFOLD_CACHE/kafka-<version>/libs.
  EVENTFOLD_KAFKA_DIR           State dir: config, data, pid file, broker.log
                                (default: /tmp/eventfold-kafka).
  EVENTFOLD_KAFKA_HOST          Listener/advertised host (default: 127.0.0.1).
  EVENTFOLD_KAFKA_PORT          Client (PLAINTEXT) port (default: 9092); the controller listens
                                on EVENTFOLD_KAFKA_PORT+1.
  EVENTFOLD_KAFKA_START_TIMEOUT Seconds to wait for the client port at start (default: 90).
  EVENTFOLD_KAFKA_STOP_TIMEOUT  Seconds to wait after SIGTERM before SIGKILL (default: 30).
  KEEP_DATA                     1: start keeps the existing data dir instead of reformatting
                                (default: 0; restart always keeps data).
  EVENTFOLD_KAFKA_HEAP_OPTS     JVM heap options (default: -Xms256m -Xmx512m).
  EVENTFOLD_KAFKA_JVM_OPTS      Extra JVM options, appended (default: empty).
  EVENTFOLD_KAFKA_LOG_LEVEL     Root Log4j2 level of the broker log (default: INFO).
  EVENTFOLD_KAFKA_EXTRA_CONFIG  Path of a properties file appended to server.properties
                                (later keys win), e.g. to tweak transaction timeouts.
  EVENTFOLD_KAFKA_LOG_TAIL      Lines of broker log shown on failure / by 'logs' (default: 80).
  EVENTFOLD_KAFKA_SASL_SSL_PORT SASL_SSL listener port (default: EVENTFOLD_KAFKA_PORT+2; 0: none).
  EVENTFOLD_KAFKA_CONTROLLER    combined (default): broker and KRaft controller in one JVM.
                                separate: a controller JVM (node 2, state in <dir>/controller,
                                log controller.log) and a broker JVM (node 1); the broker
                                runs without controlled shutdown and can be restarted alone
                                (stop-broker, start), as in a production cluster.
  EVENTFOLD_KAFKA_FEATURES      Space-separated feature levels set when storage is formatted,
                                e.g. "transaction.version=1" (default: the release's).
  JAVA                          Java executable, 17+ (default: java).
  MVN                           Maven executable (default: mvn).
EOF
}

# ---------------------------------------------------------------- settings

KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM" | head -n1)"
[[ -n "$KAFKA_VERSION" ]] || die "cannot read <kafka.version> from $POM"

CACHE_ROOT="${EVENTFOLD_CACHE:-${HOME:?HOME is not set}/.cache/eventfold}"
KAFKA_HOME="$CACHE_ROOT/kafka-$KAFKA_VERSION"
LIBS_DIR="$KAFKA_HOME/libs"
FETCH_MARKER="$KAFKA_HOME/.fetch-complete"

STATE_DIR="${EVENTFOLD_KAFKA_DIR:-/tmp/eventfold-kafka}"
DATA_DIR="$STATE_DIR/data"
PID_FILE="$STATE_DIR/broker.pid"
LOG_FILE="$STATE_DIR/broker.log"
BOOTSTRAP_FILE="$STATE_DIR/bootstrap"
SERVER_PROPS="$STATE_DIR/server.properties"
LOG4J_CONF="$STATE_DIR/log4j2.properties"

HOST="${EVENTFOLD_KAFKA_HOST:-127.0.0.1}"
PORT="${EVENTFOLD_KAFKA_PORT:-9092}"
START_TIMEOUT="${EVENTFOLD_KAFKA_START_TIMEOUT:-90}"
STOP_TIMEOUT="${EVENTFOLD_KAFKA_STOP_TIMEOUT:-30}"
KEEP_DATA="${KEEP_DATA:-0}"
HEAP_OPTS="${EVENTFOLD_KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}"
EXTRA_JVM_OPTS="${EVENTFOLD_KAFKA_JVM_OPTS:-}"
LOG_LEVEL="${EVENTFOLD_KAFKA_LOG_LEVEL:-INFO}"
EXTRA_CONFIG="${EVENTFOLD_KAFKA_EXTRA_CONFIG:-}"
LOG_TAIL="${EVENTFOLD_KAFKA_LOG_TAIL:-80}"
JAVA="${JAVA:-java}"
MVN="${MVN:-mvn}"

# Fixed KRaft cluster id: 22 chars of URL-safe base64 (16 bytes: "eventfold-kafka1").
CLUSTER_ID="ZXZlbnRmb2xkLWthZmthMQ"

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
is_uint "$PORT" && ((PORT >= 1 && PORT <= 65534)) ||
  die "EVENTFOLD_KAFKA_PORT must be a port number in 1..65534 (got '$PORT')"
CONTROLLER_PORT=$((PORT + 1))
CONTROLLER_MODE="${EVENTFOLD_KAFKA_CONTROLLER:-combined}"
[[ "$CONTROLLER_MODE" == combined || "$CONTROLLER_MODE" == separate ]] ||
  die "EVENTFOLD_KAFKA_CONTROLLER must be combined or separate (got '$CONTROLLER_MODE')"
CTRL_DIR="$STATE_DIR/controller"
CTRL_DATA_DIR="$CTRL_DIR/data"
CTRL_PID_FILE="$CTRL_DIR/controller.pid"
CTRL_LOG_FILE="$STATE_DIR/controller.log"
CTRL_PROPS="$CTRL_DIR/server.properties"
SASL_SSL_PORT="${EVENTFOLD_KAFKA_SASL_SSL_PORT:-$((PORT + 2))}"
is_uint "$SASL_SSL_PORT" && ((SASL_SSL_PORT <= 65535)) ||
  die "EVENTFOLD_KAFKA_SASL_SSL_PORT must be a port number or 0 (got '$SASL_SSL_PORT')"
SSL_DIR="$STATE_DIR/ssl"
# Test credentials of the SASL_SSL listener (usage above).
SSL_PASSWORD="eventfold-test"
SCRAM_USERS=("admin:admin-secret" "app:app-secret")
is_uint "$START_TIMEOUT" || die "EVENTFOLD_KAFKA_START_TIMEOUT must be whole seconds (got '$START_TIMEOUT')"
is_uint "$STOP_TIMEOUT" || die "EVENTFOLD_KAFKA_STOP_TIMEOUT must be whole seconds (got '$STOP_TIMEOUT')"
is_uint "$LOG_TAIL" || die "EVENTFOLD_KAFKA_LOG_TAIL must be a number (got '$LOG_TAIL')"
[[ "$KEEP_DATA" == 0 || "$KEEP_DATA" == 1 ]] || die "KEEP_DATA must be 0 or 1 (got '$KEEP_DATA')"
[[ -n "$STATE_DIR" && "$STATE_DIR" != "/" ]] || die "EVENTFOLD_KAFKA_DIR must not be empty or /"

# ---------------------------------------------------------------- helpers

have() { command -v "$1" >/dev/null 2>&1; }

# Exclusive lock on file $2 through file descriptor $1 (no-op without flock(1)).
lock() {
  local fd="$1" file="$2"
  eval "exec $fd>\"\$file\""
  if have flock; then
    flock "$fd"
  fi
}
unlock() { eval "exec $1>&-"; }

sha256_of() {
  if have sha256sum; then
    sha256sum "$1" | cut -d' ' -f1
  else
    shasum -a 256 "$1" | cut -d' ' -f1
  fi
}

# TCP connect probe: succeeds once something accepts connections on host:port.
port_open() {
  local host="$1" port="$2"
  if have timeout; then
    timeout 2 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port" 2>/dev/null
  else
    bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port" 2>/dev/null
  fi
}

# True if $1 is a live (non-zombie) process running kafka.Kafka.
is_broker_pid() {
  local pid="$1" cmd state
  [[ -n "$pid" ]] && is_uint "$pid" || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  if [[ -r "/proc/$pid/cmdline" ]]; then
    state="$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || true)"
    [[ "$state" != "Z" ]] || return 1
    cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
  else
    state="$(ps -o stat= -p "$pid" 2>/dev/null || true)"
    [[ "$state" != Z* ]] || return 1
    cmd="$(ps -o command= -p "$pid" 2>/dev/null || true)"
  fi
  [[ "$cmd" == *kafka.Kafka* ]]
}

# Prints the pid of the running broker of this state dir (or of the process whose pid
# file is $1); fails if there is none.
running_pid() {
  local pid file="${1:-$PID_FILE}"
  [[ -f "$file" ]] || return 1
  pid="$(tr -dc '0-9' <"$file")"
  is_broker_pid "$pid" || return 1
  printf '%s\n' "$pid"
}

show_log_tail() {
  local file="${1:-$LOG_FILE}"
  if [[ -s "$file" ]]; then
    printf '[kafka] ---- last %s lines of %s ----\n' "$LOG_TAIL" "$file" >&2
    tail -n "$LOG_TAIL" "$file" >&2
    printf '[kafka] ---- end of %s ----\n' "$file" >&2
  else
    log "(log $file is empty or missing)"
  fi
}

# Sends SIGTERM, waits up to STOP_TIMEOUT s, then SIGKILL. Returns once the process is gone.
terminate() {
  local pid="$1" deadline
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + STOP_TIMEOUT))
  while is_broker_pid "$pid" && ((SECONDS < deadline)); do
    sleep 0.2
  done
  if is_broker_pid "$pid"; then
    log "broker (pid $pid) still alive after ${STOP_TIMEOUT}s: sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    deadline=$((SECONDS + 10))
    while is_broker_pid "$pid" && ((SECONDS < deadline)); do
      sleep 0.2
    done
    is_broker_pid "$pid" && die "broker (pid $pid) survived SIGKILL"
  fi
  # Reap it if it is our own child (start's failure path); harmless otherwise.
  wait "$pid" 2>/dev/null || true
}

# ---------------------------------------------------------------- fetch

fetch_wanted() { printf 'kafka=%s pom-sha256=%s\n' "$KAFKA_VERSION" "$(sha256_of "$POM")"; }

fetch_complete() {
  [[ -f "$FETCH_MARKER" && -d "$LIBS_DIR" ]] && [[ "$(cat "$FETCH_MARKER")" == "$(fetch_wanted)" ]]
}

cmd_fetch() {
  if fetch_complete; then
    log "jars for Kafka $KAFKA_VERSION already in $LIBS_DIR"
    return 0
  fi
  have "$MVN" || die "Maven ('$MVN') not found: install maven (apt-get install -y maven) or set MVN"
  mkdir -p "$KAFKA_HOME"
  lock 8 "$KAFKA_HOME/.lock"
  if fetch_complete; then # another process fetched while we waited for the lock
    unlock 8
    log "jars for Kafka $KAFKA_VERSION already in $LIBS_DIR"
    return 0
  fi
  log "resolving Kafka $KAFKA_VERSION jars with Maven into $LIBS_DIR ..."
  local tmp mvn_log="$KAFKA_HOME/mvn.log" t0=$SECONDS
  tmp="$(mktemp -d "$KAFKA_HOME/libs.tmp.XXXXXX")"
  if ! "$MVN" -B -q -Dstyle.color=never -f "$POM" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$tmp" >"$mvn_log" 2>&1; then
    rm -rf "$tmp"
    show_log_tail "$mvn_log"
    unlock 8
    die "Maven could not resolve the Kafka $KAFKA_VERSION jars (full output: $mvn_log)"
  fi
  local jar
  for jar in "kafka_2.13-$KAFKA_VERSION.jar" "kafka-clients-$KAFKA_VERSION.jar"; do
    [[ -f "$tmp/$jar" ]] || {
      rm -rf "$tmp"
      unlock 8
      die "Maven finished but $jar is missing (output: $mvn_log)"
    }
  done
  compgen -G "$tmp/log4j-slf4j-impl-*.jar" >/dev/null || {
    rm -rf "$tmp"
    unlock 8
    die "Maven finished but log4j-slf4j-impl is missing (output: $mvn_log)"
  }
  rm -f "$FETCH_MARKER"
  rm -rf "$LIBS_DIR"
  mv "$tmp" "$LIBS_DIR"
  fetch_wanted >"$FETCH_MARKER.tmp"
  mv "$FETCH_MARKER.tmp" "$FETCH_MARKER"
  unlock 8
  log "fetched $(find "$LIBS_DIR" -name '*.jar' | wc -l | tr -d ' ') jars ($(du -sh "$LIBS_DIR" | cut -f1)) in $((SECONDS - t0))s"
}

# ---------------------------------------------------------------- config

# The SASL_SSL listener's settings: TLS from the generated keystore, SCRAM, and ACLs
# enforced, with the plain listener's anonymous clients as super users.
security_config() {
  cat <<EOF

# SASL_SSL listener for the Kafka security tests (test credentials: see broker.sh usage).
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-256
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PKCS12
ssl.keystore.location=$SSL_DIR/broker.p12
ssl.keystore.password=$SSL_PASSWORD
ssl.key.password=$SSL_PASSWORD
ssl.client.auth=none
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS;User:admin
EOF
}

# A CA and the broker's certificate signed by it (IP $HOST, DNS localhost), once per state
# dir: <state>/ssl/ca.pem for clients, broker.p12 for the broker.
make_certs() {
  [[ -f "$SSL_DIR/broker.p12" && -f "$SSL_DIR/ca.pem" ]] && return 0
  have openssl || die "openssl not found: it generates the SASL_SSL listener's certificates (apt-get install -y openssl), or set EVENTFOLD_KAFKA_SASL_SSL_PORT=0"
  log "generating a test CA and the broker's certificate in $SSL_DIR"
  rm -rf "$SSL_DIR"
  mkdir -p "$SSL_DIR"
  local out="$SSL_DIR/openssl.log"
  {
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=eventfold test CA" \
      -keyout "$SSL_DIR/ca.key" -out "$SSL_DIR/ca.pem" &&
      openssl req -newkey rsa:2048 -nodes -subj "/CN=$HOST" \
        -keyout "$SSL_DIR/broker.key" -out "$SSL_DIR/broker.csr" &&
      printf 'subjectAltName=IP:%s,DNS:localhost\n' "$HOST" >"$SSL_DIR/san.ext" &&
      openssl x509 -req -in "$SSL_DIR/broker.csr" -CA "$SSL_DIR/ca.pem" -CAkey "$SSL_DIR/ca.key" \
        -CAcreateserial -days 3650 -extfile "$SSL_DIR/san.ext" -out "$SSL_DIR/broker.pem" &&
      openssl pkcs12 -export -in "$SSL_DIR/broker.pem" -inkey "$SSL_DIR/broker.key" \
        -certfile "$SSL_DIR/ca.pem" -name broker -passout "pass:$SSL_PASSWORD" -out "$SSL_DIR/broker.p12"
  } >"$out" 2>&1 || {
    show_log_tail "$out"
    die "openssl could not generate the test certificates (output: $out)"
  }
}

write_config() {
  SASL_LISTENER=""
  if [[ "$SASL_SSL_PORT" != 0 ]]; then
    make_certs
    SASL_LISTENER=",SASL_SSL://$HOST:$SASL_SSL_PORT"
  fi
  if [[ "$CONTROLLER_MODE" == separate ]]; then
    mkdir -p "$CTRL_DIR"
    cat >"$CTRL_PROPS" <<EOF
# Generated by scripts/kafka/broker.sh on every start: edits are lost.
# The KRaft controller of the eventfold test cluster (EVENTFOLD_KAFKA_CONTROLLER=separate).
process.roles=controller
node.id=2
controller.quorum.voters=2@$HOST:$CONTROLLER_PORT
listeners=CONTROLLER://$HOST:$CONTROLLER_PORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT
log.dirs=$CTRL_DATA_DIR
# A broker that stopped is fenced (its partitions left without a leader) 3 s after its
# last heartbeat, while it is down; a restart shorter than that waits for it.
broker.session.timeout.ms=3000
EOF
    cat >"$SERVER_PROPS" <<EOF
# Generated by scripts/kafka/broker.sh on every start: edits are lost.
# The broker of the eventfold test cluster; its controller runs in another JVM.
process.roles=broker
node.id=1
controller.quorum.voters=2@$HOST:$CONTROLLER_PORT
listeners=PLAINTEXT://$HOST:$PORT$SASL_LISTENER
# No controlled shutdown: with one broker it would only take every partition's leader
# away while the broker still runs, and in that window Kafka's transaction coordinator
# (4.4) skips the markers of partitions without a leader ("Couldn't find leader endpoint
# ... likely deleted already") yet completes the transaction: a commit the client was
# told succeeded stays open in its partitions, and the producer's next abort aborts it.
# Without it the controller fences the broker only once it is gone (its session timed
# out), when no coordinator runs. The broker-restart crash test found this and checks
# the broker log for it (examples/shop/tests/crash.rs).
controlled.shutdown.enable=false
broker.heartbeat.interval.ms=500
EOF
  else
    cat >"$SERVER_PROPS" <<EOF
# Generated by scripts/kafka/broker.sh on every start: edits are lost.
# Single-node KRaft broker for eventfold tests (broker and controller in one JVM).
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:$CONTROLLER_PORT
listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://$HOST:$CONTROLLER_PORT$SASL_LISTENER
EOF
  fi
  cat >>"$SERVER_PROPS" <<EOF
advertised.listeners=PLAINTEXT://$HOST:$PORT$SASL_LISTENER
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL
log.dirs=$DATA_DIR

# One broker: replication factor 1 everywhere.
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1

# Fast tests.
num.partitions=1
auto.create.topics.enable=true
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
offsets.topic.num.partitions=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.num.partitions=1
num.recovery.threads.per.data.dir=1

# Small heap: the log cleaner's dedupe buffer defaults to 128 MiB.
log.cleaner.dedupe.buffer.size=8388608
EOF
  if [[ "$SASL_SSL_PORT" != 0 ]]; then
    security_config >>"$SERVER_PROPS"
  fi
  if [[ -n "$EXTRA_CONFIG" ]]; then
    [[ -r "$EXTRA_CONFIG" ]] || die "EVENTFOLD_KAFKA_EXTRA_CONFIG=$EXTRA_CONFIG is not readable"
    {
      printf '\n# From EVENTFOLD_KAFKA_EXTRA_CONFIG=%s\n' "$EXTRA_CONFIG"
      cat "$EXTRA_CONFIG"
      printf '\n'
    } >>"$SERVER_PROPS"
  fi

  cat >"$LOG4J_CONF" <<EOF
# Generated by scripts/kafka/broker.sh: everything goes to stdout, i.e. $LOG_FILE.
status = warn
name = eventfold-kafka
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = $LOG_LEVEL
rootLogger.appenderRef.out.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.requestchannel.name = kafka.network.RequestChannel\$
logger.requestchannel.level = WARN
EOF
}

# Formats the storage of the node configured by $1 (default: the broker) in $2.
format_storage() {
  local props="${1:-$SERVER_PROPS}" data="${2:-$DATA_DIR}"
  if [[ "$KEEP_DATA" == 1 && -f "$data/meta.properties" ]]; then
    log "KEEP_DATA=1: keeping existing data in $data"
    return 0
  fi
  [[ "$KEEP_DATA" == 1 ]] && log "KEEP_DATA=1 but $data is not formatted yet"
  rm -rf "$data"
  mkdir -p "$data"
  local FEATURE_ARGS=()
  for f in ${EVENTFOLD_KAFKA_FEATURES:-}; do
    FEATURE_ARGS+=(--feature "$f")
  done
  # SCRAM credentials are metadata records: the format bootstraps them.
  if [[ "$SASL_SSL_PORT" != 0 ]]; then
    local u
    for u in "${SCRAM_USERS[@]}"; do
      FEATURE_ARGS+=(--add-scram "SCRAM-SHA-256=[name=${u%%:*},password=${u#*:}]")
    done
  fi
  log "formatting storage in $data (cluster id $CLUSTER_ID)${EVENTFOLD_KAFKA_FEATURES:+, features: $EVENTFOLD_KAFKA_FEATURES}"
  local fmt_log="$STATE_DIR/format.log"
  if ! "$JAVA" -Xms64m -Xmx256m -Dlog4j2.configurationFile="$LOG4J_CONF" -cp "$LIBS_DIR/*" \
    kafka.tools.StorageTool format -t "$CLUSTER_ID" -c "$props" "${FEATURE_ARGS[@]}" >"$fmt_log" 2>&1; then
    show_log_tail "$fmt_log"
    die "kafka.tools.StorageTool format failed (output: $fmt_log)"
  fi
}

# ---------------------------------------------------------------- start / stop

# Keeps the earlier runs' log $1 (as $1.1, $1.2, ...: a restart test that fails can
# still read what the broker did before each restart); a fresh start keeps only the last.
rotate_log() {
  local file="$1" n=1
  [[ "$KEEP_DATA" == 0 ]] && rm -f "$file".[0-9]*
  if [[ -f "$file" ]]; then
    while [[ -f "$file.$n" ]]; do n=$((n + 1)); done
    mv -f "$file" "$file.$n"
  fi
}

# Starts kafka.Kafka with properties $1 in the background, logging to $2; prints its pid.
launch() {
  local props="$1" logfile="$2"
  local -a heap jvm extra
  read -r -a heap <<<"$HEAP_OPTS"
  jvm=(-server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
    -XX:+ExplicitGCInvokesConcurrent -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true
    # Log4j's own shutdown hook would stop logging while the broker still shuts down:
    # what the broker does after SIGTERM (e.g. its transaction coordinator) is kept.
    -Dlog4j2.shutdownHookEnabled=false)
  read -r -a extra <<<"$EXTRA_JVM_OPTS"
  local -a launcher=()
  have setsid && launcher=(setsid) # own session: no signals from the caller's terminal/group
  (
    cd "$STATE_DIR"
    exec "${launcher[@]}" "$JAVA" "${heap[@]}" "${jvm[@]}" "${extra[@]}" \
      -Dlog4j2.configurationFile="$LOG4J_CONF" -Dkafka.logs.dir="$STATE_DIR/logs" \
      -cp "$LIBS_DIR/*" kafka.Kafka "$props"
  ) </dev/null >"$logfile" 2>&1 8>&- 9>&- &
  printf '%s\n' "$!"
}

# EVENTFOLD_KAFKA_CONTROLLER=separate: starts the controller unless it runs, and waits
# until its port accepts connections. Called with the state dir lock held.
start_controller() {
  local pid
  if pid="$(running_pid "$CTRL_PID_FILE")"; then
    return 0
  fi
  if port_open "$HOST" "$CONTROLLER_PORT"; then
    die "port $HOST:$CONTROLLER_PORT is already in use by another process (not the controller of $STATE_DIR); stop it or set EVENTFOLD_KAFKA_PORT"
  fi
  format_storage "$CTRL_PROPS" "$CTRL_DATA_DIR"
  rotate_log "$CTRL_LOG_FILE"
  log "starting the Kafka $KAFKA_VERSION controller on $HOST:$CONTROLLER_PORT, log: $CTRL_LOG_FILE"
  pid="$(launch "$CTRL_PROPS" "$CTRL_LOG_FILE")"
  printf '%s\n' "$pid" >"$CTRL_PID_FILE"
  local deadline=$((SECONDS + START_TIMEOUT))
  until port_open "$HOST" "$CONTROLLER_PORT"; do
    if ! kill -0 "$pid" 2>/dev/null || ((SECONDS >= deadline)); then
      show_log_tail "$CTRL_LOG_FILE"
      terminate "$pid"
      rm -f "$CTRL_PID_FILE"
      die "the Kafka controller did not accept connections on $HOST:$CONTROLLER_PORT (see $CTRL_LOG_FILE)"
    fi
    sleep 0.25
  done
}

cmd_start() {
  have "$JAVA" || die "Java ('$JAVA') not found: install a JDK 17+ (apt-get install -y openjdk-17-jre-headless) or set JAVA"
  mkdir -p "$STATE_DIR"
  lock 9 "$STATE_DIR/.lock"

  local pid
  if pid="$(running_pid)"; then
    if port_open "$HOST" "$PORT"; then
      log "broker already running (pid $pid) at $(cat "$BOOTSTRAP_FILE" 2>/dev/null || echo "$HOST:$PORT")"
      unlock 9
      return 0
    fi
    log "broker process $pid exists but its client port is closed: waiting for it"
  else
    rm -f "$PID_FILE"
    # A separate controller checks its own port (start_controller).
    local p ports=("$PORT")
    [[ "$SASL_SSL_PORT" != 0 ]] && ports+=("$SASL_SSL_PORT")
    [[ "$CONTROLLER_MODE" == combined ]] && ports+=("$CONTROLLER_PORT")
    for p in "${ports[@]}"; do
      if port_open "$HOST" "$p"; then
        die "port $HOST:$p is already in use by another process (not the broker of $STATE_DIR); stop it or set EVENTFOLD_KAFKA_PORT"
      fi
    done

    cmd_fetch
    write_config
    mkdir -p "$STATE_DIR/logs"
    [[ "$CONTROLLER_MODE" == separate ]] && start_controller
    format_storage
    rotate_log "$LOG_FILE"

    local where="in the same JVM"
    [[ "$CONTROLLER_MODE" == separate ]] && where="in its own JVM"
    log "starting Kafka $KAFKA_VERSION broker on $HOST:$PORT (controller $HOST:$CONTROLLER_PORT $where), log: $LOG_FILE"
    pid="$(launch "$SERVER_PROPS" "$LOG_FILE")"
    printf '%s\n' "$pid" >"$PID_FILE"
    printf '%s:%s\n' "$HOST" "$PORT" >"$BOOTSTRAP_FILE"
  fi

  local t0=$SECONDS deadline=$((SECONDS + START_TIMEOUT)) seen=0
  while :; do
    if ! is_broker_pid "$pid"; then
      # Right after the fork the child may not have exec'd java yet.
      if ((seen == 0)) && kill -0 "$pid" 2>/dev/null && ((SECONDS - t0 < 5)); then
        sleep 0.1
        continue
      fi
      wait "$pid" 2>/dev/null || true
      rm -f "$PID_FILE"
      show_log_tail
      unlock 9
      die "the Kafka broker exited during startup (see $LOG_FILE)"
    fi
    seen=1
    if port_open "$HOST" "$PORT"; then
      break
    fi
    if ((SECONDS >= deadline)); then
      show_log_tail
      log "stopping the broker that did not become ready"
      terminate "$pid"
      rm -f "$PID_FILE"
      unlock 9
      die "the Kafka broker did not accept connections on $HOST:$PORT within ${START_TIMEOUT}s (see $LOG_FILE; raise EVENTFOLD_KAFKA_START_TIMEOUT?)"
    fi
    sleep 0.25
  done
  unlock 9
  log "broker ready (pid $pid) after $((SECONDS - t0))s: bootstrap.servers=$HOST:$PORT"
  if [[ "$SASL_SSL_PORT" != 0 ]]; then
    log "SASL_SSL listener: $HOST:$SASL_SSL_PORT (SCRAM-SHA-256; CA $SSL_DIR/ca.pem)"
  fi
}

# Stops the process of pid file $1 (named $2 in the messages).
stop_process() {
  local file="$1" what="$2" pid
  if ! pid="$(running_pid "$file")"; then
    [[ -f "$file" ]] && log "removing stale pid file $file"
    rm -f "$file"
    log "$what not running (state dir $STATE_DIR)"
    return 0
  fi
  log "stopping $what (pid $pid): SIGTERM, up to ${STOP_TIMEOUT}s before SIGKILL"
  local t0=$SECONDS
  terminate "$pid"
  rm -f "$file"
  log "$what stopped after $((SECONDS - t0))s"
}

# Stops the broker, and with `all` its separate controller too.
cmd_stop() {
  mkdir -p "$STATE_DIR"
  lock 9 "$STATE_DIR/.lock"
  stop_process "$PID_FILE" broker
  if [[ "${1:-all}" == all && "$CONTROLLER_MODE" == separate ]]; then
    stop_process "$CTRL_PID_FILE" controller
  fi
  unlock 9
}

cmd_status() {
  local pid bootstrap
  bootstrap="$(cat "$BOOTSTRAP_FILE" 2>/dev/null || echo "$HOST:$PORT")"
  if pid="$(running_pid)"; then
    if port_open "${bootstrap%:*}" "${bootstrap##*:}"; then
      echo "running pid=$pid bootstrap=$bootstrap state_dir=$STATE_DIR"
    else
      echo "starting pid=$pid bootstrap=$bootstrap (client port not open yet) state_dir=$STATE_DIR"
    fi
    return 0
  fi
  echo "stopped bootstrap=$bootstrap state_dir=$STATE_DIR"
  return 3
}

cmd_acl() {
  fetch_complete || die "no Kafka jars yet: run start first"
  local conf="$STATE_DIR/log4j2-tools.properties"
  mkdir -p "$STATE_DIR"
  printf '%s\n' "status = warn" "appender.err.type = Console" "appender.err.name = STDERR" \
    "appender.err.target = SYSTEM_ERR" "appender.err.layout.type = PatternLayout" \
    "appender.err.layout.pattern = [%d] %p %m (%c)%n" "rootLogger.level = WARN" \
    "rootLogger.appenderRef.err.ref = STDERR" >"$conf"
  "$JAVA" -Xms32m -Xmx256m -Dlog4j2.configurationFile="$conf" -cp "$LIBS_DIR/*" \
    org.apache.kafka.tools.AclCommand --bootstrap-server "$HOST:$PORT" "$@"
}

cmd_logs() {
  [[ -f "$LOG_FILE" ]] || die "no broker log at $LOG_FILE"
  tail -n "$LOG_TAIL" "$LOG_FILE"
}

# ---------------------------------------------------------------- main

case "${1:-}" in
fetch) cmd_fetch ;;
start) cmd_start ;;
stop) cmd_stop all ;;
stop-broker)
  [[ "$CONTROLLER_MODE" == separate ]] || die "stop-broker needs EVENTFOLD_KAFKA_CONTROLLER=separate (the controller runs in the broker's JVM otherwise)"
  cmd_stop broker
  ;;
restart)
  cmd_stop
  KEEP_DATA=1
  cmd_start
  ;;
status) cmd_status ;;
logs) cmd_logs ;;
acl)
  shift
  cmd_acl "$@"
  ;;
-h | --help | help) usage ;;
"")
  usage
  exit 2
  ;;
*)
  log "unknown command: $1"
  usage
  exit 2
  ;;
esac
