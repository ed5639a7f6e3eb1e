package main

import (
	"strings"
	"testing"
)

// TestHelpEverywhere: sim and each of its commands print their usage to
// stdout on -h and --help and exit 0; no command, or an unknown one, is a
// usage error (2).
func TestHelpEverywhere(t *testing.T) {
	call := func(args ...string) (int, string, string) {
		var stdout, stderr strings.Builder
		code := run(t.Context(), args, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		if code, out, errOut := call(args...); code != 0 || !strings.Contains(out, "usage: sim <command>") || errOut != "" {
			t.Errorf("sim %v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	for _, cmd := range []string{"load", "run", "accuracy", "live", "floor"} {
		for _, h := range []string{"-h", "--help"} {
			code, out, errOut := call(cmd, h)
			if code != 0 || errOut != "" || !strings.Contains(out, "usage: sim "+cmd+" [flags]") ||
				!strings.Contains(out, "docs/simulation.md") || !strings.Contains(out, "  -") {
				t.Errorf("sim %s %s: exit %d, stdout %q, stderr %q: want its flags on stdout and 0", cmd, h, code, out, errOut)
			}
		}
	}
	if code, _, errOut := call(); code != 2 || !strings.Contains(errOut, "usage") {
		t.Errorf("sim alone: exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := call("nope"); code != 2 || !strings.Contains(errOut, `unknown command "nope"`) {
		t.Errorf("sim nope: exit %d, stderr %q", code, errOut)
	}
	if code, out, errOut := call("floor", "--nope"); code != 2 || out != "" || !strings.HasPrefix(errOut, "sim floor: ") {
		t.Errorf("sim floor --nope: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
