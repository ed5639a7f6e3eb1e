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

// SentinelOptions configure a Sentinel-managed primary with replicas.
type SentinelOptions struct {
	// Dir holds the servers' files. Empty: a new temporary directory,
	// removed by Stop.
	Dir string
	// MasterName is the name the sentinels monitor; empty means "mymaster".
	MasterName string
	// Replicas is the number of replicas of the primary; 0 means 1.
	Replicas int
	// Sentinels is the number of sentinels; 0 means 3, with a quorum of a
	// majority.
	Sentinels int
	// DownAfter is how long the primary must be unreachable before the
	// sentinels fail over; 0 means one second.
	DownAfter time.Duration
}

// Sentinel is a Redis primary, its replicas and the sentinels that watch
// them, on loopback ports. Killing the primary makes the sentinels promote
// a replica.
type Sentinel struct {
	Primary   *Redis
	Replicas  []*Redis
	Sentinels []*Redis
	name      string
	dir       string
	ownDir    bool
}

// StartSentinel starts the primary, the replicas (waiting until they are in
// sync) and the sentinels (waiting until every sentinel knows the primary,
// all replicas and all other sentinels, so that a failover can happen).
func StartSentinel(ctx context.Context, opts SentinelOptions) (*Sentinel, error) {
	if opts.MasterName == "" {
		opts.MasterName = "mymaster"
	}
	if opts.Replicas == 0 {
		opts.Replicas = 1
	}
	if opts.Sentinels == 0 {
		opts.Sentinels = 3
	}
	if opts.DownAfter == 0 {
		opts.DownAfter = time.Second
	}
	dir, ownDir, err := makeDir(opts.Dir, "geoquota-redis-sentinel-*")
	if err != nil {
		return nil, err
	}
	s := &Sentinel{name: opts.MasterName, dir: dir, ownDir: ownDir}
	err = retryOnPortTaken(func() error {
		s.stopAll()
		s.Primary, s.Replicas, s.Sentinels = nil, nil, nil
		ports, err := freePorts(1 + opts.Replicas + opts.Sentinels)
		if err != nil {
			return err
		}
		return s.startAll(ctx, ports, opts)
	})
	if err != nil {
		return nil, errors.Join(err, s.Stop())
	}
	return s, nil
}

