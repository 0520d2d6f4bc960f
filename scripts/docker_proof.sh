#!/usr/bin/env bash
# Docker proof: build the three fedsys images from a local base image, bring the
# docker-compose stack up (a bridge network per site, only the proxy's sites' port
# published on 127.0.0.1, TLS, SuperNode authentication and SuperExec secrets on), check
# the threat model's network rows from the host (the sites' port answers the Fleet API
# only), run two rounds of FedAvg on Fashion-MNIST, check the recorded accuracy, tear
# everything down.  Prints build times, image sizes and the run time.
#
#   scripts/docker_proof.sh            # exit 0: proven; 77: no Docker engine here
#   scripts/docker_proof.sh --build-only   # the base image and both images, no stack
#
# Environment:
#   BASE            base image for both images (default fedsys-base:bookworm; made
#                   with debootstrap when missing and debootstrap is installed)
#   FMNIST_DIR      Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist)
#   SUPERLINK_PORT  the sites' port on 127.0.0.1 (default 9093); nothing else is published
#   MIN_ACCURACY    accuracy the run must reach (default 0.5)
#   KEEP_IMAGES=0   also remove the two images afterwards
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_ONLY=0
case "${1:-}" in
  "") ;;
  --build-only) BUILD_ONLY=1 ;;
  *) echo "usage: scripts/docker_proof.sh [--build-only]" >&2; exit 2 ;;
esac
REPO=$(pwd)

BASE="${BASE:-fedsys-base:bookworm}"
FMNIST_DIR="${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}"
PORT="${SUPERLINK_PORT:-9093}"
MIN_ACCURACY="${MIN_ACCURACY:-0.5}"
PROJECT="fedsys-proof"
export DOCKER_BUILDKIT=0  # the classic builder: no buildx plugin needed

if ! docker info >/dev/null 2>&1; then
  echo "docker_proof: no Docker engine reachable; skipped" >&2
  exit 77
fi
# Nothing here runs the caller's Python: a venv's or pyenv's PYTHONPATH / PYTHONHOME
# reaching Debian's docker-compose once broke CI (the venv's cryptography under Debian's
# pyOpenSSL: "module 'lib' has no attribute 'GEN_EMAIL'"), and would break the python3
# that debootstrap configures in the base image's root.
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP PYTHONUSERBASE VIRTUAL_ENV
# the compose CLI: Compose v2 (`docker compose`) where the plugin is installed, else
# docker-compose 1.x under its own interpreter in isolated mode (-I: no user site either)
if docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose)
elif dc=$(command -v docker-compose); then
  py=$(head -1 "$dc" | sed -n 's/^#! *\(\/[^ ]*python[0-9.]*\)$/\1/p')
  if [ -n "$py" ]; then COMPOSE=("$py" -I "$dc"); else COMPOSE=("$dc"); fi
  "${COMPOSE[@]}" version >/dev/null 2>&1 || {
    echo "error: ${COMPOSE[*]} does not run:" >&2; "${COMPOSE[@]}" version 2>&1 | tail -3 >&2
    exit 2; }
else
  echo "error: neither 'docker compose' nor docker-compose is installed" >&2; exit 2
fi
for p in "$PORT"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "error: port $p on 127.0.0.1 is in use" >&2; exit 2
  fi
done
ls "$FMNIST_DIR"/train-images-idx3-ubyte* >/dev/null 2>&1 || {
  echo "error: no Fashion-MNIST in $FMNIST_DIR (apt-get install dataset-fashion-mnist)" >&2
  exit 2; }

now() { date +%s.%N; }
secs() { python3 -I -c "print(f'{$2 - $1:.0f}')"; }
size() { docker image inspect -f '{{.Size}}' "$1" | python3 -I -c "import sys; print(f'{int(sys.stdin.read()) / 1e9:.2f} GB')"; }

# ---------------------------------------------------------------- base image
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  [ "$BASE" = "fedsys-base:bookworm" ] && command -v debootstrap >/dev/null || {
    echo "error: base image $BASE not found" >&2; exit 2; }
  echo "== making $BASE with debootstrap"
  t0=$(now)
  rootfs=$(mktemp -d /var/tmp/fedsys-rootfs.XXXXXX)
  debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$rootfs" http://deb.debian.org/debian > "$rootfs.log" 2>&1 \
    || { tail -20 "$rootfs.log" >&2; echo "error: debootstrap failed ($rootfs.log)" >&2; exit 1; }
  # package downloads may go through a proxy with its own CA: trust what this host trusts
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'ENV LANG=C.UTF-8' -c 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    -c 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' - "$BASE" >/dev/null
  rm -rf "$rootfs" "$rootfs.log"
  echo "base image: $(secs "$t0" "$(now)") s"
