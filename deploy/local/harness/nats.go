package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NATSOptions configure a single NATS server.
type NATSOptions struct {
	// Dir holds the configuration, log and JetStream store. Empty: a new
	// temporary directory, removed by Stop.
	Dir string
	// Binary runs Debian's nats-server binary (2.9) instead of the server
	// embedded in this process (2.15): code meant for production NATS
	// deployments is tested against both.
	Binary bool
	// JetStream enables JetStream, storing in Dir.
	JetStream bool
	// Users, if any, are the only clients the server lets in (see
	// Identity), all in one account (Account).
	Users []*Identity
	// Include, if set, is a file of configuration the server includes:
	// the accounts that go run ./deploy/local nats-config writes, say
	// (then give no Users: both would define the accounts).
	Include string
}

// NATS is one NATS server on loopback ports, embedded or a process. Kill
// and Restart keep its ports and JetStream store. Its methods are safe for
// concurrent use.
type NATS struct {
	name    string // server_name: unique, so that readiness knows it is ours
	cluster string // empty for a server outside any cluster
	ports   natsPorts
	dir     string
	ownDir  bool
	conf    string
	binary  bool
	expect  natsExpect
	// advertiseNowhere makes the server advertise a gateway address where
	// nothing listens, so that the other clusters reach it only through
	// the links their configurations name (see SuperclusterOptions.Links).
	advertiseNowhere bool
	users            []*Identity
	include          string // relative to dir, as nats-server reads it

	proc      *process // when binary
	logOffset int64    // where the current start's log begins

	mu     sync.Mutex
	srv    *server.Server // when embedded
	logger *fileLogger
}

type natsPorts struct{ client, monitor, cluster, gateway int }

// natsExpect is what a server must see before it is ready.
type natsExpect struct {
	jetstream bool
	routes    int // distinct servers routed to
	gateways  int // other clusters dialled
}

// StartNATS starts one NATS server on free loopback ports and waits until
// it accepts clients (and, with JetStream, until JetStream is ready).
func StartNATS(ctx context.Context, opts NATSOptions) (*NATS, error) {
	if opts.Binary {
		if _, err := lookPath("nats-server"); err != nil {
			return nil, err
		}
	}
	dir, ownDir, err := makeDir(opts.Dir, "geoquota-nats-*")
	if err != nil {
		return nil, err
	}
	var include string
	if opts.Include != "" {
		if include, err = relativeTo(dir, opts.Include); err != nil {
			if ownDir {
				os.RemoveAll(dir)
			}
			return nil, err
		}
	}
	var n *NATS
	err = retryOnPortTaken(func() error {
		ports, err := freePorts(2)
		if err != nil {
			return err
		}
		n = &NATS{name: uniqueName("nats"), ports: natsPorts{client: ports[0], monitor: ports[1]}, dir: dir, binary: opts.Binary,
			expect: natsExpect{jetstream: opts.JetStream}, users: opts.Users, include: include}
		if err := n.writeConfig(nil, nil); err != nil {
			return err
		}
		return n.startAndWait(ctx)
	})
	if err != nil {
		if ownDir {
			os.RemoveAll(dir)
		}
		return nil, err
	}
	n.ownDir = ownDir
	return n, nil
}

// writeConfig writes the server's configuration file: the one file both the
// binary and the embedded server load. routes are the cluster ports of the
// servers of its cluster; gateways map each other cluster to the
// gateway ports of its servers.
func (n *NATS) writeConfig(routes []int, gateways map[string][]int) error {
	var b strings.Builder
	fmt.Fprintf(&b, "server_name: %q\nlisten: \"127.0.0.1:%d\"\nhttp: \"127.0.0.1:%d\"\n", n.name, n.ports.client, n.ports.monitor)
	if n.expect.jetstream {
		fmt.Fprintf(&b, "jetstream {\n  store_dir: %q\n}\n", filepath.Join(n.dir, "jetstream"))
	}
	WriteAccounts(&b, n.users)
	if n.include != "" {
		fmt.Fprintf(&b, "include %q\n", n.include)
	}
	if n.cluster != "" {
		fmt.Fprintf(&b, "cluster {\n  name: %q\n  listen: \"127.0.0.1:%d\"\n  routes: [%s]\n}\n",
			n.cluster, n.ports.cluster, urlList("nats-route", routes))
		fmt.Fprintf(&b, "gateway {\n  name: %q\n  listen: \"127.0.0.1:%d\"\n", n.cluster, n.ports.gateway)
		if n.advertiseNowhere {
			// A server tells those that dial it its gateway address, and
			// they add it to the addresses they redial after a broken
			// connection: one that refuses every connection (port 1, where
			// nothing listens on loopback) keeps them on their links.
			b.WriteString("  advertise: \"127.0.0.1:1\"\n")
		}
		b.WriteString("  gateways: [\n")
		for _, name := range slices.Sorted(maps.Keys(gateways)) {
			fmt.Fprintf(&b, "    {name: %q, urls: [%s]}\n", name, urlList("nats", gateways[name]))
		}
		b.WriteString("  ]\n}\n")
	}
	n.conf = filepath.Join(n.dir, "nats.conf")
	return os.WriteFile(n.conf, []byte(b.String()), 0o644)
}

