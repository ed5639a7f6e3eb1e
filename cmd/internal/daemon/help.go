package daemon

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// HelpError is a request for help (-h, --help): the command's usage, which
// goes to stdout with exit status 0. errors.Is(err, flag.ErrHelp) holds.
type HelpError struct{ Usage string }

func (e *HelpError) Error() string        { return e.Usage }
func (e *HelpError) Is(target error) bool { return target == flag.ErrHelp }

// HelpOf is the usage of command: how to call it, every flag, the
// GEOQUOTA_* variables that set them if env, and where its documentation
// is.
func HelpOf(command string, fs *flag.FlagSet, env bool, docs string) *HelpError {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: %s [flags]\n\n", command)
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	if env {
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, EnvName(f.Name)) })
		fmt.Fprintf(&b, "\nEvery flag may also be set by its environment variable, the flag's name in\nupper case with - as _ after GEOQUOTA_ (the command line wins):\n  %s\n", strings.Join(names, " "))
	}
	fmt.Fprintf(&b, "\nDocumentation: %s\n", docs)
	return &HelpError{Usage: b.String()}
}

// ParseFailed writes what a command's flags could not be parsed for, and
// returns the exit status: a request for help is printed to stdout (0),
// another error to stderr after the command's name (2).
func ParseFailed(stdout, stderr io.Writer, command string, err error) int {
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, err)
		return 0
	}
	fmt.Fprintf(stderr, "%s: %v\n", command, err)
	return 2
}
