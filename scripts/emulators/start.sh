#!/usr/bin/env bash
# start.sh [NAME[=PORT] ...] — starts API emulators in the background on 127.0.0.1 and waits
# until each really answers (default all; NAME is localstripe, mailpit, json-server, moto or
# all). Each listens on PORT if given (or $SLUICE_EMU_<NAME>_PORT, e.g.
# SLUICE_EMU_JSON_SERVER_PORT), else on a free loopback port:
#   localstripe  localstripe-serve.py (beside this script): localstripe's app on 127.0.0.1,
#                its state in memory only. Ready = GET /v1/balance with a test key answers 200.
#   mailpit      HTTP API and UI, plus SMTP on $SLUICE_EMU_MAILPIT_SMTP_PORT or a free port;
#                basic auth on the UI and the whole API (--ui-auth-file: an htpasswd file with
#                $SLUICE_EMU_MAILPIT_USER and a generated password), the database in the run
#                dir, no pruning (--max 0), no release check. Ready = GET /readyz answers 200
#                and GET /api/v1/info answers 200 with the credentials.
#   json-server  the db file $SLUICE_EMU_JSON_SERVER_DB copied into the run dir, or a new
#                one holding {"records": []}. Ready = GET /db answers 200.
#   moto         moto_server (all AWS services in one process). It checks no signature
#                unless started with INITIAL_NO_AUTH_ACTION_COUNT=N in the environment (the
#                first N calls unchecked, then SigV4 against its own IAM access keys; also
#                settable later: POST /moto-api/reset-auth with N as the body). Ready = GET
#                /moto-api/data.json answers 200.
# Runs install.sh first (a no-op when installed). A fresh start wipes the emulator's run dir
# ($SLUICE_EMULATORS_RUN/<name>: its log, data and config); the pid file is beside it. An
# emulator that is already running is left alone and its lines printed again. On a timeout or
# crash: prints the log tail, stops it, exits 1.
# Prints on stdout, for `eval "$(scripts/emulators/start.sh ...)"`:
#   export SLUICE_EMU_<NAME>_URL=http://127.0.0.1:PORT
#   (mailpit also SLUICE_EMU_MAILPIT_SMTP=127.0.0.1:PORT, SLUICE_EMU_MAILPIT_USER and
#   SLUICE_EMU_MAILPIT_PASSWORD). Progress goes to stderr. Stop with stop.sh.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
. "$HERE/env.sh"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; }
parse_emulators "$@" || { usage; exit 0; }

TIMEOUT="$SLUICE_EMULATORS_START_TIMEOUT"
VENV="$SLUICE_EMULATORS_VENV"

# fail NAME MESSAGE — log tail, stop, exit 1.
fail() {
  local name="$1" msg="$2" log
  log="$(emu_log "$name")"
  printf '[emulators] ERROR: %s: %s\n' "$name" "$msg" >&2
  if [[ -s "$log" ]]; then
    printf '[emulators] ---- last 40 lines of %s ----\n' "$log" >&2
    tail -n 40 "$log" >&2
  fi
  stop_emulator "$name" || true
  die "$name did not start (log kept in $log)"
}

# answers CODE CURL-ARGS... — true if the request answers HTTP CODE.
answers() {
  local code="$1"
  shift
  [[ "$(curl -sS -o /dev/null -m 5 -w '%{http_code}' "$@" 2>/dev/null)" == "$code" ]]
}

# port_for NAME — the port asked for (argument, then environment), or "" for a free one.
port_for() {
  local var
  var="SLUICE_EMU_$(env_name "$1")_PORT"
  printf '%s\n' "${PORTS[$1]:-${!var:-}}"
}

# spawn NAME CMD... — runs CMD in the background in the emulator's run dir, marked with
# SLUICE_EMULATOR=<run dir> (lib.sh recognises it by that), its output in its log, without the
# start lock's descriptor (it would hold the lock for its whole life).
spawn() {
  local name="$1" run
  shift
  run="$(emu_run_dir "$name")"
  (cd "$run" && SLUICE_EMULATOR="$run" exec nohup "$@" </dev/null >"$(emu_log "$name")" 2>&1 {START_LOCK}>&-) &
  echo $! >"$(emu_pidfile "$name")"
}

