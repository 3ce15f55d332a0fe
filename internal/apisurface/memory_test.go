package apisurface

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestMemorySurface fails when package adapters/memory exports more than an
// application needs: its drivers and fault hooks are reached by tests
// through internal/memhook and by applications through keyordertest, so
// Broker's methods are the Create and Open ones and no type or error of the
// driver or fault surface is exported.
func TestMemorySurface(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goBin, "doc", "-all", "./adapters/memory")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go doc -all ./adapters/memory: %v\n%s", err, out)
	}
	method := regexp.MustCompile(`^func \(b \*Broker\) (\w+)\(`)
	decl := regexp.MustCompile(`^(?:type|var|func) (\w+)`)
	var methods []string
	for line := range strings.SplitSeq(string(out), "\n") {
		if m := method.FindStringSubmatch(line); m != nil {
			methods = append(methods, m[1])
			continue
		}
		if m := decl.FindStringSubmatch(line); m != nil {
			for _, bad := range []string{"Topic", "Subscription", "Fault", "SettleOp", "ErrTransient", "ErrCrashed"} {
				if m[1] == bad {
					t.Errorf("adapters/memory exports %s, which belongs to internal/memhook or keyordertest", bad)
				}
			}
		}
	}
	slices.Sort(methods)
	want := []string{"CreateSubscription", "CreateTopic", "OpenSubscription", "OpenTopic"}
	if !slices.Equal(methods, want) {
		t.Errorf("Broker's methods = %v, want %v", methods, want)
	}
}
