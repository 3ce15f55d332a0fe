// Package comingfrom holds the programs of the "Coming from" pages
// (docs/coming-from-*.md): one small consumer written with each library a
// team may be moving from — watermill, river, franzgo, gocloud — and the
// same consumer on keyorder, in keyorder. Each applies five balance
// adjustments to two accounts; the first attempt of adjustment 101 fails.
// They are compiled in CI; the in-memory ones also run in its tests.
package comingfrom
