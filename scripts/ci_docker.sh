#!/usr/bin/env bash
# CI's Docker engine for the container proof (tests/integration/test_deploy_docker.py):
# start dockerd where none answers (installing docker.io, docker-compose and debootstrap
# with apt when they are missing, after .ci/run's apt-get update; needs root), then build
# the base image and both fedsys images (scripts/docker_proof.sh --build-only) so that the
# test's own build finds every layer cached.  .ci/run starts it in the background while
# make sets up the venv.
#
#   scripts/ci_docker.sh READY_FILE
#
# Writes READY_FILE last: "ok", or "no-engine: <why>" when no engine could be started
# (the test then skips, naming why), or "build-failed" (the test runs the proof, which
# builds again and shows the error).  The log is READY_FILE.log.
set -uo pipefail
cd "$(dirname "$0")/.."
READY=${1:?usage: scripts/ci_docker.sh READY_FILE}
exec >"$READY.log" 2>&1
rm -f "$READY"
say() { echo "$*" > "$READY.tmp" && mv "$READY.tmp" "$READY"; echo "ci_docker: $*"; }

if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then say "no-engine: not root, cannot start dockerd"; exit 0; fi
  missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v docker-compose >/dev/null || missing+=(docker-compose)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== apt-get install ${missing[*]}"
    # .ci/run has run apt-get update; wait for any other apt to finish
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q \
      "${missing[@]}" \
      || { say "no-engine: apt-get install ${missing[*]} failed"; exit 0; }
  fi
  echo "== starting dockerd"
  (setsid dockerd > /var/log/fedsys-ci-dockerd.log 2>&1 &)
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  if ! docker info >/dev/null 2>&1; then
    tail -20 /var/log/fedsys-ci-dockerd.log
    say "no-engine: dockerd did not start (/var/log/fedsys-ci-dockerd.log)"; exit 0
  fi
fi
docker version --format 'Docker {{.Server.Version}}'
if scripts/docker_proof.sh --build-only; then say ok; else say build-failed; fi