# ---------------------------------------------------------------- launchers --
# NAME_launch PORT... writes the export lines to the run dir's exports.sh, then spawns.
# NAME_ready reads them back and is true once the emulator answers.

localstripe_launch() {
  local port="$1"
  echo "export SLUICE_EMU_LOCALSTRIPE_URL=http://127.0.0.1:$port" >"$(emu_exports localstripe)"
  spawn localstripe "$VENV/bin/python" "$HERE/localstripe-serve.py" --host 127.0.0.1 --port "$port"
}
localstripe_ready() {
  answers 200 -H "Authorization: Bearer sk_test_sluice_ready" "$SLUICE_EMU_LOCALSTRIPE_URL/v1/balance"
}

mailpit_launch() {
  local port="$1" smtp="$2" run password hash
  run="$(emu_run_dir mailpit)"
  password="${SLUICE_EMU_MAILPIT_PASSWORD:-$(head -c 18 /dev/urandom | base64 | tr -d '+/=')}"
  # Apache's MD5 ($apr1$), one of the htpasswd hashes mailpit's go-htpasswd reads.
  hash="$(openssl passwd -apr1 -stdin <<<"$password")" || die "mailpit: openssl passwd failed"
  (umask 077 && printf '%s:%s\n' "$SLUICE_EMU_MAILPIT_USER" "$hash" >"$run/ui-auth")
  (
    umask 077
    cat >"$(emu_exports mailpit)" <<EOS
export SLUICE_EMU_MAILPIT_URL=http://127.0.0.1:$port
export SLUICE_EMU_MAILPIT_SMTP=127.0.0.1:$smtp
export SLUICE_EMU_MAILPIT_USER=$SLUICE_EMU_MAILPIT_USER
export SLUICE_EMU_MAILPIT_PASSWORD=$password
EOS
  )
  spawn mailpit "$SLUICE_EMULATORS_BIN/mailpit" \
    --listen "127.0.0.1:$port" --smtp "127.0.0.1:$smtp" \
    --database "$run/mailpit.db" --ui-auth-file "$run/ui-auth" \
    --max 0 --disable-version-check --smtp-disable-rdns
}
mailpit_ready() {
  answers 200 "$SLUICE_EMU_MAILPIT_URL/readyz" &&
    answers 200 -u "$SLUICE_EMU_MAILPIT_USER:$SLUICE_EMU_MAILPIT_PASSWORD" "$SLUICE_EMU_MAILPIT_URL/api/v1/info"
}

json-server_launch() {
  local port="$1" run
  run="$(emu_run_dir json-server)"
  if [[ -n "${SLUICE_EMU_JSON_SERVER_DB:-}" ]]; then
    cp -- "$SLUICE_EMU_JSON_SERVER_DB" "$run/db.json" || die "json-server: cannot copy $SLUICE_EMU_JSON_SERVER_DB"
  else
    echo '{"records": []}' >"$run/db.json"
  fi
  echo "export SLUICE_EMU_JSON_SERVER_URL=http://127.0.0.1:$port" >"$(emu_exports json-server)"
  # In the run dir: json-server reads ./json-server.json and serves ./public when they exist.
  spawn json-server "$SLUICE_EMULATORS_NODE/node_modules/.bin/json-server" \
    --host 127.0.0.1 --port "$port" "$run/db.json"
}
json-server_ready() { answers 200 "$SLUICE_EMU_JSON_SERVER_URL/db"; }

moto_launch() {
  local port="$1"
  echo "export SLUICE_EMU_MOTO_URL=http://127.0.0.1:$port" >"$(emu_exports moto)"
  spawn moto "$VENV/bin/moto_server" -H 127.0.0.1 -p "$port"
}
moto_ready() { answers 200 "$SLUICE_EMU_MOTO_URL/moto-api/data.json"; }

