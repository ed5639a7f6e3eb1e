package daemon

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// NATSAuth is how a daemon proves to NATS who it is, and checks that the
// server is the one it means: NATS's own mechanisms, as its tools name
// them. At most one of Creds, NKey, User (with Password) and Token; a
// client certificate (Cert and Key) may go with any of them, or alone
// when the server maps certificates to users.
type NATSAuth struct {
	Creds    string // a credentials file: the user's JWT and nkey seed (nsc, decentralized auth)
	NKey     string // a file holding an nkey seed (SU…), for a server that lists the user's public nkey
	User     string
	Password string
	Token    string
	CA       string // PEM file of the CAs that sign the servers' certificates; TLS on
	Cert     string // PEM file of this client's certificate; TLS on
	Key      string // PEM file of its private key
}

// AddFlags registers the --nats-* flags (and so their GEOQUOTA_NATS_*
// variables) on fs.
func (a *NATSAuth) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&a.Creds, "nats-creds", "", "NATS credentials file (user JWT and nkey seed)")
	fs.StringVar(&a.NKey, "nats-nkey", "", "file holding this daemon's NATS nkey seed")
	fs.StringVar(&a.User, "nats-user", "", "NATS user name (with --nats-password)")
	fs.StringVar(&a.Password, "nats-password", "", "NATS password; prefer GEOQUOTA_NATS_PASSWORD to the command line")
	fs.StringVar(&a.Token, "nats-token", "", "NATS authentication token; prefer GEOQUOTA_NATS_TOKEN to the command line")
	fs.StringVar(&a.CA, "nats-tls-ca", "", "PEM file of the CAs that sign the NATS servers' certificates (turns TLS on)")
	fs.StringVar(&a.Cert, "nats-tls-cert", "", "PEM file of this daemon's TLS client certificate for NATS (with --nats-tls-key; turns TLS on)")
	fs.StringVar(&a.Key, "nats-tls-key", "", "PEM file of the private key of --nats-tls-cert")
}

// Check says what is wrong with the flags, naming them.
func (a NATSAuth) Check() error {
	var set []string
	for _, f := range []struct{ name, v string }{{"--nats-creds", a.Creds}, {"--nats-nkey", a.NKey}, {"--nats-user", a.User}, {"--nats-token", a.Token}} {
		if f.v != "" {
			set = append(set, f.name)
		}
	}
	if len(set) > 1 {
		return fmt.Errorf("%s: give one way to authenticate to NATS", strings.Join(set, " and "))
	}
	if (a.User == "") != (a.Password == "") {
		return errors.New("--nats-user and --nats-password go together")
	}
	if (a.Cert == "") != (a.Key == "") {
		return errors.New("--nats-tls-cert and --nats-tls-key go together")
	}
	for _, f := range []struct{ name, path string }{{"--nats-creds", a.Creds}, {"--nats-nkey", a.NKey}, {"--nats-tls-ca", a.CA}, {"--nats-tls-cert", a.Cert}, {"--nats-tls-key", a.Key}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
	}
	return nil
}

