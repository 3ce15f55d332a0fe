// Command releasecheck writes a Go module proxy, in the file layout GOPROXY
// reads (file://DIR), that holds every released module of this repository at
// the version about to be tagged, made from the working tree.
//
// keyorder is several modules in one repository (go.work joins them for
// development), and go.work hides the mistakes a release can make: an
// adapter module that requires a placeholder pseudo-version of the root, a
// go.mod whose requirements do not build without the workspace, a file left
// out of a module. integration/release.sh points the go command at the
// proxy this command writes, with GOWORK=off and no replace directive, and
// installs the CLI and builds a user program exactly as a user would after
// the tags are pushed.
//
// Usage:
//
//	go run ./integration/releasecheck -out DIR   # writes the proxy, prints the version
//	go run ./integration/releasecheck -tags      # prints the git tags a release pushes
//	go run ./integration/releasecheck -modules   # prints each released module's path and directory
//
// A module is released unless its directory (relative to the repository)
// has an element named internal, integration or examples: those hold tests,
// benchmarks and examples, not code for users. Every requirement of a
// released module on another keyorder module must name one and the same
// semantic version, not a pseudo-version: that version is the release's,
// CHANGELOG.md must have an entry for it, and each module's zip gets it.
// Each released module must hold a LICENSE file: pkg.go.dev shows the
// documentation of a module only with a license of its own. A module zip holds what `git archive` of a commit would: the files git
// tracks plus the untracked files it does not ignore, so uncommitted work is
// checked too, minus nested modules; golang.org/x/mod/zip applies the go
// command's own rules (sizes, names, no vendor directory).
//
// A released version never changes: once the repository holds a module's
// tag for the version the go.mod files require (adapters/kafka/v0.1.0), a
// module whose files differ from that tag's (tracked changes, or new
// untracked files) fails the check, naming the files: the release must
// require a new version. The proxy would otherwise serve, under a version
// users may already have in their module cache and go.sum, content that
// differs from the tag's.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

func main() {
	out := flag.String("out", "", "directory to write the module proxy into (created; must not exist or be empty)")
	tags := flag.Bool("tags", false, "print the git tags of the release, one a line, and write nothing")
	list := flag.Bool("modules", false, "print each released module's path and directory (relative; \".\" for the root), one a line, and write nothing")
	flag.Parse()
	mode := modeProxy
	switch {
	case *tags:
		mode = modeTags
	case *list:
		mode = modeModules
	}
	if err := run(*out, mode, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "releasecheck:", err)
		os.Exit(1)
	}
}

// released is one module the release tags.
type released struct {
	dir   string // absolute
	rel   string // relative to the repository root, "" for the root module
	path  string // module path
	gomod []byte
}

// tag is the module's git tag for version v: "v0.1.0" for the root,
// "adapters/postgres/v0.1.0" for a nested module.
func (m released) tag(v string) string {
	if m.rel == "" {
		return v
	}
	return m.rel + "/" + v
}

// What run does.
const (
	modeProxy   = iota // write the proxy
	modeTags           // print the tags
	modeModules        // print the modules
)

func run(out string, mode int, stdout io.Writer) error {
	root, err := gitRoot(".")
	if err != nil {
		return err
	}
	return runIn(root, out, mode, stdout)
}

// runIn is run in the repository at root.
func runIn(root, out string, mode int, stdout io.Writer) error {
	mods, err := releasedModules(root)
	if err != nil {
		return err
	}
	version, err := releaseVersion(mods)
	if err != nil {
		return err
	}
	changelog, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		return fmt.Errorf("reading the changelog: %w", err)
	}
	if !bytes.Contains(changelog, []byte("## ["+strings.TrimPrefix(version, "v")+"]")) {
		return fmt.Errorf("CHANGELOG.md has no entry \"## [%s]\" for the version the modules require", strings.TrimPrefix(version, "v"))
	}
	if err := unchangedSinceTags(root, mods, version); err != nil {
		return err
	}
	switch mode {
	case modeTags:
		for _, m := range mods {
			fmt.Fprintln(stdout, m.tag(version))
		}
		return nil
	case modeModules:
		for _, m := range mods {
			fmt.Fprintln(stdout, m.path, cmpOr(m.rel, "."))
		}
		return nil
	}
	if out == "" {
		return errors.New("-out DIR is required (or -tags)")
	}
	stamp, err := commitTime(root)
	if err != nil {
		return err
	}
	for _, m := range mods {
		if err := writeModule(out, m, version, stamp); err != nil {
			return fmt.Errorf("module %s: %w", m.path, err)
		}
		fmt.Fprintf(os.Stderr, "releasecheck: %s@%s (tag %s)\n", m.path, version, m.tag(version))
	}
	fmt.Fprintln(stdout, version)
	return nil
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// git runs git in dir and returns its standard output.
func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(b), nil
}

