package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// RedisClusterOptions configure a Redis Cluster.
type RedisClusterOptions struct {
	// Dir holds one directory per node. Empty: a new temporary directory,
	// removed by Stop.
	Dir string
	// Primaries is the number of primaries; 0 means 3, the fewest Redis
	// Cluster accepts.
	Primaries int
	// ReplicasPerPrimary is the number of replicas of each primary.
	ReplicasPerPrimary int
	// Persist keeps each node's data across Kill and Restart (see RedisOptions).
	Persist bool
}

// RedisCluster is a Redis Cluster of redis-server nodes on loopback ports,
// created with redis-cli --cluster create. Each node can be killed and
// restarted on its own; its cluster identity and slots survive a restart.
type RedisCluster struct {
	// Nodes are the cluster's servers, primaries first.
	Nodes  []*Redis
	dir    string
	ownDir bool
}

// StartRedisCluster starts the nodes, joins them into a cluster that covers
// all 16384 slots, and waits until every node reports the cluster healthy.
func StartRedisCluster(ctx context.Context, opts RedisClusterOptions) (*RedisCluster, error) {
	if opts.Primaries == 0 {
		opts.Primaries = 3
	}
	if opts.Primaries < 3 || opts.ReplicasPerPrimary < 0 {
		return nil, fmt.Errorf("harness: a Redis Cluster needs at least 3 primaries and no negative replicas, not %d and %d", opts.Primaries, opts.ReplicasPerPrimary)
	}
	cli, err := lookPath("redis-cli")
	if err != nil {
		return nil, err
	}
	dir, ownDir, err := makeDir(opts.Dir, "geoquota-redis-cluster-*")
	if err != nil {
		return nil, err
	}
	c := &RedisCluster{dir: dir, ownDir: ownDir}
	n := opts.Primaries * (1 + opts.ReplicasPerPrimary)
	err = retryOnPortTaken(func() error {
		c.Nodes = nil
		// A client port and a cluster bus port per node.
		ports, err := freePorts(2 * n)
		if err != nil {
			return err
		}
		for i := range n {
			if err := c.startNode(ctx, i, ports[2*i], ports[2*i+1], opts.Persist); err != nil {
				c.stopNodes()
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = c.create(ctx, cli, opts.ReplicasPerPrimary)
	}
	if err == nil {
		err = c.WaitHealthy(ctx)
	}
	if err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	return c, nil
}

func (c *RedisCluster) startNode(ctx context.Context, i, port, busPort int, persist bool) error {
	dir := filepath.Join(c.dir, fmt.Sprintf("node%d", i))
	if err := freshDir(dir); err != nil { // no cluster identity left from an attempt that lost its ports
		return err
	}
	args := append(redisArgs(port, dir, persist),
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-port", strconv.Itoa(busPort),
		"--cluster-node-timeout", "2000",
	)
	r, err := newRedis("redis-cluster-node", port, dir, args)
	if err != nil {
		return err
	}
	if err := r.start(ctx, nil); err != nil {
		return err
	}
	c.Nodes = append(c.Nodes, r)
	return nil
}

func (c *RedisCluster) create(ctx context.Context, cli string, replicas int) error {
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("harness: redis-cli --cluster create: %w\n%s", err, out)
	}
	return nil
}

// WaitHealthy waits until every running node reports the cluster state ok,
// all slots served, and knows every node.
func (c *RedisCluster) WaitHealthy(ctx context.Context) error {
	return poll(ctx, func(ctx context.Context) error {
		for _, n := range c.Nodes {
			if !n.Running() {
				continue
			}
			v, err := redisCmd(ctx, n.Addr(), "CLUSTER", "INFO")
			if err != nil {
				return err
			}
			info, _ := v.(string)
			for field, want := range map[string]string{
				"cluster_state":          "ok",
				"cluster_slots_ok":       "16384",
				"cluster_known_nodes":    strconv.Itoa(len(c.Nodes)),
				"cluster_slots_pfail":    "0",
				"cluster_slots_fail":     "0",
				"cluster_slots_assigned": "16384",
			} {
				if got, _ := infoField(info, field); got != want {
					return fmt.Errorf("node %s: %s is %q, want %q", n.Addr(), field, got, want)
				}
			}
		}
		return nil
	})
}

// Addrs returns the host:port of every node.
func (c *RedisCluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Spec returns the cluster in the form regiond's --redis takes: a
// comma-separated list of host:port.
func (c *RedisCluster) Spec() string { return strings.Join(c.Addrs(), ",") }

func (c *RedisCluster) stopNodes() error {
	var err error
	for _, n := range c.Nodes {
		err = errors.Join(err, n.proc.stop(5*time.Second))
	}
	return err
}

// Stop shuts every node down and removes the directory if the harness made it.
func (c *RedisCluster) Stop() error {
	err := c.stopNodes()
	if c.ownDir {
		err = errors.Join(err, os.RemoveAll(c.dir))
	}
	return err
}
