package subscribe

// This file: the in-process lane key (a refinement of the broker's key)
// and the fairness key, read once per received message.

import (
	"errors"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

// MessageFunc reads a string from a message: a fairness key
// (Config.FairnessKey) or a throttle's bucket (Throttle.By). It must be
// deterministic and must not modify the message.
type MessageFunc func(m *keyorder.Message) string

// FairnessKeyHeader returns the message's fairness key as published in the
// keyorder.HeaderFairnessKey header ("" when it has none). It is the
// portable choice for Config.FairnessKey and Throttle.By.
func FairnessKeyHeader(m *keyorder.Message) string { return m.Headers[keyorder.HeaderFairnessKey] }

// OrderingKey returns the message's ordering key as the broker delivered
// it: a Throttle.By for a bucket per key.
func OrderingKey(m *keyorder.Message) string { return m.Key }

// view is the message as the functions of Config see it: the delivered
// message, its headers not copied (they must not be modified).
func view(m *driver.Message) keyorder.Message {
	return keyorder.Message{ID: m.ID, Key: m.Key, Payload: m.Payload, Headers: m.Headers, NotBefore: m.NotBefore}
}

// classify sets an item's lane key and fairness key at receive.
//
// The lane key (item.key) is what the lanes and in-process holds group
// by; it never leaves them: the Delivery, logs, throttles (OrderingKey)
// and everything said to the broker use the broker's key (item.m.Key).
func (s *Subscriber) classify(it *item) {
	it.key = it.m.Key
	if s.cfg.LaneKey == nil && s.cfg.FairnessKey == nil {
		return
	}
	v := view(it.m)
	if s.cfg.FairnessKey != nil {
		it.fair = s.cfg.FairnessKey(&v)
	}
	if s.cfg.LaneKey == nil || it.key == "" {
		return
	}
	// The lane key can only split the broker's group, never merge groups:
	// it is the JoinKey encoding of the broker's key alone, or of the
	// broker's key and the refinement, and JoinKey gives different part
	// lists different keys, so two messages share a lane group only if
	// they share a broker group. (The broker's key itself would not do for
	// the unrefined form: broker key "a/b" unrefined would share a lane
	// with broker key "a" refined by "b".)
	part, err := s.cfg.LaneKey(&v)
	switch {
	case err == nil && part != "":
		it.key = keyorder.JoinKey(it.m.Key, part)
		return
	case err != nil && !errors.Is(err, keyorder.ErrMissingKey):
		s.cfg.Logger.Warn("keyorder: subscribe.Config.LaneKey failed; the message keeps the broker's key", "id", it.m.ID, "key", it.m.Key, "err", err)
	}
	// A missing refinement keeps the broker's group: coarser, never wrong.
	it.key = keyorder.JoinKey(it.m.Key)
}
