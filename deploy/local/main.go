package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/regional"
)

const usage = `usage: go run ./deploy/local <command> [flags]

commands:
  up       start a deployment in the background, print its endpoints, write DIR/state.json
  down     stop the deployment described by DIR/state.json, and everything it started
  status   print the running deployment's endpoints
  fault    cut, heal or slow the links between regions of the running deployment:
             fault partition ap | fault split us,eu ap | fault heal | fault latency us ap 150ms
  nats-config
           write a deployment's NATS accounts (an nkey per region, globalsync and the
           operator, each allowed only its own subjects) for real servers:
             nats-config -deployment prod -regions us,eu,ap -out DIR

flags of up (each command but nats-config takes -dir):
`

// regionName is what a region may be called: a NATS subject token, a
// cluster name and a file name alike.
var regionName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

// defaultDir is where the state file and the deployment's data go when no
// -dir is given: sim live -deployment deploy/local reads it there.
const defaultDir = "deploy/local"

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "deploy/local:", err)
		os.Exit(1)
	}
}

// upConfig is what up and supervise are given.
type upConfig struct {
	dir        string
	regions    int
	names      string
	replicas   int
	globalsync int
	rules      string
	adminToken string
	timeout    time.Duration
	noAuth     bool
	regionsSet bool // -regions was given
}

func upFlags(name string, c *upConfig) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&c.dir, "dir", defaultDir, "directory of the state file (state.json) and, under .run, the deployment's data and logs")
	fs.IntVar(&c.regions, "regions", 3, "number of regions, named us, eu, ap, sa, af, me, oc, ca in that order")
	fs.StringVar(&c.names, "names", "", "region names, comma-separated (instead of -regions)")
	fs.IntVar(&c.replicas, "replicas", 2, "regiond replicas per region")
	fs.IntVar(&c.globalsync, "globalsync", 2, "globalsync instances (in the first region)")
	fs.StringVar(&c.rules, "rules", "", "rules file; default: the example rules (regional/example-rules.yaml)")
	fs.StringVar(&c.adminToken, "admin-token", "local-admin", "every daemon's --admin-token")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Minute, "how long up waits for the deployment, builds included")
	fs.BoolVar(&c.noAuth, "no-auth", false, "let any client use the NATS servers, and the daemons connect without credentials")
	return fs
}

// parse parses a command's flags. A request for help (-h, --help) prints
// the command's usage to out and is flag.ErrHelp, which run answers with
// nothing more (exit status 0).
func parse(fs *flag.FlagSet, args []string, out io.Writer) error {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		if fs.Name() == "fault" {
			fmt.Fprint(out, faultUsage)
		} else {
			fmt.Fprintf(out, "usage: go run ./deploy/local %s [flags]\n\n", fs.Name())
		}
		fs.SetOutput(out)
		fs.PrintDefaults()
		fmt.Fprintln(out, "\nDocumentation: docs/operations.md, README.md")
	}
	return err
}

// faultUsage is fault's: its faults, then its flags.
const faultUsage = `usage: go run ./deploy/local fault [flags] FAULT

  partition REGION[,REGION]  cut the regions off from every other region and from globalsync
  split A,B C,D …            cut the regions into groups (each group keeps its links)
  latency A B DURATION       delay the link between regions A and B (150ms, say)
  heal                       undo every fault

`

func run(args []string, out, errOut io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		w := out
		if len(args) == 0 {
			w = errOut
		}
		fmt.Fprint(w, usage)
		fs := upFlags("up", &upConfig{})
		fs.SetOutput(w)
		fs.PrintDefaults()
		fmt.Fprintln(w, "\nDocumentation: docs/operations.md, README.md")
		if len(args) == 0 {
			return errors.New("a command is required: up, down, status, fault or nats-config")
		}
		return nil
	}
	switch args[0] {
	case "up", "supervise":
		var c upConfig
		fs := upFlags(args[0], &c)
		if err := parse(fs, args[1:], out); err != nil {
			return helped(err)
		}
		if fs.NArg() > 0 {
			return fmt.Errorf("%s: unexpected argument %q", args[0], fs.Arg(0))
		}
		fs.Visit(func(f *flag.Flag) { c.regionsSet = c.regionsSet || f.Name == "regions" })
		opts, err := c.options()
		if err != nil {
			return err
		}
		if args[0] == "up" {
			return up(c, args[1:], out)
		}
		return supervise(c, opts)
	case "down", "status", "fault":
		fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
		dir := fs.String("dir", defaultDir, "directory of the state file")
		var timeout *time.Duration
		if args[0] == "down" {
			timeout = fs.Duration("timeout", time.Minute, "how long down waits for everything to stop")
		}
		if err := parse(fs, args[1:], out); err != nil {
			return helped(err)
		}
		if args[0] != "fault" && fs.NArg() > 0 {
			return fmt.Errorf("%s: unexpected argument %q", args[0], fs.Arg(0))
		}
		switch args[0] {
		case "down":
			if *timeout <= 0 {
				return fmt.Errorf("-timeout %v: want more than 0", *timeout)
			}
			return down(*dir, *timeout, out)
		case "status":
			st, err := readLive(*dir)
			if err != nil {
				return err
			}
			printState(out, st)
			return nil
		default:
			return fault(*dir, fs.Args(), out)
		}
	case "nats-config":
		c, err := parseNATSConfig(args[1:], out)
		if err != nil {
			return helped(err)
		}
		return writeNATSConfig(c, out)
	default:
		return fmt.Errorf("unknown command %q: want up, down, status, fault or nats-config", args[0])
	}
}

