package suggest

import "testing"

func TestClosest(t *testing.T) {
	params := []string{"subscription", "ordering", "lease", "max_batch", "oldest_first", "topic", "create"}
	for _, tc := range []struct{ name, want string }{
		{"subscripton", "subscription"},  // a letter left out
		{"subsciprtion", "subscription"}, // two letters swapped
		{"Subscription", "subscription"}, // case
		{"oldestFirst", "oldest_first"},  // camelCase
		{"oldest-first", "oldest_first"}, // dashes
		{"maxbatch", "max_batch"},
		{"leese", "lease"},
		{"sub", "subscription"}, // cut short
		{"order", "ordering"},
		{"password", ""}, // nothing close
		{"x", ""},
		{"", ""},
		{"topic", ""}, // the name itself is not a suggestion
	} {
		if got := Closest(tc.name, params); got != tc.want {
			t.Errorf("Closest(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
	cmds := []string{"dead", "stats", "held", "publish", "tail", "version"}
	for _, tc := range []struct{ name, want string }{
		{"stat", "stats"}, {"pubish", "publish"}, {"tial", "tail"}, {"versoin", "version"}, {"redrive", ""}, {"list", ""},
	} {
		if got := Closest(tc.name, cmds); got != tc.want {
			t.Errorf("Closest(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		d    int
	}{
		{"", "", 0}, {"a", "", 1}, {"", "abc", 3}, {"kitten", "sitting", 3}, {"ab", "ba", 1}, {"abcd", "acbd", 1}, {"héllo", "hello", 1},
	} {
		if got := distance(tc.a, tc.b); got != tc.d {
			t.Errorf("distance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.d)
		}
	}
}
