package regional

import _ "embed"

// ExampleRules is the rules file of SPEC §11, which regiond --dev enforces.
//
//go:embed example-rules.yaml
var ExampleRules []byte
