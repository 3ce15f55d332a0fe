package driverkit

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

func TestPrepare(t *testing.T) {
	m := &keyorder.Message{Headers: map[string]string{keyorder.HeaderPartitionKey: "hk", "a": "1"}}
	am, err := Prepare(m, "dk", true, driver.Limits{})
	if err != nil || am.Key != "hk" || len(am.Headers) != 1 || am.ID == "" || m.ID != "" {
		t.Fatalf("Prepare = %+v, %v (m.ID %q: the caller's message must not change)", am, err, m.ID)
	}
	if _, err := Prepare(&keyorder.Message{}, "", true, driver.Limits{}); !errors.Is(err, keyorder.ErrMissingKey) {
		t.Fatalf("keyless: %v", err)
	}
	bad := &keyorder.Message{Key: "k", Headers: map[string]string{"a": "\x00"}}
	if _, err := Prepare(bad, "", true, driver.Limits{}); !errors.Is(err, keyorder.ErrInvalidMessage) || bad.ID != "" {
		t.Fatalf("invalid: %v (ID %q: a rejected message gets no ID)", err, bad.ID)
	}
}

func TestDeadLetterOf(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 123, time.UTC)
	pub := at.Add(time.Second)
	m := &driver.Message{ID: "m1", Key: "k", PublishTime: pub, Headers: map[string]string{
		HeaderDeadReason: "permanent: bad", HeaderDeadAttempts: "3", HeaderDeadAt: at.Format(time.RFC3339Nano), "h": "v",
	}}
	dl := DeadLetterOf(m)
	if dl.Reason != "permanent: bad" || dl.Attempts != 3 || !dl.DeadAt.Equal(at) {
		t.Errorf("dead letter %q, %d, %v; want the headers' reason, attempts and time", dl.Reason, dl.Attempts, dl.DeadAt)
	}
	if len(dl.Message.Headers) != 1 || dl.Message.Headers["h"] != "v" || dl.Message.ID != "m1" {
		t.Errorf("message %+v: want the user's header only", dl.Message)
	}
	bare := DeadLetterOf(&driver.Message{PublishTime: pub, Headers: map[string]string{HeaderDeadAt: "yesterday"}})
	if !bare.DeadAt.Equal(pub) || bare.Message.Headers != nil || bare.Reason != "" || bare.Attempts != 0 {
		t.Errorf("malformed time, no reason: %+v; want the publish time and nil headers", bare)
	}
}

type closer struct{ closed int }

func (c *closer) Close() error { c.closed++; return errors.New("close failed") }

// TestPortable: the opener's error comes back as is and nothing is built;
// a refused driver is closed and both errors come back; an accepted one is
// returned open.
func TestPortable(t *testing.T) {
	errOpen, errRefused := errors.New("open failed"), errors.New("bad config")
	built := 0
	newP := func(c *closer, cfg *int) (string, error) {
		built++
		if *cfg < 0 {
			return "", errRefused
		}
		return "portable", nil
	}
	good, bad := 1, -1

	c := &closer{}
	if p, err := Portable(newP, &good)(c, errOpen); p != "" || err != errOpen || built != 0 || c.closed != 0 {
		t.Errorf("opener failed: %q, %v, built %d, closed %d; want its error alone, nothing built or closed", p, err, built, c.closed)
	}
	if p, err := Portable(newP, &bad)(c, nil); p != "" || !errors.Is(err, errRefused) || err == nil || !strings.Contains(err.Error(), "close failed") || c.closed != 1 {
		t.Errorf("refused: %q, %v, closed %d; want both errors and the driver closed once", p, err, c.closed)
	}
	c = &closer{}
	if p, err := Portable(newP, &good)(c, nil); p != "portable" || err != nil || c.closed != 0 {
		t.Errorf("accepted: %q, %v, closed %d; want the portable type and the driver open", p, err, c.closed)
	}
}

func dead(id, reason string) driver.DeadLetter {
	return driver.DeadLetter{Message: driver.Message{ID: id}, Reason: reason}
}

