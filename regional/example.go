package regional

import _ "embed"

// ExampleRules is the example rules file (example-rules.yaml), which
// regiond --dev enforces.
//
//go:embed example-rules.yaml
var ExampleRules []byte