// helped is nil for a request for help, whose usage parse printed, and
// err otherwise.
func helped(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// options turns up's flags into a deployment, checking each.
func (c upConfig) options() (harness.DeploymentOptions, error) {
	opts := harness.DeploymentOptions{Replicas: c.replicas, GlobalSyncs: c.globalsync, AdminToken: c.adminToken,
		Dir: filepath.Join(c.dir, ".run"), Rules: regional.ExampleRules, NoAuth: c.noAuth}
	switch {
	case c.names != "" && c.regionsSet:
		return opts, errors.New("-names and -regions: give one or the other")
	case c.names != "":
		opts.Regions = strings.Split(c.names, ",")
		for i, n := range opts.Regions {
			if !regionName.MatchString(n) {
				return opts, fmt.Errorf("-names %q: region name %q: want lower-case letters, digits and dashes", c.names, n)
			}
			if slices.Contains(opts.Regions[:i], n) {
				return opts, fmt.Errorf("-names %q: region %q named twice", c.names, n)
			}
		}
	case c.regions < 1 || c.regions > len(harness.DefaultRegions):
		return opts, fmt.Errorf("-regions %d: want 1 to %d (or name them with -names)", c.regions, len(harness.DefaultRegions))
	default:
		opts.Regions = harness.DefaultRegions[:c.regions]
	}
	if c.replicas < 1 {
		return opts, fmt.Errorf("-replicas %d: want at least 1", c.replicas)
	}
	if c.globalsync < 1 {
		return opts, fmt.Errorf("-globalsync %d: want at least 1", c.globalsync)
	}
	if c.timeout <= 0 {
		return opts, fmt.Errorf("-timeout %v: want more than 0", c.timeout)
	}
	if c.rules != "" {
		b, err := os.ReadFile(c.rules)
		if err != nil {
			return opts, fmt.Errorf("-rules: %w", err)
		}
		if _, err := regional.Parse(c.rules, b); err != nil {
			return opts, fmt.Errorf("-rules: %w", err)
		}
		opts.Rules = b
	}
	return opts, nil
}

func statePath(dir string) string { return filepath.Join(dir, "state.json") }

// up starts a supervisor in the background, in its own session so that
// it outlives this command, and waits until it has written the state
// file (or died, and then shows its log).
func up(c upConfig, args []string, out io.Writer) error {
	if st, err := harness.ReadState(statePath(c.dir)); err == nil && harness.ProcessRunning(st.PID, "supervise") {
		return fmt.Errorf("a deployment is already up (pid %d, %s): run down first", st.PID, statePath(c.dir))
	}
	os.Remove(statePath(c.dir))
	if err := os.MkdirAll(filepath.Join(c.dir, ".run"), 0o755); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logPath := filepath.Join(c.dir, ".run", "supervisor.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(self, append([]string{"supervise"}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	fmt.Fprintf(out, "starting %s (builds regiond and globalsync first; log: %s)\n", c.dirDescription(), logPath)
	deadline := time.After(c.timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("the deployment did not start (%v); its log:\n%s", err, b)
		case <-deadline:
			cmd.Process.Signal(syscall.SIGTERM)
			return fmt.Errorf("the deployment was not up within %v (-timeout); see %s", c.timeout, logPath)
		case <-tick.C:
			st, err := harness.ReadState(statePath(c.dir))
			if err != nil {
				continue
			}
			printState(out, st)
			fmt.Fprintf(out, "\nstate: %s\nstop everything: go run ./deploy/local down%s\n", statePath(c.dir), dirFlag(c.dir))
			return nil
		}
	}
}

func (c upConfig) dirDescription() string {
	if c.names != "" {
		return "regions " + c.names
	}
	return fmt.Sprintf("%d regions", c.regions)
}

func dirFlag(dir string) string {
	if dir == defaultDir {
		return ""
	}
	return " -dir " + dir
}

// supervise runs the deployment in the foreground: it holds the links
// between regions (in this process), serves the fault API, writes the
// state file, and stops everything on SIGTERM or SIGINT.
func supervise(c upConfig, opts harness.DeploymentOptions) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	startCtx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	// Nothing of an earlier run is reused: every region starts empty,
	// every log anew.
	os.RemoveAll(filepath.Join(opts.Dir, "nats"))
	old, _ := filepath.Glob(filepath.Join(opts.Dir, "redis-*"))
	logs, _ := filepath.Glob(filepath.Join(opts.Dir, "*-*.log"))
	for _, p := range append(old, logs...) {
		os.RemoveAll(p)
	}
	d, err := harness.StartDeployment(startCtx, opts)
	if err != nil {
		return err
	}
	defer func() {
		os.Remove(statePath(c.dir))
		if err := d.Stop(); err != nil {
			log.Error("stopping the deployment", "error", err)
		}
		log.Info("deployment stopped")
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: controlAPI(d, c.dir), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	st := d.State()
	st.PID, st.Control = os.Getpid(), "http://"+ln.Addr().String()
	if err := harness.WriteState(statePath(c.dir), st); err != nil {
		return err
	}
	log.Info("deployment up", "regions", opts.Regions, "control", st.Control)
	<-ctx.Done()
	log.Info("stopping")
	return nil
}

// controlAPI is the supervisor's HTTP API: faults on the links between
// regions, and the state.
func controlAPI(d *harness.Deployment, dir string) http.Handler {
	mux := http.NewServeMux()
	writeState := func(w http.ResponseWriter) {
		st, err := harness.ReadState(statePath(dir))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fresh := d.State()
		fresh.PID, fresh.Control = st.PID, st.Control
		harness.WriteState(statePath(dir), fresh)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(fresh)
	}
	// Each request decodes its own body: requests may come at once.
	handle := func(pattern string, act func(decode func(any) error) error) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			decode := func(body any) error {
				dec := json.NewDecoder(r.Body)
				dec.DisallowUnknownFields()
				if err := dec.Decode(body); err != nil {
					return fmt.Errorf("body: %w", err)
				}
				return nil
			}
			if err := act(decode); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			writeState(w)
		})
	}
	handle("POST /v1/partition", func(decode func(any) error) error {
		var b struct {
			Regions []string `json:"regions"`
		}
		if err := decode(&b); err != nil {
			return err
		}
		if len(b.Regions) == 0 {
			return errors.New("regions: name at least one region")
		}
		return d.Partition(b.Regions...)
	})
	handle("POST /v1/split", func(decode func(any) error) error {
		var b struct {
			Groups [][]string `json:"groups"`
		}
		if err := decode(&b); err != nil {
			return err
		}
		if len(b.Groups) < 2 {
			return errors.New("groups: want at least two groups")
		}
		return d.Split(b.Groups...)
	})
	handle("POST /v1/heal", func(func(any) error) error { return d.Heal() })
	handle("POST /v1/latency", func(decode func(any) error) error {
		var b struct {
			A         string   `json:"a"`
			B         string   `json:"b"`
			LatencyMS *float64 `json:"latency_ms"`
		}
		if err := decode(&b); err != nil {
			return err
		}
		switch {
		case b.LatencyMS == nil:
			return errors.New("latency_ms: missing")
		case *b.LatencyMS < 0:
			return fmt.Errorf("latency_ms: %v is negative", *b.LatencyMS)
		}
		return d.SetLatency(b.A, b.B, time.Duration(*b.LatencyMS*float64(time.Millisecond)))
	})
	mux.HandleFunc("GET /v1/state", func(w http.ResponseWriter, _ *http.Request) { writeState(w) })
	return mux
}

