# shellcheck shell=bash
# env.sh — source this (". scripts/engines/env.sh") to get the addresses of the
# test engines that start.sh runs (single-node Kafka in KRaft mode, Cassandra 5),
# of the 3-node clusters that cluster.sh runs, and the paths where install.sh
# caches their jars and start.sh / cluster.sh keep their data.
#
# Every value can be overridden by setting it before sourcing. Nothing here
# touches the disk or the network. Safe to source under `set -euo pipefail`.

# Where the jars and the private Maven repository live (outside the clone).
export SLUICE_ENGINES_CACHE="${SLUICE_ENGINES_CACHE:-$HOME/.cache/sluice/engines}"
# Runtime data (configs, data dirs, logs, pid files); wiped on each fresh start.
export SLUICE_ENGINES_RUN="${SLUICE_ENGINES_RUN:-$SLUICE_ENGINES_CACHE/run}"
export SLUICE_KAFKA_RUN="${SLUICE_KAFKA_RUN:-$SLUICE_ENGINES_RUN/kafka}"
export SLUICE_CASSANDRA_RUN="${SLUICE_CASSANDRA_RUN:-$SLUICE_ENGINES_RUN/cassandra}"
export SLUICE_CASSANDRA_TLS_RUN="${SLUICE_CASSANDRA_TLS_RUN:-$SLUICE_ENGINES_RUN/cassandra-tls}"

# Versions fetched from Maven Central.
export SLUICE_KAFKA_VERSION="${SLUICE_KAFKA_VERSION:-4.1.1}"
export SLUICE_CASSANDRA_VERSION="${SLUICE_CASSANDRA_VERSION:-5.0.9}"
export SLUICE_KAFKA_LIB="${SLUICE_KAFKA_LIB:-$SLUICE_ENGINES_CACHE/kafka-$SLUICE_KAFKA_VERSION/lib}"
export SLUICE_CASSANDRA_LIB="${SLUICE_CASSANDRA_LIB:-$SLUICE_ENGINES_CACHE/cassandra-$SLUICE_CASSANDRA_VERSION/lib}"

# Loopback ports, chosen away from the engines' defaults so nothing collides.
export SLUICE_KAFKA_PORT="${SLUICE_KAFKA_PORT:-19092}"
export SLUICE_KAFKA_CONTROLLER_PORT="${SLUICE_KAFKA_CONTROLLER_PORT:-19093}"
export SLUICE_CQL_PORT="${SLUICE_CQL_PORT:-19042}"
export SLUICE_CASSANDRA_STORAGE_PORT="${SLUICE_CASSANDRA_STORAGE_PORT:-17000}"
export SLUICE_CASSANDRA_JMX_PORT="${SLUICE_CASSANDRA_JMX_PORT:-17199}"

# TLS and authentication (SLUICE_ENGINES_TLS=1, the default; 0 leaves all of it out):
# start.sh makes a test CA, a server certificate (localhost, 127.0.0.1) and a client
# certificate with openssl (and a truststore with the JDK's keytool) into SLUICE_ENGINES_PKI;
# Kafka gets a SASL_SSL listener with a PLAIN and a SCRAM-SHA-512 user; "cassandra-tls" is a
# second Cassandra node that takes only TLS with a client certificate and
# PasswordAuthenticator. Test-only credentials: nothing here protects anything.
export SLUICE_ENGINES_TLS="${SLUICE_ENGINES_TLS:-1}"
export SLUICE_ENGINES_PKI="${SLUICE_ENGINES_PKI:-$SLUICE_ENGINES_RUN/pki}"
export SLUICE_KAFKA_SASL_PORT="${SLUICE_KAFKA_SASL_PORT:-19094}"
export SLUICE_CQL_TLS_PORT="${SLUICE_CQL_TLS_PORT:-19142}"
export SLUICE_CASSANDRA_TLS_STORAGE_PORT="${SLUICE_CASSANDRA_TLS_STORAGE_PORT:-17100}"
export SLUICE_CASSANDRA_TLS_JMX_PORT="${SLUICE_CASSANDRA_TLS_JMX_PORT:-17299}"
export SLUICE_TEST_KAFKA_PLAIN_USER="${SLUICE_TEST_KAFKA_PLAIN_USER:-sluiceplain}"
export SLUICE_TEST_KAFKA_PLAIN_PASSWORD="${SLUICE_TEST_KAFKA_PLAIN_PASSWORD:-plain-test-password}"
export SLUICE_TEST_KAFKA_SCRAM_USER="${SLUICE_TEST_KAFKA_SCRAM_USER:-sluicescram}"
export SLUICE_TEST_KAFKA_SCRAM_PASSWORD="${SLUICE_TEST_KAFKA_SCRAM_PASSWORD:-scram-test-password}"
export SLUICE_TEST_CQL_USER="${SLUICE_TEST_CQL_USER:-sluice}"
export SLUICE_TEST_CQL_PASSWORD="${SLUICE_TEST_CQL_PASSWORD:-cql-test-password}"

