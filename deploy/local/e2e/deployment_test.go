//go:build e2e

package e2e

import (
	"context"
	"errors"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/geoquota/geoquota/deploy/local/harness"
)

// TestDeploymentState: a deployment's State lists every endpoint of
// every region and daemon, each answering; after Stop no process of it is
// left running and no port of it takes connections.
func TestDeploymentState(t *testing.T) {
	opts := harness.DeploymentOptions{Dir: t.TempDir(), Bin: binDir, Regions: []string{"us", "eu"},
		Replicas: 2, GlobalSyncs: 2, Rules: []byte(strictRules(600, 5*time.Second))}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := harness.StartDeployment(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			d.Stop()
		}
	})

	st := d.State()
	if st.Dir != d.Dir() || st.Rules != d.RulesPath() || st.GlobalSyncRules != d.GlobalSyncRulesPath() {
		t.Errorf("state names dir %q, rules %q and %q; the deployment has %q, %q and %q",
			st.Dir, st.Rules, st.GlobalSyncRules, d.Dir(), d.RulesPath(), d.GlobalSyncRulesPath())
	}
	if len(st.Regions) != 2 || len(st.GlobalSyncs) != 2 {
		t.Fatalf("state lists %d regions and %d globalsync, want 2 and 2: %+v", len(st.Regions), len(st.GlobalSyncs), st)
	}
	for _, r := range st.Regions {
		if !harness.ProcessRunning(r.RedisPID, "redis-server") {
			t.Errorf("region %s: redis-server pid %d not running", r.Name, r.RedisPID)
		}
	}
	// Faults that make no sense are refused, and cut nothing.
	for name, err := range map[string]error{
		"partition of every region": d.Partition("us", "eu"),
		"partition of none":         d.Partition(),
		"a region in two groups":    d.Split([]string{"us"}, []string{"us", "eu"}),
		"an unknown region":         d.Partition("mars"),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	for _, l := range d.State().Links {
		if l.Cut {
			t.Errorf("link %s→%s cut by a refused fault", l.From, l.To)
		}
	}
	// Every process, and every address that must take connections while
	// the deployment runs and refuse them after.
	var pids []int
	var addrs []string
	daemon := func(what string, ds harness.DaemonState, regiond bool) {
		if ds.Name == "" || ds.Log == "" || ds.PID <= 0 || ds.HTTP == "" || ds.GRPC == "" || (regiond && ds.Memberlist == "") {
			t.Errorf("%s: incomplete state %+v", what, ds)
		}
		if ds.PID > 0 && syscall.Kill(ds.PID, 0) != nil {
			t.Errorf("%s: pid %d is not running", what, ds.PID)
		}
		// Built as for production: Envoy's answers marshalled by
		// vtprotobuf's code (transport.Codec), as regiond's start line says.
		if log, err := os.ReadFile(ds.Log); regiond && (err != nil || !strings.Contains(string(log), "vtprotobuf=true")) {
			t.Errorf("%s: its log does not say vtprotobuf=true (%v)", what, err)
		}
		pids = append(pids, ds.PID)
		addrs = append(addrs, ds.HTTP, ds.GRPC)
		path := "/readyz"
		if !regiond {
			path = "/healthz"
		}
		if err := getJSON("http://"+ds.HTTP+path, nil); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	for i, rs := range st.Regions {
		r := d.Regions[i]
		if rs.Name != r.Name || rs.Redis != r.Redis.URL() || rs.NATS != r.NATS.ClientURLs() || len(rs.Replicas) != 2 {
			t.Errorf("region %s: state %+v", r.Name, rs)
		}
		addrs = append(addrs, r.Redis.Addr())
		for _, u := range strings.Split(rs.NATS, ",") {
			pu, err := url.Parse(u)
			if err != nil {
				t.Fatalf("region %s: NATS URL %q: %v", r.Name, u, err)
			}
			addrs = append(addrs, pu.Host)
		}
		for j, ds := range rs.Replicas {
			if ds.Name != r.Replicas[j].Name || ds.HTTP != r.Replicas[j].HTTPAddr || ds.GRPC != r.Replicas[j].GRPCAddr ||
				ds.PID != r.Replicas[j].PID() || ds.Log != r.Replicas[j].LogPath() {
				t.Errorf("replica %s: state %+v", r.Replicas[j].Name, ds)
			}
			daemon("replica "+ds.Name, ds, true)
		}
	}
	for i, ds := range st.GlobalSyncs {
		if ds.Name != d.GlobalSyncs[i].Name || ds.PID != d.GlobalSyncs[i].PID() {
			t.Errorf("globalsync %s: state %+v", d.GlobalSyncs[i].Name, ds)
		}
		daemon("globalsync "+ds.Name, ds, false)
	}
	// One link per pair of regions and direction, none cut.
	if len(st.Links) != 2 {
		t.Errorf("state lists %d links, want 2 (us→eu, eu→us): %+v", len(st.Links), st.Links)
	}
	for _, l := range st.Links {
		if l.Cut || l.Addr == "" || l.From == l.To {
			t.Errorf("link %+v", l)
		}
		addrs = append(addrs, l.Addr)
	}
	for _, a := range addrs {
		if err := dial(a); err != nil {
			t.Errorf("%s does not take connections while the deployment runs: %v", a, err)
		}
	}

	stopped = true
	if err := d.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("pid %d still exists after Stop (signal 0: %v)", pid, err)
		}
	}
	for _, r := range d.Regions {
		if r.Redis.Running() {
			t.Errorf("region %s: redis-server still running after Stop", r.Name)
		}
		for _, s := range r.NATS.Servers {
			if s.Running() {
				t.Errorf("region %s: NATS server %s still running after Stop", r.Name, s.Name())
			}
		}
	}
	for _, a := range addrs {
		if err := dial(a); err == nil {
			t.Errorf("%s still takes connections after Stop", a)
		}
	}
}

// dial connects to addr and hangs up.
func dial(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}
