package keyordertest

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyorder/keyorder/policy"
)

// Rule names a property the checker verifies.
type Rule string

// The rules. Which apply depends on Spec.Ordering.
const (
	// RuleOverlap (Exclusive, Ordered): two handlings of one key never run
	// at the same time.
	RuleOverlap Rule = "overlap"
	// RuleFirstOrder (Ordered): a key's messages are first handled in the
	// order they were published.
	RuleFirstOrder Rule = "first-handling order"
	// RuleHeadOfLine (Ordered): no message of a key is handled while a
	// message published before it on that key is unresolved (neither
	// acknowledged nor dead-lettered).
	RuleHeadOfLine Rule = "head of line"
	// RuleResolved (every policy): every published message is resolved:
	// acknowledged or dead-lettered.
	RuleResolved Rule = "resolved"
	// RuleDuplicate (with Spec.ForbidDuplicates): no message is handled
	// again after it was resolved.
	RuleDuplicate Rule = "duplicate"
	// RuleUnknown (every policy, when publishes were recorded): every
	// handled message was published in this run.
	RuleUnknown Rule = "unknown message"
)

// Spec says what a history must satisfy.
type Spec struct {
	// Ordering is the subscription's policy. Parallel checks resolution
	// only; Exclusive adds no overlap per key; Ordered (the zero value) adds
	// the order rules.
	Ordering policy.Ordering
	// DeadLettered lists the IDs of messages known to be dead-lettered
	// without a handling that says so: the subscriber dead-letters a
	// message whose attempts were used up by lost leases without calling
	// the handler. Read them from the driver's dead-letter store
	// (driver.DeadLetterStore). They count as resolved.
	DeadLettered []string
	// Unfinished skips RuleResolved, for a run stopped before every message
	// could be handled.
	Unfinished bool
	// ForbidDuplicates makes a handling after a message was resolved a
	// violation (RuleDuplicate). By default duplicates are allowed, as
	// delivery is at least once, and only counted in Report.Duplicates.
	ForbidDuplicates bool
}

// Violation is one broken rule.
type Violation struct {
	// Rule is the rule broken.
	Rule Rule
	// Key is the ordering key concerned ("" for a keyless message).
	Key string
	// IDs are the messages involved, the offending one first.
	IDs []string
	// Seq is where in the recorded history the rule broke (a Handling's
	// StartSeq or EndSeq; after every event for RuleResolved).
	Seq uint64
	// Explanation says in words what happened, and when.
	Explanation string
}

// Error returns the explanation.
func (v Violation) Error() string { return fmt.Sprintf("%s: %s", v.Rule, v.Explanation) }

// Report is the checker's account of a history.
type Report struct {
	// Ordering is the policy the history was checked against.
	Ordering policy.Ordering
	// Messages is the number of published messages; Handlings the number
	// of handler calls.
	Messages, Handlings int
	// Outcomes counts handlings by outcome.
	Outcomes map[Outcome]int
	// Duplicates counts, per message ID, the handlings that began after
	// the message was resolved.
	Duplicates map[string]int
	// Violations lists every broken rule, in the order they happened in
	// the history (the first first).
	Violations []Violation

	hist History
	t0   time.Time
}

// ErrViolation is matched (errors.Is) by the error Verify returns when a
// history breaks a rule.
var ErrViolation = errors.New("keyordertest: history breaks the ordering guarantee")

// ViolationError is the error Verify returns; it matches ErrViolation.
type ViolationError struct {
	// First is the earliest violation; Count is how many there are.
	First Violation
	Count int
}

// Error explains the first violation.
func (e *ViolationError) Error() string {
	more := ""
	if e.Count > 1 {
		more = fmt.Sprintf(" (and %d more)", e.Count-1)
	}
	return fmt.Sprintf("keyordertest: %s rule broken%s: %s", e.First.Rule, more, e.First.Explanation)
}

// Is reports whether target is ErrViolation.
func (e *ViolationError) Is(target error) bool { return target == ErrViolation }

// Err returns nil when the history keeps every rule, else a
// *ViolationError explaining the first violation.
func (r *Report) Err() error {
	if len(r.Violations) == 0 {
		return nil
	}
	return &ViolationError{First: r.Violations[0], Count: len(r.Violations)}
}

