#!/bin/bash
# sluice-healthcheck PORT [PATH]: exits 0 when http://127.0.0.1:PORT/PATH answers 2xx.
#
# For container healthchecks (docker compose): the runtime image has no curl or wget, and bash's
# /dev/tcp is enough for one GET. Kubernetes probes call the HTTP endpoints directly and do not
# use this script. PATH defaults to /readyz.
set -euo pipefail
port=${1:?usage: sluice-healthcheck PORT [PATH]}
path=${2:-/readyz}
exec 3<>"/dev/tcp/127.0.0.1/${port}"
printf 'GET %s HTTP/1.1\r\nHost: 127.0.0.1:%s\r\nConnection: close\r\n\r\n' "$path" "$port" >&3
IFS= read -r -t 5 status <&3
[[ $status =~ ^HTTP/1\.[01]\ 2[0-9][0-9] ]]
