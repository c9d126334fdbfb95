#!/usr/bin/env bash
# cql-query.sh — runs one CQL query against the test Cassandra and prints the
# printable text of the result, using a tiny native-protocol-v4 client written
# in bash (/dev/tcp + dd + od): no driver, no cqlsh, nothing to install.
#
#   scripts/engines/cql-query.sh "SELECT release_version FROM system.local"
#
# Address: $SLUICE_CQL_HOST (default 127.0.0.1) and $SLUICE_CQL_PORT (default
# 19042, from env.sh). Consistency ONE, no
# paging, no bind values. Exit 0 on a RESULT frame, 1 on an ERROR frame (the
# server's message goes to stderr) or on a connection/timeout problem.
# SLUICE_CQL_QUERY_TLS=1 talks TLS through `openssl s_client` with the test
# CA and client certificate of $SLUICE_ENGINES_PKI; SLUICE_CQL_QUERY_USER and
# SLUICE_CQL_QUERY_PASSWORD answer a PasswordAuthenticator (SASL PLAIN).
# It is a readiness probe and a debugging aid, not a general CQL client: the
# output is the raw result body with non-printable bytes shown as spaces.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
. "$HERE/env.sh"

if [[ $# -ne 1 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi

# Bound the whole exchange: re-run under timeout(1) once.
if [[ -z "${_SLUICE_CQL_TIMED:-}" ]]; then
  _SLUICE_CQL_TIMED=1 exec timeout "${SLUICE_CQL_QUERY_TIMEOUT:-20}" "$0" "$@"
fi

QUERY="$1"
PORT="$SLUICE_CQL_PORT"
HOST="${SLUICE_CQL_HOST:-127.0.0.1}"
BODY="$(mktemp)"
# s_client (TLS) ignores the end of its input and would hold the connection: stop it at exit.
trap 'rm -f "$BODY"; if [[ -n "${TLS_PID:-}" ]]; then kill "$TLS_PID" 2>/dev/null || true; fi' EXIT
OPCODE=""

# read_frame FD — reads one frame header + body; sets OPCODE, body into $BODY.
read_frame() {
  local fd="$1" len
  local -a h
  read -r -a h < <(dd bs=9 count=1 iflag=fullblock status=none <&"$fd" | od -An -v -tu1)
  [[ ${#h[@]} -eq 9 ]] || { echo "cql: short frame header from $HOST:$PORT" >&2; return 1; }
  OPCODE="${h[4]}"
  len=$(((h[5] << 24) | (h[6] << 16) | (h[7] << 8) | h[8]))
  if ((len > 0)); then
    dd bs="$len" count=1 iflag=fullblock status=none <&"$fd" >"$BODY"
  else
    : >"$BODY"
  fi
}

# be32 N — N as printf escapes of a 4-byte big-endian int.
be32() {
  printf '\\x%02x\\x%02x\\x%02x\\x%02x' \
    $((($1 >> 24) & 255)) $((($1 >> 16) & 255)) $((($1 >> 8) & 255)) $(($1 & 255))
}

# IN is read from, OUT written to: one socket, or the pipes of openssl s_client.
if [[ "${SLUICE_CQL_QUERY_TLS:-0}" == 1 ]]; then
  PKI="$SLUICE_ENGINES_PKI"
  coproc TLS {
    exec openssl s_client -quiet -verify_return_error -connect "$HOST:$PORT" \
      -CAfile "$PKI/ca.pem" -cert "$PKI/client.pem" -key "$PKI/client.key" 2>/dev/null
  }
  # Copies: bash does not hand a coprocess's own descriptors to subshells (read_frame's).
  exec {IN}<&"${TLS[0]}" {OUT}>&"${TLS[1]}"
else
  exec {FD}<>"/dev/tcp/$HOST/$PORT"
  IN="$FD"
  OUT="$FD"
fi

# STARTUP (opcode 0x01), stream 1, body = string map {CQL_VERSION: "3.0.0"}.
printf '\x04\x00\x00\x01\x01\x00\x00\x00\x16\x00\x01\x00\x0bCQL_VERSION\x00\x053.0.0' >&"$OUT"
read_frame "$IN"
if [[ "$OPCODE" == 3 ]]; then # 0x03 AUTHENTICATE: SASL PLAIN in one AUTH_RESPONSE (0x0F)
  [[ -n "${SLUICE_CQL_QUERY_USER:-}" ]] || { echo "cql: the server asks for a password (set SLUICE_CQL_QUERY_USER/PASSWORD)" >&2; exit 1; }
  TOKEN="$(printf '\\x00%s\\x00%s' "$SLUICE_CQL_QUERY_USER" "${SLUICE_CQL_QUERY_PASSWORD:-}")"
  TLEN=$((${#SLUICE_CQL_QUERY_USER} + ${#SLUICE_CQL_QUERY_PASSWORD} + 2))
  # shellcheck disable=SC2059 # the format string is assembled from escapes on purpose
  printf "\\x04\\x00\\x00\\x01\\x0f$(be32 $((TLEN + 4)))$(be32 "$TLEN")$TOKEN" >&"$OUT"
  read_frame "$IN"
  if [[ "$OPCODE" != 16 ]]; then # 0x10 AUTH_SUCCESS
    echo "cql: authentication failed (opcode $OPCODE): $(tr -cd '[:print:]' <"$BODY")" >&2
    exit 1
  fi
elif [[ "$OPCODE" != 2 ]]; then # 0x02 READY
  echo "cql: STARTUP answered with opcode $OPCODE: $(tr -cd '[:print:]' <"$BODY")" >&2
  exit 1
fi

# QUERY (opcode 0x07), stream 2, body = [long string query][short consistency
# ONE = 0x0001][byte flags = 0]. Byte length of the query, not char count.
QLEN="$(printf '%s' "$QUERY" | wc -c)"
# shellcheck disable=SC2059 # the format string is assembled from escapes on purpose
printf "\\x04\\x00\\x00\\x02\\x07$(be32 $((QLEN + 7)))$(be32 "$QLEN")%s\\x00\\x01\\x00" "$QUERY" >&"$OUT"
read_frame "$IN"
if [[ -n "${FD:-}" ]]; then exec {FD}>&-; fi

if [[ "$OPCODE" == 8 ]]; then # 0x08 RESULT
  tr -c '[:print:]' ' ' <"$BODY" | tr -s ' '
  echo
else
  echo "cql: query failed (opcode $OPCODE): $(tr -cd '[:print:]' <"$BODY")" >&2
  exit 1
fi
