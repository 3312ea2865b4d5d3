#!/bin/sh
# The surge image's entrypoint: `agent` runs one node agent, `controller` runs `surge serve`
# joining the agents (--launcher static); anything else runs as given (e.g. `surge --help`).
# Settings come from the environment (compose, a Kubernetes pod spec); the cluster token is
# a file (SURGE_TOKEN_FILE, a mounted Secret), never an argument. TLS is on when the three
# files in SURGE_TLS_DIR exist (<role>.pem, <role>.key, ca.pem; `surge node certs` names).
set -eu

role="${1:-}"
[ "$#" -gt 0 ] && shift

tls_args() {
    dir="${SURGE_TLS_DIR:-/etc/surge/tls}"
    if [ -f "$dir/$1.pem" ] && [ -f "$dir/$1.key" ] && [ -f "$dir/ca.pem" ]; then
        printf '%s\n' --tls-cert "$dir/$1.pem" --tls-key "$dir/$1.key" --tls-ca "$dir/ca.pem"
    elif [ "${SURGE_ALLOW_PLAIN:-0}" = 1 ]; then
        if [ "$1" = agent ]; then
            printf '%s\n' --allow-plain  # frames in clear, as asked
        fi
    else
        echo "error: no TLS files in $dir ($1.pem, $1.key, ca.pem); make them with" \
             "'surge node certs', or set SURGE_ALLOW_PLAIN=1 to run without TLS" >&2
        exit 2
    fi
}

node_id() {
    # SURGE_NODE_ID, else the ordinal a StatefulSet puts at the end of the pod's name.
    if [ -n "${SURGE_NODE_ID:-}" ]; then
        echo "$SURGE_NODE_ID"
        return
    fi
    name="${POD_NAME:-$(hostname)}"
    ordinal="${name##*-}"
    case "$ordinal" in
        '' | *[!0-9]*)
            echo "error: set SURGE_NODE_ID (pod name $name ends in no ordinal)" >&2
            exit 2 ;;
    esac
    echo "$ordinal"
}

token_file="${SURGE_TOKEN_FILE:-/etc/surge/token/token}"
state="${SURGE_STATE_DIR:-/var/lib/surge/state}"

case "$role" in
    agent)
        id="$(node_id)"
        tls="$(tls_args agent)"
        # shellcheck disable=SC2086  # tls holds whole arguments, one a line, no spaces
        exec surge node run --node-id "$id" \
            --host "${SURGE_HOST:-0.0.0.0}" --port "${SURGE_PORT:-7070}" \
            --disk-dir "${SURGE_DISK_DIR:-/var/lib/surge/disk}" \
            --remote-dir "$state/registry" \
            --token-file "$token_file" \
            --host-group "${SURGE_HOST_GROUP:-${NODE_NAME:-$(hostname)}}" \
            --log-level "${SURGE_LOG_LEVEL:-INFO}" \
            $tls "$@"
        ;;
    controller)
        if [ -z "${SURGE_AGENTS:-}" ]; then
            echo "error: set SURGE_AGENTS to the agents' HOST:PORT, comma-separated" >&2
            exit 2
        fi
        tls="$(tls_args controller)"
        # shellcheck disable=SC2086
        exec surge serve --launcher static --agents "$SURGE_AGENTS" \
            --token-file "$token_file" --state-dir "$state" \
            --host "${SURGE_API_HOST:-0.0.0.0}" --port "${SURGE_API_PORT:-8000}" \
            $tls "$@"
        ;;
    '')
        echo "error: give a role: agent or controller (or a command to run)" >&2
        exit 2
        ;;
    *)
        exec "$role" "$@"
        ;;
esac
