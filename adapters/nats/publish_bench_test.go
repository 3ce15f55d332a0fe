package nats_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyorder/keyorder"
	kn "github.com/keyorder/keyorder/adapters/nats"
	"github.com/keyorder/keyorder/publish"
)

// benchKeys is how many keys the publish benchmarks spread messages over.
const benchKeys = 200

// benchStream creates a stream for a publish benchmark, deleted with it:
// a keyorder stream of 8 partitions (as integration/bench makes), or, for
// the raw client, a plain stream with the same duplicate window.
func benchStream(b *testing.B, js jetstream.JetStream, keyorderStream bool) string {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := uniqueName("B")
	var err error
	if keyorderStream {
		_, err = kn.EnsureStream(ctx, js, name, 8)
	} else {
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Duplicates: 2 * time.Minute})
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, name)
	})
	return name
}

// BenchmarkPublish publishes b.N messages of 100 B over 200 keys to a real
// nats-server (KEYORDER_NATS_URL), every message asynchronously and then
// every acknowledgement waited for, as integration/bench does:
//
//   - Raw: nats.go's PublishMsgAsync on its own, each key in its own
//     subject, with and without a 36-character Nats-Msg-Id;
//   - Async: keyorder's PublishAsync from one goroutine;
//   - Batch: keyorder's PublishBatch, 1,000 messages a call from four
//     goroutines, each owning a quarter of the keys;
//
// keyorder's with its default message IDs (msgid=on) and with
// TopicOptions.NoMsgID (msgid=off). ns/op and allocs/op are per message
// and count the client's side only where the server shares the machine:
// compare them with -cpuprofile, which shows where a message's CPU goes.
func BenchmarkPublish(b *testing.B) {
	payload := make([]byte, 100)
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%03d", i)
	}
	for _, msgID := range []bool{true, false} {
		suffix := map[bool]string{true: "msgid=on", false: "msgid=off"}[msgID]
		for _, header := range []bool{false, true} {
			name := "Raw/" + suffix
			if header {
				if msgID {
					continue
				}
				name = "Raw/header"
			}
			b.Run(name, func(b *testing.B) {
				js := connect(b)
				stream := benchStream(b, js, false)
				subjects := make([]string, len(keys))
				for i, k := range keys {
					subjects[i] = stream + "." + hex.EncodeToString([]byte(k))
				}
				base := uint32(time.Now().UnixNano())
				futs := make([]jetstream.PubAckFuture, 0, b.N)
				b.ReportAllocs()
				b.ResetTimer()
				srv := startServerCPU(b)
				for i := range b.N {
					m := &nats.Msg{Subject: subjects[i%len(keys)], Data: payload}
					switch {
					case msgID:
						m.Header = nats.Header{}
						m.Header.Set(nats.MsgIdHdr, fmt.Sprintf("%08x-0000-7000-8000-%012x", base, i))
					case header:
						// The header keyorder sends with msg_id=off: the ID,
						// which the server parses and stores but does not
						// check.
						m.Header = nats.Header{}
						m.Header.Set(kn.HeaderID, fmt.Sprintf("%08x-0000-7000-8000-%012x", base, i))
					}
					f, err := publishStalled(js, m)
					if err != nil {
						b.Fatal(err)
					}
					futs = append(futs, f)
				}
				<-js.PublishAsyncComplete()
				for _, f := range futs {
					select {
					case <-f.Ok():
					case err := <-f.Err():
						b.Fatal(err)
					}
				}
				srv.report(b)
			})
		}
		open := func(b *testing.B) *publish.Publisher {
			js := connect(b)
			stream := benchStream(b, js, true)
			p, err := kn.OpenTopic(context.Background(), js, stream, &kn.TopicOptions{NoMsgID: !msgID}, &publish.Config{MaxBatch: 1000})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = p.Close(context.Background()) })
			return p
		}
		b.Run("Async/"+suffix, func(b *testing.B) {
			p := open(b)
			ctx := context.Background()
			rs := make([]*publish.Result, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			srv := startServerCPU(b)
			for i := range b.N {
				rs[i] = p.PublishAsync(ctx, &keyorder.Message{Key: keys[i%len(keys)], Payload: payload})
			}
			for _, r := range rs {
				if _, err := r.Get(ctx); err != nil {
					b.Fatal(err)
				}
			}
			srv.report(b)
		})
		b.Run("Batch/"+suffix, func(b *testing.B) {
			p := open(b)
			ctx := context.Background()
			// Four goroutines, each owning a quarter of the keys, as
			// integration/bench publishes.
			shares := make([][]*keyorder.Message, 4)
			for i := range b.N {
				k := i % len(keys)
				shares[k%4] = append(shares[k%4], &keyorder.Message{Key: keys[k], Payload: payload})
			}
			errs := make(chan error, len(shares))
			b.ReportAllocs()
			b.ResetTimer()
			srv := startServerCPU(b)
			for _, share := range shares {
				go func() {
					for c := range slices.Chunk(share, 1000) {
						if _, err := p.PublishBatch(ctx, c); err != nil {
							errs <- err
							return
						}
					}
					errs <- nil
				}()
			}
			for range shares {
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			}
			srv.report(b)
		})
	}
}

// publishStalled publishes m, waiting for the client's async window to
// drain when it is full, as an application would.
func publishStalled(js jetstream.JetStream, m *nats.Msg) (jetstream.PubAckFuture, error) {
	for {
		f, err := js.PublishMsgAsync(m)
		if err != jetstream.ErrTooManyStalledMsgs {
			return f, err
		}
		<-js.PublishAsyncComplete()
	}
}

// serverCPU measures the CPU time the test server's process (nats-server
// on this machine, found by its port) spends during a benchmark, from
// /proc: reported per message as server-ns/op, it is the server's side of
// a publish, which the client's profile does not show. Others' use of the
// same server counts too; nothing is reported where /proc or the process
// cannot be read.
type serverCPU struct {
	stat  string // the server's /proc/<pid>/stat
	start time.Duration
}

func startServerCPU(b *testing.B) *serverCPU {
	u, err := url.Parse(os.Getenv("KEYORDER_NATS_URL"))
	if err != nil || u.Port() == "" {
		return nil
	}
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		cmd, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err != nil || !bytes.Contains(cmd, []byte("nats-server")) {
			continue
		}
		args := strings.Split(string(cmd), "\x00")
		if i := slices.Index(args, "-p"); i >= 0 && i+1 < len(args) && args[i+1] == u.Port() {
			s := &serverCPU{stat: "/proc/" + d.Name() + "/stat"}
			if s.start, err = procCPU(s.stat); err != nil {
				return nil
			}
			return s
		}
	}
	return nil
}

// report reports the server's CPU per message since start.
func (s *serverCPU) report(b *testing.B) {
	if s == nil {
		return
	}
	end, err := procCPU(s.stat)
	if err != nil {
		return
	}
	b.ReportMetric(float64(end-s.start)/float64(b.N), "server-ns/op")
}

// procCPU reads a process's user and system CPU time from its stat file.
func procCPU(path string) (time.Duration, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	// The fields after the command's closing parenthesis: state is the
	// 3rd field of the file, utime the 14th and stime the 15th.
	rest := raw[bytes.LastIndexByte(raw, ')')+2:]
	f := strings.Fields(string(rest))
	if len(f) < 13 {
		return 0, fmt.Errorf("%s: %d fields", path, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("%s: utime %q stime %q", path, f[11], f[12])
	}
	// USER_HZ is 100 on Linux.
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}
