package sim

import (
	"testing"

	"go.uber.org/goleak"
)

// The simulator runs regions on goroutines of its own, step by step: none
// may outlive a run.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
