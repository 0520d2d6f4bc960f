#!/usr/bin/env bash
# Docker proof of the role compose files (issue 76 item 2): a server kit and two sites on
# one Docker host, each role from its own compose file and env file, nobody editing YAML.
#
#   1. fedsys deploy server-kit (--name fl.example.org --address 198.51.100.1) and two site
#      keys (fedsys deploy site-key), from the checkout's .venv;
#   2. the server role: deploy/server.compose.yml as the kit's compose.yml, with
#      --env-file server.env, on a bridge of its own (198.51.100.0/28, gateway 198.51.100.1,
#      the kit's --address, where the proxy's port is published);
#   3. both sites registered the way an operator does it: the .pub dropped in the kit's
#      inbox/, `docker-compose run --rm sites add-site inbox/NAME.pub ...`;
#   4. each site kit copied beside its keys and started with deploy/site.compose.yml (the
#      kit's compose.yml) and its own site.env, each on a bridge of its own
#      (198.51.100.16/28, 198.51.100.32/28) that reaches the server's published port and
#      nothing else: a firewall chain of this script's (iptables) stands for the internet
#      between the hosts (site -> 198.51.100.1:9093 forwarded, everything else from these
#      bridges dropped: no route out, no host port, not the other site, not the
#      SuperLink's own port); masquerading is off on all three;
#   5. checks: one published port, no host networking, ca.key mounted nowhere, the sites'
#      port refuses the Control API, a site reaches the server's port only; then
#      deploy/fmnist-smoke.yaml (two rounds of FedAvg, both sites) and remove-site;
#   6. everything down, the networks and firewall chains removed.
#
#   scripts/docker_kits_proof.sh     # exit 0: proven (prints PROOF OK); 77: no Docker engine
#
# Needs root (iptables, chown 49999), the fedsys images (built with scripts/docker_proof.sh
# --build-only when missing) and Fashion-MNIST.
#
# Environment:
#   FEDSYS_CLI     the fedsys command that makes the kits (default .venv/bin/fedsys)
#   FMNIST_DIR     Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist)
#   MIN_ACCURACY   accuracy the run must reach (default 0.5)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
FMNIST_DIR="${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}"
MIN_ACCURACY="${MIN_ACCURACY:-0.5}"
FEDSYS_CLI="${FEDSYS_CLI:-$REPO/.venv/bin/fedsys}"
NAME=fl.example.org
ADDR=198.51.100.1
SERVER_NET=198.51.100.0/28
SITE_NETS=(198.51.100.16/28 198.51.100.32/28)
SITE_GWS=(198.51.100.17 198.51.100.33)
SITES=(site-0 site-1)
PROJECT=fedsys-kits
export DOCKER_BUILDKIT=0

if ! docker info >/dev/null 2>&1; then
  echo "docker_kits_proof: no Docker engine reachable; skipped" >&2
  exit 77
fi
# as in docker_proof.sh: none of the caller's Python reaches docker-compose or the venv
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP PYTHONUSERBASE VIRTUAL_ENV
# and none of the compose files' settings comes from the caller's environment
unset FEDSYS_KIT CERTS_DIR SITES_BIND SUPERLINK_PORT LINK_PORT SITES_ADDRESS KIT_UID \
  SITE_NAME SUPERLINK_ADDRESS NODE_CONFIG RUNTIME_PORT SITE_KEYS SITE_DATA SERVER_NAME \
  SERVER_IP SERVER_DATA COMPOSE_PROFILES COMPOSE_PROJECT_NAME COMPOSE_FILE FEDSYS_PLUGINS
[ "$(id -u)" -eq 0 ] || { echo "error: run as root (iptables, chown 49999)" >&2; exit 2; }
command -v iptables >/dev/null || { echo "error: iptables is not installed" >&2; exit 2; }
[ -x "$FEDSYS_CLI" ] || FEDSYS_CLI=$(command -v fedsys) \
  || { echo "error: no fedsys CLI (.venv/bin/fedsys; make the venv)" >&2; exit 2; }
if docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose)
elif dc=$(command -v docker-compose); then
  py=$(head -1 "$dc" | sed -n 's/^#! *\(\/[^ ]*python[0-9.]*\)$/\1/p')
  if [ -n "$py" ]; then COMPOSE=("$py" -I "$dc"); else COMPOSE=("$dc"); fi
else
  echo "error: neither 'docker compose' nor docker-compose is installed" >&2; exit 2
fi
ls "$FMNIST_DIR"/train-images-idx3-ubyte* >/dev/null 2>&1 || {
  echo "error: no Fashion-MNIST in $FMNIST_DIR (apt-get install dataset-fashion-mnist)" >&2
  exit 2; }
