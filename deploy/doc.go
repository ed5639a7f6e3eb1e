// Package deploy holds what it takes to run geoquota for real: Kubernetes
// manifests, NATS and Sentinel configurations, systemd units, Prometheus
// alerts and the runbook (see README.md there); its tests check them.
//
// deploy/local/harness starts real servers on free loopback ports —
// redis-server standalone, as a Redis Cluster and under Sentinel; NATS
// embedded or as Debian's binary, alone or as a supercluster of clusters
// joined by gateways — and can kill and restart them on the same ports. The
// tests, the local deployment and live simulations share it.
package deploy
