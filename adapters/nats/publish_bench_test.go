package nats_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
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
		b.Run("Raw/"+suffix, func(b *testing.B) {
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
			for i := range b.N {
				m := &nats.Msg{Subject: subjects[i%len(keys)], Data: payload}
				if msgID {
					m.Header = nats.Header{}
					m.Header.Set(nats.MsgIdHdr, fmt.Sprintf("%08x-0000-7000-8000-%012x", base, i))
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
		})
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
			for i := range b.N {
				rs[i] = p.PublishAsync(ctx, &keyorder.Message{Key: keys[i%len(keys)], Payload: payload})
			}
			for _, r := range rs {
				if _, err := r.Get(ctx); err != nil {
					b.Fatal(err)
				}
			}
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
