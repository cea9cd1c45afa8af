#!/usr/bin/env bash
# Two `qevict serve` replicas behind nginx on one machine (issue 50 item 6): nginx routes each
# conversation to one replica by its X-Session-Id header (`hash ... consistent`) and, when that
# replica is gone, to the other (proxy_next_upstream), which restores the conversation from the
# shared --session-dir (every finished turn is written through there).
#
#   tools/serve/replicas.sh start [MODEL.gguf] [-- extra qevict serve flags]   # prints the URL
#   tools/serve/replicas.sh stop
#   tools/serve/replicas.sh kill N        # kill replica N (1 or 2) hard, as a crash would
#
# Ports: nginx $QEVICT_LB_PORT (8090), replicas 8091 and 8092. State (configs, logs, pids, the
# shared session directory) in $QEVICT_LB_DIR (/tmp/qevict-lb). Needs nginx (Debian:
# `apt-get install nginx-light`) and build/tools/qevict.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=${QEVICT_LB_DIR:-/tmp/qevict-lb}
lb_port=${QEVICT_LB_PORT:-8090}
ports=(8091 8092)
qevict=${QEVICT_BIN:-$here/build/tools/qevict}
die() { echo "replicas: $*" >&2; exit 1; }

start() {
  command -v nginx >/dev/null || die "nginx not found (apt-get install nginx-light)"
  [ -x "$qevict" ] || die "no $qevict (build first: tools/setup.sh)"
  local model=${1:-}
  [ $# -gt 0 ] && shift
  [ "${1:-}" = "--" ] && shift
  [ -n "$model" ] || model=$("$here/tools/fetch_model.sh" | tail -n1)
  mkdir -p "$dir/sessions" "$dir/nginx-tmp"
  for i in 0 1; do
    local p=${ports[$i]} n=$((i + 1))
    "$qevict" serve -m "$model" --port "$p" --session-dir "$dir/sessions" "$@" \
      >"$dir/replica$n.log" 2>&1 &
    echo $! >"$dir/replica$n.pid"
  done
  cat >"$dir/nginx.conf" <<CONF
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/nginx-error.log;
events { worker_connections 256; }
http {
  access_log $dir/nginx-access.log;
  client_body_temp_path $dir/nginx-tmp/body;
  proxy_temp_path $dir/nginx-tmp/proxy;
  fastcgi_temp_path $dir/nginx-tmp/fastcgi;
  uwsgi_temp_path $dir/nginx-tmp/uwsgi;
  scgi_temp_path $dir/nginx-tmp/scgi;
  upstream qevict {
    # One conversation, one replica (requests without the header spread by address).
    hash \$http_x_session_id consistent;
    server 127.0.0.1:${ports[0]} max_fails=1 fail_timeout=10s;
    server 127.0.0.1:${ports[1]} max_fails=1 fail_timeout=10s;
  }
  server {
    listen 127.0.0.1:$lb_port;
    client_max_body_size 64m;
    location / {
      proxy_pass http://qevict;
      proxy_http_version 1.1;
      proxy_buffering off;               # stream tokens as they come
      proxy_read_timeout 600s;
      # POST is not idempotent: nginx retries it on the other replica only when told to.
      proxy_next_upstream error timeout http_502 http_503 non_idempotent;
      add_header X-Qevict-Upstream \$upstream_addr always;
    }
  }
}
CONF
  # Wait for both replicas to answer /health.
  for p in "${ports[@]}"; do
    for _ in $(seq 1 120); do
      curl -sf "http://127.0.0.1:$p/health" >/dev/null 2>&1 && break
      sleep 0.5
    done
    curl -sf "http://127.0.0.1:$p/health" >/dev/null || die "replica on port $p did not start (see $dir)"
  done
  nginx -c "$dir/nginx.conf"
  echo "http://127.0.0.1:$lb_port"
}

stop() {
  [ -f "$dir/nginx.pid" ] && nginx -c "$dir/nginx.conf" -s stop 2>/dev/null || true
  for n in 1 2; do
    [ -f "$dir/replica$n.pid" ] && kill "$(cat "$dir/replica$n.pid")" 2>/dev/null || true
    rm -f "$dir/replica$n.pid"
  done
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) stop ;;
  kill) kill -9 "$(cat "$dir/replica${2:?replica 1 or 2}.pid")" ;;
  *) die "usage: $0 start [MODEL] [-- serve flags] | stop | kill N" ;;
esac
