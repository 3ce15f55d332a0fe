// Package doclinks holds a test of the repository's Markdown: every relative
// link in README.md, docs/*.md, adapters/postgres/README.md and
// integration/README.md must lead to a file that exists, and every
// #fragment to a heading of its page. Documentation moves between pages
// often (the README's detail went to docs/), and a link that leads nowhere
// is found by a reader long after the move; this finds it in CI.
package doclinks
