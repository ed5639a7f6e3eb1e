package harness

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/geoquota/geoquota/transport/namespace"
)

// DeploymentOptions configure a local multi-region deployment of geoquota.
type DeploymentOptions struct {
	// Dir holds the binaries, rules, logs and data. Empty: a new temporary
	// directory, removed by Stop.
	Dir string
	// Regions names the regions; empty means the first three of
	// DefaultRegions.
	Regions []string
	// Replicas is the number of regiond replicas per region; 0 means 2.
	Replicas int
	// GlobalSyncs is the number of globalsync instances; 0 means 2. They
	// run in the first region, on its NATS cluster.
	GlobalSyncs int
	// Rules is the rules file every daemon loads (required).
	Rules []byte
	// Bin is a directory holding the regiond and globalsync binaries.
	// Empty: they are built into Dir/bin with go build.
	Bin string
	// AdminToken is every daemon's --admin-token; empty: none.
	AdminToken string
	// RegiondArgs and GlobalSyncArgs are added to every regiond's and
	// globalsync's flags.
	RegiondArgs, GlobalSyncArgs []string
	// RedisLinks puts each region's Redis behind a Link
	// (DeployedRegion.RedisLink), which a test can slow down or cut: a
	// Redis that stalls past the replicas' timeout.
	RedisLinks bool
	// NoAuth lets any client use the NATS servers, as the daemons' flag
	// forms without credentials do. By default only the deployment's
	// identities may (Deployment.Identity): each region's regiond, with
	// namespace.Names.Region's permissions; globalsync, with GlobalSync's;
	// and an operator allowed everything, for tests and tools.
	NoAuth bool
}

// DefaultRegions names regions for deployments that are given a number of
// regions rather than names; the simulator's scenarios use the same names.
var DefaultRegions = []string{"us", "eu", "ap", "sa", "af", "me", "oc", "ca"}

// Deployment is geoquota on loopback: per region a redis-server, a NATS
// cluster and regiond replicas joined by memberlist; the NATS clusters
// joined into a supercluster by gateways that pass through links (one per
// pair of regions and direction) which Partition, Split and SetLatency act
// on; and globalsync instances in the first region.
type Deployment struct {
	Regions     []*DeployedRegion
	GlobalSyncs []*Daemon
	NATS        *Supercluster
	dir         string
	ownDir      bool
	rulesPath   string
	gsRulesPath string
	adminToken  string
	identities  map[string]*Identity
}

// DeployedRegion is one region of a deployment.
type DeployedRegion struct {
	Name  string
	Redis *Redis
	// RedisLink, with DeploymentOptions.RedisLinks, is what the region's
	// replicas reach their Redis through.
	RedisLink *Link
	NATS      *NATSCluster
	Replicas  []*Daemon
}

// Daemon is one regiond or globalsync process. Kill and Restart keep its
// ports and flags.
type Daemon struct {
	Name       string // regiond: region-i; globalsync: gs-i
	Kind       string // "regiond" or "globalsync"
	GRPCAddr   string
	HTTPAddr   string
	Memberlist string // regiond only
	proc       *process
}

// StartDeployment builds the daemons unless Bin is given, starts every
// server and daemon, and waits until every regiond is ready, every
// globalsync answers and every NATS gateway is up.
func StartDeployment(ctx context.Context, opts DeploymentOptions) (*Deployment, error) {
	if len(opts.Regions) == 0 {
		opts.Regions = DefaultRegions[:3]
	}
	if len(opts.Rules) == 0 {
		return nil, errors.New("harness: deployment: Rules is required")
	}
	if opts.Replicas == 0 {
		opts.Replicas = 2
	}
	if opts.GlobalSyncs == 0 {
		opts.GlobalSyncs = 2
	}
	if opts.Replicas < 1 || opts.GlobalSyncs < 1 {
		return nil, fmt.Errorf("harness: deployment: %d replicas, %d globalsync: want at least 1 of each", opts.Replicas, opts.GlobalSyncs)
	}
	if _, err := lookPath("redis-server"); err != nil {
		return nil, err
	}
	dir, ownDir, err := makeDir(opts.Dir, "geoquota-local-*")
	if err != nil {
		return nil, err
	}
	d := &Deployment{dir: dir, ownDir: ownDir, adminToken: opts.AdminToken}
	if err := d.start(ctx, opts); err != nil {
		return nil, errors.Join(err, d.Stop())
	}
	return d, nil
}

