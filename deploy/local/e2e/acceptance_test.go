//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/geoquota/geoquota/deploy/local/harness"
)

// TestUpSimLiveDown is what an operator does, as the README says, with
// the commands built as go run builds them: deploy/local up -regions 3,
// sim live -scenario partition against it (both modes), deploy/local
// down. The simulated and the live over-admission agree within one
// percentage point in each mode, and nothing of the deployment is left
// running.
func TestUpSimLiveDown(t *testing.T) {
	bin := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", bin+string(os.PathSeparator),
		"github.com/geoquota/geoquota/deploy/local", "github.com/geoquota/geoquota/cmd/sim")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := t.TempDir()
	local := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "local"), args...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("local %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	up := local("up", "-regions", "3", "-dir", dir)
	t.Logf("up:\n%s", up)
	st, err := harness.ReadState(filepath.Join(dir, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	procs := st.Processes()
	for _, p := range procs {
		if !p.Running() {
			t.Errorf("%s (pid %d) is not running after up", p.Name, p.PID)
		}
	}
	downed := false
	t.Cleanup(func() {
		if !downed {
			exec.Command(filepath.Join(bin, "local"), "down", "-dir", dir).Run()
		}
	})
	if len(st.Regions) != 3 || len(procs) != 1+3*3+2 || len(st.Links) != 6 {
		t.Fatalf("state: %d regions, %d processes, %d links; want 3, 12, 6", len(st.Regions), len(procs), len(st.Links))
	}
	for _, name := range []string{"us", "eu", "ap"} {
		if !strings.Contains(up, "region "+name) {
			t.Errorf("up did not print region %s", name)
		}
	}

	live := exec.CommandContext(ctx, filepath.Join(bin, "sim"), "live", "-scenario", "partition", "-deployment", dir)
	var stderr strings.Builder
	live.Stderr = &stderr
	out, err := live.Output()
	if err != nil {
		t.Fatalf("sim live: %v\n%s\n%s", err, stderr.String(), out)
	}
	t.Logf("sim live:\n%s%s", stderr.String(), out)
	if strings.Contains(stderr.String(), "no globalsync leads") || strings.Contains(stderr.String(), "over-admissions:") {
		t.Errorf("sim live did not read globalsync's findings (its reads need the deployment's admin token)")
	}
	compared := regexp.MustCompile(`== simulated vs live \(partition, (\w+) mode\)\n(?:.*\n)*?over-admission, worst window +([\d.]+)% +([\d.]+)%`).FindAllStringSubmatch(string(out), -1)
	if len(compared) != 2 {
		t.Fatalf("sim live printed %d comparisons, want one per mode", len(compared))
	}
	for _, m := range compared {
		simulated, _ := strconv.ParseFloat(m[2], 64)
		measured, _ := strconv.ParseFloat(m[3], 64)
		t.Logf("%s mode: over-admission simulated %.2f%%, live %.2f%%", m[1], simulated, measured)
		if d := simulated - measured; d > 1 || d < -1 {
			t.Errorf("%s mode: over-admission simulated %.2f%% and live %.2f%% differ by more than one point", m[1], simulated, measured)
		}
		if m[1] == "strict" && measured != 0 {
			t.Errorf("strict mode admitted %.2f%% over the limit live", measured)
		}
	}

	if down := local("down", "-dir", dir); !strings.Contains(down, "nothing of it is running") {
		t.Errorf("down said %q", down)
	}
	downed = true
	for _, p := range procs {
		if p.Running() {
			t.Errorf("%s (pid %d) still runs after down", p.Name, p.PID)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "state.json")); !os.IsNotExist(err) {
		t.Errorf("state file after down: %v", err)
	}
	for _, r := range st.Regions {
		if dial(strings.TrimPrefix(strings.TrimSuffix(r.Redis, "/0"), "redis://")) == nil {
			t.Errorf("region %s's redis-server still answers after down", r.Name)
		}
	}
}
