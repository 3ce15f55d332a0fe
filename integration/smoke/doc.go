// Package smoke holds smoke tests of the real servers started by
// integration/cmd/testenv. Each test talks to its broker with the broker's own
// Go client (no keyorder code) and checks the per-key ordering behaviour
// keyorder builds on. Without the servers the tests skip (see testenv.Require).
package smoke
