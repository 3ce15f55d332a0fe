package publish_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
)

// TestKeyFunc: a composite key defined at the mount site is used when the
// message has neither Message.Key nor the partition-key header; a missing
// part follows the missing-key policy.
func TestKeyFunc(t *testing.T) {
	kf := keyorder.CompositeKey(keyorder.FairnessKeyPart(), keyorder.HeaderPart("account"))
	_, p, s := setup(t, &publish.Config{KeyFunc: kf})
	ctx := context.Background()
	hdr := func(kv ...string) map[string]string {
		h := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			h[kv[i]] = kv[i+1]
		}
		return h
	}
	for _, m := range []*keyorder.Message{
		{Headers: hdr(keyorder.HeaderFairnessKey, "t7", "account", "42")},
		{Key: "explicit", Headers: hdr(keyorder.HeaderFairnessKey, "t7", "account", "42")},
		{Headers: hdr(keyorder.HeaderPartitionKey, "header", "account", "42")},
	} {
		if _, err := p.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	_, err := p.Publish(ctx, &keyorder.Message{Headers: hdr(keyorder.HeaderFairnessKey, "t7")})
	var mk *keyorder.MissingKeyError
	if !errors.Is(err, keyorder.ErrMissingKey) || !errors.As(err, &mk) || mk.Part != `header "account"` {
		t.Fatalf("missing part under Reject: %v", err)
	}
	var keys []string
	for _, m := range receiveAll(t, s) {
		keys = append(keys, m.Key)
		if m.Headers[keyorder.HeaderFairnessKey] == "" && m.Key == "t7/42" {
			t.Errorf("the fairness key header was not delivered: %v", m.Headers)
		}
	}
	if want := []string{"t7/42", "explicit", "header"}; !slices.Equal(keys, want) {
		t.Fatalf("keys = %v, want %v", keys, want)
	}
}

func TestKeyFuncUnordered(t *testing.T) {
	_, p, s := setup(t, &publish.Config{KeyFunc: keyorder.KeyFromHeaders("account"), MissingKey: policy.Unordered})
	if _, err := p.Publish(context.Background(), &keyorder.Message{Payload: []byte("x")}); err != nil {
		t.Fatalf("missing part under Unordered: %v", err)
	}
	if ms := receiveAll(t, s); len(ms) != 1 || ms[0].Key != "" {
		t.Fatalf("got %v", ms)
	}
}

func TestKeyFuncConfig(t *testing.T) {
	b := memory.NewBroker()
	_, err := publish.New(memhook.Of(b).TopicDriver("t"), &publish.Config{Key: "k", KeyFunc: keyorder.KeyFromHeaders("a")})
	if !errors.Is(err, keyorder.ErrInvalidConfig) {
		t.Fatalf("Key with KeyFunc: %v", err)
	}
	boom := errors.New("boom")
	_, p, _ := setup(t, &publish.Config{KeyFunc: func(*keyorder.Message) (string, error) { return "", boom }})
	if _, err := p.Publish(context.Background(), &keyorder.Message{}); !errors.Is(err, boom) || !errors.Is(err, keyorder.ErrInvalidMessage) {
		t.Fatalf("KeyFunc error: %v", err)
	}
}
