// Package doclinks holds tests of the repository's prose, so that it never
// contradicts the code:
//
//   - every relative link in README.md, docs/*.md, adapters/postgres/README.md
//     and integration/README.md leads to a file that exists, and every
//     #fragment to a heading of its page (documentation moves between pages
//     often, and a link that leads nowhere is found by a reader long after
//     the move);
//   - every list of backends in README.md, CONTRIBUTING.md, docs/*.md, the
//     package comments and the command's help names every registered scheme
//     (lists_test.go): each list was right once and drifted when a backend
//     was added;
//   - every benchmark figure quoted in README.md, docs/*.md and the
//     CHANGELOG's Unreleased section appears, at the precision quoted, in
//     the results files the benchmark runs write (figures_test.go).
//
// Each check has a test that runs it on text of its own with a known fault,
// so that a checker that finds nothing cannot pass unnoticed.
package doclinks
