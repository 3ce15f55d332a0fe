package driver

import (
	"errors"
	"strings"
	"testing"

	"github.com/keyorder/keyorder"
)

func TestValidatePortableRule(t *testing.T) {
	lim := Limits{Backend: "x", MaxHeaders: 2, MaxHeaderNameBytes: 4, MaxHeaderValueBytes: 5, MaxHeaderBytes: 12,
		Check: func(m *keyorder.Message) error {
			if m.Headers["boom"] != "" {
				return errors.New("boom header")
			}
			return nil
		}}
	ok := []*Message{
		{Key: "ключ", Payload: []byte{0, 0xff}},
		{Key: "k", Headers: map[string]string{"é": "tab\t\x01", "b": ""}},
	}
	for _, m := range ok {
		if err := Validate(lim, m); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", m, err)
		}
	}
	bad := map[string]*Message{
		"key is not valid UTF-8":   {Key: "\xff"},
		"key contains NUL":         {Key: "a\x00"},
		"header count":             {Headers: map[string]string{"a": "", "b": "", "c": ""}},
		"header name is empty":     {Headers: map[string]string{"": "v"}},
		"header name is not valid": {Headers: map[string]string{"\xff": "v"}},
		"contains NUL":             {Headers: map[string]string{"a\x00": "v"}},
		"prefix is reserved":       {Headers: map[string]string{"Keyorder-x": "v"}},
		"value is not valid UTF-8": {Headers: map[string]string{"a": "\xff"}},
		"value contains NUL":       {Headers: map[string]string{"a": "\x00"}},
		"header name length":       {Headers: map[string]string{"abcde": ""}},
		"value length":             {Headers: map[string]string{"a": "123456"}},
		"header bytes":             {Headers: map[string]string{"abcd": "12345", "efgh": "1"}},
		"boom header":              {Headers: map[string]string{"boom": "1"}},
	}
	for want, m := range bad {
		err := Validate(lim, m)
		var le *keyorder.LimitError
		if !errors.As(err, &le) || !errors.Is(err, keyorder.ErrInvalidMessage) || !strings.Contains(le.Limit, want) || keyorder.Code(err) != keyorder.CodeInvalidArgument {
			t.Errorf("%s: Validate = %v, want a LimitError naming it", want, err)
		}
	}
}
