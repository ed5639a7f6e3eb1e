// Package geoquotav1 is the generated Go code of the geoquota.v1 gRPC API
// (geoquota.proto beside it): the RateLimiter service that gateways call
// and the Admin service that operators call. Regenerate with make proto.
package geoquotav1
