#!/usr/bin/env bash
# Checks that the release about to be tagged works for a user, without
# go.work and without replace directives: what `go install` and `go get`
# will see once the tags are pushed.
#
# 1. integration/releasecheck writes a Go module proxy (file layout) with
#    every released module at the version their go.mod files require of each
#    other (v0.1.0), zipped from the working tree by golang.org/x/mod/zip.
#    It fails on a pseudo-version, two versions, a missing CHANGELOG entry
#    or a module without its LICENSE.
# 2. With GOWORK=off and that proxy in front of the usual one, it runs
#    `go install github.com/keyorder/keyorder/cmd/keyorder@VERSION` into a
#    temporary GOBIN and runs the binary.
# 3. It builds and runs a user program in a temporary module of its own that
#    requires keyorder and adapters/postgres at VERSION: it imports publish,
#    subscribe, adapters/memory and adapters/postgres, and publishes and
#    consumes a few keyed messages on the memory backend in order.
# 4. For every other released module (each adapter, the Watermill mount,
#    otelkeyorder) it builds and runs a user program in a module of its own
#    that requires only that module at VERSION: each module's go.mod must
#    build on its own, not only beside the others. An adapter's program
#    checks that its scheme is registered.
# releasecheck also fails when the repository holds a module's tag for
# VERSION and the module has changed since that tag (a released version
# never changes; see integration/releasecheck).
#
# The check uses a module cache of its own (under
# ${XDG_CACHE_HOME:-~/.cache}/keyorder/release-modcache), from which it
# deletes the keyorder modules before each run: the shared cache must never
# hold a keyorder@VERSION made from a working tree, and a cached one would
# hide the next change. Other modules come from the shared module cache
# when it has them (a file proxy over its download directory), else from
# GOPROXY; keyorder's modules are not in the checksum database yet, so
# GONOSUMDB names them. Warm, the whole check takes about 30 s here (2
# loaded cores); the first run fills its module cache and builds the SDKs
# into the build cache (2 min of CPU, 10 min of wall time at load 20). To reclaim the
# cache: GOMODCACHE=~/.cache/keyorder/release-modcache go clean -modcache.
set -euo pipefail
cd "$(dirname "$0")/.."
# go.work's toolchain line chooses the Go release (GOTOOLCHAIN=auto; a
# machine's GOTOOLCHAIN=local would ignore it); KEYORDER_GOTOOLCHAIN overrides.
export GOTOOLCHAIN=${KEYORDER_GOTOOLCHAIN:-auto}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
version=$(go run ./integration/releasecheck -out "$work/proxy")
modules=$(go run ./integration/releasecheck -modules)

shared=$(go env GOMODCACHE)
upstream=$(go env GOPROXY)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/keyorder/release-modcache
mkdir -p "$cache"
# One check at a time per machine: they share the cache.
exec 9>"$cache.lock"
flock 9
for d in "$cache/github.com/keyorder" "$cache/cache/download/github.com/keyorder"; do
	if [ -e "$d" ]; then
		chmod -R u+w "$d" # the module cache is read-only
		rm -rf "$d"
	fi
done

export GOWORK=off
# The module index (in the build cache) trusts a module version in the
# module cache never to change; this check rewrites keyorder@VERSION from
# the working tree each run, so a stale index would hide new packages
# ("could not import …/internal/memhook (open : no such file or directory)").
export GODEBUG=${GODEBUG:+$GODEBUG,}goindex=0
export GOMODCACHE=$cache
export GOPROXY="file://$work/proxy,file://$shared/cache/download,$upstream"
export GONOSUMDB=github.com/keyorder/keyorder
export GOFLAGS="${GOFLAGS:-} -mod=mod"

