package nats_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyorder/keyorder"
	kn "github.com/keyorder/keyorder/adapters/nats"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/publish"
)

// ackProxy stands between one client and the test server, passing
// everything through except the server's messages (MSG, HMSG) whose
// subject drop says to drop: a server whose publish acknowledgements never
// come.
type ackProxy struct {
	ln   net.Listener
	drop atomic.Pointer[func(subject string) bool]
	wg   sync.WaitGroup
	mu   sync.Mutex
	cs   []net.Conn
}

func newAckProxy(t *testing.T) *ackProxy {
	t.Helper()
	u, err := url.Parse(os.Getenv("KEYORDER_NATS_URL"))
	if err != nil || u.Host == "" {
		t.Fatalf("KEYORDER_NATS_URL %q: %v", os.Getenv("KEYORDER_NATS_URL"), err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &ackProxy{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", u.Host)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.cs = append(p.cs, c, s)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(s, c); s.Close() }()
			go func() { defer p.wg.Done(); p.serverToClient(s, c); c.Close() }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.cs {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// url is the proxy's address as a NATS URL.
func (p *ackProxy) url() string { return "nats://" + p.ln.Addr().String() }

// setDrop makes the proxy drop the server's messages on the subjects f
// reports (nil: none).
func (p *ackProxy) setDrop(f func(subject string) bool) { p.drop.Store(&f) }

// serverToClient copies the server's protocol to the client frame by
// frame: "MSG subject sid [reply] size" or "HMSG subject sid [reply]
// hsize size", its payload and CRLF, dropped whole when drop says so;
// every other line as it is.
func (p *ackProxy) serverToClient(s, c net.Conn) {
	r := bufio.NewReaderSize(s, 64<<10)
	w := bufio.NewWriterSize(c, 64<<10)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		f := strings.Fields(line)
		frame := []byte(line)
		subject := ""
		if len(f) >= 3 && (f[0] == "MSG" || f[0] == "HMSG") {
			n, err := strconv.Atoi(f[len(f)-1])
			if err != nil {
				return
			}
			payload := make([]byte, n+2)
			if _, err := io.ReadFull(r, payload); err != nil {
				return
			}
			frame = append(frame, payload...)
			subject = f[1]
		}
		if d := p.drop.Load(); subject == "" || d == nil || *d == nil || !(*d)(subject) {
			if _, err := w.Write(frame); err != nil {
				return
			}
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}

// pubAck reports whether subject is the reply subject of the driver's
// publish acknowledgements, _INBOX.<id>.<batch>.<index>, and returns the
// batch and index (nats.go's own request replies have one token fewer).
func pubAck(subject string) (batch, index int, ok bool) {
	f := strings.Split(subject, ".")
	if len(f) != 4 || f[0] != "_INBOX" {
		return 0, 0, false
	}
	b, err1 := strconv.Atoi(f[2])
	i, err2 := strconv.Atoi(f[3])
	return b, i, err1 == nil && err2 == nil
}

// TestAckTimeout: a publish whose acknowledgements never come fails after
// TopicOptions.AckTimeout with an error matching
// jetstream.ErrAsyncPublishTimeout that counts the messages left
// unacknowledged, never as a success, though the server stored them all
// (only the answers are lost, between a real server and the client):
//   - the server answers the first 2 of 5 and then nothing: "3 of 5";
//   - the server stops answering altogether: "5 of 5";
//   - through the publisher, without retries, PublishBatch returns the
//     error for the batch; with retries, the batch is sent again once the
//     answers come back, and the stream's duplicate window stores each
//     message once.
func TestAckTimeout(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	direct := connect(t)
	stream := newStream(t, direct, 0)
	p := newAckProxy(t)
	nc, err := nats.Connect(p.url())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const timeout = time.Second
	td, err := kn.OpenTopicDriver(ctx, js, stream, &kn.TopicOptions{AckTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer td.Close()
	batch := func(prefix string) []*driver.Message {
		var ms []*driver.Message
		for i := range 5 {
			ms = append(ms, &driver.Message{ID: prefix + strconv.Itoa(i), Key: "k" + strconv.Itoa(i%2), Payload: []byte("x")})
		}
		return ms
	}
	stored := 0
	for _, c := range []struct {
		name string
		drop func(string) bool
		want string
	}{
		{"acks after the second lost", func(s string) bool { _, i, ok := pubAck(s); return ok && i >= 2 }, "3 of 5 messages unacknowledged"},
		{"server silent", func(string) bool { return true }, "5 of 5 messages unacknowledged"},
	} {
		p.setDrop(c.drop)
		err := td.SendBatch(ctx, batch(c.name))
		p.setDrop(nil)
		if !errors.Is(err, jetstream.ErrAsyncPublishTimeout) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: SendBatch = %v, want an error matching %v saying %q", c.name, err, jetstream.ErrAsyncPublishTimeout, c.want)
		}
		if !td.IsRetryable(err) {
			t.Errorf("%s: %v is not retryable", c.name, err)
		}
		stored += 5
		if got := len(streamMsgs(t, direct, stream)); got != stored {
			t.Errorf("%s: the stream holds %d messages, want %d (the server stored the batch; only its answers were lost)", c.name, got, stored)
		}
	}
	// The connection still works: a batch whose answers come succeeds.
	if err := td.SendBatch(ctx, batch("after")); err != nil {
		t.Fatalf("after the answers come back: %v", err)
	}
	stored += 5

	// Through the publisher. The driver's batches are numbered from 1 per
	// topic driver: drop every answer to its first batch.
	firstBatch := func(s string) bool { b, _, ok := pubAck(s); return ok && b == 1 }
	msgs := func(prefix string) []*keyorder.Message {
		var ms []*keyorder.Message
		for _, m := range batch(prefix) {
			ms = append(ms, &keyorder.Message{ID: m.ID, Key: m.Key, Payload: m.Payload})
		}
		return ms
	}
	for _, retries := range []int{-1, 2} {
		p.setDrop(firstBatch)
		pub, err := kn.OpenTopic(ctx, js, stream, &kn.TopicOptions{AckTimeout: timeout},
			&publish.Config{SendRetries: retries, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		// One key, so that the publisher sends one batch.
		ms := msgs("pub" + strconv.Itoa(retries))
		for _, m := range ms {
			m.Key = "p"
		}
		_, err = pub.PublishBatch(ctx, ms)
		p.setDrop(nil)
		_ = pub.Close(ctx)
		stored += 5
		switch {
		case retries < 0 && !errors.Is(err, jetstream.ErrAsyncPublishTimeout):
			t.Errorf("PublishBatch without retries, its answers lost: %v, want an error matching %v", err, jetstream.ErrAsyncPublishTimeout)
		case retries > 0 && err != nil:
			t.Errorf("PublishBatch with retries, the first try's answers lost: %v, want success", err)
		}
		if got := len(streamMsgs(t, direct, stream)); got != stored {
			t.Errorf("retries %d: the stream holds %d messages, want %d (a retried batch is deduplicated by its message IDs)", retries, got, stored)
		}
	}
}
