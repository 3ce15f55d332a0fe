// Package suggest finds the name a mistyped one was probably meant to be,
// for the "did you mean" of the library's URL errors and of the keyorder
// command. It is a package of its own, below everything, so that the URL
// parsing of the driver contract and the command share one rule for what
// counts as close.
package suggest

import "strings"

// Closest returns the candidate closest to name, or "" when none is close
// enough to be a likely typo. Names compare without case, '_' and '-'
// ("oldestFirst" and "oldest-first" are "oldest_first"); otherwise a
// candidate is close when its edit distance to name (insertions,
// deletions, substitutions and swaps of two neighbours) is at most 1 for
// names up to 4 characters, 2 up to 8, 3 above. A candidate that starts
// with name (a name cut short, "sub" of "subscription") is close when name
// has at least 3 characters. Ties go to the earlier candidate; name itself
// is never suggested.
func Closest(name string, candidates []string) string {
	n := fold(name)
	if n == "" {
		return ""
	}
	best, bestD := "", -1
	for _, c := range candidates {
		if c == name {
			continue
		}
		f := fold(c)
		d := distance(n, f)
		if d > budget(len(n)) && !(len(n) >= 3 && strings.HasPrefix(f, n)) {
			continue
		}
		if bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

func budget(n int) int {
	switch {
	case n <= 4:
		return 1
	case n <= 8:
		return 2
	}
	return 3
}

// fold lowers s and drops '_' and '-'.
func fold(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '_' || r == '-' {
			return -1
		}
		return r
	}, strings.ToLower(s))
}

// distance is the optimal string alignment distance of a and b (the
// Levenshtein distance with swaps of two neighbours counted as one edit).
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}