// BuildDaemons builds regiond and globalsync into dir with go build, as
// for production: with -tags vtprotobuf (transport.Codec).
func BuildDaemons(ctx context.Context, dir string) error {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("harness: building the daemons needs the go command: %w", err)
	}
	cmd := exec.CommandContext(ctx, gobin, "build", "-tags", "vtprotobuf", "-o", dir+string(os.PathSeparator),
		"github.com/geoquota/geoquota/cmd/regiond", "github.com/geoquota/geoquota/cmd/globalsync")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("harness: go build of regiond and globalsync: %w\n%s", err, out)
	}
	return nil
}

func (d *Deployment) start(ctx context.Context, opts DeploymentOptions) error {
	bin := opts.Bin
	if bin == "" {
		bin = filepath.Join(d.dir, "bin")
		if err := BuildDaemons(ctx, bin); err != nil {
			return err
		}
	}
	d.rulesPath = filepath.Join(d.dir, "rules.yaml")
	d.gsRulesPath = filepath.Join(d.dir, "globalsync-rules.yaml")
	for _, p := range []string{d.rulesPath, d.gsRulesPath} {
		if err := os.WriteFile(p, opts.Rules, 0o644); err != nil {
			return err
		}
	}
	var users []*Identity
	if !opts.NoAuth {
		var err error
		if users, err = d.makeIdentities(opts.Regions); err != nil {
			return err
		}
	}
	sc, err := StartSupercluster(ctx, SuperclusterOptions{Dir: filepath.Join(d.dir, "nats"), Clusters: opts.Regions,
		JetStream: true, Links: true, Users: users})
	if err != nil {
		return err
	}
	d.NATS = sc
	regions := strings.Join(opts.Regions, ",")
	for _, name := range opts.Regions {
		r := &DeployedRegion{Name: name, NATS: sc.Cluster(name)}
		var key [32]byte
		rand.Read(key[:])
		memberKey := hex.EncodeToString(key[:]) // the region's replicas', in their environment
		d.Regions = append(d.Regions, r)
		if r.Redis, err = StartRedis(ctx, RedisOptions{Dir: filepath.Join(d.dir, "redis-"+name)}); err != nil {
			return err
		}
		redisURL := r.Redis.URL()
		if opts.RedisLinks {
			if r.RedisLink, err = StartLink(r.Redis.Addr()); err != nil {
				return err
			}
			redisURL = "redis://" + r.RedisLink.Addr() + "/0"
		}
		ports, err := freePorts(3 * opts.Replicas)
		if err != nil {
			return err
		}
		for i := range opts.Replicas {
			r.Replicas = append(r.Replicas, &Daemon{Name: fmt.Sprintf("%s-%d", name, i+1), Kind: "regiond",
				GRPCAddr: loopback(ports[3*i]), HTTPAddr: loopback(ports[3*i+1]), Memberlist: loopback(ports[3*i+2])})
		}
		for _, rep := range r.Replicas {
			var peers []string
			for _, o := range r.Replicas {
				if o != rep {
					peers = append(peers, o.Memberlist)
				}
			}
			args := []string{"--region", name, "--redis", redisURL, "--nats", r.NATS.ClientURLs(),
				"--rules", d.rulesPath, "--grpc-addr", rep.GRPCAddr, "--http-addr", rep.HTTPAddr,
				"--regions", regions, "--memberlist-addr", rep.Memberlist, "--peers", strings.Join(peers, ","),
				"--replica-name", rep.Name}
			if id := d.identities["regiond-"+name]; id != nil {
				args = append(args, id.Args()...)
			}
			d.daemon(rep, bin, append(args, opts.RegiondArgs...))
			if !opts.NoAuth {
				rep.proc.env = append(rep.proc.env, "GEOQUOTA_MEMBERLIST_KEY="+memberKey)
			}
		}
	}
	gsPorts, err := freePorts(2 * opts.GlobalSyncs)
	if err != nil {
		return err
	}
	for i := range opts.GlobalSyncs {
		gs := &Daemon{Name: fmt.Sprintf("gs-%d", i+1), Kind: "globalsync", GRPCAddr: loopback(gsPorts[2*i]), HTTPAddr: loopback(gsPorts[2*i+1])}
		args := []string{"--nats", d.Regions[0].NATS.ClientURLs(), "--grpc-addr", gs.GRPCAddr, "--http-addr", gs.HTTPAddr,
			"--rules", d.gsRulesPath, "--regions", regions, "--id", gs.Name}
		if id := d.identities["globalsync"]; id != nil {
			args = append(args, id.Args()...)
		}
		d.daemon(gs, bin, append(args, opts.GlobalSyncArgs...))
		d.GlobalSyncs = append(d.GlobalSyncs, gs)
	}
	for _, dm := range d.Daemons() {
		if err := dm.proc.start(); err != nil {
			return err
		}
	}
	for _, dm := range d.Daemons() {
		err := dm.waitReady(ctx)
		for try := 0; errors.Is(err, errPortTaken) && try < 5; try++ {
			// A port picked for it was taken before it bound it (by an
			// outgoing connection's ephemeral port, say): new ones.
			if err = dm.movePorts(); err == nil {
				if err = dm.proc.start(); err == nil {
					err = dm.waitReady(ctx)
				}
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// makeIdentities makes the deployment's NATS identities, their seeds in
// Dir/nats-keys.
func (d *Deployment) makeIdentities(regions []string) ([]*Identity, error) {
	ids, err := NewIdentities(filepath.Join(d.dir, "nats-keys"), namespace.Names{}, regions)
	if err != nil {
		return nil, err
	}
	d.identities = map[string]*Identity{}
	for _, id := range ids {
		d.identities[id.Name] = id
	}
	slices.SortFunc(ids, func(a, b *Identity) int { return strings.Compare(a.Name, b.Name) })
	return ids, nil
}

// Identity returns one of the deployment's NATS identities ("regiond-us",
// "globalsync", "operator"), or nil (always nil with NoAuth).
func (d *Deployment) Identity(name string) *Identity { return d.identities[name] }

// movePorts gives a daemon that lost the race for its ports new ones.
// (Its siblings still name its old memberlist address among their peers:
// it joins them, with theirs.)
func (dm *Daemon) movePorts() error {
	addrs := []*string{&dm.GRPCAddr, &dm.HTTPAddr}
	if dm.Memberlist != "" {
		addrs = append(addrs, &dm.Memberlist)
	}
	ports, err := freePorts(len(addrs))
	if err != nil {
		return err
	}
	for i, a := range addrs {
		old, next := *a, loopback(ports[i])
		for j, arg := range dm.proc.args {
			if arg == old {
				dm.proc.args[j] = next
			}
		}
		*a = next
	}
	return nil
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

func (d *Deployment) daemon(dm *Daemon, bin string, args []string) {
	dm.proc = &process{name: dm.Kind + " " + dm.Name, path: filepath.Join(bin, dm.Kind), args: args,
		logPath: filepath.Join(d.dir, dm.Name+".log")}
	if d.adminToken != "" { // in the environment, not where ps shows it
		dm.proc.env = append(dm.proc.env, "GEOQUOTA_ADMIN_TOKEN="+d.adminToken)
	}
}

// Daemons returns every regiond replica, then every globalsync.
func (d *Deployment) Daemons() []*Daemon {
	var all []*Daemon
	for _, r := range d.Regions {
		all = append(all, r.Replicas...)
	}
	return append(all, d.GlobalSyncs...)
}

// Region returns the region with the given name, or nil.
func (d *Deployment) Region(name string) *DeployedRegion {
	for _, r := range d.Regions {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// Dir is the deployment's directory: rules.yaml, a log per daemon, and
// the servers' data.
func (d *Deployment) Dir() string { return d.dir }

// RulesPath is the rules file every regiond loads at start and watches.
// Writing it changes the rules in every region at once, as if an operator
// had changed every region's file; PublishRules is the way through NATS.
func (d *Deployment) RulesPath() string { return d.rulesPath }

// GlobalSyncRulesPath is globalsync's rules file.
func (d *Deployment) GlobalSyncRulesPath() string { return d.gsRulesPath }

// PublishRules changes the rules the way an operator of a multi-region
// deployment does: it writes globalsync's rules file, the leader publishes
// them in the rules bucket (JetStream KV), and every regiond that can reach
// it puts them in force (a region cut off, once its link heals).
func (d *Deployment) PublishRules(yaml []byte) error { return WriteFileAtomic(d.gsRulesPath, yaml) }

// WriteFileAtomic writes a file through a temporary one renamed over it,
// so that a watcher never reads it half written.
func WriteFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ProcessRunning reports whether pid is a live process (not a zombie)
// whose command line contains name: a process id in a stale state file
// may belong to another program by now.
func ProcessRunning(pid int, name string) bool {
	if pid <= 0 {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.Contains(cmdline, []byte(name))
}

// waitReady waits until a regiond's /readyz or a globalsync's /healthz
// answers 200.
func (dm *Daemon) waitReady(ctx context.Context) error {
	path := "/readyz"
	if dm.Kind == "globalsync" {
		path = "/healthz"
	}
	return dm.proc.waitReady(ctx, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+dm.HTTPAddr+path, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s %s: %s", dm.Name, path, resp.Status)
		}
		return nil
	})
}

// PID is the daemon's process ID, or 0 if it is not running.
func (dm *Daemon) PID() int {
	if !dm.proc.running() {
		return 0
	}
	return dm.proc.pid()
}

// LogPath is the daemon's log: its stdout and stderr, across restarts.
func (dm *Daemon) LogPath() string { return dm.proc.logPath }

// Running reports whether the daemon's process is alive.
func (dm *Daemon) Running() bool { return dm.proc.running() }

// Kill sends the daemon SIGKILL and waits for it to die.
func (dm *Daemon) Kill() error { return dm.proc.kill() }

// Restart starts a stopped or killed daemon again, with the same flags,
// and waits until it is ready.
func (dm *Daemon) Restart(ctx context.Context) error {
	if dm.proc.running() {
		if err := dm.proc.kill(); err != nil {
			return err
		}
	}
	if err := dm.proc.start(); err != nil {
		return err
	}
	return dm.waitReady(ctx)
}

// Stop shuts the daemon down with SIGTERM, then SIGKILL after a grace
// period.
func (dm *Daemon) Stop() error { return dm.proc.stop(15 * time.Second) }

// Partition cuts the given regions off from every other region, both
// ways; the regions given still reach each other.
func (d *Deployment) Partition(regions ...string) error {
	if len(regions) == 0 {
		return errors.New("harness: partition: name the regions to cut off")
	}
	var rest []string
	for _, r := range d.Regions {
		if !slices.Contains(regions, r.Name) {
			rest = append(rest, r.Name)
		}
	}
	if len(rest) == 0 {
		return fmt.Errorf("harness: partition: %q is every region: there is no other side to cut off from", regions)
	}
	return d.Split(regions, rest)
}

// Split cuts every link between regions of different groups. Regions in
// no group keep their links.
func (d *Deployment) Split(groups ...[]string) error {
	group := map[string]int{}
	for i, g := range groups {
		for _, name := range g {
			if d.Region(name) == nil {
				return fmt.Errorf("harness: no region %q in the deployment", name)
			}
			if group[name] != 0 {
				return fmt.Errorf("harness: split: region %q is in two groups", name)
			}
			group[name] = i + 1
		}
	}
	for _, a := range d.Regions {
		for _, b := range d.Regions {
			ga, gb := group[a.Name], group[b.Name]
			if a != b && ga != 0 && gb != 0 && ga != gb {
				for _, l := range d.NATS.Link(a.Name, b.Name) {
					l.Cut()
				}
			}
		}
	}
	return nil
}

// Heal restores every link between regions.
func (d *Deployment) Heal() error {
	var err error
	for _, a := range d.Regions {
		for _, b := range d.Regions {
			for _, l := range d.NATS.Link(a.Name, b.Name) {
				err = errors.Join(err, l.Heal())
			}
		}
	}
	return err
}

// SetLatency delays everything between regions a and b by latency each
// way (0: none).
func (d *Deployment) SetLatency(a, b string, latency time.Duration) error {
	if d.Region(a) == nil || d.Region(b) == nil || a == b {
		return fmt.Errorf("harness: no link between %q and %q", a, b)
	}
	for _, l := range append(d.NATS.Link(a, b), d.NATS.Link(b, a)...) {
		if err := l.SetLatency(latency); err != nil {
			return err
		}
	}
	return nil
}

// Stop stops every daemon, then the servers and links, and removes the
// directory if the harness made it.
func (d *Deployment) Stop() error {
	var err error
	for _, dm := range d.Daemons() {
		if dm.proc != nil {
			err = errors.Join(err, dm.Stop())
		}
	}
	for _, r := range d.Regions {
		if r.RedisLink != nil {
			r.RedisLink.Stop()
		}
		if r.Redis != nil {
			err = errors.Join(err, r.Redis.Stop())
		}
	}
	if d.NATS != nil {
		err = errors.Join(err, d.NATS.Stop())
	}
	if d.ownDir {
		err = errors.Join(err, os.RemoveAll(d.dir))
	}
	return err
}

// DeploymentState is what a deployment's state file holds: every endpoint,
// for operators, sim live and deploy/local down.
type DeploymentState struct {
	Dir string `json:"dir"`
	// PID is the process that holds the deployment's links; deploy/local
	// down stops it, and it stops everything else.
	PID int `json:"pid"`
	// Control is the base URL of that process's HTTP API for faults:
	// POST /v1/partition {"regions":[…]}, /v1/split {"groups":[[…],[…]]},
	// /v1/heal, /v1/latency {"a":…,"b":…,"latency_ms":…}.
	Control string `json:"control"`
	// Rules is every regiond's rules file; GlobalSyncRules globalsync's,
	// whose changes the leader publishes to every region over NATS.
	Rules           string `json:"rules"`
	GlobalSyncRules string `json:"globalsync_rules"`
	AdminToken      string `json:"admin_token,omitempty"`
	// NATSNKey is the operator's nkey seed file: `nats --nkey` with it may
	// do anything on the deployment's NATS. Empty: NATS lets anyone in.
	NATSNKey    string        `json:"nats_nkey,omitempty"`
	Regions     []RegionState `json:"regions"`
	GlobalSyncs []DaemonState `json:"globalsync"`
	Links       []LinkState   `json:"links"`
}

// RegionState lists one region's endpoints.
type RegionState struct {
	Name     string        `json:"name"`
	Redis    string        `json:"redis"`
	RedisPID int           `json:"redis_pid"`
	NATS     string        `json:"nats"`
	Replicas []DaemonState `json:"regiond"`
}

// DaemonState is one daemon's endpoints.
type DaemonState struct {
	Name       string `json:"name"`
	GRPC       string `json:"grpc"`
	HTTP       string `json:"http"`
	Memberlist string `json:"memberlist,omitempty"`
	PID        int    `json:"pid"`
	Log        string `json:"log"`
}

// LinkState is one link: what From's NATS sends to To's goes through Addr.
type LinkState struct {
	From string `json:"from"`
	To   string `json:"to"`
	Addr string `json:"addr"`
	Cut  bool   `json:"cut"`
}

// State describes the deployment as it is now.
func (d *Deployment) State() DeploymentState {
	st := DeploymentState{Dir: d.dir, Rules: d.rulesPath, GlobalSyncRules: d.gsRulesPath, AdminToken: d.adminToken}
	if op := d.identities["operator"]; op != nil {
		st.NATSNKey = op.SeedFile
	}
	ds := func(dm *Daemon) DaemonState {
		return DaemonState{Name: dm.Name, GRPC: dm.GRPCAddr, HTTP: dm.HTTPAddr, Memberlist: dm.Memberlist, PID: dm.PID(), Log: dm.LogPath()}
	}
	for _, r := range d.Regions {
		rs := RegionState{Name: r.Name, Redis: r.Redis.URL(), RedisPID: r.Redis.PID(), NATS: r.NATS.ClientURLs()}
		for _, rep := range r.Replicas {
			rs.Replicas = append(rs.Replicas, ds(rep))
		}
		st.Regions = append(st.Regions, rs)
		for _, o := range d.Regions {
			for _, l := range d.NATS.Link(r.Name, o.Name) {
				st.Links = append(st.Links, LinkState{From: r.Name, To: o.Name, Addr: l.Addr(), Cut: l.Cutoff()})
			}
		}
	}
	for _, gs := range d.GlobalSyncs {
		st.GlobalSyncs = append(st.GlobalSyncs, ds(gs))
	}
	return st
}

// Process is one process of a deployment: its pid, and a word of its
// command line that tells it from a process that took a stale pid.
type Process struct {
	PID  int
	Name string
}

// Processes lists every process of a deployment: the supervisor first,
// then each region's redis-server and regiond replicas, then globalsync.
func (st DeploymentState) Processes() []Process {
	ps := []Process{{st.PID, "supervise"}}
	for _, r := range st.Regions {
		ps = append(ps, Process{r.RedisPID, "redis-server"})
		for _, d := range r.Replicas {
			ps = append(ps, Process{d.PID, "regiond"})
		}
	}
	for _, d := range st.GlobalSyncs {
		ps = append(ps, Process{d.PID, "globalsync"})
	}
	return ps
}

// Running reports whether the process still runs.
func (p Process) Running() bool { return ProcessRunning(p.PID, p.Name) }

// WriteState writes st as JSON to path, atomically.
func WriteState(path string, st DeploymentState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return WriteFileAtomic(path, append(b, '\n'))
}

// ReadState reads a state file written by WriteState.
func ReadState(path string) (DeploymentState, error) {
	var st DeploymentState
	b, err := os.ReadFile(path)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s: %w", path, err)
	}
	return st, nil
}

// Control calls the fault API of a deployment's supervisor (base is
// DeploymentState.Control): POST path with body as JSON (GET /v1/state
// when body is nil and path is /v1/state). It returns the state after.
func Control(ctx context.Context, base, path string, body any) (DeploymentState, error) {
	var st DeploymentState
	method, rd := http.MethodPost, io.Reader(nil)
	if path == "/v1/state" {
		method = http.MethodGet
	} else if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return st, err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return st, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, fmt.Errorf("deployment control %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("deployment control %s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
	}
	return st, json.Unmarshal(b, &st)
}
