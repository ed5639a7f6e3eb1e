package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// SuperclusterOptions configure a NATS supercluster: clusters of servers
// joined by routes, the clusters joined to each other by gateways, as one
// cluster per region is.
type SuperclusterOptions struct {
	// Dir holds a directory per server. Empty: a new temporary directory,
	// removed by Stop.
	Dir string
	// Clusters names the clusters; empty means three, "c1", "c2" and "c3".
	Clusters []string
	// ServersPerCluster is the number of servers in each cluster; 0 means 1.
	ServersPerCluster int
	// Binary runs Debian's nats-server binary instead of embedded servers.
	Binary bool
	// JetStream enables JetStream on every server: one JetStream domain
	// spanning the supercluster.
	JetStream bool
	// Links puts every gateway connection through a Link, one per pair of
	// clusters and direction (see Supercluster.Link): the links between
	// regions, which Cut and SetLatency act on.
	Links bool
	// Users, if any, are the only clients the servers let in (see
	// Identity).
	Users []*Identity
}

// Supercluster is a set of NATS clusters joined by gateways, on loopback.
type Supercluster struct {
	Clusters []*NATSCluster
	dir      string
	ownDir   bool
	links    map[[2]string][]*Link // from cluster, to cluster: one per server of the second
}

// NATSCluster is one cluster of a supercluster.
type NATSCluster struct {
	Name    string
	Servers []*NATS
}

// ClientURLs returns the cluster's client URLs, comma-separated, as
// nats.Connect and regiond's --nats take them.
func (c *NATSCluster) ClientURLs() string {
	urls := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		urls[i] = s.ClientURL()
	}
	return strings.Join(urls, ",")
}

// StartSupercluster starts every server and waits until each has its
// routes and its gateways to every other cluster (and JetStream, if enabled).
func StartSupercluster(ctx context.Context, opts SuperclusterOptions) (*Supercluster, error) {
	if len(opts.Clusters) == 0 {
		opts.Clusters = []string{"c1", "c2", "c3"}
	}
	if opts.ServersPerCluster == 0 {
		opts.ServersPerCluster = 1
	}
	if names := slices.Compact(slices.Sorted(slices.Values(opts.Clusters))); len(names) != len(opts.Clusters) || slices.Contains(names, "") {
		return nil, fmt.Errorf("harness: cluster names %q must be distinct and non-empty", opts.Clusters)
	}
	if opts.Binary {
		if _, err := lookPath("nats-server"); err != nil {
			return nil, err
		}
	}
	dir, ownDir, err := makeDir(opts.Dir, "geoquota-nats-supercluster-*")
	if err != nil {
		return nil, err
	}
	sc := &Supercluster{dir: dir, ownDir: ownDir}
	err = retryOnPortTaken(func() error {
		sc.stopServers()
		if err := sc.build(opts); err != nil {
			return err
		}
		return sc.start(ctx)
	})
	if err != nil {
		return nil, errors.Join(err, sc.Stop())
	}
	return sc, nil
}

// build lays the supercluster out on fresh ports and writes every
// server's configuration.
func (sc *Supercluster) build(opts SuperclusterOptions) error {
	per := opts.ServersPerCluster
	ports, err := freePorts(4 * per * len(opts.Clusters))
	if err != nil {
		return err
	}
	sc.Clusters = nil
	for ci, name := range opts.Clusters {
		c := &NATSCluster{Name: name}
		for si := range per {
			p := ports[4*(ci*per+si):]
			srvDir := filepath.Join(sc.dir, fmt.Sprintf("%s-%d", name, si+1))
			srvName := uniqueName(fmt.Sprintf("%s-%d", name, si+1))
			if err := freshDir(srvDir); err != nil { // nothing left from an attempt that lost its ports
				return err
			}
			c.Servers = append(c.Servers, &NATS{
				name: srvName, cluster: name, dir: srvDir, binary: opts.Binary, users: opts.Users,
				ports:  natsPorts{client: p[0], monitor: p[1], cluster: p[2], gateway: p[3]},
				expect: natsExpect{jetstream: opts.JetStream, routes: per - 1, gateways: len(opts.Clusters) - 1},
			})
		}
		sc.Clusters = append(sc.Clusters, c)
	}
	sc.links = map[[2]string][]*Link{}
	for _, c := range sc.Clusters {
		gateways := map[string][]int{}
		for _, o := range sc.Clusters {
			if o == c {
				continue
			}
			for _, s := range o.Servers {
				port := s.ports.gateway
				if opts.Links {
					l, err := startGatewayLink(s.GatewayAddr(), c.Name)
					if err != nil {
						return err
					}
					sc.links[[2]string{c.Name, o.Name}] = append(sc.links[[2]string{c.Name, o.Name}], l)
					port = l.port()
				}
				gateways[o.Name] = append(gateways[o.Name], port)
			}
		}
		// Every server gets the same route list, itself included (a server
		// ignores its own route): JetStream refuses a cluster with no routes,
		// even of one server.
		var routes []int
		for _, s := range c.Servers {
			routes = append(routes, s.ports.cluster)
		}
		for _, s := range c.Servers {
			s.advertiseNowhere = opts.Links
			if err := s.writeConfig(routes, gateways); err != nil {
				return err
			}
		}
	}
	return nil
}

func (sc *Supercluster) start(ctx context.Context) error {
	for _, s := range sc.Servers() {
		if err := s.start(ctx); err != nil {
			return err
		}
	}
	err := sc.WaitConnected(ctx)
	if err == nil {
		return nil
	}
	// A server that lost a cluster or gateway port to another process says
	// so in its log; start over on new ports.
	for _, s := range sc.Servers() {
		if e := s.startError(err); errors.Is(e, errPortTaken) {
			return e
		}
	}
	return err
}

// WaitConnected waits until every running server has all its routes and
// gateways (and JetStream, if enabled): after a start, a restart or a healed
// partition.
func (sc *Supercluster) WaitConnected(ctx context.Context) error {
	return poll(ctx, func(ctx context.Context) error {
		for _, s := range sc.Servers() {
			if s.Running() {
				if err := s.ready(ctx); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// Cluster returns the cluster with the given name, or nil.
func (sc *Supercluster) Cluster(name string) *NATSCluster {
	for _, c := range sc.Clusters {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Link returns the links that carry cluster from's gateway connections
// to cluster to (what from sends to to), one per server of to; nil without
// SuperclusterOptions.Links. Messages from to to from travel over
// Link(to, from).
func (sc *Supercluster) Link(from, to string) []*Link {
	return sc.links[[2]string{from, to}]
}

// Servers returns every server of every cluster.
func (sc *Supercluster) Servers() []*NATS {
	var all []*NATS
	for _, c := range sc.Clusters {
		all = append(all, c.Servers...)
	}
	return all
}

func (sc *Supercluster) stopServers() error {
	var err error
	for _, s := range sc.Servers() {
		err = errors.Join(err, s.Stop())
	}
	for _, ls := range sc.links {
		for _, l := range ls {
			l.Stop()
		}
	}
	sc.links = nil
	return err
}

// Stop shuts every server down and removes the directory if the harness made it.
func (sc *Supercluster) Stop() error {
	err := sc.stopServers()
	if sc.ownDir {
		err = errors.Join(err, os.RemoveAll(sc.dir))
	}
	return err
}
