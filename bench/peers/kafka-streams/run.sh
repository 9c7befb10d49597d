#!/usr/bin/env bash
# Launches the Kafka Streams peer, building target/ks-peer.jar first if it is missing or
# older than any source file or the pom. All arguments go to the app (see --help).
#   KS_PEER_JAVA_OPTS  extra JVM options (e.g. "-Xmx2g" or
#                      "-Dorg.slf4j.simpleLogger.defaultLogLevel=info")
#   JAVA, MVN          executables (default: java, mvn)
set -euo pipefail

DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
JAR="$DIR/target/ks-peer.jar"
JAVA="${JAVA:-java}"
MVN="${MVN:-mvn}"

stale() {
  [[ ! -f "$JAR" ]] && return 0
  [[ "$DIR/pom.xml" -nt "$JAR" ]] && return 0
  [[ -n "$(find "$DIR/src/main" -newer "$JAR" -type f -print -quit)" ]]
}

if stale; then
  echo "ks-peer: building $JAR" >&2
  # stdout of the build goes to stderr: stdout is reserved for the READY line.
  # (Debian's Maven prints colour resets even in batch mode: strip them.)
  "$MVN" -q -B -Dstyle.color=never -DskipTests -f "$DIR/pom.xml" package 2>&1 |
    sed 's/\x1b\[[0-9;]*m//g' >&2
fi

# shellcheck disable=SC2086 # word splitting of the options is intended
exec "$JAVA" ${KS_PEER_JAVA_OPTS:-} -jar "$JAR" "$@"