# ------------------------------------------------------------------ main -----

# launch NAME — starts it unless already running; sets LAUNCH_STATE to running or started.
launch() {
  local name="$1" run pid p
  local -a ports
  if pid="$(emu_pid "$name")" && [[ -s "$(emu_exports "$name")" ]]; then
    echo "$pid" >"$(emu_pidfile "$name")" # in case it was lost
    p="$(port_for "$name")"
    if [[ -n "$p" ]] && ! grep -q "_URL=http://127.0.0.1:$p\$" "$(emu_exports "$name")"; then
      die "$name: already running (pid $pid) on another port than $p: stop.sh $name first"
    fi
    LAUNCH_STATE=running
    return 0
  fi
  read -r -a ports <<<"$(port_for "$name")"
  if [[ -z "${ports[0]:-}" ]]; then read -r -a ports <<<"$(free_ports 1)"; fi
  if [[ "$name" == mailpit ]]; then
    ports+=("${SLUICE_EMU_MAILPIT_SMTP_PORT:-$(free_ports 1)}")
    ((ports[1] != ports[0])) || ports[1]="$(free_ports 1)"
  fi
  for p in "${ports[@]}"; do
    if port_open "$p"; then
      die "$name: port 127.0.0.1:$p is already in use: $(ss -Hltnp "sport = :$p" 2>/dev/null | head -n 1)"
    fi
  done
  run="$(emu_run_dir "$name")"
  safe_wipe "$run"
  mkdir -p "$run"
  "${name}_launch" "${ports[@]}"
  LAUNCH_STATE=started
}

# wait_ready NAME START — until NAME_ready holds, the process dies, or the timeout passes.
wait_ready() {
  local name="$1" start="$2" pid
  # shellcheck disable=SC1090 # the run dir's own export lines
  . "$(emu_exports "$name")"
  until "${name}_ready"; do
    pid="$(emu_pid "$name")" || fail "$name" "the process exited during startup"
    ((SECONDS - start < TIMEOUT)) || fail "$name" "no answer after $TIMEOUT s"
    sleep 0.2
  done
  say "$name: ready in $((SECONDS - start)) s, pid $(emu_pid "$name")"
}

version_of() {
  case "$1" in
    localstripe) echo "$SLUICE_LOCALSTRIPE_VERSION" ;;
    mailpit) echo "$SLUICE_MAILPIT_VERSION" ;;
    json-server) echo "$SLUICE_JSON_SERVER_VERSION" ;;
    moto) echo "$SLUICE_MOTO_VERSION" ;;
  esac
}

command -v curl >/dev/null || die "curl not found (the readiness checks use it)"
case " ${EMULATORS[*]} " in
  *" mailpit "*) command -v openssl >/dev/null || die "openssl not found (mailpit's htpasswd file)" ;;
esac
"$HERE/install.sh" "${EMULATORS[@]}"

# One start.sh at a time, so two callers never wipe each other's run dir; the second one then
# finds the emulators running.
mkdir -p "$SLUICE_EMULATORS_RUN"
exec {START_LOCK}>"$SLUICE_EMULATORS_RUN/.start.lock"
flock -w 300 "$START_LOCK" || die "another start.sh has held $SLUICE_EMULATORS_RUN/.start.lock for 5 min"

declare -A state started_at
for name in "${EMULATORS[@]}"; do
  started_at[$name]=$SECONDS
  launch "$name"
  state[$name]="$LAUNCH_STATE"
  [[ "$LAUNCH_STATE" == running ]] && say "$name: already running (pid $(emu_pid "$name")), checking it answers"
done
# All of them boot in parallel; wait for each in turn.
for name in "${EMULATORS[@]}"; do
  wait_ready "$name" "${started_at[$name]}"
done

for name in "${EMULATORS[@]}"; do
  echo "# $name $(version_of "$name") ${state[$name]/running/already running}"
  cat "$(emu_exports "$name")"
done
