package kafka_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/kafka"
	"github.com/keyorder/keyorder/integration/drivertest"
	"github.com/keyorder/keyorder/subscribe"
)

// TestAdminOpenDoesNotJoinGroup: opening a subscription only to read it
// (keyorder stats, dead list|show|redrive, held: subscribe.Open, then
// DeadLetters or Stats, then Close, no Receive) leaves a live group alone.
// It used to join the group at open: with a live consumer in the group
// that was two rebalances per command (the group moved partitions to the
// operator's process, revocation waited for the live member's records in
// flight, and moved them back on Close). The group is joined on the first
// Receive. Whether an operator that joined at open shows in the group by
// the time it has read depends on how fast its join reaches the broker;
// TestAdminOpenJoinsOnFirstReceive checks the driver itself.
func TestAdminOpenDoesNotJoinGroup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t)
	adm := kadm.NewClient(cl)
	name := createTopic(ctx, t, cl, 2)
	group := uniqueName("g")
	subURL := "kafka://" + strings.Join(brokers(t), ",") + "/" + name + "?group=" + group + "&session_timeout=6s"
	live, err := subscribe.Open(ctx, subURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close(context.Background())
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- live.Run(rctx, func(context.Context, *keyorder.Delivery) error { return nil }) }()
	defer func() { stop(); <-done }()
	// members describes the group, retrying while its coordinator is not
	// available yet (a fresh cluster creates __consumer_offsets on the
	// first group request).
	members := func() int {
		for {
			gs, err := adm.DescribeGroups(ctx, group)
			if err == nil {
				err = gs[group].Err
			}
			if err == nil {
				return len(gs[group].Members)
			}
			if errors.Is(err, kerr.GroupIDNotFound) {
				return 0 // no member joined yet
			}
			if !kerr.IsRetriable(err) || ctx.Err() != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for members() != 1 {
		if ctx.Err() != nil {
			t.Fatal("the live consumer did not join")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// What keyorder stats does.
	op, err := subscribe.Open(ctx, subURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.DeadLetters(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := op.Stats(ctx); err != nil {
		t.Fatal(err)
	}
	n := members()
	op.Close(ctx)
	if n != 1 {
		t.Errorf("the group had %d members while an operator read dead letters and stats, want 1 (the live consumer): each such command rebalances the group", n)
	}
}

// TestAdminOpenJoinsOnFirstReceive: the driver makes no group member at
// open, nor for the calls that need none (dead letters, redrive, and Ack,
// Release, ExtendLeases and Started of nothing received), and joins on
// the first Receive. Open still checks the topic and the member's
// options, and a subscription closed without receiving refuses Receive.
func TestAdminOpenJoinsOnFirstReceive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t)
	name := createTopic(ctx, t, cl, 2)
	tp, err := kafka.OpenTopicDriver(ctx, cl, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	send(ctx, t, tp, "k", "m0")

	bad := subOptions(t, drivertest.Spec{})
	bad.SessionTimeout = 50 * time.Millisecond // below franz-go's 100ms
	if s, err := kafka.OpenSubscriptionDriver(ctx, name, uniqueName("g"), bad); !errors.Is(err, keyorder.ErrInvalidConfig) {
		if s != nil {
			s.Close()
		}
		t.Errorf("a 50ms session timeout: %v, want ErrInvalidConfig at open", err)
	}

	s, err := kafka.OpenSubscriptionDriver(ctx, name, uniqueName("g"), subOptions(t, drivertest.Spec{}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if kafka.Joined(s) {
		t.Fatal("the subscription joined its group at open")
	}
	if dead, err := s.DeadLetters(ctx, 0); err != nil || len(dead) != 0 {
		t.Fatalf("DeadLetters: %v, %v; want none", dead, err)
	}
	var nd *keyorder.NotDeadLetterError
	if n, err := s.Redrive(ctx, []string{"nope"}); !errors.As(err, &nd) || n != 0 || !slices.Equal(nd.IDs, []string{"nope"}) {
		t.Fatalf("Redrive of an unknown ID: %d, %v; want 0, a NotDeadLetterError naming it", n, err)
	}
	if err := s.Ack(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if lost, err := s.ExtendLeases(ctx, nil); err != nil || len(lost) != 0 {
		t.Fatalf("ExtendLeases: %v, %v", lost, err)
	}
	if err := s.Started(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if kafka.Joined(s) {
		t.Fatal("the subscription joined its group to read dead letters")
	}
	ms := receiveN(ctx, t, s, 1)
	if !kafka.Joined(s) {
		t.Fatal("the subscription received without a group member")
	}
	if got := payloads(ms); len(got) != 1 || got[0] != "m0" {
		t.Fatalf("received %v, want [m0]", got)
	}
	if err := s.Ack(ctx, ms); err != nil {
		t.Fatal(err)
	}

	idle, err := kafka.OpenSubscriptionDriver(ctx, name, uniqueName("g"), subOptions(t, drivertest.Spec{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := idle.Close(); err != nil {
		t.Fatalf("Close without a Receive: %v", err)
	}
	if _, err := idle.Receive(ctx, 1); err == nil || kafka.Joined(idle) {
		t.Fatalf("Receive after Close: %v (joined %v), want an error and no member", err, kafka.Joined(idle))
	}
}
