// Command sim runs partition simulations (sim run), live scenarios against a
// local deployment (sim live), and load against a regiond (sim load).
//
// Status: not built yet; see the project README.
package main