// relativeTo returns path relative to dir: nats-server 2.9 reads an
// include's path relative to the directory of the file that includes it,
// even a path that starts with /.
func relativeTo(dir, path string) (string, error) {
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	return filepath.Rel(absDir, abs)
}

func urlList(scheme string, ports []int) string {
	urls := make([]string, len(ports))
	for i, p := range ports {
		urls[i] = fmt.Sprintf("%q", fmt.Sprintf("%s://127.0.0.1:%d", scheme, p))
	}
	return strings.Join(urls, ", ")
}

// startAndWait starts the server and waits until it is ready in full: with
// its routes, gateways and JetStream.
func (n *NATS) startAndWait(ctx context.Context) error {
	if err := n.start(ctx); err != nil {
		return err
	}
	if err := poll(ctx, n.ready); err != nil {
		n.Kill()
		return n.startError(err)
	}
	return nil
}

// uniqueName suffixes a server name with random hex: a server on a port
// this one meant to take is told apart by its name.
func uniqueName(name string) string {
	var b [4]byte
	rand.Read(b[:])
	return name + "-" + hex.EncodeToString(b[:])
}

// start starts the server and waits until it accepts clients.
func (n *NATS) start(ctx context.Context) error {
	n.logOffset = fileSize(n.LogPath())
	if n.binary {
		if n.proc == nil {
			path, err := lookPath("nats-server")
			if err != nil {
				return err
			}
			n.proc = &process{name: "nats-server " + n.name, path: path, args: []string{"-c", n.conf}, logPath: n.LogPath()}
		}
		if err := n.proc.start(); err != nil {
			return err
		}
		return n.proc.waitReady(ctx, n.accepting)
	}
	return n.startEmbedded(ctx)
}

// startError explains why a server did not become ready, as errPortTaken
// when its log says a port was taken.
func (n *NATS) startError(err error) error {
	return startFailure("nats "+n.name, n.LogPath(), n.logOffset, err)
}

func (n *NATS) startEmbedded(ctx context.Context) error {
	opts, err := server.ProcessConfigFile(n.conf)
	if err != nil {
		return fmt.Errorf("harness: nats %s: %w", n.name, err)
	}
	opts.NoSigs = true
	srv, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("harness: nats %s: %w", n.name, err)
	}
	logger, err := newFileLogger(n.LogPath())
	if err != nil {
		return err
	}
	srv.SetLogger(logger, false, false)
	srv.Start()
	n.mu.Lock()
	n.srv, n.logger = srv, logger
	n.mu.Unlock()
	if err := poll(ctx, n.accepting); err != nil {
		n.shutdownEmbedded()
		return n.startError(err)
	}
	return nil
}

// alive returns errExited once the server has died: the binary's process
// exited, or the embedded server failed fatally.
func (n *NATS) alive() error {
	if n.binary {
		if !n.proc.running() {
			return errExited
		}
		return nil
	}
	n.mu.Lock()
	logger := n.logger
	n.mu.Unlock()
	if logger == nil {
		return errExited
	}
	if fatal := logger.fatal(); fatal != "" {
		return fmt.Errorf("%w: %s", errExited, fatal)
	}
	return nil
}

// accepting checks that the server is alive and serving monitoring, which
// it starts after the client listener, and that it is this server.
func (n *NATS) accepting(ctx context.Context) error {
	if err := n.alive(); err != nil {
		return err
	}
	var varz struct {
		Name string `json:"server_name"`
	}
	if err := n.monitor(ctx, "/varz", &varz); err != nil {
		return err
	}
	if varz.Name != n.name {
		return fmt.Errorf("another server (%s) answers on %s", varz.Name, n.MonitorURL())
	}
	return nil
}

// ready checks, through the monitoring endpoints and the same way for the
// binary and the embedded server, that the server has every route, gateway
// and, if enabled, JetStream.
func (n *NATS) ready(ctx context.Context) error {
	if err := n.accepting(ctx); err != nil {
		return err
	}
	if n.expect.jetstream {
		if err := n.monitor(ctx, "/healthz", nil); err != nil {
			return err
		}
	}
	if n.expect.routes > 0 {
		var routez struct {
			Routes []struct {
				RemoteID string `json:"remote_id"`
			} `json:"routes"`
		}
		if err := n.monitor(ctx, "/routez", &routez); err != nil {
			return err
		}
		peers := map[string]bool{}
		for _, r := range routez.Routes {
			peers[r.RemoteID] = true
		}
		if len(peers) < n.expect.routes {
			return fmt.Errorf("nats %s: routes to %d servers, want %d", n.name, len(peers), n.expect.routes)
		}
	}
	if n.expect.gateways > 0 {
		// Every server dials every other cluster; inbound gateways land on
		// one server of each cluster, so only outbound ones are counted.
		var gatewayz struct {
			Outbound map[string]json.RawMessage `json:"outbound_gateways"`
		}
		if err := n.monitor(ctx, "/gatewayz", &gatewayz); err != nil {
			return err
		}
		if len(gatewayz.Outbound) < n.expect.gateways {
			return fmt.Errorf("nats %s: gateways to %d other clusters, want %d", n.name, len(gatewayz.Outbound), n.expect.gateways)
		}
	}
	return nil
}

