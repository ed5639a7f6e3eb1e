package transport

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/geoquota/geoquota/regional"
)

// ErrInvalid is wrapped by errors about malformed input at the API edge
// (before the engine sees it); like regional.ErrInvalidRequest, it means
// 400 / InvalidArgument.
var ErrInvalid = errors.New("transport: invalid input")

// FieldError names the field of an API request that is wrong.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }
func (e *FieldError) Unwrap() error { return ErrInvalid }

// asFieldError returns the field an input error names and what is wrong
// with it, whether the API edge or the engine found it.
func asFieldError(err error) (*FieldError, bool) {
	var fe *FieldError
	if errors.As(err, &fe) {
		return fe, true
	}
	var re *regional.RequestError
	if errors.As(err, &re) {
		return &FieldError{Field: re.Field, Msg: re.Msg}, true
	}
	return nil, false
}

// invalidField returns the field an input error names, or "".
func invalidField(err error) (string, bool) {
	if fe, ok := asFieldError(err); ok {
		return fe.Field, true
	}
	return "", false
}

// requestFrom builds an engine request from descriptors as the APIs carry
// them: api_key, endpoint, method, ip and tier are the well-known ones,
// the rest are custom. prefix names the map in error messages
// ("descriptors", "requests[2].descriptors").
func requestFrom(domain string, descriptors map[string]string, cost int64, prefix string) (regional.Request, error) {
	req := regional.Request{Domain: domain, Cost: cost}
	if cost < 0 {
		return req, &FieldError{Field: "cost", Msg: "must be positive"}
	}
	for name, value := range descriptors {
		if name == "" {
			return req, &FieldError{Field: prefix, Msg: "a descriptor has an empty name"}
		}
		if value == "" {
			return req, &FieldError{Field: prefix + "." + name, Msg: "empty value"}
		}
		switch name {
		case "api_key":
			req.APIKey = value
		case "endpoint":
			req.Endpoint = value
		case "method":
			req.Method = strings.ToUpper(value)
		case "ip":
			req.IP = value
		case "tier":
			req.Tier = value
		default:
			req.Descriptors = append(req.Descriptors, regional.Descriptor{Name: name, Value: value})
		}
	}
	// Map order is random; decisions and messages should not be.
	slices.SortFunc(req.Descriptors, func(a, b regional.Descriptor) int { return strings.Compare(a.Name, b.Name) })
	return req, nil
}

// fieldPath prefixes an error's field with where the request sat, for
// batch calls: "requests[2].cost".
func fieldPath(prefix string, err error) error {
	if fe, ok := asFieldError(err); ok {
		return &FieldError{Field: prefix + "." + fe.Field, Msg: fe.Msg}
	}
	return fmt.Errorf("%s: %w", prefix, err)
}

// renameField rewrites the prefix of the field an input error names, so
// that it uses the API's words: Envoy's descriptors have entries.
func renameField(err error, from, to string) error {
	fe, ok := asFieldError(err)
	if !ok || !strings.HasPrefix(fe.Field, from) {
		return err
	}
	return &FieldError{Field: to + strings.TrimPrefix(fe.Field, from), Msg: fe.Msg}
}

// errCostRequired is a report's error without a cost.
func errCostRequired() error {
	return &FieldError{Field: "cost", Msg: "required: what the request cost once done (tokens, bytes)"}
}