// unchangedSinceTags fails when a released module's tag for version
// exists and the module's files differ from the tag's: the version is
// released, and a released version never changes.
func unchangedSinceTags(root string, mods []released, version string) error {
	var problems []string
	for _, m := range mods {
		tag := m.tag(version)
		if _, err := git(root, "rev-parse", "-q", "--verify", "refs/tags/"+tag+"^{commit}"); err != nil {
			continue // not tagged yet
		}
		changed, err := changedSince(m, tag)
		if err != nil {
			return fmt.Errorf("module %s: %w", m.path, err)
		}
		if len(changed) > 0 {
			shown := changed[:min(len(changed), 5)]
			more := ""
			if len(changed) > len(shown) {
				more = fmt.Sprintf(" and %d more", len(changed)-len(shown))
			}
			problems = append(problems, fmt.Sprintf("%s has changed since its tag %s (%s%s), and the go.mod files still require %s: "+
				"a released version never changes; require the next version in every go.mod and give it a CHANGELOG entry",
				m.path, tag, strings.Join(shown, ", "), more, version))
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

// changedSince lists the files of module m (relative to its directory,
// nested modules excluded) that differ from tag's: changed, added or
// deleted in the working tree, or new and not ignored.
func changedSince(m released, tag string) ([]string, error) {
	diff, err := git(m.dir, "diff", "--name-only", "--no-renames", "--relative", tag, "--", ".")
	if err != nil {
		return nil, err
	}
	untracked, err := git(m.dir, "ls-files", "--others", "--exclude-standard", ".")
	if err != nil {
		return nil, err
	}
	all, err := git(m.dir, "ls-files", "--cached", "--others", "--exclude-standard", ".")
	if err != nil {
		return nil, err
	}
	atTag, err := git(m.dir, "ls-tree", "-r", "--name-only", tag, ".")
	if err != nil {
		return nil, err
	}
	// Directories below the module root that hold a go.mod, now or at the
	// tag, are other modules. ls-tree names paths from the repository root
	// unless run in the directory: it is, so they are relative to it.
	var nested []string
	for _, n := range append(strings.Split(all, "\n"), strings.Split(atTag, "\n")...) {
		if path.Base(n) == "go.mod" && n != "go.mod" {
			nested = append(nested, path.Dir(n)+"/")
		}
	}
	var out []string
	for _, n := range append(strings.Split(diff, "\n"), strings.Split(untracked, "\n")...) {
		if n == "" || slices.Contains(out, n) || slices.ContainsFunc(nested, func(d string) bool { return strings.HasPrefix(n, d) }) {
			continue
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

func gitRoot(dir string) (string, error) {
	cmd := exec.Command("git", "rev-parse", "--show-toplevel")
	cmd.Dir = dir
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("finding the repository root: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// commitTime is HEAD's commit time, the time the .info files give.
func commitTime(root string) (time.Time, error) {
	cmd := exec.Command("git", "log", "-1", "--format=%cI")
	cmd.Dir = root
	b, err := cmd.Output()
	if err != nil {
		return time.Time{}, fmt.Errorf("reading HEAD's time: %w", err)
	}
	return time.Parse(time.RFC3339, strings.TrimSpace(string(b)))
}

// releasedModules reads go.work's use directives and keeps the modules a
// release tags.
func releasedModules(root string) ([]released, error) {
	name := filepath.Join(root, "go.work")
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("reading go.work: %w", err)
	}
	wf, err := modfile.ParseWork(name, data, nil)
	if err != nil {
		return nil, fmt.Errorf("parsing go.work: %w", err)
	}
	var mods []released
	for _, u := range wf.Use {
		rel := path.Clean(filepath.ToSlash(u.Path))
		if rel == "." {
			rel = ""
		}
		if slices.ContainsFunc(strings.Split(rel, "/"), func(e string) bool {
			return e == "internal" || e == "integration" || e == "examples"
		}) {
			continue
		}
		dir := filepath.Join(root, filepath.FromSlash(rel))
		gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", rel+"/go.mod", err)
		}
		mods = append(mods, released{dir: dir, rel: rel, path: modfile.ModulePath(gomod), gomod: gomod})
	}
	if len(mods) == 0 || mods[0].rel != "" {
		return nil, errors.New("go.work must use the root module first")
	}
	return mods, nil
}

// releaseVersion checks that every requirement among released modules names
// the same semantic version, and returns it.
func releaseVersion(mods []released) (string, error) {
	ours := map[string]bool{}
	for _, m := range mods {
		ours[m.path] = true
	}
	version := ""
	var problems []string
	for _, m := range mods {
		f, err := modfile.ParseLax(m.path+"/go.mod", m.gomod, nil)
		if err != nil {
			return "", err
		}
		for _, r := range f.Require {
			if !strings.HasPrefix(r.Mod.Path, mods[0].path) {
				continue
			}
			switch {
			case !ours[r.Mod.Path]:
				problems = append(problems, fmt.Sprintf("%s requires %s, which is not a released module", m.path, r.Mod.Path))
			case module.IsPseudoVersion(r.Mod.Version) || !semver.IsValid(r.Mod.Version) || semver.Canonical(r.Mod.Version) != r.Mod.Version:
				problems = append(problems, fmt.Sprintf("%s requires %s@%s: want a release version (vX.Y.Z), not a pseudo-version", m.path, r.Mod.Path, r.Mod.Version))
			case version == "":
				version = r.Mod.Version
			case r.Mod.Version != version:
				problems = append(problems, fmt.Sprintf("%s requires %s@%s, another module requires %s: one release, one version", m.path, r.Mod.Path, r.Mod.Version, version))
			}
		}
	}
	if len(problems) > 0 {
		return "", errors.New(strings.Join(problems, "\n"))
	}
	if version == "" {
		return "", errors.New("no released module requires another: cannot tell the release version")
	}
	return version, nil
}

// file is one file of a module zip, read from the working tree.
type file struct{ abs, rel string }

func (f file) Path() string                 { return f.rel }
func (f file) Lstat() (os.FileInfo, error)  { return os.Lstat(f.abs) }
func (f file) Open() (io.ReadCloser, error) { return os.Open(f.abs) }

// moduleFiles lists the files of the module in m.dir: those git tracks or
// would track (not ignored), still present, outside nested modules.
func moduleFiles(m released) ([]modzip.File, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", ".")
	cmd.Dir = m.dir
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %w", err)
	}
	names := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
	// Directories below the module root that hold a go.mod are other modules.
	var nested []string
	for _, n := range names {
		if path.Base(n) == "go.mod" && n != "go.mod" {
			nested = append(nested, path.Dir(n)+"/")
		}
	}
	var files []modzip.File
	seen := map[string]bool{}
	for _, n := range names {
		if n == "" || seen[n] || slices.ContainsFunc(nested, func(d string) bool { return strings.HasPrefix(n, d) }) {
			continue
		}
		seen[n] = true
		abs := filepath.Join(m.dir, filepath.FromSlash(n))
		if _, err := os.Lstat(abs); errors.Is(err, os.ErrNotExist) {
			continue // deleted in the working tree, not yet in git
		}
		files = append(files, file{abs: abs, rel: n})
	}
	return files, nil
}

// writeModule writes m at version into the proxy at out: @v/list,
// @v/VERSION.info, .mod and .zip.
func writeModule(out string, m released, version string, stamp time.Time) error {
	esc, err := module.EscapePath(m.path)
	if err != nil {
		return err
	}
	dir := filepath.Join(out, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files, err := moduleFiles(m)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(files, func(f modzip.File) bool { return f.Path() == "LICENSE" }) {
		// pkg.go.dev shows no documentation for a module without a license
		// file of its own: a nested module does not inherit the root's.
		return errors.New("no LICENSE file at the module's root (copy the repository's)")
	}
	var zbuf bytes.Buffer
	if err := modzip.Create(&zbuf, module.Version{Path: m.path, Version: version}, files); err != nil {
		return fmt.Errorf("zipping: %w", err)
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, stamp.UTC()})
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{
		"list":            []byte(version + "\n"),
		version + ".info": info,
		version + ".mod":  m.gomod,
		version + ".zip":  zbuf.Bytes(),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
