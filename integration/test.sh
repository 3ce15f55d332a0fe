#!/usr/bin/env bash
# Runs keyorder's test suite against real servers: PostgreSQL, Google's Pub/Sub
# emulator, ElasticMQ (SQS), a Pulsar standalone broker and a Kafka broker
# (KRaft), all started on 127.0.0.1 by integration/cmd/testenv and stopped
# again when the tests end.
# Extra arguments go to `go test`, e.g. ./integration/test.sh -run TestPulsar -v
# Packages run one at a time (-p 1): the real-server suites measure time in
# units of 250ms and two of them at once on 2 cores made them flaky.
# After the tests, integration/fuzz.sh runs each fuzz target for a few
# seconds (no server needed; about a minute in all).
# The repository is several Go modules joined by go.work (the root's portable
# API, and one module per heavy SDK adapter, the CLI, the examples, the
# benchmark and the smoke tests); `./...` in a workspace covers the root module
# only, so the default package list names every module of go.work.
# Environment: KEYORDER_TEST_PACKAGES (default: every module's packages), KEYORDER_MVN_ARGS
# (extra Maven arguments), TESTENV_FLAGS (e.g. "--only postgres --keep"),
# KEYORDER_FUZZTIME (per fuzz target, default 5000x executions; 0 skips fuzzing),
# KEYORDER_SKIP_CHECKS=1 (skip the static checks below; ignored when CI=true).
# Before any test, integration/lint.sh (staticcheck) and
# integration/vulncheck.sh (govulncheck) check every module; either failing
# fails the run before a server starts.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${CI:-}" = true ] || [ "${KEYORDER_SKIP_CHECKS:-}" != 1 ]; then
	./integration/lint.sh
	./integration/vulncheck.sh
else
	echo "test.sh: KEYORDER_SKIP_CHECKS=1: staticcheck and govulncheck skipped" >&2
fi

# Build the launcher and exec it, so that signals sent to this script (Ctrl-C,
# SIGTERM from CI) reach the launcher directly and it stops the servers.
if [ -z "${KEYORDER_TEST_PACKAGES:-}" ]; then
	KEYORDER_TEST_PACKAGES=$(go list -m -f '{{.Dir}}' | sed "s|^$PWD|.|; s|\$|/...|" | tr '\n' ' ')
fi
mkdir -p .testenv/bin
go build -o .testenv/bin/testenv ./integration/cmd/testenv
# The fuzz targets run after the tests and inside the launcher, so that one
# exit status covers both: the tests' failure wins, a fuzz failure fails too.
# shellcheck disable=SC2086 # TESTENV_FLAGS and KEYORDER_TEST_PACKAGES are word lists
exec .testenv/bin/testenv run ${TESTENV_FLAGS:-} -- \
	bash -c 'go test -race -count=1 -p 1 "$@"; rc=$?; ./integration/fuzz.sh || rc=1; exit $rc' keyorder-tests \
	${KEYORDER_TEST_PACKAGES} "$@"
