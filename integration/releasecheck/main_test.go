package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// repo writes a repository of two modules released together (the root
// and adapters/x, which requires the root at version) and commits it.
func repo(t *testing.T, version string) string {
	t.Helper()
	for k, v := range map[string]string{
		"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
		"GIT_CONFIG_GLOBAL": os.DevNull, "GIT_CONFIG_NOSYSTEM": "1",
	} {
		t.Setenv(k, v)
	}
	dir := t.TempDir()
	files := map[string]string{
		"go.work":                 "go 1.26.0\n\nuse (\n\t.\n\t./adapters/x\n\t./integration/tool\n)\n",
		"go.mod":                  "module github.com/keyorder/keyorder\n\ngo 1.26.0\n",
		"LICENSE":                 "license\n",
		"CHANGELOG.md":            "# Changelog\n\n## [0.2.0]\n\n## [0.1.0]\n",
		"root.go":                 "package keyorder\n",
		"adapters/x/go.mod":       "module github.com/keyorder/keyorder/adapters/x\n\ngo 1.26.0\n\nrequire github.com/keyorder/keyorder " + version + "\n",
		"adapters/x/LICENSE":      "license\n",
		"adapters/x/x.go":         "package x\n",
		"integration/tool/go.mod": "module github.com/keyorder/keyorder/integration/tool\n\ngo 1.26.0\n",
		"integration/tool/t.go":   "package tool\n",
	}
	for name, body := range files {
		write(t, dir, name, body)
	}
	gitT(t, dir, "init", "-q")
	gitT(t, dir, "add", "-A")
	gitT(t, dir, "commit", "-q", "-m", "release")
	return dir
}

func write(t *testing.T, dir, name, body string) {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func gitT(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

// check runs the release check (the tags it prints) in dir.
func check(t *testing.T, dir string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := runIn(dir, "", modeTags, &out)
	return out.String(), err
}

// The check passes before the release is tagged and right after it; it
// fails, naming the module, its tag and the files, as soon as a released
// module differs from the tag that released its version (a changed file,
// a new untracked file, a deleted file); a change in another module (a
// nested one, a module the release leaves out) does not count against the
// root; requiring the next version makes it pass again.
func TestUnchangedSinceTags(t *testing.T) {
	dir := repo(t, "v0.1.0")
	if tags, err := check(t, dir); err != nil || tags != "v0.1.0\nadapters/x/v0.1.0\n" {
		t.Fatalf("untagged: %q, %v; want the two tags and no error", tags, err)
	}
	gitT(t, dir, "tag", "v0.1.0")
	gitT(t, dir, "tag", "adapters/x/v0.1.0")
	if _, err := check(t, dir); err != nil {
		t.Fatalf("just tagged: %v", err)
	}

	// A change in the unreleased module and in the nested module's
	// directory seen from the root: the root is unchanged.
	write(t, dir, "integration/tool/t.go", "package tool // changed\n")
	if _, err := check(t, dir); err != nil {
		t.Fatalf("an unreleased module changed: %v", err)
	}

	write(t, dir, "adapters/x/x.go", "package x // changed\n")
	_, err := check(t, dir)
	if err == nil || !strings.Contains(err.Error(), "github.com/keyorder/keyorder/adapters/x has changed since its tag adapters/x/v0.1.0 (x.go)") ||
		strings.Contains(err.Error(), "github.com/keyorder/keyorder has changed") {
		t.Fatalf("adapters/x changed after its tag: %v; want it named, the root not", err)
	}
	// Committed, it is still a change since the tag.
	gitT(t, dir, "commit", "-q", "-am", "change x")
	if _, err := check(t, dir); err == nil || !strings.Contains(err.Error(), "adapters/x/v0.1.0 (x.go)") {
		t.Fatalf("committed change: %v", err)
	}

	// The root: a new untracked file and a deleted one.
	write(t, dir, "new.go", "package keyorder\n")
	if err := os.Remove(filepath.Join(dir, "root.go")); err != nil {
		t.Fatal(err)
	}
	_, err = check(t, dir)
	if err == nil || !strings.Contains(err.Error(), "github.com/keyorder/keyorder has changed since its tag v0.1.0 (new.go, root.go)") {
		t.Fatalf("root changed: %v", err)
	}

	// The next version: nothing is tagged for it.
	write(t, dir, "adapters/x/go.mod", "module github.com/keyorder/keyorder/adapters/x\n\ngo 1.26.0\n\nrequire github.com/keyorder/keyorder v0.2.0\n")
	if tags, err := check(t, dir); err != nil || tags != "v0.2.0\nadapters/x/v0.2.0\n" {
		t.Fatalf("next version: %q, %v", tags, err)
	}
}

// The proxy's modules are written from the working tree of a tagged,
// unchanged release too (the check does not stop a re-run of a release).
func TestProxyOfTaggedRelease(t *testing.T) {
	dir := repo(t, "v0.1.0")
	gitT(t, dir, "tag", "v0.1.0")
	gitT(t, dir, "tag", "adapters/x/v0.1.0")
	out := filepath.Join(t.TempDir(), "proxy")
	var stdout bytes.Buffer
	if err := runIn(dir, out, modeProxy, &stdout); err != nil || stdout.String() != "v0.1.0\n" {
		t.Fatalf("proxy: %q, %v", stdout.String(), err)
	}
	for _, f := range []string{"github.com/keyorder/keyorder/@v/v0.1.0.zip", "github.com/keyorder/keyorder/adapters/x/@v/v0.1.0.mod"} {
		if _, err := os.Stat(filepath.Join(out, filepath.FromSlash(f))); err != nil {
			t.Error(err)
		}
	}
}
