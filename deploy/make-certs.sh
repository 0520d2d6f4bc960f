#!/usr/bin/env bash
# Make a private CA and a SuperLink TLS certificate signed by it.
#
#   deploy/make-certs.sh [-d DIR] [-k CADIR] [-f] [SAN ...]
#
# SANs are the names and addresses the SuperNodes use to reach the sites' port (the
# proxy in front of the SuperLink), written as openssl subjectAltName entries, e.g.
#   deploy/make-certs.sh -d deploy/certs DNS:superlink DNS:fl.example.org IP:203.0.113.7
# DNS:localhost and IP:127.0.0.1 are always included.  Writes DIR/ca.crt (give it to
# every site), DIR/server.pem and DIR/server.key (the SuperLink's and the proxy's) and
# DIR/superexec.secret (shared by the SuperLink and the SuperExec that runs the
# ServerApp), and the CA's key to CADIR/ca.key (default: DIR/../ca; nothing mounts or
# reads it: keep it offline, it is needed only to issue a new server certificate).
# Existing files are kept unless -f is given; a kept certificate must cover the SANs
# asked for and be valid for CERT_MIN_DAYS more days (default 30), else this stops and
# says so.  CERT_DAYS (default 365) is the server certificate's lifetime, CA_DAYS
# (default 3650) the CA's.  Needs openssl.
set -euo pipefail
umask 077

dir="deploy/certs"
cadir=""
force=0
while getopts "d:k:fh" opt; do
  case "$opt" in
    d) dir="$OPTARG" ;;
    k) cadir="$OPTARG" ;;
    f) force=1 ;;
    h) sed -n '2,19p' "$0"; exit 0 ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ -n "$cadir" ] || cadir="$(dirname "$dir")/ca"
days="${CERT_DAYS:-365}"
ca_days="${CA_DAYS:-3650}"
min_days="${CERT_MIN_DAYS:-30}"

sans="DNS:localhost,IP:127.0.0.1"
for san in "$@"; do
  case "$san" in
    DNS:*|IP:*) sans="$sans,$san" ;;
    *) echo "error: SAN '$san' must start with DNS: or IP:" >&2; exit 2 ;;
  esac
done

mkdir -p "$dir" "$cadir"
if [ ! -s "$dir/superexec.secret" ]; then
  openssl rand -hex 32 > "$dir/superexec.secret"
fi
if [ "$force" -eq 0 ] && [ -s "$dir/server.pem" ] && [ -s "$dir/ca.crt" ]; then
  # the certificate kept must still do what is asked of it
  have=$(openssl x509 -in "$dir/server.pem" -noout -ext subjectAltName 2>/dev/null \
    | tail -n +2 | tr -d ' ' | sed 's/IPAddress:/IP:/g')
  missing=()
  IFS=, read -ra want <<< "$sans"
  for san in "${want[@]}"; do
    case ",$have," in *",$san,"*) ;; *) missing+=("$san") ;; esac
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "error: $dir/server.pem does not cover ${missing[*]} (it has $have);" \
         "run again with -f to issue a new one" >&2
    exit 1
  fi
  if ! openssl x509 -in "$dir/server.pem" -noout -checkend $((min_days * 86400)) >/dev/null; then
    echo "error: $dir/server.pem expires within $min_days days" \
         "($(openssl x509 -in "$dir/server.pem" -noout -enddate)); run again with -f" >&2
    exit 1
  fi
  echo "certificates exist in $dir and cover $sans (use -f to replace them)"
  exit 0
fi

# EC P-384 keys: as strong as RSA-7680 and generated in milliseconds.
openssl ecparam -name secp384r1 -genkey -noout -out "$cadir/ca.key"
openssl req -new -x509 -key "$cadir/ca.key" -sha384 -days "$ca_days" \
  -subj "/CN=fedsys Flower CA" -out "$dir/ca.crt"
openssl ecparam -name secp384r1 -genkey -noout -out "$dir/server.key"
cnf=$(mktemp)
trap 'rm -f "$cnf" "$dir/server.csr"' EXIT
cat > "$cnf" <<CNF
[req]
distinguished_name = dn
prompt = no
[dn]
CN = fedsys SuperLink
[v3_req]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = $sans
CNF
openssl req -new -key "$dir/server.key" -config "$cnf" -out "$dir/server.csr"
openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$cadir/ca.key" \
  -CAcreateserial -CAserial "$cadir/ca.srl" -days "$days" -sha384 -extfile "$cnf" \
  -extensions v3_req -out "$dir/server.pem" 2>/dev/null
rm -f "$dir/server.csr" "$dir/server.cnf"
chmod 644 "$dir/ca.crt" "$dir/server.pem"
# The fedsys images run Flower as uid 49999: `chown 49999 DIR/server.key
# DIR/superexec.secret` on the SuperLink host when it runs in containers.
echo "CA: $dir/ca.crt (key: $cadir/ca.key, keep it offline)  SuperLink: $dir/server.pem" \
     "$dir/server.key  SANs: $sans"