fi

# ---------------------------------------------------------------- images
declare -A BUILD_S
for target in proxy server client; do
  echo "== building fedsys-$target from $BASE"
  t0=$(now)
  docker build --network host -f deploy/Dockerfile --target "$target" \
    --build-arg BASE="$BASE" -t "fedsys-$target:latest" . > "/tmp/fedsys-build-$target.log" 2>&1 \
    || { tail -30 "/tmp/fedsys-build-$target.log"; exit 1; }
  BUILD_S[$target]=$(secs "$t0" "$(now)")
  echo "fedsys-$target: ${BUILD_S[$target]} s, $(size "fedsys-$target:latest")"
done

if [ "$BUILD_ONLY" = 1 ]; then echo "IMAGES OK"; exit 0; fi

# ---------------------------------------------------------------- certificates, keys
WORK=$(mktemp -d /var/tmp/fedsys-proof.XXXXXX)
mkdir -p "$WORK/deploy"
deploy/make-certs.sh -d "$WORK/deploy/certs" -k "$WORK/deploy/ca" DNS:superlink >/dev/null
[ ! -e "$WORK/deploy/certs/ca.key" ] || { echo "error: ca.key beside the mounted certificates" >&2; exit 1; }
mkdir -p "$WORK/deploy/proxy"
cp deploy/proxy/nginx.conf "$WORK/deploy/proxy/nginx.conf"
deploy/node-keys.sh -d "$WORK/deploy/keys" supernode-0 supernode-1
cp deploy/flwr-config.toml "$WORK/deploy/flwr-config.toml"
chown -R 49999 "$WORK/deploy/certs" "$WORK/deploy/keys"
cat > "$WORK/.env" <<EOF
SUPERLINK_PORT=$PORT
SITES_BIND=127.0.0.1
SERVER_DATA=$FMNIST_DIR
SITE0_DATA=$FMNIST_DIR
SITE1_DATA=$FMNIST_DIR
EOF
compose() {
  "${COMPOSE[@]}" -p "$PROJECT" --project-directory "$WORK" -f "$REPO/docker-compose.yml" "$@"
}
cleanup() {
  echo "== tearing down"
  compose --profile cpu --profile cli down -v --remove-orphans >/dev/null 2>&1 || true
  if [ "${KEEP_IMAGES:-1}" = "0" ]; then
    docker image rm fedsys-proxy:latest fedsys-server:latest fedsys-client:latest >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
  left=$(docker ps -q --filter "label=com.docker.compose.project=$PROJECT")
  [ -z "$left" ] && echo "nothing of $PROJECT is running" || echo "still running: $left"
}
trap cleanup EXIT

# ---------------------------------------------------------------- stack and run
echo "== docker-compose --profile cpu up -d"
t0=$(now)
compose --profile cpu up -d
for i in $(seq 90); do
  online=$(compose run --rm -T flwr supernode list fedsys --format json 2>/dev/null \
    | python3 -I -c "import json,sys; print(sum(n['status']=='online' for n in json.load(sys.stdin)['nodes']))" \
    2>/dev/null || echo 0)
  [ "$online" = "2" ] && break
  sleep 2
done
[ "$online" = "2" ] || { compose logs --tail 40; echo "error: SuperNodes not online" >&2; exit 1; }
UP_S=$(secs "$t0" "$(now)")
echo "stack up, 2 SuperNodes online: $UP_S s"
published=()
for c in $(compose ps -q); do
  mode=$(docker inspect -f '{{.HostConfig.NetworkMode}}' "$c")
  [ "$mode" != "host" ] || { echo "error: container $c uses the host's network" >&2; exit 1; }
  ports=$(docker inspect -f '{{range $p, $b := .HostConfig.PortBindings}}{{range $b}}{{.HostIp}}:{{.HostPort}}->{{$p}} {{end}}{{end}}' "$c")
  [ -z "$ports" ] || published+=($ports)
done
[ "${published[*]}" = "127.0.0.1:$PORT->9093/tcp" ] \
  || { echo "error: published ports are '${published[*]}', not the sites' port alone" >&2; exit 1; }