# the addresses are this script's: no other network may hold them
for n in $(docker network ls -q); do
  if docker network inspect -f '{{range .IPAM.Config}}{{.Subnet}} {{end}}' "$n" \
      | grep -q '198\.51\.100\.'; then
    echo "error: docker network $(docker network inspect -f '{{.Name}}' "$n") uses" \
      "198.51.100.0/24 (a proof still running, or left over?)" >&2; exit 2
  fi
done
for img in fedsys-proxy fedsys-server fedsys-client; do
  docker image inspect "$img:latest" >/dev/null 2>&1 && continue
  echo "== $img:latest is missing: scripts/docker_proof.sh --build-only"
  scripts/docker_proof.sh --build-only
  break
done

now() { date +%s.%N; }
secs() { python3 -I -c "print(f'{$2 - $1:.0f}')"; }
T0=$(now)
WORK=$(mktemp -d /var/tmp/fedsys-kits-proof.XXXXXX)
K="$WORK/server-kit"
FWD="FEDSYS-KITS-$$"   # this run's firewall chains (FORWARD via DOCKER-USER, and INPUT)
INP="FEDSYS-KITS-IN-$$"
NETS=()               # this run's networks

server() {
  "${COMPOSE[@]}" -p "$PROJECT-server" --env-file "$K/server.env" -f "$K/compose.yml" \
    -f "$WORK/server.net.yml" "$@"
}
site() {  # site N ARGS: site N's compose, from its kit, with its own env file
  local n=${SITES[$1]}; shift
  "${COMPOSE[@]}" -p "$PROJECT-$n" --env-file "$WORK/$n/kit/site.env" \
    -f "$WORK/$n/kit/compose.yml" -f "$WORK/$n.net.yml" --profile cpu "$@"
}
cleanup() {
  rc=$?
  set +e
  echo "== tearing down"
  for i in 1 0; do
    [ -f "$WORK/${SITES[$i]}/kit/compose.yml" ] && site "$i" down -v --remove-orphans >/dev/null 2>&1
  done
  [ -f "$K/compose.yml" ] && server --profile cli down -v --remove-orphans >/dev/null 2>&1
  for n in "${NETS[@]}"; do docker network rm "$n" >/dev/null; done
  iptables -D DOCKER-USER -j "$FWD" 2>/dev/null; iptables -F "$FWD" 2>/dev/null
  iptables -X "$FWD" 2>/dev/null
  iptables -D INPUT -j "$INP" 2>/dev/null; iptables -F "$INP" 2>/dev/null
  iptables -X "$INP" 2>/dev/null
  rm -rf "$WORK"
  left=""
  for p in "$PROJECT-server" "$PROJECT-site-0" "$PROJECT-site-1"; do
    left+=$(docker ps -aq --filter "label=com.docker.compose.project=$p")
    left+=$(docker volume ls -q --filter "label=com.docker.compose.project=$p")
  done
  left+=$(docker network ls -q --filter "name=^$PROJECT-")
  iptables -S 2>/dev/null | grep -q "FEDSYS-KITS-.*$$" && left+=" firewall chains"
  [ -z "$left" ] && echo "nothing of $PROJECT is running; its networks, volumes and firewall chains are gone" \
    || echo "still there: $left"
  exit $rc
}
trap cleanup EXIT
iptables -N "$FWD"; iptables -I DOCKER-USER 1 -j "$FWD"
iptables -N "$INP"; iptables -I INPUT 1 -j "$INP"

net() {  # net NAME SUBNET GATEWAY: a bridge with the test's addresses, made before anything
  # runs on it (its firewall rules first); the role's compose file takes it as its default
  # network through an override file, NAME.net.yml.  BR: the bridge's interface.
  docker network create --driver bridge --subnet "$2" --gateway "$3" \
    -o com.docker.network.bridge.enable_ip_masquerade=false "$PROJECT-$1" >/dev/null
  NETS+=("$PROJECT-$1")
  printf 'networks:\n  default:\n    external: true\n    name: %s\n' "$PROJECT-$1" \
    > "$WORK/$1.net.yml"
  BR="br-$(docker network inspect -f '{{.Id}}' "$PROJECT-$1" | cut -c1-12)"
}

# ---------------------------------------------------------------- the kits
echo "== fedsys deploy server-kit --name $NAME --address $ADDR"
"$FEDSYS_CLI" deploy server-kit --name "$NAME" --address "$ADDR" --out "$K" >/dev/null
for i in 0 1; do
  "$FEDSYS_CLI" deploy site-key "${SITES[$i]}" --out "$WORK/${SITES[$i]}" >/dev/null
