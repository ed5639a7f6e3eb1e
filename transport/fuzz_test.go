package transport

import (
	"errors"
	"testing"
)

// FuzzParseCheck feeds arbitrary bodies to the /v1/check decoder: it never
// panics, and either gives a request or an input error naming a field.
func FuzzParseCheck(f *testing.F) {
	for _, seed := range []string{
		`{"descriptors":{"api_key":"sk_free_1","endpoint":"/search","method":"GET","ip":"203.0.113.7","tier":"free"},"cost":1}`,
		`{"descriptors":{"api_key":"a","plan":"gold"},"domain":"edge"}`,
		`{"descriptors":{"api_key":7}}`,
		`{"descriptors":{}}`,
		`{"cost":-1}`,
		`{"descriptors":{"api_key":"a"}} {}`,
		`[1,2,3]`,
		``,
		`{"descriptors":{"":"x"}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := parseCheck(body)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not an input error", err)
			}
			if field, ok := invalidField(err); !ok || field == "" {
				t.Fatalf("error %v names no field", err)
			}
			return
		}
		if req.Cost < 0 {
			t.Fatalf("negative cost accepted: %+v", req)
		}
	})
}
