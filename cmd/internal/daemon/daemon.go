package daemon

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
)

// EnvName is the environment variable that sets a flag: GEOQUOTA_, then
// the flag's name in upper case with - as _.
func EnvName(flagName string) string {
	return "GEOQUOTA_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Parse sets fs's flags from their GEOQUOTA_* variables (read with
// getenv), then from args, so that the command line wins. A request for
// help is a *HelpError holding the usage of command: every flag, the
// variable that sets it, and docs, where its documentation is. Arguments
// left over are an error.
func Parse(command string, fs *flag.FlagSet, args []string, getenv func(string) string, docs string) error {
	fs.SetOutput(io.Discard)
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name := EnvName(f.Name)
		if v := getenv(name); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %v", name, err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return HelpOf(command, fs, true, docs)
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return nil
}

// Logger returns a structured logger writing to w: format text or json,
// at level (debug, info, warn or error; info if unknown).
func Logger(w io.Writer, format, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: l}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// Addr is an address to listen on, and the flag that gave it.
type Addr struct{ Flag, Addr string }

// Listen listens on every address, or on none: an address that fails
// closes those already open, and the error names its flag.
func Listen(addrs ...Addr) ([]net.Listener, error) {
	var out []net.Listener
	for _, a := range addrs {
		lis, err := net.Listen("tcp", a.Addr)
		if err != nil {
			for _, l := range out {
				l.Close()
			}
			return nil, fmt.Errorf("--%s: %w", a.Flag, err)
		}
		out = append(out, lis)
	}
	return out, nil
}

// KeyRedaction registers --key-redaction on fs: hash (the default) puts a
// hash in place of API keys in logs, audit records and reports
// (regional.RedactKey), none shows them. The function returned reads it
// after parsing, or says what is wrong with it.
func KeyRedaction(fs *flag.FlagSet) func() (redact bool, err error) {
	v := fs.String("key-redaction", "hash", "how API keys show in logs, audit records and reports: hash (a SHA-256 prefix) or none")
	return func() (bool, error) {
		switch *v {
		case "hash":
			return true, nil
		case "none":
			return false, nil
		}
		return false, fmt.Errorf("--key-redaction %q: want hash or none", *v)
	}
}
