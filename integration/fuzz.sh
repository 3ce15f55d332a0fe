#!/usr/bin/env bash
# Runs every native Go fuzz target of the repository for a short bounded time
# (KEYORDER_FUZZTIME per target, default 5000x executions; 0 skips them). The committed
# corpus (testdata/fuzz/...) also runs as plain tests in every `go test`.
# `go test -fuzz` takes one package and one target at a time, hence the loop.
# Each target prints one line, "fuzz: TARGET PKG: passed", so that
# .ci/run's count of `ok` package lines stays the count of packages; a
# failure prints go test's output (with the input it wrote to testdata/fuzz)
# and "FAIL fuzz TARGET PKG".
set -uo pipefail
cd "$(dirname "$0")/.."
# The default budget is a count of executions, not a duration: with a
# duration, Go before 1.27 can fail a target with a bare "context deadline
# exceeded" (no input written) when -fuzztime expires while a worker is
# mid-call (golang/go#75804, fixed in go1.27; seen here in CI on go1.26.8).
# A count has no deadline to race. 5000x is a few seconds per target.
fuzztime=${KEYORDER_FUZZTIME:-5000x}
if [ "$fuzztime" = 0 ]; then
	exit 0
fi
rc=0
while read -r pkg target; do
	if out=$(go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" 2>&1); then
		echo "fuzz: $target $pkg: passed ($fuzztime)"
	else
		echo "$out" | grep -v '^ok ' | tail -40
		echo "FAIL fuzz $target $pkg"
		rc=1
	fi
done <<'TARGETS'
. FuzzJoinSplitKey
./adapters/memory FuzzURL
./adapters/postgres FuzzURL
./adapters/pubsub FuzzURL
./adapters/pubsub FuzzEncodeDecode
./adapters/sqs FuzzURL
./adapters/sqs FuzzGroupID
./adapters/sqs FuzzEncodeDecode
./adapters/kafka FuzzURL
./adapters/kafka FuzzCommitMetadata
TARGETS
exit $rc
