package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/geoquota/geoquota/transport/namespace"
)

// Account is the NATS account every identity of a deployment belongs to:
// the deployment's subjects and JetStream buckets live in it, apart from
// whatever else shares the servers.
const Account = "GEOQUOTA"

// Identity is one user of a deployment's NATS servers: an nkey pair whose
// seed is in a file only its owner reads, and what it may publish and
// subscribe to. The operator identity (no permissions listed) may do
// anything in the account: tests and tools use it.
type Identity struct {
	Name        string
	Public      string // the user's public nkey (U…), as the servers list it
	SeedFile    string // the seed, for --nats-nkey and nats.NkeyOptionFromSeed
	Permissions *namespace.Permissions
}

// NewIdentity makes an nkey pair for name and writes its seed in dir.
func NewIdentity(dir, name string, perms *namespace.Permissions) (*Identity, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("harness: nkey for %s: %w", name, err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, name+".nk")
	if err := os.WriteFile(path, seed, 0o600); err != nil {
		return nil, err
	}
	return &Identity{Name: name, Public: pub, SeedFile: path, Permissions: perms}, nil
}

// NewIdentities makes the NATS identities of a deployment (named by n) of
// the given regions, their seeds in dir: "regiond-<region>" for each
// region's replicas (n.Region), "globalsync" (n.GlobalSync) and
// "operator", with no permissions listed (anything in its account).
func NewIdentities(dir string, n namespace.Names, regions []string) ([]*Identity, error) {
	var ids []*Identity
	add := func(name string, p *namespace.Permissions) error {
		id, err := NewIdentity(dir, name, p)
		if err != nil {
			return err
		}
		ids = append(ids, id)
		return nil
	}
	for _, r := range regions {
		p := n.Region(r)
		if err := add("regiond-"+r, &p); err != nil {
			return nil, err
		}
	}
	p := n.GlobalSync()
	if err := add("globalsync", &p); err != nil {
		return nil, err
	}
	if err := add("operator", nil); err != nil {
		return nil, err
	}
	return ids, nil
}

// AccountOf names a deployment's NATS account: Account for the unnamed
// deployment, Account_NAME for a named one. Its own account keeps a named
// deployment's operator, who may do anything in it, and its JetStream
// buckets apart from any other deployment on the same servers.
func AccountOf(n namespace.Names) string {
	if n.Deployment() == "" {
		return Account
	}
	return Account + "_" + n.Deployment()
}

// Option is the nats.Option that connects as the identity.
func (id *Identity) Option() (nats.Option, error) { return nats.NkeyOptionFromSeed(id.SeedFile) }

// Args are the flags that make regiond or globalsync connect as the
// identity, and refuse to start unauthenticated.
func (id *Identity) Args() []string { return []string{"--nats-nkey", id.SeedFile, "--require-auth"} }

// WriteAccounts writes the accounts block of a NATS server's
// configuration: one account (Account), JetStream enabled, its users the
// identities. A public key written $NAME is the variable NAME, which the
// server reads from its environment (deploy/nats/accounts.conf is written
// so).
func WriteAccounts(b *strings.Builder, ids []*Identity) { WriteAccount(b, Account, ids) }

// WriteAccount is WriteAccounts for an account of another name
// (AccountOf).
func WriteAccount(b *strings.Builder, account string, ids []*Identity) {
	if len(ids) == 0 {
		return
	}
	fmt.Fprintf(b, "accounts {\n  %s: {\n    jetstream: enabled\n    users: [\n", account)
	for _, id := range ids {
		nkey := strconv.Quote(id.Public)
		if strings.HasPrefix(id.Public, "$") {
			nkey = id.Public
		}
		fmt.Fprintf(b, "      # %s\n      {\n        nkey: %s\n", id.Name, nkey)
		if p := id.Permissions; p != nil {
			fmt.Fprintf(b, "        permissions: {\n          publish: {allow: %s}\n          subscribe: {allow: %s}\n          allow_responses: true\n        }\n",
				quoteList(p.Publish), quoteList(p.Subscribe))
		}
		b.WriteString("      }\n")
	}
	b.WriteString("    ]\n  }\n}\n")
}

// quoteList writes a list of subjects, one a line.
func quoteList(subjects []string) string {
	var b strings.Builder
	b.WriteString("[\n")
	for _, s := range subjects {
		fmt.Fprintf(&b, "            %q\n", s)
	}
	b.WriteString("          ]")
	return b.String()
}

// WritePKI writes, in dir, a certificate authority (ca.pem) and a
// certificate it signs for each name (name.pem, key in name-key.pem), good
// for an hour for 127.0.0.1 and localhost, as server and as client: enough
// TLS for a test of TLS links.
func WritePKI(dir string, names ...string) error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "geoquota test CA"}, IsCA: true,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	write := func(name, kind string, der []byte) error {
		return os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
	}
	if err := write("ca.pem", "CERTIFICATE", caDER); err != nil {
		return err
	}
	for i, name := range names {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		if err := errors.Join(write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kder)); err != nil {
			return err
		}
	}
	return nil
}