done
for f in compose.yml proxy/compose.conf inbox sites; do
  [ -e "$K/$f" ] || { echo "error: the server kit has no $f" >&2; exit 1; }
done
grep -q "^SITES_BIND=$ADDR$" "$K/server.env" \
  || { echo "error: server.env does not bind $ADDR" >&2; cat "$K/server.env" >&2; exit 1; }
# the images run as uid 49999 (docs: sudo chown 49999 ...)
chown 49999 "$K/certs/server.key" "$K/certs/superexec.secret"

# ---------------------------------------------------------------- the server role
echo "== server: docker-compose --env-file server.env up -d (in the kit)"
net server "$SERVER_NET" "$ADDR"; S=$BR
iptables -A "$FWD" -i "$S" ! -o "$S" -j DROP
iptables -A "$INP" -i "$S" -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN
iptables -A "$INP" -i "$S" -j DROP
SERVER_DATA="$FMNIST_DIR" server up -d
for _ in $(seq 60); do
  server run --rm -T flwr ls fedsys >/dev/null 2>&1 && break
  sleep 2
done
server run --rm -T flwr ls fedsys >/dev/null || { server logs --tail 40; exit 1; }
echo "server role up: SuperLink answers on its namespace's loopback"

# ---------------------------------------------------------------- add-site
for i in 0 1; do
  cp "$WORK/${SITES[$i]}/keys/${SITES[$i]}.pub" "$K/inbox/"
  server run --rm -T sites add-site "inbox/${SITES[$i]}.pub" --partition-id "$i" \
    --num-partitions 2
  [ -f "$K/sites/${SITES[$i]}/site.env" ] || { echo "error: no site kit" >&2; exit 1; }
  [ -f "$K/sites/${SITES[$i]}/compose.yml" ] \
    || { echo "error: the site kit ${SITES[$i]} has no compose.yml" >&2; exit 1; }
done
echo "site.env as add-site wrote it:"; sed 's/^/  /' "$K/sites/site-0/site.env"
leak=$(find "$K/sites" -type f \( -name '*.secret' -o -name site-0 -o -name site-1 \))
[ -z "$leak" ] || { echo "error: a site kit holds a private key or secret: $leak" >&2; exit 1; }

# ---------------------------------------------------------------- the sites
for i in 0 1; do
  s="$WORK/${SITES[$i]}"
  cp -a "$K/sites/${SITES[$i]}" "$s/kit"          # the kit sent to the site, beside its keys
  chown 49999 "$s/keys/${SITES[$i]}" "$s/keys/${SITES[$i]}.secret"
  # the certificate's name, pinned to the kit's address (no DNS here)
  grep -q "^SERVER_NAME=$NAME$" "$s/kit/site.env" && grep -q "^SERVER_IP=$ADDR$" "$s/kit/site.env" \
    || { echo "error: site.env does not map $NAME to $ADDR" >&2; exit 1; }
  echo "== ${SITES[$i]}: docker-compose --env-file site.env --profile cpu up -d (in its kit)"
  net "${SITES[$i]}" "${SITE_NETS[$i]}" "${SITE_GWS[$i]}"; B=$BR
  # the internet between the hosts: this site reaches the server's published port only
  iptables -I "$FWD" 1 -i "$B" -o "$S" -p tcp -m conntrack --ctorigdst "$ADDR" \
    --ctorigdstport 9093 -j ACCEPT
  iptables -I "$FWD" 1 -i "$S" -o "$B" -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
  iptables -A "$FWD" -i "$B" ! -o "$B" -j DROP
  iptables -A "$INP" -i "$B" -j DROP
  SITE_DATA="$FMNIST_DIR" site "$i" up -d
done
for _ in $(seq 90); do
  online=$(server run --rm -T flwr supernode list fedsys --format json 2>/dev/null \
    | python3 -I -c "import json,sys; print(sum(n['status']=='online' for n in json.load(sys.stdin)['nodes']))" \
    2>/dev/null || echo 0)
  [ "$online" = "2" ] && break
  sleep 2
done
if [ "$online" != "2" ]; then
  for i in 0 1; do site "$i" logs --tail 30; done; server logs --tail 30
  echo "error: the two sites' SuperNodes are not online" >&2; exit 1
fi
echo "both sites online: $(secs "$T0" "$(now)") s since the kits were made"

