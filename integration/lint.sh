#!/usr/bin/env bash
# Runs staticcheck (and gofmt -l) over every module of go.work (the root module and each
# module listed in its `use` block) in one invocation, so packages shared by
# several modules are analysed once. Any finding fails the script.
#
# staticcheck is pinned and run with `go run pkg@version`: the first run on a
# machine downloads and builds it (about a minute), later runs reuse Go's build
# cache. A finding that is right to keep gets a `//lint:ignore CHECK reason`
# on the line above it (`//nolint` is golangci-lint's and staticcheck ignores
# it); staticcheck itself reports such a directive once it matches nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
# go.work's toolchain line chooses the Go release (GOTOOLCHAIN=auto; a
# machine's GOTOOLCHAIN=local would ignore it); KEYORDER_GOTOOLCHAIN overrides.
export GOTOOLCHAIN=${KEYORDER_GOTOOLCHAIN:-auto}

STATICCHECK=honnef.co/go/tools/cmd/staticcheck@v0.8.2

# One ./dir/... pattern per workspace module, relative so findings print
# with short paths.
mapfile -t patterns < <(go list -m -f '{{.Dir}}' | sed "s|^$PWD|.|; s|\$|/...|")
echo "lint: staticcheck ${STATICCHECK#*@} over ${#patterns[@]} modules" >&2
go run "$STATICCHECK" "${patterns[@]}"
echo "lint: staticcheck found nothing" >&2

# gofmt over every tracked Go file: staticcheck does not check formatting.
unformatted=$(git ls-files -z '*.go' | xargs -0 gofmt -l)
if [ -n "$unformatted" ]; then
	echo "lint: gofmt would change these files (run gofmt -w):" >&2
	echo "$unformatted" >&2
	exit 1
fi
echo "lint: gofmt found nothing" >&2