# Heaps (small on purpose: the machine has 2 cores and is shared with builds).
# *_HEAP is -Xmx, *_HEAP_MIN is -Xms (lower than -Xmx so an idle engine keeps
# a smaller resident set). *_JVM_OPTS (unset by default) are appended as-is.
export SLUICE_KAFKA_HEAP="${SLUICE_KAFKA_HEAP:-512m}"
export SLUICE_KAFKA_HEAP_MIN="${SLUICE_KAFKA_HEAP_MIN:-256m}"
export SLUICE_CASSANDRA_HEAP="${SLUICE_CASSANDRA_HEAP:-1g}"
export SLUICE_CASSANDRA_HEAP_MIN="${SLUICE_CASSANDRA_HEAP_MIN:-256m}"
# The TLS node holds only the TLS tests' few keyspaces.
export SLUICE_CASSANDRA_TLS_HEAP="${SLUICE_CASSANDRA_TLS_HEAP:-512m}"

# What the integration tests read.
export SLUICE_TEST_KAFKA_BROKERS="127.0.0.1:${SLUICE_KAFKA_PORT}"
export SLUICE_TEST_CQL_NODES="127.0.0.1:${SLUICE_CQL_PORT}"
export SLUICE_TEST_KAFKA_SASL_BROKERS="127.0.0.1:${SLUICE_KAFKA_SASL_PORT}"
export SLUICE_TEST_CQL_TLS_NODES="127.0.0.1:${SLUICE_CQL_TLS_PORT}"
export SLUICE_TEST_TLS_DIR="$SLUICE_ENGINES_PKI"

# The authorizing broker of kafka-secure.sh (StandardAuthorizer, SASL PLAIN users and an
# OAUTHBEARER listener), for the access tests: ports, run dir and pid file of its own.
export SLUICE_KAFKA_SECURE_RUN="${SLUICE_KAFKA_SECURE_RUN:-$SLUICE_ENGINES_RUN/kafka-secure}"
export SLUICE_KAFKA_SECURE_PORT="${SLUICE_KAFKA_SECURE_PORT:-29092}"
export SLUICE_KAFKA_SECURE_CONTROLLER_PORT="${SLUICE_KAFKA_SECURE_CONTROLLER_PORT:-29093}"
export SLUICE_KAFKA_SECURE_OAUTH_PORT="${SLUICE_KAFKA_SECURE_OAUTH_PORT:-29094}"
export SLUICE_TEST_KAFKA_SECURE_BROKERS="127.0.0.1:${SLUICE_KAFKA_SECURE_PORT}"
export SLUICE_TEST_KAFKA_SECURE_OAUTH_BROKERS="127.0.0.1:${SLUICE_KAFKA_SECURE_OAUTH_PORT}"

# The clusters of cluster.sh: 3 Cassandra nodes on 127.0.0.1, .2 and .3 (the
# same CQL and storage ports on each address, a JMX port each, since JMX binds
# 127.0.0.1 only), and 3 Kafka brokers in KRaft combined mode on 127.0.0.1,
# node N on the base ports + 100*(N-1). Ports, data and pid files all apart from
# the single-node engines above, so both can run at once.
export SLUICE_CLUSTER_RUN="${SLUICE_CLUSTER_RUN:-$SLUICE_ENGINES_CACHE/run-cluster}"
export SLUICE_CLUSTER_CQL_PORT="${SLUICE_CLUSTER_CQL_PORT:-24042}"
export SLUICE_CLUSTER_STORAGE_PORT="${SLUICE_CLUSTER_STORAGE_PORT:-24700}"
export SLUICE_CLUSTER_JMX_PORT="${SLUICE_CLUSTER_JMX_PORT:-24199}"
export SLUICE_CLUSTER_KAFKA_PORT="${SLUICE_CLUSTER_KAFKA_PORT:-24092}"
export SLUICE_CLUSTER_KAFKA_CONTROLLER_PORT="${SLUICE_CLUSTER_KAFKA_CONTROLLER_PORT:-24093}"
# Six JVMs on 2 cores and 24 GiB beside the builds: small heaps.
export SLUICE_CLUSTER_CASSANDRA_HEAP="${SLUICE_CLUSTER_CASSANDRA_HEAP:-640m}"
export SLUICE_CLUSTER_CASSANDRA_HEAP_MIN="${SLUICE_CLUSTER_CASSANDRA_HEAP_MIN:-256m}"
export SLUICE_CLUSTER_KAFKA_HEAP="${SLUICE_CLUSTER_KAFKA_HEAP:-384m}"
export SLUICE_CLUSTER_KAFKA_HEAP_MIN="${SLUICE_CLUSTER_KAFKA_HEAP_MIN:-128m}"
export SLUICE_TEST_CLUSTER_CQL_NODES="127.0.0.1:${SLUICE_CLUSTER_CQL_PORT},127.0.0.2:${SLUICE_CLUSTER_CQL_PORT},127.0.0.3:${SLUICE_CLUSTER_CQL_PORT}"
export SLUICE_TEST_CLUSTER_KAFKA_BROKERS="127.0.0.1:${SLUICE_CLUSTER_KAFKA_PORT},127.0.0.1:$((SLUICE_CLUSTER_KAFKA_PORT + 100)),127.0.0.1:$((SLUICE_CLUSTER_KAFKA_PORT + 200))"
