package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisOptions configure a standalone redis-server.
type RedisOptions struct {
	// Dir holds the server's files and log. Empty: a new temporary
	// directory, removed by Stop.
	Dir string
	// Persist keeps the data across Kill and Restart: an append-only file,
	// synced on every write. Off by default, as for a cache-only Redis, so a
	// restarted server comes back empty.
	Persist bool
	// Args are extra redis-server arguments, such as "--maxmemory", "64mb".
	Args []string
}

// Redis is a redis-server process on a loopback port. Kill and Restart keep
// its port and directory. Its methods are safe for concurrent use.
type Redis struct {
	port   int
	dir    string
	ownDir bool
	proc   *process
}

// StartRedis starts a redis-server on a free loopback port and waits until
// it answers.
func StartRedis(ctx context.Context, opts RedisOptions) (*Redis, error) {
	dir, ownDir, err := makeDir(opts.Dir, "geoquota-redis-*")
	if err != nil {
		return nil, err
	}
	var r *Redis
	err = retryOnPortTaken(func() error {
		ports, err := freePorts(1)
		if err != nil {
			return err
		}
		args := append(redisArgs(ports[0], dir, opts.Persist), opts.Args...)
		if r, err = newRedis("redis-server", ports[0], dir, args); err != nil {
			return err
		}
		return r.start(ctx, nil)
	})
	if err != nil {
		if ownDir {
			os.RemoveAll(dir)
		}
		return nil, err
	}
	r.ownDir = ownDir
	return r, nil
}

// redisArgs are the arguments of every server the harness starts: loopback
// only, logging to stdout, DEBUG allowed from loopback so tests can make
// the server slow (DEBUG SLEEP), and a replica's full sync started at
// once rather than after the default five seconds.
func redisArgs(port int, dir string, persist bool) []string {
	args := []string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--daemonize", "no", "--logfile", "", "--save", "",
		"--enable-debug-command", "local", "--repl-diskless-sync-delay", "0",
	}
	if persist {
		return append(args, "--appendonly", "yes", "--appendfsync", "always")
	}
	return append(args, "--appendonly", "no")
}

// newRedis prepares a redis-server process; role names it in messages and
// files. The arguments go into a configuration file of its own, so that
// CONFIG REWRITE (which Sentinel uses to record a failover) survives a
// restart.
func newRedis(role string, port int, dir string, args []string) (*Redis, error) {
	conf := filepath.Join(dir, role+".conf")
	if err := os.WriteFile(conf, []byte(redisConf(args)), 0o644); err != nil {
		return nil, err
	}
	return newRedisProcess(role, port, dir, conf)
}

// newRedisProcess prepares redis-server with the given command line; role
// names it in messages and its log file in dir.
func newRedisProcess(role string, port int, dir string, args ...string) (*Redis, error) {
	path, err := lookPath("redis-server")
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	return &Redis{port: port, dir: dir, proc: &process{
		name:    role + " " + addr,
		path:    path,
		args:    args,
		logPath: filepath.Join(dir, role+".log"),
	}}, nil
}

// redisConf turns "--name value…" arguments into configuration lines.
func redisConf(args []string) string {
	var b strings.Builder
	for i, a := range args {
		if name, ok := strings.CutPrefix(a, "--"); ok {
			if i > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(name)
			continue
		}
		b.WriteByte(' ')
		b.WriteString(strconv.Quote(a))
	}
	b.WriteByte('\n')
	return b.String()
}

// start starts the server and waits until it answers, and is the server
// this process started: another one may answer on the port it meant to
// take. ready, if not nil, is the role's own readiness (a replica's link),
// waited for on the first start only: after a failover the role may have
// changed.
func (r *Redis) start(ctx context.Context, ready func(context.Context, string) error) error {
	if err := r.proc.start(); err != nil {
		return err
	}
	pid := strconv.Itoa(r.proc.pid())
	return r.proc.waitReady(ctx, func(ctx context.Context) error {
		// A plain dial first: go-redis logs every refused dial, and a
		// starting server refuses a few.
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", r.Addr())
		if err != nil {
			return err
		}
		c.Close()
		got, err := redisInfo(ctx, r.Addr(), []any{"INFO", "server"}, "process_id")
		if err != nil {
			return err
		}
		if got != pid {
			return fmt.Errorf("another server (pid %s) answers on %s", got, r.Addr())
		}
		if err := redisDo(ctx, r.Addr(), "PING"); err != nil {
			return err
		}
		if ready != nil {
			return ready(ctx, r.Addr())
		}
		return nil
	})
}

// Addr returns the server's host:port.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Port returns the server's port.
func (r *Redis) Port() int { return r.port }

// URL returns the server's address in the form regiond's --redis takes.
func (r *Redis) URL() string { return "redis://" + r.Addr() + "/0" }

// Dir returns the directory that holds the server's files and log.
func (r *Redis) Dir() string { return r.dir }

// LogPath returns the path of the server's log.
func (r *Redis) LogPath() string { return r.proc.logPath }

// PID is the redis-server's process id, or 0 if it is not running.
func (r *Redis) PID() int {
	if !r.proc.running() {
		return 0
	}
	return r.proc.pid()
}

// Running reports whether the server process is up.
func (r *Redis) Running() bool { return r.proc.running() }

// Kill stops the server with SIGKILL, as a crash would: no shutdown, no save.
func (r *Redis) Kill() error { return r.proc.kill() }

// Restart starts the server again, on the same port and with the same
// files, and waits until it answers. A running server is killed first.
func (r *Redis) Restart(ctx context.Context) error {
	if err := r.proc.kill(); err != nil {
		return err
	}
	return r.start(ctx, nil)
}

// Stop shuts the server down and removes its directory if the harness made it.
func (r *Redis) Stop() error {
	err := r.proc.stop(5 * time.Second)
	if r.ownDir {
		err = errors.Join(err, os.RemoveAll(r.dir))
	}
	return err
}

// redisDo runs one command on a fresh connection and returns its error.
func redisDo(ctx context.Context, addr string, args ...any) error {
	_, err := redisCmd(ctx, addr, args...)
	return err
}

// redisCmd runs one command on a fresh connection, with no retries, and
// returns its reply.
func redisCmd(ctx context.Context, addr string, args ...any) (any, error) {
	c := redis.NewClient(checkOptions(addr))
	defer c.Close()
	return c.Do(ctx, args...).Result()
}

// checkOptions are the go-redis options of the harness's one-off checks:
// no retries, and a pool that leaves no dialling goroutine behind after a
// failed dial.
func checkOptions(addr string) *redis.Options {
	return &redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 2, DialerRetries: 1, DialTimeout: time.Second}
}

// redisInfo returns one field of a server's INFO or CLUSTER INFO text.
func redisInfo(ctx context.Context, addr string, cmd []any, field string) (string, error) {
	v, err := redisCmd(ctx, addr, cmd...)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%v: reply %T, want text", cmd, v)
	}
	value, ok := infoField(s, field)
	if !ok {
		return "", fmt.Errorf("%v: no field %q", cmd, field)
	}
	return value, nil
}

// infoField finds "field:value" in the text of Redis INFO or CLUSTER INFO.
func infoField(info, field string) (string, bool) {
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimRight(line, "\r\n"), ":"); ok && k == field {
			return v, true
		}
	}
	return "", false
}
