#!/usr/bin/env bash
# Make SuperNode key pairs and register their public keys with the SuperLink.
#
#   deploy/node-keys.sh [-d DIR] [-r CONNECTION] NAME ...
#
# For each NAME, DIR/NAME (private key, stays on that site), DIR/NAME.pub and
# DIR/NAME.secret (the secret between that site's SuperNode Runtime API and its
# SuperExec, stays on that site) are made unless they exist (keys: ECDSA P-384,
# OpenSSH format, as Flower expects; all 0600 but the .pub).  Where only DIR/NAME.pub
# is there (the operator's registration, which is given the public keys alone),
# nothing is made and the key is registered as it is.  With
# -r CONNECTION each public key is registered through `flwr supernode register`
# against that SuperLink connection of the `flwr` CLI ($FLWR_HOME/config.toml);
# a key that is already registered is left as it is.  The SuperLink assigns the node
# id at registration, so a SuperNode keeps its id when it restarts.
#   deploy/node-keys.sh -d deploy/keys site0 site1                 # make keys
#   deploy/node-keys.sh -d deploy/keys -r fedsys site0 site1       # and register them
set -euo pipefail

dir="deploy/keys"
conn=""
while getopts "d:r:h" opt; do
  case "$opt" in
    d) dir="$OPTARG" ;;
    r) conn="$OPTARG" ;;
    h) sed -n '2,19p' "$0"; exit 0 ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ "$#" -gt 0 ] || { echo "error: name at least one SuperNode" >&2; exit 2; }

umask 077
mkdir -p "$dir"
flwr_bin="${FLWR_BIN:-flwr}"
for name in "$@"; do
  case "$name" in
    *[!A-Za-z0-9_.-]*|"") echo "error: bad SuperNode name '$name'" >&2; exit 2 ;;
  esac
  if [ -s "$dir/$name.pub" ] && [ ! -e "$dir/$name" ]; then
    :  # public key only: register it, make nothing
  else
    if [ ! -s "$dir/$name" ]; then
      ssh-keygen -q -t ecdsa -b 384 -N "" -C "$name" -f "$dir/$name"
    fi
    if [ ! -s "$dir/$name.secret" ]; then
      openssl rand -hex 32 > "$dir/$name.secret"
    fi
    chmod 644 "$dir/$name.pub" 2>/dev/null || true
  fi
  if [ -n "$conn" ]; then
    if out=$("$flwr_bin" supernode register "$dir/$name.pub" "$conn" --name "$name" 2>&1); then
      echo "registered $name: $(printf '%s\n' "$out" | grep -io 'node[^0-9]*[0-9][0-9]*' | head -1)"
    # matched in bash, not by `printf | grep -q`: grep leaving at its first match can give
    # printf a broken pipe, which pipefail reads as no match (a CI run failed so, once)
    elif [[ "${out,,}" == *already* ]]; then
      echo "$name was registered before"
    else
      printf '%s\n' "$out" >&2
      echo "error: could not register $name with '$conn'" >&2
      exit 1
    fi
  fi
done