echo "no host networking; published: ${published[*]}"
# threat model, "anyone on the network", from the host through the published port: the
# Control and Runtime APIs, /docs and /openapi.json are nginx's 404; the Fleet API reaches
# the SuperLink (415: it answers a JSON body itself)
python3 -I - "$PORT" "$WORK/deploy/certs/ca.crt" <<'EOF'
import http.client, ssl, sys
ctx = ssl.create_default_context(cafile=sys.argv[2])
def status(path):
    c = http.client.HTTPSConnection("127.0.0.1", int(sys.argv[1]), context=ctx, timeout=30)
    c.request("POST", path, body=b"{}", headers={"content-type": "application/json"})
    r = c.getresponse()
    return r.status, r.getheader("server", "")
for path in ("/v1/control/register-node", "/v1/control/list-nodes", "/v1/control/start-run",
             "/v1/runtime/acquire-task", "/docs", "/openapi.json", "/health",
             "/v1/fleet/../control/list-nodes", "/v1/fleet/%2e%2e/control/list-nodes"):
    got = status(path)
    assert got == (404, "nginx"), (path, got)
assert status("/v1/fleet/pull-messages")[0] == 415, status("/v1/fleet/pull-messages")
print("sites' port: Control, Runtime, /docs, /openapi.json refused (404); Fleet API forwarded")
EOF

# threat model, "a site": each site is a bridge network of its own, its Runtime API and the
# SuperLink's own port on their namespaces' loopback.  From site 0's namespace the proxy
# answers (superlink:9093), and nothing else does: not the SuperLink's port (Control and
# Runtime APIs), not site 1 by name or by address.  From the host, the containers'
# addresses answer on no API port either.
ip_of() { docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}' "$(compose ps -q "$1")"; }
SITE1_IPS=$(ip_of supernode-1)
SERVER_IPS=$(ip_of superlink)
compose exec -T supernode-0 python3 -I - "$SITE1_IPS" <<'EOF'
import socket, sys
def reach(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "open"
    except socket.gaierror:
        return "no such name"
    except OSError as exc:
        return type(exc).__name__
assert reach("superlink", 9093) == "open", reach("superlink", 9093)
got = reach("superlink", 9091)  # the server's host answers, its SuperLink port does not
assert got == "ConnectionRefusedError", got
print(f"site 0 -> superlink:9091: {got}")
# site 1 is not on site 0's network: no name, and no packet reaches its address (a refusal
# would mean one did)
for host, port in [("supernode-1", 9094), ("superexec-1", 9094),
                   *((ip, p) for ip in sys.argv[1].split() for p in (9094, 9093, 22))]:
    got = reach(host, port)
    assert got in ("no such name", "TimeoutError", "OSError"), (host, port, got)
    print(f"site 0 -> {host}:{port}: {got}")
print("site 0 reaches the sites' port only")
EOF
python3 -I - "$SERVER_IPS $SITE1_IPS $(ip_of supernode-0)" <<'EOF'
import socket, sys
for ip in sys.argv[1].split():
    for port in (9091, 9094):
        try:
            socket.create_connection((ip, port), timeout=3).close()
            raise SystemExit(f"error: the host reaches {ip}:{port}")
        except OSError as exc:
            print(f"host -> {ip}:{port}: {type(exc).__name__}")
print("the host reaches no API port of the containers")
EOF

echo "== docker-compose run --rm run deploy/fmnist-smoke.yaml"
t0=$(now)
compose run --rm -T run deploy/fmnist-smoke.yaml | tee "$WORK/run.log"
RUN_S=$(secs "$t0" "$(now)")
compose run --rm -T --entrypoint cat flwr /runs/deploy-smoke/fedavg/metrics.jsonl > "$WORK/metrics.jsonl"
python3 -I - "$WORK/metrics.jsonl" "$MIN_ACCURACY" <<'EOF'
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
assert [r["round"] for r in recs] == [0, 1, 2], recs
assert all(r["clients-ok"] == 2 for r in recs[1:]), recs
acc = recs[-1]["accuracy"]
assert acc >= float(sys.argv[2]) > recs[0]["accuracy"], (acc, recs[0]["accuracy"])
print(f"recorded accuracy: round 0 {recs[0]['accuracy']:.4f}, round 2 {acc:.4f}")
EOF
grep -q "Uvicorn running on https://127.0.0.1:9091" <(compose logs superlink) \
  && echo "SuperLink served HTTPS on its namespace's loopback only"
echo "PROOF OK: build server ${BUILD_S[server]} s ($(size fedsys-server:latest)), client" \
  "${BUILD_S[client]} s ($(size fedsys-client:latest)), stack up $UP_S s, 2-round run $RUN_S s"
