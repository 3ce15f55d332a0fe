package keyorder_test

import (
	"errors"
	"fmt"

	"github.com/keyorder/keyorder"
)

// A composite key orders by (tenant, account); the parts are joined
// unambiguously, and a missing part names itself.
func ExampleCompositeKey() {
	key := keyorder.CompositeKey(keyorder.FairnessKeyPart(), keyorder.HeaderPart("account"))
	k, _ := key(&keyorder.Message{Headers: map[string]string{keyorder.HeaderFairnessKey: "t7", "account": "acct/42"}})
	fmt.Println(k)
	parts, _ := keyorder.SplitKey(k)
	fmt.Printf("%q\n", parts)
	_, err := key(&keyorder.Message{Headers: map[string]string{keyorder.HeaderFairnessKey: "t7"}})
	fmt.Println(errors.Is(err, keyorder.ErrMissingKey), err)
	// Output:
	// t7/acct%2F42
	// ["t7" "acct/42"]
	// true keyorder: message has no ordering key: missing header "account"
}

// JoinKey escapes '%' and '/' inside parts and writes an empty part as a
// lone "%", so every part list has its own key; "" is the empty list (no
// key). SplitKey is its exact inverse.
func ExampleJoinKey() {
	for _, parts := range [][]string{{"tenant-7", "acct-42"}, {"a/b"}, {"a", "b"}, {""}, {}} {
		k := keyorder.JoinKey(parts...)
		back, _ := keyorder.SplitKey(k)
		fmt.Printf("%q -> %q -> %q\n", parts, k, back)
	}
	_, err := keyorder.SplitKey("a//b")
	fmt.Println(errors.Is(err, keyorder.ErrBadKeyEncoding))
	// Output:
	// ["tenant-7" "acct-42"] -> "tenant-7/acct-42" -> ["tenant-7" "acct-42"]
	// ["a/b"] -> "a%2Fb" -> ["a/b"]
	// ["a" "b"] -> "a/b" -> ["a" "b"]
	// [""] -> "%" -> [""]
	// [] -> "" -> []
	// true
}
