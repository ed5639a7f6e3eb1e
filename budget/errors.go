package budget

import "errors"

var (
	// ErrInvalidConfig is wrapped by Config.Validate's errors.
	ErrInvalidConfig = errors.New("budget: invalid config")
	// ErrInvalidRule is returned for a rule the allocator cannot serve.
	ErrInvalidRule = errors.New("budget: invalid rule")
)
