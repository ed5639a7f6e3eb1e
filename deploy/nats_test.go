package deploy

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/transport/namespace"
)

var rewrite = flag.Bool("rewrite", false, "rewrite nats/accounts.conf from the permissions in transport/control")

// shippedRegions are the regions of the example configurations.
var shippedRegions = []string{"us", "eu", "ap"}

// accountsHeader opens nats/accounts.conf; the rest is written by
// harness.WriteAccounts.
const accountsHeader = `# The deployment's NATS identities, included by every server's config: one
# account (GEOQUOTA) for the deployment's subjects and JetStream buckets, a
# user per role, each an nkey whose public half comes from the servers'
# environment (make a pair with: nk -gen user -pubout; the seed goes to the
# daemon's --nats-nkey file, never to the servers). A region's replicas may
# publish only their own region's gossip and read the buckets; only
# globalsync writes budgets, rules and the leader key; the operator, for
# the nats tool, may do anything in the account.
#
# Written by: go test ./deploy -run TestNATSAccounts -rewrite
# (from transport/namespace's Names.Region and Names.GlobalSync).
`

func shippedAccounts() string {
	var n namespace.Names
	var ids []*harness.Identity
	for _, r := range shippedRegions {
		p := n.Region(r)
		ids = append(ids, &harness.Identity{Name: "regiond of region " + r, Public: "$REGIOND_" + strings.ToUpper(r) + "_NKEY", Permissions: &p})
	}
	p := n.GlobalSync()
	ids = append(ids, &harness.Identity{Name: "globalsync", Public: "$GLOBALSYNC_NKEY", Permissions: &p},
		&harness.Identity{Name: "operator", Public: "$OPERATOR_NKEY"})
	var b strings.Builder
	b.WriteString(accountsHeader)
	harness.WriteAccounts(&b, ids)
	return b.String()
}

// TestNATSAccounts keeps nats/accounts.conf what the permissions in
// transport/namespace say.
func TestNATSAccounts(t *testing.T) {
	want := shippedAccounts()
	if *rewrite {
		if err := os.WriteFile("nats/accounts.conf", []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile("nats/accounts.conf")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("nats/accounts.conf is not what transport/namespace's permissions give; rewrite it with\n\tgo test ./deploy -run TestNATSAccounts -rewrite\nwant:\n%s", want)
	}
}

// natsEnv is the environment the shipped NATS configs read: a server name,
// every identity's public nkey and TLS files, made up for a check.
func natsEnv(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	if err := harness.WritePKI(dir, "server"); err != nil {
		t.Fatal(err)
	}
	env := []string{"SERVER_NAME=check",
		"NATS_TLS_CA=" + filepath.Join(dir, "ca.pem"),
		"NATS_TLS_CERT=" + filepath.Join(dir, "server.pem"),
		"NATS_TLS_KEY=" + filepath.Join(dir, "server-key.pem")}
	for _, name := range []string{"REGIOND_US", "REGIOND_EU", "REGIOND_AP", "GLOBALSYNC", "OPERATOR"} {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		env = append(env, name+"_NKEY="+pub)
	}
	return env
}

// TestNATSConfigsCheck runs nats-server's own check on every NATS config,
// and checks what they must say: authorization from accounts.conf, TLS on
// client, cluster and gateway links, monitoring on loopback only.
func TestNATSConfigsCheck(t *testing.T) {
	bin, err := harness.LookPath("nats-server")
	if err != nil {
		t.Fatal(err)
	}
	env := natsEnv(t)
	for _, r := range shippedRegions {
		f := filepath.Join("nats", r+".conf")
		cmd := exec.Command(bin, "-c", f, "-t")
		cmd.Env = append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", f, err, out)
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		conf := string(b)
		for _, want := range []string{"include ./accounts.conf", "http: 127.0.0.1:8222"} {
			if !strings.Contains(conf, want) {
				t.Errorf("%s does not say %q", f, want)
			}
		}
		for _, block := range []string{"cluster {", "gateway {"} {
			i := strings.Index(conf, block)
			if i < 0 || !strings.Contains(conf[i:], "tls {") {
				t.Errorf("%s: no TLS in its %s block", f, strings.TrimSuffix(block, " {"))
			}
		}
		if i := strings.Index(conf, "cluster {"); i < 0 || !strings.Contains(conf[:i], "tls {") {
			t.Errorf("%s: no TLS for clients", f)
		}
	}
	// The check can fail: a broken config, and a config whose identities
	// are missing from the environment.
	bad := filepath.Join(t.TempDir(), "bad.conf")
	os.WriteFile(bad, []byte("cluster { listen: 0.0.0.0:6222\n"), 0o644)
	if err := exec.Command(bin, "-c", bad, "-t").Run(); err == nil {
		t.Error("nats-server -t passed a broken config")
	}
	cmd := exec.Command(bin, "-c", filepath.Join("nats", "us.conf"), "-t")
	cmd.Env = append(os.Environ(), "SERVER_NAME=check")
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("nats-server -t passed us.conf with no identities in the environment:\n%s", out)
	}
}
