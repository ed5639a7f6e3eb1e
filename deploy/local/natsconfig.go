package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/transport/namespace"
)

// natsConfig is what nats-config is given.
type natsConfig struct {
	names   namespace.Names // the deployment's
	regions []string
	out     string
}

func parseNATSConfig(args []string, out io.Writer) (natsConfig, error) {
	var c natsConfig
	var deployment, regions string
	fs := flag.NewFlagSet("nats-config", flag.ContinueOnError)
	fs.StringVar(&deployment, "deployment", "", "the deployment's name, as its daemons' --deployment; empty for none")
	fs.StringVar(&regions, "regions", "", "every region of the deployment, comma-separated, as the daemons' --regions")
	fs.StringVar(&c.out, "out", "", "directory to write accounts.conf and the identities' nkey seeds (*.nk) in")
	if err := parse(fs, args, out); err != nil {
		return c, err
	}
	names, err := namespace.New(deployment)
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("nats-config: unexpected argument %q", fs.Arg(0))
	case err != nil:
		return c, fmt.Errorf("-deployment: %w", err)
	case c.out == "":
		return c, errors.New("-out: missing: the directory to write the configuration and the seeds in")
	case regions == "":
		return c, errors.New("-regions: missing: every region of the deployment, comma-separated")
	}
	c.names = names
	for r := range strings.SplitSeq(regions, ",") {
		switch {
		case !validRegion(r):
			return c, fmt.Errorf("-regions %q: region %q: want letters, digits, - and _, at most 64 (as regiond's --region)", regions, r)
		case r == namespace.GlobalSync:
			return c, fmt.Errorf("-regions %q: %q is globalsync's name in the subjects; name the region otherwise", regions, r)
		case slices.Contains(c.regions, r):
			return c, fmt.Errorf("-regions %q: region %q named twice", regions, r)
		}
		c.regions = append(c.regions, r)
	}
	return c, nil
}

// validRegion reports whether regiond takes r as a region's name.
func validRegion(r string) bool {
	if r == "" || len(r) > 64 {
		return false
	}
	for _, c := range r {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return namespace.ValidName(r)
}

// writeNATSConfig writes, in c.out, a deployment's NATS accounts for its
// servers (accounts.conf: one account, AccountOf the deployment, and an
// nkey user per identity allowed only its own subjects, as
// transport/namespace gives them) and each identity's seed, for the
// daemon that connects as it. It writes over nothing: seeds in use stay.
func writeNATSConfig(c natsConfig, out io.Writer) error {
	conf := filepath.Join(c.out, "accounts.conf")
	taken := []string{conf}
	for _, r := range c.regions {
		taken = append(taken, filepath.Join(c.out, "regiond-"+r+".nk"))
	}
	taken = append(taken, filepath.Join(c.out, "globalsync.nk"), filepath.Join(c.out, "operator.nk"))
	for _, p := range taken {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("nats-config: %s exists: remove it or write elsewhere (-out); the daemons' seeds are not replaced", p)
		}
	}
	ids, err := harness.NewIdentities(c.out, c.names, c.regions)
	if err != nil {
		return err
	}
	account := harness.AccountOf(c.names)
	var b strings.Builder
	writeNATSHeader(&b, c, account)
	harness.WriteAccount(&b, account, ids)
	if err := os.WriteFile(conf, []byte(b.String()), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(out, "wrote %s: account %s, %d nkey identities, each allowed only its own subjects\n", conf, account, len(ids))
	fmt.Fprintf(out, "every NATS server of the deployment includes it (include ./accounts.conf, as deploy/nats/us.conf does);\n")
	fmt.Fprintf(out, "each seed goes to what connects as it, never to the servers:\n")
	deployment := ""
	if d := c.names.Deployment(); d != "" {
		deployment = " --deployment " + d
	}
	for _, id := range ids {
		switch id.Name {
		case "operator":
			fmt.Fprintf(out, "  %-20s nats --nkey %s\n", id.Name, id.SeedFile)
		default:
			daemon := "globalsync"
			if r, ok := strings.CutPrefix(id.Name, "regiond-"); ok {
				daemon = "regiond --region " + r
			}
			fmt.Fprintf(out, "  %-20s %s%s --nats-nkey %s --require-auth\n", id.Name, daemon, deployment, id.SeedFile)
		}
	}
	return nil
}

// writeNATSHeader opens accounts.conf: what it is, and the command that
// wrote it.
func writeNATSHeader(b *strings.Builder, c natsConfig, account string) {
	deployment, named := "the unnamed geoquota deployment", ""
	if d := c.names.Deployment(); d != "" {
		deployment, named = "geoquota deployment "+d, " -deployment "+d
	}
	fmt.Fprintf(b, `# The NATS accounts of %s, regions %s.
# Every NATS server of the deployment includes this file
# (include ./accounts.conf). One account (%s) holds the
# deployment's subjects and JetStream buckets; each identity is an nkey
# user allowed only its own subjects: a region's replicas publish their
# region's gossip and read the budgets and rules buckets; globalsync
# writes the buckets and pushes budgets and rules; the operator (for the
# nats tool) may do anything in the account. The seeds (*.nk, written
# beside this file) go to the daemons' --nats-nkey, never to the servers.
#
# Written by: go run ./deploy/local nats-config%s -regions %s -out DIR
# (from transport/namespace's Names.Region and Names.GlobalSync).
`, deployment, strings.Join(c.regions, ", "), account, named, strings.Join(c.regions, ","))
}