# ---------------------------------------------------------------- checks
published=()
containers=$(server ps -q; for i in 0 1; do site "$i" ps -q; done)
for c in $containers; do
  # each on this test's networks only: a role's first service on its bridge, the others
  # in that service's namespace
  mode=$(docker inspect -f '{{.HostConfig.NetworkMode}}' "$c")
  nets=$(docker inspect -f '{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}' "$c")
  case "$mode" in
    container:*) [ -z "$nets" ] ;;
    "$PROJECT"-*) [ "$nets" = "$mode " ] ;;
    *) false ;;
  esac || { echo "error: container $c: network mode $mode, networks $nets" >&2; exit 1; }
  ports=$(docker inspect -f '{{range $p, $b := .HostConfig.PortBindings}}{{range $b}}{{.HostIp}}:{{.HostPort}}->{{$p}} {{end}}{{end}}' "$c")
  [ -z "$ports" ] || published+=($ports)
  if docker inspect -f '{{range .Mounts}}{{.Source}} {{end}}' "$c" | grep -qE '/ca(/|\.key)'; then
    echo "error: container $c mounts the CA's key directory" >&2; exit 1
  fi
done
[ "${published[*]}" = "$ADDR:9093->9093/tcp" ] \
  || { echo "error: published ports are '${published[*]}', not the sites' port alone" >&2; exit 1; }
echo "every container on this test's bridges or in its role's namespace; ca/ mounted nowhere; published: ${published[*]}"
python3 -I - "$ADDR" "$K/certs/ca.crt" "$NAME" <<'EOF'
import http.client, socket, ssl, sys
ctx = ssl.create_default_context(cafile=sys.argv[2])
class Conn(http.client.HTTPSConnection):  # the server's address, verified as its name
    def connect(self):
        sock = socket.create_connection((sys.argv[1], 9093), timeout=30)
        self.sock = ctx.wrap_socket(sock, server_hostname=sys.argv[3])
def status(path):
    c = Conn(sys.argv[3], 9093, context=ctx, timeout=30)
    c.request("POST", path, body=b"{}", headers={"content-type": "application/json"})
    r = c.getresponse()
    return r.status, r.getheader("server", "")
for path in ("/v1/control/list-nodes", "/v1/control/start-run", "/v1/runtime/acquire-task",
             "/docs", "/v1/fleet/../control/list-nodes"):
    got = status(path)
    assert got == (404, "nginx"), (path, got)
assert status("/v1/fleet/pull-messages")[0] == 415, status("/v1/fleet/pull-messages")
print(f"sites' port {sys.argv[1]}:9093 (certificate for {sys.argv[3]}): Control, Runtime, "
      "/docs refused (404); Fleet API forwarded")
EOF
ip_of() { docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}' "$1"; }
SITE1_IP=$(ip_of "$(site 1 ps -q supernode)")
LINK_IP=$(ip_of "$(server ps -q superlink)")
site 0 exec -T supernode python3 -I - "$NAME" "$ADDR" "$LINK_IP" "$SITE1_IP" <<'EOF'
import socket, sys
name, server, link, other = (a.strip() for a in sys.argv[1:])
def reach(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "open"
    except OSError as exc:
        return type(exc).__name__
assert reach(name, 9093) == "open", reach(name, 9093)
print(f"site-0 -> {name}:9093 (the server's published port): open")
for host, port in [(server, 9091), (server, 22), (link, 9091), (link, 9093), (other, 9094),
                   (other, 22)]:
    got = reach(host, port)
    assert got in ("TimeoutError", "OSError"), (host, port, got)  # dropped, not refused
    print(f"site-0 -> {host}:{port}: {got}")
print("site-0 reaches the server's published port and nothing else")
EOF

# ---------------------------------------------------------------- a run, remove-site
echo "== docker-compose --env-file server.env run --rm run deploy/fmnist-smoke.yaml"
t0=$(now)
server run --rm -T run deploy/fmnist-smoke.yaml | tee "$WORK/run.log"
RUN_S=$(secs "$t0" "$(now)")
server run --rm -T --entrypoint cat flwr /runs/deploy-smoke/fedavg/metrics.jsonl > "$WORK/metrics.jsonl"
python3 -I - "$WORK/metrics.jsonl" "$MIN_ACCURACY" <<'EOF'
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
assert [r["round"] for r in recs] == [0, 1, 2], recs
assert all(r["clients-ok"] == 2 for r in recs[1:]), recs
acc = recs[-1]["accuracy"]
assert acc >= float(sys.argv[2]) > recs[0]["accuracy"], (acc, recs[0]["accuracy"])
print(f"both sites in every round; accuracy: round 0 {recs[0]['accuracy']:.4f}, round 2 {acc:.4f}")
EOF
server run --rm -T sites remove-site site-1
[ -f "$K/sites/site-1/REVOKED" ] || { echo "error: site-1's kit not marked revoked" >&2; exit 1; }
echo "PROOF OK: server kit + 2 sites from their own compose and env files, 2-round run" \
  "$RUN_S s, $(secs "$T0" "$(now)") s in all"
