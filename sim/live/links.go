package live

import (
	"context"
	"time"

	"github.com/geoquota/geoquota/deploy/local/harness"
)

// Links are a deployment's links between regions, which a live run cuts,
// heals and slows as its scenario says. Play calls them one at a time.
// *harness.Deployment is one; Supervisor reaches those of deploy/local
// up.
type Links interface {
	// Partition cuts the regions off from every other region.
	Partition(regions ...string) error
	// Split cuts every link between regions of different groups.
	Split(groups ...[]string) error
	// Heal restores every link.
	Heal() error
	// SetLatency delays everything between regions a and b by latency
	// each way (0: none).
	SetLatency(a, b string, latency time.Duration) error
}

// Supervisor returns the links of the deployment whose supervisor's fault
// API is at base (harness.DeploymentState.Control).
func Supervisor(base string) Links { return supervisor(base) }

type supervisor string

func (s supervisor) control(path string, body any) error {
	_, err := harness.Control(context.Background(), string(s), path, body)
	return err
}

func (s supervisor) Partition(regions ...string) error {
	return s.control("/v1/partition", map[string]any{"regions": regions})
}

func (s supervisor) Split(groups ...[]string) error {
	return s.control("/v1/split", map[string]any{"groups": groups})
}

func (s supervisor) Heal() error { return s.control("/v1/heal", nil) }

func (s supervisor) SetLatency(a, b string, latency time.Duration) error {
	return s.control("/v1/latency", map[string]any{"a": a, "b": b, "latency_ms": float64(latency) / float64(time.Millisecond)})
}
