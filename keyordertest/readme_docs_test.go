package keyordertest_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocsExampleIsReadmeTest checks that the Go block of docs/testing.md's
// "Testing your own pipeline" is, byte for byte, part of readme_test.go, so
// that what a reader copies is what TestLedgerKeepsOrder runs.
func TestDocsExampleIsReadmeTest(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "testing.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Testing your own pipeline\n")
	if !ok {
		t.Fatal(`docs/testing.md has no "## Testing your own pipeline" heading`)
	}
	_, block, ok := strings.Cut(section, "\n```go\n")
	if !ok {
		t.Fatal("docs/testing.md's section has no ```go block")
	}
	block, _, ok = strings.Cut(block, "\n```\n")
	if !ok {
		t.Fatal("docs/testing.md's ```go block is not closed")
	}
	src, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(src), block) {
		t.Fatal("docs/testing.md's example is not part of keyordertest/readme_test.go: copy one into the other")
	}
}