// Timeline returns the handlings of key, one a line, with their times
// relative to the first recorded handling: what to read when a rule broke.
func (r *Report) Timeline(key string) string {
	var b strings.Builder
	for _, h := range r.hist.Handlings {
		if h.Key != key {
			continue
		}
		end := "still running"
		if h.EndSeq != 0 {
			end = "ended " + r.at(h.End)
		}
		fmt.Fprintf(&b, "  #%d %s attempt %d: started %s, %s: %s", h.StartSeq, h.Label, h.Attempt, r.at(h.Start), end, h.Outcome)
		if h.Err != nil {
			fmt.Fprintf(&b, " (%v)", h.Err)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func (r *Report) at(t time.Time) string { return "at +" + t.Sub(r.t0).String() }

// Check verifies the Recorder's history against spec and reports the first
// violation with t.Error, with the offending key's timeline. It returns the
// report either way.
func Check(t testing.TB, rec *Recorder, spec Spec) *Report {
	t.Helper()
	rep, err := Verify(rec.History(), spec)
	if err != nil {
		var ve *ViolationError
		msg := err.Error()
		if errors.As(err, &ve) {
			msg += "\nhandlings of key " + fmt.Sprintf("%q", ve.First.Key) + ":\n" + rep.Timeline(ve.First.Key)
		}
		t.Error(msg)
	}
	return rep
}

// msgState is what the checker knows of one message.
type msgState struct {
	p        Published
	index    int // publish position within its key
	first    *Handling
	resolved *Handling // first resolving handling
	dead     bool      // in Spec.DeadLettered
	count    int
}

// Verify checks a history against spec. It returns the report and, when a
// rule is broken, a *ViolationError (matching ErrViolation) that explains
// the first violation in words: which key, which messages, what happened
// and when. Handlings recorded as Abandoned (their context was cancelled
// because the lease was lost or the subscriber stopped) decide nothing and
// are not held against the overlap and order rules: the library cancels a
// handler whose lease is lost, and a handler that keeps running after that
// may overlap the redelivery.
//
// Each rule is a method of verifier: per message (RuleUnknown,
// RuleDuplicate), overlap (RuleOverlap, under Exclusive and Ordered),
// first order and head of line (RuleFirstOrder, RuleHeadOfLine, under
// Ordered), and resolution (RuleResolved, unless Spec.Unfinished).
func Verify(h History, spec Spec) (*Report, error) {
	c := newVerifier(h, spec)
	c.perMessage()
	ordered := spec.Ordering == policy.Ordered
	if ordered || spec.Ordering == policy.Exclusive {
		c.overlap()
	}
	if ordered {
		keyHs := map[string][]*Handling{}
		for i := range c.hs {
			keyHs[c.hs[i].Key] = append(keyHs[c.hs[i].Key], &c.hs[i])
		}
		for _, key := range slices.Sorted(maps.Keys(c.byKey)) {
			if key == "" {
				continue
			}
			c.firstOrder(key)
			c.headOfLine(key, keyHs[key])
		}
	}
	if !spec.Unfinished {
		c.resolved()
	}
	rep := c.rep
	slices.SortStableFunc(rep.Violations, func(a, b Violation) int { return cmp.Compare(a.Seq, b.Seq) })
	return rep, rep.Err()
}

// verifier is one run of Verify: the history sorted by start, what is known
// of each message, and the report the rules add their violations to.
type verifier struct {
	h      History
	spec   Spec
	rep    *Report
	hs     []Handling // by StartSeq
	maxSeq uint64
	msgs   map[string]*msgState
	byKey  map[string][]*msgState // in publish order
}

func newVerifier(h History, spec Spec) *verifier {
	rep := &Report{
		Ordering:   spec.Ordering,
		Messages:   len(h.Published),
		Handlings:  len(h.Handlings),
		Outcomes:   map[Outcome]int{},
		Duplicates: map[string]int{},
		hist:       h,
	}
	hs := slices.Clone(h.Handlings)
	h.Handlings = hs
	slices.SortStableFunc(hs, func(a, b Handling) int { return cmp.Compare(a.StartSeq, b.StartSeq) })
	if len(hs) > 0 {
		rep.t0 = hs[0].Start
	}
	c := &verifier{h: h, spec: spec, rep: rep, hs: hs, msgs: map[string]*msgState{}, byKey: map[string][]*msgState{}}
	for _, x := range hs {
		c.maxSeq = max(c.maxSeq, x.StartSeq, x.EndSeq)
	}
	dead := map[string]bool{}
	for _, id := range spec.DeadLettered {
		dead[id] = true
	}
	for _, p := range h.Published {
		if _, dup := c.msgs[p.ID]; dup {
			continue
		}
		st := &msgState{p: p, index: len(c.byKey[p.Key]), dead: dead[p.ID]}
		c.msgs[p.ID] = st
		c.byKey[p.Key] = append(c.byKey[p.Key], st)
	}
	return c
}

// violation adds a violation of rule to the report.
func (c *verifier) violation(rule Rule, key string, seq uint64, ids []string, format string, args ...any) {
	c.rep.Violations = append(c.rep.Violations, Violation{Rule: rule, Key: key, IDs: ids, Seq: seq, Explanation: fmt.Sprintf(format, args...)})
}

func name(x *Handling) string  { return fmt.Sprintf("%s (ID %s)", x.Label, x.ID) }
func pname(p Published) string { return fmt.Sprintf("%s (ID %s)", p.Label, p.ID) }

// perMessage finds each message's first handling and first resolution,
// counts outcomes and duplicates, and checks RuleUnknown (a handled
// message that was never published, when anything was) and RuleDuplicate
// (a handling after the resolution, when Spec.ForbidDuplicates).
func (c *verifier) perMessage() {
	rep := c.rep
	checkUnknown := len(c.h.Published) > 0
	for i := range c.hs {
		x := &c.hs[i]
		rep.Outcomes[x.Outcome]++
		st := c.msgs[x.ID]
		if st == nil {
			if checkUnknown {
				c.violation(RuleUnknown, x.Key, x.StartSeq, []string{x.ID},
					"key %q: message %s was handled %s (attempt %d) but was never published in this run",
					x.Key, name(x), rep.at(x.Start), x.Attempt)
			}
			st = &msgState{p: Published{Key: x.Key, ID: x.ID, Label: x.Label}, index: -1}
			c.msgs[x.ID] = st
		}
		st.count++
		if st.first == nil {
			st.first = x
		}
		if st.resolved != nil && x.StartSeq > st.resolved.EndSeq {
			rep.Duplicates[x.ID]++
			if c.spec.ForbidDuplicates {
				c.violation(RuleDuplicate, x.Key, x.StartSeq, []string{x.ID},
					"key %q: message %s was handled again %s (attempt %d) after it was resolved %s (%s)",
					x.Key, name(x), rep.at(x.Start), x.Attempt, rep.at(st.resolved.End), st.resolved.Outcome)
			}
			continue
		}
		if st.resolved == nil && x.Outcome.Resolves() {
			st.resolved = x
		}
	}
}

// overlap checks RuleOverlap: per key, no handling starts while another
// of its key runs.
func (c *verifier) overlap() {
	rep := c.rep
	running := map[string][]*Handling{}
	for i := range c.hs {
		x := &c.hs[i]
		if x.Key == "" || x.Outcome == Abandoned {
			continue
		}
		live := running[x.Key][:0:0]
		for _, o := range running[x.Key] {
			if o.EndSeq == 0 || o.EndSeq > x.StartSeq {
				live = append(live, o)
			}
		}
		if len(live) > 0 {
			o := live[0]
			end := "had not returned"
			if o.EndSeq != 0 {
				end = "returned only " + rep.at(o.End)
			}
			c.violation(RuleOverlap, x.Key, x.StartSeq, []string{x.ID, o.ID},
				"key %q: message %s (attempt %d) started %s while message %s (attempt %d), started %s, was still being handled (it %s); under %v at most one message of a key is handled at a time",
				x.Key, name(x), x.Attempt, rep.at(x.Start), name(o), o.Attempt, rep.at(o.Start), end, c.spec.Ordering)
		}
		running[x.Key] = append(live, x)
	}
}

// firstOrder checks RuleFirstOrder for key: its messages are first handled
// in publish order (the first violation only).
func (c *verifier) firstOrder(key string) {
	rep := c.rep
	var handled []*msgState
	for _, st := range c.byKey[key] {
		if st.first != nil {
			handled = append(handled, st)
		}
	}
	slices.SortFunc(handled, func(a, b *msgState) int { return cmp.Compare(a.first.StartSeq, b.first.StartSeq) })
	for i := 1; i < len(handled); i++ {
		a, b := handled[i-1], handled[i]
		if b.index < a.index {
			c.violation(RuleFirstOrder, key, a.first.StartSeq, []string{a.p.ID, b.p.ID},
				"key %q: message %s was first handled %s, before message %s, which was published before it and first handled only %s",
				key, pname(a.p), rep.at(a.first.Start), pname(b.p), rep.at(b.first.Start))
			return
		}
	}
}

// headOfLine checks RuleHeadOfLine for key, whose handlings are keyHs: a
// handling of message i starts only after every earlier message of its key
// was resolved. block[i] is the earlier message resolved last (never:
// math.MaxUint64), so each handling is checked in constant time.
func (c *verifier) headOfLine(key string, keyHs []*Handling) {
	rep := c.rep
	list := c.byKey[key]
	type blocker struct {
		end uint64
		st  *msgState
	}
	block := make([]blocker, len(list))
	for i := 1; i < len(list); i++ {
		block[i] = block[i-1]
		e := list[i-1]
		end := uint64(0)
		switch {
		case e.resolved != nil:
			end = e.resolved.EndSeq
		case e.dead:
			// dead-lettered by the subscriber, time unknown
		default:
			end = math.MaxUint64
		}
		if end > block[i].end {
			block[i] = blocker{end: end, st: e}
		}
	}
	for _, x := range keyHs {
		st := c.msgs[x.ID]
		if x.Outcome == Abandoned || st.index < 0 || st.p.Key != key {
			continue
		}
		if st.resolved != nil && x.StartSeq > st.resolved.EndSeq {
			continue // a duplicate
		}
		b := block[st.index]
		if b.st == nil || b.end < x.StartSeq {
			continue
		}
		e := b.st
		what := "was never resolved"
		if e.resolved != nil {
			what = fmt.Sprintf("was resolved only %s (%s)", rep.at(e.resolved.End), e.resolved.Outcome)
		} else if e.first == nil {
			what = "had not been handled at all and was never resolved"
		}
		c.violation(RuleHeadOfLine, key, x.StartSeq, []string{x.ID, e.p.ID},
			"key %q: message %s (attempt %d) started %s while message %s, published before it, was unresolved: it %s; under Ordered a key's next message waits until the one before it is acknowledged or dead-lettered",
			key, name(x), x.Attempt, rep.at(x.Start), pname(e.p), what)
	}
}

// resolved checks RuleResolved: every published message was acknowledged
// or dead-lettered.
func (c *verifier) resolved() {
	rep := c.rep
	lastOf := map[string]*Handling{}
	for i := range c.hs {
		lastOf[c.hs[i].ID] = &c.hs[i]
	}
	seen := map[string]bool{}
	for _, p := range c.h.Published {
		st := c.msgs[p.ID]
		if seen[p.ID] || st.resolved != nil || st.dead {
			continue
		}
		what := "it was never handled"
		if st.first != nil {
			last := lastOf[p.ID]
			what = fmt.Sprintf("it was handled %d times, the last (attempt %d) started %s: %s", st.count, last.Attempt, rep.at(last.Start), last.Outcome)
			if st.count == 1 {
				what = fmt.Sprintf("it was handled once (attempt %d), started %s: %s", last.Attempt, rep.at(last.Start), last.Outcome)
			}
			if last.Err != nil {
				what += fmt.Sprintf(" (%v)", last.Err)
			}
		}
		seen[p.ID] = true
		c.violation(RuleResolved, p.Key, c.maxSeq+1, []string{p.ID},
			"key %q: message %s was neither acknowledged nor dead-lettered: %s", p.Key, pname(p), what)
	}
}
