#!/usr/bin/env bash
# Make a private CA and a SuperLink TLS certificate signed by it.
#
#   deploy/make-certs.sh [-d DIR] [-f] [SAN ...]
#
# SANs are the names and addresses the SuperNodes and the `flwr` CLI use to reach
# the SuperLink, written as openssl subjectAltName entries, e.g.
#   deploy/make-certs.sh -d deploy/certs DNS:fl.example.org IP:203.0.113.7
# DNS:localhost and IP:127.0.0.1 are always included.  Writes DIR/ca.crt (give it to
# every site), DIR/ca.key (keep it offline), DIR/server.pem and DIR/server.key (the
# SuperLink's), and DIR/superexec.secret (shared by the SuperLink and the SuperExec
# that runs the ServerApp).  Existing files are kept unless -f is given.  Needs openssl.
set -euo pipefail

dir="deploy/certs"
force=0
while getopts "d:fh" opt; do
  case "$opt" in
    d) dir="$OPTARG" ;;
    f) force=1 ;;
    h) sed -n '2,14p' "$0"; exit 0 ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
days="${CERT_DAYS:-365}"

sans="DNS:localhost,IP:127.0.0.1"
for san in "$@"; do
  case "$san" in
    DNS:*|IP:*) sans="$sans,$san" ;;
    *) echo "error: SAN '$san' must start with DNS: or IP:" >&2; exit 2 ;;
  esac
done

mkdir -p "$dir"
if [ ! -s "$dir/superexec.secret" ]; then
  (umask 077 && openssl rand -hex 32 > "$dir/superexec.secret")
fi
if [ "$force" -eq 0 ] && [ -s "$dir/server.pem" ] && [ -s "$dir/ca.crt" ]; then
  echo "certificates exist in $dir (use -f to replace them)"
  exit 0
fi

umask 077
# EC P-384 keys: as strong as RSA-7680 and generated in milliseconds.
openssl ecparam -name secp384r1 -genkey -noout -out "$dir/ca.key"
openssl req -new -x509 -key "$dir/ca.key" -sha384 -days "$days" \
  -subj "/CN=fedsys Flower CA" -out "$dir/ca.crt"
openssl ecparam -name secp384r1 -genkey -noout -out "$dir/server.key"
cat > "$dir/server.cnf" <<CNF
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
openssl req -new -key "$dir/server.key" -config "$dir/server.cnf" -out "$dir/server.csr"
openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
  -CAcreateserial -days "$days" -sha384 -extfile "$dir/server.cnf" -extensions v3_req \
  -out "$dir/server.pem" 2>/dev/null
rm -f "$dir/server.csr"
chmod 644 "$dir/ca.crt" "$dir/server.pem"
# The fedsys images run Flower as uid 49999: `chown 49999 DIR/server.key
# DIR/superexec.secret` on the SuperLink host when it runs in containers.
echo "CA: $dir/ca.crt  SuperLink: $dir/server.pem $dir/server.key  SANs: $sans"