// readLive reads the state file and checks that its supervisor is alive.
func readLive(dir string) (harness.DeploymentState, error) {
	st, err := harness.ReadState(statePath(dir))
	if errors.Is(err, os.ErrNotExist) {
		return st, fmt.Errorf("no deployment is up in %s (no %s): run up first", dir, statePath(dir))
	}
	if err != nil {
		return st, err
	}
	if !harness.ProcessRunning(st.PID, "supervise") {
		return st, fmt.Errorf("the deployment in %s is gone (pid %d not running); run down to clean up", dir, st.PID)
	}
	return st, nil
}

// running returns the processes still running.
func running(ps []harness.Process) []harness.Process {
	var out []harness.Process
	for _, p := range ps {
		if p.Running() {
			out = append(out, p)
		}
	}
	return out
}

// down stops the supervisor, which stops everything it started (or, if
// it is gone, every process of the deployment itself), and checks that
// every process of the deployment is gone.
func down(dir string, timeout time.Duration, out io.Writer) error {
	st, err := harness.ReadState(statePath(dir))
	if errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(out, "no deployment is up in %s\n", dir)
		return nil
	}
	if err != nil {
		return err
	}
	ps := st.Processes()
	if ps[0].Running() { // the supervisor
		syscall.Kill(st.PID, syscall.SIGTERM)
	} else {
		for _, p := range running(ps) {
			syscall.Kill(p.PID, syscall.SIGTERM)
		}
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && len(running(ps)) > 0 {
		time.Sleep(100 * time.Millisecond) // waiting on other processes to exit
	}
	if left := running(ps); len(left) > 0 {
		for _, p := range left {
			syscall.Kill(p.PID, syscall.SIGKILL)
		}
		return fmt.Errorf("the deployment did not stop within %v (-timeout): killed what was left (%d processes)", timeout, len(left))
	}
	os.Remove(statePath(dir))
	fmt.Fprintln(out, "deployment stopped; nothing of it is running")
	return nil
}

