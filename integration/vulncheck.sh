#!/usr/bin/env bash
# Runs govulncheck over every module of go.work against a local copy of the
# Go vulnerability database, and compares what it finds with
# integration/vulnallow.txt.
#
# The online database (vuln.go.dev) cannot be reached from the machines this
# project runs on, but the database's source is served by the Go module proxy
# as the module golang.org/x/vulndb: its data/osv folder holds one OSV file a
# vulnerability, and its cmd/indexdb builds from them the v1 database that
# govulncheck reads (`-db file://DIR`). The build (a few minutes on a new
# machine, mostly downloading indexdb's dependencies) is cached under
# ${XDG_CACHE_HOME:-~/.cache}/keyorder/vulndb/VERSION, so later runs only scan.
# VULNDB_VERSION pins the data: bump it (see `go list -m -versions
# golang.org/x/vulndb`, or the proxy's @latest) to learn of newer reports.
#
# Only vulnerabilities whose vulnerable functions the code calls count (what
# govulncheck itself fails on); the others are listed for information.
# It fails when a called vulnerability is not in vulnallow.txt, and when an
# allowlisted one is no longer found (remove it then, so the list stays true).
set -euo pipefail
cd "$(dirname "$0")/.."
# go.work's toolchain line chooses the Go release (GOTOOLCHAIN=auto; a
# machine's GOTOOLCHAIN=local would ignore it), so the standard library
# scanned is that patch release's; KEYORDER_GOTOOLCHAIN overrides.
export GOTOOLCHAIN=${KEYORDER_GOTOOLCHAIN:-auto}

GOVULNCHECK=golang.org/x/vuln/cmd/govulncheck@v1.9.0
VULNDB_VERSION=v0.0.0-20261105234957-e22db6528018
ALLOW=integration/vulnallow.txt

command -v jq >/dev/null || { echo "vulncheck: jq is needed (apt-get install jq)" >&2; exit 2; }

cache=${XDG_CACHE_HOME:-$HOME/.cache}/keyorder/vulndb
db=$cache/$VULNDB_VERSION
if [ ! -s "$db/index/db.json" ]; then
	echo "vulncheck: building the vulnerability database from golang.org/x/vulndb@$VULNDB_VERSION" >&2
	src=$(go mod download -json "golang.org/x/vulndb@$VULNDB_VERSION" | jq -er .Dir)
	mkdir -p "$cache"
	tmp=$(mktemp -d "$cache/.build.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	# Outside any module, so that go.work plays no part in building the tool.
	(cd "$tmp" && GOWORK=off go run "golang.org/x/vulndb/cmd/indexdb@$VULNDB_VERSION" -vulns "$src/data/osv" -out "$tmp/db")
	rm -rf "$db"
	mv "$tmp/db" "$db" # whole or not at all: an interrupted build leaves no half database
fi

mapfile -t patterns < <(go list -m -f '{{.Dir}}' | sed "s|^$PWD|.|; s|\$|/...|")
echo "vulncheck: govulncheck ${GOVULNCHECK#*@} over ${#patterns[@]} modules, database golang.org/x/vulndb@$VULNDB_VERSION" >&2
out=$(mktemp)
trap 'rm -f "$out"; rm -rf "${tmp:-}"' EXIT
# -format json exits 0 whatever it finds; findings are judged below.
go run "$GOVULNCHECK" -db "file://$db" -format json "${patterns[@]}" >"$out"

# One line per finding: id, how it is reached, module@version, fixed version, summary.
findings=$(jq -r --slurp '
	(map(select(.osv) | .osv | {key: .id, value: .summary}) | from_entries) as $summary
	| map(select(.finding) | .finding
		| {id: .osv,
		   level: (if .trace[0].function then "called" elif .trace[0].package then "imported" else "required" end),
		   mod: "\(.trace[0].module)@\(.trace[0].version // "")",
		   fixed: (.fixed_version // "no fix")})
	| group_by(.id)[]
	| (map(.level) | if index("called") then "called" elif index("imported") then "imported" else "required" end) as $level
	| [.[0].id, $level, .[0].mod, .[0].fixed, ($summary[.[0].id] // "")] | @tsv' "$out")

called=$(awk -F'\t' '$2 == "called" {print $1}' <<<"$findings" | sort -u)
allowed=$(sed 's/#.*//' "$ALLOW" | awk 'NF {print $1}' | sort -u)

rc=0
while IFS=$'\t' read -r id level mod fixed summary; do
	[ -n "$id" ] || continue
	if [ "$level" != called ]; then
		echo "vulncheck: note: $id ($level only, not called) in $mod, fixed in $fixed: $summary" >&2
	elif grep -qxF "$id" <<<"$allowed"; then
		echo "vulncheck: allowed: $id in $mod, fixed in $fixed: $summary" >&2
	else
		echo "vulncheck: FOUND: $id called in $mod, fixed in $fixed: $summary" >&2
		rc=1
	fi
done <<<"$findings"
for id in $(comm -13 <(echo "$called") <(echo "$allowed")); do
	echo "vulncheck: STALE: $id is in $ALLOW but no longer found; remove it" >&2
	rc=1
done
if [ "$rc" -ne 0 ]; then
	echo "vulncheck: failed (fix or upgrade; allowlist in $ALLOW only with a reason)" >&2
	exit "$rc"
fi
echo "vulncheck: $(grep -c . <<<"$called" || true) called vulnerabilities, all allowlisted with a reason" >&2