// monitor GETs a monitoring endpoint, requires 200 and decodes the JSON
// body into v unless v is nil.
func (n *NATS) monitor(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.MonitorURL()+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("nats %s: %s: %s: %s", n.name, path, resp.Status, body)
	}
	if v == nil {
		return nil
	}
	return json.Unmarshal(body, v)
}

// Name returns the server's name.
func (n *NATS) Name() string { return n.name }

// Cluster returns the name of the server's cluster, or "" for a lone server.
func (n *NATS) Cluster() string { return n.cluster }

// ClientURL returns the URL clients connect to.
func (n *NATS) ClientURL() string { return "nats://" + n.ClientAddr() }

// ClientAddr returns the host:port clients connect to.
func (n *NATS) ClientAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.ports.client))
}

// GatewayAddr returns the host:port other clusters' gateways connect to,
// or "" for a lone server.
func (n *NATS) GatewayAddr() string {
	if n.cluster == "" {
		return ""
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.ports.gateway))
}

// MonitorURL returns the base URL of the monitoring endpoints.
func (n *NATS) MonitorURL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(n.ports.monitor))
}

// LogPath returns the path of the server's log.
func (n *NATS) LogPath() string { return filepath.Join(n.dir, "nats.log") }

// Running reports whether the server is up.
func (n *NATS) Running() bool {
	if n.binary {
		return n.proc != nil && n.proc.running()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv != nil && n.srv.Running()
}

// Kill stops the server at once. A binary server gets SIGKILL; an embedded
// one, which shares this process, is shut down without lame-duck mode,
// closing every connection at once.
func (n *NATS) Kill() error {
	if n.binary {
		return n.proc.kill()
	}
	n.shutdownEmbedded()
	return nil
}

// Restart starts the server again on the same ports with the same
// JetStream store, and waits until it is ready and, in a supercluster,
// connected again. A running server is killed first.
func (n *NATS) Restart(ctx context.Context) error {
	if err := n.Kill(); err != nil {
		return err
	}
	return n.startAndWait(ctx)
}

// Stop shuts the server down and removes its directory if the harness made it.
func (n *NATS) Stop() error {
	var err error
	if n.binary {
		if n.proc != nil {
			err = n.proc.stop(5 * time.Second)
		}
	} else {
		n.shutdownEmbedded()
	}
	if n.ownDir {
		err = errors.Join(err, os.RemoveAll(n.dir))
	}
	return err
}

func (n *NATS) shutdownEmbedded() {
	n.mu.Lock()
	srv, logger := n.srv, n.logger
	n.srv, n.logger = nil, nil
	n.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
	if logger != nil {
		logger.close()
	}
}

// fileLogger is the embedded server's logger. Unlike the server's own, its
// Fatalf records the failure instead of exiting the process, so that a port
// taken at startup is retried rather than fatal to the test binary.
type fileLogger struct {
	mu       sync.Mutex
	f        *os.File
	fatalMsg string
}

func newFileLogger(path string) (*fileLogger, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &fileLogger{f: f}, nil
}

func (l *fileLogger) logf(level, format string, v ...any) string {
	msg := fmt.Sprintf(format, v...)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		fmt.Fprintf(l.f, "%s [%s] %s\n", time.Now().Format("15:04:05.000000"), level, msg)
	}
	return msg
}

func (l *fileLogger) Noticef(format string, v ...any) { l.logf("INF", format, v...) }
func (l *fileLogger) Warnf(format string, v ...any)   { l.logf("WRN", format, v...) }
func (l *fileLogger) Errorf(format string, v ...any)  { l.logf("ERR", format, v...) }
func (l *fileLogger) Debugf(format string, v ...any)  { l.logf("DBG", format, v...) }
func (l *fileLogger) Tracef(format string, v ...any)  { l.logf("TRC", format, v...) }

func (l *fileLogger) Fatalf(format string, v ...any) {
	msg := l.logf("FTL", format, v...)
	l.mu.Lock()
	if l.fatalMsg == "" {
		l.fatalMsg = msg
	}
	l.mu.Unlock()
}

func (l *fileLogger) fatal() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatalMsg
}

func (l *fileLogger) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
}