// TestDeadLog: a marker removes what came before it, a dead letter written
// again after its redrive is listed once, as last written, and the order is
// that of the IDs' first appearance.
func TestDeadLog(t *testing.T) {
	var l DeadLog
	if got := l.Letters(); len(got) != 0 {
		t.Fatalf("empty log: %v", got)
	}
	l.Add(dead("a", "1"))
	l.Add(dead("b", "1"))
	l.Redriven("a")
	l.Add(dead("c", "1"))
	l.Add(dead("a", "2")) // dead again after its redrive
	l.Add(dead("b", "2"))
	l.Redriven("nope")
	var got []string
	for _, dl := range l.Letters() {
		got = append(got, dl.Message.ID+dl.Reason)
	}
	if want := []string{"a2", "b2", "c1"}; !slices.Equal(got, want) {
		t.Errorf("Letters = %v, want %v", got, want)
	}
}

// TestLogStore: DeadLetters honours its limit; Redrive republishes only the
// listed IDs that are dead letters (naming the others in its error), clears their not-before time, marks
// each, counts a republished one whose mark failed, and stops at the
// first failure; Ready's error stops it before anything is sent.
func TestLogStore(t *testing.T) {
	nb := time.Unix(100, 0)
	letters := []driver.DeadLetter{dead("a", ""), dead("b", ""), dead("c", "")}
	for i := range letters {
		letters[i].Message.NotBefore = nb
	}
	var sent, marked []string
	failMark := ""
	errMark, errReady := errors.New("mark failed"), errors.New("no producer")
	var ready error
	s := LogStore{
		Read:  func(context.Context) ([]driver.DeadLetter, error) { return letters, nil },
		Ready: func() error { return ready },
		Republish: func(_ context.Context, m *driver.Message) error {
			if !m.NotBefore.IsZero() {
				t.Errorf("republished %s with its not-before time", m.ID)
			}
			sent = append(sent, m.ID)
			return nil
		},
		MarkRedriven: func(_ context.Context, id string) error {
			if id == failMark {
				return errMark
			}
			marked = append(marked, id)
			return nil
		},
	}
	ctx := context.Background()
	if dls, err := s.DeadLetters(ctx, 2); err != nil || len(dls) != 2 || dls[1].Message.ID != "b" {
		t.Errorf("DeadLetters(2) = %v, %v", dls, err)
	}
	if dls, _ := s.DeadLetters(ctx, 0); len(dls) != 3 {
		t.Errorf("DeadLetters(0) = %d letters, want all 3", len(dls))
	}
	var nd *keyorder.NotDeadLetterError
	if n, err := s.Redrive(ctx, []string{"c", "x", "a"}); n != 2 || !errors.As(err, &nd) || !slices.Equal(nd.IDs, []string{"x"}) || !slices.Equal(sent, []string{"a", "c"}) || !slices.Equal(marked, []string{"a", "c"}) {
		t.Errorf("Redrive(c, x, a) = %d, %v; sent %v, marked %v; want 2, x named as no dead letter, a and c in log order", n, err, sent, marked)
	}
	sent, marked = nil, nil
	if n, err := s.Redrive(ctx, []string{"b"}); n != 1 || err != nil || !slices.Equal(sent, []string{"b"}) {
		t.Errorf("Redrive(b) = %d, %v, sent %v; want 1, nil", n, err, sent)
	}
	if letters[0].Message.NotBefore != nb {
		t.Error("Redrive changed the letters Read returned")
	}
	sent, marked, failMark = nil, nil, "a"
	if n, err := s.Redrive(ctx, []string{"a", "b"}); n != 1 || !errors.Is(err, errMark) || !slices.Equal(sent, []string{"a"}) {
		t.Errorf("mark of a fails: %d, %v, sent %v; want 1 (a was republished), its error, b not sent", n, err, sent)
	}
	sent, ready = nil, errReady
	if n, err := s.Redrive(ctx, []string{"a"}); n != 0 || !errors.Is(err, errReady) || len(sent) != 0 {
		t.Errorf("Ready fails: %d, %v, sent %v; want 0, its error, nothing sent", n, err, sent)
	}
}
