package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

var (
	// ErrMissingBinary is returned when a server binary is not installed.
	// The message names the Debian package that provides it.
	ErrMissingBinary = errors.New("harness: server binary not installed")
	// errPortTaken means a server could not bind a port picked for it
	// because something else took the port first; starting again with new
	// ports fixes it.
	errPortTaken = errors.New("harness: port taken")
)

// debianPackage names the Debian package that provides each binary.
var debianPackage = map[string]string{
	"redis-server": "redis-server",
	"redis-cli":    "redis-tools",
	"nats-server":  "nats-server",
}

// sbinDirs are searched after PATH: Debian puts nats-server in /usr/sbin,
// which the PATH of a user other than root lacks.
var sbinDirs = []string{"/usr/sbin", "/usr/local/sbin"}

// lookPath finds a server binary, or says how to install it.
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range sbinDirs {
		if p, err := exec.LookPath(filepath.Join(dir, name)); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: %s not found in PATH or %s; install it with: apt-get install %s",
		ErrMissingBinary, name, strings.Join(sbinDirs, ", "), debianPackage[name])
}

// freePorts returns n distinct loopback ports that were free a moment ago.
// Another process may take one before the server binds it; servers that fail
// with errPortTaken are started again on new ports.
func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("harness: finding a free port: %w", err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// retryOnPortTaken runs start until it succeeds, fails for another reason,
// or has lost the race for its ports a few times.
func retryOnPortTaken(start func() error) error {
	var err error
	for range 5 {
		if err = start(); !errors.Is(err, errPortTaken) {
			return err
		}
	}
	return err
}

// process is one server process started from a binary. It can be killed
// and started again with the same arguments, so on the same ports.
// Its methods are safe for concurrent use.
type process struct {
	name    string // for messages, such as "redis-server 127.0.0.1:6379"
	path    string
	args    []string
	env     []string // added to this process's environment: secrets kept off the command line
	logPath string   // stdout and stderr, appended across restarts

	mu        sync.Mutex
	cmd       *exec.Cmd
	done      chan struct{} // closed when cmd has exited
	logOffset int64         // where this start's output begins in the log
}

func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !isClosed(p.done) {
		return fmt.Errorf("harness: %s is already running", p.name)
	}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("harness: %s: %w", p.name, err)
	}
	defer logf.Close() // the child has its own copy
	p.logOffset = fileSize(p.logPath)
	cmd := exec.Command(p.path, p.args...)
	if len(p.env) > 0 {
		cmd.Env = append(os.Environ(), p.env...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group, so signals to the test do not reach it; and killed
	// if the harness dies without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("harness: starting %s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	p.cmd, p.done = cmd, done
	return nil
}

// pid returns the process ID of the current start, or 0.
func (p *process) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// running reports whether the process has been started and not exited.
func (p *process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !isClosed(p.done)
}

// kill sends SIGKILL and waits for the process to exit.
func (p *process) kill() error { return p.signalAndWait(syscall.SIGKILL, 0) }

// stop asks the process to exit with SIGTERM and kills it if it has not
// within the grace period.
func (p *process) stop(grace time.Duration) error {
	return p.signalAndWait(syscall.SIGTERM, grace)
}

func (p *process) signalAndWait(sig syscall.Signal, grace time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || isClosed(done) {
		return nil
	}
	// SIGKILL goes to the whole process group, so that a child the server
	// forked (a Redis BGSAVE, say) dies with it; SIGTERM to the server,
	// which stops its children itself.
	pid := cmd.Process.Pid
	target := pid
	if sig == syscall.SIGKILL {
		target = -pid
	}
	if err := syscall.Kill(target, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("harness: signalling %s: %w", p.name, err)
	}
	if sig != syscall.SIGKILL {
		select {
		case <-done:
			return nil
		case <-time.After(grace):
			syscall.Kill(-pid, syscall.SIGKILL)
		}
	}
	<-done
	return nil
}

// waitReady polls ready until it succeeds, the process exits, or ctx ends.
// A process that exited because its port was taken gives errPortTaken.
func (p *process) waitReady(ctx context.Context, ready func(context.Context) error) error {
	err := poll(ctx, func(ctx context.Context) error {
		if !p.running() {
			return errExited
		}
		return ready(ctx)
	})
	if err == nil {
		return nil
	}
	p.kill()
	return startFailure(p.name, p.logPath, p.logOffset, err)
}

// startFailure explains why a server did not become ready, from its log
// since offset: errPortTaken when the log says a port was taken.
func startFailure(name, logPath string, offset int64, err error) error {
	log := logTail(logPath, offset)
	if portTakenIn(log) {
		return fmt.Errorf("%w: %s: %s", errPortTaken, name, log)
	}
	return fmt.Errorf("harness: %s not ready: %w; its log ends:\n%s", name, err, log)
}

var errExited = errors.New("process exited")

// poll calls check until it returns nil or errExited, or ctx ends, and
// returns the last error.
func poll(ctx context.Context, check func(context.Context) error) error {
	const interval = 10 * time.Millisecond
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		err := check(cctx)
		cancel()
		if err == nil || errors.Is(err, errExited) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}

func portTakenIn(log string) bool {
	return strings.Contains(strings.ToLower(log), "address already in use")
}

// logTail returns the last lines written to a log file from offset on,
// for error messages.
func logTail(path string, offset int64) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if offset > 0 && offset <= int64(len(b)) {
		b = b[offset:]
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

func fileSize(path string) int64 {
	if fi, err := os.Stat(path); err == nil {
		return fi.Size()
	}
	return 0
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// freshDir makes dir empty, removing what an earlier attempt left in it.
func freshDir(dir string) error {
	os.RemoveAll(dir)
	return os.MkdirAll(dir, 0o755)
}

// makeDir returns dir, creating it; or, if dir is empty, a new temporary
// directory that the caller owns and removes.
func makeDir(dir, pattern string) (string, bool, error) {
	if dir != "" {
		return dir, false, os.MkdirAll(dir, 0o755)
	}
	d, err := os.MkdirTemp("", pattern)
	return d, true, err
}

// LookPath finds a server binary (redis-server, redis-cli, nats-server),
// in PATH or Debian's sbin directories, or says how to install it.
func LookPath(name string) (string, error) { return lookPath(name) }
