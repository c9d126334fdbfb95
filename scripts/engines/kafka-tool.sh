#!/usr/bin/env bash
# kafka-tool.sh TOOL [ARG...] — runs a Kafka command-line tool from the jars that
# install.sh cached (there is no Kafka distribution with bin/*.sh here).
# TOOL is a short name or a fully qualified main class:
#   topics            org.apache.kafka.tools.TopicCommand
#   console-producer  org.apache.kafka.tools.ConsoleProducer
#   console-consumer  org.apache.kafka.tools.consumer.ConsoleConsumer
#   consumer-groups   org.apache.kafka.tools.consumer.group.ConsumerGroupCommand
#   metadata-quorum   org.apache.kafka.tools.MetadataQuorumCommand
#   storage           kafka.tools.StorageTool
# Example:
#   scripts/engines/kafka-tool.sh topics --bootstrap-server "$SLUICE_TEST_KAFKA_BROKERS" --list
# Logging: warnings to stderr (conf/tools-log4j2.xml).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
. "$HERE/env.sh"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi

tool="$1"
shift
case "$tool" in
  topics) cls=org.apache.kafka.tools.TopicCommand ;;
  console-producer) cls=org.apache.kafka.tools.ConsoleProducer ;;
  console-consumer) cls=org.apache.kafka.tools.consumer.ConsoleConsumer ;;
  consumer-groups) cls=org.apache.kafka.tools.consumer.group.ConsumerGroupCommand ;;
  metadata-quorum) cls=org.apache.kafka.tools.MetadataQuorumCommand ;;
  storage) cls=kafka.tools.StorageTool ;;
  *.*) cls="$tool" ;;
  *) die "unknown tool '$tool' (see --help)" ;;
esac

kafka_tool "$cls" "$@"