// Options returns the nats.Options that authenticate as the flags say.
func (a NATSAuth) Options() ([]nats.Option, error) {
	if err := a.Check(); err != nil {
		return nil, err
	}
	var opts []nats.Option
	switch {
	case a.Creds != "":
		opts = append(opts, nats.UserCredentials(a.Creds))
	case a.NKey != "":
		o, err := nats.NkeyOptionFromSeed(a.NKey)
		if err != nil {
			return nil, fmt.Errorf("--nats-nkey: %w", err)
		}
		opts = append(opts, o)
	case a.User != "":
		opts = append(opts, nats.UserInfo(a.User, a.Password))
	case a.Token != "":
		opts = append(opts, nats.Token(a.Token))
	}
	if a.CA != "" || a.Cert != "" {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if a.CA != "" {
			pool, err := certPool("--nats-tls-ca", a.CA)
			if err != nil {
				return nil, err
			}
			cfg.RootCAs = pool
		}
		if a.Cert != "" {
			cert, err := tls.LoadX509KeyPair(a.Cert, a.Key)
			if err != nil {
				return nil, fmt.Errorf("--nats-tls-cert/--nats-tls-key: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, nats.Secure(cfg))
	}
	return opts, nil
}

// Authenticated reports whether a connection to urls (the --nats value,
// comma-separated) made with these flags proves who it is: some
// credential, a client certificate, or a user or token in every URL.
func (a NATSAuth) Authenticated(urls string) bool {
	if a.Creds != "" || a.NKey != "" || a.User != "" || a.Token != "" || a.Cert != "" {
		return true
	}
	n := 0
	for _, s := range strings.Split(urls, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		u, err := url.Parse(s)
		if err != nil || u.User == nil || u.User.Username() == "" {
			return false
		}
		n++
	}
	return n > 0
}

// Insecure is the gauge geoquota_insecure{link}: 1 while a link runs
// without authentication or encryption (NATS without credentials,
// memberlist without a key), 0 while it is secured. Alerts and dashboards
// read it; the daemon also says so in its log at start.
func Insecure(reg prometheus.Registerer, links map[string]bool) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "geoquota_insecure",
		Help: "1 while a link (nats, memberlist) runs unauthenticated or unencrypted, 0 while it is secured"}, []string{"link"})
	for link, insecure := range links {
		v := 0.0
		if insecure {
			v = 1
		}
		g.WithLabelValues(link).Set(v)
	}
	reg.MustRegister(g)
}

// InsecureNATS is what a daemon logs at start when its NATS connection does
// not authenticate.
const InsecureNATS = "NATS: connecting without authentication: anyone who can reach these NATS servers can change every limit and budget; " +
	"give --nats-creds, --nats-nkey, --nats-user or --nats-token (docs/operations.md, \"Securing the control plane\"), and --require-auth to refuse to start this way"

// NATSErrors is the connection's handler of what the servers say
// asynchronously, logged instead of printed: above all a permission
// violation, which means the daemon's identity is not the one the servers
// give its subjects. Each subject refused is logged at most once a minute;
// Last returns the latest, for an error at start.
type NATSErrors struct {
	log     *slog.Logger
	refused prometheus.Counter
	mu      sync.Mutex
	last    error
	seen    map[string]time.Time
}

// NewNATSErrors returns a handler logging to log, and counting the
// servers' permission violations in geoquota_nats_refused_total on reg.
func NewNATSErrors(log *slog.Logger, reg prometheus.Registerer) *NATSErrors {
	h := &NATSErrors{log: log, seen: map[string]time.Time{}, refused: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "geoquota_nats_refused_total",
		Help: "What the NATS servers refused this daemon (permission violations): its identity is not the one they allow its subjects.",
	})}
	reg.MustRegister(h.refused)
	return h
}

// Option is the nats.Option that installs the handler.
func (h *NATSErrors) Option() nats.Option {
	return nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { h.handle(err) })
}

func (h *NATSErrors) handle(err error) {
	violation := errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(strings.ToLower(err.Error()), "permissions violation")
	if violation {
		h.refused.Inc()
	}
	h.mu.Lock()
	h.last = err
	msg := err.Error()
	if t, ok := h.seen[msg]; ok && time.Since(t) < time.Minute {
		h.mu.Unlock()
		return
	}
	if len(h.seen) > 1000 {
		clear(h.seen)
	}
	h.seen[msg] = time.Now()
	h.mu.Unlock()
	if violation {
		h.log.Error("NATS refused what this daemon sent: its identity (--nats-nkey, --nats-creds, …) is not the one the servers allow these subjects, or their permissions are wrong (deploy/nats/accounts.conf)", "err", msg)
		return
	}
	h.log.Warn("NATS", "err", msg)
}

// Last returns the latest error the servers sent, or nil.
func (h *NATSErrors) Last() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}
