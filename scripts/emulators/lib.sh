# shellcheck shell=bash
# lib.sh — helpers shared by install.sh, start.sh and stop.sh. Not meant to be run; sourced
# after env.sh. Defines functions only.

EMULATORS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export EMULATORS_DIR

say() { printf '[emulators] %s\n' "$*" >&2; }
die() { printf '[emulators] ERROR: %s\n' "$*" >&2; exit 1; }

ALL_EMULATORS=(localstripe mailpit json-server moto)

# parse_emulators ARG... — sets the global array EMULATORS from names (localstripe, mailpit,
# json-server, moto, all; default all) and the global map PORTS from NAME=PORT arguments
# (e.g. mailpit=8025). Returns 2 for -h/--help.
parse_emulators() {
  EMULATORS=()
  declare -gA PORTS=()
  local a name
  if [[ $# -eq 0 ]]; then set -- all; fi
  for a in "$@"; do
    name="${a%%=*}"
    case "$name" in
      localstripe | mailpit | json-server | moto) ;;
      all)
        [[ "$a" == all ]] || die "all takes no port"
        EMULATORS+=("${ALL_EMULATORS[@]}")
        continue
        ;;
      -h | --help) return 2 ;;
      *) die "unknown emulator '$a' (expected localstripe, mailpit, json-server, moto or all)" ;;
    esac
    if [[ "$a" == *=* ]]; then
      [[ "${a#*=}" =~ ^[0-9]+$ ]] || die "'$a': the port must be a number"
      # shellcheck disable=SC2034 # read by start.sh
      PORTS[$name]="${a#*=}"
    fi
    EMULATORS+=("$name")
  done
  # Each name once, in the order given.
  local -A seen=()
  local -a unique=()
  for name in "${EMULATORS[@]}"; do
    [[ -n "${seen[$name]:-}" ]] && continue
    seen[$name]=1
    unique+=("$name")
  done
  EMULATORS=("${unique[@]}")
}

# env_name NAME — json-server -> JSON_SERVER: the NAME part of SLUICE_EMU_<NAME>_URL.
env_name() { local n="${1^^}"; printf '%s\n' "${n//-/_}"; }

emu_run_dir() { printf '%s\n' "$SLUICE_EMULATORS_RUN/$1"; }
emu_log() { printf '%s\n' "$SLUICE_EMULATORS_RUN/$1/$1.log"; }
# The pid file sits beside (not inside) the run dir, so wiping the run dir can never lose the
# pid of a live process.
emu_pidfile() { printf '%s\n' "$SLUICE_EMULATORS_RUN/$1.pid"; }
# What start.sh printed for a running emulator (its export lines), kept for a second start.sh.
emu_exports() { printf '%s\n' "$SLUICE_EMULATORS_RUN/$1/exports.sh"; }

# Every emulator is started with SLUICE_EMULATOR=<its run dir> in its environment: that is
# how these scripts recognise their own process (whatever the program, python or node or go)
# and never signal another.
pid_matches() {
  local pid="$1" name="$2"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/$pid/environ" ]] || return 1
  { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qxF "SLUICE_EMULATOR=$(emu_run_dir "$name")"
}

# emu_pid NAME — prints the pid of our running instance, or returns 1. Trusts the pid file
# only if that process still carries our marker; otherwise looks for one that does.
emu_pid() {
  local name="$1" pidfile pid d
  pidfile="$(emu_pidfile "$name")"
  if [[ -f "$pidfile" ]]; then
    pid="$(<"$pidfile")"
    if pid_matches "$pid" "$name"; then
      printf '%s\n' "$pid"
      return 0
    fi
  fi
  for d in /proc/[0-9]*; do
    pid="${d#/proc/}"
    if pid_matches "$pid" "$name"; then
      printf '%s\n' "$pid"
      return 0
    fi
  done
  return 1
}

# proc_exited PID — true if PID is gone or a zombie (files and sockets closed).
proc_exited() {
  local state
  state="$(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null || true)"
  [[ -z "$state" || "$state" == Z ]]
}

# port_open PORT — true if something accepts TCP connections on 127.0.0.1:PORT.
port_open() {
  # shellcheck disable=SC2016 # $1 is expanded by the inner bash
  timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null
}

# free_ports N — prints N distinct loopback ports that nothing listens on now (all bound at
# once, then released, so they differ from each other).
free_ports() {
  "$SLUICE_EMULATORS_PYTHON" - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# safe_wipe DIR — rm -rf DIR, refusing obviously dangerous paths.
safe_wipe() {
  local dir="$1"
  [[ -n "$dir" && "$dir" == /* ]] || die "refusing to wipe non-absolute path '$dir'"
  case "${dir%/}" in
    "" | / | /root | /home | /tmp | /usr | /var | /etc | "$HOME" | "$SLUICE_EMULATORS_CACHE" | "$SLUICE_EMULATORS_RUN")
      die "refusing to wipe '$dir'"
      ;;
  esac
  rm -rf -- "$dir"
}

# stop_emulator NAME — SIGTERM our instance, wait up to 10 s, then SIGKILL; removes the pid
# file. Quiet success if it is not running.
stop_emulator() {
  local name="$1" pid waited=0
  if ! pid="$(emu_pid "$name")"; then
    say "$name: not running"
    rm -f "$(emu_pidfile "$name")"
    return 0
  fi
  say "$name: stopping pid $pid"
  kill -TERM "$pid" 2>/dev/null || true
  while ! proc_exited "$pid" && ((waited < 20)); do
    sleep 0.5
    waited=$((waited + 1))
  done
  if ! proc_exited "$pid"; then
    say "$name: still alive after 10 s, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    waited=0
    while ! proc_exited "$pid" && ((waited < 20)); do
      sleep 0.5
      waited=$((waited + 1))
    done
    proc_exited "$pid" || die "$name: pid $pid survived SIGKILL"
  fi
  rm -f "$(emu_pidfile "$name")" "$(emu_exports "$name")"
  say "$name: stopped"
}
