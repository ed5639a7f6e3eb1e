// Package daemon is what regiond and globalsync share as commands: flags
// that may also come from GEOQUOTA_* environment variables, their usage,
// structured logs, and the listeners they serve on.
package daemon
