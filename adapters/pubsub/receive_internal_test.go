package pubsub

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/testenv"
	"github.com/keyorder/keyorder/policy"
)

// slowPull plays a server that holds a Pull: for the Pull RPC it waits
// hold (or until the call is cancelled, when nothing is leased), then lets
// the server lease and answer. Zero hold passes the call through.
type slowPull struct {
	hold       atomic.Int64 // time.Duration
	mu         sync.Mutex
	dispatched time.Time // when the last held Pull reached the server
}

func (sp *slowPull) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if _, ok := req.(*pubsubpb.PullRequest); ok {
		if h := time.Duration(sp.hold.Load()); h > 0 {
			t := time.NewTimer(h)
			defer t.Stop()
			select {
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			case <-t.C:
			}
			sp.mu.Lock()
			sp.dispatched = time.Now()
			sp.mu.Unlock()
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// receiveServers are the Pub/Sub servers the receive tests run on: pstest
// always, Google's emulator when testenv provides it. Each returns a client
// whose Pulls go through sp.
var receiveServers = []struct {
	name   string
	client func(t *testing.T, sp *slowPull) *gpubsub.Client
}{
	{"pstest", func(t *testing.T, sp *slowPull) *gpubsub.Client {
		srv := pstest.NewServer()
		t.Cleanup(func() { srv.Close() })
		c, err := gpubsub.NewClient(context.Background(), "keyorder-test",
			option.WithEndpoint(srv.Addr), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
			option.WithGRPCDialOption(grpc.WithChainUnaryInterceptor(sp.intercept)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}},
	{"emulator", func(t *testing.T, sp *slowPull) *gpubsub.Client {
		testenv.Require(t, testenv.PubSub)
		c, err := gpubsub.NewClient(context.Background(), "keyorder-test",
			option.WithGRPCDialOption(grpc.WithChainUnaryInterceptor(sp.intercept)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}},
}

var receiveSeq atomic.Int64

// receiveSetup makes a topic and an ordered subscription with a 60s ack
// deadline (so that a message stranded by a cancelled Pull would stay away
// far longer than the tests wait) and opens the subscription driver.
func receiveSetup(t *testing.T, client *gpubsub.Client) (*Subscription, func(ids ...string)) {
	t.Helper()
	ctx := context.Background()
	id := fmt.Sprintf("%d-%d", time.Now().UnixNano(), receiveSeq.Add(1))
	topicID, subID := "rt-"+id, "rs-"+id
	if err := CreateTopic(ctx, client, topicID); err != nil {
		t.Fatal(err)
	}
	opts := &SubscriptionOptions{Ordering: policy.Ordered, Lease: 60 * time.Second}
	if err := CreateSubscription(ctx, client, topicID, subID, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, s := range []string{subID, subID + "-dead-sub"} {
			client.SubscriptionAdminClient.DeleteSubscription(dctx, &pubsubpb.DeleteSubscriptionRequest{Subscription: subName(client.Project(), s)})
		}
		for _, tp := range []string{topicID, subID + "-dead"} {
			client.TopicAdminClient.DeleteTopic(dctx, &pubsubpb.DeleteTopicRequest{Topic: topicName(client.Project(), tp)})
		}
	})
	sub, err := openSubscription(ctx, client, subID, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	pub := client.Publisher(topicID)
	pub.EnableMessageOrdering = true
	t.Cleanup(pub.Stop)
	publish := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			if _, err := pub.Publish(ctx, &gpubsub.Message{Data: []byte(id), OrderingKey: "k", Attributes: map[string]string{AttrID: id}}).Get(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	return sub, publish
}

// receiveWithin receives until the messages with these IDs have all come,
// failing after d (far less than the subscription's 60s ack deadline).
func receiveWithin(t *testing.T, sub *Subscription, d time.Duration, ids ...string) []*driver.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var got []*driver.Message
	for len(got) < len(ids) {
		ms, err := sub.Receive(ctx, 10)
		if err != nil {
			t.Fatalf("waiting %v for %v: got %v, then %v (a message stranded until its ack deadline?)", d, ids, msgIDs(got), err)
		}
		got = append(got, ms...)
	}
	if g := msgIDs(got); strings.Join(g, ",") != strings.Join(ids, ",") {
		t.Fatalf("received %v, want %v", g, ids)
	}
	return got
}

func msgIDs(ms []*driver.Message) []string {
	var ids []string
	for _, m := range ms {
		ids = append(ids, m.ID)
	}
	return ids
}

// A Pull in flight when the consumer stops is not cancelled at once: the
// messages it brings during the grace come back with the context's error,
// and once released they are delivered again at once (not stranded until
// their ack deadline).
func TestReceiveStopHandsBackWhatAPullInFlightBrings(t *testing.T) {
	for _, srv := range receiveServers {
		t.Run(srv.name, func(t *testing.T) {
			sp := &slowPull{}
			sub, publish := receiveSetup(t, srv.client(t, sp))
			publish("a1")
			sp.hold.Store(int64(shutdownGrace / 2))
			ctx, cancel := context.WithCancel(context.Background())
			type result struct {
				ms  []*driver.Message
				err error
			}
			done := make(chan result, 1)
			go func() {
				ms, err := sub.Receive(ctx, 10)
				done <- result{ms, err}
			}()
			time.Sleep(shutdownGrace / 10) // the Pull is held by the server
			cancel()
			var r result
			select {
			case r = <-done:
			case <-time.After(shutdownGrace + 10*time.Second):
				t.Fatal("Receive did not return after its context ended")
			}
			if !errors.Is(r.err, context.Canceled) || strings.Join(msgIDs(r.ms), ",") != "a1" {
				t.Fatalf("Receive = %v, %v; want a1 with context.Canceled", msgIDs(r.ms), r.err)
			}
			if err := sub.Release(context.Background(), r.ms); err != nil {
				t.Fatal(err)
			}
			sp.hold.Store(0)
			receiveWithin(t, sub, 15*time.Second, "a1")
		})
	}
}

// Stopping while a Pull waits on an empty subscription, then publishing:
// the message is delivered promptly to the next Receive (the stopped Pull
// either brought it and it was released, or never leased it).
func TestReceiveStopWithPullInFlightLosesNothing(t *testing.T) {
	for _, srv := range receiveServers {
		t.Run(srv.name, func(t *testing.T) {
			sub, publish := receiveSetup(t, srv.client(t, &slowPull{}))
			for i := range 3 {
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan []*driver.Message, 1)
				go func() {
					ms, err := sub.Receive(ctx, 10)
					if err != nil && !errors.Is(err, context.Canceled) {
						t.Errorf("Receive = %v", err)
					}
					done <- ms
				}()
				time.Sleep(200 * time.Millisecond) // a Pull waits on the server
				cancel()
				id := fmt.Sprint("m", i)
				publish(id)
				var late []*driver.Message
				select {
				case late = <-done:
				case <-time.After(pullWait + 10*time.Second):
					t.Fatal("Receive did not return after its context ended")
				}
				if len(late) > 0 {
					if err := sub.Release(context.Background(), late); err != nil {
						t.Fatal(err)
					}
				}
				ms := receiveWithin(t, sub, 15*time.Second, id)
				if err := sub.Ack(context.Background(), ms); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// A server that holds a Pull does not hold up shutdown: Receive returns
// by the Pull's deadline (shutdownGrace at most) after the context ends,
// and Close ends a Receive in flight the same way.
func TestReceiveShutdownBounded(t *testing.T) {
	for _, srv := range receiveServers {
		t.Run(srv.name, func(t *testing.T) {
			sp := &slowPull{}
			sub, _ := receiveSetup(t, srv.client(t, sp))
			sp.hold.Store(int64(time.Hour))
			bound := shutdownGrace + 5*time.Second // generous: the machine is shared

			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := sub.Receive(ctx, 10)
				done <- err
			}()
			time.Sleep(100 * time.Millisecond)
			cancel()
			stopped := time.Now()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("Receive = %v, want context.Canceled", err)
				}
				if d := time.Since(stopped); d < shutdownGrace/2 {
					t.Fatalf("Receive returned %v after its context ended: the Pull was cancelled before its %v grace", d, shutdownGrace)
				}
			case <-time.After(bound):
				t.Fatalf("Receive still waiting %v after its context ended", bound)
			}

			go func() {
				_, err := sub.Receive(context.Background(), 10)
				done <- err
			}()
			time.Sleep(100 * time.Millisecond)
			closed := make(chan error, 1)
			go func() { closed <- sub.Close() }()
			select {
			case err := <-done:
				if !errors.Is(err, errClosed) {
					t.Fatalf("Receive during Close = %v, want errClosed", err)
				}
			case <-time.After(bound):
				t.Fatalf("Receive still waiting %v after Close", bound)
			}
			select {
			case err := <-closed:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(bound):
				t.Fatalf("Close still waiting after %v", bound)
			}
		})
	}
}

// Close with a Pull in flight: what the Pull brings during the grace is
// handed back to Pub/Sub, and another consumer gets it at once.
func TestCloseHandsBackWhatAPullInFlightBrings(t *testing.T) {
	for _, srv := range receiveServers {
		t.Run(srv.name, func(t *testing.T) {
			sp := &slowPull{}
			client := srv.client(t, sp)
			sub, publish := receiveSetup(t, client)
			publish("a1")
			sp.hold.Store(int64(shutdownGrace / 2))
			done := make(chan error, 1)
			go func() {
				ms, err := sub.Receive(context.Background(), 10)
				if len(ms) > 0 {
					err = fmt.Errorf("Receive returned %v after Close", msgIDs(ms))
				}
				done <- err
			}()
			time.Sleep(shutdownGrace / 10)
			if err := sub.Close(); err != nil {
				t.Fatal(err)
			}
			if err := <-done; !errors.Is(err, errClosed) {
				t.Fatalf("Receive = %v, want errClosed", err)
			}
			sp.hold.Store(0)
			other, err := openSubscription(context.Background(), client, sub.name, &SubscriptionOptions{Ordering: policy.Ordered})
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			receiveWithin(t, other, 15*time.Second, "a1")
		})
	}
}

// A message's lease is counted from when the server may have leased it: a
// Pull the server held for a while does not eat into the lease (the old
// accounting from when the Pull was sent would), and the driver never
// believes in more lease than the answer allows.
func TestReceiveLeaseCountedFromAnswer(t *testing.T) {
	for _, srv := range receiveServers {
		t.Run(srv.name, func(t *testing.T) {
			sp := &slowPull{}
			sub, publish := receiveSetup(t, srv.client(t, sp))
			publish("a1")
			hold := leaseSlack + leaseSlack/2
			sp.hold.Store(int64(hold))
			sent := time.Now()
			ms, err := sub.Receive(context.Background(), 10)
			answered := time.Now()
			if err != nil || len(ms) != 1 {
				t.Fatalf("Receive = %v, %v", ms, err)
			}
			sp.mu.Lock()
			dispatched := sp.dispatched
			sp.mu.Unlock()
			lease := sub.Capabilities().LeaseDuration
			d := ms[0].AckID.(*delivery)
			if !d.deadline.After(sent.Add(lease)) || d.deadline.Before(dispatched.Add(lease-leaseSlack)) {
				t.Fatalf("lease deadline %v after the Pull was sent, want at least %v (dispatched %v after sending, slack %v)",
					d.deadline.Sub(sent), dispatched.Add(lease-leaseSlack).Sub(sent), dispatched.Sub(sent), leaseSlack)
			}
			if d.deadline.After(answered.Add(lease)) {
				t.Fatalf("lease deadline %v after the answer, more than the %v lease", d.deadline.Sub(answered), lease)
			}
			// A fast answer counts from when the Pull was sent.
			sp.hold.Store(0)
			publish("b1")
			if err := sub.Ack(context.Background(), ms); err != nil {
				t.Fatal(err)
			}
			sent = time.Now()
			ms = receiveWithin(t, sub, 15*time.Second, "b1")
			if d := ms[0].AckID.(*delivery); d.deadline.After(time.Now().Add(lease)) || d.deadline.Before(sent.Add(lease)) {
				t.Fatalf("fast answer: lease deadline %v after sending, want from sending to the answer plus %v", d.deadline.Sub(sent), lease)
			}
			// Extending renews from the extension's own sending time.
			before := time.Now()
			if lost, err := sub.ExtendLeases(context.Background(), ms); err != nil || len(lost) != 0 {
				t.Fatalf("ExtendLeases = %v, %v", lost, err)
			}
			if d := ms[0].AckID.(*delivery); d.deadline.Before(before.Add(lease)) {
				t.Fatalf("extended deadline %v, want at least %v", d.deadline, before.Add(lease))
			}
		})
	}
}

// A Pull the server holds to its deadline (the service answers
// DEADLINE_EXCEEDED when nothing came) is an empty answer, not an error:
// Receive keeps waiting and returns the message published later.
func TestReceiveTreatsPullDeadlineAsEmpty(t *testing.T) {
	for _, srv := range receiveServers {
		t.Run(srv.name, func(t *testing.T) {
			sp := &slowPull{}
			sub, publish := receiveSetup(t, srv.client(t, sp))
			sp.hold.Store(int64(time.Hour)) // every Pull ends at its deadline
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			done := make(chan error, 1)
			var got []*driver.Message
			go func() {
				var err error
				got, err = sub.Receive(ctx, 10)
				done <- err
			}()
			time.Sleep(pullWait + pullWait/2) // at least one Pull expired
			sp.hold.Store(0)
			publish("a1")
			if err := <-done; err != nil || len(got) != 1 || got[0].ID != "a1" {
				t.Fatalf("Receive = %v, %v; want a1", msgIDs(got), err)
			}
		})
	}
}
