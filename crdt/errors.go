package crdt

import "errors"

// Limits of the wire encoding. A decoder rejects anything larger, so that a
// hostile or corrupt message cannot make a receiver allocate without bound.
const (
	// MaxKeyLen is the longest counter key, in bytes.
	MaxKeyLen = 4096
	// MaxRegionNameLen is the longest region name, in bytes.
	MaxRegionNameLen = 255
	// MaxRegions is the most regions one message may name.
	MaxRegions = 256
)

var (
	// ErrMalformed is wrapped by every decoding error: the bytes are not a
	// message this package wrote.
	ErrMalformed = errors.New("crdt: malformed message")
	// ErrInvalidDelta is returned when encoding a Delta that is not canonical
	// or exceeds a limit (see Delta.Validate).
	ErrInvalidDelta = errors.New("crdt: invalid delta")
	// ErrInvalidRegions is returned by NewCounters for an unusable region set.
	ErrInvalidRegions = errors.New("crdt: invalid regions")
)