// fault sends a fault to the running deployment's supervisor.
func fault(dir string, args []string, out io.Writer) error {
	st, err := readLive(dir)
	if err != nil {
		return err
	}
	if len(args) == 0 {
		return errors.New("fault: want partition REGION[,REGION], split GROUP GROUP…, heal, or latency A B DURATION")
	}
	var path string
	var body any
	switch args[0] {
	case "partition":
		if len(args) != 2 {
			return errors.New("fault partition: want one argument, the regions to cut off (comma-separated)")
		}
		path, body = "/v1/partition", map[string]any{"regions": strings.Split(args[1], ",")}
	case "split":
		if len(args) < 3 {
			return errors.New("fault split: want two or more groups of regions (comma-separated)")
		}
		var groups [][]string
		for _, g := range args[1:] {
			groups = append(groups, strings.Split(g, ","))
		}
		path, body = "/v1/split", map[string]any{"groups": groups}
	case "heal":
		path = "/v1/heal"
	case "latency":
		if len(args) != 4 {
			return errors.New("fault latency: want A B DURATION, such as us ap 150ms")
		}
		d, err := time.ParseDuration(args[3])
		if err != nil {
			return fmt.Errorf("fault latency: duration: %w", err)
		}
		path, body = "/v1/latency", map[string]any{"a": args[1], "b": args[2], "latency_ms": float64(d) / float64(time.Millisecond)}
	default:
		return fmt.Errorf("fault %q: want partition, split, heal or latency", args[0])
	}
	if _, err := harness.Control(context.Background(), st.Control, path, body); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s: done\n", strings.Join(args, " "))
	return nil
}

// printState prints every endpoint of a deployment.
func printState(out io.Writer, st harness.DeploymentState) {
	fmt.Fprintf(out, "geoquota deployment in %s (supervisor pid %d, faults at %s)\n", st.Dir, st.PID, st.Control)
	if st.NATSNKey != "" && len(st.Regions) > 0 {
		fmt.Fprintf(out, "NATS lets in only the deployment's identities; as the operator: nats -s %s --nkey %s\n", st.Regions[0].NATS, st.NATSNKey)
	} else {
		fmt.Fprintln(out, "NATS lets anyone in (-no-auth)")
	}
	for _, r := range st.Regions {
		fmt.Fprintf(out, "region %s\n  redis   %s\n  nats    %s\n", r.Name, r.Redis, r.NATS)
		for _, d := range r.Replicas {
			fmt.Fprintf(out, "  regiond %-6s grpc %s  http http://%s  memberlist %s  pid %d\n", d.Name, d.GRPC, d.HTTP, d.Memberlist, d.PID)
		}
	}
	for _, d := range st.GlobalSyncs {
		dashboard := "http://" + d.HTTP + "/"
		if st.AdminToken != "" {
			dashboard += "#token=" + url.QueryEscape(st.AdminToken) // its reads need the token
		}
		fmt.Fprintf(out, "globalsync %s grpc %s  dashboard %s  pid %d\n", d.Name, d.GRPC, dashboard, d.PID)
	}
	var cut []string
	for _, l := range st.Links {
		if l.Cut {
			cut = append(cut, l.From+"→"+l.To)
		}
	}
	fmt.Fprintf(out, "links between regions: %d", len(st.Links))
	if len(cut) > 0 {
		fmt.Fprintf(out, " (cut: %s)", strings.Join(cut, " "))
	}
	fmt.Fprintf(out, "\nrules %s (admin token %q)\n", st.Rules, st.AdminToken)
}