func (s *Sentinel) startAll(ctx context.Context, ports []int, opts SentinelOptions) error {
	var err error
	if s.Primary, err = s.startServer(ctx, "primary", ports[0], nil, nil); err != nil {
		return err
	}
	for i := range opts.Replicas {
		r, err := s.startServer(ctx, fmt.Sprintf("replica%d", i), ports[1+i],
			[]string{"--replicaof", "127.0.0.1", strconv.Itoa(s.Primary.Port())},
			func(ctx context.Context, addr string) error {
				if link, err := redisInfo(ctx, addr, []any{"INFO", "replication"}, "master_link_status"); err != nil || link != "up" {
					return fmt.Errorf("replica %s: link to primary %q (%v)", addr, link, err)
				}
				return nil
			})
		if err != nil {
			return err
		}
		s.Replicas = append(s.Replicas, r)
	}
	quorum := opts.Sentinels/2 + 1
	for i := range opts.Sentinels {
		port := ports[1+opts.Replicas+i]
		dir := filepath.Join(s.dir, fmt.Sprintf("sentinel%d", i))
		if err := freshDir(dir); err != nil { // no state left from an attempt that lost its ports
			return err
		}
		// Sentinel rewrites its configuration file as it learns; it must be
		// its own and writable.
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndaemonize no\nlogfile \"\"\ndir %q\n"+
			"sentinel monitor %s 127.0.0.1 %d %d\n"+
			"sentinel down-after-milliseconds %[3]s %[6]d\n"+
			"sentinel failover-timeout %[3]s %[7]d\n"+
			"sentinel parallel-syncs %[3]s 1\n",
			port, dir, s.name, s.Primary.Port(), quorum,
			opts.DownAfter.Milliseconds(), max(3*opts.DownAfter, 3*time.Second).Milliseconds())
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			return err
		}
		r, err := newRedisProcess("sentinel", port, dir, conf, "--sentinel")
		if err != nil {
			return err
		}
		if err := r.start(ctx, nil); err != nil {
			return err
		}
		s.Sentinels = append(s.Sentinels, r)
	}
	return poll(ctx, func(ctx context.Context) error {
		for _, sn := range s.Sentinels {
			if err := s.sentinelReady(ctx, sn.Addr(), opts.Replicas, opts.Sentinels-1); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *Sentinel) startServer(ctx context.Context, role string, port int, extra []string, ready func(context.Context, string) error) (*Redis, error) {
	dir := filepath.Join(s.dir, role)
	if err := freshDir(dir); err != nil {
		return nil, err
	}
	r, err := newRedis("redis-"+role, port, dir, append(redisArgs(port, dir, false), extra...))
	if err != nil {
		return nil, err
	}
	return r, r.start(ctx, ready)
}

func (s *Sentinel) sentinelReady(ctx context.Context, addr string, replicas, peers int) error {
	c := redis.NewSentinelClient(checkOptions(addr))
	defer c.Close()
	primary, err := c.GetMasterAddrByName(ctx, s.name).Result()
	if err != nil {
		return fmt.Errorf("sentinel %s: %w", addr, err)
	}
	if got := net.JoinHostPort(primary[0], primary[1]); got != s.Primary.Addr() {
		return fmt.Errorf("sentinel %s: primary %s, want %s", addr, got, s.Primary.Addr())
	}
	known, err := c.Replicas(ctx, s.name).Result()
	if err != nil {
		return err
	}
	if n := countHealthy(known); n != replicas {
		return fmt.Errorf("sentinel %s: knows %d healthy replicas, want %d", addr, n, replicas)
	}
	others, err := c.Sentinels(ctx, s.name).Result()
	if err != nil {
		return err
	}
	if len(others) != peers {
		return fmt.Errorf("sentinel %s: knows %d other sentinels, want %d", addr, len(others), peers)
	}
	return nil
}

func countHealthy(servers []map[string]string) int {
	n := 0
	for _, srv := range servers {
		if !strings.Contains(srv["flags"], "down") && !strings.Contains(srv["flags"], "disconnected") {
			n++
		}
	}
	return n
}

// MasterName returns the name the sentinels monitor.
func (s *Sentinel) MasterName() string { return s.name }

// SentinelAddrs returns the host:port of every sentinel.
func (s *Sentinel) SentinelAddrs() []string {
	addrs := make([]string, len(s.Sentinels))
	for i, sn := range s.Sentinels {
		addrs[i] = sn.Addr()
	}
	return addrs
}

// URL returns the setup in the form regiond's --redis takes:
// redis-sentinel://host:port,host:port/mastername.
func (s *Sentinel) URL() string {
	return "redis-sentinel://" + strings.Join(s.SentinelAddrs(), ",") + "/" + s.name
}

// CurrentPrimary asks the sentinels which server is the primary now and
// returns its host:port, as a majority of the answering sentinels see it.
func (s *Sentinel) CurrentPrimary(ctx context.Context) (string, error) {
	votes := map[string]int{}
	var errs []error
	for _, addr := range s.SentinelAddrs() {
		c := redis.NewSentinelClient(checkOptions(addr))
		p, err := c.GetMasterAddrByName(ctx, s.name).Result()
		c.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		votes[net.JoinHostPort(p[0], p[1])]++
	}
	for addr, n := range votes {
		if n > len(s.Sentinels)/2 {
			return addr, nil
		}
	}
	return "", fmt.Errorf("harness: no majority of sentinels agrees on a primary (%v): %w", votes, errors.Join(errs...))
}

func (s *Sentinel) servers() []*Redis {
	all := append([]*Redis{}, s.Sentinels...)
	if s.Primary != nil {
		all = append(all, s.Primary)
	}
	return append(all, s.Replicas...)
}

func (s *Sentinel) stopAll() error {
	var err error
	for _, r := range s.servers() {
		err = errors.Join(err, r.proc.stop(5*time.Second))
	}
	return err
}

// Stop shuts every server down and removes the directory if the harness made it.
func (s *Sentinel) Stop() error {
	err := s.stopAll()
	if s.ownDir {
		err = errors.Join(err, os.RemoveAll(s.dir))
	}
	return err
}