echo "release: go install github.com/keyorder/keyorder/cmd/keyorder@$version" >&2
# Outside any module: go install pkg@version ignores the current one anyway.
(cd "$work" && GOBIN=$work/bin go install "github.com/keyorder/keyorder/cmd/keyorder@$version")
# With no arguments the CLI prints its usage and exits 2 (a usage error).
set +e
"$work/bin/keyorder" >"$work/usage" 2>&1
rc=$?
set -e
if [ "$rc" -ne 2 ] || ! grep -q 'keyorder' "$work/usage"; then
	echo "release: the installed keyorder printed (exit $rc):" >&2
	cat "$work/usage" >&2
	exit 1
fi

echo "release: building a user program that requires keyorder $version and adapters/postgres $version" >&2
mkdir "$work/user"
cat >"$work/user/go.mod" <<EOF
module example.com/keyorderuser

go 1.26.0

require (
	github.com/keyorder/keyorder $version
	github.com/keyorder/keyorder/adapters/postgres $version
)
EOF
cat >"$work/user/main.go" <<'EOF'
// Command keyorderuser is what a new user writes first: publish keyed
// messages and consume them in order. The PostgreSQL adapter is imported
// to prove that its module builds from the release; the memory backend
// runs, since no server is needed.
package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/keyorder/keyorder"
	_ "github.com/keyorder/keyorder/adapters/memory"
	_ "github.com/keyorder/keyorder/adapters/postgres" // registers postgres://
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

func main() {
	ctx, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	sub, err := subscribe.Open(ctx, "mem://orders?subscription=apply&ordering=ordered", nil)
	if err != nil {
		fail(err)
	}
	pub, err := publish.Open(ctx, "mem://orders", nil)
	if err != nil {
		fail(err)
	}
	want := []string{"1", "2", "3", "4", "5"}
	for _, p := range want {
		if _, err := pub.Publish(ctx, &keyorder.Message{Key: "acct-42", Payload: []byte(p)}); err != nil {
			fail(err)
		}
	}
	var got []string
	runCtx, done := context.WithCancel(ctx)
	err = sub.Run(runCtx, func(_ context.Context, d *keyorder.Delivery) error {
		got = append(got, string(d.Payload)) // Ordered: one handler at a time for the key
		if len(got) == len(want) {
			done()
		}
		return nil
	})
	if err != nil {
		fail(err)
	}
	if !slices.Equal(got, want) {
		fail(fmt.Errorf("delivered %v, want %v", got, want))
	}
	if err := pub.Close(ctx); err != nil {
		fail(err)
	}
	if err := sub.Close(ctx); err != nil {
		fail(err)
	}
	fmt.Println("keyorderuser: 5 messages of one key delivered in order")
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "keyorderuser:", err)
	os.Exit(1)
}
EOF
(cd "$work/user" && go build -o "$work/bin/keyorderuser" . && "$work/bin/keyorderuser")

# A user program per released module, each in a module of its own.
while read -r path dir; do
	case "$dir" in
	. | cmd/keyorder) continue ;; # the program above, go install above
	esac
	name=${dir//\//-}
	echo "release: building a user program that requires only $path $version" >&2
	mkdir "$work/user-$name"
	cat >"$work/user-$name/go.mod" <<EOF
module example.com/keyorderuser/$name

go 1.26.0

require $path $version
EOF
	cat >"$work/user-$name/main.go" <<EOF
// Command $name is a user program of $path alone.
package main

import (
	"fmt"

	_ "$path"
	"github.com/keyorder/keyorder/driver"
)

func main() { fmt.Println(driver.DefaultMux().SubscriptionSchemes()) }
EOF
	(cd "$work/user-$name" && go build -o "$work/bin/user-$name" .)
	schemes=$("$work/bin/user-$name")
	case "$dir" in
	adapters/watermill) ;;
	adapters/*)
		if [[ " ${schemes//[\[\]]/ } " != *" ${dir#adapters/} "* ]]; then
			echo "release: a program importing $path registers the schemes $schemes, not ${dir#adapters/}" >&2
			exit 1
		fi
		;;
	esac
done <<<"$modules"
echo "release: $version installs and builds from a module proxy, without go.work or replace directives" >&2
