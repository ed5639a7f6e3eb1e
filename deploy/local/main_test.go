package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestUpFlags: each bad flag of up is refused naming it, before anything
// starts; good ones make the deployment asked for.
func TestUpFlags(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("rules:\n  - { id: x, algorithm: nope }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-regions", "0"}, "-regions"},
		{[]string{"-regions", "9"}, "-regions"},
		{[]string{"-names", "us,,ap"}, "-names"},
		{[]string{"-names", "us,eu,us"}, "named twice"},
		{[]string{"-names", "us,e.u"}, "e.u"},
		{[]string{"-names", "us,eu", "-regions", "2"}, "-names and -regions"},
		{[]string{"-timeout", "0s"}, "-timeout"},
		{[]string{"-replicas", "0"}, "-replicas"},
		{[]string{"-globalsync", "0"}, "-globalsync"},
		{[]string{"-rules", filepath.Join(dir, "missing.yaml")}, "-rules"},
		{[]string{"-rules", bad}, "-rules"},
		{[]string{"surplus"}, "surplus"},
	} {
		err := run(append([]string{"up", "-dir", dir}, tc.args...), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("up %v: %v, want an error about %s", tc.args, err, tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "state.json")); !os.IsNotExist(err) {
		t.Fatalf("a refused up left a state file: %v", err)
	}
	var c upConfig
	fs := upFlags("up", &c)
	if err := fs.Parse([]string{"-names", "a,b", "-replicas", "1"}); err != nil {
		t.Fatal(err)
	}
	opts, err := c.options()
	if err != nil || !slices.Equal(opts.Regions, []string{"a", "b"}) || opts.Replicas != 1 || opts.GlobalSyncs != 2 || len(opts.Rules) == 0 {
		t.Fatalf("options %+v, %v", opts, err)
	}
}

// TestCommandsWithoutADeployment: down has nothing to do, status and
// fault say that nothing is up and how to start it.
func TestCommandsWithoutADeployment(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	if err := run([]string{"down", "-dir", dir}, &out, io.Discard); err != nil || !strings.Contains(out.String(), "no deployment") {
		t.Fatalf("down: %v, %q", err, out.String())
	}
	for _, cmd := range [][]string{{"status"}, {"fault", "heal"}} {
		err := run(append([]string{cmd[0], "-dir", dir}, cmd[1:]...), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "run up first") {
			t.Errorf("%v: %v", cmd, err)
		}
	}
	for _, args := range [][]string{{"status", "-dir", dir, "extra"}, {"down", "-dir", dir, "-timeout", "0s"}, {"status", "-timeout", "1s"}} {
		if err := run(args, io.Discard, io.Discard); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	if err := run([]string{"sideways"}, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "sideways") {
		t.Errorf("unknown command: %v", err)
	}
	if err := run(nil, io.Discard, io.Discard); err == nil {
		t.Error("no command: no error")
	}
}

// TestHelp: go run ./deploy/local -h, and each command's -h, print the
// usage to stdout and exit 0 (run returns nil); no command is an error.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}, {"up", "-h"}, {"down", "--help"}, {"status", "-h"}, {"fault", "-h"}} {
		var out, errOut strings.Builder
		err := run(args, &out, &errOut)
		if err != nil || errOut.Len() > 0 || !strings.Contains(out.String(), "usage: go run ./deploy/local") ||
			!strings.Contains(out.String(), "-dir") || !strings.Contains(out.String(), "docs/operations.md") {
			t.Errorf("%v: %v, stdout %q, stderr %q", args, err, out.String(), errOut.String())
		}
	}
	var fault strings.Builder
	run([]string{"fault", "-h"}, &fault, io.Discard)
	for _, f := range []string{"partition REGION", "split", "latency A B DURATION", "heal"} {
		if !strings.Contains(fault.String(), f) {
			t.Errorf("fault -h does not name %q:\n%s", f, fault.String())
		}
	}
	var out, errOut strings.Builder
	if err := run(nil, &out, &errOut); err == nil || !strings.Contains(errOut.String(), "usage") {
		t.Errorf("no command: %v, stderr %q", err, errOut.String())
	}
}
