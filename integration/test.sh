#!/usr/bin/env bash
# The README's test command: every test, with the race detector.
set -euo pipefail
cd "$(dirname "$0")/.."
exec go test -race -count=1 ./... "$@"
